"""The training side of a run's record: the local record in the output folder, and MLflow's half
handed to the recording process (:mod:`runjob.record.mirror`), so the training process never
imports MLflow.

Everything the run records (params, tags, every metric point, dataset lineage, artifacts, status)
is written to the output folder first (``mlflow_run.json``, ``metrics.jsonl``, the files) and then
sent down the pipe (:mod:`runjob.record.messages`), so a slow tracking server never stalls
training and a server that goes away mid-run costs nothing: ``runjob sync OUTPUT_DIR`` uploads the
record later. Which process records what is a type, not a flag:

- :class:`MainRecorder`: the main process records the run.
- :class:`NodeRecorder`: the first process of each other machine records that machine's system
  metrics (``metrics.node<rank>.jsonl``) into the main process's run.
- :class:`NoRecorder`: every other process records nothing.

All three have the same methods; on a recorder that does not record something, the method does
nothing (by its type). The order is fixed: ``start`` -> ``opened`` -> ``join`` -> the ``log_*``
calls -> ``end``; a main or node recorder used out of that order raises :class:`RecorderStateError`.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal, cast

from runjob.errors import TrackingError, TrainingError, describe
from runjob.host.output import screen
from runjob.host.run_folder import METRICS_FILE, RunFolder
from runjob.record import messages
from runjob.record.invocation import pasteable
from runjob.record.local import MetricsWriter, RunRecord, now_ms
from runjob.record.messages import Recording
from runjob.record.mirror import FINAL_UPLOAD_TIMEOUT_S, Mirror
from runjob.record.mlflow_writer import MODEL_ARTIFACT
from runjob.record.model_logging import MODEL_FOLDER
from runjob.record.uri import check_reachable
from runjob.tags import ERROR_TAG

if TYPE_CHECKING:
    from runjob.host.components import Batch
    from runjob.host.json_types import JSONObject
    from runjob.job.schema import TrackingTable

Role = Literal["main", "node", "none"]


class RecorderStateError(RuntimeError):
    """A recorder's method called out of the fixed order (a bug in the caller, not the user's)."""


class Recorder:
    """The run's record, as one process sees it. ``Recorder(output_dir, role, machine_rank)`` makes
    the recorder of ``role`` ("main", "node" or "none"; the same as :func:`recorder_for`); the base
    records nothing.

    A main recorder writes the local record itself and hands MLflow's half to the recording
    process, so this process never imports MLflow: the run is created there while the data and
    model are built here, and :meth:`opened` is where the two meet before training begins."""

    role: ClassVar[str] = "none"

    def __new__(cls, output_dir: Path, role: str | None = None, machine_rank: int = 0) -> Recorder:
        if cls is Recorder:  # Recorder(output_dir, role=...): the role's type
            cls = _type_of(role or "main")
        return super().__new__(cls)

    def __init__(self, output_dir: Path, role: str | None = None, machine_rank: int = 0) -> None:
        if role is not None and role != self.role:
            raise ValueError(f"{type(self).__name__}: role {role!r}, expected {self.role!r}")
        self.output_dir = Path(output_dir)
        self.machine_rank = machine_rank
        self.run_id: str | None = None
        self.tracking_uri: str | None = None
        self.experiment_id: str | None = None
        self.default_tracking_uri: str | None = None  # MLflow's default here (what `runjob runs` reads)
        self.start_ms: int | None = None  # when the run began (all processes)
        self.record = RunRecord()

    @property
    def active(self) -> bool:
        """Whether this process records the run (the main process)."""
        return False

    @property
    def online(self) -> bool:
        """Whether MLflow is getting the record (not offline, not given up)."""
        return False

    def start(
        self,
        *,
        tracking: TrackingTable,
        experiment: str,
        run_name: str,
        params: dict[str, str],
        tags: dict[str, str],
        tracking_uri: str | None = None,
        resuming: bool = False,
        disabled: dict[str, str] | None = None,
        model_name: str = MODEL_ARTIFACT,
        recording: Recording | None = None,
    ) -> None:
        """Begin the run's record (:meth:`MainRecorder.start`); nothing on other processes."""

    def opened(self, timeout: float = FINAL_UPLOAD_TIMEOUT_S) -> str | None:
        """The MLflow run's id once the recording process has it (:meth:`MainRecorder.opened`)."""
        return self.run_id

    def join(
        self, run_id: str | None, tracking_uri: str | None, offline: bool, recording: Recording | None = None
    ) -> None:
        """Record this machine's system metrics into the run (:meth:`NodeRecorder.join`)."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` at ``step`` (the main process's and the nodes' own metrics)."""

    def log_training_metrics(self, metrics: dict[str, float], step: int) -> None:
        """The loop's metrics: the same on every process, so recorded by the main one only."""

    def set_tags(self, tags: dict[str, str]) -> None:
        """Add ``tags`` to the run."""

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Record the file or folder ``path`` (inside the output folder) as an artifact."""

    def log_model(self, example: Batch = None, prediction: JSONObject | None = None) -> None:
        """Have the recording process write the run's MLflow model (:meth:`MainRecorder.log_model`)."""

    def model_logged(self, timeout: float = FINAL_UPLOAD_TIMEOUT_S) -> None:
        """Wait for the MLflow model :meth:`log_model` asked for."""

    def log_input(self, dataset: dict[str, str], context: str) -> None:
        """Record dataset lineage (name, digest, source) as an MLflow input of the run."""

    def end(self, status: str, error: BaseException | None = None) -> None:
        """Close this process's part of the record."""


