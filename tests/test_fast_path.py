"""The fast path: in-memory datasets batched on the device, channels_last, torch.compile, fused
optimizers; each gives the same training data and a usable result, and misuse is a clear error."""

from __future__ import annotations

import json

import pytest
from helpers import write_cifar_batches

from runjob.errors import DataError
from runjob.host.components import ImageTensors
from runjob.train.data_loading import BatchedImages, example_batch
from runjob_builtins.image_datasets import (
    CIFAR_MEAN,
    CIFAR_STD,
    CIFAR10Options,
    ImageFolderOptions,
    build_cifar10,
    build_imagefolder,
)

pytestmark = pytest.mark.timeout(600)


def cpu():
    import torch

    return torch.device("cpu")


def torchvision_views(image):
    """Every view torchvision's RandomCrop(32, padding=4), then the flip, ToTensor and Normalize can
    make of one uint8 CIFAR image, as ((dy, dx, flip), view), offsets in order, the plain view
    before the flipped one: the reference for the batched version. The image is padded and
    normalized once (Normalize acts on each pixel alone, so it commutes with the crop and the
    flip), then cropped and flipped by torchvision at each offset."""
    import torch
    from torchvision.transforms import functional as TF

    padded = TF.normalize(TF.pad(image, [4, 4, 4, 4]).to(torch.float32) / 255, CIFAR_MEAN, CIFAR_STD)
    for dy in range(9):
        for dx in range(9):
            crop = TF.crop(padded, dy, dx, 32, 32)
            yield (dy, dx, False), crop
            yield (dy, dx, True), TF.hflip(crop)


def test_batched_crop_and_flip_match_torchvision_image_by_image(tmp_path):
    import torch

    root = write_cifar_batches(tmp_path / "cifar", per_batch=400)
    splits = build_cifar10(CIFAR10Options(root=str(root), download=False, verify=False))
    assert isinstance(splits.train, ImageTensors) and splits.train.crop_padding == 4 and splits.train.flip
    data = BatchedImages(splits.train, cpu(), seed=0, augment=True)
    indices = list(range(0, 2000, 2))
    inputs, targets = data.__getitems__(indices)
    assert inputs.shape == (1000, 3, 32, 32) and inputs.dtype == torch.float32
    assert targets.tolist() == splits.train.labels[indices].tolist()
    offsets, flips = set(), 0
    checked = range(0, 1000, 7)
    for position in checked:  # every 7th image against the 162 views torchvision could make, up to the first match
        views = torchvision_views(splits.train.images[indices[position]])
        match = next((view for view, pixels in views if torch.allclose(inputs[position], pixels, atol=1e-5)), None)
        assert match, f"image {position} is no crop/flip torchvision would make"
        offsets.add(match[:2])
        flips += match[2]
    assert len(offsets) >= 50, (
        f"only {len(offsets)} of 81 crop offsets drawn"
    )  # uniform over 81: ~67 expected of 143 draws
    assert 0.3 < flips / len(checked) < 0.7


def test_augmentation_is_seeded_by_job_seed_and_batch(tmp_path):
    import torch

    root = write_cifar_batches(tmp_path / "cifar", per_batch=20)
    split = build_cifar10(CIFAR10Options(root=str(root), download=False, verify=False)).train
    batch = [5, 17, 3, 40, 41, 99]
    first = BatchedImages(split, cpu(), seed=0, augment=True).__getitems__(batch)[0]
    again = BatchedImages(split, cpu(), seed=0, augment=True)
    torch.manual_seed(123)  # the global RNG plays no part
    assert torch.equal(first, again.__getitems__(batch)[0])
    assert not torch.equal(first, BatchedImages(split, cpu(), seed=1, augment=True).__getitems__(batch)[0])
    plain = BatchedImages(split, cpu(), seed=0, augment=False).__getitems__(batch)[0]
    assert not torch.equal(first, plain)


def test_in_memory_cifar_gives_torchvisions_validation_images(tmp_path):
    import torch

    root = write_cifar_batches(tmp_path / "cifar", per_batch=20)
    options = {"root": str(root), "download": False, "verify": False}
    fast = build_cifar10(CIFAR10Options(**options))
    slow = build_cifar10(CIFAR10Options(**options, in_memory=False))
    assert fast.digest == slow.digest and fast.classes == slow.classes
    inputs, targets = BatchedImages(fast.val, cpu(), seed=0, augment=False).__getitems__(list(range(20)))
    for index in range(20):
        image, label = slow.val[index]
        assert torch.allclose(inputs[index], image, atol=1e-5) and targets[index] == label
    example, _ = example_batch(fast.val)  # the first item twice, as the MLflow model's input example
    assert example.shape[0] == 2 and torch.allclose(example[1], slow.val[0][0], atol=1e-5)
    assert torch.equal(example_batch(slow.val)[0], torch.stack([slow.val[0][0]] * 2))


