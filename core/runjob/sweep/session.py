"""A sweep, coordinated: created (its folder, its study, its parent run), joined by a worker on any
machine that reaches its storage, or continued when stopped; its workers run here (``--workers``
processes, each ``runjob sweep JOB --join FOLDER``, each trial a ``runjob run`` of its own); each
trial logged to the parent as it finishes; the end recorded and summed up. The process that records
the parent run holds the folder's owner lock; when it is gone, the last worker records the end.

``runjob sweep`` (:mod:`runjob.commands.sweep`) parses its arguments into a :class:`SweepOrder` and
calls :func:`load`, :func:`plan` and :func:`sweep`. Nothing heavy is imported at module level.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runjob import __version__
from runjob.errors import RunjobError, Terminated
from runjob.host.output import screen
from runjob.host.plugin_host import load_plugins
from runjob.job.redaction import redact_override, redact_tables, redact_text
from runjob.job.validation import ResolvedJob, load_resolved
from runjob.record.invocation import command_prefix
from runjob.record.logfile import LibraryLog
from runjob.record.mlflow_writer import connect
from runjob.record.outputs import choose_output_dir
from runjob.record.uri import resolve_tracking_uri
from runjob.sweep.checks import check_values
from runjob.sweep.devices import cpu_cores, plan_workers, visible_gpus
from runjob.sweep.parent import ParentRun, best_trial, overrides_of, same_sweep, sweep_params, trial_rows
from runjob.sweep.study import (
    FileLock,
    SweepInfo,
    SweepStudy,
    budget_of,
    import_optuna,
    is_url,
    make_sampler,
    open_storage,
    storage_of,
)
from runjob.sweep.sweep_folder import LOCK_FILE, OWNER_LOCK, SWEEP_FILE
from runjob.sweep.worker import (
    USER_MISTAKE_EXIT,
    Signals,
    Worker,
    preload,
    start_child,
    toml_value,
    wait_for_previous,
)
from runjob.tags import (
    JOB_FILE_TAG,
    OUTPUT_DIR_TAG,
    OVERRIDES_TAG,
    PARENT_ATTR,
    RUN_ID_ATTR,
    STOPPED_ATTR,
    SWEEP_DIR_ATTR,
    SWEEP_STUDY_TAG,
    SWEEP_TAG,
    VERSION_TAG,
)

if TYPE_CHECKING:
    from runjob.sweep.worker import Child

RUN_ID = re.compile(r"^[0-9a-f]{32}$")
# set for the workers `runjob sweep` starts on its machine: "1" sends each trial's output to its folder
QUIET_ENVIRONMENT = "RUNJOB_SWEEP_QUIET"

Render = Callable[..., list[str]]
"""``runjob.commands.table.render``: a plain-text table's lines from its headers and rows."""


@dataclass(frozen=True)
class CommandLine:
    """What the sweep uses of runjob's command line, the room above it: ``main``
    (``runjob.commands.cli.main``), to fork each trial's ``runjob run`` from a worker, and
    ``render``, the tables the commands print."""

    main: Callable[[list[str]], int]
    render: Render


@dataclass
class SweepOrder:
    """``runjob sweep``'s arguments: the job file and its ``--set`` overrides, ``--output-dir``,
    ``--workers``, ``--join`` or ``--resume``; and what each worker here gets (:func:`plan`)."""

    job_file: Path
    overrides: list[str]
    command_line: CommandLine
    output_dir: Path | None = None
    workers: int | None = None
    join: str | None = None
    resume: str | None = None
    plans: list[dict[str, str]] | None = None

    @property
    def worker_plans(self) -> list[dict[str, str]]:
        assert self.plans is not None, "plan() gives them before the sweep starts"
        return self.plans


def load(job_file: Path, overrides: list[str]) -> ResolvedJob:
    """The job with its [sweep] table, every value checked, before anything is recorded."""
    host = load_plugins()
    job = load_resolved(job_file, overrides, host)
    if job.sweep is None:
        raise RunjobError(
            f"{job_file}: has no [sweep] table: add one to say which job keys to try (see the README's [sweep] "
            "reference)"
        )
    check_values(job, host)
    if job.tracking.offline:
        raise RunjobError(
            "tracking.offline = true: `runjob sweep` records its trials under a parent MLflow run; sweep with "
            "tracking.offline = false"
        )
    make_sampler(import_optuna(job.sweep.method), job.sweep, 0)  # Optuna and the sampler's needs, installed
    return job


