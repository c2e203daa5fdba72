"""Fast path: runjob's speed options one at a time, and runjob's defaults against a hand-written loop.

Both parts train a torchvision model (ResNet-18 by default, ``num_classes=10``) on CIFAR-10 files
written by this script in CIFAR's own pickle format (random pixels and labels, so
``verify = false``), with SGD (lr 0.1, momentum 0.9), fp32, ``max_steps = warm-up + timed steps``.

* ``--part options``: runjob's ``run_job`` in-process on one base job (``cifar10``, runjob's
  defaults: in memory, crop + flip batched on the device; tracking offline, ``log_model = "none"``),
  then the same job with one option changed: ``channels_last``, ``compile``, ``foreach``, ``fused``,
  ``bf16``, ``in_memory_off`` (torchvision's per-image PIL transforms through the DataLoader,
  ``--num-workers`` workers), and on CUDA ``cudnn_benchmark`` and ``all_on`` (channels_last + bf16 +
  fused + cudnn_benchmark + compile). Each is reported against ``baseline``, with the MFU and
  peak memory from the run's ``metrics.jsonl``.
* ``--part handwritten``: runjob with the base job against the Accelerate quick-start loop over
  torchvision's ``datasets.CIFAR10`` on the same files, with the standard transforms
  (RandomCrop(32, padding=4), RandomHorizontalFlip, ToTensor, Normalize) in a
  ``DataLoader(shuffle=True, drop_last=True, num_workers=--hand-workers)``.

Each repetition is one subprocess (Accelerate's state is one per process); the contestants run
interleaved. Throughput is samples/s from the end of the warm-up steps to the last step (so
``compile``'s compiling is not timed), from ``time.perf_counter()`` after each optimizer step (a
runjob plugin's ``runjob_after_step`` on runjob's side, the same call inline in the hand-written
loop); on CUDA the GPU is waited for at those two steps only, so queued work is counted.

Defaults follow the device: on a CPU batch 64, the ImageNet stem (a step of ResNet-18 with the
CIFAR stem takes seconds on a CPU), 1 torch thread; with CUDA batch 512, ``cifar_stem``, torch's
threads.

    uv run python benchmarks/fastpath.py --part options       # ~10 minutes on 2 busy CPU cores
    uv run python benchmarks/fastpath.py --part handwritten   # ~2 minutes on 2 busy CPU cores
    uv run python benchmarks/fastpath.py --part handwritten --model mobilenet_v3_small
    uv run python benchmarks/fastpath.py --part options --variants baseline,bf16,fused --reps 5
    uv run python benchmarks/fastpath.py --part options --steps 100 --reps 2 --num-workers 8   # one GPU
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

CIFAR_MEAN = [0.4914, 0.4822, 0.4465]
CIFAR_STD = [0.2470, 0.2435, 0.2616]
LR, MOMENTUM, SEED = 0.1, 0.9, 0
GOAL_VS_HANDWRITTEN = 1.10  # issue 6: runjob's defaults >= 1.10x a hand-written loop on small data sets
GOAL_H200_IMAGES_S = 60_000  # issue 6: ResNet-18 (CIFAR stem) on one H200

ALL_ON = ["train.channels_last=true", 'train.mixed_precision="bf16"', "optimizer.fused=true", "train.compile=true"]
VARIANTS: dict[str, list[str]] = {  # each: the --set overrides applied to the base job
    "baseline": [],
    "channels_last": ["train.channels_last=true"],
    "compile": ["train.compile=true"],
    "foreach": ["optimizer.foreach=true"],
    "fused": ["optimizer.fused=true"],
    "bf16": ['train.mixed_precision="bf16"'],
    "in_memory_off": ["dataset.in_memory=false"],  # + dataset.num_workers with --num-workers
    "cudnn_benchmark": ["train.cudnn_benchmark=true"],  # CUDA only
    "all_on": ALL_ON,  # + train.cudnn_benchmark=true on CUDA
}
CUDA_ONLY = {"cudnn_benchmark"}
COMPILED = {"compile", "all_on"}
KEPT_METRICS = ("train/mfu", "train/tflops", "train/samples_per_s", "train/peak_memory_gib", "train/peak_rss_gib")

# The timer: like common.py's, plus a CUDA synchronize at the two steps that bound the timed window
# (RUNJOB_BENCH_SYNC_STEPS), so that kernels still queued then are counted.
TIMER_PLUGIN = '''
"""fastpath.py's timer: a runjob plugin noting when each optimizer step ends."""
import os
import time