def test_in_memory_image_folder_decodes_once_to_the_same_inputs(digits_folder):
    import torch

    fast = build_imagefolder(ImageFolderOptions(root=str(digits_folder), in_memory=True, augment=True))
    slow = build_imagefolder(ImageFolderOptions(root=str(digits_folder)))
    assert len(fast.train) == len(slow.train) and fast.classes == slow.classes and fast.digest == slow.digest
    assert fast.train.flip and not fast.val.flip and fast.train.images.dtype == torch.uint8
    inputs, targets = BatchedImages(fast.val, cpu(), seed=0, augment=False).__getitems__([0, 10, 100])
    for position, index in enumerate([0, 10, 100]):
        image, label = slow.val[index]
        assert torch.allclose(inputs[position], image, atol=1e-5) and targets[position] == label


def test_in_memory_image_folder_refuses_images_of_several_sizes(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for size in (8, 12):
            folder = tmp_path / "imgs" / split / "a"
            folder.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (size, size)).save(folder / f"{size}.png")
    with pytest.raises(DataError) as caught:
        build_imagefolder(ImageFolderOptions(root=str(tmp_path / "imgs"), in_memory=True))
    assert "2 sizes" in str(caught.value) and "dataset.image_size" in str(caught.value)
    sized = build_imagefolder(ImageFolderOptions(root=str(tmp_path / "imgs"), in_memory=True, image_size=10))
    assert tuple(sized.train.images.shape) == (2, 3, 10, 10)


def test_channels_last_batches():
    import torch

    split = ImageTensors(
        torch.randint(0, 256, (8, 3, 6, 6), dtype=torch.uint8),
        torch.zeros(8, dtype=torch.long),
        [0.5] * 3,
        [0.2] * 3,
        2,
        True,
    )
    inputs, _ = BatchedImages(split, cpu(), seed=0, augment=True, channels_last=True).__getitems__(list(range(8)))
    assert inputs.is_contiguous(memory_format=torch.channels_last)
    inputs, _ = BatchedImages(split, cpu(), seed=0, augment=True).__getitems__(list(range(8)))
    assert inputs.is_contiguous()


def test_image_tensors_refuse_wrong_shapes():
    import torch

    with pytest.raises(ValueError, match=r"must be \(N, C, H, W\)"):
        ImageTensors(torch.zeros(4, 8, 8), torch.zeros(4), [0.0], [1.0])
    with pytest.raises(ValueError, match="labels must be"):
        ImageTensors(torch.zeros(4, 1, 8, 8), torch.zeros(5), [0.0], [1.0])
    with pytest.raises(ValueError, match="need 3 values"):
        ImageTensors(torch.zeros(4, 3, 8, 8), torch.zeros(4), [0.0], [1.0])


def test_fused_and_foreach_reach_torch_and_exclude_each_other(runjob_tester):
    import torch

    from runjob_builtins.optimizers import AdamWOptions, SGDOptions, build_adamw, build_sgd

    params = [torch.nn.Parameter(torch.zeros(3))]
    assert build_sgd(params, SGDOptions(fused=True)).param_groups[0]["fused"] is True
    assert build_adamw(params, AdamWOptions(foreach=True)).param_groups[0]["foreach"] is True
    assert build_sgd(params, SGDOptions()).param_groups[0]["foreach"] is None  # torch decides
    runjob_tester.write_job(
        "job.toml",
        '[model]\nname = "resnet18"\n[dataset]\nname = "synthetic"\n'
        '[optimizer]\nname = "adamw"\nfused = true\nforeach = true\n',
    )
    result = runjob_tester.cli("validate", "job.toml")
    assert result.returncode == 2
    assert "job.toml:5: optimizer: foreach = true and fused = true cannot both be set" in result.stderr
    assert "Traceback" not in result.stderr


def test_compile_mode_needs_compile(runjob_tester):
    runjob_tester.write_job(
        "job.toml",
        '[model]\nname = "resnet18"\n[dataset]\nname = "synthetic"\n[train]\ncompile_mode = "max-autotune"\n',
    )
    result = runjob_tester.cli("validate", "job.toml")
    assert result.returncode == 2
    assert 'compile_mode = "max-autotune" needs compile = true' in result.stderr


