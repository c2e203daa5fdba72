"""Recording a run: MLflow (params, tags, metrics, artifacts, status) and ``metrics.jsonl``.

Only the main process records; on the others a :class:`Recorder` does nothing. Metrics are sent to
MLflow asynchronously (one batched call per log step) so a slow tracking server never stalls the
training loop; every metric is also appended to ``OUTPUT_DIR/metrics.jsonl``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from runjob.errors import TrackingError, user_message

RUN_RECORD = "mlflow_run.json"  # which MLflow run this output folder belongs to
RUN_TAGS_ENV = "RUNJOB_RUN_TAGS"  # a JSON object of extra tags for the run (set by `rerun` and `sweep`)
MAX_PARAM_LENGTH = 6000  # MLflow refuses longer param values
TRUNCATED = "...(truncated; full value in job.toml)"


def flatten(tables: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"optimizer": {"lr": 0.1}}`` -> ``{"optimizer.lr": "0.1"}``; lists as JSON, long values cut."""
    flat: dict[str, str] = {}
    for key, value in tables.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, dotted + "."))
            continue
        text = json.dumps(value) if isinstance(value, (list, dict, bool)) else str(value)
        if len(text) > MAX_PARAM_LENGTH:
            text = text[: MAX_PARAM_LENGTH - len(TRUNCATED)] + TRUNCATED
        flat[dotted] = text
    return flat


class Recorder:
    """The run's record. ``active`` is true on the main process only."""

    def __init__(self, output_dir: Path, active: bool) -> None:
        self.output_dir = output_dir
        self.active = active
        self.run_id: str | None = None
        self._metrics_file = None

    def start(
        self, *, tracking: Any, experiment: str, run_name: str, params: dict[str, str], tags: dict[str, str], resume_run_id: str | None = None
    ) -> str | None:
        """Create the MLflow run with its params and tags (or reopen ``resume_run_id``, adding the
        tags); returns the run id (main process)."""
        if not self.active:
            return None
        import mlflow

        self._metrics_file = (self.output_dir / "metrics.jsonl").open("a", encoding="utf-8")
        uri = tracking.uri or mlflow.get_tracking_uri()
        try:
            mlflow.set_tracking_uri(uri)
            if resume_run_id:
                run = mlflow.start_run(run_id=resume_run_id)
                mlflow.set_tags(tags)
            else:
                mlflow.set_experiment(experiment)
                run = mlflow.start_run(run_name=run_name, tags=tags)
        except Exception as error:  # noqa: BLE001 - any failure to reach MLflow is the same to the user
            raise TrackingError(f"cannot record the run to MLflow at {uri} (tracking.uri): {type(error).__name__}: {_first_line(error)}") from None
        self.run_id = run.info.run_id
        record = {"run_id": self.run_id, "tracking_uri": mlflow.get_tracking_uri(), "experiment": experiment}
        (self.output_dir / RUN_RECORD).write_text(json.dumps(record) + "\n", encoding="utf-8")
        if resume_run_id:
            return self.run_id  # params were logged when the run began; changes are in the tags
        try:
            mlflow.log_params(params)
        except Exception as error:  # noqa: BLE001
            self.end("FAILED", error)  # a run is never left RUNNING
            raise TrackingError(f"MLflow at {uri} refused the run's params: {type(error).__name__}: {_first_line(error)}") from None
        return self.run_id

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` at ``step``: a line each in metrics.jsonl, one async MLflow call."""
        if not self.active:
            return
        import mlflow

        timestamp = int(time.time() * 1000)
        for key, value in metrics.items():
            self._metrics_file.write(json.dumps({"key": key, "value": value, "step": step, "timestamp": timestamp}) + "\n")
        self._metrics_file.flush()
        mlflow.log_metrics(metrics, step=step, timestamp=timestamp, synchronous=False, run_id=self.run_id)

    def log_artifact(self, path: Path) -> None:
        if self.active and self.run_id:
            import mlflow

            mlflow.log_artifact(str(path), run_id=self.run_id)

    def log_text(self, text: str, name: str) -> None:
        """Record ``text`` as the artifact ``name`` (e.g. the job with its secrets hidden)."""
        if self.active and self.run_id:
            import mlflow

            mlflow.log_text(text, name, run_id=self.run_id)

    def end(self, status: str, error: BaseException | None = None) -> None:
        """Flush queued metrics and close the run as FINISHED, FAILED or KILLED."""
        if not self.active:
            return
        if self._metrics_file:
            self._metrics_file.close()
        if not self.run_id:
            return
        import mlflow

        try:
            if error is not None:
                lines = user_message(error).strip().splitlines()
                mlflow.set_tag("runjob.error", f"{type(error).__name__}: {lines[0] if lines else ''}"[:5000])
            mlflow.flush_async_logging()
        finally:
            # always close with the real status: MLflow's own exit handler would say FINISHED
            mlflow.end_run(status=status)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def extra_run_tags() -> dict[str, str]:
    """Tags that the process that started this run asked for through ``$RUNJOB_RUN_TAGS``."""
    text = os.environ.get(RUN_TAGS_ENV)
    if not text:
        return {}
    tags = json.loads(text)
    return {str(key): str(value) for key, value in tags.items()}


def resolve_tracking_uri(explicit: str | None = None) -> str:
    """``explicit``, else ``$MLFLOW_TRACKING_URI``, else MLflow's default (``sqlite:///mlflow.db``)."""
    if explicit:
        return explicit
    import mlflow

    return mlflow.get_tracking_uri()


def default_experiment(tracking: Any, job_name: str) -> str:
    """``tracking.experiment``, else ``$MLFLOW_EXPERIMENT_NAME``, else the job's name."""
    return tracking.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or job_name
