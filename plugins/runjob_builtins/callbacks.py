"""Built-in callbacks a job switches on in ``[callbacks.NAME]`` tables: ``early_stopping``, ``ema``
and ``profile``.

They use only the public plugin API (``runjob.Callback``, ``runjob.CallbackOptions``), as a
third-party callback would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, field_validator

from runjob import Callback, CallbackOptions, RunFolder, hookimpl

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    import torch
    from torch.autograd.profiler_util import EventList
    from torch.profiler import profile

    from runjob import Register, Run


class EarlyStoppingOptions(CallbackOptions):
    metric: str | None = Field(None, min_length=1)
    """The evaluation metric to watch; by default ``train.best_metric``. Better is the direction the
    task (or the callback that logs it) declares."""
    patience: int = Field(3, ge=1)
    """Evaluations in a row without improvement before training stops."""
    min_delta: float = Field(0.0, ge=0)
    """How much better than the best so far counts as an improvement."""

    @field_validator("metric")
    @classmethod
    def _evaluated(cls, metric: str | None) -> str | None:
        if metric is not None and not metric.startswith("val/"):
            raise ValueError(f"early stopping watches an evaluation metric (val/...), got {metric!r}")
        return metric

    def watches(self) -> dict[str, str]:
        return {"metric": self.metric} if self.metric else {}


class EarlyStopping(Callback):
    """Stops training when the watched metric has not improved for ``patience`` evaluations; the
    run then saves its final and best model and ends FINISHED."""

    def __init__(self, options: EarlyStoppingOptions) -> None:
        self.metric = options.metric or ""  # "": train.best_metric, read at on_run_start
        self.patience = options.patience
        self.min_delta = options.min_delta
        self.best: float | None = None
        self.waited = 0

    def on_run_start(self, run: Run) -> None:
        self.metric = self.metric or run.job.train.best_metric or ""  # a resolved job names its best_metric
        self.higher_is_better = run.job.metrics[self.metric] == "max"

    def on_evaluation(self, run: Run, step: int, epoch: int, metrics: dict[str, float]) -> None:
        value = metrics.get(self.metric, run.logged.get(self.metric))
        if value is None or value != value:  # not reported at this evaluation, or NaN
            return
        gain = (value - self.best if self.higher_is_better else self.best - value) if self.best is not None else None
        if gain is None or gain > self.min_delta:
            self.best, self.waited = value, 0
            return
        self.waited += 1
        if self.waited >= self.patience:
            run.request_stop(
                f"early_stopping: {self.metric} did not improve on {self.best:.6g} for {self.patience} evaluation(s)"
            )

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "waited": self.waited}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.waited = state["best"], state["waited"]


class EmaOptions(CallbackOptions):
    owns_model: ClassVar[bool] = True

    decay: float = Field(0.999, gt=0, lt=1)
    """How much of the average each step keeps: after a step, ``average += (1 - decay) * (weights -
    average)``. About ``1 / (1 - decay)`` steps make up the average (1,000 for 0.999)."""
    warmup_steps: int = Field(0, ge=0)
    """For the first ``warmup_steps`` optimizer steps the average is the weights themselves (copied
    after each step); averaging with ``decay`` starts from there, so early, poor weights don't linger."""


