"""``runjob sweep``: run the trials of a job's ``[sweep]`` table under one parent MLflow run.

Every trial is ``runjob run JOB --set KEY=VALUE...`` in a subprocess of its own, so a trial is an
ordinary run (several processes included) whose output folder and MLflow run look like any other;
its ``--tag`` flags tag it as a child of the sweep's parent run. A grid is every combination of
the listed values; random and TPE draw points through Optuna's ask-and-tell interface.

Nothing heavy is imported at module level: ``runjob validate`` uses :func:`check_values`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import json
import math
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runjob.commands.table import render
from runjob.errors import JobError, Problem, RunjobError, Terminated, TrackingError, describe
from runjob.host.plugin_host import PluginHost
from runjob.host.run_folder import RunFolder
from runjob.job.jobfile import RawJob, apply_override
from runjob.job.schema import SWEEP_TABLE, SweepRange, SweepTable
from runjob.job.validation import ResolvedJob, resolve
from runjob.record.command_run import CommandRun
from runjob.record.local import RUN_RECORD, last_values, run_id_in
from runjob.train.entry import run_arguments

TRIALS_FILE = "trials.json"  # every trial's overrides, status, value and run; in the sweep folder and on the parent run
USER_MISTAKE_EXIT = 2  # a trial that exits with this stops the sweep: every other trial would repeat it


@dataclass
class Trial:
    """One trial: the values it sets and what came of it."""

    index: int
    values: dict[str, Any]
    output_dir: Path
    status: str = "running"  # then "finished", "failed" or "killed"
    value: float | None = None
    run_id: str | None = None
    message: str = ""

    @property
    def overrides(self) -> list[str]:
        return [override(key, value) for key, value in self.values.items()]

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "overrides": self.overrides,
            "status": self.status,
            "value": self.value,
            "run_id": self.run_id,
            "output_dir": str(self.output_dir.resolve()),
            "message": self.message,
        }


# --- values as --set overrides ------------------------------------------------------------------


def toml_value(value: Any) -> str:
    """``value`` as one line of TOML, as ``--set`` reads it back (``0.01``, ``"ddp"``, ``[0.9, 0.99]``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, str):
        return json.dumps(value)
    return value.isoformat()  # TOML dates and times


def override(key: str, value: Any) -> str:
    """The ``--set`` text that gives job key ``key`` the value ``value``."""
    return f"{key}={toml_value(value)}"


def _shown(values: dict[str, Any]) -> str:
    return " ".join(
        f"{key}={value:.4g}" if isinstance(value, float) else override(key, value) for key, value in values.items()
    )


# --- checking every value before any trial -------------------------------------------------------


def _refused(job: ResolvedJob, host: PluginHost, overrides: list[str]) -> Problem | None:
    """The first problem with the base job plus ``overrides``, or None when it resolves."""
    raw = job.source
    trial = RawJob(raw.path, copy.deepcopy(raw.data), dict(raw.origins), [*raw.overrides, *overrides])
    for text in overrides:
        problem = apply_override(trial, text)
        if problem:
            return problem
    try:
        resolve(trial, host)
    except JobError as error:
        return error.problems[0]
    return None


def check_values(job: ResolvedJob, host: PluginHost) -> None:
    """Resolve the job with each value of each ``[sweep]`` parameter (each bound of a range) set,
    and for a grid with every combination, so a value a trial would refuse is reported now, at its
    line in the job file. Raises :class:`JobError`."""
    problems: list[Problem] = []
    for key, spec in job.sweep.parameters.items():
        dotted = f"{SWEEP_TABLE}.parameters.{key}"
        origin = job.source.origin(dotted)
        seen: set[str] = set()
        for value in (spec.low, spec.high) if isinstance(spec, SweepRange) else spec:
            text = override(key, value)
            refused = _refused(job, host, [text])
            if refused is None or refused.message in seen:
                continue  # one line for a mistake every value repeats (an unknown key)
            seen.add(refused.message)
            detail = refused.message if refused.key in (key, text) else f"{refused.key}: {refused.message}"
            problems.append(Problem(origin.file, dotted, f"{text} is refused: {detail}", origin.line))
    if not problems and job.sweep.method == "grid":
        problems.extend(_refused_combination(job, host))
    if problems:
        raise JobError(problems)


