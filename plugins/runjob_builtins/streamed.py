"""Built-in dataset ``streamed_images``: an image folder converted to shards (``runjob data convert``)
and streamed from ``s3://``, ``gs://`` or a local folder of shards, decoded and transformed in the
loader workers as the ``imagefolder`` dataset transforms its files. Needs the stream extra
(``pip install 'runjob-train[stream]'``)."""

from __future__ import annotations

import io
import random
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from runjob import DataError, DatasetSplits, Streamed, StreamOptions, hookimpl, require_module
from runjob_builtins.image_datasets import ImageFileInputs, ImageNormalization

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    import torch

    from runjob import Register


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
def runjob_register_datasets(register: Register) -> None:
    """Register streamed_images."""
    register(
        "streamed_images",
        build_streamed_images,
        options=StreamedImagesOptions,
        description="an image folder converted by `runjob data convert`, streamed from s3://, gs:// or a folder",
    )
