"""A third-party runjob plugin: registers the model ``tiny_mlp``, the task ``focal_classification``
and the callback ``loss_plateau``.

Job files use them as::

    [model]
    name = "tiny_mlp"
    num_classes = 10
    in_features = 3072   # 3 x 32 x 32 images, flattened
    hidden_size = 64

    [task]
    name = "focal_classification"   # focal loss, for imbalanced classes
    gamma = 2.0                      # >= 0; 0 is plain cross-entropy
    # optional: one positive weight per class (here the rare class 9 counts four times)
    alpha = [1, 1, 1, 1, 1, 1, 1, 1, 1, 4]

    [train]
    best_metric = "val/balanced_accuracy"

    [callbacks.loss_plateau]         # stop when the training loss stops falling
    patience = 5                     # log steps in a row without a new lowest train/loss
    min_delta = 0.0                  # how much lower counts as new
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from pydantic import Field, PositiveFloat

import runjob

if TYPE_CHECKING:  # torch names in annotations only: loading a plugin must not import torch
    import torch

    Batch: TypeAlias = tuple[torch.Tensor, torch.Tensor]
    """What the task's batches are: (inputs, class indices)."""


class TinyMLPOptions(runjob.Options):
    num_classes: int = Field(..., ge=2)
    in_features: int = Field(3 * 32 * 32, ge=1)
    """Inputs are flattened: channels x height x width (3x32x32 by default)."""
    hidden_size: int = Field(64, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)


def build_tiny_mlp(options: TinyMLPOptions) -> torch.nn.Module:
    # torch is imported here, not at module level, so `runjob --help` stays fast
    import torch.nn as nn

    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(options.in_features, options.hidden_size),
        nn.ReLU(),
        nn.Dropout(options.dropout),
        nn.Linear(options.hidden_size, options.num_classes),
    )


# --- a task: focal loss (Lin et al. 2017, "Focal Loss for Dense Object Detection") -------------------


class FocalOptions(runjob.TaskOptions):
    gamma: float = Field(2.0, ge=0)
    """How much well-classified samples are down-weighted: each sample's cross-entropy is scaled by
    ``(1 - p_t) ** gamma``, p_t its probability of the right class. 0 is plain cross-entropy."""
    alpha: list[PositiveFloat] | None = None
    """One weight per class, multiplying the loss of that class's samples (none: all 1)."""

    def metrics(self) -> dict[str, Literal["max", "min"]]:
        # balanced accuracy, the mean of per-class recall, is what counts when classes are imbalanced
        return {"accuracy": "max", "balanced_accuracy": "max", "loss": "min"}


