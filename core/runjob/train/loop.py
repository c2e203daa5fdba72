"""The training loop and evaluation: as lean as a hand-written Accelerate loop.

Per optimizer step the loop does forward, ``accelerator.backward``, optional clipping, step and
zero_grad; the loss is summed on the device and read back (a host-device sync) only every
``train.log_every`` steps.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runjob.errors import Terminated, TrainingError, first_line
from runjob.host.events import Dispatcher, Event
from runjob.host.run_context import Clock, RecordSink, Run, StopFlag
from runjob.train.checkpoints import Position, save_checkpoint


@dataclass
class Schedule:
    """How long the run is: epochs, optimizer steps per epoch, and the total."""

    epochs: int
    steps_per_epoch: int
    total_steps: int


def plan_schedule(train: Any, batches_per_epoch: int) -> Schedule:
    """Turn ``train.epochs`` / ``train.max_steps`` into a schedule (whichever ends first)."""
    steps_per_epoch = max(1, math.ceil(batches_per_epoch / train.gradient_accumulation_steps))
    if train.epochs is None:
        epochs = math.ceil(train.max_steps / steps_per_epoch)
        return Schedule(epochs, steps_per_epoch, train.max_steps)
    total = epochs_total = train.epochs * steps_per_epoch
    if train.max_steps is not None:
        total = min(epochs_total, train.max_steps)
    return Schedule(min(train.epochs, math.ceil(total / steps_per_epoch)), steps_per_epoch, total)


def shapes(batch: Any) -> str:
    """The shapes in a batch of nested tuples, lists and dicts, for messages: ``(32, 3, 32, 32), (32,)``."""
    if hasattr(batch, "shape"):
        return str(tuple(batch.shape))
    if isinstance(batch, dict):
        return "{" + ", ".join(f"{key!r}: {shapes(value)}" for key, value in batch.items()) + "}"
    if isinstance(batch, (tuple, list)):
        return ", ".join(shapes(item) for item in batch)
    return type(batch).__name__


def channels_last(batch: Any) -> Any:
    """Every 4-D tensor of a batch (images) in channels-last memory; anything else as it is."""
    import torch
    from accelerate.utils import recursively_apply

    def convert(tensor: Any) -> Any:
        return tensor.contiguous(memory_format=torch.channels_last) if tensor.ndim == 4 else tensor

    return recursively_apply(convert, batch, error_on_other_type=False)


def first_loss(run: Run, batch: Any) -> Any:
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


def evaluate(run: Run, loader: Any, prefix: str = "val") -> dict[str, float]:
    """The task's metrics over a whole split (``prefix/name``): every sample counted once on all
    processes (``gather_for_metrics``), sums kept on the device, read back once."""
    import torch

    accelerator, model, task = run.accelerator, run.model, run.task
    convert = run.job.train.channels_last
    model.eval()

    def evaluated() -> Any:
        for batch in loader:
            if convert:
                batch = channels_last(batch)
            yield task.forward(model, batch), batch

    with torch.no_grad():
        totals, count = add_up(task, run.job.task.name, evaluated(), accelerator.gather_for_metrics)
    model.train()
    return summarize(run, totals, count, prefix)


def add_up(task: Any, task_name: str, evaluated: Any, gather: Any = None) -> tuple[dict[str, Any], int]:
    """``task.evaluate`` of each ``(outputs, batch)`` of ``evaluated``, checked, gathered across
    processes (``gather``, none on one process) and summed over the samples on the device (float64):
    the totals and the number of samples. ``runjob.testing.evaluate_task`` calls it too."""
    import torch

    totals: dict[str, Any] = {}
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


def summarize(run: Run, totals: dict[str, Any], count: int, prefix: str) -> dict[str, float]:
    """The task's summary of the totals (one device-to-host copy), checked against what it declares."""
    return summarize_totals(run.task, run.job.task.name, run.job.task.options, totals, count, prefix)


