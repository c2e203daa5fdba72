"""The training loop and evaluation: as lean as a hand-written Accelerate loop.

Per optimizer step the loop does forward, ``accelerator.backward``, optional clipping, step and
zero_grad; the loss is summed on the device and read back (a host-device sync) only every
``train.log_every`` steps.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from runjob.errors import Terminated, TrainingError, first_line
from runjob.host.events import Dispatcher, Event
from runjob.host.output import screen
from runjob.host.run_context import Clock, Run, StopFlag
from runjob.train.checkpoints import Position, save_checkpoint
from runjob.train.data_loading import PositionedLoader, is_stream

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from tqdm.auto import tqdm

    from runjob.host.components import Batch, ModelOutputs
    from runjob.host.task import Task, TaskOptions
    from runjob.job.schema import TrainTable


VALID_ROWS = "runjob.valid_rows"
"""The key a streamed batch's row mask travels under when evaluation gathers it."""


@dataclass
class Schedule:
    """How long the run is: epochs, optimizer steps per epoch, and the total."""

    epochs: int
    steps_per_epoch: int
    total_steps: int


def plan_schedule(train: TrainTable, batches_per_epoch: int) -> Schedule:
    """Turn ``train.epochs`` / ``train.max_steps`` into a schedule (whichever ends first)."""
    steps_per_epoch = max(1, math.ceil(batches_per_epoch / train.gradient_accumulation_steps))
    if train.epochs is None:
        max_steps = cast(int, train.max_steps)  # the job's validation: epochs or max_steps
        epochs = math.ceil(max_steps / steps_per_epoch)
        return Schedule(epochs, steps_per_epoch, max_steps)
    total = epochs_total = train.epochs * steps_per_epoch
    if train.max_steps is not None:
        total = min(epochs_total, train.max_steps)
    return Schedule(min(train.epochs, math.ceil(total / steps_per_epoch)), steps_per_epoch, total)


def shapes(batch: object) -> str:
    """The shapes in a batch of nested tuples, lists and dicts, for messages: ``(32, 3, 32, 32), (32,)``."""
    if hasattr(batch, "shape"):
        return str(tuple(batch.shape))
    if isinstance(batch, dict):
        return "{" + ", ".join(f"{key!r}: {shapes(value)}" for key, value in batch.items()) + "}"
    if isinstance(batch, (tuple, list)):
        return ", ".join(shapes(item) for item in batch)
    return type(batch).__name__


def channels_last(batch: Batch) -> Batch:
    """Every 4-D tensor of a batch (images) in channels-last memory; anything else as it is."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch and accelerate load
    # (train.entry)
    import torch
    from accelerate.utils import recursively_apply

    def convert(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.contiguous(memory_format=torch.channels_last) if tensor.ndim == 4 else tensor

    return recursively_apply(convert, batch, error_on_other_type=False)


def first_loss(run: Run, batch: Batch) -> torch.Tensor:
    """The loss of the first training batch, its outputs checked by the task: a model that cannot
    take the data, or whose outputs do not fit the task, stops with one line naming all three."""
    job, task = run.job, run.task
    misfit = f"model {job.model.name!r} does not fit task {job.task.name!r} with dataset {job.dataset.name!r}"
    try:
        inputs = task.inputs(batch)
    except (ValueError, LookupError, TypeError) as error:  # the task cannot read the dataset's batches
        raise TrainingError(
            f"task {job.task.name!r} cannot read a batch of dataset {job.dataset.name!r} ({shapes(batch)}): "
            f"{first_line(error)}"
        ) from None
    try:
        outputs = task.forward(run.model, batch)
    except (RuntimeError, ValueError) as error:  # torch's shape errors; a model's own checks
        raise TrainingError(
            f"model {job.model.name!r} cannot take the inputs of dataset {job.dataset.name!r} "
            f"(a batch of shape {shapes(inputs)}): {first_line(error)}"
        ) from None
    try:
        task.check(outputs, batch)
    except ValueError as error:  # the task says what is wrong, shapes included
        raise TrainingError(f"{misfit}: {first_line(error)}") from None
    try:
        return task.loss(outputs, batch)
    except (ValueError, RuntimeError) as error:  # a shape the loss can't take, said here rather than as a traceback
        raise TrainingError(
            f"{misfit}: {first_line(error)} (outputs {shapes(outputs)}; batch {shapes(batch)})"
        ) from None


def evaluate(run: Run, loader: Iterable[Batch], prefix: str = "val") -> dict[str, float]:
    """The task's metrics over a whole split (``prefix/name``): every sample counted once on all
    processes (``gather_for_metrics``), sums kept on the device, read back once."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch

    accelerator, model, task = run.accelerator, run.model, run.task
    convert = run.job.train.channels_last
    model.eval()

    def evaluated() -> Iterator[tuple[ModelOutputs, Batch]]:
        for batch in loader:
            if convert:
                batch = channels_last(batch)
            yield task.forward(model, batch), batch

    gather: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] = accelerator.gather_for_metrics
    if isinstance(loader, PositionedLoader):
        gather = partial(_counted_rows, accelerator, loader)
    with torch.no_grad():
        totals, count = add_up(task, run.job.task.name, evaluated(), gather)
    model.train()
    return summarize(run, totals, count, prefix)


