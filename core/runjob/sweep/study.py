"""The sweep's state: one Optuna study in durable storage, shared by every worker.

A sweep folder holds ``sweep.json`` (which study, where, the parent MLflow run), by default the
study itself (``study.journal``, Optuna's journal file, safe on a shared filesystem) and one
folder per trial (``trial-NNN``, NNN the Optuna trial number). Workers take trials under the
folder's lock file, so two never take the same one and the budget is never overshot; a trial's own
lock file is held by its worker and its ``runjob run`` for as long as either lives, so a trial whose
lock is free was interrupted (a signal, a crash, SIGKILL) and the next worker resumes it in its
folder from its checkpoint. Optuna and the lock files are the whole mechanism: nothing else keeps
state.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, cast

from runjob.errors import RunjobError, describe
from runjob.job.redaction import redact_text
from runjob.job.schema import SWEEP_TABLE, SweepPruner, SweepRange, SweepTable
from runjob.sweep.sweep_folder import STUDY_FILE, SWEEP_FILE, TRIAL_LOCK, trial_name
from runjob.tags import OUTPUT_DIR_ATTR, STOPPED_ATTR, WORKER_ATTR, WORKERS_ATTR

if TYPE_CHECKING:  # Optuna is imported when a sweep needs it
    from types import ModuleType

    import optuna
    from optuna.distributions import BaseDistribution, CategoricalChoiceType
    from optuna.pruners import BasePruner
    from optuna.samplers import BaseSampler
    from optuna.storages import BaseStorage

    from runjob.host.json_types import JSONValue

Parameters: TypeAlias = "Mapping[str, list[JSONValue] | SweepRange]"
"""``[sweep] parameters``: each swept job key's list of values or range."""

# --- Optuna, its storages and pruners (Optuna imported only when a sweep needs it) -------------------


