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
from typing import Any

from runjob.errors import Terminated, TrainingError, first_line
from runjob.host.run_context import RunContext
from runjob.train.checkpoints import Position


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


def check_first_batch(logits: Any, num_classes: int, model_name: str, dataset_name: str) -> None:
    """Stop with a clear message when the model's outputs do not fit the dataset's classes."""
    if logits.ndim != 2 or logits.shape[1] != num_classes:
        raise TrainingError(
            f"model {model_name!r} gives outputs of shape {tuple(logits.shape)}, but dataset {dataset_name!r} has "
            f"{num_classes} classes: set model.num_classes = {num_classes}"
        )


def _first_forward(model: Any, inputs: Any, job: Any) -> Any:
    try:
        return model(inputs)
    except RuntimeError as error:
        first = first_line(error)
        raise TrainingError(
            f"model {job.model.name!r} cannot take the inputs of dataset {job.dataset.name!r} "
            f"(a batch of shape {tuple(inputs.shape)}): {first}"
        ) from None


def channels_last(inputs: Any) -> Any:
    """A batch of images (4-D) in channels-last memory; anything else as it is."""
    import torch

    if getattr(inputs, "ndim", 0) == 4:
        return inputs.contiguous(memory_format=torch.channels_last)
    return inputs


def evaluate(run: RunContext) -> dict[str, float]:
    """Loss and accuracy over the whole validation set, every sample counted once on all processes."""
    import torch
    import torch.nn.functional as F

    accelerator, model = run.accelerator, run.model
    model.eval()
    loss_sum = torch.zeros((), device=accelerator.device, dtype=torch.float64)
    correct = torch.zeros((), device=accelerator.device, dtype=torch.long)
    count = 0
    with torch.no_grad():
        for inputs, targets in run.val_loader:
            if run.job.train.channels_last:
                inputs = channels_last(inputs)
            logits = model(inputs)
            losses = F.cross_entropy(logits.float(), targets, reduction="none")
            hits = logits.argmax(dim=-1) == targets
            losses, hits = accelerator.gather_for_metrics((losses, hits))
            loss_sum += losses.sum()
            correct += hits.sum()
            count += losses.numel()
    model.train()
    return {"val/loss": (loss_sum / count).item(), "val/accuracy": (correct.double() / count).item()}


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
                f"Usual remedies: a lower learning rate (optimizer.lr, now {lr:g}), gradient clipping "
                "(train.max_grad_norm = 1.0), mixed_precision = 'bf16' instead of 'fp16'; or train.on_nonfinite = "
                "'skip' to skip such steps"
            )


class StopRequest:
    """Set from a signal handler (SIGTERM, SIGINT, a configured signal); the loop stops at the next
    point where every process can agree, after writing a checkpoint."""

    def __init__(self) -> None:
        self.signum = 0

    def agreed(self, accelerator: Any) -> int:
        """The signal to stop for, agreed by all processes (a collective when there are several)."""
        if accelerator.num_processes == 1:
            return self.signum
        import torch

        flag = torch.tensor([self.signum], device=accelerator.device)
        return int(accelerator.reduce(flag, reduction="max").item())


