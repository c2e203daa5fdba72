"""A run a command records itself (``runjob evaluate``'s evaluation, ``runjob sweep``'s parent run),
recorded as a training run is: its local record first, then MLflow.

The folder gets the files a training run's output folder holds for its record (``mlflow_run.json``,
``metrics.jsonl``, the artifacts it lists), so ``runjob sync FOLDER`` uploads whatever MLflow
missed. Each part then goes to MLflow at once, through the one writer
(:class:`runjob.record.mlflow_writer.RunWriter`), tried again while the store is busy
(:class:`runjob.record.mlflow_writer.Retrying`, as a training run's record is); a write that fails
every try is noted as the record's ``unsynced``, and one the store gave no answer to stops the
writing (each later call would wait through its retries too).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from runjob.errors import RunjobError
from runjob.host.run_folder import METRICS_FILE
from runjob.record.local import RUN_RECORD, MetricsWriter, RunRecord, now_ms
from runjob.record.messages import Point
from runjob.record.mlflow_writer import RETRY_DELAYS_S, Retrying, RunWriter, connect, retried
from runjob.record.uri import check_reachable


class CommandRun:
    """One run recorded by a command: :meth:`begin`, the ``log_*`` calls, :meth:`end`."""

    def __init__(self, folder: Path, record: RunRecord) -> None:
        self.folder = Path(folder)
        self.record = record
        self.writer: RunWriter | None = None  # once MLflow has the run
        self.failure: str | None = None  # what MLflow did not take first, and why
        self.error: BaseException | None = None  # the error that said so
        self._gone = False  # the store gave no answer: later writes are not tried

    @classmethod
    def begin(
        cls,
        folder: Path,
        uri: str,
        experiment: str,
        run_name: str,
        params: dict[str, str],
        tags: dict[str, str],
        setting: str = "tracking.uri",
    ) -> CommandRun:
        """Write the record of a new run into ``folder`` (made when missing), then create it in
        the MLflow at ``uri`` (named ``setting`` in messages) with its params and tags."""
        folder.mkdir(parents=True, exist_ok=True)
        record = RunRecord(
            tracking_uri=uri, experiment=experiment, run_name=run_name, start_time=now_ms(), params=params, tags=tags
        )
        record.write(folder)
        run = cls(folder, record)
        run._send("the run's creation", lambda: run._create(uri, setting))
        return run

    @classmethod
    def reopen(cls, folder: Path, setting: str = "tracking.uri") -> CommandRun:
        """The run recorded in ``folder``, RUNNING again (a resumed sweep's parent): locally, then
        in MLflow, where it is created now if MLflow never took it."""
        record = RunRecord.read(folder)
        if record is None:
            raise RunjobError(f"{folder}: holds no run record ({RUN_RECORD})")
        record.status, record.end_time = "RUNNING", None
        record.write(folder)
        run = cls(folder, record)
        if record.run_id is None:
            run._send("the run's creation", lambda: run._create(record.tracking_uri or "", setting))
        else:
            run._send("the run's reopening", lambda: run._attach(record.tracking_uri or "", record.run_id or ""))
        return run

    def _attach(self, uri: str, run_id: str) -> None:
        writer = RunWriter(connect(uri), run_id)
        retried(writer.reopen, "the run's reopening")
        self.writer = writer

    def _create(self, uri: str, setting: str) -> None:
        check_reachable(uri, setting)
        record = self.record
        client = connect(uri)
        # each step tried again on its own while the store is busy (not the whole: a second run)
        self.writer = writer = retried(
            lambda: RunWriter.create(client, record.experiment, record.run_name, record.tags, record.start_time),
            "the run's creation",
        )
        record.run_id = writer.run_id
        record.write(self.folder)  # before the params: a failure after this is synced into this run
        retried(lambda: writer.params(record.params), "params")

    @property
    def run_id(self) -> str | None:
        return self.record.run_id

    @property
    def online(self) -> bool:
        """Whether MLflow has taken everything so far."""
        return self.writer is not None and self.failure is None

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` at ``step``: a line each in ``metrics.jsonl``, then to MLflow."""
        stamp = now_ms()
        writer = MetricsWriter(self.folder / METRICS_FILE)
        try:
            writer.write(metrics, step, stamp)
        finally:
            writer.close()
        points = [Point(key, float(value), step, stamp) for key, value in metrics.items()]
        self._send(f"metrics of step {step}", lambda: self._writer.metrics(points))

    def set_tags(self, tags: dict[str, str]) -> None:
        tags = {str(k): str(v) for k, v in tags.items()}
        self.record.tags.update(tags)
        self.record.write(self.folder)
        self._send("tags", lambda: self._writer.tags(tags))

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Record the file or folder ``path`` (inside the folder) as an artifact; sent again
        whole when it changed since (the same file logged twice replaces MLflow's copy)."""
        relative = str(Path(path).relative_to(self.folder))
        if self.record.add_artifact(relative, artifact_path):
            self.record.write(self.folder)
        self._send(f"artifact {relative}", lambda: self._writer.artifact(Path(path), artifact_path))

    def end(self, status: str) -> None:
        """Close the run as FINISHED, FAILED or KILLED, locally, then in MLflow."""
        self.record.status, self.record.end_time = status, now_ms()
        self.record.write(self.folder)
        end_time = self.record.end_time
        self._send("the run's end", lambda: self._writer.terminate(status, end_time))

    @property
    def _writer(self) -> RunWriter:
        """The MLflow run (a write is sent only once it exists: ``_send`` skips it otherwise)."""
        if self.writer is None:
            raise RunjobError(f"{self.folder}: MLflow has no run for this record")
        return self.writer

    def _send(self, what: str, call: Callable[[], object]) -> None:
        """``call`` to MLflow, tried again while the store is busy, unless the store stopped
        answering before; a write that fails every try is noted, not raised."""
        if self.failure is not None and (self._gone or self.writer is None):
            return
        outcome = Retrying(delays=() if self.writer is None else RETRY_DELAYS_S).write(call, what)
        if outcome.error is None:
            return
        error = outcome.exception
        text = str(error) if isinstance(error, RunjobError) else outcome.error
        self.failure, self.error = self.failure or f"{what}: {text[:500]}", self.error or error
        self._gone = self._gone or outcome.unreachable
        self.record.unsynced = self.failure
        self.record.write(self.folder)
