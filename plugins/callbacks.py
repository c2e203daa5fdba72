"""Built-in callbacks a job switches on in ``[callbacks.NAME]`` tables: ``early_stopping``.

They use only the public plugin API (``runjob.Callback``, ``runjob.CallbackOptions``), as a
third-party callback would.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from runjob import Callback, CallbackOptions, hookimpl


class EarlyStoppingOptions(CallbackOptions):
    metric: str | None = Field(None, min_length=1)
    """The evaluation metric to watch; by default ``train.best_metric``. Better is the direction the
    task (or the callback that logs it) declares."""
    patience: int = Field(3, ge=1)
    """Evaluations in a row without improvement before training stops."""
    min_delta: float = Field(0.0, ge=0)
    """How much better than the best so far counts as an improvement."""

    def watches(self) -> dict[str, str]:
        return {"metric": self.metric} if self.metric else {}


class EarlyStopping(Callback):
    """Stops training when the watched metric has not improved for ``patience`` evaluations; the
    run then saves its final and best model and ends FINISHED."""

    def __init__(self, options: EarlyStoppingOptions) -> None:
        self.metric = options.metric
        self.patience = options.patience
        self.min_delta = options.min_delta
        self.best: float | None = None
        self.waited = 0

    def on_run_start(self, run: Any) -> None:
        self.metric = self.metric or run.job.train.best_metric
        self.higher_is_better = run.job.metrics[self.metric] == "max"

    def on_evaluation(self, run: Any, step: int, epoch: int, metrics: dict[str, float]) -> None:
        value = metrics.get(self.metric, run.logged.get(self.metric))
        if value is None or value != value:  # not reported at this evaluation, or NaN
            return
        gain = (value - self.best if self.higher_is_better else self.best - value) if self.best is not None else None
        if gain is None or gain > self.min_delta:
            self.best, self.waited = value, 0
            return
        self.waited += 1
        if self.waited >= self.patience:
            run.request_stop(
                f"early_stopping: {self.metric} did not improve on {self.best:.6g} for {self.patience} evaluation(s)"
            )

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "waited": self.waited}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.waited = state["best"], state["waited"]


@hookimpl
def runjob_register_callbacks(register):
    """Register early_stopping."""
    register(
        "early_stopping",
        EarlyStopping,
        options=EarlyStoppingOptions,
        description="stop when a metric has not improved for `patience` evaluations; the run finishes",
    )
