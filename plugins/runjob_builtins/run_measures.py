"""The callbacks on in every job: ``best_weights``, ``throughput`` and ``peak_memory``.

They are runjob's own loop features, written against the public plugin API as a third-party
callback would be, and registered ``on_by_default``: a job switches one off with
``[callbacks.NAME] enabled = false``; ``--disable-plugin run_measures`` switches off all three.
"""

from __future__ import annotations

import json
import resource
import time
from typing import TYPE_CHECKING, Literal

from runjob import (
    Callback,
    CallbackOptions,
    RunFolder,
    hookimpl,
    model_flops_per_unit,
    peak_flops,
)
from runjob.tags import (  # the one owner of runjob's tag names, public
    BEST_METRIC_TAG,
    BEST_STEP_TAG,
    BEST_VALUE_TAG,
    FLOPS_COUNTED_TAG,
    flops_per_tag,
)

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    from runjob import Register, Run


class BestWeights(Callback):
    """``best_weights``: keeps ``OUTPUT_DIR/best/model.safetensors``, the weights at the evaluation
    with the best ``train.best_metric`` so far (higher or lower, as the task or the callback that
    logs it declares), names them the run's model ``best`` (``run.add_model``: listed at the end of
    the run, uploaded with it, found by ``init_from = "runs:/ID/best"``), and sets the tags
    ``runjob.best.metric``, ``runjob.best.value`` and ``runjob.best.step``. It saves at
    ``on_evaluation_end``, before the callbacks that declare they come after it (``ema``: so from
    the weights as evaluated, the average), and sees the metrics callbacks logged during the
    evaluation. ``best/best.json`` (metric, value, step) lets a resumed run continue from the best
    so far."""

    def __init__(self, options: CallbackOptions) -> None:
        self.metric = ""
        self.higher_is_better = True
        self.value: float | None = None
        self.step: int | None = None
        self.evaluated: dict[str, float] = {}

    def on_run_start(self, run: Run) -> None:
        self.metric = run.job.train.best_metric or ""  # a resolved job names its best_metric
        self.higher_is_better = run.job.metrics[self.metric] == "max"
        folder = RunFolder(run.output_dir)
        self.folder, self.record = folder.best_dir, folder.best_file
        if self.record.is_file():
            state = json.loads(self.record.read_text(encoding="utf-8"))
            if state.get("metric") == self.metric:
                self.value, self.step = state["value"], state["step"]

    def on_evaluation(self, run: Run, step: int, epoch: int, metrics: dict[str, float]) -> None:
        self.evaluated = metrics

    def on_evaluation_end(self, run: Run, step: int, epoch: int) -> None:
        value = self.evaluated.get(self.metric, run.logged.get(self.metric))
        if value is None or value != value:  # not reported, or NaN
            return
        if self.value is not None and (value <= self.value if self.higher_is_better else value >= self.value):
            return
        weights = run.save_model(self.folder)  # on every process: a sharded model is gathered
        self.value, self.step = value, step
        if run.is_main_process:
            state = {"metric": self.metric, "value": value, "step": step}
            self.record.write_text(json.dumps(state) + "\n", encoding="utf-8")
            # named as its folder is (RunFolder's best/), so init_from = "runs:/ID/best" names both
            run.add_model(self.folder.name, weights, f"{self.metric} {value:.4g} at step {step}")
            run.set_tags({BEST_METRIC_TAG: self.metric, BEST_VALUE_TAG: f"{value:.6g}", BEST_STEP_TAG: str(step)})


class ThroughputOptions(CallbackOptions):
    flops: bool = True
    """Count the model's FLOPs per sample (or token) once, at the first batch, on a copy of the run's
    model made on the ``meta`` device (its factory not called again, no memory, no time on the
    device, the weights untouched), to log
    ``train/tflops`` and, where the device's peak is known (``train.peak_tflops``, or a known GPU
    in bf16/fp16), ``train/mfu``."""

    def metrics(self) -> dict[str, Literal["max", "min"]]:
        return {"train/tflops": "max", "train/mfu": "max"}


