"""Built-in task ``segmentation``: a class for every pixel, learned with per-pixel cross-entropy and
reported as mean intersection over union (mIoU), pixel accuracy and loss.

Batches are ``(images, masks)``: images ``(N, C, H, W)`` and masks ``(N, H, W)`` of int64 class
indices in ``0 .. num_classes - 1`` (the dataset's ``DatasetSplits.num_classes``, background
included); mask pixels equal to ``ignore_index`` (object borders, unlabelled areas) count in neither
the loss nor the metrics. The model returns logits ``(N, num_classes, H, W)``: the masks' height and
width, one channel a class. The first training batch is checked against that, so a model built for
the wrong number of classes or one that shrinks the image stops the run with the shapes to fix::

    [task]
    name = "segmentation"
    ignore_index = 255        # e.g. Pascal VOC's border pixels; -100 by default
    label_smoothing = 0.0

    [train]
    best_metric = "val/miou"  # the default: the first metric the task declares

Evaluation reports ``val/miou`` (the mean over classes present in the masks or the predictions:
a class that is in neither has no IoU and is left out), ``val/pixel_accuracy`` (correct pixels over
pixels that count) and ``val/loss`` (each image's mean over its pixels, averaged over images).
The counts behind them are summed over the whole validation set before dividing, so they do not
depend on the batch size or the number of processes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import Field

from runjob import DatasetSplits, Task, TaskOptions, hookimpl

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    import torch

    from runjob import Register


class SegmentationOptions(TaskOptions):
    ignore_index: int = -100
    """Mask value of pixels left out of the loss and the metrics (255 in Pascal VOC's masks)."""
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    """Share of each pixel's target spread evenly over all classes (0: plain cross-entropy)."""

    def metrics(self) -> dict[str, Literal["max", "min"]]:
        return {"miou": "max", "pixel_accuracy": "max", "loss": "min"}


class Segmentation(Task):
    """Per-pixel classification of ``(images, masks)`` batches into ``num_classes`` classes."""

    def __init__(self, options: SegmentationOptions, num_classes: int | None) -> None:
        self.options = options
        self.num_classes = num_classes

    def targets(self, batch: object) -> torch.Tensor:
        return cast("torch.Tensor", super().targets(batch)).long()  # no copy when the masks are int64 already

    def loss(self, outputs: torch.Tensor, batch: object) -> torch.Tensor:
        # lazy: plugin modules are imported by `runjob validate`, which must not load torch
        import torch.nn.functional as F

        return F.cross_entropy(
            outputs,
            self.targets(batch),
            ignore_index=self.options.ignore_index,
            label_smoothing=self.options.label_smoothing,
        )

    def check(self, outputs: torch.Tensor, batch: object) -> None:
        classes = self._classes()
        masks = self.targets(batch)
        shape, mask_shape = tuple(outputs.shape), tuple(masks.shape)
        if len(mask_shape) != 3:
            raise ValueError(
                f"masks of shape {mask_shape}: the segmentation task expects masks of shape (batch, height, width) "
                "holding a class index per pixel"
            )
        wanted = (mask_shape[0], classes, *mask_shape[1:])
        if shape == wanted:
            self._check_mask_values(masks, classes)
            return
        seen = f"outputs of shape {shape}, but the dataset has {classes} classes and masks of shape {mask_shape}"
        if len(shape) == 4 and shape[1] != classes:
            raise ValueError(f"{seen}: set model.num_classes = {classes}")
        raise ValueError(
            f"{seen}: the model must return logits of shape {wanted} (batch, classes, height, width), "
            "at the masks' height and width (pad its convolutions or upsample its output)"
        )

    def _classes(self) -> int:
        if self.num_classes is None:
            raise ValueError(
                "the dataset does not say how many classes its masks index (DatasetSplits.num_classes is None): "
                "the segmentation task needs it"
            )
        if self.num_classes < 2:
            raise ValueError(
                f"the dataset has {self.num_classes} class: the segmentation task needs at least 2 "
                "(the background counts as one)"
            )
        return self.num_classes

    def _check_mask_values(self, masks: torch.Tensor, classes: int) -> None:
        # once, on the first batch: a class index out of range fails deep inside cross_entropy on
        # the CPU and as a device-side assert on CUDA, neither of which says what to fix
        ignore = self.options.ignore_index
        counted = masks[masks != ignore]
        if counted.numel() == 0:
            return
        low, high = int(counted.min()), int(counted.max())
        if low < 0 or high >= classes:
            bad = low if low < 0 else high
            raise ValueError(
                f"masks hold class index {bad}, but the dataset has {classes} classes (0 to {classes - 1}): "
                f"pixels to leave out must be task.ignore_index = {ignore}, or set it to their value"
            )

    def evaluate(self, outputs: torch.Tensor, batch: object) -> dict[str, torch.Tensor]:
        # lazy: plugin modules are imported by `runjob validate`, which must not load torch
        import torch
        import torch.nn.functional as F

        classes = self._classes()
        masks = self.targets(batch)
        ignore = self.options.ignore_index
        valid = masks != ignore
        pixel_losses = F.cross_entropy(
            outputs.float(), masks, ignore_index=ignore, label_smoothing=self.options.label_smoothing, reduction="none"
        )  # 0 at ignored pixels
        valid_pixels = valid.flatten(1).sum(1)
        loss = pixel_losses.flatten(1).sum(1) / valid_pixels.clamp(min=1)

        predictions = outputs.argmax(1)
        hits = (predictions == masks) & valid
        labels = torch.where(valid, masks, 0)  # an ignored pixel adds 0 to class 0's counts
        # per-sample class counts with scatter_add_: no device sync (bincount waits for its input's
        # max on CUDA, masking with a boolean tensor waits for the count), no (N, H, W, classes) one-hot
        intersection = per_class(labels, hits, classes)
        in_masks = per_class(labels, valid, classes)
        in_predictions = per_class(predictions, valid, classes)
        return {
            "loss": loss,
            "correct_pixels": hits.flatten(1).sum(1),
            "valid_pixels": valid_pixels,
            "intersection": intersection,
            "union": in_masks + in_predictions - intersection,
        }

    def summarize(self, totals: dict[str, Any], count: int) -> dict[str, float]:
        ious = [i / u for i, u in zip(totals["intersection"], totals["union"], strict=True) if u > 0]
        valid = totals["valid_pixels"]
        return {
            "miou": sum(ious) / len(ious) if ious else math.nan,
            "pixel_accuracy": totals["correct_pixels"] / valid if valid else math.nan,
            "loss": totals["loss"] / count if count else math.nan,
        }


def per_class(classes: torch.Tensor, counted: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``(N, num_classes)`` int64: for each sample, how many of its pixels where ``counted`` is true
    have each class in ``classes`` (``(N, H, W)`` indices, each in range)."""
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    counts = torch.zeros(classes.shape[0], num_classes, dtype=torch.long, device=classes.device)
    return counts.scatter_add_(1, classes.flatten(1), counted.flatten(1).long())


def build_segmentation(options: SegmentationOptions, data: DatasetSplits) -> Segmentation:
    return Segmentation(options, data.num_classes)


@hookimpl
def runjob_register_tasks(register: Register) -> None:
    register(
        "segmentation",
        build_segmentation,
        options=SegmentationOptions,
        description="a class per pixel: cross-entropy; mIoU, pixel accuracy",
    )
