"""Recording a run: a complete local record in the output folder, mirrored to MLflow.

Everything the run records (params, tags, every metric point, dataset lineage, artifacts, status)
is written to the output folder first (``mlflow_run.json``, ``metrics.jsonl``, the files) and then
sent to MLflow by the recording process (``runjob.record.mirror``; its :class:`Uploader` batches the
calls), so the training process never imports MLflow, a slow tracking server never stalls
training and a server that goes away mid-run costs nothing: training goes on, and ``runjob sync
OUTPUT_DIR`` uploads the record later. Only the main process records the run; the first process of each other
machine records that machine's system metrics.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runjob.errors import TrackingError, describe
from runjob.job.keys import flat, value_text
from runjob.record.local import METRICS_FILE, MetricsWriter, RunRecord, now_ms
from runjob.record.model_logging import MODEL_FOLDER

MAX_PARAM_LENGTH = 6000  # MLflow refuses longer param values
TRUNCATED = "...(truncated; full value in job.toml)"
REACH_TIMEOUT_S = 5.0  # an unreachable tracking server is reported within this (twice at most)
FINAL_UPLOAD_TIMEOUT_S = 300.0  # the longest the end of a run waits for MLflow
MODEL_ARTIFACT = "model"  # a run's logged model's name when none is given (before models were named after their job)
# MLflow's HTTP retries default to minutes of back-off; a lost server should cost seconds.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


def flatten(tables: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"optimizer": {"lr": 0.1}}`` -> ``{"optimizer.lr": "0.1"}``; lists as JSON, long values cut."""
    return {key: _param_text(value) for key, value in flat(tables, prefix=prefix).items()}


def _param_text(value: Any) -> str:
    text = value_text(value)
    if len(text) > MAX_PARAM_LENGTH:  # an MLflow limit; the whole value is in job.toml
        text = text[: MAX_PARAM_LENGTH - len(TRUNCATED)] + TRUNCATED
    return text


def bound_http_retries() -> None:
    """MLflow's HTTP retries for this process, as ``HTTP_DEFAULTS`` (the user's own environment
    variables win)."""
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)


def check_reachable(uri: str, setting: str = "tracking.uri") -> None:
    """Fail within seconds, with a clear message, when a tracking server does not answer.
    ``setting`` names where the URI came from, for the message. Also bounds MLflow's retries."""
    bound_http_retries()
    if urllib.parse.urlparse(uri).scheme not in ("http", "https"):
        return
    health = probe_health(uri)
    if health.status is not None and health.status >= 500:
        raise TrackingError(
            f"the MLflow tracking server at {uri} ({setting}) answers {health.url} with HTTP {health.status}"
        )
    if health.status is None:  # no answer at all; an HTTP 4xx still means a server is there
        reason = health.error
        advice = (
            "Start it, fix tracking.uri or $MLFLOW_TRACKING_URI, or set tracking.offline = true to record in the "
            "output folder and upload later with `runjob sync OUTPUT_DIR`"
            if setting == "tracking.uri"
            else "Start it, or give another with --tracking-uri"
        )
        raise TrackingError(f"cannot reach the MLflow tracking server at {uri} ({setting}): {reason}. {advice}")


@dataclass(frozen=True)
class Health:
    """What ``GET <server>/health`` gave: the HTTP status, or the reason there was no answer."""

    url: str
    status: int | None
    error: BaseException | None = None


def probe_health(uri: str, timeout: float = REACH_TIMEOUT_S) -> Health:
    """Ask an MLflow server's ``/health`` once, waiting at most ``timeout`` seconds."""
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            answer.read(100)
            return Health(url, answer.status)
    except urllib.error.HTTPError as error:
        return Health(url, error.code, error)
    except (OSError, ValueError) as error:
        # "[Errno 111] Connection refused", not "<urlopen error [Errno 111] ...>"
        reason = error.reason if isinstance(getattr(error, "reason", None), BaseException) else error
        return Health(url, None, reason)


def sqlite_path(uri: str) -> str | None:
    """The database file of a ``sqlite:`` URI (``""`` or ``":memory:"`` for an in-memory one), or
    None when the URI is not sqlite."""
    if not uri.lower().startswith("sqlite:"):
        return None
    return uri[len("sqlite:") :].removeprefix("//").partition("?")[0].removeprefix("/")


