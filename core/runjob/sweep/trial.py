"""A sweep trial's own side: the callbacks the sweep attaches to a trial's run, and the outcome the
trial sends its worker.

The worker gives the trial's process a :class:`runjob.train.request.TrialContext` (its values, its
study and number, the pipe to send its outcome through); ``runjob run`` in that process (and in
each process a launched trial starts) attaches :func:`trial_callbacks`:

* :class:`SweepPruning`, when the sweep has a pruner: reports each evaluation's value of the sweep
  metric to the trial (step 1 for the first evaluation, 2 for the next, ...) and asks the pruner;
  its request to stop stops every process of the run at the next point where they all agree, as any
  callback's does. The run then evaluates, saves its model and ends FINISHED, tagged
  ``runjob.sweep.pruned``; the worker records the trial as PRUNED.
* :class:`TrialReport`, in the trial's own process: keeps the last value of each metric the run
  logged and evaluated, and at the run's end sends :class:`TrialOutcome` (its MLflow run, those
  values, whether it was pruned) through the pipe, so the worker reads no file to learn it.

Optuna is imported when a trial with a pruner first reports, never by ``runjob run`` otherwise.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, cast

import pydantic

from runjob.host.callback import Callback
from runjob.sweep.study import import_optuna, make_pruner, open_storage
from runjob.tags import SWEEP_PRUNED_TAG
from runjob.train.launcher import is_worker
from runjob.train.request import TrialContext

if TYPE_CHECKING:
    from collections.abc import Mapping

    import optuna

    from runjob.host.run_context import Run
    from runjob.job.schema import SweepTable

PRUNING_CALLBACK = "sweep_pruning"  # its name among the run's callbacks (and in its checkpoints' states)
REPORT_CALLBACK = "sweep_outcome"
OUTCOME_LIMIT = 60_000
"""Bytes: an outcome is sent in one write, under a pipe's capacity (64 KiB on Linux), so the trial
never waits for its worker to read it."""


class TrialOutcome(pydantic.BaseModel):
    """What a trial's process sends its worker when its run ends."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    status: str
    """The run's end: FINISHED, FAILED or KILLED."""
    run_id: str | None = None
    metrics: dict[str, float] = pydantic.Field(default_factory=dict)
    """The last value of each metric the run logged or evaluated."""
    pruned: str | None = None
    """Why the pruner stopped the run, when it did."""


class TrialReport(Callback):
    """Keeps the run's last metrics; at its end sends them through the worker's pipe (fd ``fd``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.metrics: dict[str, float] = {}
        self.pruned: str | None = None

    def on_log(self, run: Run, step: int, epoch: int, metrics: dict[str, float]) -> None:
        self.metrics.update(metrics)

    def on_evaluation(self, run: Run, step: int, epoch: int, metrics: dict[str, float]) -> None:
        self.metrics.update(metrics)

    def on_run_end(self, run: Run, status: str, error: BaseException | None) -> None:
        if not run.is_main_process:
            return
        outcome = TrialOutcome(status=status, run_id=run.mlflow_run_id, metrics=dict(self.metrics), pruned=self.pruned)
        send(self.fd, outcome)


def send(fd: int, outcome: TrialOutcome) -> None:
    """``outcome`` to the worker in one write (too many metrics for a pipe: the others left out; the
    worker then reads its folder for a metric it lacks)."""
    data = outcome.model_dump_json().encode()
    if len(data) > OUTCOME_LIMIT:
        data = outcome.model_copy(update={"metrics": {}}).model_dump_json().encode()
    with contextlib.suppress(OSError):  # the worker is gone: nobody to tell
        os.write(fd, data)
        os.close(fd)


def receive(fd: int) -> TrialOutcome | None:
    """What the trial sent through the pipe's read end ``fd`` (closed here), read once its process
    ended; None when it sent nothing (it failed before its run began, or was killed)."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except BlockingIOError:  # another process still holds the write end (one the trial started)
        pass
    finally:
        os.close(fd)
    if not chunks:
        return None
    try:
        return TrialOutcome.model_validate_json(b"".join(chunks))
    except pydantic.ValidationError:
        return None


class SweepPruning(Callback):
    """Reports the sweep metric to the trial after every evaluation; stops a pruned trial."""

    def __init__(self, trial: TrialContext, report: TrialReport | None = None) -> None:
        self.study_name, self.number, self.storage = trial.study, trial.number, trial.storage
        self.report = report
        self.evaluations = 0
        self._opened: tuple[optuna.Study, optuna.storages.BaseStorage, int] | None = None

    def _opened_trial(self, sweep: SweepTable) -> tuple[optuna.Study, optuna.storages.BaseStorage, int]:
        """The study, its storage and this trial's id there, through Optuna's public API."""
        if self._opened is None:
            optuna = import_optuna(sweep.method)
            backend = open_storage(optuna, self.storage)
            study = optuna.load_study(
                study_name=self.study_name, storage=backend, pruner=make_pruner(optuna, sweep.pruner)
            )
            study_id = backend.get_study_id_from_name(self.study_name)
            self._opened = (study, backend, backend.get_trial_id_from_study_id_trial_number(study_id, self.number))
        return self._opened

    def on_evaluation(self, run: Run, step: int, epoch: int, metrics: dict[str, float]) -> None:
        sweep = run.job.sweep  # the trial's job keeps the sweep's [sweep] table
        if sweep is None or sweep.metric not in metrics:
            return
        metric = sweep.metric
        self.evaluations += 1
        if not run.is_main_process:
            return
        study, backend, trial_id = self._opened_trial(sweep)
        # what Trial.report and Trial.should_prune do, through the storage's and the pruner's public API
        backend.set_trial_intermediate_value(trial_id, self.evaluations, float(metrics[metric]))
        if study.pruner.prune(study, backend.get_trial(trial_id)):
            reason = (
                f"pruned by the sweep's {sweep.pruner.name} pruner at evaluation {self.evaluations} "
                f"({metric} {metrics[metric]:.4g})"
            )
            run.set_tags({SWEEP_PRUNED_TAG: "true"})
            run.request_stop(reason)
            if self.report is not None:
                self.report.pruned = reason

    def state_dict(self) -> dict[str, object]:
        return {"evaluations": self.evaluations}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.evaluations = int(cast(int, state.get("evaluations", 0)))


def trial_callbacks(trial: TrialContext | None) -> Mapping[str, Callback]:
    """The callbacks a sweep trial's run gets besides the job's own: its pruner (when the sweep has
    one) and, in the trial's own process (not one a launched trial started), its report."""
    if trial is None:
        return {}
    callbacks: dict[str, Callback] = {}
    report = TrialReport(trial.outcome_fd) if trial.outcome_fd is not None and not is_worker() else None
    if trial.pruner != "none":
        callbacks[PRUNING_CALLBACK] = SweepPruning(trial, report)
    if report is not None:
        callbacks[REPORT_CALLBACK] = report
    return callbacks
