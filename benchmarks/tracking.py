"""Step-time overhead of logging every step to MLflow: a real server, the local sqlite store.

A local ``mlflow server`` (127.0.0.1, a free port, its own sqlite store and artifact folder in a
temporary folder; ``--workers 1`` and MLflow's job runner off, so it is one process plus uvicorn)
is started for the benchmark and stopped at the end. The same run, ``train.log_every = 1``, goes
through ``runjob.train.runner.run_job`` in-process (one subprocess per repetition) either to that server
(``online``: each log step appends to metrics.jsonl and queues one ``log_batch`` for the
background uploader thread) or with ``tracking.offline = true`` (metrics.jsonl only). The two run
interleaved; throughput is samples/s after the warm-up steps, timed by a runjob plugin's
``runjob_after_step`` hook. Each online run is checked to have every ``train/loss`` point on the
server. For reference, the cost of one synchronous ``MlflowClient.log_metric`` call (and one
``log_batch`` of 5 metrics) to the same server is measured too.

Note: the server runs on the same 2 cores as the training, as a local server would.

``--cpu`` (issue 15) compares the **training process's CPU time per step** (``time.process_time``
noted by the timer plugin beside each step: every thread of the training process, not the
recording process or the server) in three modes: ``server`` and ``sqlite`` (recording on, with
system metrics sampled every ``--system-metrics-interval`` s) against ``offline`` (no recording
process, no sampler); with ``--baseline-python`` the same three for another checkout
(``runjob@base``), interleaved round by round. Ratios are paired by round with 95% intervals.

    uv run python benchmarks/tracking.py                     # a few minutes on 2 CPU cores
    uv run python benchmarks/tracking.py --steps 200 --reps 7
    uv run python benchmarks/tracking.py --cpu --reps 8 --steps 100 --baseline-python /tmp/base/.venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from runjob.testing import running_mlflow_server  # noqa: E402

GOAL_OVERHEAD = 0.01


def job_toml(args: argparse.Namespace, mode: str) -> str:
    total = args.warmup + args.steps
    tracking = "offline = true\n" if mode == "offline" else f'uri = "{args.uri}"\n'
    if mode == "sqlite":
        tracking = f'uri = "sqlite:///{Path(args.work) / "store.db"}"\n'
    if args.cpu:
        tracking += f"system_metrics_interval = {args.system_metrics_interval if mode != 'offline' else 0}\n"
    return f"""
[job]
name = "bench-tracking"
seed = 0

[model]
name = "resnet18"
num_classes = 10

[dataset]
name = "synthetic"
num_train = {total * args.batch}
num_val = {args.batch}
image_size = {args.image_size}

[optimizer]
name = "sgd"
lr = 0.01
momentum = 0.9

[train]
epochs = 1
max_steps = {total}
batch_size = {args.batch}
log_every = 1