def test_worker_keys_with_an_in_memory_dataset_are_refused(runjob_tester):
    write_cifar_batches(runjob_tester.path / "cifar", per_batch=8)
    job = (
        '[model]\nname = "resnet18"\nnum_classes = 10\n'
        '[dataset]\nname = "cifar10"\nroot = "cifar"\ndownload = false\nverify = false\nnum_workers = 2\n'
    )
    runjob_tester.write_job("job.toml", job + "[tracking]\noffline = true\n")
    result = runjob_tester.cli("job.toml", "--set", "train.max_steps=1", "--set", "train.batch_size=4")
    assert result.returncode == 2, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert "dataset.num_workers = 2" in line and "`runjob plugins --long` lists 'cifar10''s options" in line
    assert "Traceback" not in result.stderr


PROBE_PLUGIN = """
import json, os
import runjob

def build_tiny(options):
    import torch.nn as nn
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10),
    )

@runjob.hookimpl
def runjob_register_models(register):
    register("tinycnn", build_tiny)

@runjob.hookimpl
def runjob_run_start(run):
    import torch
    from accelerate.utils import is_compiled_module
    conv = run.accelerator.unwrap_model(run.model, keep_torch_compile=False)[0]
    seen = {
        "compiled": is_compiled_module(run.model),
        "weights_channels_last": (
            conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
        ),
        "optimizer_fused": run.optimizer.param_groups[0].get("fused"),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,  # a flag only, on a CPU: set from the job all the same
    }
    with open(os.path.join(run.output_dir, "probe.json"), "w") as f:
        json.dump(seen, f)
"""

TINY_DIGITS = """
[job]
name = "fast"
[model]
name = "tinycnn"
[dataset]
name = "digits"
image_size = 8
[optimizer]
name = "sgd"
lr = 0.05
[train]
max_steps = 6
batch_size = 32
log_every = 2
checkpoint_every = 3
[tracking]
offline = true
"""


@pytest.mark.slow
def test_compiled_channels_last_fused_cudnn_benchmark_run_trains_saves_and_resumes(runjob_tester):
    import torch
    from safetensors.torch import load_file

    runjob_tester.install_plugin("fake-probe", {"fake_probe": PROBE_PLUGIN}, {"probe": "fake_probe"})
    runjob_tester.write_job("job.toml", TINY_DIGITS)
    fast = (
        "--set",
        "train.compile=true",
        "--set",
        "train.channels_last=true",
        "--set",
        "optimizer.fused=true",
        "--set",
        "train.cudnn_benchmark=true",
    )
    result = runjob_tester.cli("job.toml", *fast, "--output-dir", "fast")
    assert result.returncode == 0, result.stderr[-3000:]
    probe = json.loads((runjob_tester.path / "fast" / "probe.json").read_text())
    assert probe == {"compiled": True, "weights_channels_last": True, "optimizer_fused": True, "cudnn_benchmark": True}
    weights = load_file(runjob_tester.path / "fast" / "model.safetensors")
    assert not any(key.startswith("_orig_mod") for key in weights)  # saved as the plain model
    plain = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 10),
    )
    plain.load_state_dict(weights)
    assert [step for step, _ in runjob_tester.record("fast").local_history("train/loss")] == [2, 4, 6]

    baseline = runjob_tester.cli("job.toml", "--output-dir", "plain")
    assert baseline.returncode == 0, baseline.stderr[-3000:]
    assert json.loads((runjob_tester.path / "plain" / "probe.json").read_text()) == {
        "compiled": False,
        "weights_channels_last": False,
        "optimizer_fused": None,
        "cudnn_benchmark": False,
    }
    reference = load_file(runjob_tester.path / "plain" / "model.safetensors")
    for key, value in reference.items():  # the same training, up to kernel rounding
        assert torch.allclose(weights[key], value, atol=1e-3), key

    longer = runjob_tester.cli("job.toml", *fast, "--set", "train.max_steps=9", "--output-dir", "fast", "--resume")
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert "resuming step-00000006" in longer.stdout
    # max_steps ended mid-epoch: it goes on from there
    assert [step for step, _ in runjob_tester.record("fast").local_history("train/loss")] == [2, 4, 6, 8, 9]
    plain_resume = runjob_tester.cli("job.toml", "--set", "train.max_steps=12", "--output-dir", "fast", "--resume")
    assert plain_resume.returncode == 2
    assert "train.compile: true -> false" in plain_resume.stderr and "Traceback" not in plain_resume.stderr
