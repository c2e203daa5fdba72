"""Model FLOPs per trained sample (PyTorch's own FLOP counter) and the device's peak, for MFU.

The count runs once per run, at the first batch (for its shape), on a second instance of the model
built on the ``meta`` device: no memory, no time on the real device, no extra read of the data,
and the model's own state (weights, BatchNorm statistics, RNG) is untouched.
"""

from __future__ import annotations

from typing import Any

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


def meta_model(build: Any) -> Any:
    """The model ``build()`` makes, made on the ``meta`` device (shapes only: no memory, no
    initialisation work); ``None`` when it can't be made there."""
    import torch

    try:
        with torch.device("meta"):
            return build()
    except Exception:  # noqa: BLE001 - a model that insists on real tensors just has no MFU
        return None


def training_flops_per_unit(meta_model: Any, task: Any, batch: Any) -> float | None:
    """FLOPs of one forward and backward pass per unit of ``batch`` (what ``task.count`` counts:
    samples, tokens), counted on a :func:`meta_model` fed a meta-device copy of the batch's shapes;
    ``None`` when the model cannot be counted."""
    import torch
    from accelerate.utils import recursively_apply
    from torch.utils.flop_counter import FlopCounterMode

    if meta_model is None:
        return None
    try:
        meta_model.train()
        shapes = recursively_apply(lambda t: torch.empty_like(t, device="meta"), batch, error_on_other_type=False)
        counter = FlopCounterMode(display=False)
        with counter:
            task.loss(task.forward(meta_model, shapes), shapes).float().backward()
        total = counter.get_total_flops()
        units = task.count(shapes)
    except Exception:  # noqa: BLE001 - a model or task the counter can't trace just has no MFU
        return None
    return total / units if total and units else None


def peak_flops(device: Any, mixed_precision: str, configured_tflops: float | None) -> float | None:
    """The device's peak FLOP/s: ``train.peak_tflops`` when set, else the table for bf16/fp16 on a
    known GPU; ``None`` when unknown (MFU is then not reported)."""
    if configured_tflops:
        return configured_tflops * 1e12
    if device.type != "cuda" or mixed_precision not in ("bf16", "fp16"):
        return None
    import torch

    name = torch.cuda.get_device_name(device)
    for fragment, tflops in PEAK_TFLOPS:
        if fragment in name:
            return tflops * 1e12
    return None
