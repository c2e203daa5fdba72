"""The one writer of runs to MLflow: a run's creation, params (100 a call), tags, metric points
(1,000 a call), dataset inputs, artifacts, the logged model, its end.

Every writer of a run goes through :class:`RunWriter`: the recording process
(:mod:`runjob.record.mirror`, through the :class:`Uploader` thread), ``runjob sync``
(:mod:`runjob.record.sync`), a failed or abandoned run's closing (:func:`close_failed_run`,
:func:`close_abandoned_run`), and the runs commands record (an evaluation, a sweep's parent:
:mod:`runjob.record.command_run`). Each of them writes the local record first, so what MLflow
misses ``runjob sync`` sends later. MLflow is imported only when a run is written.
"""

from __future__ import annotations

import functools
import math
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Literal, TypeVar, cast

from runjob.errors import TrackingError, describe
from runjob.host.output import screen
from runjob.record.invocation import pasteable
from runjob.record.local import RunRecord, now_ms, read_metric_points
from runjob.record.logfile import note
from runjob.record.messages import Point
from runjob.record.model_logging import MODEL_FOLDER
from runjob.record.naming import headline_first, headline_metrics
from runjob.record.uri import bound_http_retries
from runjob.tags import ABANDONED_TAG, DATASET_CONTEXT_TAG, ERROR_TAG, WORKER_FAILURE_TAG

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Metric

_T = TypeVar("_T")

PARAMS_PER_CALL = 100  # MLflow's limit for one log_batch's params (and tags)
METRICS_PER_CALL = 1000  # MLflow's limit for one log_batch's metrics
MODEL_ARTIFACT = "model"  # a run's logged model's name when none is given (before models were named after their job)
FINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")


def connect(uri: str | None) -> MlflowClient:
    """An ``MlflowClient`` for ``uri`` (None: MLflow's default), MLflow's HTTP retries bounded
    (``uri.HTTP_DEFAULTS``)."""
    # lazy: the training process imports this module and never imports mlflow (record.mirror)
    from mlflow import MlflowClient

    bound_http_retries()
    return MlflowClient(tracking_uri=uri)


