"""The sweep's parent MLflow run and its summary.

The parent is recorded as a training run is, first in the sweep's folder (``mlflow_run.json``,
``metrics.jsonl``, ``record/<job file>``), then in MLflow, so ``runjob sync SWEEP_DIR`` uploads what
MLflow missed. Its params are the sweep's settings; after each trial it logs the trial's value
(``sweep/<metric>`` at step = the trial's number) and the best so far (``best/<metric>`` at step =
trials finished); at the end the best trial as tags, each parameter's importance
(``importance/<key>``, Optuna's ``get_param_importances``), ``trials.json`` and two plots
(Optuna's matplotlib views of the history and the importances).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

import tomli_w

from runjob.errors import TrackingError, describe
from runjob.host.output import screen
from runjob.host.run_folder import RunFolder
from runjob.job.redaction import redact_tables, redact_text
from runjob.job.schema import SweepRange, SweepTable
from runjob.job.validation import ResolvedJob
from runjob.record.command_run import CommandRun
from runjob.record.invocation import pasteable
from runjob.record.local import RUN_RECORD, read_metric_points
from runjob.record.uri import default_experiment, resolve_tracking_uri
from runjob.sweep.study import SweepStudy, job_values
from runjob.sweep.sweep_folder import HISTORY_PLOT, IMPORTANCES_PLOT, TRIALS_FILE
from runjob.sweep.worker import override
from runjob.tags import (
    ERROR_TAG,
    MESSAGE_ATTR,
    NOTE_TAG,
    OUTPUT_DIR_ATTR,
    RUN_ID_ATTR,
    SWEEP_BEST_PARAMS_TAG,
    SWEEP_BEST_RUN_ID_TAG,
    SWEEP_BEST_TRIAL_TAG,
    SWEEP_UNSYNCED_TAG,
    UNSYNCED_ATTR,
)

if TYPE_CHECKING:  # Optuna and matplotlib are imported when a sweep needs them
    import optuna
    from matplotlib.axes import Axes
    from optuna.trial import FrozenTrial

STATE_NAMES = {
    "COMPLETE": "finished",
    "PRUNED": "pruned",
    "FAIL": "failed",
    "RUNNING": "interrupted",
    "WAITING": "waiting",
}


def sweep_params(sweep: SweepTable, budget: int, study: str, storage: str) -> dict[str, str]:
    """The parent run's params: the sweep's settings, each parameter's choices or range as JSON."""
    params = {
        "sweep.method": sweep.method,
        "sweep.metric": sweep.metric or "",
        "sweep.direction": sweep.direction or "",
        "sweep.trials": str(budget),
        "sweep.pruner": sweep.pruner.name,
        "sweep.study": study,
        "sweep.storage": redact_text(storage),
    }
    if sweep.method != "grid":
        params["sweep.seed"] = str(sweep.seed)
    if sweep.pruner.options():
        params["sweep.pruner_options"] = json.dumps(sweep.pruner.options())
    for key, spec in sweep.parameters.items():
        params[f"sweep.parameters.{key}"] = json.dumps(spec.model_dump() if isinstance(spec, SweepRange) else spec)
    return params


def same_sweep(recorded: dict[str, str], mine: dict[str, str]) -> list[str]:
    """The settings (params) in which a worker's job differs from the sweep it joins."""
    ignored = {"sweep.storage", "sweep.study"}
    return sorted(key for key in set(recorded) | set(mine) if key not in ignored and recorded.get(key) != mine.get(key))


