"""The local record: what a run writes into its output folder before anything reaches MLflow.

``mlflow_run.json`` (:class:`RunRecord`: which MLflow run, params, tags, dataset inputs, artifacts,
status) and ``metrics.jsonl`` (every metric point; other machines write ``metrics.node<rank>.jsonl``)
hold everything the run logged, so ``runjob sync`` can make the MLflow run whole from them. This
module is the one reader and writer of both files.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TextIO, TypedDict

from runjob.errors import RunjobError
from runjob.host.run_folder import METRICS_FILE, METRICS_PATTERN, RUN_RECORD_FILE
from runjob.job.keys import flat, value_text

RUN_RECORD = RUN_RECORD_FILE
MAX_PARAM_LENGTH = 6000  # MLflow refuses longer param values
TRUNCATED = "...(truncated; full value in job.toml)"


class MetricLine(TypedDict):
    """One line of ``metrics.jsonl``:
    ``{"key": "train/loss", "value": 0.41, "step": 40, "timestamp": 1796221694072}``."""

    key: str
    value: float
    step: int
    timestamp: int


def now_ms() -> int:
    """The time as MLflow keeps it: milliseconds since the epoch."""
    return int(time.time() * 1000)


def flatten(tables: Mapping[str, object], prefix: str = "") -> dict[str, str]:
    """``{"optimizer": {"lr": 0.1}}`` -> ``{"optimizer.lr": "0.1"}``; lists as JSON, long values cut
    (params as the record keeps them and MLflow takes them)."""
    return {key: _param_text(value) for key, value in flat(tables, prefix=prefix).items()}


def _param_text(value: object) -> str:
    text = value_text(value)
    if len(text) > MAX_PARAM_LENGTH:  # an MLflow limit; the whole value is in job.toml
        text = text[: MAX_PARAM_LENGTH - len(TRUNCATED)] + TRUNCATED
    return text


@dataclass
class RunRecord:
    """``OUTPUT_DIR/mlflow_run.json``: the run as recorded locally, mirrored to MLflow."""

    run_id: str | None = None
    """The MLflow run; ``None`` for an offline run that was never synced."""
    tracking_uri: str | None = None
    experiment: str = ""
    run_name: str = ""
    start_time: int | None = None
    """Milliseconds since the epoch, as MLflow keeps it."""
    end_time: int | None = None
    status: str = "RUNNING"
    """RUNNING, FINISHED, FAILED or KILLED."""
    offline: bool = False
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    inputs: list[dict[str, str]] = field(default_factory=list)
    """Dataset lineage: name, digest, source_type, source, profile, context."""
    artifacts: list[dict[str, str | None]] = field(default_factory=list)
    """``{"path": relative to the output folder, "artifact_path": folder in MLflow or None}``."""
    unsynced: str | None = None
    """Why MLflow is missing part of the record (``runjob sync`` uploads it and clears this)."""
    synced_at: int | None = None
    copies: dict[str, str] = field(default_factory=dict)
    """Runs this record was synced into on other servers: tracking URI -> run id."""

    @classmethod
    def read(cls, output_dir: Path) -> RunRecord | None:
        """The record in ``output_dir``, or None when there is none. A record that cannot be read
        is a one-line error naming the file."""
        path = Path(output_dir) / RUN_RECORD
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise RunjobError(f"{path}: not a runjob run record ({error})") from None
        if not isinstance(data, dict):
            raise RunjobError(f"{path}: not a runjob run record (a JSON object was expected)")
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    def write(self, output_dir: Path) -> None:
        """Replace the record in ``output_dir`` atomically (a crash leaves the old one or the new one)."""
        path = Path(output_dir) / RUN_RECORD
        partial = path.with_suffix(".json.tmp")
        data = {key: value for key, value in asdict(self).items() if key not in _UNTIL_SET or value}
        partial.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        os.replace(partial, path)

    def add_artifact(self, path: str, artifact_path: str | None) -> bool:
        """Note an artifact; false when it was noted already."""
        entry = {"path": path, "artifact_path": artifact_path}
        if entry in self.artifacts:
            return False
        self.artifacts.append(entry)
        return True


# written only once they have a value: why MLflow is missing something, when it was synced, copies
_UNTIL_SET = {"unsynced", "synced_at", "copies"}


def run_id_in(output_dir: Path | None) -> str | None:
    """The MLflow run id recorded in ``output_dir`` (None when there is no record or no run)."""
    record = RunRecord.read(output_dir) if output_dir is not None else None
    return record.run_id if record is not None else None


class MetricsWriter:
    """Appends metric points to one ``metrics*.jsonl`` file, a line each:
    ``{"key": "train/loss", "value": 0.41, "step": 40, "timestamp": 1796221694072}``. Safe to call
    from several threads (the loop and the system-metrics sampler)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, metrics: dict[str, float], step: int, timestamp: int) -> None:
        with self._lock:
            if self._file is None:
                return
            for key, value in metrics.items():
                self._file.write(json.dumps({"key": key, "value": value, "step": step, "timestamp": timestamp}) + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_metric_points(output_dir: Path, pattern: str = METRICS_PATTERN) -> list[MetricLine]:
    """Every metric point in ``metrics.jsonl`` and the other machines' ``metrics.node<k>.jsonl``
    (``pattern`` chooses the files). A last line cut short by a crash is left out; a bad line
    before it is a one-line error naming the file and line."""
    points: list[MetricLine] = []
    for path in sorted(Path(output_dir).glob(pattern)):
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


def last_values(output_dir: Path) -> dict[str, float]:
    """The last value logged for each metric of the run's own ``metrics.jsonl``."""
    return {point["key"]: point["value"] for point in read_metric_points(output_dir, METRICS_FILE)}
