"""A sweep with one worker against the same sweep with two: ``runjob sweep jobs/digits_sweep.toml``
(12 TPE trials of a small MLP on the digits, a median pruner) with ``--workers 1`` and
``--workers 2``, interleaved (1 2 1 2 ..., the order turning each round), each a fresh process with
its own sweep folder and MLflow store. Per sweep: wall seconds (start to exit), CPU seconds of the
whole process tree (``os.wait4``: every trial's run is waited for, so it is counted), the trials
finished, pruned and failed (``trials.json``), and whether any trial number ran twice (one MLflow
run per trial folder, every folder's run a child of the one parent).

    uv run --extra digits --extra sweep python benchmarks/sweep_workers.py            # 3 rounds, ~15 min
    uv run --extra digits --extra sweep python benchmarks/sweep_workers.py --reps 2 --json benchmarks/sweep_workers.json
    uv run --extra digits --extra sweep python benchmarks/sweep_workers.py --set train.epochs=30   # longer trials

Run it in an environment with compiled bytecode (``uv sync --compile-bytecode``, as CI builds it:
this machine sets PYTHONDONTWRITEBYTECODE, where a user's machine keeps ``.pyc`` files); runjob's own
modules are compiled on first use (the variable is unset for the sweeps), so each trial's start-up
is what a user sees.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

JOB = common.REPO / "jobs" / "digits_sweep.toml"


def one_sweep(workers: int, folder: Path, env: dict[str, str], sets: list[str]) -> dict[str, object]:
    out = folder / f"sweep-w{workers}"
    db = folder / f"mlflow-w{workers}.db"
    command = [sys.executable, "-m", "runjob", "sweep", str(JOB), "--workers", str(workers), "--output-dir", str(out)]
    command += ["--set", f'tracking.uri="sqlite:///{db}"', *[part for text in sets for part in ("--set", text)]]
    started = time.monotonic()
    with open(folder / f"w{workers}.log", "w") as log:
        child = subprocess.Popen(command, cwd=common.REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.monotonic() - started
    code = os.waitstatus_to_exitcode(status)
    trials = json.loads((out / "trials.json").read_text()) if (out / "trials.json").exists() else []
    states = [t["state"] for t in trials]
    numbers = [t["trial"] for t in trials]
    with sqlite3.connect(db) as connection:  # every child run's trial number, from MLflow itself
        tagged = [
            int(value)
            for (value,) in connection.execute("select value from tags where key = 'runjob.sweep.trial'").fetchall()
        ]
    return {
        "workers": workers,
        "exit": code,
        "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "finished": states.count("finished"),
        "pruned": states.count("pruned"),
        "failed": states.count("failed"),
        "trials": len(trials),
        "run_twice": sorted({n for n in tagged if tagged.count(n) > 1})
        + sorted({n for n in numbers if numbers.count(n) > 1}),
        "load_after": common.load_now(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="rounds (each: one sweep of each kind)")
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="a job override for every sweep")
    args = parser.parse_args()
    info = common.machine()
    common.print_machine(info)
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as scratch:
        env = dict(os.environ)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        for rep in range(args.reps):
            for workers in (1, 2) if rep % 2 == 0 else (2, 1):
                folder = Path(scratch) / f"round-{rep}"
                folder.mkdir(exist_ok=True)
                result = {"round": rep, **one_sweep(workers, folder, env, args.sets)}
                print(json.dumps(result), flush=True)
                results.append(result)
    ratios = []
    for rep in range(args.reps):
        walls = {r["workers"]: r["wall_s"] for r in results if r["round"] == rep}
        ratios.append(walls[2] / walls[1])  # type: ignore[operator]
    rows = [
        [
            w,
            common.median([r["wall_s"] for r in results if r["workers"] == w]),  # type: ignore[misc]
            common.median([r["cpu_s"] for r in results if r["workers"] == w]),  # type: ignore[misc]
            sorted({f"{r['finished']}+{r['pruned']}" for r in results if r["workers"] == w}),
        ]
        for w in (1, 2)
    ]
    print(common.table(rows, ["workers", "median wall s", "median CPU s", "finished+pruned"]))
    print(f"wall time, 2 workers / 1 worker, per round: {', '.join(f'{r:.3f}' for r in ratios)}")
    if args.json:
        raw = {"machine": info, "sets": args.sets, "results": results, "ratios": ratios}
        common.write_json("sweep_workers", raw, args.json)


if __name__ == "__main__":
    main()