def import_optuna(method: str) -> ModuleType:
    """Optuna, or a RunjobError saying how to install it."""
    try:
        # lazy: the training process imports runjob.sweep.study (trials): optuna only when a study is opened
        import optuna
    except ImportError:
        raise RunjobError(
            f"{SWEEP_TABLE}.method = \"{method}\" needs Optuna: pip install 'runjob-train[sweep]'"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # runjob prints its own line per trial
    return optuna


def is_url(storage: str) -> bool:
    return "://" in storage


def open_storage(optuna: ModuleType, storage: str) -> BaseStorage:
    """Optuna's storage for ``storage``: an RDB storage for a URL, a journal file otherwise."""
    try:
        if is_url(storage):
            return cast("BaseStorage", optuna.storages.RDBStorage(storage))
        # lazy: the training process imports runjob.sweep.study (trials): optuna only when a study is opened
        from optuna.storages.journal import JournalFileBackend

        return cast("BaseStorage", optuna.storages.JournalStorage(JournalFileBackend(storage)))
    except Exception as error:  # noqa: BLE001 - a driver missing, a server down, a bad URL: one line
        raise RunjobError(
            f"{SWEEP_TABLE}.storage = {redact_text(storage)!r}: Optuna cannot open it: {describe(error)}"
        ) from None


def make_pruner(optuna: ModuleType, pruner: SweepPruner) -> BasePruner:
    """Optuna's pruner named ``pruner.name`` with the job's options (``none``: never prunes)."""
    pruners = optuna.pruners
    made = {
        "none": pruners.NopPruner,
        "median": pruners.MedianPruner,
        "successive_halving": pruners.SuccessiveHalvingPruner,
        "hyperband": pruners.HyperbandPruner,
    }[pruner.name]
    return cast("BasePruner", made(**pruner.options()))


class FileLock:
    """An exclusive ``flock`` on ``path`` (made when missing). Held by an open file, so a process
    that dies for any reason lets go, and a child given the file (``pass_fds``) holds it too.

    Not the ``filelock`` library (checked with 4.3.1): its ``os.register_at_fork`` hook closes the
    inherited descriptor in a forked child, so a trial forked from its worker (``ForkedTrial``) would
    not hold its trial's lock, and another worker could resume the trial while the orphan, its
    worker killed, still writes its checkpoint; its ``release`` unlocks (``LOCK_UN``) the open file
    a ``pass_fds`` child shares before closing it, so the child would lose the lock too; the
    descriptor to pass is private (``_context.lock_file_fd``); and where ``flock`` is missing it
    falls back by default to a marker file that a killed process leaves behind."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def acquire(self, blocking: bool = True) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @classmethod
    def held_elsewhere(cls, path: Path) -> bool:
        """Whether another process holds the lock on ``path`` (False when the file is missing)."""
        if not path.exists():
            return False
        lock = cls(path)
        if lock.acquire(blocking=False):
            lock.release()
            return False
        return True


def this_worker() -> str:
    return f"{socket.gethostname()} {os.getpid()}"


# --- the sweep's identity ---------------------------------------------------------------------


@dataclass
class SweepInfo:
    """``sweep.json``: what a worker needs to join the sweep in this folder."""

    study: str
    storage: str  # the journal file's path, or the storage URL with its password hidden
    parent_run_id: str
    job_file: str
    sweep: dict[str, str]  # the sweep's settings as the parent run's params: a joiner's must match

    def write(self, folder: Path) -> None:
        path = folder / SWEEP_FILE
        partial = path.with_suffix(".json.partial")
        partial.write_text(json.dumps(self.__dict__, indent=1) + "\n", encoding="utf-8")
        partial.replace(path)

    @classmethod
    def read(cls, folder: Path) -> SweepInfo | None:
        path = folder / SWEEP_FILE
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(**{key: data[key] for key in ("study", "storage", "parent_run_id", "job_file", "sweep")})
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise RunjobError(f"{path}: not a runjob sweep record ({describe(error)})") from None


def storage_of(sweep: SweepTable, folder: Path) -> str:
    """The study's storage: ``[sweep] storage`` (a URL, or a journal file relative to the working
    directory), else ``study.journal`` in the sweep folder; journal paths absolute."""
    if sweep.storage and is_url(sweep.storage):
        return sweep.storage
    return str(Path(sweep.storage).resolve() if sweep.storage else (folder / STUDY_FILE).resolve())


# --- samplers, pruners and the parameters' distributions ------------------------------------------


def make_sampler(optuna: ModuleType, sweep: SweepTable, worker: int) -> BaseSampler:
    """The sampler for ``sweep.method``, seeded ``seed + worker`` so workers draw different points."""
    seed = sweep.seed + worker
    samplers = optuna.samplers
    if sweep.method == "grid":
        grid = {key: choices(spec) for key, spec in sweep.parameters.items() if isinstance(spec, list)}
        if len(grid) < len(sweep.parameters):  # validate refuses a range in a grid sweep before this
            raise RunjobError(f"{SWEEP_TABLE}: a grid sweep takes a list of values for every key, not a range")
        return cast("BaseSampler", samplers.GridSampler(grid, seed=seed))
    if sweep.method == "random":
        return cast("BaseSampler", samplers.RandomSampler(seed=seed))
    if sweep.method == "tpe":  # constant_liar: running trials count as bad, so workers spread out
        return cast("BaseSampler", samplers.TPESampler(seed=seed, constant_liar=True))
    needs = {"cmaes": "cmaes", "gp": "scipy"}[sweep.method]
    try:
        __import__(needs)
    except ImportError:
        raise RunjobError(
            f"{SWEEP_TABLE}.method = \"{sweep.method}\" needs {needs}: pip install 'runjob-train[sweep]'"
        ) from None
    if sweep.method == "cmaes":
        return cast("BaseSampler", samplers.CmaEsSampler(seed=seed))
    return cast("BaseSampler", samplers.GPSampler(seed=seed))


def choices(spec: Sequence[object]) -> list[CategoricalChoiceType]:
    """A list of values as Optuna stores it: the values themselves when Optuna can (numbers,
    strings, booleans), else their positions (an array or a table as a choice)."""
    if all(value is None or isinstance(value, (str, int, float, bool)) for value in spec):
        return cast("list[CategoricalChoiceType]", list(spec))
    return list(range(len(spec)))


def distributions(optuna: ModuleType, parameters: Parameters) -> dict[str, BaseDistribution]:
    made: dict[str, BaseDistribution] = {}
    for key, spec in parameters.items():
        if isinstance(spec, list):
            made[key] = optuna.distributions.CategoricalDistribution(choices(spec))
        elif spec.integer:
            made[key] = optuna.distributions.IntDistribution(int(spec.low), int(spec.high), log=spec.log)
        else:
            made[key] = optuna.distributions.FloatDistribution(float(spec.low), float(spec.high), log=spec.log)
    return made


def job_values(parameters: Parameters, params: Mapping[str, object]) -> dict[str, object]:
    """An Optuna trial's params as the job values they stand for."""
    values: dict[str, object] = {}
    for key, spec in parameters.items():
        value = params[key]
        values[key] = spec[cast(int, value)] if isinstance(spec, list) and choices(spec) != spec else value
    return values