def _refused_combination(job: ResolvedJob, host: PluginHost) -> list[Problem]:
    """The first grid point whose values are refused together (each is fine alone)."""
    for point in grid_points(job.sweep.parameters):
        refused = _refused(job, host, [override(k, v) for k, v in point.items()])
        if refused is not None:
            where = f"{SWEEP_TABLE}.parameters"
            origin = job.source.origin(where)
            return [
                Problem(
                    origin.file,
                    where,
                    f"the combination {_shown(point)} is refused: {refused.key}: {refused.message}",
                    origin.line,
                )
            ]
    return []


# --- choosing each trial's values ---------------------------------------------------------------


def grid_points(parameters: dict[str, list[Any] | SweepRange]) -> list[dict[str, Any]]:
    """Every combination of the listed values, the last key varying fastest."""
    keys = list(parameters)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(parameters[k] for k in keys))]


class GridPlan:
    """Trial ``i`` is the ``i``-th combination of the grid."""

    def __init__(self, sweep: SweepTable) -> None:
        self.points = grid_points(sweep.parameters)
        self.total = len(self.points)

    def ask(self, index: int) -> dict[str, Any]:
        return self.points[index]

    def tell(self, index: int, value: float | None) -> None:
        """A grid does not learn from results."""


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


class OptunaPlan:
    """Random or TPE sampling through Optuna's ask-and-tell interface.

    A list of choices is asked as a categorical over the choices' positions, so any TOML value
    (an array too) can be a choice.
    """

    def __init__(self, sweep: SweepTable) -> None:
        optuna = import_optuna(sweep.method)
        samplers = {"random": optuna.samplers.RandomSampler, "tpe": optuna.samplers.TPESampler}
        self.study = optuna.create_study(direction=sweep.direction, sampler=samplers[sweep.method](seed=sweep.seed))
        self.parameters = sweep.parameters
        self.distributions = {key: _distribution(optuna, spec) for key, spec in sweep.parameters.items()}
        self.total = sweep.trials
        self._failed = optuna.trial.TrialState.FAIL
        self._asked: dict[int, Any] = {}

    def ask(self, index: int) -> dict[str, Any]:
        trial = self.study.ask(self.distributions)
        self._asked[index] = trial
        return {
            key: spec[trial.params[key]] if isinstance(spec, list) else trial.params[key]
            for key, spec in self.parameters.items()
        }

    def tell(self, index: int, value: float | None) -> None:
        """Report trial ``index``'s result (None: it failed)."""
        trial = self._asked.pop(index)
        if value is None:
            self.study.tell(trial, state=self._failed)
        else:
            self.study.tell(trial, value)


def _distribution(optuna: Any, spec: list[Any] | SweepRange) -> Any:
    distributions = optuna.distributions
    if isinstance(spec, list):
        return distributions.CategoricalDistribution(list(range(len(spec))))
    if spec.integer:
        return distributions.IntDistribution(spec.low, spec.high, log=spec.log)
    return distributions.FloatDistribution(float(spec.low), float(spec.high), log=spec.log)


def make_plan(sweep: SweepTable) -> GridPlan | OptunaPlan:
    """The plan that chooses each trial's values for ``sweep.method``."""
    return GridPlan(sweep) if sweep.method == "grid" else OptunaPlan(sweep)


# --- a trial's run --------------------------------------------------------------------------------


class SignalForwarder:
    """While active, SIGINT and SIGTERM are remembered and passed on to the running trial, which
    stops after a checkpoint (a second Ctrl-C stops it at once). Trials run in their own session,
    so a terminal's Ctrl-C reaches them once, through here."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.child: subprocess.Popen | None = None

    def _receive(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    @contextlib.contextmanager
    def active(self) -> Iterator[SignalForwarder]:
        previous = {s: signal.signal(s, self._receive) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def run_trial(trial: Trial, command: list[str], signals: SignalForwarder) -> int:
    """Run one trial's ``runjob run`` with its output streamed through; returns its exit code."""
    child = subprocess.Popen(command, start_new_session=True)
    signals.child = child
    if signals.signum:  # the signal came while the trial was starting
        child.send_signal(signals.signum)
    try:
        return child.wait()
    finally:
        signals.child = None
        if child.poll() is None:  # the sweep itself failed: leave no trial behind
            child.kill()
            child.wait()