def experiment_id(client: MlflowClient, name: str) -> str:
    """The id of experiment ``name``, created when missing (another process may create it first)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            raise TrackingError(
                f"MLflow experiment {name!r} is deleted; restore it (mlflow experiments restore) or choose another "
                "tracking.experiment"
            )
        return str(experiment.experiment_id)
    try:
        return client.create_experiment(name)
    except Exception:  # noqa: BLE001 - lost a race with another process: read theirs
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return str(experiment.experiment_id)


class RunWriter:
    """One MLflow run, written: every call a run's record makes, with MLflow's limits kept."""

    def __init__(self, client: MlflowClient, run_id: str) -> None:
        self.client = client
        self.run_id = run_id

    @classmethod
    def create(
        cls, client: MlflowClient, experiment: str, run_name: str, tags: dict[str, str], start_time: int | None = None
    ) -> RunWriter:
        """A new run in experiment ``experiment`` (created when missing), with ``tags``."""
        run = client.create_run(experiment_id(client, experiment), start_time=start_time, tags=tags, run_name=run_name)
        return cls(client, str(run.info.run_id))

    def experiment_id(self) -> str:
        return str(self.client.get_run(self.run_id).info.experiment_id)

    def status(self) -> str:
        return str(self.client.get_run(self.run_id).info.status)

    def reopen(self) -> None:
        """A resumed run: RUNNING again."""
        self.client.update_run(self.run_id, status="RUNNING")

    def params(self, params: dict[str, str]) -> int:
        """Log ``params``, 100 a call; returns how many."""
        # lazy: the training process imports this module and never imports mlflow (record.mirror)
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for first in range(0, len(items), PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=items[first : first + PARAMS_PER_CALL])
        return len(items)

    def tags(self, tags: dict[str, str]) -> int:
        """Set ``tags``, 100 a call; returns how many."""
        # lazy: the training process imports this module and never imports mlflow (record.mirror)
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)) for k, v in tags.items()]
        for first in range(0, len(items), PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, tags=items[first : first + PARAMS_PER_CALL])
        return len(items)

    def metrics(self, points: Iterable[Point]) -> int:
        """Log metric ``points`` in order, 1,000 a call; returns how many."""
        items = metric_entities(points)
        for first in range(0, len(items), METRICS_PER_CALL):
            self.client.log_batch(self.run_id, metrics=items[first : first + METRICS_PER_CALL])
        return len(items)

    def inputs(self, entries: list[dict[str, str]]) -> None:
        log_inputs(self.client, self.run_id, entries)

    def artifact(self, path: Path, artifact_path: str | None) -> None:
        upload_artifact(self.client, self.run_id, path, artifact_path)

    def terminate(self, status: str, end_time: int | None = None) -> None:
        self.client.set_terminated(self.run_id, status, end_time)

    def missing_points(self, points: list[Point]) -> list[Point]:
        """The ``points`` this run does not have, in their order: a point is the same one when its
        key, step, timestamp and value are."""

        def same(p: Point | Metric) -> tuple[str, int, int, float | str]:
            value = float(p.value)
            return p.key, int(p.step), int(p.timestamp), "nan" if math.isnan(value) else value

        present: set[tuple[str, int, int, float | str]] = set()
        for key in dict.fromkeys(p.key for p in points):
            present.update(same(m) for m in self.client.get_metric_history(self.run_id, key))
        return [p for p in points if same(p) not in present]

    def send_record(self, output_dir: Path, record: RunRecord, catching_up: bool = False) -> dict[str, int]:
        """Send this run what the local record in ``output_dir`` holds and it lacks: params, tags,
        dataset inputs (MLflow keeps one copy of each), the metric points it does not have (the
        headline metrics first: mlflow ui's compare view opens on a run's first metric), the
        artifacts. ``catching_up``: a resumed run's recording process making up for the points its
        killed predecessor had not sent; it leaves out the MLflow model (the resumed run logs its
        own). The artifacts are sent again whole (MLflow cannot say whether its copy is the latest:
        a best model re-logged under one name keeps its size). Returns how many of each were sent."""
        params = self.params(record.params)
        tags = self.tags(record.tags)
        if record.inputs:
            self.inputs(record.inputs)
        local = headline_first(read_metric_points(output_dir), headline_metrics(record.params, record.tags))
        metrics = self.metrics(self.missing_points([Point.of(p) for p in local]))
        artifacts = [a for a in record.artifacts if (output_dir / str(a["path"])).exists()]
        if catching_up:
            artifacts = [a for a in artifacts if a["path"] != MODEL_FOLDER]
        for artifact in artifacts:
            self.artifact(output_dir / str(artifact["path"]), artifact["artifact_path"])
        return {"params": params, "tags": tags, "metrics": metrics, "artifacts": len(artifacts)}


def metric_entities(points: Iterable[Point]) -> list[Metric]:
    """MLflow ``Metric``\\ s of ``points``."""
    # lazy: the training process imports this module and never imports mlflow (record.mirror)
    from mlflow.entities import Metric

    return [Metric(p.key, float(p.value), int(p.timestamp), int(p.step)) for p in points]


def upload_artifact(client: MlflowClient, run_id: str, path: Path, artifact_path: str | None) -> None:
    """Upload a file or a folder's contents as an artifact of ``run_id``; the run's MLflow model
    folder (``mlflow_model``) becomes the run's logged model instead, named ``artifact_path``
    (:func:`log_logged_model`)."""
    if (path / "MLmodel").is_file() and (path.name == MODEL_FOLDER or artifact_path == MODEL_ARTIFACT):
        log_logged_model(client, run_id, path, artifact_path or MODEL_ARTIFACT)
        return
    if path.is_dir():
        client.log_artifacts(run_id, str(path), artifact_path)
    else:
        client.log_artifact(run_id, str(path), artifact_path)


def log_logged_model(client: MlflowClient, run_id: str, folder: Path, name: str = MODEL_ARTIFACT) -> str:
    """The MLflow model in ``folder`` as a logged model called ``name`` (the job's name) of
    ``run_id``: MLflow 3 lists it under the run's models (and the experiment's Models tab), and
    ``runs:/ID/<name>`` loads it. Its files are stored once, in the model's own artifact location.
    A run that has one already (``runjob sync`` again) keeps it; one left PENDING by an earlier try
    that failed half-way (a retried write) is completed. Returns the model id."""
    # lazy: the training process imports this module and never imports mlflow (record.mirror)
    from mlflow.entities import LoggedModelOutput

    experiment = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models(
        [experiment], filter_string=f"source_run_id = '{run_id}' AND name = '{name}'", max_results=1
    )
    if found and str(found[0].status) == "READY":
        return found[0].model_id
    model = found[0] if found else None
    model = model or client.create_logged_model(experiment, name=name, source_run_id=run_id, model_type="pytorch")
    client.log_model_artifacts(model.model_id, str(folder))
    client.finalize_logged_model(model.model_id, "READY")
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, 0)])
    return model.model_id


def log_inputs(client: MlflowClient, run_id: str, entries: list[dict[str, str]]) -> None:
    """Log recorded dataset lineage entries as MLflow dataset inputs."""
    # lazy: the training process imports this module and never imports mlflow (record.mirror)
    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = [
        DatasetInput(
            Dataset(
                name=e["name"],
                digest=e["digest"],
                source_type=e["source_type"],
                source=e["source"],
                profile=e.get("profile"),
            ),
            tags=[InputTag(DATASET_CONTEXT_TAG, e["context"])],
        )
        for e in entries
    ]
    client.log_inputs(run_id, datasets=inputs)


RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0)
"""The waits before each new try of a failed MLflow write (15.5 s in all, six tries): a sqlite store
locked by another run's write, a server's 5xx while it restarts, a dataset row two runs insert at
once. MLflow's own HTTP retries (``uri.HTTP_DEFAULTS``) come inside each try."""
UNREACHABLE_TRIES = 3
"""Tries of a write that gets no answer at all (each with MLflow's own HTTP retries inside): a
server that is restarting comes back within them; one that does not is gone."""
UNREACHABLE_AFTER = 3
"""Writes in a row that fail every try: the store is taken as gone, and the rest is left to
``runjob sync`` (each later write would wait through its retries too)."""

