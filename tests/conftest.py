"""runjob's own tests use the public test kit, ``runjob.testing`` (the ``runjob_tester`` fixture and
its helpers); what is left here is test data only runjob's tests need."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

pytest_plugins = ["runjob.testing", "pytester"]  # pytester: the kit's own tests run pytest inside

REPO = Path(__file__).resolve().parents[1]

# Two xdist workers share two cores, and each test's torch would start a thread a core (four busy
# threads on two cores spin: shared/TRAPS.md). One torch thread in this process and in every
# process a test starts (tests that need otherwise say so).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that start processes (marked e2e, the longest) first: the two xdist workers share
    them out, and the quick in-process tests fill in the end instead of one long test ending alone."""
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


@pytest.fixture(scope="session")
def digits_folder(tmp_path_factory) -> Path:
    """scikit-learn's digits written as PNGs in train/<digit>/ and val/<digit>/ (the contract layout)."""
    from runjob.plugins.digits import export_image_folder

    root = tmp_path_factory.mktemp("digits") / "digits"
    export_image_folder(root, image_size=32)
    return root


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


@pytest.fixture
def tester(runjob_tester):
    """``runjob_tester`` with the kit's tiny models installed (``tiny_cnn``, for SMALL_DIGITS)."""
    runjob_tester.install_tiny_models()
    return runjob_tester