class ExponentialMovingAverage(Callback):
    """``ema``: an exponential moving average of the model's parameters, which is what evaluations
    see, and what the run ends with: the test-split evaluation, ``model.safetensors``, ``best/`` and
    the MLflow model all hold the averaged weights. Training itself is unchanged.

    - After each optimizer step the average moves towards the weights, on the training device, with
      no host-device sync (``torch._foreach_lerp_``). Only floating-point parameters are averaged;
      buffers (BatchNorm's running statistics) are the model's own, as they are at that moment.
    - An evaluation swaps the averaged values into the model (the training weights are copied
      aside) at ``on_evaluation_start`` and puts them back at ``on_evaluation_end``, after
      ``best_weights`` saved ``best/`` (declared: ``after``): so ``best/`` holds the averaged
      weights that were evaluated, while the checkpoint written after an evaluation holds the
      training weights, as a checkpoint should.
    - ``on_train_end`` puts the average into the model for good.
    - ``state_dict`` holds the average (CPU copies) and the number of steps averaged, so a resumed
      run continues the same average, bit for bit.
    - Under DDP every process keeps the same average, as DDP keeps the weights the same. Sharded
      strategies (``fsdp``, ``deepspeed``) are refused at the start: each process holds only a shard
      of the parameters, which this average cannot follow.
    """

    after = ("best_weights",)  # best_weights saves the averaged weights before ema puts the training ones back

    def __init__(self, options: EmaOptions) -> None:
        self.decay = options.decay
        self.warmup_steps = options.warmup_steps
        self.steps = 0  # optimizer steps folded into the average
        self.average: list[torch.Tensor] | None = None  # on the device, one tensor per averaged parameter
        self.loaded: list[torch.Tensor] | None = None  # a checkpoint's average, until on_run_start places it
        self.kept: list[torch.Tensor] | None = None  # the training weights, aside during an evaluation
        self.swapped = False  # the model holds the averaged values for an evaluation
        self.final = False  # on_train_end put the average into the model for good

    @staticmethod
    def parameters(run: Run) -> list[torch.Tensor]:
        model: torch.nn.Module = run.accelerator.unwrap_model(run.model)
        return [parameter for parameter in model.parameters() if parameter.is_floating_point()]

    def on_run_start(self, run: Run) -> None:
        import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

        kind = str(getattr(run.accelerator.distributed_type, "value", run.accelerator.distributed_type))
        if kind in SHARDED:
            raise ValueError(
                f"ema averages whole parameters, and with {SHARDED[kind]} each process holds only a shard of them: "
                "use strategy 'ddp' (or none) with ema, or leave ema out"
            )
        parameters = self.parameters(run)
        with torch.no_grad():
            if self.loaded is None:
                self.average = [parameter.detach().clone() for parameter in parameters]
                return
            shapes = [tuple(parameter.shape) for parameter in parameters]
            if [tuple(tensor.shape) for tensor in self.loaded] != shapes:
                raise ValueError(
                    f"the checkpoint's average ({len(self.loaded)} tensors) does not fit the model's "
                    f"{len(shapes)} parameters"
                )
            self.average = [
                tensor.to(device=parameter.device, dtype=parameter.dtype).clone()
                for tensor, parameter in zip(self.loaded, parameters, strict=True)
            ]
            self.loaded = None

    def on_step(self, run: Run, step: int, epoch: int, loss: torch.Tensor) -> None:
        import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

        if self.swapped:  # the host changed: a step was taken on the averaged weights
            raise RuntimeError("the averaged weights were still in the model at a training step")
        self.steps += 1
        with torch.no_grad():
            parameters = [parameter.detach() for parameter in self.parameters(run)]
            if self.steps <= self.warmup_steps:
                torch._foreach_copy_(self.averaged(), parameters)
            else:
                torch._foreach_lerp_(self.averaged(), parameters, 1.0 - self.decay)

    def on_evaluation_start(self, run: Run, step: int, epoch: int) -> None:
        import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

        if self.final or self.swapped:
            return
        with torch.no_grad():
            parameters = self.parameters(run)
            if self.kept is None:
                self.kept = [parameter.detach().clone() for parameter in parameters]
            else:
                torch._foreach_copy_(self.kept, [parameter.detach() for parameter in parameters])
            torch._foreach_copy_(parameters, self.averaged())
        self.swapped = True

    def on_evaluation_end(self, run: Run, step: int, epoch: int) -> None:
        self.restore(run)

    def restore(self, run: Run) -> None:
        """Put the training weights back after an evaluation of the averaged ones."""
        import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

        if not self.swapped or self.kept is None:  # kept is set whenever swapped is
            return
        with torch.no_grad():
            torch._foreach_copy_(self.parameters(run), self.kept)
        self.swapped = False

    def on_train_end(self, run: Run, step: int, epoch: int) -> None:
        import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

        self.restore(run)
        with torch.no_grad():
            torch._foreach_copy_(self.parameters(run), self.averaged())
        self.final, self.kept = True, None
        run.say(f"runjob: ema: the model now holds the average of {self.steps} step(s) (decay {self.decay:g})")

    def averaged(self) -> list[torch.Tensor]:
        """The average, which ``on_run_start`` made."""
        if self.average is None:
            raise RuntimeError("ema: the average is made at on_run_start, which has not run")
        return self.average

    def state_dict(self) -> dict[str, Any]:
        if self.average is None:
            return {}
        return {"steps": self.steps, "average": [tensor.detach().cpu().clone() for tensor in self.average]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps, self.loaded = int(state["steps"]), list(state["average"])


SHARDED = {"FSDP": "strategy 'fsdp'", "DEEPSPEED": "strategy 'deepspeed'", "MEGATRON_LM": "Megatron-LM"}
"""Accelerate's distributed types whose processes hold shards of the parameters."""


class ProfileOptions(CallbackOptions):
    start_step: int = Field(5, ge=1)
    """The first optimizer step profiled (1-based); the first steps are usually slow (allocation,
    compilation), which is why it is not 1 by default."""
    steps: int = Field(3, ge=1)
    """How many optimizer steps are profiled."""
    record_shapes: bool = False
    """Record the input shapes of each operator (a larger trace; the table groups by shape)."""


class Profile(Callback):
    """``profile``: a ``torch.profiler`` trace of optimizer steps ``start_step`` ...
    ``start_step + steps - 1``, on the main process. It writes ``OUTPUT_DIR/profile/trace.json``
    (Chrome trace format: open it in Perfetto or ``chrome://tracing``) and
    ``OUTPUT_DIR/profile/top_operators.txt`` (the operators by self CPU time, and by self CUDA time
    on a GPU), and prints one line with the top operators. An evaluation that falls inside the
    window is in the trace too. A run that resumes past ``start_step`` profiles nothing; one that
    ends inside the window writes what it recorded.
    """

    def __init__(self, options: ProfileOptions) -> None:
        self.start_step = options.start_step
        self.last_step = options.start_step + options.steps - 1
        self.record_shapes = options.record_shapes
        self.profiler: profile | None = None
        self.first = 0  # the first step inside the trace

    def on_run_start(self, run: Run) -> None:
        self._start_if_next(run, run.step)

    def on_step(self, run: Run, step: int, epoch: int, loss: torch.Tensor) -> None:
        if self.profiler is not None and step >= self.last_step:
            self._finish(run, step)
        self._start_if_next(run, step)

    def on_train_end(self, run: Run, step: int, epoch: int) -> None:
        if self.profiler is not None:
            self._finish(run, step)

    def on_run_end(self, run: Run, status: str, error: BaseException | None) -> None:
        if self.profiler is not None:  # the run failed inside the window
            self.profiler.stop()
            self.profiler = None

    def _start_if_next(self, run: Run, done: int) -> None:
        if done + 1 != self.start_step or not run.accelerator.is_main_process:
            return
        # lazy: plugin modules are imported by `runjob validate`, which must not load torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if run.accelerator.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.profiler = profile(activities=activities, record_shapes=self.record_shapes)
        self.profiler.start()
        self.first = self.start_step

    def _finish(self, run: Run, step: int) -> None:
        profiler, self.profiler = self.profiler, None
        if profiler is None:
            return
        profiler.stop()
        paths = RunFolder(run.output_dir)
        folder = paths.profile_dir
        folder.mkdir(parents=True, exist_ok=True)
        on_device = run.accelerator.device.type == "cuda"
        averages = profiler.key_averages(group_by_input_shape=self.record_shapes)
        tables = [averages.table(sort_by="self_cpu_time_total", row_limit=30)]
        if on_device:
            tables.append(averages.table(sort_by="self_device_time_total", row_limit=30))
        profiler.export_chrome_trace(str(paths.profile_trace))
        steps = f"{self.first}-{step}" if step > self.first else str(self.first)
        paths.profile_operators.write_text(
            f"torch.profiler, optimizer steps {steps}\n\n" + "\n\n".join(tables) + "\n", encoding="utf-8"
        )
        clock = "self_device_time_total" if on_device else "self_cpu_time_total"
        top = top_operators(averages, clock)
        run.say(
            f"runjob: profile of steps {steps}: top operators by self {'CUDA' if on_device else 'CPU'} time: "
            f"{top} (trace in {folder})"
        )
        run.log_artifact(folder)


def top_operators(averages: EventList, clock: str, count: int = 5) -> str:
    """``aten::convolution_backward 41%, aten::mm 12%, ...``: the operators with the most self time,
    as a share of all self time."""
    times = [(getattr(event, clock), event.key) for event in averages if getattr(event, clock) > 0]
    total = sum(time for time, _ in times)
    if not total:
        return "none recorded"
    return ", ".join(f"{name} {100 * time / total:.0f}%" for time, name in sorted(times, reverse=True)[:count])


@hookimpl
def runjob_register_callbacks(register: Register) -> None:
    """Register early_stopping, ema and profile."""
    register(
        "early_stopping",
        EarlyStopping,
        options=EarlyStoppingOptions,
        description="stop when a metric has not improved for `patience` evaluations; the run finishes",
    )
    register(
        "ema",
        ExponentialMovingAverage,
        options=EmaOptions,
        description="evaluate, save and log an exponential moving average of the weights (`decay`)",
    )
    register(
        "profile",
        Profile,
        options=ProfileOptions,
        description="a torch.profiler trace of chosen steps and a summary of the top operators",
    )