# Another process inserted the same row first (two runs logging one dataset at once); the write's
# transaction was rolled back, and its next try finds the row and succeeds.
_DUPLICATE = re.compile(
    r"UNIQUE constraint failed|duplicate key value violates unique constraint|RESOURCE_ALREADY_EXISTS", re.I
)
# No answer from the store at all: retried like the rest, then taken as the store being gone.
_UNREACHABLE = re.compile(
    r"Connection refused|Max retries exceeded|Failed to establish a new connection|Name or service not known"
    r"|Read timed out|Connection aborted|RemoteDisconnected|unable to open database file",
    re.I,
)
# MLflow's answers that another try cannot change: the write is skipped, the rest still sent.
_REFUSED = {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "PERMISSION_DENIED", "UNAUTHENTICATED"}


def is_duplicate(error: BaseException) -> bool:
    """Whether ``error`` is a store refusing a row another writer inserted first."""
    return bool(_DUPLICATE.search(str(error)))


def is_unreachable(error: BaseException) -> bool:
    """Whether ``error`` says the store did not answer (as opposed to refusing the write)."""
    return isinstance(error, ConnectionError | TimeoutError) or bool(_UNREACHABLE.search(str(error)))


def is_refused(error: BaseException) -> bool:
    """Whether MLflow refused the write for a reason another try cannot change (a bad value)."""
    return getattr(error, "error_code", None) in _REFUSED and not is_duplicate(error)


@dataclass
class Write:
    """What became of one MLflow write: ``error`` None when it went (or its row was there already:
    ``duplicate``); ``tries`` it took."""

    what: str
    tries: int = 1
    error: str | None = None
    unreachable: bool = False
    duplicate: bool = False
    exception: Exception | None = field(default=None, repr=False)


