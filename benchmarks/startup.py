"""Start-up times of the runjob CLI, and where the time to the first optimizer step goes.

Wall time (subprocess start to exit) of ``runjob --help``, ``runjob validate jobs/digits.toml`` and
``runjob plugins``, and the time from starting ``runjob jobs/digits.toml`` to the end of its first
optimizer step, with MLflow's default local store (sqlite) and with ``tracking.offline = true``.
The first step is seen by a timer plugin (a temporary dist-info with a ``runjob`` entry point on
PYTHONPATH) whose ``runjob_after_step`` hook writes the time and ends the process. The commands run
interleaved, each once untimed first; medians are reported. ``python -c pass`` and ``python -c
"import torch"`` are timed alongside as floors.

The breakdown: the timer plugin's clock at its import (all plugins loaded), at ``runjob_run_start``
(Accelerator, MLflow run, data, model, FLOP count done) and at the first step; and ``python -X
importtime`` of one run, cumulative import time of the heavy packages.

    uv run python benchmarks/startup.py             # about three minutes on 2 CPU cores
    uv run python benchmarks/startup.py --reps 7
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

GOALS = {"runjob --help": 0.3, "runjob validate jobs/digits.toml": 1.5}
HEAVY = (
    "torch",
    "torchvision",
    "mlflow",
    "accelerate",
    "sklearn",
    "numpy",
    "pandas",
    "scipy",
    "PIL",
    "pydantic",
    "pluggy",
    "tqdm",
    "safetensors",
    "runjob",
)


def first_step(
    runjob: str, job: str, work: Path, env: dict[str, str], n: int, offline: bool, importtime: bool = False
) -> dict:
    """Start ``runjob JOB``; return the seconds to its first step and the phase times."""
    stamp = work / f"first-step-{n}.txt"
    env = {**env, "RUNJOB_BENCH_FIRST_STEP_FILE": str(stamp), "RUNJOB_BENCH_EXIT_AFTER_FIRST_STEP": "1"}
    command = [runjob, job, "--output-dir", str(work / f"out-{n}")]
    if offline:
        command += ["--set", "tracking.offline=true"]
    if importtime:
        command = [sys.executable, "-X", "importtime", "-m", "runjob", *command[1:]]
    started = time.time()
    proc = subprocess.run(command, cwd=common.REPO, env=env, capture_output=True, text=True, timeout=600)
    if not stamp.exists():
        raise RuntimeError(
            f"no first step seen (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
    events = ast.literal_eval(stamp.read_text())
    result = {
        "to_first_step_s": events["first_step"] - started,
        "to_plugins_loaded_s": events["plugin_imported"] - started,
        "plugins_loaded_to_run_start_s": events["run_start"] - events["plugin_imported"],
        "run_start_to_first_step_s": events["first_step"] - events["run_start"],
    }
    if importtime:
        result["importtime"] = parse_importtime(proc.stderr)
    return result


def parse_importtime(text: str) -> dict[str, float]:
    """Seconds of import time by top-level package: the self time of every module summed by its
    top-level package (so no package's time is counted twice), the rest as "other", and the total."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = line.split("|")
        try:
            own = int(parts[0].split(":")[1]) / 1e6
        except ValueError:  # the header line
            continue
        root = parts[2].strip().split(".")[0]
        key = root if root in HEAVY else "other"
        found[key] = found.get(key, 0.0) + own
    found["all imports"] = sum(found.values())
    return found


PROFILED = """
import cProfile, sys
sys.path.insert(0, sys.argv[1])
import runjob_bench_timer
runjob_bench_timer.PROFILER = profiler = cProfile.Profile()
profiler.enable()
from runjob.commands.cli import main
sys.exit(main(sys.argv[2:]))
"""


def profile_first_step(job: str, work: Path, env: dict[str, str], plugin_root: Path) -> list[list]:
    """cProfile of one run to its first step: runjob's own functions by cumulative time."""
    import pstats

    stamp = work / "profiled.txt"
    env = {**env, "RUNJOB_BENCH_FIRST_STEP_FILE": str(stamp), "RUNJOB_BENCH_EXIT_AFTER_FIRST_STEP": "1"}
    command = [sys.executable, "-c", PROFILED, str(plugin_root), job, "--output-dir", str(work / "out-profiled")]
    subprocess.run(command, cwd=common.REPO, env=env, capture_output=True, text=True, timeout=600)
    stats = pstats.Stats(str(stamp) + ".prof")
    import runjob
    import runjob_builtins

    packages = [
        Path(runjob.__file__).parent,
        Path(runjob_builtins.__file__).parent,
    ]  # runjob's own code, not pandas' or sympy's core/
    rows = []
    for (path, line, function), (_, calls, _, cumulative, _) in stats.stats.items():
        where = Path(path)
        if any(where.is_relative_to(folder) for folder in packages):
            rows.append([f"{where.parent.name}/{where.name}:{line} {function}", calls, cumulative])
    rows.sort(key=lambda row: -row[2])
    return rows[:25]


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=common.REPO, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{command} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="timed runs of each command, interleaved")
    parser.add_argument("--job", default="jobs/digits.toml")
    parser.add_argument("--json", type=Path, help="where to write the raw numbers (default benchmarks/startup.json)")
    args = parser.parse_args()

    info = common.machine()
    common.print_machine(info)
    runjob = str(
        Path(sys.executable).parent / "runjob"
    )  # the installed console script, as a user runs it (no `uv run` in front)
    with tempfile.TemporaryDirectory(prefix="runjob-bench-startup-") as tmp:
        work = Path(tmp)
        plugin_root = common.make_timer_plugin(work / "plugin")
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db"}
        env.pop("PYTHONPATH", None)
        run_env = {**env, "PYTHONPATH": str(plugin_root)}
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            'python -c "import torch"': [sys.executable, "-c", "import torch"],
            "runjob --help": [runjob, "--help"],
            f"runjob validate {args.job}": [runjob, "validate", args.job],
            "runjob plugins": [runjob, "plugins"],
        }
        walls: dict[str, list[float]] = {name: [] for name in commands}
        runs: dict[str, list[dict]] = {"sqlite store": [], "offline": []}
        counter = 0
        print("untimed first round (fills the OS file cache and creates the sqlite store) ...", flush=True)
        cold = {name: timed(command, env) for name, command in commands.items()}
        for mode in runs:
            counter += 1
            cold[f"first step ({mode})"] = first_step(runjob, args.job, work, run_env, counter, mode == "offline")[
                "to_first_step_s"
            ]
        loads = []
        for rep in range(args.reps):
            loads.append(common.load_now())
            for name, command in commands.items():
                walls[name].append(timed(command, env))
            for mode in runs:
                counter += 1
                runs[mode].append(first_step(runjob, args.job, work, run_env, counter, mode == "offline"))
            print(
                f"rep {rep + 1}/{args.reps}  load {loads[-1]}  "
                + "  ".join(f"{n.split()[1] if n.startswith('runjob') else n}: {w[-1]:.2f}s" for n, w in walls.items())
                + "  "
                + "  ".join(f"first step ({m}): {r[-1]['to_first_step_s']:.2f}s" for m, r in runs.items()),
                flush=True,
            )
        counter += 1
        breakdown = first_step(runjob, args.job, work, run_env, counter, offline=False, importtime=True)
        profile = profile_first_step(args.job, work, env, plugin_root)

    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    rows = []
    summary: dict[str, dict] = {}
    for name, values in walls.items():
        goal = GOALS.get(name)
        summary[name] = {"median_s": common.median(values), "goal_s": goal, "cold_s": cold[name]}
        rows.append(
            [
                name,
                common.median(values),
                min(values),
                max(values),
                cold[name],
                f"<= {goal}" if goal else "",
                ("met" if common.median(values) <= goal else "MISSED") if goal else "",
            ]
        )
    for mode, values in runs.items():
        seconds = [v["to_first_step_s"] for v in values]
        name = f"runjob {args.job} -> first step ({mode})"
        summary[name] = {
            "median_s": common.median(seconds),
            "cold_s": cold[f"first step ({mode})"],
            **{k: common.median([v[k] for v in values]) for k in values[0]},
        }
        rows.append([name, common.median(seconds), min(seconds), max(seconds), cold[f"first step ({mode})"], "", ""])
    print()
    print(
        f"wall seconds, {args.reps} interleaved runs each (load averages at each round's start: {loads}; at end "
        f"{info['load_avg_end']})"
    )
    print(common.table(rows, ["command", "median s", "min", "max", "first (untimed) run", "goal", ""]))
    print()
    phases = summary[f"runjob {args.job} -> first step (sqlite store)"]
    print("time to first step (sqlite store), medians:")
    print(
        common.table(
            [
                [
                    "process start -> all plugins imported (Python, runjob CLI, entry points)",
                    phases["to_plugins_loaded_s"],
                ],
                [
                    "plugins imported -> runjob_run_start (validate, Accelerator, MLflow run, data, model, FLOP count)",
                    phases["plugins_loaded_to_run_start_s"],
                ],
                [
                    "runjob_run_start -> end of first step (first forward/backward/step)",
                    phases["run_start_to_first_step_s"],
                ],
            ],
            ["phase", "s"],
        )
    )
    print()
    print(
        "python -X importtime, one run to the first step (own import time of every module, summed by top-level "
        "package; importtime itself adds some):"
    )
    imports = breakdown["importtime"]
    print(common.table([[k, v] for k, v in sorted(imports.items(), key=lambda kv: -kv[1])], ["package", "s"]))
    print()
    print("cProfile of one run to the first step: runjob's functions by cumulative time (profiling inflates the times)")
    print(common.table(profile, ["function", "calls", "cumulative s"]))
    data = {
        "machine": info,
        "settings": {"reps": args.reps, "job": args.job, "runjob": runjob},
        "raw": {"walls": walls, "first_step": runs, "cold": cold, "loads": loads},
        "summary": summary,
        "importtime_run": breakdown,
        "profile_top": profile,
    }
    path = common.write_json("startup", data, args.json)
    print(f"raw numbers: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