class ParentRun:
    """The sweep's own run, recorded by one process at a time (the sweep's owner)."""

    def __init__(self, recorded: CommandRun) -> None:
        self.recorded = recorded
        self.logged: set[int] = set()
        self.finished = 0

    @property
    def run_id(self) -> str:
        run_id = self.recorded.run_id
        assert run_id is not None, "ParentRun.start gives a run MLflow created"
        return run_id

    @classmethod
    def start(cls, job: ResolvedJob, params: dict[str, str], tags: dict[str, str], folder: Path) -> ParentRun:
        """Record the parent run in ``folder`` and create it in the job's experiment; a TrackingError
        when MLflow cannot create it (the trials are its children: they need its id)."""
        uri = resolve_tracking_uri(job.tracking.uri)
        experiment = default_experiment(job.tracking, job.job.name)
        recorded = CommandRun.begin(folder, uri, experiment, f"{job.job.name}-sweep", params, tags)
        if recorded.online:
            job_file = RunFolder(folder).record_dir / job.source.path.name
            job_file.parent.mkdir(exist_ok=True)
            job_file.write_text(_job_file_text(job), encoding="utf-8")
            recorded.log_artifact(job_file)
        if not recorded.online:
            if recorded.run_id is None:  # no sweep began: nothing for `runjob sync` to upload
                (folder / RUN_RECORD).unlink(missing_ok=True)
            else:
                recorded.set_tags({ERROR_TAG: f"MLflow did not take the sweep: {recorded.failure}"})
                recorded.end("FAILED")  # a run is never left RUNNING
            if isinstance(recorded.error, TrackingError):  # the server is not there: said as for a run
                raise TrackingError(str(recorded.error)) from None
            raise TrackingError(f"cannot record the sweep to MLflow at {uri} (tracking.uri): {recorded.failure}")
        return cls(recorded)

    @classmethod
    def reopen(cls, folder: Path, metric: str) -> ParentRun:
        """The parent recorded in ``folder``, RUNNING again, knowing which trials it logged."""
        parent = cls(CommandRun.reopen(folder))
        for point in read_metric_points(folder):
            if point.get("key") == f"sweep/{metric}":
                parent.logged.add(int(point["step"]))
            elif point.get("key") == f"best/{metric}":
                parent.finished = max(parent.finished, int(point["step"]))
        return parent

    def progress(self, study: SweepStudy) -> None:
        """Log each trial that finished since the last call (any worker's), and the best so far."""
        states = study.states
        metric = study.sweep.metric
        done = [t for t in study.trials() if t.state in (states.COMPLETE, states.PRUNED)]
        new = sorted((t for t in done if t.number not in self.logged), key=lambda t: t.datetime_complete or 0)
        with warn_if_mlflow_fails("the sweep's progress"):
            for trial in new:
                value = trial.value if trial.value is not None else _last_intermediate(trial)
                if value is not None:
                    self.recorded.log_metrics({f"sweep/{metric}": float(value)}, trial.number)
                self.logged.add(trial.number)
            if new:
                self.finished = len(self.logged)
                best = best_trial(study)
                if best is not None:
                    self.recorded.log_metrics({f"best/{metric}": float(cast(float, best.value))}, self.finished)

    def finish_unstarted(self, error: BaseException) -> None:
        """The sweep could not begin after its parent run was created: the run ends FAILED, saying why."""
        with warn_if_mlflow_fails("the sweep's failure"):
            self.recorded.set_tags({ERROR_TAG: describe(error)[:5000]})
            self.recorded.end("FAILED")

    def finish(self, study: SweepStudy, status: str, error: BaseException | None) -> None:
        """Record the best trial, the importances, the plots and every trial; close the run."""
        self.progress(study)
        folder = self.recorded.folder
        best = best_trial(study)
        with warn_if_mlflow_fails("the sweep's results"):
            if best is not None:
                run_id, settings = str(best.user_attrs.get(RUN_ID_ATTR, "")), overrides_of(study, best)
                self.recorded.set_tags(
                    {
                        SWEEP_BEST_TRIAL_TAG: str(best.number),
                        SWEEP_BEST_RUN_ID_TAG: run_id,
                        SWEEP_BEST_PARAMS_TAG: " ".join(settings),
                        NOTE_TAG: best_trial_note(best.number, run_id, settings, study.sweep.metric, best.value),
                    }
                )
            importances = param_importances(study)
            if importances:
                self.recorded.log_metrics({f"importance/{key}": value for key, value in importances.items()}, 0)
            if error is not None:
                self.recorded.set_tags({ERROR_TAG: describe(error)[:5000]})
            unsynced = unsynced_trials(study)
            if unsynced:  # trials whose own MLflow runs lack part of their record: named where users look
                self.recorded.set_tags({SWEEP_UNSYNCED_TAG: " ".join(map(str, unsynced))})
            trials_file = folder / TRIALS_FILE
            trials_file.write_text(json.dumps(trial_rows(study), indent=1) + "\n", encoding="utf-8")
            self.recorded.log_artifact(trials_file)
            for plot in save_plots(study, folder, importances):
                self.recorded.log_artifact(plot)
            self.recorded.end(status)
        if not self.recorded.online:
            screen.each(
                f"runjob: warning: MLflow did not take the sweep's parent run ({self.recorded.failure}); its record is "
                f"complete in {folder}: upload it with `{pasteable('sync', folder)}`",
                err=True,
            )


def best_trial_note(number: int, run_id: str, settings: list[str], metric: str | None, value: float | None) -> str:
    """The parent run's description: the best trial, a link to its run. MLflow's UI shows a tag's
    value as plain text, a run's description as Markdown with its links clickable; the link is the
    UI's own route to a run by its id (its routes follow ``#``, so the link is relative to wherever
    the UI is served, whatever address the tracking URI uses)."""
    trial = f"[trial {number}](#/runs/{run_id})" if run_id else f"trial {number}"
    said = f", {metric} {value:.4g}" if metric and value is not None else ""
    given = f": `{' '.join(settings)}`" if settings else ""
    return f"Best trial: {trial}{said}{given}"


def _job_file_text(job: ResolvedJob) -> str:
    """The job file as written; where the job holds a secret, its tables with the secrets hidden."""
    hidden = redact_tables(job.source.data)
    return job.source.path.read_text(encoding="utf-8") if hidden == job.source.data else tomli_w.dumps(hidden)


