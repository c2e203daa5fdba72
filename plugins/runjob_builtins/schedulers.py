"""Built-in learning-rate schedules, stepped once per optimizer step: none, cosine, onecycle, step."""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from runjob import Options, hookimpl

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    import torch
    from torch.optim.lr_scheduler import LambdaLR, OneCycleLR, StepLR

    from runjob import Register


class CosineOptions(Options):
    warmup_steps: int = Field(0, ge=0)
    """Optimizer steps of linear warm-up from 0 to the optimizer's lr."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """The final lr as a fraction of the optimizer's lr."""


class OneCycleOptions(Options):
    max_lr: float | None = Field(None, gt=0)
    """Peak lr; by default the optimizer's lr."""
    pct_start: float = Field(0.3, gt=0, lt=1)
    anneal_strategy: Literal["cos", "linear"] = "cos"
    div_factor: float = Field(25.0, gt=0)
    final_div_factor: float = Field(1e4, gt=0)


class StepOptions(Options):
    step_size: int = Field(..., ge=1)
    """Optimizer steps between lr decays."""
    gamma: float = Field(0.1, gt=0, le=1)


def build_none(optimizer: torch.optim.Optimizer, options: Options, total_steps: int) -> None:
    return None


def cosine_factor(step: int, total_steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """The lr multiplier after ``step`` optimizer steps: linear warm-up, then cosine decay."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_cosine(optimizer: torch.optim.Optimizer, options: CosineOptions, total_steps: int) -> LambdaLR:
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    factor = partial(
        cosine_factor, total_steps=total_steps, warmup_steps=options.warmup_steps, min_lr_ratio=options.min_lr_ratio
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def build_onecycle(optimizer: torch.optim.Optimizer, options: OneCycleOptions, total_steps: int) -> OneCycleLR:
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    max_lr = options.max_lr or [group["lr"] for group in optimizer.param_groups]
    return torch.optim.lr_scheduler.OneCycleLR(
        optimizer,
        max_lr=max_lr,
        total_steps=total_steps,
        pct_start=options.pct_start,
        anneal_strategy=options.anneal_strategy,
        div_factor=options.div_factor,
        final_div_factor=options.final_div_factor,
        cycle_momentum=False,
    )


def build_step(optimizer: torch.optim.Optimizer, options: StepOptions, total_steps: int) -> StepLR:
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=options.step_size, gamma=options.gamma)


@hookimpl
def runjob_register_schedulers(register: Register) -> None:
    """Register none, cosine (with warm-up), onecycle and step."""
    register("none", build_none, description="constant learning rate")
    register(
        "cosine", build_cosine, options=CosineOptions, description="linear warm-up, then cosine decay to min_lr_ratio"
    )
    register("onecycle", build_onecycle, options=OneCycleOptions, description="torch OneCycleLR over the whole run")
    register(
        "step", build_step, options=StepOptions, description="multiply lr by gamma every step_size optimizer steps"
    )
