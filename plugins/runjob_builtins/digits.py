"""Built-in dataset ``digits``: scikit-learn's bundled 8x8 scans of handwritten digits (1,797 of
them, no download), upscaled to 3-channel images so torchvision models take them.

Needs scikit-learn (``pip install 'runjob-train[digits]'``). ``python -m runjob_builtins.digits
export DIR`` writes the same images as PNG files in ``DIR/train/<digit>/`` and ``DIR/val/<digit>/``
for the ``imagefolder`` dataset.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from runjob import DatasetSplits, ImageTensors, Options, hookimpl, require_module
from runjob_builtins.image_datasets import ImageFileInputs

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    import torch

    from runjob import Register


class DigitsOptions(Options):
    image_size: int = Field(32, ge=8, le=256)
    """Side of the square images, upscaled from 8x8 (bilinear)."""
    val_fraction: float = Field(0.2, gt=0, lt=1)
    """Share of the 1,797 scans held out for validation."""
    split_seed: int = Field(0, ge=0)
    """Seed of the train/validation split (fixed, so runs compare)."""

    @model_validator(mode="after")
    def _needs_sklearn(self) -> DigitsOptions:
        require_module("sklearn", "digits", "dataset 'digits'")
        return self


def digits_file() -> Path:
    """scikit-learn's bundled ``digits.csv.gz`` (64 pixel columns, then the label), found without
    importing scikit-learn: ``sklearn.datasets`` costs seconds of imports, the file milliseconds."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:  # DigitsOptions checked it is installed
        raise ModuleNotFoundError("digits needs scikit-learn: pip install 'runjob-train[digits]'")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"


def digits_tensors(image_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All scans as a float tensor (N, 3, size, size) in [0, 1] and their labels (N,); the same
    data as ``sklearn.datasets.load_digits()``."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load numpy and torch
    import numpy as np
    import torch
    import torch.nn.functional as F

    table = np.loadtxt(digits_file(), delimiter=",", dtype=np.float32)
    images = torch.from_numpy(table[:, :-1].reshape(-1, 1, 8, 8)) / 16.0
    labels = torch.from_numpy(table[:, -1].astype(np.int64))
    images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False).clamp(0, 1)
    return images.expand(-1, 3, -1, -1).contiguous(), labels


def split_indices(count: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random split of ``range(count)`` into (train, val) index tensors."""
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    val_count = max(1, round(count * val_fraction))
    return order[val_count:], order[:val_count]


def build_digits(options: DigitsOptions) -> DatasetSplits:
    """The scans in memory (17 MB at 32x32), normalized to [-1, 1] batch by batch on the training device."""
    images, labels = digits_tensors(options.image_size)
    train_idx, val_idx = split_indices(len(labels), options.val_fraction, options.split_seed)
    mean, std = [0.5] * 3, [0.5] * 3
    normalized = (images - 0.5) / 0.5
    return DatasetSplits(
        train=ImageTensors(images[train_idx], labels[train_idx], mean, std),
        val=ImageTensors(images[val_idx], labels[val_idx], mean, std),
        num_classes=10,
        classes=[str(d) for d in range(10)],
        source="sklearn.datasets.load_digits",
        digest=hashlib.sha256(normalized.numpy().tobytes() + labels.numpy().tobytes()).hexdigest()[:16],
        # image files of digits, light on dark as `export` writes them: one gray level, three channels
        inputs=ImageFileInputs(options.image_size, mean, std, gray=True),
    )


def export_image_folder(target: Path, image_size: int = 32, val_fraction: float = 0.2, seed: int = 0) -> int:
    """Write the scans as PNG files in target/train/<digit>/ and target/val/<digit>/; return the count."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load torch and PIL
    import torch
    from PIL import Image

    images, labels = digits_tensors(image_size)
    train_idx, val_idx = split_indices(len(labels), val_fraction, seed)
    for split, indices in (("train", train_idx), ("val", val_idx)):
        for index in indices.tolist():
            folder = target / split / str(int(labels[index]))
            folder.mkdir(parents=True, exist_ok=True)
            pixels = (images[index, 0] * 255).round().to(torch.uint8).numpy()
            Image.fromarray(pixels, mode="L").save(folder / f"{index:04d}.png")
    return len(labels)


@hookimpl
def runjob_register_datasets(register: Register) -> None:
    """Register digits."""
    register(
        "digits",
        build_digits,
        options=DigitsOptions,
        description="scikit-learn's 1,797 handwritten digit scans (offline)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runjob_builtins.digits", description="Export the digits scans as a PNG image folder."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    export = sub.add_parser("export", help="write DIR/train/<digit>/*.png and DIR/val/<digit>/*.png")
    export.add_argument("dir", type=Path)
    export.add_argument("--image-size", type=int, default=32)
    args = parser.parse_args(argv)
    try:
        require_module("sklearn", "digits", "exporting digits")
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: {error}\n")
    count = export_image_folder(args.dir, args.image_size)
    print(f"wrote {count} images to {args.dir}/train and {args.dir}/val")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