[tracking]
{tracking}log_model = "none"
"""


def worker(args: argparse.Namespace) -> dict:
    sys.path.insert(0, args.plugin_root)
    from runjob.host.plugin_host import load_plugins
    from runjob.job.validation import load_resolved
    from runjob.train.runner import run_job

    work = Path(args.work)
    job_file = work / f"job-{args.worker}.toml"
    job_file.write_text(job_toml(args, args.worker), encoding="utf-8")
    host = load_plugins()
    job = load_resolved(job_file, [], host)
    out = work / f"out-{args.worker}-{time.time_ns()}"
    run_job(job, host, output_dir=out)
    import runjob_bench_timer

    result = {
        "step_times": runjob_bench_timer.STEP_TIMES,
        "cpu_times": runjob_bench_timer.CPU_TIMES,
        "end_after_last_step_s": time.perf_counter() - runjob_bench_timer.STEP_TIMES[-1],
    }
    if args.worker in ("online", "server"):
        from mlflow import MlflowClient

        record = json.loads((out / "mlflow_run.json").read_text())
        history = MlflowClient(record["tracking_uri"]).get_metric_history(record["run_id"], "train/loss")
        result["server_loss_points"] = len(history)
        result["unsynced"] = record.get("unsynced")
    return result


def sync_call_costs(uri: str, calls: int) -> dict[str, float]:
    """Milliseconds per synchronous log_metric and per log_batch of 5 metrics (medians)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(uri)
    experiment = client.create_experiment(f"sync-calls-{time.time_ns()}")
    run_id = client.create_run(experiment).info.run_id
    single, batch, batch_cpu = [], [], []
    for step in range(calls):
        started = time.perf_counter()
        client.log_metric(run_id, "x", float(step), step=step)
        single.append(1000 * (time.perf_counter() - started))
        metrics = [Metric(f"m{i}", float(step), int(time.time() * 1000), step) for i in range(5)]
        started, cpu = time.perf_counter(), time.thread_time()
        client.log_batch(run_id, metrics=metrics)
        batch.append(1000 * (time.perf_counter() - started))
        batch_cpu.append(1000 * (time.thread_time() - cpu))  # the client's own CPU time (the rest: server and network)
    client.set_terminated(run_id)
    return {
        "log_metric_ms_median": common.median(single),
        "log_batch5_ms_median": common.median(batch),
        "log_batch5_client_cpu_ms_median": common.median(batch_cpu),
        "log_metric_ms": single,
        "log_batch5_ms": batch,
        "log_batch5_client_cpu_ms": batch_cpu,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_repetition_arguments(parser, "mode")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--calls", type=int, default=50, help="synchronous calls timed for the reference")
    parser.add_argument(
        "--calls-only", action="store_true", help="only the synchronous-call reference (prints it; writes no JSON)"
    )
    parser.add_argument("--json", type=Path, help="where to write the raw numbers (default benchmarks/tracking.json)")
    parser.add_argument("--cpu", action="store_true", help="the training process's CPU time per step (see above)")
    parser.add_argument(
        "--costs",
        action="store_true",
        help="the CPU the training process spends per recording call (log_metrics to a live recording process, "
        "one system-metrics sample), measured directly",
    )
    parser.add_argument("--system-metrics-interval", type=float, default=10.0, help="with --cpu, for server and sqlite")
    parser.add_argument("--baseline-python", help="with --cpu: the python of another checkout, as runjob@base")
    parser.add_argument("--worker", choices=["online", "offline", "server", "sqlite"], help=argparse.SUPPRESS)
    parser.add_argument("--uri", help=argparse.SUPPRESS)
    parser.add_argument("--plugin-root", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        common.emit(worker(args))
        return 0
    if args.cpu:
        return cpu_main(args)
    if args.costs:
        return costs_main(args)

    info = common.machine()
    common.print_machine(info)
    if args.calls_only:
        with tempfile.TemporaryDirectory(prefix="runjob-bench-tracking-") as tmp:
            with running_mlflow_server(Path(tmp) / "server") as uri:
                calls = sync_call_costs(uri, args.calls)
        print(json.dumps({k: v for k, v in calls.items() if k.endswith("median")}))
        return 0
    modes = ["online", "offline"]
    results = {m: {"samples_per_s": [], "median_step_ms": [], "load": [], "end_after_last_step_s": []} for m in modes}
    checks = []
    with tempfile.TemporaryDirectory(prefix="runjob-bench-tracking-") as tmp:
        work = Path(tmp)
        plugin_root = common.make_timer_plugin(work / "plugin")
        started = time.perf_counter()
        with running_mlflow_server(work / "server") as uri:
            server_start_s = time.perf_counter() - started
            print(f"mlflow server at {uri} (up in {server_start_s:.1f} s)", flush=True)
            env = {**os.environ, "PYTHONUNBUFFERED": "1", **common.thread_env(args.threads), "MLFLOW_TRACKING_URI": uri}
            for rep in range(args.reps):
                for mode in modes:
                    command = [
                        str(Path(__file__).resolve()),
                        "--worker",
                        mode,
                        "--uri",
                        uri,
                        "--plugin-root",
                        str(plugin_root),
                        "--work",
                        str(work),
                        "--steps",
                        str(args.steps),
                        "--warmup",
                        str(args.warmup),
                        "--batch",
                        str(args.batch),
                        "--image-size",
                        str(args.image_size),
                    ]
                    load = common.load_now()
                    answer = common.run_worker(command, env=env)
                    rate = common.steady_rate(answer["step_times"], args.warmup, args.batch)
                    for key in ("samples_per_s", "median_step_ms"):
                        results[mode][key].append(rate[key])
                    results[mode]["load"].append(load)
                    results[mode]["end_after_last_step_s"].append(answer["end_after_last_step_s"])
                    note = ""
                    if mode == "online":
                        total = args.warmup + args.steps
                        checks.append(
                            {
                                "server_loss_points": answer["server_loss_points"],
                                "expected": total,
                                "unsynced": answer["unsynced"],
                            }
                        )
                        note = f"  train/loss points on the server: {answer['server_loss_points']}/{total}"
                    print(
                        f"rep {rep + 1}/{args.reps}  {mode:<8} {rate['samples_per_s']:8.1f} samples/s  median step "
                        f"{rate['median_step_ms']:7.1f} ms  "
                        f"load {load}{note}",
                        flush=True,
                    )
            calls = sync_call_costs(uri, args.calls)

    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    online, offline = results["online"]["samples_per_s"], results["offline"]["samples_per_s"]
    paired = [on / off for on, off in zip(online, offline, strict=True)]
    ratio = common.median(online) / common.median(offline)
    step_on, step_off = (
        common.median(results["online"]["median_step_ms"]),
        common.median(results["offline"]["median_step_ms"]),
    )
    overhead = 1 / ratio - 1  # extra step time, as a fraction of the offline step time
    print()
    print(
        f"ResNet-18 (ImageNet stem), {args.image_size}x{args.image_size}, batch {args.batch}, fp32, CPU, "
        f"{args.threads or 'default'} torch thread(s); log_every 1; "
        f"{args.steps} timed steps after {args.warmup} warm-up, {args.reps} interleaved repetitions; load at end "
        f"{info['load_avg_end']}"
    )
    print(
        common.table(
            [
                [
                    "online (mlflow server)",
                    common.median(online),
                    step_on,
                    ratio,
                    common.median(paired),
                    f"{min(paired):.3f}-{max(paired):.3f}",
                ],
                ["offline (metrics.jsonl only)", common.median(offline), step_off, 1.0, 1.0, ""],
            ],
            [
                "tracking",
                "samples/s (median)",
                "step ms (median)",
                "vs offline",
                "paired ratio (median)",
                "paired range",
            ],
        )
    )
    verdict = "met" if overhead < GOAL_OVERHEAD else "MISSED"
    print(
        f"step-time overhead of logging every step: {100 * overhead:+.2f}% (from the ratio of median throughputs; goal "
        f"< 1%: {verdict}); "
        f"paired: {100 * (1 / common.median(paired) - 1):+.2f}%"
    )
    print(
        f"synchronous MlflowClient.log_metric to this server: {calls['log_metric_ms_median']:.1f} ms a call (median of "
        f"{args.calls}); "
        f"log_batch of 5 metrics: {calls['log_batch5_ms_median']:.1f} ms, of it "
        f"{calls['log_batch5_client_cpu_ms_median']:.1f} ms CPU in the calling thread"
    )
    print(f"mlflow server start to /health: {server_start_s:.1f} s")
    summary = {
        "online_median_samples_per_s": common.median(online),
        "offline_median_samples_per_s": common.median(offline),
        "ratio_online_vs_offline": ratio,
        "median_paired_ratio": common.median(paired),
        "step_time_overhead": overhead,
        "goal_overhead": GOAL_OVERHEAD,
        "sync_log_metric_ms": calls["log_metric_ms_median"],
        "sync_log_batch5_ms": calls["log_batch5_ms_median"],
        "server_start_s": server_start_s,
        "upload_checks": checks,
    }
    settings = {k: getattr(args, k) for k in ("steps", "warmup", "reps", "batch", "image_size", "threads", "calls")}
    path = common.write_json(
        "tracking",
        {"machine": info, "settings": settings, "raw": results, "sync_calls": calls, "summary": summary},
        args.json,
    )
    print(f"raw numbers: {path}")
    return 0


def costs_main(args: argparse.Namespace, calls: int = 2000, samples: int = 50) -> int:
    """What recording costs the training process, call by call: ``Recorder.log_metrics`` (5
    metrics: a line each in metrics.jsonl and one message down the pipe to a live recording process
    writing to a sqlite store) and one ``SystemMetricsSampler.sample()``, in this process's CPU
    time (``time.process_time``: all its threads, so the pipe's reply reader is counted too)."""
    from types import SimpleNamespace

    from runjob.record.recorder import Recorder
    from runjob.record.system_metrics import SystemMetricsSampler

    info = common.machine()
    common.print_machine(info)
    with tempfile.TemporaryDirectory(prefix="runjob-bench-costs-") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        recorder = Recorder(out)
        tracking = SimpleNamespace(offline=False, log_model="none")
        recorder.start(
            tracking=tracking,
            experiment="costs",
            run_name="costs",
            params={"a": "1"},
            tags={},
            tracking_uri=f"sqlite:///{tmp}/store.db",
        )
        recorder.opened()
        metrics = {"train/loss": 0.5, "lr": 0.01, "train/samples_per_s": 500.0, "train/tflops": 0.1, "x": 1.0}
        started, cpu = time.perf_counter(), time.process_time()
        for step in range(calls):
            recorder.log_metrics(metrics, step)
        log_cpu = (time.process_time() - cpu) / calls
        log_wall = (time.perf_counter() - started) / calls
        sampler = SystemMetricsSampler(lambda values, step: None, 10.0, 0, int(time.time() * 1000))
        sampler.sample()  # the monitors' first sample primes psutil
        cpu = time.process_time()
        for _ in range(samples):
            sampler.sample()
        sample_cpu = (time.process_time() - cpu) / samples
        recorder.end("FINISHED")
        record = json.loads((out / "mlflow_run.json").read_text())
    print(
        f"Recorder.log_metrics (5 metrics, live recording process): {1e6 * log_cpu:.0f} us CPU, "
        f"{1e6 * log_wall:.0f} us wall a call ({calls} calls); one system-metrics sample: "
        f"{1e3 * sample_cpu:.2f} ms CPU ({samples} samples); "
        f"the run ended {record['status']}{', unsynced: ' + record['unsynced'] if record.get('unsynced') else ''}"
    )
    common.write_json(
        "tracking_costs",
        {"machine": info, "log_metrics_cpu_s": log_cpu, "log_metrics_wall_s": log_wall, "sample_cpu_s": sample_cpu},
        args.json,
    )
    return 0


def cpu_main(args: argparse.Namespace) -> int:
    """Training-process CPU time per step, recording on (server, sqlite) and off, paired by round."""
    info = common.machine()
    common.print_machine(info)
    if args.baseline_python and (why := common.peer_missing("runjob@base", executable=args.baseline_python)):
        print(why)
        args.baseline_python = None
    modes = ["server", "sqlite", "offline"]
    pythons = {"runjob": sys.executable, **({"runjob@base": args.baseline_python} if args.baseline_python else {})}
    contestants = [(who, mode) for who in pythons for mode in modes]
    raw: dict[str, list[dict]] = {f"{who} {mode}": [] for who, mode in contestants}
    loads = []
    with tempfile.TemporaryDirectory(prefix="runjob-bench-tracking-") as tmp:
        work = Path(tmp)
        plugin_root = common.make_timer_plugin(work / "plugin")
        with running_mlflow_server(work / "server") as uri:
            env = {**os.environ, "PYTHONUNBUFFERED": "1", **common.thread_env(args.threads)}
            for rep in range(args.reps):
                loads.append(common.load_now())
                order = contestants if rep % 2 == 0 else contestants[::-1]
                for who, mode in order:
                    command = [str(Path(__file__).resolve()), "--worker", mode, "--uri", uri, "--cpu"]
                    command += ["--system-metrics-interval", str(args.system_metrics_interval)]
                    command += ["--plugin-root", str(plugin_root), "--work", str(work), "--steps", str(args.steps)]
                    command += ["--warmup", str(args.warmup), "--batch", str(args.batch)]
                    command += ["--image-size", str(args.image_size)]
                    answer = common.run_worker(command, env=env, python=pythons[who])
                    measured = {
                        **common.steady_rate(answer["step_times"], args.warmup, args.batch),
                        **common.steady_cpu(answer["cpu_times"], args.warmup),
                        "server_loss_points": answer.get("server_loss_points"),
                        "unsynced": answer.get("unsynced"),
                    }
                    raw[f"{who} {mode}"].append(measured)
                print(
                    f"round {rep + 1}/{args.reps} load {loads[-1]}: "
                    + "  ".join(f"{name} {runs[-1]['cpu_ms_per_step']:.1f} CPU ms" for name, runs in raw.items()),
                    flush=True,
                )
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    rows, summary = [], {}
    for who in pythons:
        base = raw[f"{who} offline"]
        for mode in modes:
            runs = raw[f"{who} {mode}"]
            cpu = common.paired_ratio([r["cpu_ms_per_step"] for r in runs], [r["cpu_ms_per_step"] for r in base])
            wall = common.paired_ratio([r["median_step_ms"] for r in runs], [r["median_step_ms"] for r in base])
            summary[f"{who} {mode}"] = {"cpu_vs_offline": cpu, "wall_vs_offline": wall}
            rows.append(
                [
                    f"{who} {mode}",
                    common.median([r["cpu_ms_per_step"] for r in runs]),
                    common.median([r["median_step_ms"] for r in runs]),
                    f"{cpu['paired']:.4f} ({cpu['low']:.4f}-{cpu['high']:.4f})",
                    f"{wall['paired']:.4f} ({wall['low']:.4f}-{wall['high']:.4f})",
                ]
            )
    print()
    print(
        f"ResNet-18 {args.image_size}x{args.image_size}, batch {args.batch}, log_every 1, system metrics every "
        f"{args.system_metrics_interval:g} s when recording; {args.steps} timed steps after {args.warmup}, "
        f"{args.reps} rounds; loads {loads}, at end {info['load_avg_end']}"
    )
    header = ["contestant", "CPU ms/step", "wall ms/step", "CPU vs offline (95% CI)", "wall vs offline (95% CI)"]
    print(common.table(rows, header))
    settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    data = {"machine": info, "settings": settings, "raw": raw, "loads": loads, "summary": summary}
    path = common.write_json("tracking_cpu", data, args.json)
    print(f"raw numbers: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
