"""Shared pieces of the hand-run benchmarks (not part of the test suite).

Each benchmark runs its contestants interleaved (A B A B ...), one subprocess per repetition, so
machine noise and drift hit every contestant alike; it reports medians and ratios and writes its
raw numbers, with the machine and its load, to ``benchmarks/<name>.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULT_MARK = "BENCH-RESULT "  # a worker's last line: this mark, then its numbers as JSON

TIMER_PLUGIN = '''
"""Benchmark timer: a runjob plugin that notes when each optimizer step ends."""
import os
import time

from runjob import hookimpl

IMPORTED_AT = time.time()
STEP_TIMES = []      # time.perf_counter() after each optimizer step
CPU_TIMES = []       # time.process_time() at the same moments: the process's CPU time, all threads
EVENTS = {"plugin_imported": IMPORTED_AT}
PROFILER = None      # a cProfile.Profile to stop and save at the first step
_WINDOW = None       # RUNJOB_BENCH_PROFILE="FIRST:LAST:FILE": cProfile from step FIRST to step LAST


def profile_window(step):
    """Profile the steps FIRST+1..LAST (the hand-written loop calls this too)."""
    global _WINDOW
    if not os.environ.get("RUNJOB_BENCH_PROFILE"):
        return
    first, last, path = os.environ["RUNJOB_BENCH_PROFILE"].split(":", 2)
    if step == int(first):
        import cProfile

        _WINDOW = cProfile.Profile()
        _WINDOW.enable()
    elif step == int(last) and _WINDOW is not None:
        _WINDOW.disable()
        _WINDOW.dump_stats(path)


@hookimpl
def runjob_run_start(run):
    EVENTS["run_start"] = time.time()


@hookimpl
def runjob_after_step(run, step, epoch, loss):
    STEP_TIMES.append(time.perf_counter())
    CPU_TIMES.append(time.process_time())
    profile_window(step)
    if step == 1 and os.environ.get("RUNJOB_BENCH_FIRST_STEP_FILE"):
        EVENTS["first_step"] = time.time()
        with open(os.environ["RUNJOB_BENCH_FIRST_STEP_FILE"], "w") as file:
            file.write(repr(EVENTS))
        if PROFILER is not None:  # set by benchmarks/startup.py's profiled run
            PROFILER.disable()
            PROFILER.dump_stats(os.environ["RUNJOB_BENCH_FIRST_STEP_FILE"] + ".prof")
        if os.environ.get("RUNJOB_BENCH_EXIT_AFTER_FIRST_STEP"):
            os._exit(0)
'''


def make_timer_plugin(root: Path, module: str = "runjob_bench_timer", source: str = TIMER_PLUGIN) -> Path:
    """Lay out a timer plugin (``source``, importable as ``module``) as an installed distribution
    in ``root`` (runjob.testing.make_plugin_dist: a dist-info with a ``runjob`` entry point); put
    ``root`` on ``sys.path`` or ``PYTHONPATH`` and runjob loads it like any plugin. Its entry point
    is named to load last."""
    from runjob.testing import make_plugin_dist  # imported here: a benchmark's workers never need it

    entry_point = f"zzz_{module.removeprefix('runjob_')}"
    return make_plugin_dist(root, module.replace("_", "-"), "0.0.0", {entry_point: module}, {module: source})


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """Date, CPU, cores, load average and versions: written next to every result."""
    versions = {}
    for name in ("torch", "torchvision", "accelerate", "mlflow"):
        try:
            from importlib.metadata import version

            versions[name] = version(name)
        except Exception:  # noqa: BLE001 - a missing package is just not listed
            pass
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain", "--", "core", "plugins"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    )
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_avg_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "versions": versions,
        "git": f"{commit}{' (core/ or plugins/ modified)' if dirty else ''}",
        "command": " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
    }


def add_repetition_arguments(parser: Any, what: str) -> None:
    """The flags every timing benchmark takes: steps, warm-up, repetitions, batch, torch threads."""
    parser.add_argument("--steps", type=int, default=40, help="timed steps per repetition (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=5, help="steps not timed at the start of each repetition")
    parser.add_argument("--reps", type=int, default=3, help=f"repetitions of each {what}, interleaved")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch (OpenMP/MKL) threads per run, 0 for torch's default (one per core); "
        "1 keeps a run on a shared 2-core machine from stalling at OpenMP barriers whenever anything else runs",
    )


def thread_env(threads: int) -> dict[str, str]:
    """Environment for a worker with ``threads`` torch threads (0: torch's default)."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}


def load_now() -> float:
    return round(os.getloadavg()[0], 2)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def steady_rate(step_times: list[float], warmup: int, batch: int) -> dict[str, float]:
    """Samples/s over the steps after ``warmup`` (from the end of step ``warmup`` to the last), and
    the median step time in that window."""
    window = step_times[warmup - 1 :] if warmup else step_times
    steps = len(window) - 1
    if steps < 1:
        raise RuntimeError(f"too few steps timed ({len(step_times)}) for {warmup} warm-up steps")
    seconds = window[-1] - window[0]
    durations = [b - a for a, b in zip(window, window[1:], strict=False)]
    return {"samples_per_s": steps * batch / seconds, "median_step_ms": 1000 * median(durations), "steps_timed": steps}


def steady_cpu(cpu_times: list[float], warmup: int) -> dict[str, float]:
    """The process's CPU time (``time.process_time()`` noted beside each step's ``perf_counter()``)
    over the same window as steady_rate: CPU ms per step on average over the window (what the
    throughput costs in CPU, the steps that log or checkpoint included) and the median step's."""
    window = cpu_times[warmup - 1 :] if warmup else cpu_times
    steps = len(window) - 1
    if steps < 1:
        raise RuntimeError(f"too few steps timed ({len(cpu_times)}) for {warmup} warm-up steps")
    durations = [b - a for a, b in zip(window, window[1:], strict=False)]
    return {"cpu_ms_per_step": 1000 * (window[-1] - window[0]) / steps, "median_cpu_step_ms": 1000 * median(durations)}


# t(0.975, df) for df 1-30, then 40, 60, 120 (and 1.96 beyond): two-sided 95% intervals
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131]
T975 += [2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
T975_LARGE = [(40, 2.021), (60, 2.000), (120, 1.980)]


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (conservative between table rows)."""
    if df < 1:
        return float("nan")
    if df <= len(T975):
        return T975[df - 1]
    for limit, value in T975_LARGE:
        if df <= limit:
            return value
    return 1.960


def paired_ratio(values: list[float], bases: list[float], resamples: int = 10000, seed: int = 0) -> dict[str, Any]:
    """``values`` against ``bases``, measured in pairs (one per interleaved round).

    * ``ratio_of_medians``, with a 95% bootstrap interval (``boot_low``, ``boot_high``): whole rounds
      resampled with replacement, ``resamples`` times, from a fixed ``seed``;
    * ``paired`` (the main estimate), the geometric mean of the per-round ratios, with a 95%
      t interval (``low``, ``high``): mean of log(ratio) +- t(0.975, n-1) * sd / sqrt(n), exponentiated.
      Pairing by round removes what the machine's load did to both of a round's runs alike.
    """
    import math
    import random

    if len(values) != len(bases) or not values:
        raise ValueError(f"paired_ratio needs pairs: {len(values)} values, {len(bases)} bases")
    n = len(values)
    ratios = [v / b for v, b in zip(values, bases, strict=True)]
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = t975(n - 1) * statistics.stdev(logs) / math.sqrt(n) if n > 1 else float("nan")
    rng = random.Random(seed)
    boots = []
    for _ in range(resamples if n > 1 else 0):
        picks = [rng.randrange(n) for _ in range(n)]
        boots.append(median([values[i] for i in picks]) / median([bases[i] for i in picks]))
    boots.sort()
    return {
        "rounds": n,
        "ratios": ratios,
        "paired": math.exp(mean),
        "low": math.exp(mean - half),
        "high": math.exp(mean + half),
        "ratio_of_medians": median(values) / median(bases),
        "boot_low": boots[int(0.025 * len(boots))] if boots else float("nan"),
        "boot_high": boots[int(0.975 * len(boots)) - 1] if boots else float("nan"),
    }


def run_worker(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 1800, python: str | None = None
) -> dict[str, Any]:
    """Run ``python <args>`` (this interpreter unless ``python`` names another) and return the JSON
    its last RESULT_MARK line carries."""
    started = time.perf_counter()
    command = [python or sys.executable, *args]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise RuntimeError(f"worker {args} failed (exit {proc.returncode}):\n{tail}")
    result = json.loads(lines[-1][len(RESULT_MARK) :])
    result["process_wall_s"] = time.perf_counter() - started
    return result


def emit(result: dict[str, Any]) -> None:
    """A worker's answer to run_worker."""
    print(RESULT_MARK + json.dumps(result), flush=True)


def write_json(name: str, data: dict[str, Any], path: Path | None = None) -> Path:
    path = path or BENCH_DIR / f"{name}.json"
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path


def table(rows: list[list[Any]], header: list[str]) -> str:
    """A plain text table, numbers right-aligned."""
    cells = [header] + [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_machine(info: dict[str, Any]) -> None:
    print(
        f"{info['date']}  {info['cpu']}, {info['cores']} cores, load average at start {info['load_avg_start']}  git "
        f"{info['git']}"
    )
    print(f"command: {info['command']}")


def peer_missing(name: str, module: str | None = None, executable: str | None = None) -> str | None:
    """Why the contestant ``name`` cannot run here, in one line (None when it can): its Python
    package ``module`` is not importable, or its program ``executable`` does not exist. A
    benchmark then skips it and writes no ratio for it."""
    import importlib.util
    import shutil

    if module is not None and importlib.util.find_spec(module) is None:
        return f"skipping {name}: the package {module!r} is not installed here (e.g. uv run --with {module} ...)"
    if executable is not None and not (Path(executable).is_file() or shutil.which(executable)):
        return f"skipping {name}: {executable} does not exist"
    return None
