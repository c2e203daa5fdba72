"""Uploading a run's local record to MLflow (``runjob sync OUTPUT_DIR``).

The record (``mlflow_run.json``, ``metrics*.jsonl``, the artifacts it lists) is everything the run
logged, so uploading it makes the MLflow run complete after an offline run or a lost server.
Uploading twice changes nothing: MLflow keeps one copy of an identical metric point, param or tag.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from runjob.errors import RunjobError, first_line
from runjob.record.local import RunRecord, now_ms, read_metric_points
from runjob.record.model_logging import MODEL_FOLDER
from runjob.record.naming import headline_first, headline_metrics
from runjob.record.tracking import experiment_id, log_inputs, upload_artifact

METRICS_PER_CALL = 1000  # MLflow's limit for one log_batch
PARAMS_PER_CALL = 100
FINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")


def sync_record(output_dir: Path, record: RunRecord, uri: str) -> dict[str, Any]:
    """Upload ``record`` to the MLflow at ``uri``; returns what was sent."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run_id = _run_on_server(client, record, uri, output_dir)
    try:
        sent = send_record(client, run_id, output_dir, record)
        if record.status in FINAL_STATUSES:
            client.set_terminated(run_id, record.status, record.end_time)
    except RunjobError:
        raise
    except Exception as error:  # noqa: BLE001 - the server refused something: say what, keep the record
        text = first_line(error) or type(error).__name__
        raise RunjobError(f"{output_dir}: MLflow at {uri} refused the upload to run {run_id}: {text[:300]}") from None
    record.unsynced, record.synced_at = None, now_ms()
    record.write(output_dir)
    return {"run_id": run_id, **sent, "status": record.status}


def send_record(
    client: Any, run_id: str, output_dir: Path, record: RunRecord, catching_up: bool = False
) -> dict[str, int]:
    """Send MLflow run ``run_id`` what the local record in ``output_dir`` holds and it lacks: params,
    tags, dataset inputs (MLflow keeps one copy of each), the metric points it does not have, the
    artifacts. ``catching_up``: a resumed run's recording process making up for the points its
    killed predecessor had not sent; it leaves out the MLflow model (the resumed run logs its own).
    The artifacts are sent again whole (MLflow cannot say whether its copy is the latest: a best
    model re-logged under one name keeps its size). Returns how many of each were sent."""
    from mlflow.entities import Metric, Param, RunTag

    params = [Param(k, v) for k, v in record.params.items()]
    for first in range(0, len(params), PARAMS_PER_CALL):
        client.log_batch(run_id, params=params[first : first + PARAMS_PER_CALL])
    tags = [RunTag(k, str(v)) for k, v in record.tags.items()]
    for first in range(0, len(tags), PARAMS_PER_CALL):
        client.log_batch(run_id, tags=tags[first : first + PARAMS_PER_CALL])
    if record.inputs:
        log_inputs(client, run_id, record.inputs)
    local = headline_first(read_metric_points(output_dir), headline_metrics(record.params, record.tags))
    points = [  # the headline metrics first: mlflow ui's compare view opens on a run's first metric
        Metric(p["key"], float(p["value"]), int(p["timestamp"]), int(p["step"]))
        for p in missing_points(client, run_id, local)
    ]
    for first in range(0, len(points), METRICS_PER_CALL):
        client.log_batch(run_id, metrics=points[first : first + METRICS_PER_CALL])
    artifacts = [a for a in record.artifacts if (output_dir / a["path"]).exists()]
    if catching_up:
        artifacts = [a for a in artifacts if a["path"] != MODEL_FOLDER]
    for artifact in artifacts:
        upload_artifact(client, run_id, output_dir / artifact["path"], artifact["artifact_path"])
    return {"params": len(params), "tags": len(tags), "metrics": len(points), "artifacts": len(artifacts)}


def missing_points(client: Any, run_id: str, points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``points`` (as ``metrics.jsonl`` has them) that MLflow run ``run_id`` does not have, in
    their order: a point is the same one when its key, step, timestamp and value are."""

    def same(key: str, step: int, timestamp: int, value: float) -> tuple[str, int, int, float | str]:
        return key, int(step), int(timestamp), "nan" if math.isnan(value) else float(value)

    present: set[tuple[str, int, int, float | str]] = set()
    for key in dict.fromkeys(p["key"] for p in points):
        present.update(same(m.key, m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key))
    return [p for p in points if same(p["key"], p["step"], p["timestamp"], float(p["value"])) not in present]


def _run_on_server(client: Any, record: RunRecord, uri: str, output_dir: Path) -> str:
    """The run to upload into: the recorded one when it is on this server, else a new one (an
    offline run, or a copy to another server), remembered in the record so repeats reuse it."""
    from mlflow.exceptions import MlflowException

    if uri == record.tracking_uri and record.run_id:
        candidates = [record.run_id]
    else:
        candidates = [record.copies.get(uri)]
    for run_id in filter(None, candidates):
        try:
            client.get_run(run_id)
            return run_id
        except MlflowException:
            pass  # not on this server (a fresh store): make it anew
    run = client.create_run(
        experiment_id(client, record.experiment),
        start_time=record.start_time,
        tags=record.tags,
        run_name=record.run_name,
    )
    if uri == record.tracking_uri:
        record.run_id = run.info.run_id
    else:
        record.copies[uri] = run.info.run_id
    record.write(output_dir)  # before uploading: a failed upload is retried into this run
    return run.info.run_id
