"""Model FLOPs per trained sample (PyTorch's own FLOP counter) and the device's peak, for MFU.

The count runs once per run, at the first batch (for its shape), the first of these ways that works
(:func:`model_flops_per_unit`):

1. the model states them: a ``training_flops(batch)`` method (FLOPs of one forward and backward
   pass over the batch as its task passes it);
2. counted on a copy of the run's model made on the ``meta`` device from the built model itself
   (its structure and shapes; no data copied): the model's factory is not called again, so its side
   effects (loading weights, downloads) happen once per run; no memory, no time on the real device,
   and the model's own state (weights, BatchNorm statistics, RNG) is untouched;
3. where the meta count fails (models that read values, such as Hugging Face's attention masks):
   one real forward pass over the batch, counted, in eval mode without gradients (the model's state
   untouched), times 3 for the backward pass (which costs about twice the forward).

When none works, one line says so and why, and ``train/tflops`` / ``train/mfu`` are not logged.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, cast

from runjob.errors import describe
from runjob.host.output import screen

if TYPE_CHECKING:
    import torch

    from runjob.host.components import Batch
    from runjob.host.task import Task

# Dense bf16/fp16 tensor-core peak TFLOP/s from the vendors' data sheets, by a substring of
# torch.cuda.get_device_name(). Longer names first, so "H100 PCIe" wins over "H100".
PEAK_TFLOPS = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10G", 125.0),
    ("A10", 125.0),
    ("V100", 125.0),
    ("RTX 4090", 165.0),
)


def model_flops_per_unit(model: torch.nn.Module, task: Task, batch: Batch) -> tuple[float | None, str]:
    """FLOPs of one training step per unit of ``batch`` (what ``task.count`` counts) and how they
    were found (``"stated"``, ``"meta"``, ``"forward x3"``); ``(None, "")`` after one line saying why
    there is no count."""
    plain = _unwrapped(model)
    units = task.count(batch)
    stated = getattr(plain, "training_flops", None)
    if callable(stated):
        try:
            total = float(stated(batch))
        except Exception as error:  # noqa: BLE001 - a model's own estimate failing just means no MFU
            say_no_count(f"the model's training_flops(batch) failed: {describe(error)}")
            return None, ""
        if total > 0 and units:
            return total / units, "stated"
        say_no_count(f"the model's training_flops(batch) gave {total} for {units} {getattr(task, 'unit', 'samples')}")
        return None, ""
    reasons: list[str] = []
    copy = meta_model(plain, reasons)
    if copy is not None:
        per_unit = training_flops_per_unit(copy, task, batch, reasons)
        if per_unit:
            return per_unit, "meta"
    per_unit = _forward_flops_per_unit(plain, task, batch, units, reasons)
    if per_unit:
        return per_unit, "forward x3"
    say_no_count("; ".join(reasons))
    return None, ""


def _forward_flops_per_unit(
    model: torch.nn.Module, task: Task, batch: Batch, units: int, reasons: list[str]
) -> float | None:
    """3x the counted FLOPs of one real forward pass over ``batch`` in eval mode without
    gradients, per unit; ``None`` (and why in ``reasons``) when it cannot be counted."""
    # lazy: `runjob validate` imports this module, which must not load torch
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    training = model.training
    model.eval()
    try:
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            task.forward(model, batch)
        total = counter.get_total_flops()
    except Exception as error:  # noqa: BLE001 - a model the counter can't trace just has no MFU
        reasons.append(f"a real forward pass: {describe(error)}")
        return None
    finally:
        model.train(training)
    if not total or not units:
        reasons.append(f"a real forward pass: the counter found {total} FLOPs for {units} units")
        return None
    return float(3 * total / units)


def meta_model(model: torch.nn.Module, reasons: list[str] | None = None) -> torch.nn.Module | None:
    """A copy of ``model`` on the ``meta`` device (shapes only: no memory, no data copied, the
    original untouched); ``model`` is a built ``torch.nn.Module`` (a prepared one is unwrapped), or,
    as before, a function that builds one, called once under ``torch.device("meta")``. ``None``
    when no copy can be made, and a line says why (or, given ``reasons``, why is added to it)."""
    import torch  # lazy: `runjob validate` imports this module, which must not load torch

    try:
        if isinstance(model, torch.nn.Module):
            return _meta_copy(_unwrapped(model))
        with torch.device("meta"):
            built: torch.nn.Module = model()
            return built
    except Exception as error:  # noqa: BLE001 - a model that insists on real tensors just has no MFU
        if reasons is None:
            say_no_count(error)
        else:
            reasons.append(f"a meta copy: {describe(error)}")
        return None


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DistributedDataParallel / DataParallel / ``torch.compile`` wrappers (a
    model's own attribute named ``module`` is left alone)."""
    import torch  # lazy: `runjob validate` imports this module, which must not load torch

    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    while True:
        if isinstance(model, wrappers):
            model = model.module
        elif hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule":
            model = cast("torch.nn.Module", model._orig_mod)  # torch.compile's wrapper: the module it compiled
        else:
            return model


