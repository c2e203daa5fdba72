"""What each of a machine's sweep workers gets: its own GPUs (``CUDA_VISIBLE_DEVICES``), or its
share of the CPU cores (the thread counts), so N workers neither share a GPU nor oversubscribe
the cores. Finding the GPUs never imports torch."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

from runjob.errors import RunjobError
from runjob.job.schema import SWEEP_TABLE

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set (a Slurm allocation, a
    container), else every GPU ``nvidia-smi`` lists; none without either."""
    environ = os.environ if environ is None else environ
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        devices = [part.strip() for part in listed.split(",") if part.strip()]
        return [] if devices and devices[0].startswith("-") else devices  # "-1" hides every GPU
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def plan_workers(
    workers: int | None, gpus: list[str], gpus_per_trial: int | None, processes: int, cores: int
) -> list[dict[str, str]]:
    """The environment each worker adds to its trials': ``CUDA_VISIBLE_DEVICES`` (``gpus``
    divided, ``gpus_per_trial`` each, at least the job's ``processes``), or on CPUs the thread
    counts (``cores`` divided by workers x processes) when several share the machine. ``workers``
    None: one per ``gpus_per_trial`` GPUs, else 1. A request the machine cannot meet is a RunjobError."""
    per_trial = gpus_per_trial if gpus_per_trial is not None else (max(1, processes) if gpus else 0)
    if per_trial and not gpus:
        raise RunjobError(
            f"{SWEEP_TABLE}.gpus_per_trial = {per_trial}: this machine shows no GPU (CUDA_VISIBLE_DEVICES, "
            "nvidia-smi); set it to 0 to run the trials on CPUs"
        )
    if per_trial and per_trial < processes:
        raise RunjobError(
            f"{SWEEP_TABLE}.gpus_per_trial = {per_trial}: each trial runs launch.num_processes = {processes} "
            f"processes, one a GPU: give each trial at least {processes}"
        )
    if per_trial:
        count = workers if workers is not None else len(gpus) // per_trial
        if count < 1 or count * per_trial > len(gpus):
            raise RunjobError(
                f"--workers {count} with {SWEEP_TABLE}.gpus_per_trial = {per_trial} needs "
                f"{max(count, 1) * per_trial} GPU(s); this machine shows {len(gpus)} ({', '.join(gpus)})"
            )
        return [
            {"CUDA_VISIBLE_DEVICES": ",".join(gpus[index * per_trial : (index + 1) * per_trial])}
            for index in range(count)
        ]
    count = workers if workers is not None else 1
    hidden = {"CUDA_VISIBLE_DEVICES": ""} if gpus else {}  # gpus_per_trial = 0 on a GPU machine: CPUs
    if count == 1:
        return [hidden]
    threads = str(max(1, cores // (count * max(1, processes))))
    return [{**dict.fromkeys(THREAD_VARIABLES, threads), **hidden} for _ in range(count)]