class Throughput(Callback):
    """``throughput``: at each log, ``train/<unit>_per_s`` (the task's unit: samples, tokens) over all
    processes since the last log, counting training time only (evaluations and the time between
    epochs are left out), and with ``flops`` the model TFLOP/s and MFU. The FLOPs per unit are also
    the tag ``runjob.flops_per_<unit>``."""

    def __init__(self, options: ThroughputOptions) -> None:
        self.count_flops = options.flops
        self.flops_per_unit: float | None = None
        self.peak: float | None = None
        self.units = 0
        self.seconds = 0.0  # training time in this window before the current stretch
        self.since: float | None = None  # when the current stretch of training began

    def on_run_start(self, run: Run) -> None:
        train = run.job.train
        self.peak = peak_flops(run.accelerator.device, train.mixed_precision, train.peak_tflops)

    def on_epoch_start(self, run: Run, step: int, epoch: int) -> None:
        self.since = time.perf_counter()

    def on_batch(self, run: Run, step: int, epoch: int, batch: object) -> None:
        if self.count_flops:
            self.count_flops = False
            began = time.perf_counter()
            self._count(run, batch)
            if self.since is not None:  # counting is not training time
                self.since += time.perf_counter() - began
        self.units += run.task.count(batch)

    def _count(self, run: Run, batch: object) -> None:
        # stated by the model, else counted on a meta copy of the built model (its factory runs once
        # per run), else on one real forward pass
        self.flops_per_unit, how = model_flops_per_unit(run.model, run.task, batch)
        if self.flops_per_unit:
            unit = run.task.unit.removesuffix("s")
            run.set_tags({flops_per_tag(unit): f"{self.flops_per_unit:.6g}", FLOPS_COUNTED_TAG: how})

    def on_evaluation_start(self, run: Run, step: int, epoch: int) -> None:
        if self.since is not None:
            self.seconds += time.perf_counter() - self.since
            self.since = None

    def on_evaluation_end(self, run: Run, step: int, epoch: int) -> None:
        self.since = time.perf_counter()

    def on_log(self, run: Run, step: int, epoch: int, metrics: dict[str, float]) -> None:
        now = time.perf_counter()
        seconds = max(self.seconds + (now - self.since if self.since is not None else 0.0), 1e-9)
        processes = run.accelerator.num_processes
        rate = self.units * processes / seconds
        values = {f"train/{run.task.unit}_per_s": rate}
        if self.flops_per_unit:
            achieved = rate * self.flops_per_unit
            values["train/tflops"] = achieved / 1e12
            if self.peak:
                values["train/mfu"] = achieved / (self.peak * processes)
        run.log(values)
        self.units, self.seconds, self.since = 0, 0.0, now


class PeakMemory(Callback):
    """``peak_memory``: at each log, the peak memory so far: ``train/peak_memory_gib`` (the device's
    allocations) on CUDA, else ``train/peak_rss_gib`` (this process's resident set)."""

    def __init__(self, options: CallbackOptions) -> None:
        pass

    def on_log(self, run: Run, step: int, epoch: int, metrics: dict[str, float]) -> None:
        device = run.accelerator.device
        if device.type == "cuda":
            import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

            run.log({"train/peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30})
        else:
            run.log({"train/peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20})  # KiB


class PeakMemoryOptions(CallbackOptions):
    def metrics(self) -> dict[str, Literal["max", "min"]]:
        return {"train/peak_memory_gib": "min", "train/peak_rss_gib": "min"}


class BestWeightsOptions(CallbackOptions):
    """No options of its own: the metric is ``train.best_metric``."""


@hookimpl
def runjob_register_callbacks(register: Register) -> None:
    """Register best_weights, throughput and peak_memory, on in every job."""
    register(
        "best_weights",
        BestWeights,
        options=BestWeightsOptions,
        description="keep best/: the weights at the best train.best_metric so far, uploaded with the run",
        on_by_default=True,
    )
    register(
        "throughput",
        Throughput,
        options=ThroughputOptions,
        description="log train/<unit>_per_s, and with the model's FLOPs train/tflops and train/mfu",
        on_by_default=True,
    )
    register(
        "peak_memory",
        PeakMemory,
        options=PeakMemoryOptions,
        description="log the peak memory so far: device allocations on CUDA, else the resident set",
        on_by_default=True,
    )