def optuna_params(parameters: Parameters, values: Mapping[str, object]) -> dict[str, object]:
    """Job values as an Optuna trial's params (the inverse of :func:`job_values`)."""
    params: dict[str, object] = {}
    for key, value in values.items():
        spec = parameters[key]
        params[key] = (
            spec.index(cast("JSONValue", value)) if isinstance(spec, list) and choices(spec) != spec else value
        )
    return params


def grid_points(parameters: Parameters) -> list[dict[str, object]]:
    """Every combination of the listed values, the last key varying fastest."""
    keys = list(parameters)
    lists = [spec for spec in parameters.values() if isinstance(spec, list)]
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*lists)]


def budget_of(sweep: SweepTable) -> int:
    """How many trials the sweep runs: ``trials``, or every combination of a grid."""
    if sweep.method == "grid":
        return len(grid_points(sweep.parameters))
    assert sweep.trials is not None, "validation requires trials for every method but grid"
    return sweep.trials


# --- the study ------------------------------------------------------------------------------------


@dataclass
class Claim:
    """A trial a worker took: its number, job values, folder, and the trial lock it holds."""

    number: int
    values: dict[str, object]
    output_dir: Path
    lock: FileLock
    resumed: bool


class SweepStudy:
    """The Optuna study of one sweep, as its workers and its owner use it."""

    def __init__(
        self,
        optuna: ModuleType,
        study: optuna.Study,
        sweep: SweepTable,
        folder: Path,
        storage: str,
        backend: BaseStorage,
    ) -> None:
        self.optuna = optuna
        self.study = study
        self.backend = backend
        """The Optuna storage the study was opened on: trials' user attributes are written through its
        public API (``set_trial_user_attr``), trials found by number (``get_trial_id_from_study_id_trial_number``)."""
        self.study_id = backend.get_study_id_from_name(study.study_name)
        self.sweep = sweep
        self.folder = folder
        self.storage = storage
        self.budget = budget_of(sweep)
        self.states = optuna.trial.TrialState
        self.distributions = distributions(optuna, sweep.parameters)

    @classmethod
    def create(cls, sweep: SweepTable, folder: Path, name: str) -> SweepStudy:
        """A new study named ``name``; a grid's points queued in order, so workers take one each."""
        optuna = import_optuna(sweep.method)
        folder.mkdir(parents=True, exist_ok=True)
        storage = storage_of(sweep, folder)
        backend = open_storage(optuna, storage)
        try:
            study = optuna.create_study(
                study_name=name,
                storage=backend,
                sampler=make_sampler(optuna, sweep, 0),
                pruner=make_pruner(optuna, sweep.pruner),
                direction=sweep.direction,
            )
        except optuna.exceptions.DuplicatedStudyError:
            raise RunjobError(
                f"{SWEEP_TABLE}.study = {name!r}: the storage {redact_text(storage)} already holds a study of that "
                "name; join it with `runjob sweep JOB --join ...` or name another"
            ) from None
        if sweep.method == "grid":
            for point in grid_points(sweep.parameters):
                study.enqueue_trial(optuna_params(sweep.parameters, point))
        study.set_user_attr(WORKERS_ATTR, 0)
        return cls(optuna, study, sweep, folder, storage, backend)

    @classmethod
    def load(cls, sweep: SweepTable, folder: Path, name: str, storage: str) -> SweepStudy:
        optuna = import_optuna(sweep.method)
        opened = open_storage(optuna, storage)
        try:
            study = optuna.load_study(study_name=name, storage=opened, pruner=make_pruner(optuna, sweep.pruner))
        except KeyError:
            raise RunjobError(f"no study {name!r} in the Optuna storage {redact_text(storage)}") from None
        return cls(optuna, study, sweep, folder, storage, opened)

    def join(self) -> int:
        """Count this worker in (under the folder lock) and give it its sampler; its number."""
        number = int(self.study.user_attrs.get(WORKERS_ATTR, 0))
        self.study.set_user_attr(WORKERS_ATTR, number + 1)
        self.study.sampler = make_sampler(self.optuna, self.sweep, number)
        return number

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        return list(self.study.get_trials(deepcopy=False))

    def stopped(self) -> str | None:
        stopped = self.study.user_attrs.get(STOPPED_ATTR)
        return None if stopped is None else str(stopped)

    def claim(self) -> Claim | None:
        """Take the next trial: an interrupted one first (resumed in its folder), else a new one
        while the budget lasts; None when there is nothing left. Call it under the folder lock."""
        if self.stopped():
            return None
        trials = self.trials()
        for trial in trials:
            if trial.state == self.states.RUNNING and OUTPUT_DIR_ATTR in trial.user_attrs:
                folder = Path(trial.user_attrs[OUTPUT_DIR_ATTR])
                lock = FileLock(folder / TRIAL_LOCK)
                if folder.is_dir() and lock.acquire(blocking=False):
                    self.mark(trial.number, {WORKER_ATTR: this_worker()})
                    values = job_values(self.sweep.parameters, trial.params)
                    return Claim(trial.number, values, folder, lock, resumed=True)
        if sum(trial.state != self.states.WAITING for trial in trials) >= self.budget:
            return None
        asked = self.study.ask(self.distributions)
        folder = self.folder / trial_name(asked.number)
        for key, value in {OUTPUT_DIR_ATTR: str(folder.resolve()), WORKER_ATTR: this_worker()}.items():
            asked.set_user_attr(key, value)
        folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(folder / TRIAL_LOCK)
        lock.acquire()
        return Claim(asked.number, job_values(self.sweep.parameters, asked.params), folder, lock, resumed=False)

    def mark(self, number: int, attrs: Mapping[str, object]) -> None:
        """Set trial ``number``'s user attributes (through the storage's public API: the trial may be
        another worker's, or finished)."""
        trial_id = self.backend.get_trial_id_from_study_id_trial_number(self.study_id, number)
        for key, value in attrs.items():
            self.backend.set_trial_user_attr(trial_id, key, value)

    def tell(self, number: int, value: float | None, state: str) -> None:
        """Record trial ``number``'s end: ``complete`` (with ``value``), ``pruned`` or ``fail``."""
        states = {"complete": self.states.COMPLETE, "pruned": self.states.PRUNED, "fail": self.states.FAIL}
        self.study.tell(number, value if state == "complete" else None, state=states[state])

    def running_elsewhere(self) -> list[int]:
        """Trials a live process is running (their lock held), here or on another machine."""
        return [
            t.number
            for t in self.trials()
            if t.state == self.states.RUNNING
            and OUTPUT_DIR_ATTR in t.user_attrs
            and FileLock.held_elsewhere(Path(t.user_attrs[OUTPUT_DIR_ATTR]) / TRIAL_LOCK)
        ]

    def interrupted(self) -> list[int]:
        """Trials left RUNNING by a stopped or killed worker: resumed by the next worker."""
        running = set(self.running_elsewhere())
        return [t.number for t in self.trials() if t.state == self.states.RUNNING and t.number not in running]