def _meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """``copy.deepcopy(model)`` where every parameter and buffer is replaced, in the memo, by an
    empty one of its shape, dtype and ``requires_grad`` on ``meta``: the weights are not copied."""
    import torch  # lazy: `runjob validate` imports this module, which must not load torch

    memo: dict[int, object] = {}
    for tensor in [*model.parameters(), *model.buffers()]:  # each once, a shared one too
        empty = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, torch.nn.Parameter):
            empty = torch.nn.Parameter(empty, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = empty
    return copy.deepcopy(model, memo)


def say_no_count(error: BaseException | str) -> None:
    """One line, on the first process: the model's FLOPs are not counted, and why."""
    why = error if isinstance(error, str) else describe(error)
    screen.say(f"runjob: the model's FLOPs were not counted (no train/tflops, train/mfu): {why}")


def training_flops_per_unit(
    meta_model: torch.nn.Module | None, task: Task, batch: Batch, reasons: list[str] | None = None
) -> float | None:
    """FLOPs of one forward and backward pass per unit of ``batch`` (what ``task.count`` counts:
    samples, tokens), counted on a :func:`meta_model` fed a meta-device copy of the batch's shapes;
    ``None`` when the model cannot be counted (one line says why; given ``reasons``, why is added
    to it instead)."""
    # lazy: `runjob validate` imports this module, which must not load torch and accelerate
    import torch
    from accelerate.utils import recursively_apply
    from torch.utils.flop_counter import FlopCounterMode

    if meta_model is None:
        return None  # meta_model said why
    try:
        meta_model.train()
        shapes = recursively_apply(lambda t: torch.empty_like(t, device="meta"), batch, error_on_other_type=False)
        counter = FlopCounterMode(display=False)
        with counter:
            torch.autograd.backward(task.loss(task.forward(meta_model, shapes), shapes).float())  # loss.backward()
        total = counter.get_total_flops()
        units = task.count(shapes)
    except Exception as error:  # noqa: BLE001 - a model or task the counter can't trace just has no MFU
        if reasons is None:
            say_no_count(error)
        else:
            reasons.append(f"the meta device: {describe(error)}")
        return None
    if not total or not units:
        why = f"the counter found {total} FLOPs for {units} {getattr(task, 'unit', 'samples')}"
        if reasons is None:
            say_no_count(why)
        else:
            reasons.append(f"the meta device: {why}")
        return None
    return float(total / units)


def peak_flops(device: torch.device, mixed_precision: str, configured_tflops: float | None) -> float | None:
    """The device's peak FLOP/s: ``train.peak_tflops`` when set, else the table for bf16/fp16 on a
    known GPU; ``None`` when unknown (MFU is then not reported)."""
    if configured_tflops:
        return configured_tflops * 1e12
    if device.type != "cuda" or mixed_precision not in ("bf16", "fp16"):
        return None
    import torch  # lazy: `runjob validate` imports this module, which must not load torch

    name = torch.cuda.get_device_name(device)
    for fragment, tflops in PEAK_TFLOPS:
        if fragment in name:
            return tflops * 1e12
    return None
