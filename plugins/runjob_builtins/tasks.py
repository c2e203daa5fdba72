"""Built-in tasks: ``classification`` (the default), ``regression`` and ``language_modeling``.

A task says what is learned from a batch: the loss, what evaluation accumulates and reports, and
what a batch holds for throughput (see ``runjob_register_tasks`` in :mod:`runjob.host.hookspecs`).
They use only the public plugin API, as a third-party task would.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import Field

from runjob import Generating, Task, TaskOptions, hookimpl

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    import torch

    from runjob import Register

# A model's outputs (a tensor, a dict, a Hugging Face ModelOutput: logits_of takes them) and a batch
# (what the DataLoader yields) are annotated ``object``: the tasks read them through Task's helpers.

# --- classification ---------------------------------------------------------------------------------


class ClassificationOptions(TaskOptions):
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    """Share of each target's probability spread over all classes in the training loss (0: none);
    evaluation reports the plain cross-entropy."""
    top_k: int | None = Field(None, ge=2)
    """Also report ``val/top<k>``: the share of samples whose class is among the k highest outputs."""

    def metrics(self) -> dict[str, Literal["max", "min"]]:
        declared: dict[str, Literal["max", "min"]] = {"accuracy": "max", "loss": "min"}
        if self.top_k:
            declared[f"top{self.top_k}"] = "max"
        return declared


class Classification(Task):
    """Batches ``(inputs, targets)``: targets are class indices ``(batch,)`` or class probabilities
    ``(batch, classes)``; the model gives logits ``(batch, classes)``."""

    def __init__(self, options: ClassificationOptions, num_classes: int | None) -> None:
        self.label_smoothing = options.label_smoothing
        self.top_k = options.top_k
        self.num_classes = num_classes

    def loss(self, outputs: object, batch: object) -> torch.Tensor:
        # lazy: plugin modules are imported by `runjob validate`, which must not load torch
        import torch.nn.functional as F

        return F.cross_entropy(self.logits_of(outputs), self.targets(batch), label_smoothing=self.label_smoothing)

    def check(self, outputs: object, batch: object) -> None:
        outputs = self.logits_of(outputs)
        classes = self.num_classes
        if outputs.ndim != 2 or (classes is not None and outputs.shape[1] != classes):
            if classes is None:
                raise ValueError(f"outputs of shape {tuple(outputs.shape)}: the task needs (batch, classes) logits")
            raise ValueError(
                f"outputs of shape {tuple(outputs.shape)}, but the dataset has {classes} classes: set "
                f"model.num_classes = {classes} (or the model's own option for its number of outputs)"
            )
        targets: torch.Tensor = self.targets(batch)
        if targets.is_floating_point() and targets.shape != outputs.shape:
            raise ValueError(
                f"targets of shape {tuple(targets.shape)} are probabilities but do not match the outputs' shape"
            )
        if self.top_k and self.top_k > outputs.shape[1]:
            raise ValueError(f"task.top_k = {self.top_k}, but there are only {outputs.shape[1]} classes")

    def evaluate(self, outputs: object, batch: object) -> dict[str, torch.Tensor]:
        # lazy: plugin modules are imported by `runjob validate`, which must not load torch
        import torch.nn.functional as F

        outputs, targets = self.logits_of(outputs), cast("torch.Tensor", self.targets(batch))
        losses = F.cross_entropy(outputs.float(), targets, reduction="none")
        classes = targets.argmax(dim=-1) if targets.is_floating_point() else targets
        values = {"loss": losses, "correct": outputs.argmax(dim=-1) == classes}
        if self.top_k:
            values["in_top_k"] = (outputs.topk(self.top_k, dim=-1).indices == classes[:, None]).any(dim=-1)
        return values

    def summarize(self, totals: dict[str, float], count: int) -> dict[str, float]:
        summary: dict[str, float] = {"accuracy": totals["correct"] / count, "loss": totals["loss"] / count}
        if self.top_k:
            summary[f"top{self.top_k}"] = totals["in_top_k"] / count
        return summary

    def predict(self, outputs: object) -> dict[str, torch.Tensor]:
        """The most likely class of each sample and its probability (softmax of the logits)."""
        probability, index = self.logits_of(outputs).float().softmax(dim=-1).max(dim=-1)
        return {"class": index, "probability": probability}


# --- regression -------------------------------------------------------------------------------------


class RegressionOptions(TaskOptions):
    loss: Literal["mse", "l1", "huber"] = "mse"
    """The training loss: mean squared error, mean absolute error, or Huber (squared near 0, absolute beyond)."""
    huber_delta: float = Field(1.0, gt=0)
    """Where the Huber loss turns from squared to absolute, in the targets' units."""

    def metrics(self) -> dict[str, Literal["max", "min"]]:
        return {"r2": "max", "mae": "min", "rmse": "min", "loss": "min"}