def _counted_rows(
    accelerator: Accelerator, loader: PositionedLoader, values: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """A streamed split's batch values, gathered from every process without the copies that fill a
    short batch or pad a process's share (``loader.valid``: which rows of its last batch count)."""
    valid = loader.valid
    gathered: dict[str, torch.Tensor]
    if valid is None:
        gathered = accelerator.gather_for_metrics(values)
        return gathered
    gathered = accelerator.gather({**values, VALID_ROWS: valid})
    keep = gathered.pop(VALID_ROWS)
    return {name: value[keep] for name, value in gathered.items()}


def add_up(
    task: Task,
    task_name: str,
    evaluated: Iterable[tuple[ModelOutputs, Batch]],
    gather: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
) -> tuple[dict[str, torch.Tensor], int]:
    """``task.evaluate`` of each ``(outputs, batch)`` of ``evaluated``, checked, gathered across
    processes (``gather``, none on one process) and summed over the samples on the device (float64):
    the totals and the number of samples. ``runjob.testing.evaluate_task`` calls it too."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch

    totals: dict[str, torch.Tensor] = {}
    count = 0
    for outputs, batch in evaluated:
        values = task.evaluate(outputs, batch)
        if not isinstance(values, dict) or not all(hasattr(v, "shape") and v.ndim for v in values.values()):
            raise TrainingError(
                f"task {task_name!r}: evaluate() must return a dict of tensors whose first dimension is "
                f"the batch, got {shapes(values) if isinstance(values, dict) else type(values).__name__}"
            )
        if gather is not None:
            values = gather(values)
        for name, value in values.items():
            total = value.sum(0)
            if name in totals:
                totals[name] += total
            else:
                totals[name] = total.to(torch.float64)
        count += int(next(iter(values.values())).shape[0]) if values else 0
    return totals, count


def summarize(run: Run, totals: dict[str, torch.Tensor], count: int, prefix: str) -> dict[str, float]:
    """The task's summary of the totals (one device-to-host copy), checked against what it declares."""
    options = cast("TaskOptions", run.job.task.options)  # a task's options are TaskOptions
    return summarize_totals(run.task, run.job.task.name, options, totals, count, prefix)


def summarize_totals(
    task: Task, task_name: str, options: TaskOptions, totals: dict[str, torch.Tensor], count: int, prefix: str
) -> dict[str, float]:
    """``task.summarize`` of the totals (read back in one device-to-host copy), checked against what
    ``options.metrics()`` declares, as ``prefix/name``: declared metrics first."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch

    read: dict[str, object] = {}  # nested lists of numbers, as tolist() gives them
    if totals:
        flat = torch.cat([total.reshape(-1) for total in totals.values()]).cpu()
        offset = 0
        for name, total in totals.items():
            read[name] = flat[offset : offset + total.numel()].reshape(total.shape).tolist()
            offset += total.numel()
    summary = task.summarize(read, count)
    declared = list(options.metrics())
    missing = [name for name in declared if name not in summary]
    if missing:
        raise TrainingError(
            f"task {task_name!r} declares {', '.join(missing)} but its summarize() did not return "
            f"{'it' if len(missing) == 1 else 'them'} (it returned: {', '.join(summary) or 'nothing'})"
        )
    metrics = {}
    for name in [*declared, *(name for name in summary if name not in declared)]:
        value = summary[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TrainingError(f"task {task_name!r}: summarize() gave {name} = {value!r}, not a number")
        metrics[f"{prefix}/{name}"] = float(value)
    return metrics


class NonFiniteGuard:
    """``train.on_nonfinite``: "stop" notes the first step with a non-finite loss or gradient norm on
    the device (no sync) and stops at the next log step; "skip" looks at every step (one sync a
    step) and skips the optimizer step, counting it."""

    def __init__(self, mode: str, device: torch.device) -> None:
        # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
        import torch

        self.mode = mode
        self.skipped = 0
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)

    def allows_step(self, step: int, loss: torch.Tensor, norm: torch.Tensor | None) -> bool:
        # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
        import torch

        if self.mode == "skip":  # the gradient norm is the same on every process: all skip together
            if not bool(torch.isfinite(cast("torch.Tensor", norm))):  # measured whenever skipping
                self.skipped += 1
                return False
            return True
        bad = ~torch.isfinite(loss.detach())
        if norm is not None:
            bad = bad | ~torch.isfinite(norm)
        self.first_bad = torch.where((self.first_bad < 0) & bad, torch.full_like(self.first_bad, step), self.first_bad)
        return True

    def stop_if_seen(self, accelerator: Accelerator, run: Run) -> None:
        if self.mode != "stop":
            return
        step = (
            int(accelerator.reduce(self.first_bad.clone(), reduction="max").item())
            if accelerator.num_processes > 1
            else int(self.first_bad.item())
        )
        if step >= 0:
            lr = run.optimizer.param_groups[0]["lr"]
            raise TrainingError(
                f"the loss or the gradients became NaN or infinite at step {step} (train.on_nonfinite = 'stop'). "
                f"Usual remedies: a lower learning rate (now {lr:g}), gradient clipping "
                "(train.max_grad_norm = 1.0), mixed_precision = 'bf16' instead of 'fp16'; or train.on_nonfinite = "
                "'skip' to skip such steps"
            )


class StopRequest(StopFlag):
    """Set from a signal handler (SIGTERM, SIGINT, a configured signal: ``signum``), or by a
    callback's ``run.request_stop(reason)``; the loop stops at the next point where every process
    can agree: for a signal after writing a checkpoint (the run is KILLED and can resume), for a
    callback's request cleanly (the run finishes)."""

    def agreed(self, accelerator: Accelerator) -> tuple[int, bool]:
        """The signal to stop for, and whether a callback asked to stop, agreed by all processes (a
        collective when there are several)."""
        if accelerator.num_processes == 1:
            return self.signum, bool(self.reason)
        # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
        import torch

        flags = torch.tensor([self.signum, int(bool(self.reason))], device=accelerator.device)
        signum, asked = accelerator.reduce(flags, reduction="max").tolist()
        if asked:  # once a run: every process learns the reason given, whichever process gave it
            # lazy: `runjob JOB` says its first line and starts its recording process before accelerate loads
            # (train.entry)
            from accelerate.utils import gather_object

            self.reason = next(reason for reason in gather_object([self.reason]) if reason)
        return int(signum), bool(asked)


class StoppedEarly(Exception):  # noqa: N818 - a control-flow signal inside the loop, not an error
    """A callback asked to stop and every process agreed."""


@dataclass(frozen=True)
class LoopSettings:
    """The keys of ``[train]`` the loop's order reads."""

    log_every: int
    eval_every: int | None = None
    checkpoint_every: int | None = None
    max_steps: int | None = None
    gradient_accumulation_steps: int = 1
    channels_last: bool = False

    @classmethod
    def of(cls, train: TrainTable) -> LoopSettings:
        return cls(
            train.log_every,
            train.eval_every,
            train.checkpoint_every,
            train.max_steps,
            train.gradient_accumulation_steps,
            train.channels_last,
        )


class LoopWork(Protocol):
    """What the loop's order asks the device to do; :class:`AccelerateWork` does it for a run, the
    test kit's ``drive`` with CPU fakes."""

    @property
    def batches_per_epoch(self) -> int: ...

    def start_epoch(self, epoch: int, skip: int) -> Iterable[Batch]:
        """The epoch's batches, after ``skip`` of them; the model set to train, the loss sum to zero."""
        ...

    def train_batch(self, batch: Batch, step: int, first: bool) -> tuple[torch.Tensor | float, bool]:
        """Forward and backward of one micro-batch, and the optimizer step when gradients are synced
        (towards optimizer step ``step``; ``first``: the run's first batch); the detached loss and
        whether the optimizer stepped."""
        ...

    @property
    def synced(self) -> bool:
        """Whether the last micro-batch ended an optimizer step (gradient accumulation)."""
        ...

    def after_step(self, stepped: bool) -> None:
        """Once an optimizer step is done (the scheduler's step)."""
        ...

    @property
    def unlogged(self) -> int:
        """Micro-batches since the last log line."""
        ...

    def log_metrics(self) -> dict[str, float]:
        """The mean loss since the last log line, the learning rate...; the sum starts again."""
        ...

    def evaluate(self, why: str) -> dict[str, float]:
        """The validation split's metrics (``why``: what made the loop evaluate now)."""
        ...

    def test(self) -> dict[str, float] | None:
        """The test split's metrics, or None without one."""
        ...

    def agree(self) -> tuple[int, bool]:
        """The stop signal and whether a callback asked to stop, agreed by every process."""
        ...

    def checkpoint(self, position: Position) -> Path | None:
        """Write a checkpoint at ``position``; its folder."""
        ...


class AccelerateWork:
    """The loop's work for a run: the task's loss, ``accelerator.backward``, clipping, the optimizer
    and scheduler, evaluation, checkpoints, on every process of ``run``."""

    def __init__(self, run: Run, stop: StopRequest) -> None:
        self.run = run
        self.stop = stop
        self.train = run.job.train
        self.nonfinite = NonFiniteGuard(self.train.on_nonfinite, run.accelerator.device)
        self.saved_with = {"mlflow_run_id": run.mlflow_run_id, "job": run.job.to_dict()}  # in every checkpoint
        self.loss_sum: torch.Tensor | None = None
        self.micro_batches = 0
        self.events: Dispatcher | None = None  # the run's dispatcher, for the callbacks' states in a checkpoint

    @property
    def batches_per_epoch(self) -> int:
        return len(self.run.train_loader)

    def start_epoch(self, epoch: int, skip: int) -> Iterable[Batch]:
        # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
        import torch

        loader = self.run.train_loader
        loader.set_epoch(epoch)  # the sampler's order depends on the seed and the epoch alone
        if skip and not is_stream(loader):  # a streamed split's loader took its position from the checkpoint
            loader = self.run.accelerator.skip_first_batches(loader, skip)
            loader.set_epoch(epoch)
        self.run.model.train()
        self.loss_sum = torch.zeros((), device=self.run.accelerator.device)
        self.micro_batches = 0
        return loader  # type: ignore[no-any-return]

    def train_batch(self, batch: Batch, step: int, first: bool) -> tuple[torch.Tensor | float, bool]:
        # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
        import torch

        run, train = self.run, self.train
        accelerator, model, optimizer, task = run.accelerator, run.model, run.optimizer, run.task
        with accelerator.accumulate(model):
            loss = first_loss(run, batch) if first else task.loss(task.forward(model, batch), batch)
            accelerator.backward(loss)
            stepped = True
            if accelerator.sync_gradients:
                norm = None
                if train.max_grad_norm is not None:
                    norm = accelerator.clip_grad_norm_(model.parameters(), train.max_grad_norm)
                elif train.on_nonfinite == "skip":
                    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
                stepped = self.nonfinite.allows_step(step, loss, norm)
            if stepped:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        assert self.loss_sum is not None
        self.loss_sum += loss.detach()
        self.micro_batches += 1
        return loss.detach(), stepped

    @property
    def synced(self) -> bool:
        return bool(self.run.accelerator.sync_gradients)

    def after_step(self, stepped: bool) -> None:
        scheduler = self.run.scheduler
        if scheduler is not None and stepped and not self.run.accelerator.optimizer_step_was_skipped:
            scheduler.step()

    @property
    def unlogged(self) -> int:
        return self.micro_batches

    def log_metrics(self) -> dict[str, float]:
        run, accelerator = self.run, self.run.accelerator
        assert self.loss_sum is not None
        self.nonfinite.stop_if_seen(accelerator, run)
        metrics = {
            "train/loss": accelerator.reduce(self.loss_sum / self.micro_batches, reduction="mean").item(),
            "lr": float(run.optimizer.param_groups[0]["lr"]),
        }
        if self.train.on_nonfinite == "skip":
            metrics["train/nonfinite_skipped"] = float(self.nonfinite.skipped)
        if isinstance(run.train_loader, PositionedLoader):  # a streamed split: the store's errors retried so far
            retried = self.loss_sum.new_tensor(float(run.train_loader.retries()))
            metrics["data/retries"] = accelerator.reduce(retried, reduction="sum").item()
        self.loss_sum.zero_()
        self.micro_batches = 0
        return metrics

    def evaluate(self, why: str) -> dict[str, float]:
        return evaluate(self.run, self.run.val_loader)

    def test(self) -> dict[str, float] | None:
        return evaluate(self.run, self.run.test_loader, "test") if self.run.test_loader is not None else None

    def agree(self) -> tuple[int, bool]:
        return self.stop.agreed(self.run.accelerator)

    def checkpoint(self, position: Position) -> Path:
        return save_checkpoint(self.run, position, self.train.keep_checkpoints, self.saved_with, self.events)


class TrainingLoop:
    """The loop's order, written once: runs ``schedule`` from ``start``, ``work`` doing each step
    (:class:`AccelerateWork` for a run; CPU fakes in the test kit's ``drive``); every event goes
    through ``events``, the run's one dispatcher (the callbacks, runjob's own features among them,
    then the plugins' global hooks, and the run's record as a destination:
    :mod:`runjob.host.events`); checkpoints are written every ``checkpoint_every`` steps and at each
    epoch's end, and a stop is honoured where the processes agree. ``clock`` is the one step
    counter: the loop alone moves it, and the run shows it (``run.step``, ``run.epoch``).
    ``quiet``: no progress bar or lines (the test kit)."""

    def __init__(
        self,
        run: Run,
        events: Dispatcher,
        clock: Clock,
        schedule: Schedule,
        work: LoopWork,
        settings: LoopSettings,
        *,
        stop: StopFlag,
        start: Position | None = None,
        quiet: bool = False,
    ) -> None:
        self.run = run
        self.events = events
        self.clock = clock
        self.schedule = schedule
        self.work = work
        self.settings = settings
        self.stop = stop
        self.start = start or Position()
        self.quiet = quiet
        self.last_metrics: dict[str, float] = {}
        self.batches_done = 0
        self.evaluated_at = -1  # the step of the last evaluation: the epoch's end doesn't repeat it
        self.stopped = ""  # why a callback stopped training early, when one did
        clock.step, clock.epoch = self.start.step, self.start.epoch

    @property
    def step(self) -> int:
        """Optimizer steps done: the clock's."""
        return self.clock.step

    @property
    def epoch(self) -> int:
        return self.clock.epoch

    def _say(self, line: str) -> None:
        if not self.quiet:
            screen.say(line)

    def checkpoint(self, position: Position) -> Path | None:
        return self.work.checkpoint(position)

    def fit(self) -> dict[str, float]:
        """Train for the whole schedule; returns the last metrics logged."""
        # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
        import torch

        try:
            return self._fit()
        except torch.OutOfMemoryError as error:
            train = self.run.job.train
            raise TrainingError(
                f"out of memory on {self.run.accelerator.device} at step {self.step + 1} with train.batch_size = "
                f"{train.batch_size} per process ({first_line(error)[:120]}). To use less: a smaller "
                "train.batch_size with train.gradient_accumulation_steps to keep the effective batch, "
                "train.mixed_precision = 'bf16', or a strategy that shards the model across processes (see "
                "`runjob plugins --long`: fsdp, deepspeed)"
            ) from None

    def _fit(self) -> dict[str, float]:
        try:
            self._epochs()
        except StoppedEarly:
            self.stopped = self.stop.reason or "stopped by a callback"
            self._say(f"runjob: stopping at step {self.step}: {self.stopped}")
            if self.evaluated_at != self.step:
                self._evaluate(self.epoch, "the run stops early")
        self.events.send(Event.TRAIN_END, self.step, self.epoch)
        self.last_metrics.update(self.run.logged)
        test_metrics = self.work.test()
        if test_metrics is not None:
            self.events.record(test_metrics, self.step)
            self.last_metrics.update(test_metrics)
            self._say(f"test  step {self.step}  " + "  ".join(f"{k} {v:.4g}" for k, v in test_metrics.items()))
        return self.last_metrics

    def _epochs(self) -> None:
        settings = self.settings
        for epoch in range(self.start.epoch, self.schedule.epochs):
            if settings.max_steps is not None and self.step >= settings.max_steps:
                break
            started = time.perf_counter()
            skip = self.start.batches_done if epoch == self.start.epoch else 0
            self.clock.epoch = epoch
            self.events.send(Event.EPOCH_START, self.step, epoch)
            train_metrics = self._train_epoch(epoch, skip)
            self.last_metrics.update(train_metrics)
            if self.evaluated_at != self.step:
                self._evaluate(epoch, f"the end of epoch {epoch}")
            self.events.send(Event.EPOCH_END, self.step, epoch)
            self._summary(epoch, time.perf_counter() - started)
            # train.max_steps may end the run inside an epoch: a resume with more steps goes on from there
            whole = self.batches_done >= self.work.batches_per_epoch
            finished = Position(self.step, epoch + 1, 0) if whole else Position(self.step, epoch, self.batches_done)
            self._stop_if_asked(finished)
            self.checkpoint(finished)

    def _evaluate(self, epoch: int, why: str) -> dict[str, float]:
        self.events.send(Event.EVALUATION_START, self.step, epoch)
        metrics = self.work.evaluate(why)
        self.evaluated_at = self.step
        self.events.send(Event.EVALUATION, self.step, epoch, metrics)  # recorded first (the record hears it first)
        self.events.send(Event.EVALUATION_END, self.step, epoch)
        # what callbacks logged as evaluation metrics (``val/...``, the ones that may be the
        # best_metric) is shown with the task's, on the step and epoch lines and in the summary
        logged = {name: value for name, value in self.run.logged.items() if name.startswith("val/")}
        metrics = {**metrics, **{name: value for name, value in logged.items() if name not in metrics}}
        self.last_metrics.update(metrics)
        return metrics

    def _stop_if_asked(self, position: Position) -> None:
        signum, asked = self.work.agree()
        if signum:
            raise Terminated(signum, self.checkpoint(position), position.step)
        if asked:
            raise StoppedEarly

    def _progress(self, epoch: int, skip: int) -> tqdm:
        # lazy: `runjob JOB` says its first line and starts its recording process before tqdm loads (train.entry)
        from tqdm.auto import tqdm

        # train.max_steps may end the epoch early: the bar counts the batches this epoch will take
        remaining = (self.schedule.total_steps - self.step) * self.settings.gradient_accumulation_steps
        return tqdm(
            total=min(self.work.batches_per_epoch, skip + remaining),
            initial=skip,
            desc=f"epoch {epoch + 1}/{self.schedule.epochs}",
            unit="batch",
            disable=self.quiet or not screen.bars,
            leave=False,
            dynamic_ncols=True,
            mininterval=0.1 if sys.stderr.isatty() else 30.0,  # a log file gets a line every 30 s
        )

    def _train_epoch(self, epoch: int, skip: int) -> dict[str, float]:
        settings, work, clock = self.settings, self.work, self.clock
        batches = work.start_epoch(epoch, skip)
        progress = self._progress(epoch, skip)
        batches_done = skip
        metrics: dict[str, float] = {}
        try:
            for batch in batches:
                if settings.channels_last:
                    batch = channels_last(batch)
                self.events.send(Event.BATCH, clock.step, epoch, batch)
                first = clock.step == 0 and batches_done == 0 and epoch == 0
                loss, stepped = work.train_batch(batch, clock.step + 1, first)
                batches_done += 1
                progress.update(1)
                if not work.synced:
                    continue
                work.after_step(stepped)
                clock.step += 1
                step = clock.step
                self.events.send(Event.STEP, step, epoch, loss)
                here = Position(step, epoch, batches_done)
                logged = step % settings.log_every == 0
                if logged:
                    metrics = self._log()
                    progress.set_postfix(loss=f"{metrics['train/loss']:.4f}", refresh=False)
                if settings.eval_every and step % settings.eval_every == 0:
                    self._evaluate_within_epoch(epoch)
                    self._stop_if_asked(here)  # evaluation synchronized the processes anyway
                if logged or self.run.accelerator.num_processes == 1:  # agreeing costs a sync: only where one happens
                    self._stop_if_asked(here)
                checkpoint_every = settings.checkpoint_every
                if checkpoint_every and step % checkpoint_every == 0 and batches_done < work.batches_per_epoch:
                    self.checkpoint(here)
                if settings.max_steps is not None and step >= settings.max_steps:
                    break
            if work.unlogged:
                metrics = self._log()
        finally:
            progress.close()
            self.batches_done = batches_done
        return metrics

    def _evaluate_within_epoch(self, epoch: int) -> None:
        """``train.eval_every``: evaluate now, and say so on its own line above the progress bar."""
        metrics = self._evaluate(epoch, f"train.eval_every = {self.settings.eval_every}")
        shown = "  ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        self._say(f"step {self.step}/{self.schedule.total_steps}  {shown}")

    def _log(self) -> dict[str, float]:
        """Log the mean loss since the last log and the learning rate, with what the callbacks add
        in ``on_log`` (throughput, peak memory, ...), as one record line (the record hears it last)."""
        metrics = self.work.log_metrics()
        self.events.send(Event.LOG, self.step, self.epoch, metrics)  # what callbacks log joins this line
        return metrics

    def _summary(self, epoch: int, seconds: float) -> None:
        self.last_metrics.update(self.run.logged)  # the callbacks' metrics, wherever they logged them
        shown = "  ".join(f"{k} {v:.4g}" for k, v in self.last_metrics.items() if k != "lr")
        self._say(f"epoch {epoch + 1}/{self.schedule.epochs}  step {self.step}  {shown}  ({seconds:.1f} s)")
