"""The host's own job-file tables: ``[job]``, ``[train]``, ``[tracking]`` and the DataLoader keys.

Component tables (``[model]``, ``[dataset]``, ...) are declared by the plugins that provide them;
see :mod:`runjob.host.components`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from runjob.host.components import Options
from runjob.host.json_types import JSONValue
from runjob.host.kinds import MANY_TABLES
from runjob.host.kinds import NAMES as KIND_NAMES
from runjob.host.run_folder import WEIGHTS_FILE, RunFolder

HOST_TABLES = ("job", "train", "launch", "tracking")
# the order of a resolved job's tables: what it is, its components (one table a kind), how it runs
TABLE_ORDER = ("job", *KIND_NAMES, *MANY_TABLES, "train", "launch", "tracking")
# accepted in a job file but not part of the resolved job: `runjob sweep` reads it, trials never see it
SWEEP_TABLE = "sweep"
RUNS_URI = "runs:/"


def sweep_note(what_happens: str) -> str:
    """The note a command prints when the job it was given has a ``[sweep]`` table it does not use."""
    return f"note: the job's [{SWEEP_TABLE}] table is used by `runjob sweep`; {what_happens}"


class JobTable(Options):
    """``[job]``: what the run is called and how it is seeded."""

    name: str = Field("runjob", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """The job's name (letters, digits, ``.``, ``_``, ``-``): the MLflow experiment by default, the output
    folder ``runs/<name>/``, the logged model's name."""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """Seed for everything random, the data order included."""
    description: str = ""
    """Free text, recorded as a param and as the MLflow run's description (``mlflow.note.content``)."""