class Regression(Task):
    """Batches ``(inputs, targets)``: targets ``(batch,)`` for one value or ``(batch, k)`` for k;
    the model gives outputs of the same shape (``(batch, 1)`` is taken for one value)."""

    def __init__(self, options: RegressionOptions) -> None:
        self.kind = options.loss
        self.delta = options.huber_delta

    def _pair(self, outputs: object, batch: object) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs and targets as float ``(batch, k)``, the same shape, or a ValueError saying how they differ."""
        outputs, targets = self.logits_of(outputs), cast("torch.Tensor", self.targets(batch))
        wide_targets = targets[:, None] if targets.ndim == 1 else targets
        wide_outputs = outputs[:, None] if outputs.ndim == 1 else outputs
        if wide_outputs.shape != wide_targets.shape:
            values = wide_targets.shape[1] if wide_targets.ndim == 2 else "?"
            raise ValueError(
                f"outputs of shape {tuple(outputs.shape)} do not match targets of shape {tuple(targets.shape)}: the "
                f"model needs {values} output(s) per sample"
            )
        return wide_outputs.float(), wide_targets.to(wide_outputs.device, dtype=wide_outputs.dtype).float()

    def _per_value(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # lazy: plugin modules are imported by `runjob validate`, which must not load torch
        import torch.nn.functional as F

        if self.kind == "mse":
            return F.mse_loss(outputs, targets, reduction="none")
        if self.kind == "l1":
            return F.l1_loss(outputs, targets, reduction="none")
        return F.huber_loss(outputs, targets, reduction="none", delta=self.delta)

    def loss(self, outputs: object, batch: object) -> torch.Tensor:
        return self._per_value(*self._pair(outputs, batch)).mean()

    def check(self, outputs: object, batch: object) -> None:
        self._pair(outputs, batch)

    def evaluate(self, outputs: object, batch: object) -> dict[str, torch.Tensor]:
        outputs, targets = self._pair(outputs, batch)
        error = outputs - targets
        return {
            "loss": self._per_value(outputs, targets).mean(dim=1),
            "absolute": error.abs(),
            "squared": error.square(),
            "target": targets,
            "target_squared": targets.square(),
        }

    def summarize(self, totals: dict[str, Any], count: int) -> dict[str, float]:
        values = len(totals["squared"])
        r2: list[float] = []
        for sse, total, total_squared in zip(
            totals["squared"], totals["target"], totals["target_squared"], strict=True
        ):
            spread = total_squared - total * total / count  # the targets' sum of squares about their mean
            r2.append(1.0 - sse / spread if spread > 0 else float("nan"))
        return {
            "r2": sum(r2) / values,  # the mean over target columns, as scikit-learn's r2_score
            "mae": sum(totals["absolute"]) / (count * values),
            "rmse": math.sqrt(sum(totals["squared"]) / (count * values)),
            "loss": totals["loss"] / count,
        }

    def predict(self, outputs: object) -> dict[str, torch.Tensor]:
        """The predicted values: ``(batch,)`` for one value (a ``(batch, 1)`` output included), else ``(batch, k)``."""
        outputs = self.logits_of(outputs)
        return {"value": outputs[:, 0] if outputs.ndim == 2 and outputs.shape[1] == 1 else outputs}


# --- language modelling -----------------------------------------------------------------------------


class LanguageModelingOptions(TaskOptions):
    ignore_index: int = -100
    """Target token ids with this value (padding) are left out of the loss and the metrics."""

    def metrics(self) -> dict[str, Literal["max", "min"]]:
        return {"perplexity": "min", "loss": "min"}


class LanguageModeling(Task, Generating):
    """Next-token prediction. A batch is a token tensor ``(batch, T + 1)`` (the model reads the
    first T, each position predicts the next), an ``(inputs, targets)`` pair already aligned, or a
    tokenizer's dict with ``input_ids`` (and optionally ``labels`` aligned with them, as a Hugging
    Face model takes them, ``attention_mask``, ``position_ids``). The model gives logits ``(batch,
    T, vocabulary)``, as a tensor or as the ``logits`` of its outputs (a Hugging Face model's).

    Padding (an ``attention_mask``, left or right): the mask goes to a model whose ``forward`` names
    ``attention_mask``, with ``position_ids`` counted from each sequence's first real token when
    ``forward`` names them and the batch has none (so left and right padding give the same loss);
    only targets whose token and the token before it are both real are scored (and ``labels`` equal
    to ``ignore_index``, -100, never are); throughput counts only those. A model that takes token ids
    positionally (the built-in ``gpt``) gets ``input_ids`` alone. Throughput is counted in tokens.
    ``runjob predict`` continues prompts (:meth:`generate`)."""

    unit = "tokens"

    def __init__(self, options: LanguageModelingOptions, vocabulary: int | None) -> None:
        self.ignore_index = options.ignore_index
        self.vocabulary = vocabulary
        self._warned_unmasked = False

    @staticmethod
    def _real_pairs(mask: torch.Tensor) -> torch.Tensor:
        """``(batch, T)``: whether each (input token, next token) pair of a padded batch is real."""
        return (mask[:, :-1] != 0) & (mask[:, 1:] != 0)

    def _split(self, batch: object) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(batch, dict):
            if "input_ids" not in batch:
                raise ValueError(f"a dict batch needs 'input_ids' (it has {', '.join(map(str, batch))})")
            tokens: torch.Tensor = batch["input_ids"]
            labels: torch.Tensor = batch.get("labels", tokens)[:, 1:]
            if batch.get("attention_mask") is not None:
                labels = labels.masked_fill(~self._real_pairs(batch["attention_mask"]), self.ignore_index)
            return tokens[:, :-1], labels
        if isinstance(batch, (tuple, list)):
            return batch[0], batch[1]
        tokens = cast("torch.Tensor", batch)
        return tokens[:, :-1], tokens[:, 1:]

    def inputs(self, batch: object) -> torch.Tensor:
        """The token ids the model reads, a tensor (what a prompt is at prediction)."""
        return self._split(batch)[0]

    def targets(self, batch: object) -> torch.Tensor:
        return self._split(batch)[1]

    def forward(self, model: torch.nn.Module, batch: object) -> object:
        """:meth:`call_model` on the token ids (:meth:`inputs`); for a dict batch with an
        ``attention_mask`` or ``position_ids``, on a dict of those and ``input_ids`` (each without its
        last position, as the token ids), so the padding reaches the model."""
        tokens = self.inputs(batch)
        if isinstance(batch, dict):
            keys = ("attention_mask", "position_ids")
            padding = {key: batch[key][:, :-1] for key in keys if batch.get(key) is not None}
            if padding:
                return self.call_model(model, {"input_ids": tokens, **padding})
        return self.call_model(model, tokens)

    def call_model(self, model: torch.nn.Module, inputs: object) -> object:
        """A tensor of token ids goes in positionally. A dict (a padded batch) goes in as keyword
        arguments to a model whose ``forward`` names ``input_ids`` (a Hugging Face model), with
        ``position_ids`` counted from the mask when it names them and the batch has none; any other
        model gets ``input_ids`` positionally (a ``UserWarning``, once, says its padding is not
        masked inside the model)."""
        if isinstance(inputs, dict):
            mask: torch.Tensor | None = inputs.get("attention_mask")
            if mask is not None and not self.takes_keyword(model, "attention_mask"):
                self._warn_unmasked(model)
            if not self.takes_keyword(model, "input_ids"):
                return super().call_model(model, inputs["input_ids"])
            if mask is not None and "position_ids" not in inputs and self.takes_keyword(model, "position_ids"):
                positions = mask.long().cumsum(-1) - 1  # as Hugging Face's generate counts them
                inputs = {**inputs, "position_ids": positions.masked_fill(mask == 0, 1)}
        return super().call_model(model, inputs)

    def _warn_unmasked(self, model: torch.nn.Module) -> None:
        if not self._warned_unmasked:
            self._warned_unmasked = True
            warnings.warn(
                f"the batches are padded (attention_mask), but {type(model).__name__}.forward takes no attention_mask: "
                "padding is left out of the loss but not masked inside the model (right padding is still exact for "
                "a causal model, left padding is not)",
                UserWarning,
                stacklevel=3,
            )

    def loss(self, outputs: object, batch: object) -> torch.Tensor:
        # lazy: plugin modules are imported by `runjob validate`, which must not load torch
        import torch.nn.functional as F

        logits: torch.Tensor = self.logits_of(outputs)
        return F.cross_entropy(logits.flatten(0, 1), self.targets(batch).flatten(), ignore_index=self.ignore_index)

    def check(self, outputs: object, batch: object) -> None:
        outputs, targets = self.logits_of(outputs), self.targets(batch)
        if outputs.ndim != 3 or outputs.shape[:2] != targets.shape:
            raise ValueError(
                f"outputs of shape {tuple(outputs.shape)} for targets of shape {tuple(targets.shape)}: the model must "
                "give (batch, tokens, vocabulary) logits, one position per input token"
            )
        if self.vocabulary is not None and outputs.shape[2] < self.vocabulary:
            raise ValueError(
                f"outputs of shape {tuple(outputs.shape)} score {outputs.shape[2]} token ids, but the dataset has "
                f"{self.vocabulary}: set model.vocab_size = {self.vocabulary}"
            )

    def count(self, batch: object) -> int:
        """The targets of a batch; of a padded one, only the real ones (both tokens of the pair real
        under ``attention_mask``): that reads the mask, one small read from the device a step."""
        mask: torch.Tensor | None = batch.get("attention_mask") if isinstance(batch, dict) else None
        if mask is not None and mask.device.type != "meta":  # FLOP counting passes shapes only
            return int(self._real_pairs(mask).sum())
        return int(self.targets(batch).numel())

    def evaluate(self, outputs: object, batch: object) -> dict[str, torch.Tensor]:
        # lazy: plugin modules are imported by `runjob validate`, which must not load torch
        import torch.nn.functional as F

        outputs, targets = self.logits_of(outputs), self.targets(batch)
        losses = F.cross_entropy(
            outputs.float().flatten(0, 1), targets.flatten(), ignore_index=self.ignore_index, reduction="none"
        ).view(targets.shape)
        return {"loss": losses.sum(dim=1), "tokens": (targets != self.ignore_index).sum(dim=1)}

    def summarize(self, totals: dict[str, float], count: int) -> dict[str, float]:
        loss: float = totals["loss"] / totals["tokens"] if totals["tokens"] else float("nan")
        return {"perplexity": math.exp(loss) if loss < 700 else float("inf"), "loss": loss}

    def predict(self, outputs: object) -> dict[str, torch.Tensor]:
        """The most likely next token after each sample's last position."""
        return {"next_token": self.logits_of(outputs)[:, -1].argmax(dim=-1)}

    def generate(
        self,
        model: torch.nn.Module,
        tokens: torch.Tensor,
        max_new_tokens: int,
        context: int,
        temperature: float,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        """Token by token: the model reads the last ``context`` tokens and the next one is its most
        likely (``temperature`` 0) or drawn from the softmax of its logits divided by ``temperature``."""
        import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

        new = []
        with torch.no_grad():
            for _ in range(max_new_tokens):
                logits: torch.Tensor = self.logits_of(self.call_model(model, tokens[:, -context:]))[:, -1].float()
                if self.vocabulary is not None:
                    logits = logits[:, : self.vocabulary]  # ids past the data's vocabulary were never targets
                if temperature > 0:
                    probabilities = (logits / temperature).softmax(dim=-1)
                    token = torch.multinomial(probabilities.cpu(), 1, generator=generator).to(tokens.device)
                else:
                    token = logits.argmax(dim=-1, keepdim=True)
                new.append(token)
                tokens = torch.cat([tokens, token], dim=1)
        return torch.cat(new, dim=1) if new else tokens[:, :0]


@hookimpl
def runjob_register_tasks(register: Register) -> None:
    """Register classification, regression and language_modeling."""
    register(
        "classification",
        lambda options, data: Classification(options, data.num_classes),
        options=ClassificationOptions,
        description="cross-entropy over class logits; val/accuracy, val/loss (top-k on request)",
    )
    register(
        "regression",
        lambda options, data: Regression(options),
        options=RegressionOptions,
        description="mse, l1 or huber loss on one or more values; val/r2, val/mae, val/rmse",
    )
    register(
        "language_modeling",
        lambda options, data: LanguageModeling(options, data.num_classes),
        options=LanguageModelingOptions,
        description="next-token cross-entropy; val/perplexity, val/loss; throughput in tokens/s",
    )