def sweep(job: ResolvedJob, order: SweepOrder) -> int:
    """Run ``order`` on the sweep of ``job`` (:func:`load`): a new sweep, a worker joining one
    (``--join``), or a stopped one continued (``--resume``). Exit 0 when at least one trial finished
    (a joining worker: when it ran its share), 1 when none did, 2 for a mistake in the job (a trial
    exiting with 2); a stop signal raises Terminated."""
    # lazy: `runjob validate` of a sweep job imports this module, which must not load mlflow
    import mlflow  # noqa: F401 - its import sets its loggers' handlers: the library log below goes after it

    with LibraryLog("command"):  # MLflow's INFO lines (a new store's tables) are not the user's
        if order.join:
            return _join(job, order)
        if order.resume:
            return _resume(job, order)
        return _new(job, order)


def plan(job: ResolvedJob, workers: int | None) -> list[dict[str, str]]:
    """What each worker here gets (its GPUs, its threads), checked against this machine before
    anything starts."""
    assert job.sweep is not None  # checked by load
    return plan_workers(workers, visible_gpus(), job.sweep.gpus_per_trial, job.launch.num_processes, cpu_cores())


def _new(job: ResolvedJob, order: SweepOrder, folder: Path | None = None) -> int:
    folder = folder or choose_output_dir(f"{job.job.name}-sweep", order.output_dir)
    if (folder / SWEEP_FILE).exists():
        raise RunjobError(
            f"--output-dir {folder}: this folder already holds a sweep ({SWEEP_FILE}): continue it with "
            f"--resume {folder}, add workers with --join {folder}, or choose another folder"
        )
    folder.mkdir(parents=True, exist_ok=True)
    owner = FileLock(folder / OWNER_LOCK)
    owner.acquire()
    with FileLock(folder / LOCK_FILE):
        # The workers start now, importing torch and the rest while this process records the parent
        # run: they wait for this lock before they open the sweep, which is created by then.
        workers = [_start_worker(job, order, folder, plan) for plan in order.worker_plans]
        try:
            study, parent = _create(job, order, folder)
        except BaseException:
            for child in workers:  # no sweep: gone before the lock is free, so none creates one
                child.kill()
                child.wait()
            raise
        _announce(job, order, study, parent.run_id)  # before a worker, free to go on, says a trial
    return _coordinate(job, order, study, parent, time.time(), workers=workers)


def _create(job: ResolvedJob, order: SweepOrder, folder: Path) -> tuple[SweepStudy, ParentRun]:
    """The sweep in ``folder``: its parent run, its study, ``sweep.json``. Under the folder's lock."""
    sweep = job.sweep
    assert sweep is not None
    name = sweep.study or f"{job.job.name}-{folder.resolve().name}"
    storage = storage_of(sweep, folder)
    params = sweep_params(sweep, budget_of(sweep), name, storage)
    tags = {**_parent_tags(job, order.overrides, folder), SWEEP_STUDY_TAG: name}
    parent = ParentRun.start(job, params, tags, folder)
    try:
        study = SweepStudy.create(sweep, folder, name)
    except BaseException as error:  # a study of that name already there, a storage refusing: no sweep
        parent.finish_unstarted(error)
        raise
    study.study.set_user_attr(PARENT_ATTR, parent.run_id)
    study.study.set_user_attr(SWEEP_DIR_ATTR, str(folder.resolve()))
    SweepInfo(name, redact_text(storage), parent.run_id, str(job.source.path.resolve()), params).write(folder)
    return study, parent


def _parent_tags(job: ResolvedJob, overrides: list[str], sweep_dir: Path) -> dict[str, str]:
    return {
        **redact_tables(dict(job.tracking.tags)),
        SWEEP_TAG: "true",
        VERSION_TAG: __version__,
        JOB_FILE_TAG: str(job.source.path.resolve()),
        OVERRIDES_TAG: " ".join(redact_override(o) for o in overrides),
        OUTPUT_DIR_TAG: str(sweep_dir.resolve()),
    }


