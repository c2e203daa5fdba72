"""The task ``token_classification``: a class per token (NER, part of speech), scored only where
the labels say (-100: a word's later sub-tokens, special tokens, padding are never scored)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, cast

from pydantic import Field

import runjob

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    import torch

# A model's outputs (a tensor, a Hugging Face ModelOutput: logits_of takes them) and a batch (a
# tokenizer's dict, or an (inputs, labels) pair) are annotated ``object``: read through Task's helpers.


class TokenClassificationOptions(runjob.TaskOptions):
    ignore_index: int = -100
    """Labels with this value are left out of the loss and the metrics."""
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    """Share of each target's probability spread over all classes in the training loss (0: none)."""

    def metrics(self) -> dict[str, Literal["max", "min"]]:
        return {"accuracy": "max", "loss": "min"}


class TokenClassification(runjob.Task):
    """Batches ``{"input_ids", "attention_mask", "labels"}`` (or ``(inputs, labels)`` pairs) with
    labels ``(batch, T)``; the model gives logits ``(batch, T, classes)`` (a tensor, or a Hugging
    Face model's outputs). ``val/accuracy`` is the share of scored tokens whose class is right."""

    def __init__(self, options: TokenClassificationOptions, num_classes: int | None) -> None:
        self.ignore_index = options.ignore_index
        self.label_smoothing = options.label_smoothing
        self.num_classes = num_classes

    def inputs(self, batch: object) -> object:
        if isinstance(batch, Mapping):
            return {key: value for key, value in batch.items() if key != "labels"}
        return super().inputs(batch)

    def targets(self, batch: object) -> torch.Tensor:
        if isinstance(batch, Mapping):
            if "labels" not in batch:
                raise ValueError(f"a dict batch needs 'labels' (it has {', '.join(map(str, batch))})")
            labels: torch.Tensor = batch["labels"]
            return labels
        return cast("torch.Tensor", super().targets(batch))

    def loss(self, outputs: object, batch: object) -> torch.Tensor:
        # lazy: plugin modules are imported by `runjob validate`, which must not load torch
        import torch.nn.functional as F

        logits: torch.Tensor = self.logits_of(outputs)
        return F.cross_entropy(
            logits.flatten(0, 1),
            self.targets(batch).flatten(),
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
        )

    def check(self, outputs: object, batch: object) -> None:
        logits, labels = self.logits_of(outputs), self.targets(batch)
        if logits.ndim != 3 or logits.shape[:2] != labels.shape:
            raise ValueError(
                f"outputs of shape {tuple(logits.shape)} for labels of shape {tuple(labels.shape)}: the model must "
                'give (batch, tokens, classes) logits (task_class = "token_classification")'
            )
        if self.num_classes is not None and logits.shape[2] != self.num_classes:
            raise ValueError(
                f"outputs score {logits.shape[2]} classes, but the dataset has {self.num_classes}: leave the model's "
                "num_labels to the data"
            )

    def evaluate(self, outputs: object, batch: object) -> dict[str, torch.Tensor]:
        # lazy: plugin modules are imported by `runjob validate`, which must not load torch
        import torch.nn.functional as F

        logits, labels = self.logits_of(outputs).float(), self.targets(batch)
        scored = labels != self.ignore_index
        losses = F.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=self.ignore_index, reduction="none"
        ).view(labels.shape)
        correct = (logits.argmax(dim=-1) == labels) & scored
        return {"loss": losses.sum(dim=1), "tokens": scored.sum(dim=1), "correct": correct.sum(dim=1)}

    def summarize(self, totals: dict[str, float], count: int) -> dict[str, float]:
        tokens = totals["tokens"]
        if not tokens:
            return {"accuracy": float("nan"), "loss": float("nan")}
        return {"accuracy": totals["correct"] / tokens, "loss": totals["loss"] / tokens}

    def predict(self, outputs: object) -> dict[str, torch.Tensor]:
        """Each token position's class index (``class_0``, ``class_1``, ... columns)."""
        return {"class": self.logits_of(outputs).argmax(dim=-1)}


class BitsPerByteOptions(runjob.CallbackOptions):
    """``[callbacks.bits_per_byte]``: log ``val/bits_per_byte`` after each evaluation of a language
    model on ``hf_text``: ``val/loss`` (nats a token) x the validation split's tokens a byte /
    ln 2, comparable across tokenizers (a byte-level model's is log2 of its perplexity)."""

    def metrics(self) -> dict[str, Literal["max", "min"]]:
        return {"val/bits_per_byte": "min"}


class BitsPerByte(runjob.Callback):
    def __init__(self, options: BitsPerByteOptions) -> None:
        self.tokens_per_byte: float | None = None

    def on_run_start(self, run: runjob.Run) -> None:
        loader = run.val_loader
        # hf_text's windows, or hf_text_streamed's split (a streamed loader's dataset is LitData's)
        split = getattr(loader, "streamed", None) or getattr(loader, "dataset", None)
        self.tokens_per_byte = getattr(split, "tokens_per_byte", None)
        if self.tokens_per_byte is None:
            raise ValueError(
                "bits_per_byte needs the dataset hf_text or hf_text_streamed (they know the validation text's bytes)"
            )

    def on_evaluation(self, run: runjob.Run, step: int, epoch: int, metrics: Mapping[str, float]) -> None:
        loss = metrics.get("val/loss")
        if loss is not None and self.tokens_per_byte:
            run.log({"val/bits_per_byte": loss * self.tokens_per_byte / math.log(2)})
