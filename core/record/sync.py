"""``runjob sync OUTPUT_DIR``: upload a run's local record to MLflow.

The record (``mlflow_run.json``, ``metrics*.jsonl``, the artifacts it lists) is everything the run
logged, so uploading it makes the MLflow run complete after an offline run or a lost server.
Uploading twice changes nothing: MLflow keeps one copy of an identical metric point, param or tag.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from runjob.errors import RunjobError
from runjob.record.tracking import (
    RUN_RECORD,
    check_reachable,
    experiment_id,
    log_inputs,
    read_record,
    resolve_tracking_uri,
    upload_artifact,
    write_record,
)

METRICS_PER_CALL = 1000  # MLflow's limit for one log_batch
PARAMS_PER_CALL = 100
FINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")


def read_metric_points(output_dir: Path) -> list[dict[str, Any]]:
    """Every metric point in ``metrics.jsonl`` and the other machines' ``metrics.node<k>.jsonl``.
    A last line cut short by a crash is left out."""
    points = []
    for path in sorted(output_dir.glob("metrics*.jsonl")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                points.append(json.loads(line))
            except json.JSONDecodeError:
                if number < len(lines):
                    raise RunjobError(f"{path}:{number}: not a metric record (JSON): {line[:80]!r}") from None
    return points


def cmd_sync(args: argparse.Namespace) -> int:
    output_dir: Path = args.output_dir
    record = read_record(output_dir)
    if not record:
        raise RunjobError(f"{output_dir}: no {RUN_RECORD} here: not the output folder of a runjob run")
    uri = resolve_tracking_uri(args.tracking_uri or record.get("tracking_uri"))
    check_reachable(uri, "--tracking-uri" if args.tracking_uri else f"recorded in {output_dir / RUN_RECORD}")
    summary = sync_record(output_dir, record, uri)
    print(
        f"runjob: synced {output_dir} to MLflow run {summary['run_id']} at {uri}: {summary['params']} params, "
        f"{summary['tags']} tags, {summary['metrics']} metric points, {summary['artifacts']} artifacts, status {summary['status']}"
    )
    if summary["status"] == "RUNNING":
        print(
            "runjob: the record says RUNNING: the run is still going, or it was killed before it could record its end "
            "(`runjob run JOB --output-dir DIR --resume` continues it)"
        )
    return 0


def sync_record(output_dir: Path, record: dict[str, Any], uri: str) -> dict[str, Any]:
    """Upload ``record`` to the MLflow at ``uri``; returns what was sent."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    client = MlflowClient(tracking_uri=uri)
    run_id = _run_on_server(client, record, uri, output_dir)
    try:
        params = [Param(k, v) for k, v in record.get("params", {}).items()]
        for first in range(0, len(params), PARAMS_PER_CALL):
            client.log_batch(run_id, params=params[first : first + PARAMS_PER_CALL])
        tags = [RunTag(k, str(v)) for k, v in record.get("tags", {}).items()]
        for first in range(0, len(tags), PARAMS_PER_CALL):
            client.log_batch(run_id, tags=tags[first : first + PARAMS_PER_CALL])
        if record.get("inputs"):
            log_inputs(client, run_id, record["inputs"])
        points = [
            Metric(p["key"], float(p["value"]), int(p["timestamp"]), int(p["step"]))
            for p in read_metric_points(output_dir)
        ]
        for first in range(0, len(points), METRICS_PER_CALL):
            client.log_batch(run_id, metrics=points[first : first + METRICS_PER_CALL])
        artifacts = [a for a in record.get("artifacts", []) if (output_dir / a["path"]).exists()]
        for artifact in artifacts:
            upload_artifact(client, run_id, output_dir / artifact["path"], artifact["artifact_path"])
        status = record.get("status", "RUNNING")
        if status in FINAL_STATUSES:
            client.set_terminated(run_id, status, record.get("end_time"))
    except RunjobError:
        raise
    except Exception as error:  # noqa: BLE001 - the server refused something: say what, keep the record
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RunjobError(f"{output_dir}: MLflow at {uri} refused the upload to run {run_id}: {text[:300]}") from None
    record.pop("unsynced", None)
    record["synced_at"] = int(time.time() * 1000)
    write_record(output_dir, record)
    return {
        "run_id": run_id,
        "params": len(params),
        "tags": len(tags),
        "metrics": len(points),
        "artifacts": len(artifacts),
        "status": status,
    }


def _run_on_server(client: Any, record: dict[str, Any], uri: str, output_dir: Path) -> str:
    """The run to upload into: the recorded one when it is on this server, else a new one (an
    offline run, or a copy to another server), remembered in the record so repeats reuse it."""
    from mlflow.exceptions import MlflowException

    if uri == record.get("tracking_uri") and record.get("run_id"):
        candidates = [record["run_id"]]
    else:
        candidates = [record.get("copies", {}).get(uri)]
    for run_id in filter(None, candidates):
        try:
            client.get_run(run_id)
            return run_id
        except MlflowException:
            pass  # not on this server (a fresh store): make it anew
    run = client.create_run(
        experiment_id(client, record["experiment"]),
        start_time=record.get("start_time"),
        tags=record.get("tags", {}),
        run_name=record.get("run_name"),
    )
    if uri == record.get("tracking_uri"):
        record["run_id"] = run.info.run_id
    else:
        record.setdefault("copies", {})[uri] = run.info.run_id
    write_record(output_dir, record)  # before uploading: a failed upload is retried into this run
    return run.info.run_id