def _open(job: ResolvedJob, folder: Path) -> tuple[SweepStudy, SweepInfo]:
    """The study of the sweep recorded in ``folder``; the job's sweep must be the recorded one."""
    sweep = job.sweep
    assert sweep is not None
    info = SweepInfo.read(folder)
    if info is None:
        raise RunjobError(f"{folder}: holds no sweep ({SWEEP_FILE}): start one with `runjob sweep {job.source.path}`")
    storage = info.storage
    if is_url(storage):  # recorded with its password hidden: the job's own [sweep] storage says it
        if not sweep.storage or not is_url(sweep.storage):
            raise RunjobError(
                f"{folder}: the sweep's study is in {storage}: give the storage URL with "
                "--set 'sweep.storage=\"...\"' (or [sweep] storage)"
            )
        storage = sweep.storage
    differs = same_sweep(info.sweep, sweep_params(sweep, budget_of(sweep), info.study, storage))
    if differs:
        key = differs[0]
        raise RunjobError(
            f"{key}: this job's value ({sweep_params(sweep, budget_of(sweep), info.study, storage).get(key)}) is not "
            f"the sweep's in {folder} ({info.sweep.get(key)}): a sweep's workers run one job; use the sweep's job "
            f"file ({info.job_file}) and --set flags"
        )
    return SweepStudy.load(sweep, folder, info.study, storage), info


def _where(job: ResolvedJob, target: str, output_dir: Path | None) -> Path:
    """The sweep folder ``--join`` / ``--resume`` names: a folder, a parent run id, or a storage URL."""
    if is_url(target):
        sweep = job.sweep
        assert sweep is not None
        if not sweep.study:
            raise RunjobError(
                f"--join {redact_text(target)}: name the study to join with [sweep] study "
                "(or --set 'sweep.study=\"...\"')"
            )
        optuna = import_optuna(sweep.method)
        try:
            study = optuna.load_study(study_name=sweep.study, storage=open_storage(optuna, target))
        except KeyError:
            raise RunjobError(f"sweep.study = {sweep.study!r}: no such study in that storage yet") from None
        recorded = study.user_attrs.get(SWEEP_DIR_ATTR)
        if output_dir is None and not recorded:
            raise RunjobError(f"sweep.study = {sweep.study!r}: its sweep folder is not recorded: give --output-dir")
        return output_dir or Path(recorded)
    if RUN_ID.match(target) and not Path(target).exists():
        try:
            run = connect(resolve_tracking_uri(job.tracking.uri)).get_run(target)
        except Exception as error:  # noqa: BLE001 - MLflow's not-found error has no public type
            raise RunjobError(f"--join {target}: no such MLflow run at the job's tracking.uri ({error})") from None
        if run.data.tags.get(SWEEP_TAG) != "true":
            raise RunjobError(f"--join {target}: not a sweep's parent run (no {SWEEP_TAG} tag)")
        return Path(run.data.tags[OUTPUT_DIR_TAG])
    return Path(target)


def _join(job: ResolvedJob, order: SweepOrder) -> int:
    """One more worker (or ``--workers`` more) on the sweep ``--join`` names; the first worker to
    reach an empty folder creates the sweep there and records it."""
    assert order.join is not None
    folder = _where(job, order.join, order.output_dir)
    if QUIET_ENVIRONMENT in os.environ and len(order.worker_plans) == 1:
        # a worker `runjob sweep` started here: import what its trials need while the sweep is created
        preload(order.worker_plans[0])
    folder.mkdir(parents=True, exist_ok=True)
    started = time.time()
    owner: FileLock | None = None
    with FileLock(folder / LOCK_FILE):
        if not (folder / SWEEP_FILE).exists():
            owner = FileLock(folder / OWNER_LOCK)
            owner.acquire()
            study, parent = _create(job, order, folder)
    if owner is not None:
        screen.each(f"runjob: created the sweep in {folder} (MLflow parent run {parent.run_id})")
        return _coordinate(job, order, study, parent, started, in_process=len(order.worker_plans) == 1)
    study, info = _open(job, folder)
    if len(order.worker_plans) > 1:
        return _coordinate(job, order, study, None, started, parent_run_id=info.parent_run_id)
    return _work_here(job, order, study, info.parent_run_id, started)