def trial_command(job_path: Path, overrides: list[str], trial: Trial, tags: dict[str, str]) -> list[str]:
    """``python -m runjob run JOB --set ... --tag ... --output-dir SWEEP_DIR/trial-NNN``: the trial
    is an ordinary run in a process of its own (so ``[launch]`` works for trials too)."""
    arguments = run_arguments(job_path, [*overrides, *trial.overrides], trial.output_dir, tags=tags)
    return [sys.executable, "-m", "runjob", *arguments]


def read_result(trial: Trial, metric: str) -> None:
    """Fill in ``trial``'s run id and the last value of ``metric`` from its output folder; a
    finished trial without the metric (or with a non-finite one) is failed, saying what it logged."""
    trial.run_id = run_id_in(trial.output_dir)
    logged = last_values(trial.output_dir)
    value = logged.get(metric)
    if value is None:
        trial.status = "failed"
        trial.message = f"logged no {metric!r}; it logged: {', '.join(sorted(logged)) or 'nothing'}"
    elif not math.isfinite(value):
        trial.status, trial.message = "failed", f"{metric} is {value}"
    else:
        trial.status, trial.value = "finished", float(value)


# --- the parent MLflow run ------------------------------------------------------------------------


class ParentRun:
    """The sweep's own run: its settings as params, one ``sweep/<metric>`` point per trial, the
    best trial as tags, ``trials.json`` and the job file as artifacts. Recorded as a training run
    is, first in the sweep's folder (``mlflow_run.json``, ``metrics.jsonl``, ``record/<job file>``),
    then in MLflow, so ``runjob sync SWEEP_DIR`` uploads what MLflow missed mid-sweep."""

    def __init__(self, recorded: CommandRun) -> None:
        self.recorded = recorded

    @property
    def run_id(self) -> str:
        run_id = self.recorded.run_id
        assert run_id is not None, "ParentRun.start gives a run MLflow created"
        return run_id

    @classmethod
    def start(cls, job: ResolvedJob, total: int, tags: dict[str, str], folder: Path) -> ParentRun:
        """Record the parent run in ``folder`` and create it in the job's experiment; a TrackingError
        when MLflow cannot create it (the trials are its children: they need its id)."""
        from runjob.record.uri import default_experiment, resolve_tracking_uri

        uri = resolve_tracking_uri(job.tracking.uri)
        experiment = default_experiment(job.tracking, job.job.name)
        recorded = CommandRun.begin(
            folder, uri, experiment, f"{job.job.name}-sweep", sweep_params(job.sweep, total), tags
        )
        if recorded.online:
            job_file = RunFolder(folder).record_dir / job.source.path.name
            job_file.parent.mkdir(exist_ok=True)
            job_file.write_text(_job_file_text(job), encoding="utf-8")
            recorded.log_artifact(job_file)
        if not recorded.online:
            if recorded.run_id is None:  # no sweep began: nothing for `runjob sync` to upload
                (folder / RUN_RECORD).unlink(missing_ok=True)
            else:
                recorded.set_tags({"runjob.error": f"MLflow did not take the sweep: {recorded.failure}"})
                recorded.end("FAILED")  # a run is never left RUNNING
            if isinstance(recorded.error, TrackingError):  # the server is not there: said as for a run
                raise TrackingError(str(recorded.error)) from None
            raise TrackingError(f"cannot record the sweep to MLflow at {uri} (tracking.uri): {recorded.failure}")
        return cls(recorded)

    def log_trial(self, trial: Trial, metric: str) -> None:
        """Record a finished trial's value at step = its index."""
        if trial.value is not None:
            self.recorded.log_metrics({f"sweep/{metric}": trial.value}, trial.index)

    def finish(
        self, trials: list[Trial], best: Trial | None, metric: str, status: str, error: BaseException | None
    ) -> None:
        """Record the best trial and every trial, and close the run with ``status``; say how to
        upload what MLflow did not take."""
        if best is not None:
            self.recorded.set_tags(
                {
                    "runjob.sweep.best_trial": str(best.index),
                    "runjob.sweep.best_run_id": best.run_id or "",
                    "runjob.sweep.best_params": " ".join(best.overrides),
                }
            )
            self.recorded.log_metrics({f"best/{metric}": best.value}, best.index)
        if error is not None:
            self.recorded.set_tags({"runjob.error": describe(error)[:5000]})
        trials_file = self.recorded.folder / TRIALS_FILE
        trials_file.write_text(trials_json(trials), encoding="utf-8")
        self.recorded.log_artifact(trials_file)
        self.recorded.end(status)
        if not self.recorded.online:
            print(
                f"runjob: warning: MLflow did not take the sweep's parent run ({self.recorded.failure}); its record is "
                f"complete in {self.recorded.folder}: upload it with `runjob sync {self.recorded.folder}`",
                file=sys.stderr,
            )


