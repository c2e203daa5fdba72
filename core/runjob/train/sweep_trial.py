"""Optuna for a sweep's trials: its storage and pruners, and a callback that reports each
evaluation's value of the sweep metric to the trial's pruner and stops the run cleanly when the
pruner says so.

The worker that starts a trial tags it with the study and the trial number and hands it the
storage in ``RUNJOB_SWEEP_STORAGE`` (not recorded: a URL may hold a password). The main process
reports (step 1 for the first evaluation, 2 for the next, ...) and asks; its request to stop stops
every process of the run at the next point where they all agree, as any callback's does. The run
then evaluates, saves its model and ends FINISHED, tagged ``runjob.sweep.pruned``; the worker
records the trial as PRUNED.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from runjob.errors import RunjobError, describe
from runjob.host.callback import Callback
from runjob.job.redaction import redact_text
from runjob.job.schema import SWEEP_TABLE, SweepPruner
from runjob.tags import SWEEP_PRUNED_TAG, SWEEP_STUDY_TAG, SWEEP_TRIAL_TAG

if TYPE_CHECKING:
    from runjob.host.run_context import Run
    from runjob.job.validation import ResolvedJob

STORAGE_ENVIRONMENT = "RUNJOB_SWEEP_STORAGE"
PRUNING_CALLBACK = "sweep_pruning"  # its name among the run's callbacks (and in messages)


def import_optuna(method: str) -> Any:
    """Optuna, or a RunjobError saying how to install it."""
    try:
        import optuna
    except ImportError:
        raise RunjobError(
            f"{SWEEP_TABLE}.method = \"{method}\" needs Optuna: pip install 'runjob-train[sweep]'"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # runjob prints its own line per trial
    return optuna


def is_url(storage: str) -> bool:
    return "://" in storage


def open_storage(optuna: Any, storage: str) -> Any:
    """Optuna's storage for ``storage``: an RDB storage for a URL, a journal file otherwise."""
    try:
        if is_url(storage):
            return optuna.storages.RDBStorage(storage)
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(storage))
    except Exception as error:  # noqa: BLE001 - a driver missing, a server down, a bad URL: one line
        raise RunjobError(
            f"{SWEEP_TABLE}.storage = {redact_text(storage)!r}: Optuna cannot open it: {describe(error)}"
        ) from None


def make_pruner(optuna: Any, pruner: SweepPruner) -> Any:
    """Optuna's pruner named ``pruner.name`` with the job's options (``none``: never prunes)."""
    pruners = optuna.pruners
    made = {
        "none": pruners.NopPruner,
        "median": pruners.MedianPruner,
        "successive_halving": pruners.SuccessiveHalvingPruner,
        "hyperband": pruners.HyperbandPruner,
    }[pruner.name]
    return made(**pruner.options())


class SweepPruning(Callback):
    """Reports the sweep metric to the trial after every evaluation; stops a pruned trial."""

    def __init__(self, job: ResolvedJob, study: str, number: int, storage: str) -> None:
        assert job.sweep is not None
        self.sweep = job.sweep
        self.study_name, self.number, self.storage = study, number, storage
        self.evaluations = 0
        self._opened: tuple[Any, Any, int] | None = None

    def _opened_trial(self) -> tuple[Any, Any, int]:
        """The study, its storage and this trial's id there, through Optuna's public API."""
        if self._opened is None:
            optuna = import_optuna(self.sweep.method)
            backend = open_storage(optuna, self.storage)
            study = optuna.load_study(
                study_name=self.study_name, storage=backend, pruner=make_pruner(optuna, self.sweep.pruner)
            )
            study_id = backend.get_study_id_from_name(self.study_name)
            self._opened = (study, backend, backend.get_trial_id_from_study_id_trial_number(study_id, self.number))
        return self._opened

    def on_evaluation(self, run: Run, step: int, epoch: int, metrics: dict[str, float]) -> None:
        metric = self.sweep.metric
        if metric not in metrics:
            return
        self.evaluations += 1
        if not run.is_main_process:
            return
        study, backend, trial_id = self._opened_trial()
        # what Trial.report and Trial.should_prune do, through the storage's and the pruner's public API
        backend.set_trial_intermediate_value(trial_id, self.evaluations, float(metrics[metric]))
        if study.pruner.prune(study, backend.get_trial(trial_id)):
            run.set_tags({SWEEP_PRUNED_TAG: "true"})
            run.request_stop(
                f"pruned by the sweep's {self.sweep.pruner.name} pruner at evaluation {self.evaluations} "
                f"({metric} {metrics[metric]:.4g})"
            )

    def state_dict(self) -> dict[str, Any]:
        return {"evaluations": self.evaluations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.evaluations = int(state.get("evaluations", 0))


def sweep_pruning(job: ResolvedJob, tags: dict[str, str]) -> SweepPruning | None:
    """The pruning callback for a sweep trial whose sweep has a pruner, else None."""
    storage = os.environ.get(STORAGE_ENVIRONMENT)
    trial = SWEEP_TRIAL_TAG in tags and SWEEP_STUDY_TAG in tags
    if job.sweep is None or job.sweep.pruner.name == "none" or not trial:
        return None
    if not storage:
        return None
    return SweepPruning(job, tags[SWEEP_STUDY_TAG], int(tags[SWEEP_TRIAL_TAG]), storage)