class Retrying:
    """MLflow writes tried again after :data:`RETRY_DELAYS_S` when they fail, each retry noted in the
    run's ``runjob.log``; ``retried`` counts the writes that needed another try."""

    def __init__(
        self, delays: tuple[float, ...] = RETRY_DELAYS_S, sleep: Callable[[float], object] = time.sleep
    ) -> None:
        self.delays, self.sleep = delays, sleep
        self.retried = 0

    def write(self, call: Callable[[], object], what: str) -> Write:
        """Call ``call`` until it succeeds or its tries are spent; never raises an ``Exception``."""
        outcome = Write(what)
        for wait in (*self.delays, None):
            try:
                call()
                outcome.error = None
                return outcome
            except Exception as error:  # noqa: BLE001 - judged below: retried, skipped or the store gone
                outcome.error, outcome.exception = describe(error)[:500], error
                outcome.duplicate, outcome.unreachable = is_duplicate(error), is_unreachable(error)
                if wait is None or is_refused(error) or (outcome.unreachable and outcome.tries >= UNREACHABLE_TRIES):
                    break
                if outcome.tries == 1:
                    self.retried += 1
                note(f"MLflow write retried (try {outcome.tries + 1} in {wait:g} s): {what}: {outcome.error}")
                self.sleep(wait)
                outcome.tries += 1
        if outcome.duplicate:  # the row is there: what this write was to add is in the store
            note(f"MLflow write taken as done, its row already there: {what}: {outcome.error}")
            outcome.error = None
        return outcome


def retried(call: Callable[[], _T], what: str, retrying: Retrying | None = None) -> _T:
    """``call()``'s result, tried again as :class:`Retrying` does; its last error raised when every
    try failed (a run's creation at its start, where there is no record in MLflow to go on with)."""
    result: list[_T | None] = [None]

    def attempt() -> None:
        result[0] = call()

    outcome = (retrying or Retrying()).write(attempt, what)
    if outcome.exception is not None and outcome.error is not None:
        raise outcome.exception
    return cast("_T", result[0])  # set: the write succeeded (or was taken as done)


_P = TypeVar("_P")
r"""What an :class:`Uploader` batches: the points its ``send_metrics`` takes (the recording process
sends ``messages.Point``\ s, converted to MLflow's ``Metric`` in its ``send_metrics``)."""

_Queued = (
    tuple[Literal["call"], "Callable[[], object]", str]
    | tuple[Literal["metrics"], list[_P], str]
    | tuple[Literal["close"], None, str]
)
"""An :class:`Uploader`'s queued item: a call, metric points to batch, or the end; what it is for."""