from runjob import hookimpl

STEP_TIMES = []  # time.perf_counter() after each optimizer step
SYNC_STEPS = {int(s) for s in os.environ.get("RUNJOB_BENCH_SYNC_STEPS", "").split(",") if s}


def mark(step):
    if step in SYNC_STEPS:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
    STEP_TIMES.append(time.perf_counter())


@hookimpl
def runjob_after_step(run, step, epoch, loss):
    mark(step)
'''


# ---------------------------------------------------------------- workers (one per subprocess)


def job_toml(spec: dict) -> str:
    """The base job: runjob's defaults for cifar10 (in memory, augmented), tracking offline."""
    stem = f"cifar_stem = {str(spec['cifar_stem']).lower()}\n" if spec["cifar_stem"] else ""
    return f"""
[job]
name = "bench-fastpath"
seed = {SEED}

[model]
name = "{spec["model"]}"
num_classes = 10
{stem}
[dataset]
name = "cifar10"
root = "{spec["cifar_root"]}"
download = false
verify = false
augment = true

[optimizer]
name = "sgd"
lr = {LR}
momentum = {MOMENTUM}

[train]
max_steps = {spec["warmup"] + spec["steps"]}
batch_size = {spec["batch"]}
mixed_precision = "{spec["mixed_precision"]}"

[tracking]
offline = true
log_model = "none"
"""


def read_metrics(path: Path) -> list[list]:
    """The points of KEPT_METRICS in a run's metrics.jsonl, as [key, value, step]."""
    points = []
    for line in path.read_text(encoding="utf-8").splitlines():
        point = json.loads(line)
        if point["key"] in KEPT_METRICS:
            points.append([point["key"], point["value"], point["step"]])
    return points


def worker_runjob(spec: dict) -> dict:
    sys.path.insert(0, spec["plugin_root"])  # the timer plugin's dist-info
    from runjob.host.plugin_host import load_plugins
    from runjob.job.validation import load_resolved
    from runjob.train.runner import run_job

    work = Path(spec["work"])
    host = load_plugins()
    if not any(p.name == "zzz_fastpath_timer" for p in host.plugins):
        raise RuntimeError(f"timer plugin not loaded: {host.failures}")
    job = load_resolved(work / "job.toml", spec["overrides"], host)
    out = Path(tempfile.mkdtemp(dir=work, prefix="runjob-out-"))
    os.rmdir(out)
    run_job(job, host, output_dir=out)
    import runjob_fastpath_timer

    metrics = read_metrics(out / "metrics.jsonl")
    shutil.rmtree(out, ignore_errors=True)  # model.safetensors: 45 MB a run for ResNet-18
    return {"step_times": runjob_fastpath_timer.STEP_TIMES, "metrics": metrics}


def build_model(spec: dict):
    """torchvision's model, with runjob's cifar_stem change when asked (the same model on both sides)."""
    import torch.nn as nn
    import torchvision

    model = torchvision.models.get_model(spec["model"], num_classes=10)
    if spec["cifar_stem"]:
        model.conv1 = nn.Conv2d(3, model.conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    return model


def worker_handwritten(spec: dict) -> dict:
    # The hand-written loop, as in Accelerate's quick start, on torchvision's CIFAR10 and transforms.
    import torch
    import torch.nn.functional as F
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    sys.path.insert(0, spec["plugin_root"])
    import runjob_fastpath_timer as timer

    class BenchCIFAR10(datasets.CIFAR10):
        """The benchmark's files are complete but their md5 sums are not CIFAR's."""

        train_list = [[name, None] for name, _ in datasets.CIFAR10.train_list]
        test_list = [[name, None] for name, _ in datasets.CIFAR10.test_list]
        meta = {**datasets.CIFAR10.meta, "md5": None}

    torch.manual_seed(SEED)
    total = spec["warmup"] + spec["steps"]
    accelerator = Accelerator(mixed_precision=spec["mixed_precision"])
    model = build_model(spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    train_tf = transforms.Compose(
        [
            transforms.RandomCrop(32, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(CIFAR_MEAN, CIFAR_STD),
        ]
    )
    dataset = BenchCIFAR10(spec["cifar_root"], train=True, download=False, transform=train_tf)
    dataloader = DataLoader(
        dataset, batch_size=spec["batch"], shuffle=True, drop_last=True, num_workers=spec["hand_workers"]
    )
    model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)

    model.train()
    for inputs, targets in dataloader:
        outputs = model(inputs)
        loss = F.cross_entropy(outputs, targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        timer.mark(len(timer.STEP_TIMES) + 1)
        if len(timer.STEP_TIMES) >= total:
            break
    if accelerator.device.type == "cuda":
        peak = ["train/peak_memory_gib", torch.cuda.max_memory_allocated(accelerator.device) / 2**30, total]
    else:
        peak = ["train/peak_rss_gib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, total]
    return {"step_times": timer.STEP_TIMES, "metrics": [peak]}


WORKERS = {"runjob": worker_runjob, "handwritten": worker_handwritten}


# ---------------------------------------------------------------- driver


def write_cifar(root: Path, num_train: int, num_test: int, seed: int = SEED) -> Path:
    """CIFAR-10's python format with random pixels and labels, ``num_train`` training images in all
    (the ``cifar10`` plugin's writer). The md5 sums are not CIFAR's: verify = false."""
    from runjob_builtins.image_datasets import write_cifar10_files

    return write_cifar10_files(root, per_batch=-(-num_train // 5), test_count=num_test, seed=seed)


def gpu_name() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout
        return out.strip().splitlines()[0] if out.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def timed_median(points: list[list], key: str, warmup: int) -> float | None:
    """Median of ``key`` over the logging windows that lie wholly after the warm-up steps."""
    steps = sorted({step for k, _, step in points if k == "train/samples_per_s"})
    starts = dict(zip(steps, [0, *steps[:-1]], strict=True))  # each logged window starts after the previous log step
    values = [value for k, value, step in points if k == key and starts.get(step, 0) >= warmup]
    return common.median(values) if values else None


def peak_memory(points: list[list]) -> tuple[str, float] | tuple[None, None]:
    for key in ("train/peak_memory_gib", "train/peak_rss_gib"):
        values = [value for k, value, _ in points if k == key]
        if values:
            return key.removeprefix("train/"), max(values)
    return None, None


def fmt(value: float | None, digits: str = ".3f") -> str:
    return "-" if value is None else format(value, digits)


def verdict(paired: list[float], ratio: float, noise: float) -> str:
    """faster / slower only when every pair agrees and the medians differ by more than the noise."""
    if ratio > 1 + noise and min(paired) > 1:
        return "faster"
    if ratio < 1 - noise and max(paired) < 1:
        return "slower"
    return "inside noise"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--part",
        choices=["options", "handwritten"],
        default="options",
        help="options: one option at a time against the base job; handwritten: runjob vs a hand-written loop",
    )
    parser.add_argument(
        "--variants",
        help=f"options part: comma-separated subset of {', '.join(VARIANTS)} "
        "(default: all but cudnn_benchmark and all_on on a CPU, all with CUDA); baseline is always run",
    )
    parser.add_argument("--steps", type=int, help="timed steps per repetition (default 20 on a CPU, 200 with CUDA)")
    parser.add_argument(
        "--warmup",
        type=int,
        help="steps not timed at the start of each repetition (default 5; 10 when "
        "compile or all_on runs, whose first steps compile)",
    )
    parser.add_argument(
        "--reps",
        type=int,
        help="repetitions of each contestant, interleaved (default 3; 2 for the options part on a CPU)",
    )
    parser.add_argument("--batch", type=int, help="default 64 on a CPU, 512 with CUDA")
    parser.add_argument(
        "--model",
        default="resnet18",
        help="a torchvision classification model name (e.g. mobilenet_v3_small), both sides",
    )
    parser.add_argument(
        "--cifar-stem",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ResNet's 3x3 stride-1 stem without max-pool (default: on with CUDA, off on a CPU)",
    )
    parser.add_argument(
        "--mixed-precision",
        choices=["no", "bf16", "fp16"],
        default="no",
        help="the base job's precision (and the hand-written loop's)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch (OpenMP/MKL) threads per run, 0 for torch's default (default 1 on a CPU, 0 with CUDA)",
    )
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader workers of the in_memory_off variant")
    parser.add_argument("--hand-workers", type=int, default=0, help="DataLoader workers of the hand-written loop")
    parser.add_argument(
        "--noise", type=float, help="a ratio within 1 +- this is 'inside noise' (default 0.10 on a CPU, 0.03 with CUDA)"
    )
    parser.add_argument(
        "--json", type=Path, help="where to write the raw numbers (default benchmarks/fastpath_<part>.json)"
    )
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        common.emit(WORKERS[args.worker](json.loads(args.spec)))
        return 0

    import torch

    cuda = torch.cuda.is_available()
    if args.variants:
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown:
            parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
        if not cuda and CUDA_ONLY & set(variants):
            parser.error("cudnn_benchmark needs CUDA")
        variants = ["baseline"] + [v for v in variants if v != "baseline"]
    else:
        variants = [v for v in VARIANTS if cuda or v not in CUDA_ONLY | {"all_on"}]
    if args.part == "handwritten":
        variants = ["baseline"]
    compiled = args.part == "options" and bool(COMPILED & set(variants))
    batch = args.batch or (512 if cuda else 64)
    steps = args.steps or (200 if cuda else 20)
    reps = args.reps or (2 if args.part == "options" and not cuda else 3)
    warmup = args.warmup if args.warmup is not None else (10 if compiled else 5)
    threads = args.threads if args.threads is not None else (0 if cuda else 1)
    cifar_stem = cuda if args.cifar_stem is None else args.cifar_stem
    noise = args.noise if args.noise is not None else (0.03 if cuda else 0.10)
    if warmup < 1:
        parser.error("--warmup must be at least 1")
    if cifar_stem and not args.model.startswith(("resnet", "resnext", "wide_resnet")):
        parser.error(f"--cifar-stem is for ResNets; {args.model} has no such option (pass --no-cifar-stem)")
    total = warmup + steps

    info = common.machine()
    if cuda:
        info["gpu"] = gpu_name()
    common.print_machine(info)
    extra = {
        "in_memory_off": [f"dataset.num_workers={args.num_workers}"] if args.num_workers else [],
        "all_on": ["train.cudnn_benchmark=true"] if cuda else [],
    }
    overrides = {v: VARIANTS[v] + extra.get(v, []) for v in variants}
    contestants = [f"runjob/{v}" for v in variants] if args.part == "options" else ["runjob", "handwritten"]

    results: dict[str, dict[str, list]] = {
        c: {
            "samples_per_s": [],
            "median_step_ms": [],
            "mfu": [],
            "tflops": [],
            "peak_gib": [],
            "peak_kind": [],
            "load": [],
            "wall_s": [],
            "step_ms": [],
        }
        for c in contestants
    }
    with tempfile.TemporaryDirectory(prefix="runjob-bench-fastpath-") as tmp:
        work = Path(tmp)
        plugin_root = common.make_timer_plugin(work / "plugin", "runjob_fastpath_timer", TIMER_PLUGIN)
        cifar_root = write_cifar(work / "cifar10", num_train=(total + 2) * batch, num_test=batch)
        base = {
            "model": args.model,
            "cifar_stem": cifar_stem,
            "cifar_root": str(cifar_root),
            "warmup": warmup,
            "steps": steps,
            "batch": batch,
            "mixed_precision": args.mixed_precision,
            "hand_workers": args.hand_workers,
            "plugin_root": str(plugin_root),
            "work": str(work),
        }
        (work / "job.toml").write_text(job_toml(base), encoding="utf-8")
        check_variants(work / "job.toml", overrides)
        env = {
            **os.environ,
            "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
            "PYTHONUNBUFFERED": "1",
            "RUNJOB_BENCH_SYNC_STEPS": f"{warmup},{total}",
            **common.thread_env(threads),
        }
        print(
            f"{args.part}: {', '.join(contestants)}; {args.model}{' (CIFAR stem)' if cifar_stem else ''}, batch "
            f"{batch}, {args.mixed_precision if args.mixed_precision != 'no' else 'fp32'}, {steps} timed steps after "
            f"{warmup} warm-up, {reps} repetition(s)",
            flush=True,
        )
        for rep in range(reps):
            for contestant in contestants:
                worker, _, variant = contestant.partition("/")
                spec = {**base, "overrides": overrides.get(variant or "baseline", [])}
                command = [str(Path(__file__).resolve()), "--worker", worker, "--spec", json.dumps(spec)]
                load = common.load_now()
                answer = common.run_worker(command, env=env)
                rate = common.steady_rate(answer["step_times"], warmup, batch)
                if len(answer["step_times"]) != total:
                    raise RuntimeError(f"{contestant}: {len(answer['step_times'])} steps timed, {total} expected")
                entry = results[contestant]
                kind, peak = peak_memory(answer["metrics"])
                entry["samples_per_s"].append(rate["samples_per_s"])
                entry["median_step_ms"].append(rate["median_step_ms"])
                entry["mfu"].append(timed_median(answer["metrics"], "train/mfu", warmup))
                entry["tflops"].append(timed_median(answer["metrics"], "train/tflops", warmup))
                entry["peak_gib"].append(peak)
                entry["peak_kind"].append(kind)
                entry["load"].append(load)
                entry["wall_s"].append(round(answer["process_wall_s"], 1))
                times = answer["step_times"]
                entry["step_ms"].append([round(1000 * (b - a), 2) for a, b in zip(times, times[1:], strict=False)])
                print(
                    f"rep {rep + 1}/{reps}  {contestant:<22} {rate['samples_per_s']:9.1f} samples/s  "
                    f"median step {rate['median_step_ms']:8.1f} ms  load {load}  ({answer['process_wall_s']:.0f} s in "
                    "all)",
                    flush=True,
                )

    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    reference = contestants[0] if args.part == "options" else "handwritten"
    base_rates = results[reference]["samples_per_s"]
    rows, summary = [], {}
    for contestant in contestants:
        entry = results[contestant]
        rates = entry["samples_per_s"]
        paired = [r / b for r, b in zip(rates, base_rates, strict=True)]
        mfus = [m for m in entry["mfu"] if m is not None]
        tflops = [t for t in entry["tflops"] if t is not None]
        peaks = [p for p in entry["peak_gib"] if p is not None]
        kind = next((k for k in entry["peak_kind"] if k), None)
        item = {
            "overrides": overrides.get(contestant.partition("/")[2], []) if args.part == "options" else None,
            "median_samples_per_s": common.median(rates),
            "ratio_of_medians": common.median(rates) / common.median(base_rates),
            "median_of_paired_ratios": common.median(paired),
            "min_paired_ratio": min(paired),
            "max_paired_ratio": max(paired),
            "median_mfu": common.median(mfus) if mfus else None,
            "median_tflops": common.median(tflops) if tflops else None,
            "max_peak_gib": max(peaks) if peaks else None,
            "peak_kind": kind,
            "verdict": None
            if contestant == reference
            else verdict(paired, common.median(rates) / common.median(base_rates), noise),
        }
        summary[contestant] = item
        rows.append(
            [
                contestant.removeprefix("runjob/") if args.part == "options" else contestant,
                item["median_samples_per_s"],
                common.median(entry["median_step_ms"]),
                item["ratio_of_medians"],
                item["median_of_paired_ratios"],
                f"{min(paired):.3f}-{max(paired):.3f}",
                fmt(item["median_mfu"]),
                fmt(item["median_tflops"], ".3g"),
                f"{fmt(item['max_peak_gib'], '.2f')} ({kind.removesuffix('_gib') if kind else '-'})",
                item["verdict"] or "",
            ]
        )

    device = f"CUDA ({info.get('gpu', 'GPU')})" if cuda else "CPU"
    print()
    stem = (
        " (CIFAR stem)"
        if cifar_stem
        else " (ImageNet stem)"
        if args.model.startswith(("resnet", "resnext", "wide_resnet"))
        else ""
    )
    print(
        f"{args.model}{stem}, 32x32 CIFAR-format random images, batch {batch}, "
        f"{args.mixed_precision if args.mixed_precision != 'no' else 'fp32'} base, {device}, {threads or 'default'} "
        f"torch thread(s); {steps} timed steps after {warmup} warm-up, {reps} interleaved repetitions; load at end "
        f"{info['load_avg_end']}"
    )
    against = "vs baseline" if args.part == "options" else "vs hand-written"
    print(
        common.table(
            rows,
            [
                "variant" if args.part == "options" else "loop",
                "samples/s (median)",
                "step ms (median)",
                against,
                "paired ratio (median)",
                "paired range",
                "MFU",
                "TFLOP/s",
                "peak GiB",
                f"verdict (noise {noise:.0%})",
            ],
        )
    )
    goals = {}
    if args.part == "handwritten":
        ratio = summary["runjob"]["ratio_of_medians"]
        goals["runjob_vs_handwritten"] = {
            "goal": GOAL_VS_HANDWRITTEN,
            "ratio_of_medians": ratio,
            "met": ratio >= GOAL_VS_HANDWRITTEN,
        }
        print(
            f"runjob / hand-written: {ratio:.3f} (ratio of medians), "
            f"{summary['runjob']['median_of_paired_ratios']:.3f} (paired median); "
            f"goal >= {GOAL_VS_HANDWRITTEN:.2f}: {'met' if ratio >= GOAL_VS_HANDWRITTEN else 'not met'} in this run"
        )
    elif cuda and args.model == "resnet18" and cifar_stem:
        best = max(contestants, key=lambda c: summary[c]["median_samples_per_s"])
        rate = summary[best]["median_samples_per_s"]
        goals["images_per_s_one_gpu"] = {
            "goal": GOAL_H200_IMAGES_S,
            "best_variant": best,
            "median_samples_per_s": rate,
            "gpu": info.get("gpu"),
        }
        print(
            f"fastest: {best.removeprefix('runjob/')} at {rate:,.0f} images/s on one {info.get('gpu', 'GPU')}; "
            f"goal >= {GOAL_H200_IMAGES_S:,} images/s (ResNet-18, CIFAR stem, one H200): "
            f"{'met' if rate >= GOAL_H200_IMAGES_S else 'not met'}"
        )

    settings = {
        "part": args.part,
        "steps": steps,
        "warmup": warmup,
        "reps": reps,
        "batch": batch,
        "model": args.model,
        "cifar_stem": cifar_stem,
        "mixed_precision": args.mixed_precision,
        "threads": threads,
        "num_workers": args.num_workers,
        "hand_workers": args.hand_workers,
        "noise": noise,
        "device": device,
        "optimizer": f"SGD lr {LR} momentum {MOMENTUM}",
        "dataset": "cifar10 files of random pixels, augment = true",
    }
    path = common.write_json(
        f"fastpath_{args.part}",
        {"machine": info, "settings": settings, "raw": results, "summary": summary, "goals": goals},
        args.json,
    )
    print(f"raw numbers: {path}")
    return 0


def check_variants(job_file: Path, overrides: dict[str, list[str]]) -> None:
    """Every variant's job passes runjob's checks before anything runs (no torch needed for that)."""
    from runjob.errors import JobError
    from runjob.host.plugin_host import load_plugins
    from runjob.job.validation import load_resolved

    host = load_plugins()
    for variant, sets in overrides.items():
        try:
            load_resolved(job_file, sets, host)
        except JobError as error:
            raise SystemExit(f"variant {variant} ({' '.join(sets)}) is not a valid job:\n{error}") from None


if __name__ == "__main__":
    raise SystemExit(main())
