"""Built-in strategies: ``ddp`` (DistributedDataParallel through Accelerate) and ``single``."""

from __future__ import annotations

from pydantic import Field

from runjob import Options, StrategyPlan, hookimpl

MULTI_PROCESS_DDP = ("MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_HPU")


class DDPOptions(Options):
    """``torch.nn.parallel.DistributedDataParallel`` arguments (Accelerate's DistributedDataParallelKwargs)."""

    find_unused_parameters: bool = False
    bucket_cap_mb: int = Field(25, ge=1)
    broadcast_buffers: bool = True
    gradient_as_bucket_view: bool = False
    static_graph: bool = False


def build_ddp(options: DDPOptions) -> StrategyPlan:
    from accelerate import DistributedDataParallelKwargs

    handler = DistributedDataParallelKwargs(**options.model_dump())
    return StrategyPlan(accelerator_kwargs={"kwargs_handlers": [handler]}, expected_distributed_types=MULTI_PROCESS_DDP)


def build_single(options) -> StrategyPlan:
    return StrategyPlan(max_processes=1)


@hookimpl
def runjob_register_strategies(register):
    """Register ddp (any number of processes; one process needs no wrapping) and single."""
    register("ddp", build_ddp, options=DDPOptions, description="DistributedDataParallel across processes (plain training in one process)")
    register("single", build_single, description="one process, no distributed wrapping")
