"""The distributed plan of a job, shown by ``runjob validate`` before any GPU hour is spent."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

NEEDS_GPU = {"fsdp": "FSDP", "deepspeed": "DeepSpeed"}


def gpu_driver_present() -> bool:
    """Whether this machine shows an NVIDIA driver (without importing torch, which is slow)."""
    return shutil.which("nvidia-smi") is not None or Path("/proc/driver/nvidia").exists()


def plan_lines(job: Any, has_gpu: bool | None = None) -> list[str]:
    """Human-readable lines: processes, batches, precision, strategy, length, and warnings."""
    has_gpu = gpu_driver_present() if has_gpu is None else has_gpu
    launch, train = job.launch, job.train
    processes = launch.num_processes
    global_batch = train.batch_size * processes
    effective = global_batch * train.gradient_accumulation_steps
    strategy_options = ", ".join(f"{k}={v}" for k, v in job.strategy.options.model_dump(exclude_none=True).items())
    length = f"{train.epochs} epoch(s)" if train.epochs else "no epoch limit"
    if train.max_steps:
        length += f", at most {train.max_steps} optimizer steps"
    lines = [
        f"processes: {processes} on {launch.num_machines} machine(s), {launch.processes_per_machine} per machine",
        f"batch: {train.batch_size} per process x {processes} = {global_batch} global; "
        f"gradient accumulation {train.gradient_accumulation_steps} -> {effective} samples per optimizer step",
        f"precision: {train.mixed_precision}",
        f"strategy: {job.strategy.name}" + (f" ({strategy_options})" if strategy_options else ""),
        f"length: {length}",
    ]
    return lines + [f"warning: {w}" for w in plan_warnings(job, has_gpu)]


def plan_warnings(job: Any, has_gpu: bool) -> list[str]:
    """What would stop the run (or waste it) on this machine, known without importing torch."""
    warnings = []
    on_cpu = job.train.cpu or not has_gpu
    if job.train.mixed_precision == "fp16" and on_cpu:
        warnings.append(
            "mixed_precision = 'fp16' needs a CUDA GPU and none is used here: this run would stop (use 'bf16' on a CPU)"
        )
    if job.strategy.name in NEEDS_GPU and on_cpu:
        warnings.append(
            f"strategy '{job.strategy.name}' needs CUDA GPUs and none is used here: this run would stop (it runs on a GPU machine)"
        )
    if job.strategy.name == "single" and job.launch.num_processes > 1:
        warnings.append("strategy 'single' runs one process, but launch.num_processes > 1")
    return warnings