def _work_here(job: ResolvedJob, order: SweepOrder, study: SweepStudy, parent_run_id: str, started: float) -> int:
    """Run this process's share of the trials; then, when the sweep's owner is gone, record its end."""
    quiet = os.environ.get(QUIET_ENVIRONMENT) == "1"
    worker = Worker(study, job.source.path, list(order.overrides), parent_run_id, order.worker_plans[0], quiet=quiet)
    worker.command_line = order.command_line.main
    with Signals().active() as signals:
        outcomes = worker.run(signals)
        if signals.signum and QUIET_ENVIRONMENT in os.environ:  # one of the sweep's workers: it says so itself
            return 128 + signals.signum
        if signals.signum:
            raise Terminated(signals.signum)
    owner = FileLock(study.folder / OWNER_LOCK)
    if not owner.acquire(blocking=False):
        if QUIET_ENVIRONMENT in os.environ:  # one of this machine's workers: the sweep's own lines say it all
            return 0
        screen.each(f"runjob: sweep worker done: {len(outcomes)} trial(s) here; the sweep's owner records its end")
        return 0
    assert job.sweep is not None
    parent = ParentRun.reopen(study.folder, job.sweep.metric or "")
    screen.each(f"runjob: the sweep's owner is gone: this worker records its end (MLflow parent run {parent.run_id})")
    with Signals().active() as signals:
        _wait_elsewhere(study, parent, signals)
        return _finish(study, parent, started, signals, None, order.command_line.render)


def _resume(job: ResolvedJob, order: SweepOrder) -> int:
    """Continue the stopped sweep in ``--resume``'s folder (``auto``: ``--output-dir``'s, or a new one)."""
    if order.resume == "auto":
        if order.output_dir is None:
            raise RunjobError(
                "--resume auto needs --output-dir: the sweep's folder (a new sweep starts there when it holds none)"
            )
        if not (order.output_dir / SWEEP_FILE).exists():
            return _new(job, order, order.output_dir)
        folder = order.output_dir
    else:
        assert order.resume is not None
        folder = _where(job, order.resume, order.output_dir)
    owner = FileLock(folder / OWNER_LOCK)
    if (folder / SWEEP_FILE).exists() and not owner.acquire(blocking=False):
        raise RunjobError(
            f"--resume {folder}: the sweep there is still running (its owner holds {OWNER_LOCK}); add workers to it "
            f"with --join {folder}"
        )
    study, _ = _open(job, folder)
    if study.stopped():  # a trial's mistake stopped it: resuming says the job was put right
        screen.each(f"runjob: note: the sweep had stopped: {study.stopped()}; resuming it as asked")
        study.study.set_user_attr(STOPPED_ATTR, "")
    wait_for_previous(study)
    assert job.sweep is not None
    parent = ParentRun.reopen(folder, job.sweep.metric or "")
    screen.each(f"runjob: resuming the sweep in {folder} (MLflow parent run {parent.run_id})")
    return _coordinate(job, order, study, parent, time.time())


def _coordinate(
    job: ResolvedJob,
    order: SweepOrder,
    study: SweepStudy,
    parent: ParentRun | None,
    started: float,
    *,
    in_process: bool = False,
    parent_run_id: str | None = None,
    workers: list[Child] | None = None,
) -> int:
    """Run the workers (here, or ``--workers`` processes), log the parent run as trials finish,
    wait for other machines' running trials, then record the end. ``parent`` None: not the owner;
    ``workers``: the worker processes already started, the sweep announced (:func:`_new`)."""
    sweep = job.sweep
    assert sweep is not None
    run_id = parent.run_id if parent is not None else parent_run_id
    assert run_id is not None
    if workers is None:
        _announce(job, order, study, run_id)
    code: int | None = None
    plans = order.worker_plans
    with Signals().active() as signals:
        try:
            if in_process:
                worker = Worker(study, job.source.path, list(order.overrides), run_id, environment=plans[0])
                worker.command_line = order.command_line.main
                if parent is not None:
                    worker.after_trial = lambda outcome: parent.progress(study)
                worker.run(signals)
            else:
                code = _run_workers(job, order, study, parent, plans, signals, workers)
        except RunjobError as mistake:
            if parent is None:
                raise
            screen.each(f"runjob: {mistake}", err=True)
            code = USER_MISTAKE_EXIT
        if parent is None:
            if signals.signum:
                raise Terminated(signals.signum)
            return 0 if code in (None, 0) else code
        if not signals.signum and code is None:
            _wait_elsewhere(study, parent, signals)
        return _finish(study, parent, started, signals, code, order.command_line.render)