def _job_file_text(job: ResolvedJob) -> str:
    """The job file as written; where the job holds a secret, its tables with the secrets hidden."""
    import tomli_w

    from runjob.job.redaction import redact_tables

    hidden = redact_tables(job.source.data)
    return job.source.path.read_text(encoding="utf-8") if hidden == job.source.data else tomli_w.dumps(hidden)


def sweep_params(sweep: SweepTable, total: int) -> dict[str, str]:
    """The parent run's params: the sweep's settings, each parameter's choices or range as JSON."""
    params = {
        "sweep.method": sweep.method,
        "sweep.metric": sweep.metric,
        "sweep.direction": sweep.direction,
        "sweep.trials": str(total),
    }
    if sweep.method != "grid":
        params["sweep.seed"] = str(sweep.seed)
    for key, spec in sweep.parameters.items():
        params[f"sweep.parameters.{key}"] = json.dumps(spec.model_dump() if isinstance(spec, SweepRange) else spec)
    return params


def trials_json(trials: list[Trial]) -> str:
    return json.dumps([trial.to_json() for trial in trials], indent=1) + "\n"


def best_trial(trials: list[Trial], direction: str) -> Trial | None:
    """The finished trial with the best value (the earliest among equals)."""
    finished = [t for t in trials if t.status == "finished"]
    if not finished:
        return None
    sign = -1 if direction == "maximize" else 1
    return min(finished, key=lambda t: (sign * t.value, t.index))


# --- the command ----------------------------------------------------------------------------------


def _parent_tags(job: ResolvedJob, overrides: list[str], sweep_dir: Path) -> dict[str, str]:
    from runjob import __version__
    from runjob.job.redaction import redact_override, redact_tables

    return {
        **redact_tables(dict(job.tracking.tags)),
        "runjob.sweep": "true",
        "runjob.version": __version__,
        "runjob.job_file": str(job.source.path.resolve()),
        "runjob.overrides": " ".join(redact_override(o) for o in overrides),
        "runjob.output_dir": str(sweep_dir.resolve()),
    }


def _prepare(args: argparse.Namespace) -> tuple[ResolvedJob, GridPlan | OptunaPlan, Path]:
    """Everything checked before the parent run exists: the job, every value, Optuna, the folder."""
    from runjob.host.plugin_host import load_plugins
    from runjob.job.validation import load_resolved
    from runjob.record.outputs import choose_output_dir

    host = load_plugins()
    job = load_resolved(args.job, args.overrides, host)
    if job.sweep is None:
        raise RunjobError(
            f"{args.job}: has no [sweep] table: add one to say which job keys to try (see the README's [sweep] "
            "reference)"
        )
    check_values(job, host)
    if job.tracking.offline:
        raise RunjobError(
            "tracking.offline = true: `runjob sweep` records its trials under a parent MLflow run; sweep with "
            "tracking.offline = false"
        )
    plan = make_plan(job.sweep)
    sweep_dir = choose_output_dir(f"{job.job.name}-sweep", args.output_dir)
    if (sweep_dir / TRIALS_FILE).exists():
        raise RunjobError(
            f"--output-dir {sweep_dir}: this folder already holds a sweep ({TRIALS_FILE}); choose another so nothing "
            "is overwritten"
        )
    sweep_dir.mkdir(parents=True, exist_ok=True)
    return job, plan, sweep_dir


