"""``runjob sync OUTPUT_DIR``: upload a run's local record to MLflow (a sweep's: its trials' too)."""

from __future__ import annotations

import argparse
from pathlib import Path

from runjob.errors import RunjobError
from runjob.host.output import screen
from runjob.record.local import RUN_RECORD, RunRecord
from runjob.record.sync import sync_record
from runjob.record.uri import check_reachable, resolve_tracking_uri
from runjob.sweep.sweep_folder import SWEEP_FILE, TRIAL_PATTERN


def cmd_sync(args: argparse.Namespace) -> int:
    """Upload everything the run in ``args.output_dir`` recorded; safe to repeat."""
    output_dir: Path = args.output_dir
    record = RunRecord.read(output_dir)
    if record is None:
        raise RunjobError(f"{output_dir}: no {RUN_RECORD} here: not the output folder of a runjob run")
    uri = resolve_tracking_uri(args.tracking_uri or record.tracking_uri)
    check_reachable(uri, "--tracking-uri" if args.tracking_uri else f"recorded in {output_dir / RUN_RECORD}")
    summary = sync_record(output_dir, record, uri)
    screen.each(
        f"runjob: synced {output_dir} to MLflow run {summary['run_id']} at {uri}: {summary['params']} params, "
        f"{summary['tags']} tags, {summary['metrics']} metric points, {summary['artifacts']} artifacts, "
        f"status {summary['status']}"
    )
    trials = sorted(output_dir.glob(f"{TRIAL_PATTERN}/{RUN_RECORD}")) if (output_dir / SWEEP_FILE).exists() else []
    for trial_record in trials:  # a sweep's folder: its trials' runs too
        trial = trial_record.parent
        recorded = RunRecord.read(trial)
        if recorded is not None:
            done = sync_record(trial, recorded, uri)
            said = f"{done['metrics']} metric points, status {done['status']}"
            screen.each(f"runjob: synced the trial {trial} to MLflow run {done['run_id']}: {said}")
    if summary["status"] == "RUNNING":
        screen.each(
            "runjob: the record says RUNNING: the run is still going, or it was killed before it could record its end "
            "(`runjob run JOB --output-dir DIR --resume` continues it)"
        )
    return 0
