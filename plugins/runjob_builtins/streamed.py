"""Built-in converter ``images`` and dataset ``streamed_images``: an image folder converted to shards
(``runjob data convert FOLDER LOCATION``) and streamed from ``s3://``, ``gs://`` or a local folder of
shards, decoded and transformed in the loader workers as the ``imagefolder`` dataset transforms its
files. Needs the stream extra (``pip install 'runjob-train[stream]'``).

The converter reads ``train/<class>/``, ``val/<class>/`` and optionally ``test/<class>/`` (as
``imagefolder`` does); a record is ``{"id": int, "label": int, "image": bytes}``, the file's own
bytes: decoding, resizing and augmenting happen in the training run's loader workers."""

from __future__ import annotations

import hashlib
import io
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from runjob import DataError, DatasetSplits, Options, ShardSource, Streamed, StreamOptions, hookimpl, require_module
from runjob_builtins.image_datasets import ImageFileInputs, ImageNormalization

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    import torch

    from runjob import Register

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
SPLITS = ("train", "val", "test")


class StreamedImagesOptions(ImageNormalization, StreamOptions):
    image_size: int | None = Field(None, ge=1)
    """Resize every image to image_size x image_size; by default images keep their size."""
    augment: bool = False
    """Random horizontal flip for training (drawn from the job's seed, the epoch and the image)."""

    @model_validator(mode="after")
    def _needs_litdata(self) -> StreamedImagesOptions:
        require_module("litdata", "stream", "dataset 'streamed_images'")
        return self


class ImageRecords:
    """A stored image record (``{"id", "label", "image": bytes}``) as ``(image tensor, label)``:
    decoded as RGB, resized, flipped when drawn (training with ``augment``), scaled to [0, 1] and
    normalized: the ``imagefolder`` dataset's transform."""

    def __init__(self, size: int | None, mean: list[float], std: list[float], flip: bool) -> None:
        self.size, self.mean, self.std, self.flip = size, mean, std, flip

    def __call__(self, record: dict[str, Any], draw: random.Random) -> tuple[torch.Tensor, int]:
        # lazy: plugin modules are imported by `runjob validate`, which must not load torch, torchvision and PIL
        import torchvision.transforms.functional as F
        from PIL import Image

        try:
            image = Image.open(io.BytesIO(record["image"])).convert("RGB")
        except Exception as error:  # noqa: BLE001 - PIL raises many kinds for bytes that are not an image
            raise DataError(
                f"sample {record.get('id')}: cannot decode its image ({type(error).__name__}: {error})"
            ) from None
        if self.size:
            image = F.resize(image, [self.size, self.size])
        if self.flip and draw.random() < 0.5:
            image = F.hflip(image)
        return F.normalize(F.to_tensor(image), self.mean, self.std), int(record["label"])


@dataclass(frozen=True)
class ImageFile:
    """One image of an image folder: its place in its split (the record's id), class and path."""

    id: int
    label: int
    path: str


def image_folder(root: Path) -> tuple[list[str], dict[str, list[ImageFile]]]:
    """The classes and each split's images of an image folder (sorted: ids are stable), with a
    one-line DataError for a folder that is not one."""
    splits = [name for name in SPLITS if (root / name).is_dir()]
    if "train" not in splits or "val" not in splits:
        raise DataError(f"{root}: an image folder holds train/<class>/ and val/<class>/ folders of images")
    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"{root / 'train'}: no class folders")
    found: dict[str, list[ImageFile]] = {}
    for split in splits:
        others = sorted(p.name for p in (root / split).iterdir() if p.is_dir() and p.name not in classes)
        if others:
            raise DataError(f"{root / split}: class folders {others} are not in train/ ({len(classes)} classes)")
        files = [
            (label, path)
            for label, name in enumerate(classes)
            if (root / split / name).is_dir()
            for path in sorted((root / split / name).rglob("*"))
            if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not files:
            raise DataError(f"{root / split}: no image files ({', '.join(IMAGE_SUFFIXES)})")
        found[split] = [ImageFile(i, label, str(path)) for i, (label, path) in enumerate(files)]
    return classes, found


def split_digest(root: Path, files: list[ImageFile]) -> str:
    """A digest of a split's images: each one's place, class, name and bytes."""
    digest = hashlib.sha256()
    for item in files:
        digest.update(f"{item.id}\0{item.label}\0{Path(item.path).relative_to(root).as_posix()}\0".encode())
        digest.update(Path(item.path).read_bytes())
    return digest.hexdigest()


def image_record(item: ImageFile) -> dict[str, Any]:
    """The record of one image (run in the conversion's worker processes)."""
    return {"id": item.id, "label": item.label, "image": Path(item.path).read_bytes()}


def convert_images(source: str, options: Options) -> ShardSource:
    """An image folder's splits as image records (``runjob data convert FOLDER LOCATION``)."""
    root = Path(source).expanduser().resolve()
    if not root.is_dir():
        raise DataError(f"{source}: no such folder (an image folder: train/<class>/, val/<class>/)")
    classes, splits = image_folder(root)
    return ShardSource(
        splits=splits,
        record=image_record,
        digests={split: split_digest(root, files) for split, files in splits.items()},
        source=str(root),
        facts={"classes": classes},
        sizes={split: sum(Path(item.path).stat().st_size for item in files) for split, files in splits.items()},
    )


def build_streamed_images(options: StreamedImagesOptions) -> DatasetSplits:
    """The location's converted image splits, streamed."""
    # lazy: plugin modules are imported by `runjob validate`, which reads no store
    from runjob import stream_manifest

    manifest = stream_manifest(options)
    if manifest.get("kind") != "images":
        raise DataError(
            f"dataset.location = {options.location!r} holds {manifest.get('kind')!r} shards, not images: "
            "give the location of an image folder's conversion"
        )
    splits = manifest["splits"]
    if "val" not in splits:
        raise DataError(f"dataset.location = {options.location!r}: the conversion has no val split")

    def split(name: str, training: bool) -> Streamed:
        transform = ImageRecords(options.image_size, options.mean, options.std, flip=training and options.augment)
        info = splits[name]
        return Streamed(options, name, transform, int(info["samples"]), str(info["digest"]), augment=training)

    classes = [str(c) for c in manifest["classes"]]
    return DatasetSplits(
        train=split("train", training=True),
        val=split("val", training=False),
        test=split("test", training=False) if "test" in splits else None,
        num_classes=len(classes),
        classes=classes,
        source=options.where.url(),
        digest=str(manifest["source_digest"])[:16],
        inputs=ImageFileInputs(options.image_size, options.mean, options.std),  # the validation split's transform
        channels=3,
        image_size=options.image_size,
    )


@hookimpl
def runjob_register_converters(register: Register) -> None:
    """Register images."""
    register(
        "images",
        convert_images,
        description="an image folder (train/<class>/, val/<class>/, test/<class>/): each file's bytes and class",
    )


@hookimpl
def runjob_register_datasets(register: Register) -> None:
    """Register streamed_images."""
    register(
        "streamed_images",
        build_streamed_images,
        options=StreamedImagesOptions,
        description="an image folder converted by `runjob data convert`, streamed from s3://, gs:// or a folder",
    )
