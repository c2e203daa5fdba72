"""MLflow under load (issue 30): several runs writing one store at once, and whether each run's
MLflow record ends whole.

For each store, two loads, one after the other:

* ``runs``: ``--runs`` (8) ``runjob run jobs/digits_sweep.toml`` started together (the digits
  MLP without its sweep, ``train.log_every = 1``: a point of each training metric every step,
  220 steps in 5 epochs), each its own process with one torch thread;
* ``sweep``: ``runjob sweep jobs/digits_sweep.toml --workers 4`` (its 12 TPE trials, a median
  pruner), logging every step too;

into (a) ``sqlite``: one ``sqlite:///`` file every run writes itself (MLflow's default kind of
store; initialised first, as a store that has been used before), (b) ``server``: ``mlflow
server`` on 127.0.0.1 over a sqlite file (``--workers 1``, as ``runjob.testing`` starts it), (c)
``postgres``: ``mlflow server`` over a private PostgreSQL 15 (fsync on, as a real one runs;
tests/helpers.py starts it). Per load: runs, points in MLflow, every run's MLflow points compared
with its ``metrics.jsonl`` (missing points, runs not FINISHED), writes retried (each has a line in
its run's ``runjob.log``, which says what failed; and the runs' ``runjob.tracking.retried``
tags), wall seconds (first start to last exit), CPU seconds of the runs (``os.wait4``: each run
with the processes it waited for) and of the server (its processes, PostgreSQL's too).

    uv run --extra digits --extra sweep python benchmarks/load_test.py                 # ~15 min on 2 shared cores
    uv run --extra digits --extra sweep python benchmarks/load_test.py --stores sqlite --runs 4
    uv run --extra digits --extra sweep python benchmarks/load_test.py --json benchmarks/load_test.json

Compiled bytecode goes to one temporary folder for every process (as in sweep_workers.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import common  # noqa: E402
from helpers import local_points, postgres_bin, running_mlflow_server_on, running_postgres  # noqa: E402

from runjob.testing import MlflowRun, RecordedRun, init_mlflow_store, running_mlflow_server  # noqa: E402

JOB = common.REPO / "jobs" / "digits_sweep.toml"
RETRIED_TAG = "runjob.tracking.retried"
RETRY_LINE = "runjob: MLflow write retried"
STORES = ("sqlite", "server", "postgres")


@contextlib.contextmanager
def store(kind: str, folder: Path) -> Iterator[tuple[str, list[str]]]:
    """The tracking URI of a fresh store of ``kind`` in ``folder``, and what to look for in the
    command lines of its server's processes (none for sqlite)."""
    if kind == "sqlite":
        yield f"sqlite:///{init_mlflow_store(folder / 'mlflow.db')}", []
    elif kind == "server":
        with running_mlflow_server(folder, template=init_mlflow_store(folder / "template.db")) as url:
            yield url, [f"--port {url.rsplit(':', 1)[1]} "]
    else:
        with running_postgres(["mlflow"], durable=True) as postgres:
            with running_mlflow_server_on(f"{postgres}/mlflow", folder) as url:
                yield url, [f"--port {url.rsplit(':', 1)[1]} ", f"-p {postgres.rsplit(':', 1)[1]} "]


def server_cpu(marks: list[str]) -> float:
    """CPU seconds so far of the processes whose command line holds one of ``marks``, and of their
    children (a server's workers, PostgreSQL's backends)."""
    total = 0.0
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or []) + " "
        if any(mark in line for mark in marks):
            with contextlib.suppress(psutil.Error):
                for member in [process, *process.children(recursive=True)]:
                    times = member.cpu_times()
                    total += times.user + times.system
    return total