def summarize_totals(
    task: Any, task_name: str, options: Any, totals: dict[str, Any], count: int, prefix: str
) -> dict[str, float]:
    """``task.summarize`` of the totals (read back in one device-to-host copy), checked against what
    ``options.metrics()`` declares, as ``prefix/name``: declared metrics first."""
    import torch

    read: dict[str, Any] = {}
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

    def __init__(self, mode: str, device: Any) -> None:
        import torch

        self.mode = mode
        self.skipped = 0
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)

    def allows_step(self, step: int, loss: Any, norm: Any) -> bool:
        import torch

        if self.mode == "skip":  # the gradient norm is the same on every process: all skip together
            if not bool(torch.isfinite(norm)):
                self.skipped += 1
                return False
            return True
        bad = ~torch.isfinite(loss.detach())
        if norm is not None:
            bad = bad | ~torch.isfinite(norm)
        self.first_bad = torch.where((self.first_bad < 0) & bad, torch.full_like(self.first_bad, step), self.first_bad)
        return True

    def stop_if_seen(self, accelerator: Any, run: Any) -> None:
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

    def agreed(self, accelerator: Any) -> tuple[int, bool]:
        """The signal to stop for, and whether a callback asked to stop, agreed by all processes (a
        collective when there are several)."""
        if accelerator.num_processes == 1:
            return self.signum, bool(self.reason)
        import torch

        flags = torch.tensor([self.signum, int(bool(self.reason))], device=accelerator.device)
        signum, asked = accelerator.reduce(flags, reduction="max").tolist()
        if asked:  # once a run: every process learns the reason given, whichever process gave it
            from accelerate.utils import gather_object

            self.reason = next(reason for reason in gather_object([self.reason]) if reason)
        return int(signum), bool(asked)


class StoppedEarly(Exception):  # noqa: N818 - a control-flow signal inside the loop, not an error
    """A callback asked to stop and every process agreed."""


