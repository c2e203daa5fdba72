"""Building the ``accelerate.Accelerator`` a job asks for, and refusing one that differs from it.

Accelerate quietly falls back in several cases (fp16 ignored on a CPU, FSDP turned into DDP, one
process when several were meant). Each is checked here and stopped with an error, before any data
is read or model built.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from runjob.errors import TrainingError
from runjob.host.components import StrategyPlan
from runjob.host.output import screen
from runjob.job.plan import fp16_problem
from runjob.tags import DEVICE_TAG, DISTRIBUTED_TYPE_TAG, MIXED_PRECISION_TAG, NUM_MACHINES_TAG, WORLD_SIZE_TAG
from runjob.train.data_loading import pins_memory
from runjob.train.launcher import launched_processes

if TYPE_CHECKING:
    from accelerate import Accelerator

    from runjob.job.validation import ResolvedJob


def build_accelerator(job: ResolvedJob, plan: StrategyPlan) -> Accelerator:
    """An Accelerator with the job's precision, accumulation, seeded sampling and strategy objects."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch and accelerate load
    # (train.entry)
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, TorchDynamoPlugin

    # Several processes on a machine without CUDA: Accelerate runs them as MULTI_CPU (gloo) only
    # when told to use the CPU; otherwise each would train alone, believing it is rank 0.
    cpu = job.train.cpu or (launched_processes() > 1 and not torch.cuda.is_available())
    torch.backends.cudnn.benchmark = job.train.cudnn_benchmark
    # compiled in accelerator.prepare, after DDP/FSDP wrapping, as Accelerate recommends; the job
    # file decides, not an ACCELERATE_DYNAMO_* variable left over from `accelerate config`
    dynamo = (
        TorchDynamoPlugin(backend="inductor", mode=job.train.compile_mode)
        if job.train.compile
        else TorchDynamoPlugin(backend="no")
    )
    try:
        accelerator = Accelerator(
            cpu=cpu,
            mixed_precision=job.train.mixed_precision,
            gradient_accumulation_steps=job.train.gradient_accumulation_steps,
            # copies to the GPU overlap with compute when the batch is in pinned memory (dataset.pin_memory, on by
            # default on CUDA)
            dataloader_config=DataLoaderConfiguration(
                use_seedable_sampler=True,
                data_seed=job.job.seed,
                non_blocking=pins_memory(job, not cpu and torch.cuda.is_available()),
            ),
            step_scheduler_with_optimizer=False,
            dynamo_plugin=dynamo,
            **plan.accelerator_kwargs,
        )
    except (ValueError, RuntimeError) as error:  # e.g. bf16 on a GPU without it
        raise TrainingError(f"train.mixed_precision / strategy: Accelerate refused the setup: {error}") from None
    screen.set_main(accelerator.is_main_process)  # whose lines are said for the job, from now on
    return accelerator


def forget_accelerator() -> None:
    """Forget the Accelerator this process made, so that the next one is built from its own arguments.

    Accelerate keeps process-wide singletons (``PartialState``, ``AcceleratorState``,
    ``GradientState``: class-level shared dicts). A second ``Accelerator`` in the same process takes
    them over as they are (the first one's device, distributed setup, strategy plugins, accumulation
    steps), or refuses with "AcceleratorState has already been initialized" when its precision or
    ``cpu`` differs. A run, and an evaluation of a finished run, call this when done with theirs, so
    that the next one in the process (a sweep's forked trial, a test, ``runjob evaluate``) starts clean."""
    # lazy: `runjob JOB` says its first line and starts its recording process before accelerate loads (train.entry)
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    screen.set_main(None)


def check_setup(accelerator: Accelerator, job: ResolvedJob, plan: StrategyPlan) -> None:
    """Raise TrainingError if what Accelerate set up is not what the job asked for."""
    problems = []
    device = accelerator.device.type
    asked = job.train.mixed_precision
    fp16 = fp16_problem(asked, device == "cuda", "this run uses the CPU")
    if fp16:
        problems.append(fp16)
    elif accelerator.mixed_precision != asked:
        problems.append(f"train.mixed_precision = {asked!r}, but Accelerate set up {accelerator.mixed_precision!r}")
    processes = accelerator.num_processes
    if processes != launched_processes():
        problems.append(
            f"{launched_processes()} processes were launched (WORLD_SIZE), but Accelerate set up {processes}"
        )
    strategy = job.strategy.name
    limits = [m for m in (job.strategy.component.facts.get("max_processes"), plan.max_processes) if m is not None]
    if limits and processes > min(limits):
        problems.append(
            f"strategy.name = {strategy!r} runs at most {min(limits)} process(es), but {processes} were started"
        )
    actual = accelerator.distributed_type.name
    if plan.expected_distributed_types and actual not in plan.expected_distributed_types:
        needs = f" ({plan.requirement})" if plan.requirement else ""
        problems.append(
            f"strategy.name = {strategy!r} needs {' or '.join(plan.expected_distributed_types)}{needs}, but Accelerate "
            f"set up {actual} with {processes} process(es) on {device}; it would have trained without {strategy}"
        )
    if problems:
        raise TrainingError("; ".join(problems))


def actual_setup(accelerator: Accelerator) -> dict[str, str]:
    """What really runs, as MLflow tags."""
    return {
        DISTRIBUTED_TYPE_TAG: accelerator.distributed_type.name,
        WORLD_SIZE_TAG: str(accelerator.num_processes),
        MIXED_PRECISION_TAG: accelerator.mixed_precision,
        DEVICE_TAG: accelerator.device.type,
        NUM_MACHINES_TAG: str(_machines(accelerator)),
    }


def _machines(accelerator: Accelerator) -> int:
    """Machines in the job: processes divided by processes per machine (``LOCAL_WORLD_SIZE``)."""
    per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", accelerator.num_processes) or 1)
    return max(1, int(accelerator.num_processes) // per_machine)
