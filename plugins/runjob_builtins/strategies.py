"""Built-in strategies, each mapping its options onto Accelerate's own objects:
``ddp`` (DistributedDataParallelKwargs), ``fsdp`` (FullyShardedDataParallelPlugin), ``deepspeed``
(DeepSpeedPlugin) and ``single``.

Each plan names the distributed type it needs; the host compares it with what Accelerate really
set up and stops when they differ (Accelerate turns FSDP into plain DDP on a CPU, and drops
DeepSpeed without a GPU).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from runjob import ExistingFile, Options, RunjobError, StrategyPlan, hookimpl

if TYPE_CHECKING:
    from runjob import Register

MULTI_PROCESS_DDP = (
    "MULTI_GPU",
    "MULTI_CPU",
    "MULTI_XPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_HPU",
)
ONE_PROCESS = ("NO",)


class DDPOptions(Options):
    """``torch.nn.parallel.DistributedDataParallel`` arguments (Accelerate's DistributedDataParallelKwargs)."""

    find_unused_parameters: bool = False
    bucket_cap_mb: int = Field(25, ge=1)
    broadcast_buffers: bool = True
    gradient_as_bucket_view: bool = False
    static_graph: bool = False


FSDP1_ONLY = ("use_orig_params", "backward_prefetch", "forward_prefetch", "limit_all_gathers", "sync_module_states")


class FSDPOptions(Options):
    """Accelerate's FullyShardedDataParallelPlugin. Unset version-specific keys take that version's default."""

    fsdp_version: Literal[1, 2] = 2
    sharding_strategy: (
        Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"] | None
    ) = None
    """FSDP1's sharding; with FSDP2 use reshard_after_forward (FULL_SHARD = true, SHARD_GRAD_OP = false)."""
    reshard_after_forward: bool | None = None
    """FSDP2: free the gathered parameters after forward (true, like FULL_SHARD) or keep them (false)."""
    auto_wrap_policy: Literal["no_wrap", "size_based_wrap", "transformer_based_wrap"] = "no_wrap"
    transformer_layer_cls_to_wrap: list[str] = Field(default_factory=list)
    """Class names of the layers to shard separately, for transformer_based_wrap."""
    min_num_params: int = Field(100_000_000, ge=1)
    """Parameters a module must have to be sharded separately, for size_based_wrap."""
    state_dict_type: Literal["FULL_STATE_DICT", "SHARDED_STATE_DICT"] = "FULL_STATE_DICT"
    cpu_offload: bool = False
    activation_checkpointing: bool = False
    use_orig_params: bool | None = None
    """FSDP1 only (FSDP2 always keeps the original parameters)."""
    backward_prefetch: Literal["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"] | None = None
    """FSDP1 only."""
    forward_prefetch: bool | None = None
    """FSDP1 only (default false)."""
    limit_all_gathers: bool | None = None
    """FSDP1 only (default true)."""
    sync_module_states: bool | None = None
    """FSDP1 only (default true)."""

    @model_validator(mode="after")
    def _consistent(self) -> FSDPOptions:
        if self.fsdp_version == 2:
            fsdp1_only = [k for k in FSDP1_ONLY if getattr(self, k) is not None]
            if self.sharding_strategy not in (None, "FULL_SHARD", "SHARD_GRAD_OP"):
                fsdp1_only.append(f"sharding_strategy = {self.sharding_strategy!r}")
            if fsdp1_only:
                raise ValueError(f"{', '.join(fsdp1_only)}: FSDP1 only; set fsdp_version = 1 or remove them")
            if self.sharding_strategy is not None and self.reshard_after_forward is not None:
                raise ValueError("give either sharding_strategy or reshard_after_forward, not both")
        elif self.reshard_after_forward is not None:
            raise ValueError("reshard_after_forward is FSDP2's; with fsdp_version = 1 use sharding_strategy")
        if self.auto_wrap_policy == "transformer_based_wrap" and not self.transformer_layer_cls_to_wrap:
            raise ValueError(
                "auto_wrap_policy = 'transformer_based_wrap' needs transformer_layer_cls_to_wrap (layer class names)"
            )
        return self


class DeepSpeedOptions(Options):
    """Accelerate's DeepSpeedPlugin (needs ``pip install 'runjob-train[deepspeed]'``)."""

    zero_stage: Literal[0, 1, 2, 3] = 2
    offload_optimizer_device: Literal["none", "cpu", "nvme"] = "none"
    offload_param_device: Literal["none", "cpu", "nvme"] = "none"
    gradient_clipping: float | None = Field(None, gt=0)
    zero3_init_flag: bool = False
    config_file: ExistingFile | None = None
    """A DeepSpeed JSON config; when given, the other keys must be left at their defaults."""

    @model_validator(mode="after")
    def _config_file_alone(self) -> DeepSpeedOptions:
        if self.config_file is not None:
            changed = sorted(k for k in self.model_fields_set if k != "config_file")
            if changed:
                raise ValueError(f"config_file is given, so {', '.join(changed)} must be set in that file instead")
        if self.offload_param_device != "none" and self.zero_stage != 3:
            raise ValueError("offload_param_device needs zero_stage = 3")
        return self


def build_ddp(options: DDPOptions) -> StrategyPlan:
    # lazy: plugin modules are imported by `runjob validate`, which must not load accelerate
    from accelerate import DistributedDataParallelKwargs

    handler = DistributedDataParallelKwargs(**options.model_dump())
    return StrategyPlan(
        accelerator_kwargs={"kwargs_handlers": [handler]}, expected_distributed_types=MULTI_PROCESS_DDP + ONE_PROCESS
    )


def _accelerate_plugin(strategy: str, plugin_class: type, **settings: object) -> object:
    """Build an Accelerate plugin; a setting it refuses is the user's to fix, not a traceback."""
    try:
        return plugin_class(**settings)
    except (ValueError, RuntimeError) as error:  # e.g. FSDP1's sync_module_states on a CPU
        raise RunjobError(f"strategy.name = {strategy!r}: Accelerate refused these options: {error}") from None


def _default(value: bool | None, default: bool) -> bool:
    return default if value is None else value


def build_fsdp(options: FSDPOptions) -> StrategyPlan:
    # lazy: plugin modules are imported by `runjob validate`, which must not load accelerate
    from accelerate import FullyShardedDataParallelPlugin

    if options.fsdp_version == 2:
        reshard = options.reshard_after_forward
        if reshard is None:
            reshard = options.sharding_strategy != "SHARD_GRAD_OP"
        version_specific: dict[str, object] = {"reshard_after_forward": reshard}
    else:
        version_specific = {
            "sharding_strategy": options.sharding_strategy or "FULL_SHARD",
            "use_orig_params": _default(options.use_orig_params, True),
            "backward_prefetch": options.backward_prefetch or "BACKWARD_PRE",
            "forward_prefetch": _default(options.forward_prefetch, False),
            "limit_all_gathers": _default(options.limit_all_gathers, True),
            "sync_module_states": _default(options.sync_module_states, True),
        }
    wrap: dict[str, object] = {"auto_wrap_policy": options.auto_wrap_policy}
    if options.auto_wrap_policy == "transformer_based_wrap":
        wrap["transformer_cls_names_to_wrap"] = options.transformer_layer_cls_to_wrap
    if options.auto_wrap_policy == "size_based_wrap":
        wrap["min_num_params"] = options.min_num_params
    plugin = _accelerate_plugin(
        "fsdp",
        FullyShardedDataParallelPlugin,
        fsdp_version=options.fsdp_version,
        state_dict_type=options.state_dict_type,
        cpu_offload=options.cpu_offload,
        activation_checkpointing=options.activation_checkpointing,
        **version_specific,
        **wrap,
    )
    return StrategyPlan(
        accelerator_kwargs={"fsdp_plugin": plugin},
        expected_distributed_types=("FSDP",),
        requirement="FSDP needs CUDA GPUs",
    )


def build_deepspeed(options: DeepSpeedOptions) -> StrategyPlan:
    missing = [m for m in ("deepspeed", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise RunjobError(
            f"strategy.name = 'deepspeed' needs {' and '.join(missing)}: pip install 'runjob-train[deepspeed]'"
        )
    # lazy: plugin modules are imported by `runjob validate`, which must not load accelerate
    from accelerate import DeepSpeedPlugin

    if options.config_file is not None:
        plugin = _accelerate_plugin("deepspeed", DeepSpeedPlugin, hf_ds_config=options.config_file)
    else:
        settings = options.model_dump(exclude={"config_file"})
        plugin = _accelerate_plugin("deepspeed", DeepSpeedPlugin, **settings)
    return StrategyPlan(
        accelerator_kwargs={"deepspeed_plugin": plugin},
        expected_distributed_types=("DEEPSPEED",),
        requirement="DeepSpeed needs CUDA GPUs",
    )


def build_single(options: Options) -> StrategyPlan:
    return StrategyPlan(expected_distributed_types=ONE_PROCESS)  # one process: stated at registration


@hookimpl
def runjob_register_strategies(register: Register) -> None:
    """Register ddp, fsdp, deepspeed and single."""
    register(
        "ddp",
        build_ddp,
        options=DDPOptions,
        description="DistributedDataParallel across processes (plain training in one process)",
    )
    register(
        "fsdp",
        build_fsdp,
        options=FSDPOptions,
        description="Fully Sharded Data Parallel (FSDP2 by default; CUDA)",
        needs_gpu=True,
    )
    register(
        "deepspeed",
        build_deepspeed,
        options=DeepSpeedOptions,
        description="DeepSpeed ZeRO stages 0-3 (CUDA; the deepspeed extra)",
        needs_gpu=True,
    )
    register("single", build_single, description="one process, no distributed wrapping", max_processes=1)
