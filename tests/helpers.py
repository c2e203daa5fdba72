"""Test data only runjob's own tests need (the kit, runjob.testing, has the rest): job texts, fake
CIFAR-10 files. A module of its own, not conftest.py: the example plugin's tests, collected in the
same session, have a conftest.py too, and only one module can be called ``conftest``."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_cifar_batches(root: Path, per_batch: int = 20, seed: int = 0) -> Path:
    """CIFAR-10's python format with random pixels, ``per_batch`` images in each batch file (the
    ``cifar10`` plugin's own writer); the md5 sums are not CIFAR's."""
    from runjob.plugins.image_datasets import write_cifar10_files

    return write_cifar10_files(root, per_batch, seed=seed)


SMALL_DIGITS = """
    [job]
    name = "{name}"
    [model]
    name = "tiny_cnn"
    [dataset]
    name = "digits"
    image_size = 16
    [train]
    batch_size = 32
"""
"""A small job on the digits: the kit's tiny_cnn (a few thousand parameters) on 16x16 scans;
``{name}`` is the job's name (and its MLflow experiment's)."""

TINY_GPT = """
    [job]
    name = "{name}"
    [task]
    name = "language_modeling"
    [model]
    name = "gpt"
    context = 16
    layers = 1
    width = 16
    heads = 2
    [dataset]
    name = "text_files"
    paths = "corpus/*.txt"
    context = 16
    val_fraction = 0.2
"""
"""A one-layer, width-16 GPT on the text files in ``corpus/`` (the test writes them); add ``[train]``
and ``[optimizer]`` tables after it."""

RESNET18_DIGITS = """
    [job]
    name = "{name}"
    [model]
    name = "resnet18"
    num_classes = 10
    [dataset]
    name = "digits"
    image_size = 16
    [train]
    batch_size = 32
"""
"""The same job with the built-in ResNet-18, for tests about what that model gives (and for job
files that are only checked, never trained)."""


def uploaded_best(output_dir: Path) -> set[str]:
    """What MLflow's ``best/`` of the run in ``output_dir`` holds: the best weights, unless the
    run's record of models (``models.json``) says they are the final ``model.safetensors`` (stored
    once)."""
    import json

    named = json.loads((Path(output_dir) / "models.json").read_text())["best"]["artifact"]
    return set() if named == "model.safetensors" else {"best/model.safetensors"}


def installed_plugin_tags():
    """The ``runjob.plugin.NAME`` tag of every plugin installed here that is not a built-in (the
    plugin packages of this repository, runjob-timm and runjob-hf, when their extras are)."""
    from runjob.host.plugin_host import load_plugins

    return {f"runjob.plugin.{plugin.name}" for plugin in load_plugins().plugins if not plugin.builtin}
