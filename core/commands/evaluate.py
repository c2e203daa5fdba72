"""``runjob evaluate RUN``: a finished run's model evaluated again by its task, recorded as a new
MLflow run tagged ``runjob.evaluated_from``."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from runjob.commands.table import render
from runjob.errors import TrackingError, describe

EVALUATED_FROM = "runjob.evaluated_from"


def add_run_reference(parser: argparse.ArgumentParser) -> None:
    """The RUN argument every command on a trained model takes."""
    parser.add_argument("run", metavar="RUN", help="the run: its output folder, its MLflow run id, or runs:/ID")


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Evaluate run RUN's final weights on its validation (or test) split with the job's task, print
    the metrics and record them as a new MLflow run."""
    from runjob.host.plugin_host import load_plugins
    from runjob.train.trained import evaluate_split, find_run, load_job

    host = load_plugins()
    with tempfile.TemporaryDirectory(prefix="runjob-evaluate-") as scratch:
        run = find_run(args.run, args.tracking_uri, Path(scratch))
        job = load_job(run, args.overrides, host)
        metrics = evaluate_split(run, job, args.split)
    print("\n".join(render(["metric", "value"], [[name, f"{value:.6g}"] for name, value in metrics.items()])))
    if not args.no_record:
        run_id, uri = record_evaluation(run, job, args, metrics)
        print(f"runjob: recorded as MLflow run {run_id} at {uri}", file=sys.stderr)
    return 0


def record_evaluation(run: Any, job: Any, args: argparse.Namespace, metrics: dict[str, float]) -> tuple[str, str]:
    """A new MLflow run in the evaluated run's experiment (and store, unless ``--tracking-uri``
    says another): the job's params, the metrics, and tags naming the run it evaluated."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    from runjob import __version__
    from runjob.host.task import declared_metrics
    from runjob.job.redaction import redact_override
    from runjob.record.local import now_ms
    from runjob.record.naming import recorded_params
    from runjob.record.tracking import (
        check_reachable,
        default_experiment,
        experiment_id,
        resolve_tracking_uri,
    )

    uri = resolve_tracking_uri(args.tracking_uri or run.tracking_uri or job.tracking.uri)
    check_reachable(uri)
    client = MlflowClient(tracking_uri=uri)
    experiment = run.experiment or default_experiment(job.tracking, job.job.name)
    tags = {
        EVALUATED_FROM: run.run_id or str(run.output_dir),
        "runjob.evaluated_split": args.split,
        "runjob.metrics": json.dumps(declared_metrics(job.task.options, args.split)),
        "runjob.overrides": " ".join(redact_override(o) for o in args.overrides),
        "runjob.version": __version__,
    }
    if run.output_dir is not None:
        tags[f"{EVALUATED_FROM}.output_dir"] = str(run.output_dir.resolve())
    params = recorded_params(job)  # as the training run's, so `runjob runs` finds no difference in the job
    try:
        created = client.create_run(
            experiment_id(client, experiment),
            run_name=f"evaluate {args.split} · {run.run_name or job.job.name}",
            tags=tags,
        )
        run_id = created.info.run_id
        items = [Param(key, value) for key, value in params.items()]
        for first in range(0, len(items), 100):  # MLflow takes 100 params a call
            client.log_batch(run_id, params=items[first : first + 100])
        stamp = now_ms()
        client.log_batch(
            run_id,
            metrics=[Metric(name, float(value), stamp, 0) for name, value in metrics.items()],
            tags=[RunTag(key, value) for key, value in tags.items()],
        )
        client.set_terminated(run_id, "FINISHED")
    except TrackingError:
        raise
    except Exception as error:  # noqa: BLE001 - an unreachable or refusing store is the same to the user
        raise TrackingError(
            f"evaluated, but cannot record the evaluation to MLflow at {uri}: {describe(error)} (--no-record to skip)"
        ) from None
    return run_id, uri