class NoRecorder(Recorder):
    """A process that records nothing (neither the main process nor a machine's first): every
    method does nothing."""

    role: ClassVar[str] = "none"


class NodeRecorder(Recorder):
    """Another machine's first process: its system metrics, written to ``metrics.node<rank>.jsonl``
    and sent into the main process's run. :meth:`join` first; :meth:`log_metrics` before it is a
    :class:`RecorderStateError`."""

    role: ClassVar[str] = "node"

    def __init__(self, output_dir: Path, role: str | None = None, machine_rank: int = 0) -> None:
        super().__init__(output_dir, role, machine_rank)
        self._metrics: MetricsWriter | None = None
        self._mirror: Mirror | None = None
        self._ended = False

    @property
    def online(self) -> bool:
        return self._mirror is not None

    def join(
        self, run_id: str | None, tracking_uri: str | None, offline: bool, recording: Recording | None = None
    ) -> None:
        """Record system metrics into the main process's run ``run_id`` (locally only when offline
        or without a run). ``recording``: see :class:`runjob.record.mirror.Mirror`."""
        if self._metrics is not None or self._ended:
            raise RecorderStateError(f"NodeRecorder.join: already {'ended' if self._ended else 'joined'}")
        self.run_id, self.tracking_uri = run_id, tracking_uri
        self._metrics = MetricsWriter(RunFolder(self.output_dir).node_metrics_file(self.machine_rank))
        if run_id and not offline:
            self._mirror = Mirror(messages.Join(str(self.output_dir), tracking_uri, run_id), recording)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self._metrics is None:
            raise RecorderStateError(f"NodeRecorder.log_metrics at step {step}: before join() or after end()")
        timestamp = now_ms()
        self._metrics.write(metrics, step, timestamp)
        if self._mirror is not None:
            self._mirror.send(messages.Metrics(_points(metrics, step, timestamp)))

    def end(self, status: str, error: BaseException | None = None) -> None:
        """Close the metrics file and the recording process (after it sent what it has)."""
        if self._ended:
            raise RecorderStateError("NodeRecorder.end: called twice")
        self._ended = True
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._mirror is not None:
            mirror, self._mirror = self._mirror, None
            mirror.close(FINAL_UPLOAD_TIMEOUT_S)