class TrainingLoop:
    """Runs the schedule from ``start``: ``run.task`` turns each batch into a loss and each
    evaluation into metrics; metrics go into ``record``; every event goes through ``events``, the
    run's one dispatcher (the callbacks, runjob's own features among them, then the plugins' global
    hooks: :mod:`runjob.host.events`); checkpoints are written every ``train.checkpoint_every``
    steps and at each epoch's end, and ``stop`` is honoured where the processes agree. The loop
    alone moves ``clock``, the position the run shows (``run.step``, ``run.epoch``)."""

    def __init__(
        self,
        run: Run,
        events: Dispatcher,
        clock: Clock,
        schedule: Schedule,
        *,
        record: RecordSink | None = None,
        start: Position | None = None,
        stop: StopRequest,
    ) -> None:
        self.run = run
        self.events = events
        self.clock = clock
        self.recorder = record
        self.schedule = schedule
        self.start = start or Position()
        self.step = self.start.step
        self.stop = stop
        self.saved_with = {"mlflow_run_id": run.mlflow_run_id, "job": run.job.to_dict()}  # in every checkpoint
        self.nonfinite = NonFiniteGuard(run.job.train.on_nonfinite, run.accelerator.device)
        self.last_metrics: dict[str, float] = {}
        self.batches_done = 0
        self.evaluated_at = -1  # the step of the last evaluation: the epoch's end doesn't repeat it
        self.epoch = self.start.epoch
        self.stopped = ""  # why a callback stopped training early, when one did
        clock.step, clock.epoch = self.step, self.epoch

    def record(self, metrics: dict[str, float], step: int) -> None:
        if self.recorder is not None:
            self.recorder.log_training_metrics(metrics, step)

    def checkpoint(self, position: Position) -> Path:
        return save_checkpoint(self.run, position, self.run.job.train.keep_checkpoints, self.saved_with, self.events)

    def fit(self) -> dict[str, float]:
        """Train for the whole schedule; returns the last metrics logged."""
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
            if self.run.accelerator.is_main_process:
                print(f"runjob: stopping at step {self.step}: {self.stopped}")
            if self.evaluated_at != self.step:
                self._evaluate(self.epoch)
        self.events.send(Event.TRAIN_END, self.step, self.epoch)
        self.last_metrics.update(self.run.logged)
        if self.run.test_loader is not None:
            test_metrics = evaluate(self.run, self.run.test_loader, "test")
            self.record(test_metrics, self.step)
            self.last_metrics.update(test_metrics)
            if self.run.accelerator.is_main_process:
                print(f"test  step {self.step}  " + "  ".join(f"{k} {v:.4g}" for k, v in test_metrics.items()))
        return self.last_metrics

    def _epochs(self) -> None:
        job = self.run.job
        for epoch in range(self.start.epoch, self.schedule.epochs):
            if job.train.max_steps is not None and self.step >= job.train.max_steps:
                break
            started = time.perf_counter()
            skip = self.start.batches_done if epoch == self.start.epoch else 0
            self.epoch = self.clock.epoch = epoch
            self.events.send(Event.EPOCH_START, self.step, epoch)
            train_metrics = self._train_epoch(epoch, skip)
            self.last_metrics.update(train_metrics)
            if self.evaluated_at != self.step:
                self._evaluate(epoch)
            self.events.send(Event.EPOCH_END, self.step, epoch)
            self._summary(epoch, time.perf_counter() - started)
            # train.max_steps may end the run inside an epoch: a resume with more steps goes on from there
            whole = self.batches_done >= len(self.run.train_loader)
            finished = Position(self.step, epoch + 1, 0) if whole else Position(self.step, epoch, self.batches_done)
            self._stop_if_asked(finished)
            self.checkpoint(finished)

    def _evaluate(self, epoch: int) -> dict[str, float]:
        self.events.send(Event.EVALUATION_START, self.step, epoch)
        metrics = evaluate(self.run, self.run.val_loader)
        self.evaluated_at = self.step
        self.record(metrics, self.step)
        self.events.send(Event.EVALUATION, self.step, epoch, metrics)
        self.events.send(Event.EVALUATION_END, self.step, epoch)
        # what callbacks logged as evaluation metrics (``val/...``, the ones that may be the
        # best_metric) is shown with the task's, on the step and epoch lines and in the summary
        logged = {name: value for name, value in self.run.logged.items() if name.startswith("val/")}
        metrics = {**metrics, **{name: value for name, value in logged.items() if name not in metrics}}
        self.last_metrics.update(metrics)
        return metrics

    def _stop_if_asked(self, position: Position) -> None:
        signum, asked = self.stop.agreed(self.run.accelerator)
        if signum:
            raise Terminated(signum, self.checkpoint(position), position.step)
        if asked:
            raise StoppedEarly

    def _batches(self, epoch: int, skip: int) -> Any:
        loader = self.run.train_loader
        loader.set_epoch(epoch)  # the sampler's order depends on the seed and the epoch alone
        if skip:
            loader = self.run.accelerator.skip_first_batches(loader, skip)
            loader.set_epoch(epoch)
        return loader

    def _train_epoch(self, epoch: int, skip: int) -> dict[str, float]:
        import torch
        from tqdm.auto import tqdm

        run, job, task = self.run, self.run.job, self.run.task
        accelerator, model, optimizer, scheduler = run.accelerator, run.model, run.optimizer, run.scheduler
        train = job.train
        batches = self._batches(epoch, skip)
        model.train()
        # train.max_steps may end the epoch early: the bar counts the batches this epoch will take
        remaining = (self.schedule.total_steps - self.step) * train.gradient_accumulation_steps
        progress = tqdm(
            total=min(len(run.train_loader), skip + remaining),
            initial=skip,
            desc=f"epoch {epoch + 1}/{self.schedule.epochs}",
            unit="batch",
            disable=not accelerator.is_main_process,
            leave=False,
            dynamic_ncols=True,
            mininterval=0.1 if sys.stderr.isatty() else 30.0,  # a log file gets a line every 30 s
        )
        loss_sum = torch.zeros((), device=accelerator.device)
        micro_batches = 0
        batches_done = skip
        metrics: dict[str, float] = {}
        try:
            for batch in batches:
                if train.channels_last:
                    batch = channels_last(batch)
                self.events.send(Event.BATCH, self.step, epoch, batch)
                with accelerator.accumulate(model):
                    if self.step == 0 and batches_done == 0 and epoch == 0:
                        loss = first_loss(run, batch)
                    else:
                        loss = task.loss(task.forward(model, batch), batch)
                    accelerator.backward(loss)
                    stepped = True
                    if accelerator.sync_gradients:
                        norm = None
                        if train.max_grad_norm is not None:
                            norm = accelerator.clip_grad_norm_(model.parameters(), train.max_grad_norm)
                        elif train.on_nonfinite == "skip":
                            norm = torch.nn.utils.get_total_norm(
                                [p.grad for p in model.parameters() if p.grad is not None]
                            )
                        stepped = self.nonfinite.allows_step(self.step + 1, loss, norm)
                    if stepped:
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                loss_sum += loss.detach()
                micro_batches += 1
                batches_done += 1
                progress.update(1)
                if not accelerator.sync_gradients:
                    continue
                if scheduler is not None and stepped and not accelerator.optimizer_step_was_skipped:
                    scheduler.step()
                self.step += 1
                self.clock.step = self.step
                self.events.send(Event.STEP, self.step, epoch, loss.detach())
                here = Position(self.step, epoch, batches_done)
                logged = self.step % train.log_every == 0
                if logged:
                    metrics = self._log(loss_sum, micro_batches)
                    progress.set_postfix(loss=f"{metrics['train/loss']:.4f}", refresh=False)
                    loss_sum.zero_()
                    micro_batches = 0
                if train.eval_every and self.step % train.eval_every == 0:
                    self._evaluate_within_epoch(epoch, progress)
                    self._stop_if_asked(here)  # evaluation synchronized the processes anyway
                if logged or accelerator.num_processes == 1:  # agreeing costs a sync: only where one happens anyway
                    self._stop_if_asked(here)
                if (
                    train.checkpoint_every
                    and self.step % train.checkpoint_every == 0
                    and batches_done < len(run.train_loader)
                ):
                    self.checkpoint(here)
                if train.max_steps is not None and self.step >= train.max_steps:
                    break
            if micro_batches:
                metrics = self._log(loss_sum, micro_batches)
        finally:
            progress.close()
            self.batches_done = batches_done
        return metrics

    def _evaluate_within_epoch(self, epoch: int, progress: Any) -> None:
        """``train.eval_every``: evaluate now, and say so on its own line above the progress bar."""
        metrics = self._evaluate(epoch)
        if self.run.accelerator.is_main_process:
            shown = "  ".join(f"{k} {v:.4g}" for k, v in metrics.items())
            progress.write(f"step {self.step}/{self.schedule.total_steps}  {shown}")

    def _log(self, loss_sum: Any, micro_batches: int) -> dict[str, float]:
        """Log the mean loss since the last log and the learning rate, with what the callbacks add
        in ``on_log`` (throughput, peak memory, ...), as one record line."""
        run, accelerator = self.run, self.run.accelerator
        self.nonfinite.stop_if_seen(accelerator, run)
        metrics = {
            "train/loss": accelerator.reduce(loss_sum / micro_batches, reduction="mean").item(),
            "lr": float(run.optimizer.param_groups[0]["lr"]),
        }
        if run.job.train.on_nonfinite == "skip":
            metrics["train/nonfinite_skipped"] = float(self.nonfinite.skipped)
        self.events.send(Event.LOG, self.step, self.epoch, metrics)  # what callbacks log joins this line
        self.record(metrics, self.step)
        return metrics

    def _summary(self, epoch: int, seconds: float) -> None:
        self.last_metrics.update(self.run.logged)  # the callbacks' metrics, wherever they logged them
        shown = "  ".join(f"{k} {v:.4g}" for k, v in self.last_metrics.items() if k != "lr")
        if self.run.accelerator.is_main_process:
            print(f"epoch {epoch + 1}/{self.schedule.epochs}  step {self.step}  {shown}  ({seconds:.1f} s)")
