"""Training-loop overhead: runjob's loop against a hand-written Accelerate loop.

Same model (torchvision ResNet-18, num_classes=10, the unmodified ImageNet stem: no cifar_stem),
same data, batch size, precision (fp32), optimizer (SGD lr 0.01, momentum 0.9) and number of
steps, through

* ``runjob``: ``runjob.train.runner.run_job``, the function ``runjob JOB`` calls, in-process (so start-up
  is not timed), with tracking offline (metrics.jsonl only; MLflow's cost is benchmarks/tracking.py)
  and its defaults otherwise (log_every 10, system metrics every 10 s, on_nonfinite "stop");
* ``accelerate``: the HF Accelerate quick-start loop: ``Accelerator()``, ``prepare(model,
  optimizer, dataloader)``, forward, ``F.cross_entropy``, ``accelerator.backward``, step, zero_grad.

Two input paths, each for both loops: ``tensor`` (in-memory random tensors through the DataLoader:
runjob's ``synthetic`` dataset with ``in_memory = false`` and random tensors in a TensorDataset by
hand) and ``png`` (torchvision ImageFolder over scikit-learn's digits exported as PNG files, decoded
with PIL every step; hard links repeat the 1,437 training images so one epoch covers every timed
step). A third, ``lm`` (``--inputs lm``), is the language-model job of jobs/gpt_text.toml: its
``gpt`` model and the standard library's bytes in windows of 129 tokens, AdamW; runjob trains it
with the ``language_modeling`` task, the hand-written loop with the same model class and token
windows and ``F.cross_entropy`` over the next tokens.

With ``--baseline-python PATH`` a third contestant, ``runjob@base``, runs the same runjob worker
(this script's) with another interpreter, e.g. the virtual environment of an older checkout, so
that interpreter's ``runjob`` is measured against this one's (the job has no ``[task]`` table, so
both train classification by default).

Each repetition is one subprocess (Accelerate's state is one per process); the contestants run
interleaved, in a serpentine order (A B C, C B A, ...) so each runs before and after each other
equally often. Throughput is samples/s from the end of the warm-up steps to the last step, timed by
``time.perf_counter()`` after each optimizer step (a runjob plugin's ``runjob_after_step`` hook on
runjob's side, the same call inline in the hand-written loop); ``time.process_time()`` noted at
the same moments gives the process's CPU time per step (all its threads), which other tenants of
the machine disturb far less than the wall clock. Ratios between contestants come as the
geometric mean of the per-round ratios with a 95% t interval (pairs by interleaved round), and as
the ratio of medians with a 95% bootstrap interval over rounds.

    uv run python benchmarks/overhead.py                      # a few minutes on 2 CPU cores
    uv run python benchmarks/overhead.py --steps 300 --reps 7  # longer
    uv run python benchmarks/overhead.py --inputs tensor --baseline-python /tmp/base/.venv/bin/python
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

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
LR, MOMENTUM, SEED = 0.01, 0.9, 0


# ---------------------------------------------------------------- workers (one per subprocess)


LM_LR = 0.003
LM_TEXT = {"paths": "{stdlib}/*.py", "context": 128, "max_bytes": 2_000_000}
"""The ``lm`` input: jobs/gpt_text.toml's model (gpt: 4 layers, width 128, context 128) and data
(bytes of the standard library's top-level modules), AdamW at a constant learning rate."""


def train_tables(args: argparse.Namespace) -> str:
    """Both jobs' [train] and [tracking]: the warm-up and timed steps, one epoch at most, offline."""
    return f"""[train]
epochs = 1
max_steps = {args.warmup + args.steps}
batch_size = {args.batch}

[tracking]
offline = true
log_model = "none"
"""


def lm_job_toml(args: argparse.Namespace) -> str:
    return f"""
[job]
name = "bench-overhead-lm"
seed = {SEED}

[task]
name = "language_modeling"

[model]
name = "gpt"

[dataset]
name = "text_files"
paths = "{LM_TEXT["paths"]}"
context = {LM_TEXT["context"]}
max_bytes = {LM_TEXT["max_bytes"]}

[optimizer]
name = "adamw"
lr = {LM_LR}

{train_tables(args)}"""


def job_toml(args: argparse.Namespace) -> str:
    if args.input == "lm":
        return lm_job_toml(args)
    total = args.warmup + args.steps
    if args.input == "tensor":
        # in_memory = false: through the DataLoader as a TensorDataset, the hand-written loop's data path
        # (runjob's in-memory batching is measured against it in fastpath.py)
        dataset = (
            f'name = "synthetic"\nnum_train = {total * args.batch}\nnum_val = {args.batch}\n'
            f"image_size = {args.image_size}\nin_memory = false\n"
        )
    else:
        dataset = f'name = "imagefolder"\nroot = "{args.png_root}"\n'
    if args.num_workers:
        dataset += f"num_workers = {args.num_workers}\n"
    return f"""
[job]
name = "bench-overhead"
seed = {SEED}

[model]
name = "resnet18"
num_classes = 10

[dataset]
{dataset}
[optimizer]
name = "sgd"
lr = {LR}
momentum = {MOMENTUM}

{train_tables(args)}"""


def worker_runjob(args: argparse.Namespace) -> dict:
    sys.path.insert(0, args.plugin_root)  # the timer plugin's dist-info
    import runjob
    from runjob.host.plugin_host import load_plugins
    from runjob.job.validation import load_resolved
    from runjob.train.runner import run_job

    work = Path(args.work)
    job_file = work / f"job-{args.input}.toml"
    job_file.write_text(job_toml(args), encoding="utf-8")
    host = load_plugins()
    if not any(p.name == "zzz_bench_timer" for p in host.plugins):
        raise RuntimeError(f"timer plugin not loaded: {host.failures}")
    job = load_resolved(job_file, [], host)
    out = Path(tempfile.mkdtemp(dir=work, prefix="runjob-out-"))
    os.rmdir(out)
    run_job(job, host, output_dir=out)
    import runjob_bench_timer

    return {
        "step_times": runjob_bench_timer.STEP_TIMES,
        "cpu_times": runjob_bench_timer.CPU_TIMES,
        "runjob_file": runjob.__file__,  # which runjob this interpreter imported (runjob@base: the old one)
        "python": sys.executable,
    }


def bench_dataset(args: argparse.Namespace, total: int):
    """The hand-built contestants' data: seeded random tensors, or the PNG folder through ImageFolder."""
    import torch
    import torchvision
    from torch.utils.data import TensorDataset

    if args.input == "tensor":
        generator = torch.Generator().manual_seed(SEED)
        n, size = total * args.batch, args.image_size
        return TensorDataset(
            torch.randn(n, 3, size, size, generator=generator), torch.randint(0, 10, (n,), generator=generator)
        )
    from torchvision import transforms

    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    return torchvision.datasets.ImageFolder(str(Path(args.png_root) / "train"), transform=tf)


def lm_parts() -> tuple:
    """The ``lm`` input's data and model for the hand-written loop: the same bytes and the same
    GPT class as runjob's (built through their plugins' factories, not runjob's loop)."""
    from runjob_builtins.gpt import GPTOptions, build_gpt
    from runjob_builtins.text import TextFilesOptions, build_text_files

    splits = build_text_files(TextFilesOptions(**LM_TEXT))
    return splits.train, build_gpt(GPTOptions())


def worker_accelerate(args: argparse.Namespace) -> dict:
    # The hand-written loop, as in Accelerate's quick start.
    import torch
    import torch.nn.functional as F
    import torchvision
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    torch.manual_seed(SEED)
    total = args.warmup + args.steps
    lm = args.input == "lm"
    if lm:
        dataset, model = lm_parts()
    else:
        dataset, model = bench_dataset(args, total), torchvision.models.resnet18(num_classes=10)

    accelerator = Accelerator()
    if lm:
        optimizer = torch.optim.AdamW(model.parameters(), lr=LM_LR)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    dataloader = DataLoader(dataset, batch_size=args.batch, shuffle=True, drop_last=True, num_workers=args.num_workers)
    model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)

    model.train()
    step_times, cpu_times = [], []
    profiled = bool(os.environ.get("RUNJOB_BENCH_PROFILE"))  # --profile: the same window as runjob's
    if profiled:
        sys.path.insert(0, args.plugin_root)
        import runjob_bench_timer
    for batch in dataloader:
        if lm:  # (B, T + 1) tokens: predict each next one
            outputs = model(batch[:, :-1])
            loss = F.cross_entropy(outputs.flatten(0, 1), batch[:, 1:].flatten())
        else:
            inputs, targets = batch
            loss = F.cross_entropy(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        step_times.append(time.perf_counter())
        cpu_times.append(time.process_time())
        if profiled:
            runjob_bench_timer.profile_window(len(step_times))
        if len(step_times) >= total:
            break
    return {"step_times": step_times, "cpu_times": cpu_times}


def worker_lightning(args: argparse.Namespace) -> dict:
    # PyTorch Lightning's Trainer on the same model and data (only where lightning is importable).
    import lightning as L
    import torch
    import torch.nn.functional as F
    import torchvision
    from torch.utils.data import DataLoader

    L.seed_everything(SEED)
    total = args.warmup + args.steps
    dataset = bench_dataset(args, total)
    step_times: list[float] = []
    cpu_times: list[float] = []

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = torchvision.models.resnet18(num_classes=10)

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            return F.cross_entropy(self.model(inputs), targets)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            step_times.append(time.perf_counter())
            cpu_times.append(time.process_time())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)

    loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, drop_last=True, num_workers=args.num_workers)
    trainer = L.Trainer(
        max_steps=total,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), loader)
    return {"step_times": step_times, "cpu_times": cpu_times}


