"""Uploading a run's local record to MLflow (``runjob sync OUTPUT_DIR``).

The record (``mlflow_run.json``, ``metrics*.jsonl``, the artifacts it lists) is everything the run
logged, so uploading it makes the MLflow run complete after an offline run or a lost server. The
same holds for the runs commands record (an evaluation, a sweep's parent): they write the same
record first. Uploading twice changes nothing: MLflow keeps one copy of an identical metric point,
param or tag. The writing itself is :class:`runjob.record.mlflow_writer.RunWriter`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from runjob.errors import RunjobError, first_line
from runjob.record.invocation import pasteable
from runjob.record.local import RunRecord, now_ms
from runjob.record.mlflow_writer import FINAL_STATUSES, RunWriter, connect

if TYPE_CHECKING:
    from mlflow import MlflowClient


def sync_record(output_dir: Path, record: RunRecord, uri: str) -> dict[str, str | int | None]:
    """Upload ``record`` to the MLflow at ``uri``; returns what was sent."""
    client = connect(uri)
    writer = _run_on_server(client, record, uri, output_dir)
    try:
        sent = writer.send_record(output_dir, record)
        if record.status in FINAL_STATUSES:
            writer.terminate(record.status, record.end_time)
    except RunjobError:
        raise
    except Exception as error:  # noqa: BLE001 - the server refused something: say what, keep the record
        text = first_line(error) or type(error).__name__
        raise RunjobError(
            f"{output_dir}: MLflow at {uri} refused the upload to run {writer.run_id}: {text[:300]}"
        ) from None
    record.unsynced, record.synced_at = None, now_ms()
    record.write(output_dir)
    return {"run_id": writer.run_id, **sent, "status": record.status}


def _run_on_server(client: MlflowClient, record: RunRecord, uri: str, output_dir: Path) -> RunWriter:
    """The run to upload into: the recorded one when it is on this server, else a new one (an
    offline run, or a copy to another server), remembered in the record so repeats reuse it."""
    # lazy: `runjob sweep`'s workers import this module: mlflow only when a run is uploaded
    from mlflow.exceptions import MlflowException

    if uri == record.tracking_uri and record.run_id:
        candidates = [record.run_id]
    else:
        candidates = [record.copies.get(uri) or ""]
    for run_id in filter(None, candidates):
        try:
            client.get_run(run_id)
            return RunWriter(client, run_id)
        except MlflowException:
            pass  # not on this server (a fresh store): make it anew
    writer = RunWriter.create(client, record.experiment, record.run_name, record.tags, record.start_time)
    if uri == record.tracking_uri:
        record.run_id = writer.run_id
    else:
        record.copies[uri] = writer.run_id
    record.write(output_dir)  # before uploading: a failed upload is retried into this run
    return writer


def make_whole(output_dir: Path) -> str | None:
    """After a run's process ended (a sweep's trial): where its MLflow run lacks part of the local
    record (the run says ``unsynced``) or was left RUNNING though the run ended (its recording process
    died with the end still queued), upload the record now. Returns None when MLflow has the run
    whole (or the run records offline), else one line saying what is missing and how to send it."""
    record = RunRecord.read(output_dir)
    if record is None or record.offline or not record.run_id or not record.tracking_uri:
        return None
    try:
        if not record.unsynced:
            if record.status not in FINAL_STATUSES:
                return None  # still going (resumed later): its own process finishes it
            if connect(record.tracking_uri).get_run(record.run_id).info.status == record.status:
                return None
        sync_record(output_dir, record, record.tracking_uri)
        return None
    except Exception as error:  # noqa: BLE001 - said, with the way to send it later
        reason = record.unsynced or first_line(error) or type(error).__name__
        return f"its MLflow run is missing part of the record ({reason[:200]}): `{pasteable('sync', output_dir)}`"