def _announce(job: ResolvedJob, order: SweepOrder, study: SweepStudy, run_id: str) -> None:
    """The sweep's first line: its trials, its method, its workers here, where it is recorded."""
    sweep = job.sweep
    assert sweep is not None
    plans = order.worker_plans
    devices = ", ".join(plan["CUDA_VISIBLE_DEVICES"] or "CPU" for plan in plans if "CUDA_VISIBLE_DEVICES" in plan)
    threads = plans[0].get("OMP_NUM_THREADS")
    how = f"GPUs {devices}" if devices and "CPU" not in devices else f"{threads} thread(s) each" if threads else ""
    screen.each(
        f"runjob: sweep of {study.budget} trial(s), {sweep.method}, {sweep.direction} {sweep.metric}"
        + (f", pruner {sweep.pruner.name}" if sweep.pruner.name != "none" else "")
        + f": {len(plans)} worker(s) here"
        + (f" ({how})" if how else "")
        + f"; output in {study.folder}, MLflow parent run {run_id}; study {study.study.study_name!r} in "
        + f"{redact_text(study.storage)}"
    )


def _run_workers(
    job: ResolvedJob,
    order: SweepOrder,
    study: SweepStudy,
    parent: ParentRun | None,
    plans: list[dict[str, str]],
    signals: Signals,
    started: list[Child] | None = None,
) -> int | None:
    """``len(plans)`` worker processes (``started``: those already running), each ``runjob sweep
    JOB --join FOLDER`` with its devices; the parent logged as their trials finish. A worker that
    dies (a crash, SIGKILL) leaves its trial interrupted: another is started in its place while
    trials are left, at most 3 times a slot. Returns 2 when a worker stopped the sweep for a
    mistake in the job, else None."""

    def start(plan: dict[str, str]) -> Child:
        child = _start_worker(job, order, study.folder, plan)
        signals.watch(child)
        return child

    children = started or [_start_worker(job, order, study.folder, plan) for plan in plans]
    for child in children:
        signals.watch(child)
    restarts = [0] * len(plans)
    mistake = False
    while True:
        if parent is not None:
            parent.progress(study)
        for slot, child in enumerate(children):
            code = child.poll()
            if code in (None, 0) or signals.signum:
                continue
            mistake = mistake or code == USER_MISTAKE_EXIT
            if mistake or restarts[slot] >= 3 or study.stopped() or not (study.interrupted() or _budget_left(study)):
                continue
            restarts[slot] += 1
            said = f"code {code}" if code > 0 else f"signal {-code}"
            screen.each(f"runjob: warning: sweep worker {slot + 1} ended with {said}; starting another", err=True)
            children[slot] = start(plans[slot])
        if all(child.poll() is not None for child in children):
            dead = [c.returncode not in (0, USER_MISTAKE_EXIT) for c in children]
            dying = any(dead) and not (mistake or signals.signum) and study.running_elsewhere()
            if not dying:  # else a killed worker's trial is still checkpointing: then its slot takes it over
                break
        time.sleep(1.0)
    return USER_MISTAKE_EXIT if mistake and not signals.signum else None


def _start_worker(job: ResolvedJob, order: SweepOrder, folder: Path, plan: dict[str, str]) -> Child:
    """A worker process on this machine: ``runjob sweep JOB --join FOLDER`` with its devices or threads."""
    command = [sys.executable, "-m", "runjob", "sweep", str(job.source.path), "--join", str(folder)]
    command += [part for text in order.overrides for part in ("--set", text)]
    # their trials' output to the trials' folders when several share the terminal
    quiet = {QUIET_ENVIRONMENT: "1" if len(order.worker_plans) > 1 else "0"}
    return start_child(command, {**os.environ, **plan, **quiet})


def _budget_left(study: SweepStudy) -> bool:
    started: int = sum(t.state != study.states.WAITING for t in study.trials())
    return started < study.budget


def _wait_elsewhere(study: SweepStudy, parent: ParentRun, signals: Signals) -> None:
    """Trials other machines still run: wait for them, logging each as it finishes."""
    said = False
    while not signals.signum:
        running = study.running_elsewhere()
        if not running:
            return
        if not said:
            screen.each(f"runjob: waiting for trial(s) {', '.join(map(str, running))} running on other workers")
            said = True
        parent.progress(study)
        time.sleep(2.0)