WORKERS = {"runjob": worker_runjob, "accelerate": worker_accelerate, "lightning": worker_lightning}
BASE = "runjob@base"  # runjob's worker under --baseline-python


# ---------------------------------------------------------------- driver


def make_png_folder(root: Path, image_size: int, needed: int) -> Path:
    """Digits as PNGs (runjob's own export), the training images repeated by hard links to ``needed``."""
    from runjob_builtins.digits import export_image_folder

    source = root / "digits-export"
    export_image_folder(source, image_size=image_size)
    folder = root / "digits-png"
    originals = sorted((source / "train").rglob("*.png"))
    count, copy = 0, 0
    while count < needed:
        for png in originals:
            target = folder / "train" / png.parent.name / f"r{copy:03d}_{png.name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(png, target)
            count += 1
        copy += 1
    for digit in sorted((source / "val").iterdir()):  # a small validation split: it runs after the timed steps
        (folder / "val" / digit.name).mkdir(parents=True, exist_ok=True)
        for png in sorted(digit.glob("*.png"))[:2]:
            os.link(png, folder / "val" / digit.name / png.name)
    return folder


def profile(args, contestants, input_path, work, plugin_root, png_root, env) -> int:
    """cProfile of the timed steps of one run of each loop: own time by function, and the totals."""
    import pstats

    for contestant in contestants:
        path = work / f"{contestant}.prof"
        command = worker_command(args, contestant, input_path, plugin_root, work, png_root)
        common.run_worker(
            command,
            env={**env, "RUNJOB_BENCH_PROFILE": f"{args.warmup}:{args.warmup + args.steps}:{path}"},
            python=contestant_python(args, contestant),
        )
        stats = pstats.Stats(str(path))
        print(
            f"\n{contestant} ({input_path}): {args.steps} steps, {stats.total_tt:.2f} s profiled, "
            f"{1000 * stats.total_tt / args.steps:.1f} ms a step"
        )
        stats.sort_stats("tottime").print_stats(12)
        print(f"{contestant}: runjob's and Accelerate's own functions in that window, by cumulative time")
        stats.sort_stats("cumulative").print_stats(r"runjob|core/|plugins/|accelerate/", 15)
    return 0