def cmd_sweep(args: argparse.Namespace) -> int:
    """``runjob sweep JOB.toml``: run every trial, record the parent run, print the best.

    Exit 0 when at least one trial finished, 1 when none did, 2 for a mistake in the job (found
    before any trial, or a trial exiting with 2), 128 + signal when stopped.
    """
    job, plan, sweep_dir = _prepare(args)
    sweep = job.sweep
    parent = ParentRun.start(job, plan.total, _parent_tags(job, args.overrides, sweep_dir), sweep_dir)
    print(
        f"runjob: sweep of {plan.total} trial(s), {sweep.method}, {sweep.direction} {sweep.metric}: output in "
        f"{sweep_dir}, MLflow parent run {parent.run_id}",
        flush=True,
    )
    trials: list[Trial] = []
    status, error = "FAILED", None
    try:
        with SignalForwarder().active() as signals:
            for index in range(plan.total):
                if signals.signum:
                    break
                trial = Trial(index, plan.ask(index), sweep_dir / f"trial-{index:03d}")
                trials.append(trial)
                _run_one(job, args, plan, trial, parent, signals)
                (sweep_dir / TRIALS_FILE).write_text(trials_json(trials), encoding="utf-8")
            if signals.signum:
                raise Terminated(signals.signum)
        status = "FINISHED" if best_trial(trials, sweep.direction) else "FAILED"
    except (Terminated, KeyboardInterrupt) as stop:
        status, error = "KILLED", stop
        raise
    except BaseException as failure:
        error = failure
        raise
    finally:
        best = best_trial(trials, sweep.direction)
        (sweep_dir / TRIALS_FILE).write_text(trials_json(trials), encoding="utf-8")
        with _warn_if_mlflow_fails("the parent run's results"):
            parent.finish(trials, best, sweep.metric, status, error)
        print_summary(trials, best, plan.total, sweep.metric)
    return 0 if status == "FINISHED" else 1


def _run_one(
    job: ResolvedJob,
    args: argparse.Namespace,
    plan: GridPlan | OptunaPlan,
    trial: Trial,
    parent: ParentRun,
    signals: SignalForwarder,
) -> None:
    """Run ``trial``, read its result, tell the plan and the parent run; exit 2 stops the sweep."""
    label = f"runjob: sweep trial {trial.index + 1}/{plan.total}: {_shown(trial.values)}"
    print(f"{label} (output in {trial.output_dir})", flush=True)
    tags = {
        "mlflow.parentRunId": parent.run_id,
        "runjob.sweep.parent": parent.run_id,
        "runjob.sweep.trial": str(trial.index),
    }
    code = run_trial(trial, trial_command(job.source.path, args.overrides, trial, tags), signals)
    read_result(trial, job.sweep.metric)
    if signals.signum:
        trial.status, trial.value, trial.message = "killed", None, f"stopped by signal {signals.signum}"
    elif code != 0:
        trial.status, trial.value, trial.message = "failed", None, f"exit code {code}"
    plan.tell(trial.index, trial.value)
    with _warn_if_mlflow_fails(f"trial {trial.index}'s value"):
        parent.log_trial(trial, job.sweep.metric)
    outcome = (
        f"{job.sweep.metric} {trial.value:.4f}" if trial.value is not None else f"{trial.status} ({trial.message})"
    )
    print(f"{label} -> {outcome}" + (f" (run {trial.run_id})" if trial.run_id else ""), flush=True)
    if code == USER_MISTAKE_EXIT and not signals.signum:
        raise RunjobError(
            f"sweep trial {trial.index} ({' '.join(trial.overrides)}) stopped with a mistake in the job or its setup "
            "(above) that every trial would repeat; the sweep stops"
        )


@contextlib.contextmanager
def _warn_if_mlflow_fails(what: str) -> Iterator[None]:
    """A tracking server that fails mid-sweep costs a line in the parent run, not the sweep."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - MLflow's errors have no common base worth naming
        print(f"runjob: warning: could not record {what} to MLflow: {describe(error)}", file=sys.stderr)


def print_summary(trials: list[Trial], best: Trial | None, total: int, metric: str) -> None:
    """A table of the trials, the best marked with ``*``, and its values as ``--set`` flags."""
    if not trials:
        return
    keys = list(trials[0].values)
    rows = []
    for t in trials:
        shown = [f"{v:.4g}" if isinstance(v, float) else toml_value(v) for v in t.values.values()]
        rows.append(
            [
                ("* " if t is best else "  ") + str(t.index),
                t.status,
                "" if t.value is None else f"{t.value:.4f}",
                *shown,
                t.run_id or "",
            ]
        )
    print(f"runjob: sweep: {sum(t.status == 'finished' for t in trials)} of {total} trial(s) finished")
    for line in render(["  trial", "status", metric, *keys, "run"], rows, indent="  "):
        print(line)
    if best is not None:
        flags = " ".join(f"--set {shlex.quote(text)}" for text in best.overrides)
        print(f"runjob: best: trial {best.index}, {metric} {best.value:.4f} (run {best.run_id}): {flags}")
    sys.stdout.flush()
