"""Learning-rate schedules, stepped once per optimizer step."""

from __future__ import annotations

import pytest
import torch

from runjob_builtins.schedulers import (
    CosineOptions,
    OneCycleOptions,
    StepOptions,
    build_cosine,
    build_onecycle,
    build_step,
    cosine_factor,
)


def lrs(scheduler, optimizer, steps):
    values = []
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        values.append(optimizer.param_groups[0]["lr"])
    return values


def sgd(lr=0.1):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def test_cosine_warms_up_then_decays_to_the_floor():
    optimizer = sgd()
    scheduler = build_cosine(optimizer, CosineOptions(warmup_steps=4, min_lr_ratio=0.1), total_steps=20)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 / 4)
    values = lrs(scheduler, optimizer, 20)
    assert values[2] == pytest.approx(0.1)  # after 3 steps: warm-up done
    assert values[:3] == sorted(values[:3])
    assert all(a >= b for a, b in zip(values[3:], values[4:], strict=False))
    assert values[-1] == pytest.approx(0.01)
    assert cosine_factor(12, 20, 4, 0.0) == pytest.approx(0.5)


def test_onecycle_peaks_at_max_lr():
    optimizer = sgd(0.05)
    scheduler = build_onecycle(optimizer, OneCycleOptions(max_lr=0.4, pct_start=0.25), total_steps=40)
    values = lrs(scheduler, optimizer, 39)
    assert max(values) == pytest.approx(0.4, rel=1e-3)
    assert values.index(max(values)) in (8, 9)
    assert values[-1] < 0.001


def test_onecycle_defaults_to_the_optimizers_lr():
    optimizer = sgd(0.3)
    scheduler = build_onecycle(optimizer, OneCycleOptions(), total_steps=10)
    assert max(lrs(scheduler, optimizer, 9)) == pytest.approx(0.3, rel=1e-2)


def test_step_decays_every_step_size_steps():
    optimizer = sgd(1.0)
    scheduler = build_step(optimizer, StepOptions(step_size=3, gamma=0.5), total_steps=9)
    assert lrs(scheduler, optimizer, 7) == pytest.approx([1, 1, 0.5, 0.5, 0.5, 0.25, 0.25])