def experiment_id(client: Any, name: str) -> str:
    """The id of experiment ``name``, created when missing (another process may create it first)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            raise TrackingError(
                f"MLflow experiment {name!r} is deleted; restore it (mlflow experiments restore) or choose another "
                "tracking.experiment"
            )
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:  # noqa: BLE001 - lost a race with another process: read theirs
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


class Uploader:
    """One background thread that sends queued MLflow calls in order. Metric points waiting in the
    queue are sent together, in one ``log_batch`` of up to 1,000, at most once every
    ``METRICS_INTERVAL_S`` (logging every step then costs one call a second, not one a step).
    After the first failure it stops sending (each later call would wait on retries too) and
    remembers why; the local record holds everything, and ``runjob sync`` sends it later."""

    METRICS_INTERVAL_S = 1.0
    METRICS_PER_CALL = 1000  # MLflow's limit for one log_batch

    def __init__(self, send_metrics: Callable[[list[Any]], Any]) -> None:
        self.failure: str | None = None
        self.failed_at: str | None = None
        self._send_metrics = send_metrics
        self._last_metrics_sent = 0.0
        self._calls: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._send, name="runjob-mlflow-upload", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], Any], what: str) -> None:
        self._calls.put(("call", call, what))

    def submit_metrics(self, metrics: list[Any], step: int) -> None:
        self._calls.put(("metrics", metrics, f"metrics of step {step}"))

    def _send(self) -> None:
        pending: list[tuple[str, Any, str]] = []
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
            kind, payload, what = pending.pop(0)
            if kind == "close":
                return
            if kind == "metrics":
                while pending and pending[0][0] == "metrics" and len(payload) < self.METRICS_PER_CALL:
                    _, more, what = pending.pop(0)
                    payload = payload + more
                self._attempt(lambda payload=payload: self._send_metrics(payload[: self.METRICS_PER_CALL]), what)
                if len(payload) > self.METRICS_PER_CALL:
                    pending.insert(0, ("metrics", payload[self.METRICS_PER_CALL :], what))
                self._last_metrics_sent = time.monotonic()
            else:
                self._attempt(payload, what)

    def _drain(self) -> list[tuple[str, Any, str]]:
        items = []
        while True:
            try:
                items.append(self._calls.get_nowait())
            except queue.Empty:
                return items

    def _closing(self, pending: list[tuple[str, Any, str]]) -> bool:
        return any(kind == "close" for kind, _, _ in pending) or any(
            item[0] == "close" for item in list(self._calls.queue)
        )

    def _attempt(self, call: Callable[[], Any], what: str) -> None:
        if self.failure is not None:
            return
        try:
            call()
        except Exception as error:  # noqa: BLE001 - recorded, reported at the end of the run
            self.failure = describe(error)[:500]
            self.failed_at = what

    def close(self, timeout: float) -> bool:
        """Send what is queued (waiting at most ``timeout`` s); true when it all went."""
        self._calls.put(("close", None, "close"))
        self._thread.join(timeout)
        return self.failure is None and not self._thread.is_alive()


class Recorder:
    """The run's record. ``role`` is "main" (the run), "node" (another machine's system metrics,
    written to ``metrics.node<rank>.jsonl``) or "none".

    It writes the local record itself and hands MLflow's half to the recording process
    (:class:`runjob.record.mirror.Mirror`), so this process never imports MLflow: the run is
    created there while the data and model are built here, and :meth:`opened` is where the two
    meet before training begins."""

    def __init__(self, output_dir: Path, role: str = "main", machine_rank: int = 0) -> None:
        self.output_dir = output_dir
        self.role = role
        self.machine_rank = machine_rank
        self.run_id: str | None = None
        self.tracking_uri: str | None = None
        self.experiment_id: str | None = None
        self.default_tracking_uri: str | None = None  # MLflow's default here (what `runjob runs` reads)
        self.start_ms: int | None = None  # when the run began (all processes)
        self.record = RunRecord()
        self._metrics: MetricsWriter | None = None
        self._mirror: Any = None
        self._mirroring = False  # MLflow gets the record (not offline, not given up)
        self._began_offline = False
        self._disabled: dict[str, str] = {}
        self._model_name = MODEL_ARTIFACT
        self._model_asked = False  # log_model() asked the recording process for the MLflow model
        self._example: Path | None = None  # the example input's temporary file, for pickle and pt2
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self.role == "main"

    @property
    def online(self) -> bool:
        return self._mirroring

    def start(
        self,
        *,
        tracking: Any,
        experiment: str,
        run_name: str,
        params: dict[str, str],
        tags: dict[str, str],
        tracking_uri: str | None = None,
        resuming: bool = False,
        disabled: dict[str, str] | None = None,
        model_name: str = MODEL_ARTIFACT,
    ) -> None:
        """Write the local record and start the recording process, which creates the MLflow run
        with its params and tags (a resumed run's is reopened, with the tags added) while this
        process goes on; :meth:`opened` waits for it. ``tracking_uri``: where to record (default
        ``$MLFLOW_TRACKING_URI``, else MLflow's default, which the recording process resolves).
        ``disabled``: the plugins the run was given without, for rebuilding its model there.
        ``model_name``: the name of the run's logged model (the job's: MLflow lists every run's
        model by it)."""
        if self.role != "main":
            return
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
        self._metrics = MetricsWriter(self.output_dir / METRICS_FILE)
        self.run_id = self.record.run_id
        self._began_offline = previous is not None and previous.run_id is None and not tracking.offline
        if not tracking.offline and self.tracking_uri:
            check_reachable(self.tracking_uri)  # a server that is not there: said now, before anything is built
        self._save()
        if tracking.offline and tracking.log_model == "none":
            return
        from runjob.record.mirror import Mirror

        self._mirror = Mirror(
            {
                "output_dir": str(self.output_dir),
                "tracking_uri": self.tracking_uri,
                "offline": bool(tracking.offline),
                "role": "main",
                "run_id": self.run_id,
                "experiment": self.record.experiment,
                "run_name": self.record.run_name,
                "start_time": self.record.start_time,
                "tags": dict(self.record.tags),
                "params": self.record.params,
                "log_params": self.run_id is None,
                "log_model": tracking.log_model,
                "model_name": model_name,
                "disabled": self._disabled,
            }
        )
        self._mirroring = not tracking.offline

    def opened(self, timeout: float = FINAL_UPLOAD_TIMEOUT_S) -> str | None:
        """Wait until the recording process has the MLflow run; returns its id (None offline).
        A run MLflow refuses (a deleted experiment, a store that cannot be written) is the
        TrackingError it was before anything trained."""
        if self._mirror is None or not self.active:
            return self.run_id
        started = self._mirror.reply("started", timeout, also="error")
        error = self._mirror.reply("error", 0)
        if started is None:
            self._mirroring = False
            self._mirror.close(30)
            self._mirror = None
            raise TrackingError(
                error
                or f"the recording process did not open the MLflow run within {timeout:.0f} s; record with "
                "tracking.offline = true and upload later with `runjob sync OUTPUT_DIR`"
            )
        self.tracking_uri = started["tracking_uri"]
        self.experiment_id = started.get("experiment_id")
        self.default_tracking_uri = started.get("default_uri")
        if self._mirroring:
            self.run_id = started["run_id"]
            with self._lock:
                self.record.run_id, self.record.tracking_uri = self.run_id, self.tracking_uri
            self._save()
            if self._began_offline:
                print(
                    f"runjob: the run began offline; `runjob sync {self.output_dir}` uploads what it recorded before "
                    "this resume",
                    flush=True,
                )
        return self.run_id

    def join(self, run_id: str | None, tracking_uri: str | None, offline: bool) -> None:
        """On another machine's first process: record system metrics into the main process's run."""
        if self.role != "node":
            return
        self.run_id, self.tracking_uri = run_id, tracking_uri
        self._metrics = MetricsWriter(self.output_dir / f"metrics.node{self.machine_rank}.jsonl")
        if run_id and not offline:
            from runjob.record.mirror import Mirror

            start = {"output_dir": str(self.output_dir), "tracking_uri": tracking_uri, "role": "node", "run_id": run_id}
            self._mirror = Mirror(start)
            self._mirroring = True

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` at ``step``: a line each in the metrics file, and to the recording process."""
        if self._metrics is None:
            return
        timestamp = now_ms()
        self._metrics.write(metrics, step, timestamp)
        if self._mirroring:
            points = [{"key": k, "value": float(v), "step": step, "timestamp": timestamp} for k, v in metrics.items()]
            self._mirror.send({"metrics": points})

    def log_training_metrics(self, metrics: dict[str, float], step: int) -> None:
        """The loop's metrics: the same on every process, so recorded by the main one only."""
        if self.active:
            self.log_metrics(metrics, step)

    def set_tags(self, tags: dict[str, str]) -> None:
        if not self.active:
            return
        tags = {str(k): str(v) for k, v in tags.items()}
        with self._lock:
            self.record.tags.update(tags)
        self._save()
        if self._mirroring:
            self._mirror.send({"tags": tags})

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Record the file or folder ``path`` (inside the output folder) as an artifact."""
        if not self.active:
            return
        relative = str(path.relative_to(self.output_dir))
        with self._lock:
            added = self.record.add_artifact(relative, artifact_path)
        if added:
            self._save()
        if self._mirroring:
            self._mirror.send({"artifact": {"path": relative, "artifact_path": artifact_path}})

    def log_model(self, example: Any = None, prediction: dict[str, Any] | None = None) -> None:
        """Have the recording process build the run's MLflow model from the saved final weights
        (``OUTPUT_DIR/mlflow_model``) and log it as the run's logged model; ``example`` is a batch
        of two inputs as the model sees them (for ``pickle`` and ``pt2``; a ``weights`` model needs
        none); ``prediction`` describes the run's predictor (``runjob.train.predictor``) for a
        ``weights`` model. :meth:`model_logged` waits for it."""
        if not self.active or self._mirror is None:
            return
        name = ""
        if example is not None:
            import tempfile

            import torch

            handle, name = tempfile.mkstemp(prefix="runjob-example-", suffix=".pt")
            os.close(handle)
            torch.save(example, name)
        self._example, self._model_asked = (Path(name) if name else None), True
        with self._lock:
            added = self.record.add_artifact(MODEL_FOLDER, self._model_name)
        if added:
            self._save()
        self._mirror.send({"model": {"example": name, "disabled": self._disabled, "prediction": prediction}})

    def model_logged(self, timeout: float = FINAL_UPLOAD_TIMEOUT_S) -> None:
        """Wait for the MLflow model :meth:`log_model` asked for; one that could not be built is a
        TrainingError (the weights are in model.safetensors)."""
        if self._mirror is None or not self._model_asked:
            return
        answer = self._mirror.reply("model", timeout)
        if self._example is not None:
            self._example.unlink(missing_ok=True)
        self._example, self._model_asked = None, False
        if answer is None and self._mirroring:
            self._give_up("the MLflow model: the recording process stopped")
        elif answer is None:
            print(
                f"runjob: the MLflow model was not written (the recording process stopped); the weights are in "
                f"{self.output_dir / 'model.safetensors'}",
                flush=True,
            )
        elif "error" in answer:
            from runjob.errors import TrainingError

            raise TrainingError(answer["error"])
        else:
            for note in answer.get("notes") or []:
                print(f"runjob: {note}", flush=True)

    def log_input(self, dataset: dict[str, str], context: str) -> None:
        """Record dataset lineage (name, digest, source) as an MLflow input of the run."""
        if not self.active:
            return
        entry = {**dataset, "context": context}
        if entry not in self.record.inputs:
            with self._lock:
                self.record.inputs.append(entry)
            self._save()
        if self._mirroring:
            self._mirror.send({"input": entry})

    def end(self, status: str, error: BaseException | None = None) -> None:
        """Close the run as FINISHED, FAILED or KILLED, after everything queued has been sent."""
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self.active and self.record.start_time is not None:
            if error is not None:
                self.set_tags({"runjob.error": describe(error)[:5000]})
            self.record.status, self.record.end_time = status, now_ms()
            self._save()
            if self._mirroring:
                self._mirror.send({"end": {"status": status, "end_time": self.record.end_time}})
        if self._mirror is None:
            return
        mirror, self._mirror = self._mirror, None
        ended = mirror.close(FINAL_UPLOAD_TIMEOUT_S)
        if not self._mirroring or not self.active:
            return
        if ended is None or not ended.get("sent"):
            reason = (
                (ended or {}).get("failure")
                or mirror.lost
                or (f"still sending after {FINAL_UPLOAD_TIMEOUT_S:.0f} s" if ended is None else "not sent")
            )
            self._give_up(f"{(ended or {}).get('failed_at') or 'upload'}: {reason}")
        elif ended.get("caught_up") and self.record.unsynced:  # a resume sent what an earlier run had not
            with self._lock:
                self.record.unsynced = None
            self._save()

    def _give_up(self, what: str) -> None:
        """MLflow is missing part of the record: note why, and say how to send it."""
        self._mirroring = False
        self.record.unsynced = self.record.unsynced or what
        self._save()
        print(
            f"runjob: MLflow at {self.tracking_uri} stopped taking the run's record ({self.record.unsynced}); "
            f"training went on and the record is complete in {self.output_dir}: upload it with "
            f"`runjob sync {self.output_dir}`",
            flush=True,
        )

    def _save(self) -> None:
        if self.active:
            with self._lock:
                self.record.write(self.output_dir)


def upload_artifact(client: Any, run_id: str, path: Path, artifact_path: str | None) -> None:
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


def log_logged_model(client: Any, run_id: str, folder: Path, name: str = MODEL_ARTIFACT) -> str:
    """The MLflow model in ``folder`` as a logged model called ``name`` (the job's name) of
    ``run_id``: MLflow 3 lists it under the run's models (and the experiment's Models tab), and
    ``runs:/ID/<name>`` loads it. Its files are stored once, in the model's own artifact location.
    A run that has one already (``runjob sync`` again) keeps it. Returns the model id."""
    from mlflow.entities import LoggedModelOutput

    experiment = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models(
        [experiment], filter_string=f"source_run_id = '{run_id}' AND name = '{name}'", max_results=1
    )
    if found:
        return found[0].model_id
    model = client.create_logged_model(experiment, name=name, source_run_id=run_id, model_type="pytorch")
    client.log_model_artifacts(model.model_id, str(folder))
    client.finalize_logged_model(model.model_id, "READY")
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, 0)])
    return model.model_id


def log_inputs(client: Any, run_id: str, entries: list[dict[str, str]]) -> None:
    """Log recorded dataset lineage entries as MLflow dataset inputs."""
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
            tags=[InputTag("mlflow.data.context", e["context"])],
        )
        for e in entries
    ]
    client.log_inputs(run_id, datasets=inputs)


def resolve_tracking_uri(explicit: str | None = None) -> str:
    """``explicit``, else ``$MLFLOW_TRACKING_URI``, else MLflow's default (``sqlite:///mlflow.db``)."""
    return tracking_uri_and_source(explicit)[0]


def tracking_uri_and_source(explicit: str | None = None, setting: str = "tracking.uri") -> tuple[str, str]:
    """The tracking URI a run would use and where it came from: ``explicit`` (named ``setting``),
    else ``$MLFLOW_TRACKING_URI``, else MLflow's default."""
    if explicit:
        return explicit, setting
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], "$MLFLOW_TRACKING_URI"
    import mlflow

    return mlflow.get_tracking_uri(), "MLflow's default"