class TrainTable(Options):
    """``[train]``: the training loop."""

    epochs: int | None = Field(None, ge=1)
    """Passes over the training set; 1 when ``max_steps`` is not set either."""
    max_steps: int | None = Field(None, ge=1)
    """Stop after this many optimizer steps; with ``epochs`` too, whichever comes first."""
    batch_size: int = Field(32, ge=1)
    """Samples per batch per process: the global batch is this times the processes (and times
    ``gradient_accumulation_steps`` per optimizer step)."""
    eval_batch_size: int | None = Field(None, ge=1)
    """Validation batch size per process; by default ``batch_size``."""
    gradient_accumulation_steps: int = Field(1, ge=1)
    """Gradient accumulation: micro-batches whose gradients are summed before each optimizer
    step (an effective batch of ``batch_size`` x processes x this, in the memory of one batch)."""
    max_grad_norm: float | None = Field(None, gt=0)
    """Clip the gradient norm to this before each optimizer step; by default no clipping."""
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    """``bf16`` or ``fp16`` autocast through Accelerate; fp16 on a CPU is refused (Accelerate would
    silently train in fp32)."""
    log_every: int = Field(10, ge=1)
    """Optimizer steps between logs of ``train/loss``, ``lr`` and the throughput (the only
    host-device syncs in the loop)."""
    drop_last: bool = True
    """Drop the last incomplete training batch of each epoch."""
    cpu: bool = False
    """Train on the CPU even where a GPU exists."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """A NaN or infinite loss or gradient: stop with advice, or skip that optimizer step."""
    checkpoint_every: int | None = Field(None, ge=1)
    """Optimizer steps between checkpoints; one is written at every epoch end regardless."""
    keep_checkpoints: int = Field(2, ge=1)
    """Complete checkpoints kept during the run; older ones are deleted."""
    keep_checkpoints_finished: int = Field(1, ge=0)
    """Checkpoints kept once the run has finished (the newest): 1 lets ``--resume`` extend it with
    more epochs; 0 keeps none (the final and best weights stay either way)."""
    best_metric: str | None = Field(None, min_length=1)
    """The validation metric that picks the best weights (``best/``), one the job's task declares
    (``val/accuracy``, ``val/loss``, ...), in the direction it declares; by default the task's first."""
    eval_every: int | None = Field(None, ge=1)
    """Optimizer steps between evaluations, besides the one at the end of every epoch (long
    single-epoch or ``max_steps`` runs, language models)."""
    peak_tflops: float | None = Field(None, gt=0)
    """The device's peak TFLOP/s for MFU, when runjob's table doesn't know the device."""
    channels_last: bool = False
    """Model weights and input batches in channels-last (NHWC) memory: faster convolutions on tensor-core GPUs."""
    compile: bool = False
    """``torch.compile`` the model (Accelerate's TorchDynamoPlugin, inductor backend); the first steps pay for
    compiling."""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    """``torch.compile``'s mode, with ``compile = true``."""
    cudnn_benchmark: bool = False
    """Let cuDNN time its convolution algorithms for each input shape and keep the fastest (CUDA only)."""
    stop_signal: Literal["SIGUSR1", "SIGUSR2"] | None = None
    """A signal that, like SIGTERM and SIGINT, stops training after a checkpoint (e.g. Slurm's --signal)."""
    resume: Literal["auto"] | None = None
    """``"auto"``: as ``--resume auto``: continue from the newest complete checkpoint in the output
    folder (``--output-dir``, which must be given) when there is one, else start there afresh; so
    the same command can be resubmitted after a preemption."""

    @model_validator(mode="before")
    @classmethod
    def _one_epoch_by_default(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("epochs") is None and data.get("max_steps") is None:
            return {**data, "epochs": 1}
        return data

    @model_validator(mode="after")
    def _compile_mode_needs_compile(self) -> TrainTable:
        if self.compile_mode != "default" and not self.compile:
            raise ValueError(f'compile_mode = "{self.compile_mode}" needs compile = true')
        return self


class LaunchTable(Options):
    """``[launch]``: how many processes on how many machines, named as ``accelerate launch`` names
    them. Each key is also a CLI flag (``--num-processes 2``), which wins over the file."""

    num_processes: int = Field(1, ge=1)
    """Processes in all, across machines (one per GPU, typically)."""
    num_machines: int = Field(1, ge=1)
    """Machines in all; ``num_processes`` is split evenly between them."""
    machine_rank: int = Field(0, ge=0)
    """This machine's rank, 0 to ``num_machines - 1`` (each machine runs the same command with its own)."""
    main_process_ip: str | None = Field(None, min_length=1)
    """Machine 0's address, which the others reach; needed with several machines."""
    main_process_port: int | None = Field(None, ge=1, le=65535)
    """The port machine 0 listens on for the others; needed with several machines."""

    @model_validator(mode="after")
    def _consistent(self) -> LaunchTable:
        if self.num_processes % self.num_machines:
            raise ValueError(
                f"num_processes ({self.num_processes}) must be a multiple of num_machines ({self.num_machines})"
            )
        if self.machine_rank >= self.num_machines:
            raise ValueError(f"machine_rank ({self.machine_rank}) must be below num_machines ({self.num_machines})")
        if self.num_machines > 1 and (self.main_process_ip is None or self.main_process_port is None):
            raise ValueError("several machines need main_process_ip and main_process_port (the address of machine 0)")
        return self

    @property
    def processes_per_machine(self) -> int:
        return self.num_processes // self.num_machines


class TrackingTable(Options):
    """``[tracking]``: where the MLflow run goes. Unset values fall back to MLflow's own
    environment variables (``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``), then defaults."""

    uri: str | None = Field(None, min_length=1)
    """The MLflow tracking server or store; by default ``$MLFLOW_TRACKING_URI``, else
    ``sqlite:///mlflow.db`` in the working folder."""
    experiment: str | None = Field(None, min_length=1)
    """The MLflow experiment; by default ``$MLFLOW_EXPERIMENT_NAME``, else ``job.name``."""
    run_name: str | None = Field(None, min_length=1)
    """The MLflow run name; by default the run's ``--set`` values abbreviated (``lr=0.003 bs=64``)
    or its start time, then `` · `` and the job's name."""
    tags: dict[str, str] = Field(default_factory=dict)
    """Extra MLflow tags, a table of strings."""
    offline: bool = False
    """Record only to the output folder (no MLflow contact); upload later with ``runjob sync``."""
    system_metrics_interval: float | None = Field(None, ge=0)
    """Seconds between MLflow system-metric samples (CPU, memory, disk, network, GPU) on each
    machine; 0 turns them off; by default 10 on a GPU run and off
    on a CPU-only one, where they would be 8 of its 15 metrics (disk, network, memory) in MLflow's
    compare and chart views, next to 7 of its own."""
    log_model: Literal["weights", "pickle", "pt2", "none"] = "weights"
    """How the final model is logged as an MLflow model: its safetensors weights and job, rebuilt
    through runjob when loaded (``mlflow.pyfunc.load_model``; written without torch, so the end of a
    run does not wait on torch's import), the pickled module (``mlflow.pytorch.load_model``; loading
    needs its code importable), a ``torch.export`` program (loads without the code; the model must
    export), or not at all."""


class LoaderOptions(Options):
    """The DataLoader keys every ``[dataset]`` table accepts besides its dataset's own options."""

    num_workers: int = Field(0, ge=0)
    """DataLoader worker processes for each training process; 0 loads in the training process."""
    pin_memory: bool | None = None
    """Pinned host memory for faster copies to the GPU; by default on where a GPU is used."""
    persistent_workers: bool = False
    """Keep the loader's workers between epochs (needs ``num_workers > 0``)."""
    prefetch_factor: int | None = Field(None, ge=1)
    """Batches each worker loads ahead (needs ``num_workers > 0``); by default PyTorch's."""

    @model_validator(mode="after")
    def _workers_needed(self) -> LoaderOptions:
        if self.num_workers == 0 and (self.persistent_workers or self.prefetch_factor is not None):
            raise ValueError("persistent_workers and prefetch_factor need num_workers > 0")
        return self


class ModelSetup(Options):
    """The keys every ``[model]`` table accepts besides its model's own options: where the weights
    start from and which of them are not trained. Names are checked when the model is built."""

    init_from: str | None = Field(None, min_length=1)
    """Weights to start from: a run's output folder (its ``model.safetensors``; ``best/`` too), a
    ``.safetensors`` file, or an MLflow run ``runs:/RUN_ID`` (its ``model.safetensors`` artifact) or
    ``runs:/RUN_ID/PATH`` (an artifact folder holding one, or a ``.safetensors`` artifact)."""
    freeze: list[str] = Field(default_factory=list)
    """Regular expressions, matched from the start of the parameter names (``re.match``): those
    parameters are not trained (no gradients, left out of the optimizer)."""

    @field_validator("init_from")
    @classmethod
    def _source(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if value.startswith(RUNS_URI):
            run_id = value.removeprefix(RUNS_URI).split("/", 1)[0]
            if not re.fullmatch(r"[0-9A-Za-z_-]+", run_id):
                raise ValueError(f"an MLflow run is written {RUNS_URI}RUN_ID (or {RUNS_URI}RUN_ID/PATH)")
            return value.rstrip("/")
        path = Path(os.path.abspath(os.path.expanduser(value)))
        if path.is_dir():
            if not RunFolder(path).weights.is_file():
                raise ValueError(f"folder {path} has no {WEIGHTS_FILE} (a run's output folder has one when it ended)")
        elif path.is_file():
            if path.suffix != ".safetensors":
                raise ValueError(f"{path} is not a .safetensors file (a run's {WEIGHTS_FILE}, or its output folder)")
        else:
            raise ValueError(f"not found: {path} (a run's output folder, a .safetensors file or {RUNS_URI}RUN_ID)")
        return str(path)

    @field_validator("freeze")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            _compiles(pattern)
        return value


class ParamGroup(Options):
    """One ``[optimizer] groups`` entry: the parameters whose names match ``params`` (``re.match``,
    from the start of the name), trained with their own ``lr`` and ``weight_decay``."""

    params: str = Field(min_length=1)
    """A regular expression matched from the start of each parameter's name."""
    lr: float | None = Field(None, gt=0)
    """The group's learning rate; by default the optimizer's."""
    weight_decay: float | None = Field(None, ge=0)
    """The group's weight decay; by default the optimizer's."""

    @field_validator("params")
    @classmethod
    def _pattern(cls, value: str) -> str:
        return _compiles(value)


class OptimizerSetup(Options):
    """The keys every ``[optimizer]`` table accepts besides its optimizer's own options: parameter
    groups. The optimizer's factory receives them as torch.optim param-group dicts."""

    groups: list[ParamGroup] = Field(default_factory=list)
    """Each group takes the parameters its ``params`` matches (the first matching group wins); the
    rest train with the optimizer's own options."""
    no_decay_norm_and_bias: bool = False
    """weight_decay 0 for every bias and every parameter of a normalization layer."""


def _compiles(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as error:
        raise ValueError(f"{pattern!r} is not a regular expression: {error}") from None
    return pattern


class SweepRange(Options):
    """A range to draw a sweep parameter from (random and TPE sweeps): integers when both bounds
    are integers, else floats; ``log`` draws uniformly in log space."""

    low: int | float
    """The range's lower bound."""
    high: int | float
    """The range's upper bound (above ``low``)."""
    log: bool = False
    """Draw uniformly in log space (needs ``low > 0``): for learning rates and the like."""

    @model_validator(mode="before")
    @classmethod
    def _numbers(cls, data: object) -> object:
        for bound in ("low", "high"):
            value = data.get(bound) if isinstance(data, dict) else None
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{bound} must be a number (got {value!r})")
        return data

    @model_validator(mode="after")
    def _ordered(self) -> SweepRange:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError(f"log = true needs low > 0 (got low = {self.low})")
        return self

    @property
    def integer(self) -> bool:
        return isinstance(self.low, int) and isinstance(self.high, int)


PRUNER_OPTIONS: dict[str, tuple[str, ...]] = {
    "none": (),
    "median": ("n_startup_trials", "n_warmup_steps", "interval_steps", "n_min_trials"),
    "successive_halving": ("min_resource", "reduction_factor", "min_early_stopping_rate", "bootstrap_count"),
    "hyperband": ("min_resource", "max_resource", "reduction_factor", "bootstrap_count"),
}
"""Each pruner's options, as Optuna's pruner of that name takes them (its steps are evaluations)."""


class SweepPruner(Options):
    """``[sweep] pruner``: a name, or a table with the name and Optuna's options for that pruner.
    Each evaluation of a trial reports the sweep metric to it (step 1, 2, ...: the evaluations)."""

    name: Literal["none", "median", "successive_halving", "hyperband"] = "none"
    """The Optuna pruner that stops unpromising trials early: ``median``, ``successive_halving``,
    ``hyperband``, or ``none``."""
    n_startup_trials: int | None = Field(None, ge=0)
    n_warmup_steps: int | None = Field(None, ge=0)
    interval_steps: int | None = Field(None, ge=1)
    n_min_trials: int | None = Field(None, ge=1)
    min_resource: int | Literal["auto"] | None = None
    max_resource: int | Literal["auto"] | None = None
    reduction_factor: int | None = Field(None, ge=2)
    min_early_stopping_rate: int | None = Field(None, ge=0)
    bootstrap_count: int | None = Field(None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _named(cls, data: object) -> object:
        return {"name": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _its_options(self) -> SweepPruner:
        allowed = PRUNER_OPTIONS[self.name]
        foreign = sorted(set(self.model_fields_set) - {"name", *allowed})
        if foreign:
            said = ", ".join(allowed) if allowed else "none"
            raise ValueError(f"{', '.join(foreign)}: not an option of the {self.name!r} pruner (its options: {said})")
        return self

    def options(self) -> dict[str, Any]:
        """The options the job set, as keyword arguments of Optuna's pruner."""
        return {key: getattr(self, key) for key in PRUNER_OPTIONS[self.name] if key in self.model_fields_set}


SAMPLERS = ("grid", "random", "tpe", "cmaes", "gp")


class SweepTable(Options):
    """``[sweep]``: the trials ``runjob sweep`` runs. ``parameters`` maps dotted job keys to a list
    of values to try or a :class:`SweepRange`; :mod:`runjob.job.validation` checks them."""

    method: Literal["grid", "random", "tpe", "cmaes", "gp"] = "grid"
    """How trials are chosen: every combination (``grid``), ``random``, or Optuna's ``tpe``,
    ``cmaes`` and ``gp`` samplers."""
    trials: int | None = Field(None, ge=1)
    """The trial budget; a grid runs every combination, so it may be left out there."""
    metric: str | None = Field(None, min_length=1)
    """A metric the trials log, one the job's task declares (``val/...``, ``test/...``) or
    ``train/loss``; its last value is the trial's result. By default the task's first metric."""
    direction: Literal["maximize", "minimize"] | None = None
    """By default the direction the task declares for the metric."""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """The sampler's seed: the same seed draws the same trials."""
    parameters: dict[str, list[JSONValue] | SweepRange]  # a trial gets its values as JSON: no TOML dates
    storage: str | None = Field(None, min_length=1)
    """Where the Optuna study lives: a storage URL (``postgresql://...``, ``sqlite:///...``) or a
    journal file's path; by default ``study.journal`` in the sweep's folder."""
    study: str | None = Field(None, min_length=1, max_length=200)
    """The study's name; by default the sweep folder's name."""
    pruner: SweepPruner = Field(default_factory=SweepPruner)
    gpus_per_trial: int | None = Field(None, ge=0)
    """GPUs each trial gets; by default, where GPUs are visible, one for each of a trial's processes, else 0."""

    @model_validator(mode="after")
    def _complete(self) -> SweepTable:
        if self.trials is None and self.method != "grid":
            raise ValueError(f'trials is required with method = "{self.method}": how many trials to run')
        return self
