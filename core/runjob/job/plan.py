"""The distributed plan of a job, shown by ``runjob validate`` before any GPU hour is spent."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runjob.job.validation import ResolvedJob


def gpu_driver_present() -> bool:
    """Whether this machine shows an NVIDIA driver (without importing torch, which is slow)."""
    return shutil.which("nvidia-smi") is not None or Path("/proc/driver/nvidia").exists()


def plan_lines(job: ResolvedJob, has_gpu: bool | None = None) -> list[str]:
    """Human-readable lines: processes, batches, precision, strategy, length, callbacks, and warnings."""
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
    callbacks = getattr(job, "callbacks", {})
    if callbacks:
        on = [name for name, chosen in callbacks.items() if chosen.options.enabled]
        off = [name for name, chosen in callbacks.items() if not chosen.options.enabled]
        lines.append(f"callbacks: {', '.join(on) or 'none'}" + (f" (switched off: {', '.join(off)})" if off else ""))
    return lines + [f"warning: {w}" for w in plan_warnings(job, has_gpu)]


def fp16_problem(mixed_precision: str, on_cuda: bool, where: str = "none is used here") -> str | None:
    """The one message for fp16 without a GPU (validate's plan, doctor and the run itself say it),
    or None when the precision can run. ``where`` says why no GPU is used."""
    if mixed_precision != "fp16" or on_cuda:
        return None
    return (
        f"train.mixed_precision = 'fp16' needs a GPU and {where}: on a CPU Accelerate would silently train "
        "in fp32. Use 'bf16' (works on a CPU) or 'no'"
    )


def plan_warnings(job: ResolvedJob, has_gpu: bool) -> list[str]:
    """What would stop the run (or waste it) on this machine, known without importing torch: the
    precision, and what the strategy stated when it was registered (GPUs, processes)."""
    warnings = []
    on_cpu = job.train.cpu or not has_gpu
    fp16 = fp16_problem(job.train.mixed_precision, not on_cpu)
    if fp16:
        warnings.append(f"{fp16}: this run would stop")
    strategy = job.strategy
    if strategy.component.facts.get("needs_gpu") and on_cpu:
        warnings.append(
            f"strategy '{strategy.name}' needs CUDA GPUs and none is used here: this run would stop (it runs on a GPU "
            "machine)"
        )
    most = strategy.component.facts.get("max_processes")
    if most is not None and job.launch.num_processes > most:
        warnings.append(
            f"strategy '{strategy.name}' runs at most {most} process(es), but launch.num_processes = "
            f"{job.launch.num_processes}"
        )
    return warnings