def wait_all(commands: list[list[str]], env: dict[str, str], logs: Path) -> dict[str, float]:
    """Start ``commands`` together, wait for every one; wall seconds and their CPU seconds."""
    started = time.monotonic()
    children = []
    for n, command in enumerate(commands):
        with open(logs / f"process-{n}.log", "w") as log:
            children.append(subprocess.Popen(command, cwd=common.REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    cpu, codes = 0.0, []
    for child in children:
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        codes.append(child.returncode)
        cpu += usage.ru_utime + usage.ru_stime
    return {"wall_s": round(time.monotonic() - started, 1), "cpu_s": round(cpu, 1), "exit_codes": codes}


def check(folders: list[Path]) -> dict[str, object]:
    """Every run folder's MLflow record against its local one."""
    sums = {"runs": 0, "local_points": 0, "mlflow_points": 0, "missing_points": 0, "retried_writes": 0}
    sums |= {"retry_lines": 0, "writes_retried_in_log": 0, "not_finished": [], "retried_for": {}}
    for folder in folders:
        record = RecordedRun(folder)
        local = local_points(folder)
        sums["runs"] += 1
        sums["local_points"] += sum(map(len, local.values()))
        for line in (folder / "runjob.log").read_text(errors="replace").splitlines():
            if RETRY_LINE in line:  # "... (try N in S s): WHAT: ERROR"
                sums["retry_lines"] += 1
                sums["writes_retried_in_log"] += "(try 2 " in line
                what, _, why = line.split("): ", 1)[-1].partition(": ")
                why = f"{what}: {re.sub(r'http://[^ ]+', 'URL', why)[:160]}"
                sums["retried_for"][why] = sums["retried_for"].get(why, 0) + 1
        if record.run_id is None:
            sums["not_finished"].append(f"{folder.name}: no MLflow run")
            sums["missing_points"] += sum(map(len, local.values()))
            continue
        run = MlflowRun.get(record.tracking_uri, record.run_id)
        if run.status != "FINISHED":
            sums["not_finished"].append(f"{folder.name}: {run.status}")
        sums["retried_writes"] += int(run.tags.get(RETRIED_TAG, "0"))
        for key, points in local.items():
            there = run.history(key)
            sums["mlflow_points"] += len(there)
            sums["missing_points"] += len(set(points) - set(there))
    return sums


def one_store(kind: str, folder: Path, env: dict[str, str], args: argparse.Namespace) -> list[dict[str, object]]:
    results = []
    with store(kind, folder) as (uri, marks):
        base = [sys.executable, "-m", "runjob"]
        sets = ["--set", "train.log_every=1", "--set", f'tracking.uri="{uri}"', *args.sets]
        runs = folder / "runs"
        runs.mkdir()
        commands = [
            [
                *base,
                "run",
                str(JOB),
                *sets,
                "--set",
                "tracking.experiment=load-runs",
                "--output-dir",
                str(runs / f"{n}"),
            ]
            for n in range(args.runs)
        ]
        loads = [("runs", commands, lambda: sorted(p for p in runs.iterdir() if p.is_dir()))]
        sweep = folder / "sweep"
        command = [*base, "sweep", str(JOB), "--workers", str(args.workers), *sets]
        command += ["--set", "tracking.experiment=load-sweep", "--set", f"sweep.trials={args.trials}"]
        loads.append(("sweep", [[*command, "--output-dir", str(sweep)]], lambda: sorted(sweep.glob("trial-*"))))
        for load, commands, folders in loads:
            if load not in args.loads:
                continue
            logs = folder / f"logs-{load}"
            logs.mkdir()
            server_before = server_cpu(marks)
            load_before = common.load_now()
            timing = wait_all(commands, env, logs)
            result = {
                "store": kind,
                "load": load,
                **timing,
                "server_cpu_s": round(server_cpu(marks) - server_before, 1),
            }
            result |= {"load_avg_before": load_before, "load_avg_after": common.load_now(), **check(folders())}
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default=",".join(STORES), help=f"which of {', '.join(STORES)}, comma-separated")
    parser.add_argument("--loads", default="runs,sweep", help="runs, sweep or both (comma-separated)")
    parser.add_argument("--runs", type=int, default=8, help="runs started together")
    parser.add_argument("--workers", type=int, default=4, help="the sweep's workers")
    parser.add_argument("--trials", type=int, default=12, help="the sweep's trials")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="a job override for every run")
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    args = parser.parse_args()
    args.sets = [part for text in args.sets for part in ("--set", text)]
    args.loads = args.loads.split(",")
    stores = args.stores.split(",")
    if "postgres" in stores and postgres_bin() is None:
        sys.exit("load_test: PostgreSQL is not installed (apt-get install postgresql); leave it out with --stores")
    info = common.machine()
    common.print_machine(info)
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="load-test-") as scratch:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RUNJOB_"))}
        env |= {"PYTHONPYCACHEPREFIX": str(Path(scratch) / "pycache"), **common.thread_env(1)}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        # compile every module the runs import once, before any load is timed
        warm = "import torch, accelerate, mlflow, optuna, sklearn, psycopg, mlflow.server.handlers, runjob.train.runner"
        subprocess.run(
            [sys.executable, "-c", warm + ", runjob.record.mirror, runjob.commands.sweep"], env=env, check=True
        )
        for kind in stores:
            folder = Path(scratch) / kind
            folder.mkdir()
            results += one_store(kind, folder, env, args)
    header = ["store", "load", "runs", "MLflow points", "missing", "not FINISHED", "retried (log)", "tagged"]
    header += ["wall s", "CPU s", "server CPU s"]
    rows = [
        [r["store"], r["load"], r["runs"], r["mlflow_points"], r["missing_points"], len(r["not_finished"])]  # type: ignore[arg-type]
        + [r["writes_retried_in_log"], r["retried_writes"], r["wall_s"], r["cpu_s"], r["server_cpu_s"]]
        for r in results
    ]
    print(common.table(rows, header))
    if args.json:
        common.write_json("load_test", {"machine": info, "args": sys.argv[1:], "results": results}, args.json)


if __name__ == "__main__":
    main()
