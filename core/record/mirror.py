"""The recording process: MLflow's half of a run's record, out of the training process's way.

The training process writes the local record (``mlflow_run.json``, ``metrics.jsonl``) and sends
each thing it records, as a JSON line, down a pipe to this process (``python -m
runjob.record.mirror``), which creates the MLflow run and mirrors the record into it: the same
calls, in the same order, with metric points gathered into few ``log_batch`` calls
(:class:`runjob.record.tracking.Uploader`). It also writes the run's MLflow model at the end
(record.model_logging), so the training process never imports MLflow: its import, the run's
creation, every upload and the MLflow model run on another core instead of before the first step
and between the steps (benchmarks/RESULTS.md, section 8). Where MLflow is imported in the
training process already, the same work runs in a thread of it instead (:func:`in_process`).

Nothing is lost when this process is slow or stops: the local record holds everything and
``runjob sync`` uploads it; a resumed run's recording process first sends MLflow what the record
holds and it lacks (what a killed predecessor had not sent). It reads the pipe in a thread of its
own, so the training process's writes never wait on MLflow. It ignores SIGINT and SIGTERM (a Ctrl-C
reaches the whole process group; the training process ends the run, then says ``close``), and it
exits once told to, or when the pipe closes, after sending what it has.

Messages in (one JSON object a line, one key): ``start`` (first: where and what to record),
``metrics`` (lines as ``metrics.jsonl`` has them), ``tags``, ``artifact``, ``input``, ``model``,
``end``. Replies out: ``started`` (run id, tracking URI, experiment id) or ``error``, ``model``
(``{"error": ...}`` when it could not be built), and ``ended`` (whether everything was sent, and
whether a resumed run's catch-up was).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODULE = "runjob.record.mirror"


_early: subprocess.Popen | None = None  # started by prestart(), waiting for its first message


def _spawn() -> subprocess.Popen:
    # it builds the MLflow model on the CPU (no CUDA context); no progress bars between its files
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    return subprocess.Popen(
        [sys.executable, "-m", MODULE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
        encoding="utf-8",
    )


def prestart() -> None:
    """Start the recording process now, before the training process imports torch: it imports
    MLflow on another core meanwhile, and the next :class:`Mirror` takes it over."""
    global _early
    if _early is None and not in_process():
        _early = _spawn()


def in_process() -> bool:
    """Whether to record in a thread of this process instead: where MLflow is imported already
    (a notebook, the test kit, a sweep's parent), there is no import to take off its path."""
    return "mlflow" in sys.modules


def discard_prestarted() -> None:
    """A prestarted recording process that no Mirror took over (the run stopped first): end it."""
    global _early
    if _early is not None:
        process, _early = _early, None
        process.kill()  # it was told nothing: nothing to finish
        process.wait(30)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


class Mirror:
    """The training process's end of the pipe: starts the recording process (or takes over the
    one :func:`prestart` started) and talks to it."""

    def __init__(self, start: dict[str, Any]) -> None:
        global _early
        self._replies: dict[str, Any] = {}
        self._arrived = threading.Condition()
        self._gone = False
        self.lost: str | None = None  # why the pipe broke, when it did
        self._inbox: queue.Queue | None = None
        if _early is None and in_process():  # the same work, in a thread: see in_process()
            self._proc = None
            self._inbox = queue.Queue()
            self._reader = threading.Thread(target=self._serve, name="runjob-recording", daemon=True)
        else:
            self._proc, _early = (_early or _spawn()), None
            self._reader = threading.Thread(target=self._read, name="runjob-mirror-replies", daemon=True)
        self._reader.start()
        self.send({"start": start})

    def _serve(self) -> None:
        assert self._inbox is not None
        try:
            serve(self._inbox, self._deliver)
        finally:
            with self._arrived:
                self._gone = True
                self._arrived.notify_all()

    def _deliver(self, reply: dict[str, Any]) -> None:
        with self._arrived:
            self._replies.update(reply)
            self._arrived.notify_all()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            self._deliver(reply)
        with self._arrived:
            self._gone = True
            self._arrived.notify_all()

    def send(self, message: dict[str, Any]) -> None:
        """Queue ``message`` for the recording process; never waits on MLflow."""
        if self._inbox is not None:
            self._inbox.put(message)
            return
        if self.lost is not None or self._proc.stdin is None:
            return
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
        except (OSError, ValueError) as error:  # it died: the local record has everything
            self.lost = f"the recording process stopped ({type(error).__name__})"

    def reply(self, kind: str, timeout: float, also: str | None = None) -> Any | None:
        """Wait at most ``timeout`` s for the reply ``kind`` (or ``also``, or the process's end);
        returns the reply ``kind``, None when it did not come."""
        with self._arrived:
            self._arrived.wait_for(lambda: kind in self._replies or also in self._replies or self._gone, timeout)
            return self._replies.get(kind)

    def close(self, timeout: float) -> dict[str, Any] | None:
        """End the conversation: the pipe is closed, the process sends what it has and exits
        (waited for at most ``timeout`` s, then killed). Returns its ``ended`` reply."""
        if self._inbox is not None:
            self._inbox.put(None)
            self._reader.join(timeout)
            return self._replies.get("ended")
        # said, not only the pipe closed: a DataLoader worker forked from this process holds a copy
        # of the pipe's end, so the recording process may never see it close
        self.send({"close": True})
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(10)
        return self._replies.get("ended")


# ---------------------------------------------------------------------------------------------
# the recording process


class _Recording:
    """What the recording process does with each message."""

    def __init__(self, answer: Callable[[dict[str, Any]], None]) -> None:
        self._answer = answer
        self.client: Any = None
        self.run_id: str | None = None
        self.uploader: Any = None
        self.output_dir = Path()
        self.start: dict[str, Any] = {}
        self.host: Any = None
        self.first_metrics: Any = None  # a new run's: HeadlineFirst
        self.prewarmed: threading.Thread | None = None
        self.caught_up = False  # a resumed run: MLflow was given what its killed predecessor had not sent

    def reply(self, **message: Any) -> None:
        self._answer(message)

    def begin(self, start: dict[str, Any]) -> bool:
        """Create (or reopen, or join) the MLflow run; reply ``started`` or ``error``."""
        from runjob.errors import TrackingError, describe
        from runjob.record import logfile
        from runjob.record.tracking import resolve_tracking_uri

        self.start = start
        self.output_dir = Path(start["output_dir"])
        logfile.open_in(self.output_dir)  # MLflow's chatter (a new database's creation) goes there
        uri = resolve_tracking_uri(start.get("tracking_uri"))
        default = resolve_tracking_uri(None)  # what `runjob runs` reads without --tracking-uri
        if start.get("offline"):
            self.reply(
                started={
                    "run_id": start.get("run_id"),
                    "tracking_uri": uri,
                    "experiment_id": None,
                    "default_uri": default,
                }
            )
            return True
        try:
            self.run_id, experiment = _open_run(start, uri)
        except TrackingError as error:
            self.reply(error=str(error))
            return False
        except Exception as error:  # noqa: BLE001 - any failure to reach MLflow is the same to the user
            self.reply(error=f"cannot record the run to MLflow at {uri} (tracking.uri): {describe(error)}")
            return False
        from mlflow import MlflowClient

        from runjob.record.tracking import Uploader

        self.client = MlflowClient(tracking_uri=uri)
        self.uploader = Uploader(lambda metrics: self.client.log_batch(self.run_id, metrics=metrics))
        if start.get("role") == "main" and start.get("run_id") is None:  # a new run: its headline metrics first
            from runjob.record.naming import HeadlineFirst, headline_metrics

            self.first_metrics = HeadlineFirst(headline_metrics(start.get("params") or {}, start.get("tags") or {}))
        self.reply(
            started={"run_id": self.run_id, "tracking_uri": uri, "experiment_id": experiment, "default_uri": default}
        )
        if start.get("role") == "main" and start.get("run_id") is not None:
            self._catch_up()
        return True

    def _catch_up(self) -> None:
        """A resumed run: the process that recorded it before may have been killed (SIGKILL,
        the machine lost) with points not yet sent, which only ``metrics.jsonl`` holds. Send
        MLflow what the local record has and it lacks, first in the upload queue: this process's
        time, not training's."""
        from runjob.record.local import RunRecord
        from runjob.record.sync import send_record

        def send() -> None:
            record = RunRecord.read(self.output_dir)
            if record is not None:
                send_record(self.client, self.run_id, self.output_dir, record, catching_up=True)
                self.caught_up = True

        self.uploader.submit(send, "what the run recorded before it was resumed")

    def prewarm(self) -> None:
        """Import what building the MLflow model needs, and load the plugins, in a thread while
        training runs, so the end of the run does not wait for them and the messages that arrive
        meanwhile go to MLflow at once (a process killed with them still queued loses them)."""
        if self.start.get("log_model", "none") != "none":
            self.prewarmed = threading.Thread(target=self._prewarm, name="runjob-prewarm", daemon=True)
            self.prewarmed.start()

    def _prewarm(self) -> None:
        kind = self.start.get("log_model", "none")
        from runjob.host.plugin_host import load_plugins

        try:
            self.host = load_plugins(self.start.get("disabled") or {})
            if kind == "weights":
                import mlflow.pyfunc  # noqa: F401 - no torch: writing this model needs none
            else:  # pickle, pt2: the model is built here, from the weights
                import mlflow.pytorch  # noqa: F401
                import torch  # noqa: F401
        except Exception:  # noqa: BLE001 - only a head start: building the model says what is wrong
            self.host = None

    def handle(self, message: dict[str, Any]) -> None:
        ((kind, value),) = message.items()
        if kind == "model":
            self._model(value)
            return
        if self.uploader is None:
            return
        if kind == "metrics":
            self._submit_metrics(self.first_metrics.take(value) if self.first_metrics else value)
        elif kind == "tags":
            from mlflow.entities import RunTag

            tags = [RunTag(k, str(v)) for k, v in value.items()]
            self.uploader.submit(lambda: self.client.log_batch(self.run_id, tags=tags), "tags")
        elif kind == "artifact":
            self._upload(value["path"], value["artifact_path"])
        elif kind == "input":
            from runjob.record.tracking import log_inputs

            self.uploader.submit(lambda: log_inputs(self.client, self.run_id, [value]), f"dataset {value['name']}")
        elif kind == "end":
            self._submit_metrics(self.first_metrics.release() if self.first_metrics else [])
            status, end_time = value["status"], value["end_time"]
            self.uploader.submit(lambda: self.client.set_terminated(self.run_id, status, end_time), "the run's end")

    def _submit_metrics(self, value: list[dict[str, Any]]) -> None:
        if not value:
            return
        from mlflow.entities import Metric

        points = [Metric(p["key"], float(p["value"]), int(p["timestamp"]), int(p["step"])) for p in value]
        self.uploader.submit_metrics(points, points[-1].step)

    def _upload(self, relative: str, artifact_path: str | None) -> None:
        from runjob.record.tracking import upload_artifact

        path = self.output_dir / relative
        self.uploader.submit(
            lambda: upload_artifact(self.client, self.run_id, path, artifact_path), f"artifact {relative}"
        )

    def _model(self, request: dict[str, Any]) -> None:
        """Build the MLflow model of the final weights into ``OUTPUT_DIR/mlflow_model`` and upload
        it as the run's logged model; reply ``model``."""
        from runjob.errors import RunjobError, describe

        if self.prewarmed is not None:
            self.prewarmed.join()  # the plugins it loads build the model
        notes: list[str] = []
        try:
            folder = _build_model(self.output_dir, request, self.host, notes)
        except RunjobError as error:
            self.reply(model={"error": str(error)})
            return
        except Exception as error:  # noqa: BLE001 - said in one line by the training process
            self.reply(model={"error": f"could not write the MLflow model: {describe(error)}"})
            return
        self.reply(model={"folder": str(folder), "notes": notes})
        if self.uploader is not None:
            name = self.start.get("model_name") or "model"  # the job's name
            self._upload(str(folder.relative_to(self.output_dir)), name)

    def finish(self) -> None:
        """Send what is queued; reply ``ended``."""
        from runjob.record.tracking import FINAL_UPLOAD_TIMEOUT_S

        if self.uploader is None:
            self.reply(ended={"sent": True})
            return
        self._submit_metrics(self.first_metrics.release() if self.first_metrics else [])
        sent = self.uploader.close(FINAL_UPLOAD_TIMEOUT_S)
        self.reply(
            ended={
                "sent": sent,
                "failure": self.uploader.failure,
                "failed_at": self.uploader.failed_at,
                "caught_up": self.caught_up,
            }
        )


def _open_run(start: dict[str, Any], uri: str) -> tuple[str, str]:
    """Create the run with its tags and params (or reopen a resumed one, or take the one another
    machine's main process made); returns the run id and its experiment id."""
    from mlflow import MlflowClient
    from mlflow.entities import Param, RunTag

    from runjob.record.tracking import bound_http_retries, experiment_id

    bound_http_retries()
    client = MlflowClient(tracking_uri=uri)
    run_id = start.get("run_id")
    if start.get("role") == "node":
        return run_id, client.get_run(run_id).info.experiment_id
    tags = start["tags"]
    if run_id is None:
        run = client.create_run(
            experiment_id(client, start["experiment"]),
            start_time=start["start_time"],
            tags=tags,
            run_name=start["run_name"],
        )
        run_id = run.info.run_id
    else:
        run = client.get_run(run_id)
        client.update_run(run_id, status="RUNNING")
    try:
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        if start.get("log_params"):  # a resumed run logged its params when it began; changes are in the tags
            items = [Param(k, v) for k, v in start["params"].items()]
            for first in range(0, len(items), 100):  # MLflow takes 100 params a call
                client.log_batch(run_id, params=items[first : first + 100])
    except Exception:
        try:
            client.set_terminated(run_id, "FAILED")
        except Exception:  # noqa: BLE001 - already reporting the error that matters
            pass
        raise
    return run_id, run.info.experiment_id


def _build_model(output_dir: Path, request: dict[str, Any], host: Any = None, notes: list[str] | None = None) -> Path:
    """The run's job rebuilt from its ``job.toml`` (with the plugins the run had), its example
    input loaded, and the MLflow model written (record.model_logging)."""
    from runjob.host.plugin_host import load_plugins
    from runjob.job.validation import load_resolved
    from runjob.record.model_logging import save_mlflow_model

    host = host or load_plugins(request.get("disabled") or {})
    job = load_resolved(output_dir / "job.toml", [], host)
    example = None
    if request.get("example"):
        import torch

        example = torch.load(request["example"], weights_only=True)
    return save_mlflow_model(job, output_dir, example, host, request.get("prediction"), notes)


def serve(inbox: queue.Queue, answer: Callable[[dict[str, Any]], None]) -> None:
    """Record what arrives in ``inbox`` (messages, then None at the end), answering through ``answer``."""
    first = inbox.get()
    if not first or "start" not in first:
        return
    recording = _Recording(answer)
    if not recording.begin(first["start"]):
        return
    recording.prewarm()
    while (message := inbox.get()) is not None:
        recording.handle(message)
    recording.finish()


def main() -> int:
    os.nice(10)  # where it competes with training for a core, training goes first
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")  # replies; anything printed goes to stderr
    os.dup2(2, 1)
    inbox: queue.Queue = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "close" in message:
                break
            inbox.put(message)
        inbox.put(None)

    def answer(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    threading.Thread(target=read, name="runjob-mirror-inbox", daemon=True).start()
    import mlflow  # noqa: F401 - the slow part of starting, done while the training process starts too

    from runjob.record.logfile import LibraryLog

    LibraryLog("recording").start()  # after MLflow's import, which sets its loggers' handlers; to os._exit
    serve(inbox, answer)
    # Everything is sent and said; the interpreter's own teardown (MLflow, SQLAlchemy: half a second
    # here) would only keep the training process waiting for this one to exit.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
