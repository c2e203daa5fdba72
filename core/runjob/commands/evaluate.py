"""``runjob evaluate RUN``: a finished run's model evaluated again by its task, recorded as a new
MLflow run tagged ``runjob.evaluated_from``."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import runjob
from runjob.commands.table import render
from runjob.errors import TrackingError
from runjob.host.output import screen
from runjob.tags import (
    EVALUATED_FROM_OUTPUT_DIR_TAG,
    EVALUATED_FROM_TAG,
    EVALUATED_SPLIT_TAG,
    METRICS_TAG,
    OVERRIDES_TAG,
    VERSION_TAG,
)

if TYPE_CHECKING:
    from runjob.job.validation import ResolvedJob
    from runjob.train.trained import TrainedRun


def add_run_reference(parser: argparse.ArgumentParser) -> None:
    """The RUN argument every command on a trained model takes."""
    parser.add_argument("run", metavar="RUN", help="the run: its output folder, its MLflow run id, or runs:/ID")


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Evaluate run RUN's final weights on its validation (or test) split with the job's task, print
    the metrics and record them as a new MLflow run."""
    # lazy: `runjob --help` imports this module and stays quick: the command's modules load when it runs
    from runjob.commands.run_plugins import require_run_plugins
    from runjob.host.plugin_host import load_plugins
    from runjob.train.trained import evaluate_split, find_run, load_job

    host = load_plugins()
    with tempfile.TemporaryDirectory(prefix="runjob-evaluate-") as scratch:
        run = find_run(args.run, args.tracking_uri, Path(scratch))
        require_run_plugins(run, host, "evaluate")  # its job names what they registered
        job = load_job(run, args.overrides, host)
        metrics = evaluate_split(run, job, args.split)
    print("\n".join(render(["metric", "value"], [[name, f"{value:.6g}"] for name, value in metrics.items()])))
    if not args.no_record:
        run_id, uri = record_evaluation(run, job, args, metrics)
        screen.each(f"runjob: recorded as MLflow run {run_id} at {uri}", err=True)
    return 0


def record_evaluation(
    run: TrainedRun, job: ResolvedJob, args: argparse.Namespace, metrics: dict[str, float]
) -> tuple[str, str]:
    """A new run in the evaluated run's experiment (and store, unless ``--tracking-uri`` says
    another): the job's params, the metrics (at step 0), and tags naming the run it evaluated.
    Recorded as a training run is: first in its own folder (``runs/<job name>-evaluate/<UTC
    time>/``, or ``--output-dir``), then in MLflow, so ``runjob sync FOLDER`` uploads an evaluation
    MLflow could not take. Returns the MLflow run id and the tracking URI; a TrackingError, naming
    the folder, when MLflow did not take it all."""
    # lazy: `runjob --help` imports this module and stays quick: the command's modules load when it runs
    from runjob.host.task import declared_metrics
    from runjob.job.redaction import redact_override
    from runjob.record.command_run import CommandRun
    from runjob.record.naming import recorded_params
    from runjob.record.outputs import choose_output_dir
    from runjob.record.uri import default_experiment, resolve_tracking_uri

    uri = resolve_tracking_uri(args.tracking_uri or run.tracking_uri or job.tracking.uri)
    tags = {
        EVALUATED_FROM_TAG: run.run_id or str(run.output_dir),
        EVALUATED_SPLIT_TAG: args.split,
        METRICS_TAG: json.dumps(declared_metrics(job.task.options, args.split)),
        OVERRIDES_TAG: " ".join(redact_override(o) for o in args.overrides),
        VERSION_TAG: runjob.__version__,  # read when needed: `runjob --help` imports this module
    }
    if run.output_dir is not None:
        tags[EVALUATED_FROM_OUTPUT_DIR_TAG] = str(run.output_dir.resolve())
    folder = choose_output_dir(f"{job.job.name}-evaluate", getattr(args, "output_dir", None))
    recorded = CommandRun.begin(
        folder,
        uri,
        run.experiment or default_experiment(job.tracking, job.job.name),
        f"evaluate {args.split} · {run.run_name or job.job.name}",
        recorded_params(job),  # as the training run's, so `runjob runs` finds no difference in the job
        tags,
        "--tracking-uri" if args.tracking_uri else "the evaluated run's tracking URI",
    )
    recorded.log_metrics(metrics, 0)
    recorded.end("FINISHED")
    if not recorded.online:
        raise TrackingError(
            f"evaluated and recorded in {folder}, but MLflow at {uri} did not take the evaluation "
            f"({recorded.failure}); `runjob sync {folder}` uploads it (--no-record to skip recording)"
        )
    assert recorded.run_id is not None
    return recorded.run_id, uri