class Uploader(Generic[_P]):
    """One background thread that sends queued MLflow calls in order. Metric points waiting in the
    queue are sent together, in one ``log_batch`` of up to 1,000, at most once every
    ``METRICS_INTERVAL_S`` (logging every step then costs one call a second, not one a step).

    A call that fails is tried again (:class:`Retrying`); one that fails every try is skipped and
    remembered (``failure``, ``failed_at``, ``missed``), and the calls after it are still sent. Only a
    store that stays unreachable (:data:`UNREACHABLE_AFTER` calls in a row, or one that got no answer
    through all its tries) stops the sending (``stopped``): the local record holds everything, and
    ``runjob sync`` sends it later."""

    METRICS_INTERVAL_S = 1.0
    METRICS_PER_CALL = METRICS_PER_CALL

    def __init__(self, send_metrics: Callable[[list[_P]], object], retrying: Retrying | None = None) -> None:
        self.failure: str | None = None
        self.failed_at: str | None = None
        self.missed: list[str] = []
        self.stopped = False
        self.retrying = retrying or Retrying()
        self._failed_in_a_row = 0
        self._send_metrics = send_metrics
        self._last_metrics_sent = 0.0
        self._calls: queue.Queue[_Queued[_P]] = queue.Queue()
        self._thread = threading.Thread(target=self._send, name="runjob-mlflow-upload", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], object], what: str) -> None:
        self._calls.put(("call", call, what))

    def submit_metrics(self, metrics: list[_P], step: int) -> None:
        self._calls.put(("metrics", metrics, f"metrics of step {step}"))

    def _send(self) -> None:
        pending: list[_Queued[_P]] = []
        while True:
            if not pending:
                pending.append(self._calls.get())
            if pending[0][0] == "metrics":  # let more points gather, until the interval is up or the end comes
                deadline = self._last_metrics_sent + self.METRICS_INTERVAL_S
                while not self._closing(pending) and (wait := deadline - time.monotonic()) > 0:
                    try:
                        pending.append(self._calls.get(timeout=wait))
                    except queue.Empty:
                        break
            pending.extend(self._drain())
            item = pending.pop(0)
            if item[0] == "close":
                return
            if item[0] == "metrics":
                _, points, what = item
                while pending and len(points) < self.METRICS_PER_CALL:
                    following = pending[0]
                    if following[0] != "metrics":
                        break
                    pending.pop(0)
                    _, more, what = following
                    points = points + more
                sent = points[: self.METRICS_PER_CALL]
                self._attempt(functools.partial(self._send_metrics, sent), what)
                if len(points) > self.METRICS_PER_CALL:
                    pending.insert(0, ("metrics", points[self.METRICS_PER_CALL :], what))
                self._last_metrics_sent = time.monotonic()
            else:
                self._attempt(item[1], item[2])

    def _drain(self) -> list[_Queued[_P]]:
        items: list[_Queued[_P]] = []
        while True:
            try:
                items.append(self._calls.get_nowait())
            except queue.Empty:
                return items

    def _closing(self, pending: list[_Queued[_P]]) -> bool:
        return any(kind == "close" for kind, _, _ in pending) or any(
            item[0] == "close" for item in list(self._calls.queue)
        )

    @property
    def retried(self) -> int:
        """How many calls needed more than one try."""
        return self.retrying.retried

    def _attempt(self, call: Callable[[], object], what: str) -> None:
        if self.stopped:
            self.missed.append(what)
            return
        outcome = self.retrying.write(call, what)
        if outcome.error is None:
            self._failed_in_a_row = 0
            return
        self.missed.append(what)
        if self.failure is None:
            self.failure, self.failed_at = outcome.error, what
        self._failed_in_a_row += 1
        if outcome.unreachable or self._failed_in_a_row >= UNREACHABLE_AFTER:
            self.stopped = True

    def close(self, timeout: float) -> bool:
        """Send what is queued (waiting at most ``timeout`` s); true when it all went."""
        self._calls.put(("close", None, "close"))
        self._thread.join(timeout)
        return not self.missed and not self._thread.is_alive()


def close_failed_run(output_dir: Path, reason: str) -> None:
    """After a worker failed: note which (``reason``) on the job's run, and mark the run FAILED
    where rank 0 could not end it (it was stopped too). A run rank 0 finished stays FINISHED. The
    local record says the same as MLflow, so ``runjob sync`` agrees with it."""
    _close_run(output_dir, "FAILED", {WORKER_FAILURE_TAG: reason}, {ERROR_TAG: reason})


def close_abandoned_run(output_dir: Path, reason: str) -> str | None:
    """A run left RUNNING by a process that was killed (SIGKILL) before its first checkpoint, and
    that nothing can continue: mark it KILLED with ``reason`` as the tag ``runjob.abandoned``, in
    the local record and in MLflow. Returns its MLflow run id (None when there is no record)."""
    return _close_run(output_dir, "KILLED", {}, {ABANDONED_TAG: reason})


def _close_run(output_dir: Path, status: str, tags: dict[str, str], if_open: dict[str, str]) -> str | None:
    """Set ``tags`` on the run recorded in ``output_dir``; where it is still open (RUNNING, or
    KILLED for FAILED), also ``if_open`` and ``status``: locally, then in MLflow."""
    record = RunRecord.read(output_dir)
    if record is None:
        return None
    open_states = ("RUNNING", "KILLED") if status == "FAILED" else ("RUNNING",)
    record.tags.update(tags)
    if record.status in open_states:
        record.tags.update(if_open)
        record.status, record.end_time = status, now_ms()
    record.write(output_dir)
    if record.run_id is None or record.offline:
        return record.run_id
    try:
        writer = RunWriter(connect(record.tracking_uri), record.run_id)
        writer.tags(tags)
        if writer.status() in open_states:
            writer.tags(if_open)
            writer.terminate(status)
    except Exception as error:  # noqa: BLE001 - the local record has it; sync sends it later
        screen.each(
            f"runjob: could not mark MLflow run {record.run_id} {status} ({describe(error)}); "
            f"`{pasteable('sync', output_dir)}` sends what the local record says",
            err=True,
        )
    return record.run_id