class MainRecorder(Recorder):
    """The main process: the run's record, local and (through the recording process) MLflow's.
    :meth:`start` first and :meth:`end` last; anything else before or after is a
    :class:`RecorderStateError`."""

    role: ClassVar[str] = "main"

    def __init__(self, output_dir: Path, role: str | None = None, machine_rank: int = 0) -> None:
        super().__init__(output_dir, role, machine_rank)
        self._state = "new"  # -> started -> ended
        self._metrics: MetricsWriter | None = None
        self._mirror: Mirror | None = None
        self._mirroring = False  # MLflow gets the record (not offline, not given up)
        self._began_offline = False
        self._disabled: dict[str, str] = {}
        self._model_name = MODEL_ARTIFACT
        self._model_asked = False  # log_model() asked the recording process for the MLflow model
        self._example: Path | None = None  # the example input's temporary file, for pickle and pt2
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return True

    @property
    def online(self) -> bool:
        return self._mirroring

    def _require_started(self, method: str) -> None:
        if self._state != "started":
            when = "before start()" if self._state == "new" else "after end()"
            raise RecorderStateError(f"MainRecorder.{method}: called {when}")

    def start(
        self,
        *,
        tracking: TrackingTable,
        experiment: str,
        run_name: str,
        params: dict[str, str],
        tags: dict[str, str],
        tracking_uri: str | None = None,
        resuming: bool = False,
        disabled: dict[str, str] | None = None,
        model_name: str = MODEL_ARTIFACT,
        recording: Recording | None = None,
    ) -> None:
        """Write the local record and start the recording process, which creates the MLflow run
        with its params and tags (a resumed run's is reopened, with the tags added) while this
        process goes on; :meth:`opened` waits for it. ``tracking_uri``: where to record (default
        ``$MLFLOW_TRACKING_URI``, else MLflow's default, which the recording process resolves).
        ``disabled``: the plugins the run was given without, for rebuilding its model there.
        ``model_name``: the name of the run's logged model (the job's: MLflow lists every run's
        model by it). ``recording``: "process" or "thread" (see :class:`runjob.record.mirror.Mirror`)."""
        if self._state != "new":
            raise RecorderStateError(f"MainRecorder.start: called twice (the record is {self._state})")

        self._disabled = dict(disabled or {})
        self._model_name = model_name
        self.tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        previous = RunRecord.read(self.output_dir) if resuming else None
        self.record = previous or RunRecord(
            tracking_uri=self.tracking_uri,
            experiment=experiment,
            run_name=run_name,
            start_time=now_ms(),
            params=params,
        )
        self.record.status, self.record.end_time, self.record.offline = "RUNNING", None, bool(tracking.offline)
        self.record.tags.update(tags)
        self.run_id = self.record.run_id
        self._began_offline = previous is not None and previous.run_id is None and not tracking.offline
        if not tracking.offline and self.tracking_uri:
            check_reachable(self.tracking_uri)  # a server that is not there: said now, before anything is built
        self._metrics = MetricsWriter(self.output_dir / METRICS_FILE)
        self._state = "started"
        self._save()
        if tracking.offline and tracking.log_model == "none":
            return
        start = messages.Start(
            output_dir=str(self.output_dir),
            tracking_uri=self.tracking_uri,
            offline=bool(tracking.offline),
            run_id=self.run_id,
            experiment=self.record.experiment,
            run_name=self.record.run_name,
            start_time=self.record.start_time,
            tags=dict(self.record.tags),
            params=dict(self.record.params),
            log_params=self.run_id is None,
            log_model=tracking.log_model,
            model_name=model_name,
            disabled=self._disabled,
        )
        self._mirror = Mirror(start, recording)
        self._mirroring = not tracking.offline

    def opened(self, timeout: float = FINAL_UPLOAD_TIMEOUT_S) -> str | None:
        """Wait until the recording process has the MLflow run; returns its id (None offline).
        A run MLflow refuses (a deleted experiment, a store that cannot be written) is the
        TrackingError it was before anything trained."""
        self._require_started("opened")
        if self._mirror is None:
            return self.run_id
        started = self._mirror.reply((messages.Started, messages.Refused), timeout)
        if not isinstance(started, messages.Started):
            self._mirroring = False
            self._mirror.close(30)
            self._mirror = None
            raise TrackingError(
                started.error
                if isinstance(started, messages.Refused)
                else f"the recording process did not open the MLflow run within {timeout:.0f} s; record with "
                "tracking.offline = true and upload later with `runjob sync OUTPUT_DIR`"
            )
        self.tracking_uri = started.tracking_uri
        self.experiment_id = started.experiment_id
        self.default_tracking_uri = started.default_uri
        if self._mirroring:
            self.run_id = started.run_id
            with self._lock:
                self.record.run_id, self.record.tracking_uri = self.run_id, self.tracking_uri
            self._save()
            if self._began_offline:
                screen.say(
                    f"runjob: the run began offline; `runjob sync {self.output_dir}` uploads what it recorded before "
                    "this resume"
                )
        return self.run_id

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` at ``step``: a line each in the metrics file, and to the recording process."""
        self._require_started("log_metrics")
        assert self._metrics is not None
        timestamp = now_ms()
        self._metrics.write(metrics, step, timestamp)
        if self._mirroring:  # a mirror is there
            cast("Mirror", self._mirror).send(messages.Metrics(_points(metrics, step, timestamp)))

    def log_training_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.log_metrics(metrics, step)

    def set_tags(self, tags: dict[str, str]) -> None:
        self._require_started("set_tags")
        tags = {str(k): str(v) for k, v in tags.items()}
        with self._lock:
            self.record.tags.update(tags)
        self._save()
        if self._mirroring:  # a mirror is there
            cast("Mirror", self._mirror).send(messages.Tags(tags))

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self._require_started("log_artifact")
        relative = str(Path(path).relative_to(self.output_dir))
        with self._lock:
            added = self.record.add_artifact(relative, artifact_path)
        if added:
            self._save()
        if self._mirroring:  # a mirror is there
            cast("Mirror", self._mirror).send(messages.Artifact(relative, artifact_path))

    def log_model(self, example: Batch = None, prediction: JSONObject | None = None) -> None:
        """Have the recording process build the run's MLflow model from the saved final weights
        (``OUTPUT_DIR/mlflow_model``) and log it as the run's logged model; ``example`` is a batch
        of two inputs as the model sees them (for ``pickle`` and ``pt2``; a ``weights`` model needs
        none); ``prediction`` describes the run's predictor (``runjob.train.predictor``) for a
        ``weights`` model. :meth:`model_logged` waits for it. Nothing without a recording process
        (offline with ``tracking.log_model = "none"``)."""
        self._require_started("log_model")
        if self._mirror is None:
            return
        name = ""
        if example is not None:
            # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
            import torch

            handle, name = tempfile.mkstemp(prefix="runjob-example-", suffix=".pt")
            os.close(handle)
            torch.save(example, name)
        self._example, self._model_asked = (Path(name) if name else None), True
        with self._lock:
            added = self.record.add_artifact(MODEL_FOLDER, self._model_name)
        if added:
            self._save()
        self._mirror.send(messages.Model(name, self._disabled, prediction))

    def model_logged(self, timeout: float = FINAL_UPLOAD_TIMEOUT_S) -> None:
        """Wait for the MLflow model :meth:`log_model` asked for (nothing when it asked none); one
        that could not be built is a TrainingError (the weights are in model.safetensors)."""
        self._require_started("model_logged")
        if self._mirror is None or not self._model_asked:
            return
        answer = self._mirror.reply((messages.ModelWritten,), timeout)
        if self._example is not None:
            self._example.unlink(missing_ok=True)
        self._example, self._model_asked = None, False
        if answer is None and self._mirroring:
            self._give_up("the MLflow model: the recording process stopped")
        elif answer is None:
            screen.say(
                f"runjob: the MLflow model was not written (the recording process stopped); the weights are in "
                f"{self.output_dir / 'model.safetensors'}"
            )
        elif answer.error is not None:
            raise TrainingError(answer.error)
        else:
            screen.say(*(f"runjob: {note}" for note in answer.notes))

    def log_input(self, dataset: dict[str, str], context: str) -> None:
        self._require_started("log_input")
        entry = {**dataset, "context": context}
        if entry not in self.record.inputs:
            with self._lock:
                self.record.inputs.append(entry)
            self._save()
        if self._mirroring:  # a mirror is there
            cast("Mirror", self._mirror).send(messages.Input(entry))

    def end(self, status: str, error: BaseException | None = None) -> None:
        """Close the run as FINISHED, FAILED or KILLED, after everything queued has been sent."""
        self._require_started("end")
        if error is not None:
            self.set_tags({ERROR_TAG: describe(error)[:5000]})
        self._state = "ended"
        assert self._metrics is not None
        self._metrics.close()
        self._metrics = None
        self.record.status, self.record.end_time = status, now_ms()
        self._save()
        if self._mirror is None:
            return
        if self._mirroring:
            self._mirror.send(messages.End(status, self.record.end_time))
        mirror, self._mirror = self._mirror, None
        ended = mirror.close(FINAL_UPLOAD_TIMEOUT_S)
        if not self._mirroring:
            return
        if ended is None or not ended.sent:
            reason = (
                (ended.failure if ended is not None else None)
                or mirror.lost
                or (f"still sending after {FINAL_UPLOAD_TIMEOUT_S:.0f} s" if ended is None else "not sent")
            )
            self._give_up(
                f"{(ended.failed_at if ended is not None else None) or 'upload'}: {reason}",
                stopped=ended is None or ended.stopped,
            )
        elif ended.caught_up and self.record.unsynced:  # a resume sent what an earlier run had not
            with self._lock:
                self.record.unsynced = None
            self._save()

    def _give_up(self, what: str, stopped: bool = True) -> None:
        """MLflow is missing part of the record: note why, and say how to send it. ``stopped``: the
        store stopped answering (else it refused some writes, every try, and took the rest)."""
        self._mirroring = False
        self.record.unsynced = self.record.unsynced or what
        self._save()
        how = "stopped taking the run's record" if stopped else "did not take part of the run's record"
        screen.say(
            f"runjob: MLflow at {self.tracking_uri} {how} ({self.record.unsynced}); "
            f"training went on and the record is complete in {self.output_dir}: upload it with "
            f"`{pasteable('sync', self.output_dir)}`"
        )

    def _save(self) -> None:
        with self._lock:
            self.record.write(self.output_dir)


ROLES: dict[str, type[Recorder]] = {"main": MainRecorder, "node": NodeRecorder, "none": NoRecorder}


def _type_of(role: str) -> type[Recorder]:
    try:
        return ROLES[role]
    except KeyError:
        raise ValueError(f"recorder role {role!r}: expected one of {', '.join(ROLES)}") from None


def recorder_for(role: Role, output_dir: Path, machine_rank: int = 0) -> Recorder:
    """The recorder of a process by its ``role``: "main" (:class:`MainRecorder`), "node"
    (:class:`NodeRecorder`, for machine ``machine_rank``) or "none" (:class:`NoRecorder`)."""
    return _type_of(role)(output_dir, machine_rank=machine_rank)


def _points(metrics: dict[str, float], step: int, timestamp: int) -> tuple[messages.Point, ...]:
    return tuple(messages.Point(str(k), float(v), step, timestamp) for k, v in metrics.items())