class FocalClassification(runjob.Task):
    """Batches ``(inputs, class indices)``; the model gives logits ``(batch, classes)``."""

    def __init__(self, options: FocalOptions) -> None:
        self.gamma = options.gamma
        self.alpha = options.alpha

    def _focal(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Each sample's focal loss, shape ``(batch,)``."""
        import torch.nn.functional as F

        cross_entropy = F.cross_entropy(outputs.float(), targets, reduction="none")  # -log(p_t)
        # 1 - p_t, kept above 0 so that 0 < gamma < 1 has a finite gradient where p_t rounds to 1
        loss = (-(-cross_entropy).expm1()).clamp_min(1e-12) ** self.gamma * cross_entropy
        if self.alpha is not None:
            loss = loss * outputs.new_tensor(self.alpha, dtype=loss.dtype)[targets]
        return loss

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self._focal(outputs, self.targets(batch)).mean()

    def check(self, outputs: torch.Tensor, batch: Batch) -> None:
        targets = self.targets(batch)
        if outputs.ndim != 2 or targets.ndim != 1 or targets.is_floating_point():
            raise ValueError(
                f"outputs of shape {tuple(outputs.shape)}, targets of shape {tuple(targets.shape)}: the task "
                "needs (batch, classes) logits and (batch,) class indices"
            )
        if self.alpha is not None and len(self.alpha) != outputs.shape[1]:
            raise ValueError(
                f"task.alpha has {len(self.alpha)} weights, but the outputs have {outputs.shape[1]} classes: "
                "give one weight per class"
            )

    def evaluate(self, outputs: torch.Tensor, batch: Batch) -> dict[str, torch.Tensor]:
        import torch.nn.functional as F

        targets = self.targets(batch)
        support = F.one_hot(targets, outputs.shape[1])  # (batch, classes): 1 at each sample's class
        hit = support * (outputs.argmax(dim=1) == targets)[:, None]  # ... where it was predicted right
        return {"loss": self._focal(outputs, targets), "support": support, "hit": hit}

    def summarize(self, totals: dict[str, Any], count: int) -> dict[str, float]:
        # totals["support"][c]: samples of class c; totals["hit"][c]: those predicted right.
        # Classes absent from the split have no recall and are left out, as scikit-learn does.
        recalls = [hit / support for hit, support in zip(totals["hit"], totals["support"], strict=True) if support]
        return {
            "accuracy": sum(totals["hit"]) / count,
            "balanced_accuracy": sum(recalls) / len(recalls),
            "loss": totals["loss"] / count,
        }


# --- a callback: stop when the training loss plateaus --------------------------------------------------


class LossPlateauOptions(runjob.CallbackOptions):
    patience: int = Field(5, ge=1)
    """Log steps (every ``train.log_every`` optimizer steps) in a row without a new lowest
    ``train/loss`` before training stops."""
    min_delta: float = Field(0.0, ge=0)
    """How much lower than the lowest so far counts as a new lowest."""

    def metrics(self) -> dict[str, Literal["max", "min"]]:
        return {"train/plateau_steps": "min"}


class LossPlateau(runjob.Callback):
    """Counts log steps without a new lowest ``train/loss``, logs the count as
    ``train/plateau_steps`` and asks the run to stop once it reaches ``patience``. The lowest loss
    and the count go into every checkpoint, so a resumed run counts on."""

    def __init__(self, options: LossPlateauOptions) -> None:
        self.patience = options.patience
        self.min_delta = options.min_delta
        self.lowest: float | None = None
        self.plateau = 0

    def on_log(self, run: runjob.Run, step: int, epoch: int, metrics: dict[str, float]) -> None:
        # train/loss is the mean over processes: every process counts the same
        loss = metrics["train/loss"]
        if self.lowest is None or loss < self.lowest - self.min_delta:
            self.lowest, self.plateau = loss, 0
        else:
            self.plateau += 1
        run.log({"train/plateau_steps": self.plateau})
        if self.plateau >= self.patience:
            run.request_stop(f"loss_plateau: no new lowest train/loss ({self.lowest:.4g}) for {self.plateau} log steps")

    def state_dict(self) -> dict[str, Any]:
        return {"lowest": self.lowest, "plateau": self.plateau}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lowest, self.plateau = state["lowest"], state["plateau"]


@runjob.hookimpl
def runjob_register_models(register: runjob.Register) -> None:
    """Register tiny_mlp."""
    register("tiny_mlp", build_tiny_mlp, options=TinyMLPOptions, description="Flatten, one hidden layer, logits")


@runjob.hookimpl
def runjob_register_tasks(register: runjob.Register) -> None:
    """Register focal_classification."""
    register(
        "focal_classification",
        lambda options, data: FocalClassification(options),
        options=FocalOptions,
        description="focal loss for imbalanced classes; val/accuracy, val/balanced_accuracy, val/loss",
    )


@runjob.hookimpl
def runjob_register_callbacks(register: runjob.Register) -> None:
    """Register loss_plateau."""
    register(
        "loss_plateau",
        LossPlateau,
        options=LossPlateauOptions,
        description="stop when train/loss has no new lowest for `patience` log steps; logs train/plateau_steps",
    )
