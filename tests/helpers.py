"""Test data only runjob's own tests need (the kit, runjob.testing, has the rest): job texts, fake
CIFAR-10 files. A module of its own, not conftest.py: the example plugin's tests, collected in the
same session, have a conftest.py too, and only one module can be called ``conftest``."""

from __future__ import annotations

import pickle
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_cifar_batches(root: Path, per_batch: int = 20, seed: int = 0) -> Path:
    """CIFAR-10's python format (five training batches, a test batch, meta) with random pixels.

    The files are real pickles in torchvision's layout, but their md5 sums are not CIFAR's.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        batch = {
            "batch_label": name,
            "data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
            "labels": [int(x) for x in rng.integers(0, 10, size=per_batch)],
        }
        with open(folder / name, "wb") as file:
            pickle.dump(batch, file)
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    with open(folder / "batches.meta", "wb") as file:
        pickle.dump({"label_names": classes, "num_cases_per_batch": per_batch, "num_vis": 3072}, file)
    return root


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