def default_experiment(tracking: Any, job_name: str) -> str:
    """``tracking.experiment``, else ``$MLFLOW_EXPERIMENT_NAME``, else the job's name."""
    return tracking.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or job_name


def close_failed_run(output_dir: Path, reason: str) -> None:
    """After a worker failed: note which (``reason``) on the job's run, and mark the run FAILED
    where rank 0 could not end it (it was stopped too). A run rank 0 finished stays FINISHED. The
    local record says the same as MLflow, so ``runjob sync`` agrees with it."""
    _close_run(output_dir, "FAILED", {"runjob.worker_failure": reason}, {"runjob.error": reason})


def close_abandoned_run(output_dir: Path, reason: str) -> str | None:
    """A run left RUNNING by a process that was killed (SIGKILL) before its first checkpoint, and
    that nothing can continue: mark it KILLED with ``reason`` as the tag ``runjob.abandoned``, in
    the local record and in MLflow. Returns its MLflow run id (None when there is no record)."""
    return _close_run(output_dir, "KILLED", {}, {"runjob.abandoned": reason})


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
    from mlflow import MlflowClient

    bound_http_retries()
    try:
        client = MlflowClient(tracking_uri=record.tracking_uri)
        for key, value in tags.items():
            client.set_tag(record.run_id, key, value)
        if client.get_run(record.run_id).info.status in open_states:
            for key, value in if_open.items():
                client.set_tag(record.run_id, key, value)
            client.set_terminated(record.run_id, status=status)
    except Exception as error:  # noqa: BLE001 - the local record has it; sync sends it later
        print(
            f"runjob: could not mark MLflow run {record.run_id} {status} ({describe(error)}); "
            f"`runjob sync {output_dir}` sends what the local record says",
            file=sys.stderr,
        )
    return record.run_id