def _finish(
    study: SweepStudy, parent: ParentRun, started: float, signals: Signals, code: int | None, render: Render
) -> int:
    """Record the sweep's end on the parent run and print the summary; the exit code."""
    states = study.states
    trials = study.trials()
    signum = signals.signum
    stopped = bool(signum)
    if stopped:
        status = "KILLED"
    elif code == USER_MISTAKE_EXIT or study.stopped():
        status = "FAILED"
    else:
        status = "FINISHED" if any(t.state == states.COMPLETE for t in trials) else "FAILED"
    error = (
        Terminated(signum) if signum else RunjobError(study.study.user_attrs[STOPPED_ATTR]) if study.stopped() else None
    )
    parent.finish(study, status, error)
    print_summary(study, started, render, stopped)
    if stopped:
        screen.each(
            f"runjob: the sweep stopped; continue it with `{_sweep_said()} {_job_said(study)} --resume {study.folder}`"
        )
        assert signum is not None
        raise Terminated(signum)
    if status == "FAILED" and (code == USER_MISTAKE_EXIT or study.stopped()):
        return USER_MISTAKE_EXIT
    return 0 if status == "FINISHED" else 1


def _sweep_said() -> str:
    """``runjob sweep``, started as this command was (``uv run runjob sweep``...), for pasting."""
    return shlex.join([*command_prefix(), "sweep"])


def _job_said(study: SweepStudy) -> str:
    info = SweepInfo.read(study.folder)
    return shlex.quote(info.job_file) if info else "JOB"


def print_summary(study: SweepStudy, started: float, render: Render, stopped: bool = False) -> None:
    """How many trials finished, were pruned, failed, are interrupted; a table of them, the best
    marked ``*`` with its ``--set`` flags; the wall time and, when trials overlapped, how many ran at
    once on average."""
    rows = trial_rows(study)
    if not rows:
        return
    best = best_trial(study)
    metric = study.sweep.metric or ""
    counts = {
        state: sum(row["state"] == state for row in rows) for state in ("finished", "pruned", "failed", "interrupted")
    }
    said = ", ".join(f"{count} {state}" for state, count in counts.items() if count or state == "finished")
    trials = study.trials()
    starts = [t.datetime_start.timestamp() for t in trials if t.datetime_start is not None]
    wall = time.time() - min([started, *starts])  # a resumed sweep's too: since its first trial began
    busy = sum(row["seconds"] or 0.0 for row in rows)
    spans = [(t.datetime_start, t.datetime_complete) for t in trials if t.datetime_start and t.datetime_complete]
    at_once = max((sum(a <= start < b for a, b in spans) for start, _ in spans), default=0)
    speed = f"; {busy / wall:.2f} trials at once on average" if at_once > 1 and wall > 0 else ""
    screen.each(f"runjob: sweep: {said} of {study.budget} trial(s) in {_clock(wall)}{speed}")
    keys = list(study.sweep.parameters)
    table = []
    for row in rows:
        cells = [f"{v:.4g}" if isinstance(v, float) else toml_value(v) for v in row["values"].values()]
        value = "" if row["value"] is None else f"{row['value']:.4f}"
        mark = "* " if best is not None and row["trial"] == best.number else "  "
        table.append([mark + str(row["trial"]), row["state"], value, *cells, row["run_id"] or ""])
    for line in render(["  trial", "state", metric, *keys, "run"], table, indent="  "):
        screen.each(line)
    if best is not None:
        flags = " ".join(f"--set {shlex.quote(text)}" for text in overrides_of(study, best))
        run = best.user_attrs.get(RUN_ID_ATTR, "")
        screen.each(f"runjob: best: trial {best.number}, {metric} {best.value:.4f} (run {run}): {flags}")
    for row in rows:
        if row.get("unsynced"):
            screen.each(f"runjob: warning: trial {row['trial']}: {row['unsynced']}")
    if counts["interrupted"] and not stopped:  # a stopped sweep says how to go on anyway
        screen.each(
            f"runjob: {counts['interrupted']} trial(s) interrupted: `{_sweep_said()} {_job_said(study)} --resume "
            f"{study.folder}` resumes them"
        )
    sys.stdout.flush()


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
