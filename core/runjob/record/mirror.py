"""The recording process: MLflow's half of a run's record, out of the training process's way.

The training process writes the local record (``mlflow_run.json``, ``metrics.jsonl``) and sends
each thing it records down a pipe to this process (``python -m runjob.record.mirror``) as a typed
message (:mod:`runjob.record.messages`, one JSON line each), which creates the MLflow run and
mirrors the record into it through the one MLflow writer (:mod:`runjob.record.mlflow_writer`): the
same calls, in the same order, with metric points gathered into few ``log_batch`` calls
(:class:`runjob.record.mlflow_writer.Uploader`). It also writes the run's MLflow model at the end
(record.model_logging), so the training process never imports MLflow: its import, the run's
creation, every upload and the MLflow model run on another core instead of before the first step
and between the steps (benchmarks/RESULTS.md, section 8).

Where it runs is chosen (:data:`runjob.record.messages.Recording`): ``"process"`` (the above) or
``"thread"``, the same work in a thread of the caller (where MLflow is imported already, there is
no import to take off its path). No choice (None) means, for now, ``"thread"`` where MLflow is
imported already and ``"process"`` otherwise (:func:`in_process`).

Nothing is lost when this process is slow or stops: the local record holds everything and
``runjob sync`` uploads it; a resumed run's recording process first sends MLflow what the record
holds and it lacks (what a killed predecessor had not sent). It reads the pipe in a thread of its
own, so the training process's writes never wait on MLflow. It ignores SIGINT, SIGTERM and SIGHUP
(a Ctrl-C, or a closed terminal's hang-up, reaches the whole process group; the training process
ends the run, then says ``Close``), and it
exits once told to, or when the pipe closes, after sending what it has.

Messages in: ``Start`` (a main process: where and what to record) or ``Join`` (another machine's
system metrics) first, then ``Metrics``, ``Tags``, ``Artifact``, ``Input``, ``Model``, ``End``,
``Close``. Replies out: ``Started`` or ``Refused``, ``ModelWritten``, and ``Ended`` (whether
everything was sent, and whether a resumed run's catch-up was).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

from runjob.errors import RunjobError, TrackingError, describe
from runjob.host.output import screen
from runjob.host.plugin_host import load_plugins
from runjob.host.run_folder import RunFolder
from runjob.job.validation import load_resolved
from runjob.record import logfile, messages
from runjob.record.local import RunRecord
from runjob.record.logfile import LibraryLog
from runjob.record.messages import Recording
from runjob.record.mlflow_writer import (
    Retrying,
    RunWriter,
    Uploader,
    connect,
    metric_entities,
    retried,
)
from runjob.record.model_logging import save_mlflow_model
from runjob.record.naming import HeadlineFirst, headline_metrics
from runjob.record.uri import resolve_tracking_uri
from runjob.tags import RETRIED_TAG

if TYPE_CHECKING:
    from runjob.host.plugin_host import PluginHost
    from runjob.record.local import MetricLine

R = TypeVar("R", bound=messages.Reply)  # the kind of reply waited for

MODULE = "runjob.record.mirror"
FINAL_UPLOAD_TIMEOUT_S = 300.0  # the longest the end of a run waits for MLflow


_early: subprocess.Popen[str] | None = None  # started by prestart(), waiting for its first message


def _spawn() -> subprocess.Popen[str]:
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


def choose(recording: Recording | None) -> Recording:
    """``recording``, or where it is None, what :func:`in_process` says."""
    if recording is None:
        return "thread" if in_process() else "process"
    if recording not in ("process", "thread"):
        raise RunjobError(f"recording = {recording!r}: expected 'process' (the default) or 'thread'")
    return recording


def prestart(recording: Recording | None = None) -> None:
    """Start the recording process now, before the training process imports torch: it imports
    MLflow on another core meanwhile, and the next :class:`Mirror` takes it over. Nothing where
    the recording is to be a thread."""
    global _early
    if _early is None and choose(recording) == "process":
        _early = _spawn()


def in_process() -> bool:
    """What no choice of recording means for now: a thread of this process where MLflow is
    imported already (a notebook, the test kit), else a process."""
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


def _import_setuptools_once() -> None:
    """Import setuptools in this thread before the recording thread starts. Its ``_distutils_hack``
    swaps one global import hook in and out while it imports: importing setuptools from two threads
    at once (the recording thread building a wheel, the training thread's ``torch.compile`` building
    its C++ kernels through ``torch.utils.cpp_extension``) can leave the standard library's distutils
    loaded, and torch's build then fails with ``AssertionError: .../distutils/core.py`` (measured:
    the compiled-run test under a recording thread, 3 failures in 3 parallel runs)."""
    if importlib.util.find_spec("setuptools") is not None:
        # lazy: setuptools only where it is installed (see the docstring)
        import setuptools  # type: ignore[import-untyped]  # noqa: F401 - no type information here


class Mirror:
    """The training process's end of the pipe: starts the recording process (or takes over the
    one :func:`prestart` started), or the recording thread, and talks to it. ``first`` is the
    first message (``Start`` or ``Join``); ``recording`` where it runs (see :func:`choose`)."""

    def __init__(self, first: messages.Start | messages.Join, recording: Recording | None = None) -> None:
        global _early
        self.recording = choose(recording)
        self._replies: dict[type, messages.Reply] = {}
        self._arrived = threading.Condition()
        self._gone = False
        self.lost: str | None = None  # why the pipe broke, when it did
        self._inbox: queue.Queue[messages.Message] | None = None
        if self.recording == "thread":
            discard_prestarted()  # one started for a process is not needed
            _import_setuptools_once()
            self._proc = None
            self._inbox = queue.Queue()
            self._reader = threading.Thread(target=self._serve, name="runjob-recording", daemon=True)
        else:
            self._proc, _early = (_early or _spawn()), None
            self._reader = threading.Thread(target=self._read, name="runjob-mirror-replies", daemon=True)
        self._reader.start()
        self.send(first)

    def _serve(self) -> None:
        assert self._inbox is not None
        try:
            serve(self._inbox, self._deliver)
        finally:
            with self._arrived:
                self._gone = True
                self._arrived.notify_all()

    def _deliver(self, reply: messages.Reply) -> None:
        with self._arrived:
            self._replies[type(reply)] = reply
            self._arrived.notify_all()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                reply = messages.decode(line)
            except ValueError as error:  # a bug on one side: said, and the rest still read
                screen.each(f"runjob: the recording process said something unknown: {error}", err=True)
                continue
            if not isinstance(reply, messages.REPLIES):
                screen.each(f"runjob: the recording process sent a {reply.kind} message, not a reply", err=True)
                continue
            self._deliver(reply)
        with self._arrived:
            self._gone = True
            self._arrived.notify_all()

    def send(self, message: messages.Message) -> None:
        """Queue ``message`` for the recording process; never waits on MLflow."""
        if self._inbox is not None:
            self._inbox.put(message)
            return
        assert self._proc is not None
        if self.lost is not None or self._proc.stdin is None:
            return
        try:
            self._proc.stdin.write(messages.encode(message) + "\n")
            self._proc.stdin.flush()
        except (OSError, ValueError) as error:  # it died: the local record has everything
            self.lost = f"the recording process stopped ({type(error).__name__})"

    def reply(self, kinds: tuple[type[R], ...], timeout: float) -> R | None:
        """Wait at most ``timeout`` s for a reply of one of ``kinds`` (or the process's end);
        returns it, None when none came."""

        def arrived() -> R | None:
            return next((cast(R, self._replies[kind]) for kind in kinds if kind in self._replies), None)

        with self._arrived:
            self._arrived.wait_for(lambda: arrived() is not None or self._gone, timeout)
            return arrived()

    def close(self, timeout: float) -> messages.Ended | None:
        """End the conversation: the pipe is closed, the process sends what it has and exits
        (waited for at most ``timeout`` s, then killed). Returns its ``Ended`` reply."""
        if self._inbox is not None:
            self._inbox.put(messages.Close())
            self._reader.join(timeout)
            return cast("messages.Ended | None", self._replies.get(messages.Ended))
        assert self._proc is not None
        # said, not only the pipe closed: a DataLoader worker forked from this process holds a copy
        # of the pipe's end, so the recording process may never see it close
        self.send(messages.Close())
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
        return cast("messages.Ended | None", self._replies.get(messages.Ended))


# ---------------------------------------------------------------------------------------------
# the recording process


class _Recording:
    """What the recording process does with each message."""

    def __init__(self, answer: Callable[[messages.Reply], None]) -> None:
        self.reply = answer
        self.writer: RunWriter = None  # type: ignore[assignment]  # the run's, from begin() on
        self.uploader: Uploader[messages.Point] | None = None
        self.output_dir = Path()
        self.start: messages.Start | None = None  # None: another machine's (Join)
        self.host: PluginHost | None = None
        self.first_metrics: HeadlineFirst | None = None  # a new run's
        self.prewarmed: threading.Thread | None = None
        self.caught_up = False  # a resumed run: MLflow was given what its killed predecessor had not sent

    def begin(self, first: messages.Start | messages.Join) -> bool:
        """Create (or reopen, or join) the MLflow run; reply ``Started`` or ``Refused``."""
        self.start = first if isinstance(first, messages.Start) else None
        self.output_dir = Path(first.output_dir)
        logfile.open_in(self.output_dir)  # MLflow's chatter (a new database's creation) goes there
        uri = resolve_tracking_uri(first.tracking_uri)
        default = resolve_tracking_uri(None)  # what `runjob runs` reads without --tracking-uri
        if self.start is not None and self.start.offline:
            self.reply(messages.Started(self.start.run_id, uri, None, default))
            return True
        try:
            retrying = Retrying()  # one count of retried writes, from the run's creation to its end
            self.writer = _open_run(first, uri, retrying)
            experiment = self.writer.experiment_id()
        except TrackingError as error:
            self.reply(messages.Refused(str(error)))
            return False
        except Exception as error:  # noqa: BLE001 - any failure to reach MLflow is the same to the user
            self.reply(messages.Refused(f"cannot record the run to MLflow at {uri} (tracking.uri): {describe(error)}"))
            return False

        writer = self.writer
        self.uploader = Uploader(
            lambda points: writer.client.log_batch(writer.run_id, metrics=metric_entities(points)), retrying
        )
        if self.start is not None and self.start.run_id is None:  # a new run: its headline metrics first
            self.first_metrics = HeadlineFirst(headline_metrics(self.start.params, self.start.tags))
        self.reply(messages.Started(writer.run_id, uri, experiment, default))
        if self.start is not None and self.start.run_id is not None:
            self._catch_up()
        return True

    def _catch_up(self) -> None:
        """A resumed run: the process that recorded it before may have been killed (SIGKILL,
        the machine lost) with points not yet sent, which only ``metrics.jsonl`` holds. Send
        MLflow what the local record has and it lacks, first in the upload queue: this process's
        time, not training's."""

        def send() -> None:
            record = RunRecord.read(self.output_dir)
            if record is not None:
                self.writer.send_record(self.output_dir, record, catching_up=True)
                self.caught_up = True

        self.sending.submit(send, "what the run recorded before it was resumed")

    def prewarm(self) -> None:
        """Import what building the MLflow model needs, and load the plugins, in a thread while
        training runs, so the end of the run does not wait for them and the messages that arrive
        meanwhile go to MLflow at once (a process killed with them still queued loses them)."""
        if self.start is not None and self.start.log_model != "none":
            self.prewarmed = threading.Thread(target=self._prewarm, name="runjob-prewarm", daemon=True)
            self.prewarmed.start()

    def _prewarm(self) -> None:
        assert self.start is not None

        try:
            self.host = load_plugins(self.start.disabled)
            if self.start.log_model == "weights":
                # lazy: the training process imports this module and never imports mlflow (record.mirror)
                import mlflow.pyfunc  # noqa: F401 - no torch: writing this model needs none
            else:  # pickle, pt2: the model is built here, from the weights
                # lazy: the training process imports this module and never imports mlflow (record.mirror); the recording
                # process imports this module: torch only where a model is logged
                import mlflow.pytorch  # noqa: F401
                import torch  # noqa: F401
        except Exception:  # noqa: BLE001 - only a head start: building the model says what is wrong
            self.host = None

    def handle(self, message: messages.Message) -> None:
        if isinstance(message, messages.Model):
            self._model(message)
            return
        if self.uploader is None:
            return
        writer = self.writer
        if isinstance(message, messages.Metrics):
            self._submit_metrics(self._headline_first(list(message.points)))
        elif isinstance(message, messages.Tags):
            tags = message.tags
            self.uploader.submit(lambda: writer.tags(tags), "tags")
        elif isinstance(message, messages.Artifact):
            self._upload(message.path, message.artifact_path)
        elif isinstance(message, messages.Input):
            entry = message.dataset
            self.uploader.submit(lambda: writer.inputs([entry]), f"dataset {entry['name']}")
        elif isinstance(message, messages.End):
            self._submit_metrics(self._headline_first([], release=True))
            status, end_time, uploader = message.status, message.end_time, self.uploader

            def end() -> None:
                if uploader.retried:  # said in MLflow too: how busy the store was for this run
                    writer.tags({RETRIED_TAG: str(uploader.retried)})
                writer.terminate(status, end_time)

            self.uploader.submit(end, "the run's end")
        else:
            raise ValueError(f"the recording process cannot take a {message.kind} message here")

    def _headline_first(self, points: list[messages.Point], release: bool = False) -> list[messages.Point]:
        """A new run's points as :class:`runjob.record.naming.HeadlineFirst` lets them go (all that
        it holds when ``release``); any other run's as they come."""
        if self.first_metrics is None:
            return points
        lines = [cast("MetricLine", dataclasses.asdict(p)) for p in points]  # HeadlineFirst reads metrics.jsonl's lines
        given = self.first_metrics.release() if release else self.first_metrics.take(lines)
        return [messages.Point.of(line) for line in given]

    @property
    def sending(self) -> Uploader[messages.Point]:
        """The uploader, there from the moment the MLflow run is open."""
        if self.uploader is None:
            raise RunjobError("the recording sent to MLflow before its run was open")
        return self.uploader

    def _submit_metrics(self, points: list[messages.Point]) -> None:
        if points:
            self.sending.submit_metrics(points, points[-1].step)

    def _upload(self, relative: str, artifact_path: str | None) -> None:
        path, writer = self.output_dir / relative, self.writer
        self.sending.submit(lambda: writer.artifact(path, artifact_path), f"artifact {relative}")

    def _model(self, request: messages.Model) -> None:
        """Build the MLflow model of the final weights into ``OUTPUT_DIR/mlflow_model`` and upload
        it as the run's logged model; reply ``ModelWritten``."""
        if self.prewarmed is not None:
            self.prewarmed.join()  # the plugins it loads build the model
        notes: list[str] = []
        try:
            folder = _build_model(self.output_dir, request, self.host, notes)
        except RunjobError as error:
            self.reply(messages.ModelWritten(error=str(error)))
            return
        except Exception as error:  # noqa: BLE001 - said in one line by the training process
            self.reply(messages.ModelWritten(error=f"could not write the MLflow model: {describe(error)}"))
            return
        self.reply(messages.ModelWritten(folder=str(folder), notes=tuple(notes)))
        if self.uploader is not None:
            name = (self.start.model_name if self.start is not None else "") or "model"  # the job's name
            self._upload(str(folder.relative_to(self.output_dir)), name)

    def finish(self) -> None:
        """Send what is queued; reply ``Ended``."""
        if self.uploader is None:
            self.reply(messages.Ended(sent=True))
            return
        self._submit_metrics(self._headline_first([], release=True))
        uploader = self.uploader
        sent = uploader.close(FINAL_UPLOAD_TIMEOUT_S)
        failed_at = uploader.failed_at
        if len(uploader.missed) > 1:
            failed_at = f"{failed_at} and {len(uploader.missed) - 1} more"
        self.reply(
            messages.Ended(sent, uploader.failure, failed_at, self.caught_up, uploader.retried, uploader.stopped)
        )


def _open_run(first: messages.Start | messages.Join, uri: str, retrying: Retrying | None = None) -> RunWriter:
    """Create the run with its tags and params (or reopen a resumed one, or take the one another
    machine's main process made); returns its :class:`runjob.record.mlflow_writer.RunWriter`."""
    client = connect(uri)
    if isinstance(first, messages.Join):
        return RunWriter(client, first.run_id)
    # each write tried again while the store is busy (another run's write holding a sqlite store)
    if first.run_id is None:
        create = RunWriter.create
        made = lambda: create(client, first.experiment, first.run_name, first.tags, first.start_time)  # noqa: E731
        writer = retried(made, "the run's creation", retrying)
    else:
        writer = RunWriter(client, first.run_id)
        retried(writer.reopen, "the run's reopening", retrying)
    try:
        retried(lambda: writer.tags(first.tags), "tags", retrying)
        if first.log_params:  # a resumed run logged its params when it began; changes are in the tags
            retried(lambda: writer.params(first.params), "params", retrying)
    except Exception:
        try:
            writer.terminate("FAILED")
        except Exception:  # noqa: BLE001 - already reporting the error that matters
            pass
        raise
    return writer


def _build_model(
    output_dir: Path, request: messages.Model, host: PluginHost | None = None, notes: list[str] | None = None
) -> Path:
    """The run's job rebuilt from its ``job.toml`` (with the plugins the run had), its example
    input loaded, and the MLflow model written (record.model_logging)."""
    host = host or load_plugins(request.disabled)
    job = load_resolved(RunFolder(output_dir).job_file, [], host)
    example = None
    if request.example:
        import torch  # lazy: the recording process imports this module: torch only where a model is logged

        example = torch.load(request.example, weights_only=True)
    return save_mlflow_model(job, output_dir, example, host, request.prediction, notes)


def serve(inbox: queue.Queue[messages.Message], answer: Callable[[messages.Reply], None]) -> None:
    """Record what arrives in ``inbox`` (a ``Start`` or ``Join``, messages, then ``Close``),
    answering through ``answer``."""
    first = inbox.get()
    if not isinstance(first, messages.Start | messages.Join):
        return
    recording = _Recording(answer)
    if not recording.begin(first):
        return
    recording.prewarm()
    while not isinstance(message := inbox.get(), messages.Close):
        recording.handle(message)
    recording.finish()


def main() -> int:
    os.nice(10)  # where it competes with training for a core, training goes first
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")  # replies; anything printed goes to stderr
    os.dup2(2, 1)
    inbox: queue.Queue[messages.Message] = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            try:
                message = messages.decode(line)
            except ValueError as error:  # a bug on one side: said, and the rest still read
                screen.each(f"runjob recording process: {error}", err=True)
                continue
            if isinstance(message, messages.Close):
                break
            if isinstance(message, messages.REPLIES):  # a reply sent this way: a bug, said, and the rest read
                screen.each(f"runjob recording process: a reply where a message was expected: {line[:80]}", err=True)
                continue
            inbox.put(message)
        inbox.put(messages.Close())

    def answer(message: messages.Reply) -> None:
        replies.write(messages.encode(message) + "\n")
        replies.flush()

    threading.Thread(target=read, name="runjob-mirror-inbox", daemon=True).start()
    # lazy: the training process imports this module and never imports mlflow (record.mirror)
    import mlflow  # noqa: F401 - the slow part of starting, done while the training process starts too

    LibraryLog("recording").start()  # after MLflow's import, which sets its loggers' handlers; to os._exit
    serve(inbox, answer)
    # Everything is sent and said; the interpreter's own teardown (MLflow, SQLAlchemy: half a second
    # here) would only keep the training process waiting for this one to exit.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