class TrainingLoop:
    """Runs the schedule from ``start``, logging through ``record(metrics, step)``, calling the
    event hooks, writing checkpoints through ``checkpoint(position)`` and honouring ``stop``.
    ``on_evaluation(metrics, step)`` runs on every process after each evaluation. With
    ``count_flops(first_inputs) -> FLOPs per sample`` the loop reports model TFLOP/s, and with
    ``peak_flops`` (per process) MFU."""

    def __init__(
        self,
        run: RunContext,
        hooks: Any,
        record: Any,
        schedule: Schedule,
        num_classes: int,
        start: Position | None = None,
        checkpoint: Any = None,
        stop: StopRequest | None = None,
        on_evaluation: Any = None,
        count_flops: Any = None,
        peak_flops: float | None = None,
    ) -> None:
        self.run = run
        self.hooks = hooks
        self.record = record
        self.schedule = schedule
        self.num_classes = num_classes
        self.start = start or Position()
        self.step = self.start.step
        self.checkpoint = checkpoint or (lambda position: None)
        self.stop = stop or StopRequest()
        self.on_evaluation = on_evaluation or (lambda metrics, step: None)
        self.count_flops = count_flops
        self.flops_per_sample: float | None = None
        self.peak_flops = peak_flops
        self.nonfinite = NonFiniteGuard(run.job.train.on_nonfinite, run.accelerator.device)
        self.last_metrics: dict[str, float] = {}
        self.batches_done = 0

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
                "train.mixed_precision = 'bf16', strategy 'fsdp' (activation_checkpointing, cpu_offload) or "
                "'deepspeed' (zero_stage 2 or 3)"
            ) from None

    def _fit(self) -> dict[str, float]:
        job = self.run.job
        for epoch in range(self.start.epoch, self.schedule.epochs):
            if job.train.max_steps is not None and self.step >= job.train.max_steps:
                break
            started = time.perf_counter()
            skip = self.start.batches_done if epoch == self.start.epoch else 0
            train_metrics = self._train_epoch(epoch, skip)
            val_metrics = evaluate(self.run)
            self.record(val_metrics, self.step)
            self.on_evaluation(val_metrics, self.step)
            self.hooks.runjob_after_evaluation(run=self.run, epoch=epoch, step=self.step, metrics=val_metrics)
            self.last_metrics.update(train_metrics)
            self.last_metrics.update(val_metrics)
            self._summary(epoch, time.perf_counter() - started)
            # train.max_steps may end the run inside an epoch: a resume with more steps goes on from there
            whole = self.batches_done >= len(self.run.train_loader)
            finished = Position(self.step, epoch + 1, 0) if whole else Position(self.step, epoch, self.batches_done)
            self._stop_if_asked(finished)
            self.checkpoint(finished)
        return self.last_metrics

    def _stop_if_asked(self, position: Position) -> None:
        signum = self.stop.agreed(self.run.accelerator)
        if signum:
            self.checkpoint(position)
            raise Terminated(signum)

    def _batches(self, epoch: int, skip: int) -> Any:
        loader = self.run.train_loader
        loader.set_epoch(epoch)  # the sampler's order depends on the seed and the epoch alone
        if skip:
            loader = self.run.accelerator.skip_first_batches(loader, skip)
            loader.set_epoch(epoch)
        return loader

    def _train_epoch(self, epoch: int, skip: int) -> dict[str, float]:
        import torch
        import torch.nn.functional as F
        from tqdm.auto import tqdm

        run, job = self.run, self.run.job
        accelerator, model, optimizer, scheduler = run.accelerator, run.model, run.optimizer, run.scheduler
        train = job.train
        batches = self._batches(epoch, skip)
        model.train()
        progress = tqdm(
            total=len(run.train_loader),
            initial=skip,
            desc=f"epoch {epoch + 1}/{self.schedule.epochs}",
            unit="batch",
            disable=not accelerator.is_main_process,
            leave=False,
            dynamic_ncols=True,
            mininterval=0.1 if sys.stderr.isatty() else 30.0,  # a log file gets a line every 30 s
        )
        loss_sum = torch.zeros((), device=accelerator.device)
        micro_batches = samples = 0
        batches_done = skip
        window_start = time.perf_counter()
        metrics: dict[str, float] = {}
        try:
            for inputs, targets in batches:
                if train.channels_last:
                    inputs = channels_last(inputs)
                with accelerator.accumulate(model):
                    if self.count_flops is not None and hasattr(inputs, "shape"):
                        self.flops_per_sample, self.count_flops = self.count_flops(inputs), None
                    if self.step == 0 and batches_done == 0 and epoch == 0:
                        logits = _first_forward(model, inputs, job)
                        check_first_batch(logits, self.num_classes, job.model.name, job.dataset.name)
                    else:
                        logits = model(inputs)
                    loss = F.cross_entropy(logits, targets)
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
                samples += inputs.shape[0]
                progress.update(1)
                if not accelerator.sync_gradients:
                    continue
                if scheduler is not None and stepped and not accelerator.optimizer_step_was_skipped:
                    scheduler.step()
                self.step += 1
                self.hooks.runjob_after_step(run=run, step=self.step, epoch=epoch, loss=loss.detach())
                here = Position(self.step, epoch, batches_done)
                logged = self.step % train.log_every == 0
                if logged:
                    metrics = self._log(loss_sum, micro_batches, samples, window_start)
                    progress.set_postfix(loss=f"{metrics['train/loss']:.4f}", refresh=False)
                    loss_sum.zero_()
                    micro_batches = samples = 0
                    window_start = time.perf_counter()
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
                metrics = self._log(loss_sum, micro_batches, samples, window_start)
        finally:
            progress.close()
            self.batches_done = batches_done
        return metrics

    def _log(self, loss_sum: Any, micro_batches: int, samples: int, window_start: float) -> dict[str, float]:
        accelerator = self.run.accelerator
        self.nonfinite.stop_if_seen(accelerator, self.run)
        mean_loss = accelerator.reduce(loss_sum / micro_batches, reduction="mean").item()
        elapsed = max(time.perf_counter() - window_start, 1e-9)
        metrics = {
            "train/loss": mean_loss,
            "lr": float(self.run.optimizer.param_groups[0]["lr"]),
            "train/samples_per_s": samples * accelerator.num_processes / elapsed,
        }
        if self.flops_per_sample:
            achieved = metrics["train/samples_per_s"] * self.flops_per_sample
            metrics["train/tflops"] = achieved / 1e12
            if self.peak_flops:
                metrics["train/mfu"] = achieved / (self.peak_flops * accelerator.num_processes)
        if self.run.job.train.on_nonfinite == "skip":
            metrics["train/nonfinite_skipped"] = float(self.nonfinite.skipped)
        metrics.update(_peak_memory(accelerator.device))
        self.record(metrics, self.step)
        if accelerator.is_main_process:
            self.hooks.runjob_after_log(run=self.run, step=self.step, metrics=metrics)
        return metrics

    def _summary(self, epoch: int, seconds: float) -> None:
        shown = "  ".join(f"{k} {v:.4g}" for k, v in self.last_metrics.items() if k != "lr")
        if self.run.accelerator.is_main_process:
            print(f"epoch {epoch + 1}/{self.schedule.epochs}  step {self.step}  {shown}  ({seconds:.1f} s)")


def _peak_memory(device: Any) -> dict[str, float]:
    """Peak memory so far: the device's allocations on CUDA, else this process's resident set."""
    if device.type == "cuda":
        import torch

        return {"train/peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30}
    import resource

    return {"train/peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}  # KiB on Linux
