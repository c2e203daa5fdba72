"""The callback contract: what a job switches on in ``[callbacks.NAME]`` tables.

A callback receives the run's events, and through the run context may log metrics into runjob's
own record (``run.log``), ask the run to stop cleanly (``run.request_stop``), and keep state that
goes into every checkpoint (``state_dict`` / ``load_state_dict``). Nothing here imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from runjob.host.components import Options

if TYPE_CHECKING:  # annotations only: the host never imports torch
    import torch

    from runjob.host.run_context import Run

Direction = Literal["max", "min"]


class CallbackOptions(Options):
    """Base class for a callback's options (the keys of its ``[callbacks.NAME]`` table).

    Override :meth:`metrics` to declare what the callback logs with ``run.log`` (full names,
    ``"train/grad_norm"``), so they may be a job's ``best_metric`` or sweep metric, and
    :meth:`watches` to name the metrics it reads, which ``runjob validate`` checks against what
    the task and the other callbacks declare.
    """

    enabled: bool = True
    """``false`` switches the callback off for this job: a callback on by default (``best_weights``,
    ``throughput``, ``peak_memory``), or one a job lists but a run (``--set``, a sweep) leaves out."""

    owns_model: ClassVar[bool] = False
    """True for a callback that replaces the weights that are evaluated and saved (an EMA): a job
    may switch on only one such callback."""

    def metrics(self) -> dict[str, Direction]:
        """The metrics this callback logs, each with the direction that is better."""
        return {}

    def watches(self) -> dict[str, str]:
        """The metrics this callback reads, by the option that names them (``{"metric": "val/loss"}``),
        so a metric no task or callback declares is reported at that option's line."""
        return {}


class Callback:
    """Base class of what a callback factory returns. Every event is optional; each is called on
    every process: first for the callbacks on by default (registered with ``on_by_default=True``:
    runjob's ``best_weights``, ``throughput``, ``peak_memory``), then in the order the job lists its
    ``[callbacks.NAME]`` tables, a callback that declares :attr:`after` after those it names; then
    the plugins' global hooks (:mod:`runjob.host.events` has the map). Keep them cheap: most run in
    the loop. An event a callback does not override costs nothing.

    ``run`` is the :class:`runjob.Run`: what it reads is read-only (``run.job``, ``run.model``,
    ``run.step``...); ``run.log(metrics)`` records metrics at the current step (on the main process;
    other processes' calls are ignored) and ``run.request_stop(reason)`` ends training at the next
    point where all processes agree anyway (a log step, the end of an evaluation), after which the
    run evaluates, saves and uploads its final and best model and ends FINISHED with the reason as
    the tag ``runjob.stopped``. An exception raised in an event stops the run with one line naming
    the callback, the event and the step (exit code 2, the MLflow run FAILED).
    """

    after: ClassVar[tuple[str, ...]] = ()
    """Callbacks (by their job name) whose events must reach them before this one, when they are
    on: e.g. ``ema`` comes after ``best_weights``, which saves the averaged weights ema swapped in
    before ema puts the training weights back."""

    def on_run_start(self, run: Run) -> None:
        """Training is about to begin (the model, optimizer and loaders are prepared; after a resume,
        :meth:`load_state_dict` has already run)."""

    def on_epoch_start(self, run: Run, step: int, epoch: int) -> None:
        """A training epoch begins (``epoch`` is 0-based; after a resume, possibly part-way through)."""

    def on_batch(self, run: Run, step: int, epoch: int, batch: Any) -> None:
        """Before each training micro-batch goes through the model: ``batch`` is on the device, as
        the task receives it; ``step`` is the optimizer steps done so far."""

    def on_step(self, run: Run, step: int, epoch: int, loss: torch.Tensor) -> None:
        """After each optimizer step; ``loss`` is this process's detached loss (``.item()`` syncs)."""

    def on_log(self, run: Run, step: int, epoch: int, metrics: dict[str, float]) -> None:
        """Each time training metrics are logged (every ``train.log_every`` steps and at the end of
        an epoch). ``metrics`` holds what is being logged at this step: runjob's own (``train/loss``,
        ``lr``) and what the callbacks before this one added with ``run.log`` (``throughput`` and
        ``peak_memory`` come first). What a callback logs here is recorded with them, in one call."""

    def on_evaluation_start(self, run: Run, step: int, epoch: int) -> None:
        """Before an evaluation (e.g. swap in averaged weights)."""

    def on_evaluation(self, run: Run, step: int, epoch: int, metrics: dict[str, float]) -> None:
        """After an evaluation over the validation set; ``metrics`` are the same on every process."""

    def on_evaluation_end(self, run: Run, step: int, epoch: int) -> None:
        """After every callback's ``on_evaluation`` and the global ``runjob_after_evaluation`` hooks;
        ``best_weights`` saves ``best/`` here, first, from the model as evaluated, so a callback that
        swapped weights in at ``on_evaluation_start`` puts them back here."""

    def on_epoch_end(self, run: Run, step: int, epoch: int) -> None:
        """An epoch is over and evaluated, before its checkpoint is written."""

    def on_train_end(self, run: Run, step: int, epoch: int) -> None:
        """Training is over and the final weights are about to be evaluated on the test split and saved."""

    def on_run_end(self, run: Run, status: str, error: BaseException | None) -> None:
        """The run ends: ``status`` is FINISHED, FAILED or KILLED."""

    def state_dict(self) -> dict[str, object]:
        """What this callback needs to continue after a resume: tensors, numbers, strings, lists and
        dicts of them. The main process's is saved in every checkpoint (so it should be the same on
        every process) and loaded with ``weights_only`` on every process."""
        return {}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore what :meth:`state_dict` returned."""
