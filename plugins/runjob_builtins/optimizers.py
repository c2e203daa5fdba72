"""Built-in optimizers: SGD, Adam and AdamW from torch.optim.

Each factory receives the host's param groups (dicts with ``params``, ``param_names`` and a group's
own ``lr`` / ``weight_decay``) and hands them to torch.optim as they are: the options below are the
defaults of every group that does not set its own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from runjob import Options, hookimpl

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    import torch

    from runjob import Register

    ParamGroups = list[dict[str, Any]]
    """The host's param groups: ``params`` (tensors), ``param_names`` (strings), ``lr``, ``weight_decay``."""


class ImplementationOptions(Options):
    """torch.optim's implementation choice; unset leaves it to torch (foreach on CUDA, for-loop on CPU)."""

    foreach: bool | None = None
    """Update all parameters with a few multi-tensor kernels instead of a Python loop over them."""
    fused: bool | None = None
    """One fused kernel for the whole update (CUDA and CPU)."""

    @model_validator(mode="after")
    def _one_implementation(self) -> ImplementationOptions:
        if self.foreach and self.fused:
            raise ValueError("foreach = true and fused = true cannot both be set: choose one")
        return self


class SGDOptions(ImplementationOptions):
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = False
    weight_decay: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _nesterov_needs_momentum(self) -> SGDOptions:
        if self.nesterov and self.momentum == 0:
            raise ValueError("nesterov = true needs momentum > 0")
        return self


class AdamOptions(ImplementationOptions):
    lr: float = Field(1e-3, gt=0)
    betas: list[float] = Field(default_factory=lambda: [0.9, 0.999], min_length=2, max_length=2)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _betas_in_range(self) -> AdamOptions:
        if not all(0 <= beta < 1 for beta in self.betas):
            raise ValueError(f"betas must each be in [0, 1), got {self.betas}")
        return self


class AdamWOptions(AdamOptions):
    weight_decay: float = Field(0.01, ge=0)


def build_sgd(params: ParamGroups, options: SGDOptions) -> torch.optim.SGD:
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    return torch.optim.SGD(
        params,
        lr=options.lr,
        momentum=options.momentum,
        nesterov=options.nesterov,
        weight_decay=options.weight_decay,
        foreach=options.foreach,
        fused=options.fused,
    )


def build_adam(params: ParamGroups, options: AdamOptions) -> torch.optim.Adam:
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    return torch.optim.Adam(
        params,
        lr=options.lr,
        betas=(options.betas[0], options.betas[1]),  # two, as the options require
        eps=options.eps,
        weight_decay=options.weight_decay,
        foreach=options.foreach,
        fused=options.fused,
    )


def build_adamw(params: ParamGroups, options: AdamWOptions) -> torch.optim.AdamW:
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    return torch.optim.AdamW(
        params,
        lr=options.lr,
        betas=(options.betas[0], options.betas[1]),  # two, as the options require
        eps=options.eps,
        weight_decay=options.weight_decay,
        foreach=options.foreach,
        fused=options.fused,
    )


@hookimpl
def runjob_register_optimizers(register: Register) -> None:
    """Register sgd, adam and adamw."""
    register("sgd", build_sgd, options=SGDOptions, description="torch.optim.SGD (momentum, nesterov)")
    register("adam", build_adam, options=AdamOptions, description="torch.optim.Adam")
    register("adamw", build_adamw, options=AdamWOptions, description="torch.optim.AdamW (decoupled weight decay)")
