"""Built-in datasets on data the tests write themselves: CIFAR-10's pickle batches, digits."""

from __future__ import annotations

import pytest
from helpers import write_cifar_batches

from runjob.errors import DataError
from runjob_builtins.digits import DigitsOptions, build_digits
from runjob_builtins.image_datasets import CIFAR10Options, build_cifar10


def test_cifar10_reads_python_batches(tmp_path):
    root = write_cifar_batches(tmp_path / "cifar", per_batch=20)
    splits = build_cifar10(CIFAR10Options(root=str(root), download=False, verify=False, in_memory=False))
    assert len(splits.train) == 100 and len(splits.val) == 20
    assert splits.num_classes == 10 and splits.classes[0] == "airplane"
    image, label = splits.train[0]
    assert tuple(image.shape) == (3, 32, 32) and 0 <= label < 10


def test_cifar10_training_images_are_augmented_validation_not(tmp_path):
    import torch

    root = write_cifar_batches(tmp_path / "cifar", per_batch=4)
    splits = build_cifar10(CIFAR10Options(root=str(root), download=False, verify=False, in_memory=False))
    torch.manual_seed(0)
    crops = [splits.train[0][0] for _ in range(8)]
    assert any(not torch.equal(crops[0], c) for c in crops[1:]), "random crop/flip should vary"
    assert torch.equal(splits.val[0][0], splits.val[0][0])


def test_cifar10_checks_md5_sums_by_default(tmp_path):
    root = write_cifar_batches(tmp_path / "cifar", per_batch=4)
    with pytest.raises(DataError) as caught:
        build_cifar10(CIFAR10Options(root=str(root), download=False))
    message = str(caught.value)
    assert f"CIFAR-10 not found or incomplete in {root / 'cifar-10-batches-py'}" in message
    assert "md5" in message and "dataset.verify = false" in message


def test_cifar10_missing_batch_file_is_reported(tmp_path):
    root = write_cifar_batches(tmp_path / "cifar", per_batch=4)
    (root / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DataError, match="not found or incomplete"):
        build_cifar10(CIFAR10Options(root=str(root), download=False, verify=False))


def test_cifar10_failed_download_says_how_to_use_a_copy(tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR10

    def offline(self):
        raise OSError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(CIFAR10, "download", offline)
    with pytest.raises(DataError) as caught:
        build_cifar10(CIFAR10Options(root=str(tmp_path / "nothing"), download=True))
    message = str(caught.value)
    assert "could not download CIFAR-10" in message and "dataset.download = false" in message
    assert "\n" not in message


def test_digits_split_is_fixed_and_disjoint():
    a = build_digits(DigitsOptions())
    b = build_digits(DigitsOptions())
    assert len(a.train) + len(a.val) == 1797
    assert len(a.val) == round(1797 * 0.2)
    import torch

    assert torch.equal(a.val.images, b.val.images) and torch.equal(a.val.labels, b.val.labels)
    assert tuple(a.train.images.shape[1:]) == (3, 32, 32) and a.train.mean == [0.5] * 3
    from runjob_builtins.digits import split_indices

    train_idx, val_idx = split_indices(1797, 0.2, seed=0)
    assert not set(train_idx.tolist()) & set(val_idx.tolist())
    assert len(train_idx) + len(val_idx) == 1797


def test_digits_are_scikit_learns_scans_read_without_importing_it():
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    from runjob_builtins.digits import digits_tensors

    images, labels = digits_tensors(8)
    reference = load_digits()
    assert torch.equal(labels, torch.tensor(reference.target))
    expected = F.interpolate(
        torch.tensor(reference.images, dtype=torch.float32).unsqueeze(1) / 16.0,
        size=(8, 8),
        mode="bilinear",
        align_corners=False,
    )
    assert torch.equal(images[:, 0:1], expected.clamp(0, 1)) and images.shape == (1797, 3, 8, 8)
