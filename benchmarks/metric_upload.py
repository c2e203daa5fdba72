"""runjob's metric ``Uploader`` (runjob.record.mlflow_writer) against MLflow's own asynchronous
logging (``MlflowClient.log_batch(..., synchronous=False)``), into a sqlite store in a temporary folder.

    uv run python benchmarks/metric_upload.py [--steps 3000] [--rounds 3]

Each contestant logs ``--steps`` steps of 8 points (a run logging every step), in rounds that
alternate between them. Printed per round: the caller's cost per logged point (the training side's
CPU microseconds to hand a step over), the time until every point is in the store, and the points the
store holds at the end. Then the same with the store failing for 1 s in the middle of the run (every
``log_batch`` raises a connection error, as a server that restarts does): what each keeps.
RESULTS.md section 12 has the numbers and the verdict.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mlflow.entities import Metric
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracking import MlflowClient
from mlflow.utils.async_logging.run_operations import RunOperations

from runjob.record.mlflow_writer import Retrying, Uploader

KEYS = [f"train/k{i}" for i in range(8)]


@contextlib.contextmanager
def failing_store(during: tuple[float, float] | None) -> Iterator[None]:
    """Every metrics write into a sqlite store raises between ``during``'s two monotonic times (patched
    where both contestants' ``log_batch`` reach it: MLflow's queue holds a bound ``log_batch``)."""
    real = SqlAlchemyStore._log_metrics

    def log_metrics(self: SqlAlchemyStore, *args: Any, **kwargs: Any) -> Any:
        if during is not None and during[0] <= time.monotonic() < during[1]:
            raise ConnectionError("Connection refused: the store restarts")
        return real(self, *args, **kwargs)

    SqlAlchemyStore._log_metrics = log_metrics  # type: ignore[method-assign]
    try:
        yield
    finally:
        SqlAlchemyStore._log_metrics = real  # type: ignore[method-assign]


def points(step: int) -> list[Metric]:
    now = int(time.time() * 1000)
    return [Metric(key, float(step) + i / 10, now, step) for i, key in enumerate(KEYS)]


def log_steps(steps: int, hand_over: Callable[[int], None], pace_s: float) -> float:
    """Hands ``steps`` steps over at ``pace_s`` apart; the caller's CPU seconds doing so."""
    cpu = 0.0
    for step in range(steps):
        began = time.thread_time()
        hand_over(step)
        cpu += time.thread_time() - began
        if pace_s:
            time.sleep(pace_s)
    return cpu


def run_uploader(client: MlflowClient, run_id: str, steps: int, pace_s: float) -> tuple[float, float]:
    uploader = Uploader(lambda batch: client.log_batch(run_id, metrics=batch), Retrying())
    began = time.monotonic()
    cpu = log_steps(steps, lambda step: uploader.submit_metrics(points(step), step), pace_s)
    uploader.close(timeout=300)
    return cpu, time.monotonic() - began


def run_mlflow_async(client: MlflowClient, run_id: str, steps: int, pace_s: float) -> tuple[float, float]:
    operations: list[RunOperations] = []
    began = time.monotonic()
    cpu = log_steps(
        steps, lambda step: operations.append(client.log_batch(run_id, metrics=points(step), synchronous=False)), pace_s
    )
    for operation in operations:  # MLflow's public way to wait for asynchronous writes
        with contextlib.suppress(Exception):  # a batch that failed raises here; the rest went
            operation.wait()
    return cpu, time.monotonic() - began


def held(client: MlflowClient, run_id: str) -> int:
    return sum(len(client.get_metric_history(run_id, key)) for key in KEYS)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("mlflow").setLevel(logging.CRITICAL)  # MLflow logs each batch it drops: counted below instead
    contestants = {"runjob Uploader": run_uploader, "MLflow async": run_mlflow_async}
    with tempfile.TemporaryDirectory() as folder:
        client = MlflowClient(f"sqlite:///{Path(folder) / 'mlflow.db'}")
        experiment = client.create_experiment("upload")
        results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in contestants}
        for _ in range(args.rounds):
            for name, contestant in contestants.items():
                run_id = client.create_run(experiment).info.run_id
                with failing_store(None):
                    cpu, wall = contestant(client, run_id, args.steps, 0.0)
                results[name].append((cpu / (args.steps * len(KEYS)) * 1e6, wall, held(client, run_id)))
        for name, rows in results.items():
            print(
                f"{name}: caller CPU us/point {[round(r[0], 2) for r in rows]} "
                f"(median {statistics.median(r[0] for r in rows):.2f}); all in the store after s "
                f"{[round(r[1], 2) for r in rows]}; points held {[r[2] for r in rows]} of {args.steps * len(KEYS)}"
            )
        # the store refuses every write for 1 s (a server restarting), 1 s into a run paced at 5 ms a step
        steps = 800
        for name, contestant in contestants.items():
            run_id = client.create_run(experiment).info.run_id
            start = time.monotonic()
            with failing_store((start + 1.0, start + 2.0)):
                contestant(client, run_id, steps, 0.005)
            print(f"{name}, store down 1 s mid-run: points held {held(client, run_id)} of {steps * len(KEYS)}")


if __name__ == "__main__":
    main()