@contextlib.contextmanager
def warn_if_mlflow_fails(what: str) -> Iterator[None]:
    """A tracking server that fails mid-sweep costs a line in the parent run, not the sweep."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - MLflow's errors have no common base worth naming
        screen.each(f"runjob: warning: could not record {what} to MLflow: {describe(error)}", err=True)


def _last_intermediate(trial: FrozenTrial) -> float | None:
    values = trial.intermediate_values
    return float(values[max(values)]) if values else None


def best_trial(study: SweepStudy) -> FrozenTrial | None:
    """The finished (not pruned) trial with the best value, the earliest among equals."""
    complete = [t for t in study.trials() if t.state == study.states.COMPLETE and t.value is not None]
    if not complete:
        return None
    sign = -1 if study.sweep.direction == "maximize" else 1
    return min(complete, key=lambda t: (sign * cast(float, t.value), t.number))  # complete: each has a value


def unsynced_trials(study: SweepStudy) -> list[int]:
    """The trials whose MLflow runs lack part of their record even after their workers tried to send it."""
    return [trial.number for trial in study.trials() if trial.user_attrs.get(UNSYNCED_ATTR)]


def overrides_of(study: SweepStudy, trial: FrozenTrial) -> list[str]:
    return [override(key, value) for key, value in job_values(study.sweep.parameters, trial.params).items()]


class TrialRow(TypedDict):
    """One trial of ``trials.json``."""

    trial: int
    state: str
    value: float | None
    values: dict[str, object]
    overrides: list[str]
    run_id: str | None
    output_dir: str | None
    started: str | None
    seconds: float | None
    message: str
    unsynced: str | None


def trial_rows(study: SweepStudy) -> list[TrialRow]:
    """``trials.json``: each trial's number, state, value, ``--set`` flags, run and folder."""
    rows: list[TrialRow] = []
    for trial in study.trials():
        if trial.state == study.states.WAITING:
            continue
        started, ended = trial.datetime_start, trial.datetime_complete
        rows.append(
            {
                "trial": trial.number,
                "state": STATE_NAMES.get(trial.state.name, trial.state.name.lower()),
                "value": trial.value if trial.value is not None else _last_intermediate(trial),
                "values": job_values(study.sweep.parameters, trial.params),
                "overrides": overrides_of(study, trial),
                "run_id": trial.user_attrs.get(RUN_ID_ATTR),
                "output_dir": trial.user_attrs.get(OUTPUT_DIR_ATTR),
                "started": started.isoformat(timespec="seconds") if started else None,
                "seconds": round((ended - started).total_seconds(), 1) if started and ended else None,
                "message": trial.user_attrs.get(MESSAGE_ATTR, ""),
                "unsynced": trial.user_attrs.get(UNSYNCED_ATTR),
            }
        )
    return rows


def param_importances(study: SweepStudy) -> dict[str, float]:
    """Optuna's importance of each swept key (fANOVA), when two or more trials finished with
    different values; empty otherwise."""
    complete = [t for t in study.trials() if t.state == study.states.COMPLETE]
    if len(complete) < 2 or len(study.sweep.parameters) < 1:
        return {}
    try:
        importances = study.optuna.importance.get_param_importances(study.study)
    except (ValueError, RuntimeError, ZeroDivisionError):  # every trial the same point, or one value only
        return {}
    return {key: float(value) for key, value in importances.items()}


def save_plots(study: SweepStudy, folder: Path, importances: dict[str, float]) -> list[Path]:
    """``optimization_history.png`` and (with importances) ``param_importances.png``, drawn by
    Optuna's matplotlib views; a missing matplotlib or a failing view costs a warning."""
    if not any(t.state == study.states.COMPLETE for t in study.trials()):
        return []
    try:
        import matplotlib  # lazy: matplotlib and optuna's plots only when a sweep ends

        matplotlib.use("Agg")
        # lazy: matplotlib and optuna's plots only when a sweep ends
        import matplotlib.pyplot as plt
        from optuna.visualization import matplotlib as views
    except ImportError as error:
        screen.each(f"runjob: note: no plots of the sweep ({error}): pip install matplotlib", err=True)
        return []
    saved = []
    plots: list[tuple[str, Callable[[optuna.Study], Axes]]] = [(HISTORY_PLOT, views.plot_optimization_history)]
    if importances:
        plots.append((IMPORTANCES_PLOT, views.plot_param_importances))
    for name, view in plots:
        try:
            with contextlib.redirect_stderr(None), _quiet_warnings():
                axes = view(study.study)
            figure = axes.get_figure(root=True)  # the Figure itself, not a subfigure
            if figure is None:
                raise ValueError("the plot drew no figure")
            figure.set_size_inches(8, 5)
            figure.tight_layout()
            figure.savefig(folder / name, dpi=100)
            plt.close(figure)
            saved.append(folder / name)
        except Exception as error:  # noqa: BLE001 - a plot is a convenience: never fail the sweep for it
            screen.each(f"runjob: warning: could not draw {name}: {describe(error)}", err=True)
    return saved


@contextlib.contextmanager
def _quiet_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib views experimental
        yield
