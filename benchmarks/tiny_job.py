"""A tiny job as a whole process: runjob against the hand-written script it replaces.

ResNet-18 on scikit-learn's digits written as an image folder (32x32 PNG, train/ and val/), 5
optimizer steps of batch 32, evaluated on val and saved: ``benchmarks/handwritten_tiny.py`` (torch,
torchvision and accelerate, nothing else) against ``runjob JOB`` with the same settings, with its
default recording (an MLflow sqlite store) and with ``tracking.offline = true``. Each contestant is
a fresh process, started in interleaved rounds (the order turns each round). Per process:

* **first line**: seconds from the start to the first line on its stdout or stderr (what the user
  sees first);
* **first step**: seconds to the end of the first optimizer step (the script's ``step 1`` line;
  for runjob a timer plugin's ``runjob_after_step``);
* **wall**: the whole process, start to exit;
* **CPU**: the process's user + system CPU seconds (``os.wait4``), which the machine's other
  tenants disturb less than wall time.

Ratios against the script are paired by round (geometric mean, 95% t interval; common.paired_ratio).

    uv run python benchmarks/tiny_job.py                 # 5 rounds, about 3 minutes on 2 cores
    uv run python benchmarks/tiny_job.py --reps 9 --json benchmarks/tiny_job.json
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

GOALS = {"wall": 1.25, "first step +s": 1.5, "first line s": 1.0}

JOB = """
[job]
name = "tiny"
[model]
name = "resnet18"
num_classes = 10
[dataset]
name = "imagefolder"
root = "{root}"
image_size = 32
[optimizer]
name = "adamw"
lr = 0.002
weight_decay = 0.01
[train]
batch_size = 32
max_steps = {steps}
log_every = 1
"""


def timed_process(command: list[str], env: dict[str, str], first_step_mark: str | None) -> dict[str, float]:
    """Run ``command``; the seconds to its first output line, to the line starting with
    ``first_step_mark`` (when given), to its exit, and its CPU seconds."""
    launched, started = time.time(), time.perf_counter()
    proc = subprocess.Popen(command, cwd=common.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: dict[str, float] = {}
    lines: list[str] = []

    def read(stream) -> None:
        for raw in iter(stream.readline, b""):
            now = time.perf_counter() - started
            text = raw.decode(errors="replace").strip()
            if text:
                seen.setdefault("first_line_s", now)
                if first_step_mark and text.startswith(first_step_mark):
                    seen.setdefault("first_step_s", now)
                lines.append(text)

    readers = [threading.Thread(target=read, args=(s,), daemon=True) for s in (proc.stdout, proc.stderr)]
    for reader in readers:
        reader.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    for reader in readers:
        reader.join(10)
    if proc.returncode != 0:
        raise RuntimeError(f"{command} exited {proc.returncode}:\n" + "\n".join(lines[-30:]))
    return {**seen, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "launched": launched}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads per process (0: torch's default)")
    parser.add_argument("--json", type=Path, help="where to write the raw numbers (default benchmarks/tiny_job.json)")
    parser.add_argument(
        "--baseline-runjob",
        help="the runjob command of another checkout (its own venv), timed as a fourth contestant, 'runjob@base'",
    )
    args = parser.parse_args()

    info = common.machine()
    common.print_machine(info)
    if args.baseline_runjob and (why := common.peer_missing("runjob@base", executable=args.baseline_runjob)):
        print(why)
        args.baseline_runjob = None
    runjob = str(Path(sys.executable).parent / "runjob")
    with tempfile.TemporaryDirectory(prefix="runjob-bench-tiny-") as tmp:
        work = Path(tmp)
        from runjob_builtins.digits import export_image_folder

        export_image_folder(work / "data", image_size=32)
        job = work / "tiny.toml"
        job.write_text(JOB.format(root=work / "data", steps=args.steps), encoding="utf-8")
        plugin_root = common.make_timer_plugin(work / "plugin")
        env = {**os.environ, **common.thread_env(args.threads), "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db"}
        env.pop("PYTHONPATH", None)
        runjob_env = {**env, "PYTHONPATH": str(plugin_root)}
        script = str(common.BENCH_DIR / "handwritten_tiny.py")
        counter = 0

        def contestant(name: str) -> dict[str, float]:
            nonlocal counter
            counter += 1
            out = work / f"out-{counter}"
            if name == "hand-written":
                command = [sys.executable, script, str(work / "data"), str(out), "--steps", str(args.steps)]
                return timed_process(command, env, "step 1 ")
            stamp = work / f"first-step-{counter}.txt"
            command = [args.baseline_runjob if name == "runjob@base" else runjob, str(job), "--output-dir", str(out)]
            if name == "runjob offline":
                command += ["--set", "tracking.offline=true"]
            measured = timed_process(command, {**runjob_env, "RUNJOB_BENCH_FIRST_STEP_FILE": str(stamp)}, None)
            events = ast.literal_eval(stamp.read_text())
            measured["first_step_s"] = events["first_step"] - measured["launched"]
            return measured

        names = ["hand-written", "runjob", "runjob offline"] + (["runjob@base"] if args.baseline_runjob else [])
        print("untimed first round (the OS file cache, the sqlite store) ...", flush=True)
        for name in names:
            contestant(name)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        loads = []
        for rep in range(args.reps):
            loads.append(common.load_now())
            order = names if rep % 2 == 0 else names[::-1]
            for name in order:
                results[name].append(contestant(name))
            print(
                f"round {rep + 1}/{args.reps} load {loads[-1]}: "
                + "  ".join(
                    f"{n}: wall {r[-1]['wall_s']:.2f} s, first step {r[-1]['first_step_s']:.2f} s, "
                    f"first line {r[-1]['first_line_s']:.2f} s"
                    for n, r in results.items()
                ),
                flush=True,
            )
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    return report(results, args, info, loads)


def verdict(ratio: dict, goal: float) -> str:
    """Met (the interval's upper bound under the goal), met by the estimate only, or missed."""
    if ratio["high"] <= goal:
        return "met: the 95% interval's upper bound is under it"
    return "met by the estimate, not by the interval" if ratio["paired"] <= goal else "MISSED"


def report(results: dict[str, list[dict[str, float]]], args: argparse.Namespace, info: dict, loads: list) -> int:
    base = results["hand-written"]
    rows, summary = [], {}
    for name, runs in results.items():
        row = [name]
        entry: dict[str, object] = {}
        for key in ("first_line_s", "first_step_s", "wall_s", "cpu_s"):
            values = [r[key] for r in runs]
            entry[key] = {"median": common.median(values), "min": min(values), "max": max(values)}
            row.append(f"{common.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        if name != "hand-written":
            wall = common.paired_ratio([r["wall_s"] for r in runs], [r["wall_s"] for r in base])
            cpu = common.paired_ratio([r["cpu_s"] for r in runs], [r["cpu_s"] for r in base])
            later = [r["first_step_s"] - b["first_step_s"] for r, b in zip(runs, base, strict=True)]
            entry.update(wall_ratio=wall, cpu_ratio=cpu, first_step_later_s=later)
            row += [
                f"{wall['paired']:.3f} ({wall['low']:.3f}-{wall['high']:.3f})",
                f"{cpu['paired']:.3f} ({cpu['low']:.3f}-{cpu['high']:.3f})",
                f"{common.median(later):+.2f} ({min(later):+.2f} to {max(later):+.2f})",
            ]
        else:
            row += ["1", "1", ""]
        rows.append(row)
        summary[name] = entry
    print()
    print(f"seconds, median (min-max) of {args.reps} interleaved rounds; loads at each round's start {loads}")
    header = ["contestant", "first line", "first step", "wall", "CPU", "wall / script (95% CI)", "CPU / script"]
    print(common.table(rows, [*header, "first step later than the script's"]))
    goals = summary["runjob"]
    wall = goals["wall_ratio"]
    print()
    print(
        f"goals: wall <= {GOALS['wall']}x the script's: {wall['paired']:.3f}x "
        f"({verdict(wall, GOALS['wall'])}); "
        f"first step within {GOALS['first step +s']} s of the script's: "
        f"{common.median(goals['first_step_later_s']):+.2f} s; first line <= {GOALS['first line s']} s: "
        f"{goals['first_line_s']['median']:.2f} s"
    )
    data = {
        "machine": info,
        "settings": vars(args) | {"json": str(args.json) if args.json else None},
        "raw": results,
        "loads": loads,
        "summary": summary,
    }
    path = common.write_json("tiny_job", data, args.json)
    print(f"raw numbers: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