def worker_command(
    args: argparse.Namespace, contestant: str, input_path: str, plugin_root: Path, work: Path, png_root: Path | None
) -> list[str]:
    """This script as one repetition's worker: ``contestant`` on ``input_path`` with the run's settings."""
    settings = {"--steps": args.steps, "--warmup": args.warmup, "--batch": args.batch}
    settings |= {"--image-size": args.image_size, "--num-workers": args.num_workers}
    worker = "runjob" if contestant == BASE else contestant
    command = [str(Path(__file__).resolve()), "--worker", worker, "--input", input_path]
    command += [part for flag, value in settings.items() for part in (flag, str(value))]
    command += ["--plugin-root", str(plugin_root), "--work", str(work)]
    return command + (["--png-root", str(png_root)] if png_root else [])


def contestant_python(args: argparse.Namespace, contestant: str) -> str | None:
    """The interpreter a contestant's worker runs with: --baseline-python for runjob@base, else this one."""
    return args.baseline_python if contestant == BASE else None


def round_order(contestants: list[str], rep: int) -> list[str]:
    """Serpentine: forwards in even rounds, backwards in odd ones."""
    return contestants if rep % 2 == 0 else contestants[::-1]


def print_comparisons(comparisons: dict[str, dict]) -> None:
    for key, entry in comparisons.items():
        print(f"{key}  (ms/step: above 1 = the first is slower)")
        for metric, label in (("cpu_ms_per_step", "CPU time per step"), ("wall_ms_per_step", "wall time per step")):
            r = entry[metric]
            if r["rounds"] < 2:
                print(f"  {label:<19} {r['paired']:.3f} (1 round: no interval)")
                continue
            print(
                f"  {label:<19} {r['paired']:.3f} (95% CI {r['low']:.3f}-{r['high']:.3f}, {r['rounds']} rounds: "
                f"geometric mean of the per-round ratios, t interval); ratio of medians {r['ratio_of_medians']:.3f} "
                f"(bootstrap 95% CI {r['boot_low']:.3f}-{r['boot_high']:.3f})"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_repetition_arguments(parser, "contestant")
    parser.add_argument("--image-size", type=int, default=16, help="16 or 32 (ResNet-18 with its ImageNet stem)")
    parser.add_argument(
        "--num-workers", type=int, default=0, help="DataLoader workers on both sides (runjob's default is 0)"
    )
    parser.add_argument(
        "--inputs",
        default="tensor,png",
        help="comma-separated: tensor, png, lm (the gpt job's model and data; samples/s x 128 = tokens/s)",
    )
    parser.add_argument(
        "--lightning", action="store_true", help="also PyTorch Lightning's Trainer (needs lightning importable)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead: one run of each loop (first input path) under cProfile over the "
        "timed steps; prints the functions with the most own time",
    )
    parser.add_argument(
        "--baseline-python",
        metavar="PATH",
        help="also 'runjob@base': runjob's worker run by this interpreter (another checkout's venv), interleaved",
    )
    parser.add_argument("--json", type=Path, help="where to write the raw numbers (default benchmarks/overhead.json)")
    parser.add_argument(
        "--add-to",
        type=Path,
        metavar="JSON",
        help="more rounds for an earlier run: start from that run's raw numbers (same settings and contestants, "
        "checked) and report on all the rounds",
    )
    # worker mode
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--input", choices=["tensor", "png", "lm"], help=argparse.SUPPRESS)
    parser.add_argument("--png-root", help=argparse.SUPPRESS)
    parser.add_argument("--plugin-root", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        common.emit(WORKERS[args.worker](args))
        return 0

    info = common.machine()
    common.print_machine(info)
    for flag, why in (
        ("baseline_python", args.baseline_python and common.peer_missing(BASE, executable=args.baseline_python)),
        ("lightning", args.lightning and common.peer_missing("lightning", module="lightning")),
    ):
        if why:
            print(why)
            setattr(args, flag, None if flag == "baseline_python" else False)
    contestants = ([BASE] if args.baseline_python else []) + ["runjob", "accelerate"]
    contestants += ["lightning"] if args.lightning else []
    inputs = [i.strip() for i in args.inputs.split(",") if i.strip()]
    fields = ("samples_per_s", "wall_ms_per_step", "cpu_ms_per_step", "median_step_ms", "median_cpu_step_ms", "load")
    results: dict[str, dict[str, list]] = {f"{c}/{i}": {f: [] for f in fields} for i in inputs for c in contestants}
    imported: dict[str, str] = {}
    earlier, done = [], 0  # --add-to: the earlier sessions' machine records, and their rounds
    if args.add_to:
        previous = json.loads(args.add_to.read_text(encoding="utf-8"))
        same = ("steps", "warmup", "batch", "image_size", "threads", "num_workers", "baseline_python")
        differ = [k for k in same if previous["settings"].get(k) != getattr(args, k)]
        if differ or set(previous["raw"]) != set(results):
            raise SystemExit(
                f"--add-to {args.add_to}: other settings ({differ}) or contestants ({list(previous['raw'])})"
            )
        results = {key: {f: list(previous["raw"][key][f]) for f in fields} for key in results}
        earlier = [
            *previous["machine"].get("earlier", []),
            {k: v for k, v in previous["machine"].items() if k != "earlier"},
        ]
        done = previous["settings"]["reps"]
        print(f"adding {args.reps} rounds to the {done} of {args.add_to}")
    total_reps = done + args.reps
    with tempfile.TemporaryDirectory(prefix="runjob-bench-overhead-") as tmp:
        work = Path(tmp)
        plugin_root = common.make_timer_plugin(work / "plugin")
        png_root = (
            make_png_folder(work, args.image_size, (args.warmup + args.steps + 1) * args.batch)
            if "png" in inputs
            else None
        )
        env = {
            **os.environ,
            "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
            "PYTHONUNBUFFERED": "1",
            **common.thread_env(args.threads),
        }
        if args.profile:
            return profile(args, contestants, inputs[0], work, plugin_root, png_root, env)
        for rep in range(done, total_reps):
            for input_path in inputs:
                for contestant in round_order(contestants, rep):
                    command = worker_command(args, contestant, input_path, plugin_root, work, png_root)
                    load = common.load_now()
                    answer = common.run_worker(command, env=env, python=contestant_python(args, contestant))
                    rate = common.steady_rate(answer["step_times"], args.warmup, args.batch)
                    rate |= common.steady_cpu(answer["cpu_times"], args.warmup)
                    rate["wall_ms_per_step"] = 1000 * args.batch / rate["samples_per_s"]
                    key = f"{contestant}/{input_path}"
                    for field in fields[:-1]:
                        results[key][field].append(rate[field])
                    results[key]["load"].append(load)
                    if "runjob_file" in answer and contestant not in imported:
                        imported[contestant] = answer["runjob_file"]
                        print(f"{contestant}: {answer['python']} imports runjob from {answer['runjob_file']}")
                    print(
                        f"rep {rep + 1}/{total_reps}  {key:<18} {rate['samples_per_s']:7.1f} samples/s  "
                        f"wall {rate['wall_ms_per_step']:6.1f} ms/step (median {rate['median_step_ms']:6.1f})  "
                        f"CPU {rate['cpu_ms_per_step']:6.1f} ms/step (median {rate['median_cpu_step_ms']:6.1f})  "
                        f"load {load}  ({answer['process_wall_s']:.0f} s in all)",
                        flush=True,
                    )
        if BASE in imported and imported[BASE] == imported.get("runjob"):
            print(f"note: {BASE} imported the same runjob as runjob ({imported[BASE]}): an A/A comparison")

    rows, summary, comparisons = [], {}, {}
    for input_path in inputs:
        base = results[f"accelerate/{input_path}"]["samples_per_s"]
        for contestant in contestants:
            got = results[f"{contestant}/{input_path}"]
            rates = got["samples_per_s"]
            paired = [r / b for r, b in zip(rates, base, strict=True)]
            entry = {
                "median_samples_per_s": common.median(rates),
                "median_wall_ms_per_step": common.median(got["wall_ms_per_step"]),
                "median_cpu_ms_per_step": common.median(got["cpu_ms_per_step"]),
                "median_step_ms": common.median(got["median_step_ms"]),
                "median_cpu_step_ms": common.median(got["median_cpu_step_ms"]),
                "ratio_of_medians": common.median(rates) / common.median(base),
                "median_of_paired_ratios": common.median(paired),
                "min_paired_ratio": min(paired),
                "max_paired_ratio": max(paired),
            }
            summary[f"{contestant}/{input_path}"] = entry
            rows.append(
                [
                    f"{contestant} ({input_path})",
                    entry["median_samples_per_s"],
                    entry["median_wall_ms_per_step"],
                    entry["median_cpu_ms_per_step"],
                    entry["median_step_ms"],
                    entry["median_cpu_step_ms"],
                    entry["ratio_of_medians"],
                    f"{min(paired):.3f}-{max(paired):.3f}",
                ]
            )
        pairs = [("runjob", BASE), ("runjob", "accelerate"), (BASE, "accelerate"), ("runjob", "lightning")]
        for first, second in pairs:
            if first in contestants and second in contestants:
                a, b = results[f"{first}/{input_path}"], results[f"{second}/{input_path}"]
                comparisons[f"{first} / {second} ({input_path})"] = {
                    metric: common.paired_ratio(a[metric], b[metric])
                    for metric in ("cpu_ms_per_step", "wall_ms_per_step")
                }
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print()
    print(
        ("gpt (4 layers, width 128, context 128) on the stdlib's bytes" if inputs == ["lm"] else "")
        + (f"ResNet-18 (ImageNet stem), {args.image_size}x{args.image_size} inputs" if inputs != ["lm"] else "")
        + f", batch {args.batch}, fp32, CPU, "
        f"{args.threads or 'default'} torch thread(s); "
        f"{args.steps} timed steps after {args.warmup} warm-up, {total_reps} interleaved repetitions; load at end "
        f"{info['load_avg_end']}"
    )
    print(
        common.table(
            rows,
            [
                "loop (input)",
                "samples/s",
                "wall ms/step",
                "CPU ms/step",
                "median step ms",
                "median step CPU ms",
                "samples/s vs hand-written",
                "paired range",
            ],
        )
    )
    print("(medians over the repetitions; ms/step = the timed window's time / its steps)")
    print()
    print_comparisons(comparisons)
    settings = {
        k: getattr(args, k)
        for k in ("steps", "warmup", "reps", "batch", "image_size", "threads", "num_workers", "baseline_python")
    }
    settings["reps"] = total_reps
    settings["runjob_imported_from"] = imported
    if earlier:
        info["earlier"] = earlier
    settings.update(
        model="torchvision resnet18, num_classes=10, ImageNet stem (no cifar_stem)",
        precision="fp32",
        optimizer=f"SGD lr {LR} momentum {MOMENTUM}",
    )
    path = common.write_json(
        "overhead",
        {"machine": info, "settings": settings, "raw": results, "summary": summary, "comparisons": comparisons},
        args.json,
    )
    print(f"raw numbers: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
