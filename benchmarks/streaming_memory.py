"""Streaming memory (issue 33): a data set several times larger than the stream cache, and larger than
the memory the training run's processes take, streamed for one training epoch from an S3 server on
this machine, the cache folder and the run's process tree watched all along.

The data: random-noise RGB images (``--size`` x ``--size``, incompressible) written as PNG with numpy
and PIL, as many as make ``--gigabytes`` (2 classes; ``--val`` of them in val/, the rest in train/),
converted with ``runjob data convert`` (in this process, 2 writer workers, ``--chunk-bytes``) to moto's
S3 server, started here on 127.0.0.1 (``streaming_speed.s3_server``: a free port, fake credentials,
stopped at the end).

The run: a process of its own (like streaming_speed.py's timed runs) streams one epoch of the train
split with the ``streamed_images`` dataset (``--image-size``: decoding stays cheap, while every file is
downloaded and cached whole), ``--cache-limit``, a fresh cache folder, runjob's ``StreamLoader``
(shuffled, ``--workers`` loader workers, batch ``--batch``) and one SGD step of a linear classifier on
each batch; ``--workers 2 0`` makes one run for each count, in turn, on the same conversion. This
process samples, every ``--interval`` seconds from the run's start to its end, the bytes under the
cache folder and the resident memory (RSS) of the run's process tree: the process and all its
descendants (the loader workers, forked each epoch), summed at each sample (pages the workers share
with the process they were forked from count once in each: an upper bound), and every second the
tree's proportional set size (PSS: shared pages split between their sharers). The run itself reports
its samples, wall and CPU seconds and ``getrusage``'s peak RSS of itself and of its largest loader worker.

Checks, for each run (exit 1 when one fails): the run finished, every training sample read once, the
cache's peak at most ``--cache-limit``, the data set larger than the process tree's peak RSS. A run
that fails is reported with its last line and the peaks until then. Everything written goes in a
temporary folder, deleted at the end.

Found with it (RESULTS.md, section 18): with loader workers, the reader that ``StreamLoader`` opens in
the training process to read the first sample (``first_samples``) keeps downloading, fills LitData's
share of the cache and keeps it; the workers then wait for room, and the epoch stops after LitData's
120 s wait for a chunk. ``--workers 0`` does not read that sample.

    uv run --locked python benchmarks/streaming_memory.py --json /tmp/streaming_memory.json
    uv run --locked python benchmarks/streaming_memory.py --gigabytes 0.1 --chunk-bytes 2MB --cache-limit 40MB
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from streaming_speed import BUCKET, SEED, cpu_seconds, preload, s3_server, uptime  # noqa: E402

PREFIX = "noise"
CLASSES = 2


def tree_bytes(folder: Path) -> int:
    """The bytes of the files under ``folder`` now; a file deleted between listing and looking counts 0."""
    total, pending = 0, [str(folder)]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except FileNotFoundError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                else:
                    total += entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                pass
    return total


def write_noise_images(root: Path, gigabytes: float, size: int, val: int) -> dict[str, Any]:
    """Random RGB images as PNG under ``root/{train,val}/{0,1}/``, enough for ``gigabytes`` (judged by
    the first file's size: noise leaves every file the same size, give or take a few bytes)."""
    # lazy: only the parent writes the data
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(SEED)
    count, written, files = 0, 0, {"train": 0, "val": 0}
    total = None
    while total is None or count < total:
        split = "val" if count < val else "train"
        folder = root / split / str(count % CLASSES)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{count:06d}.png"
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path, compress_level=0)  # noise does not compress: store it, the fastest
        written += path.stat().st_size
        files[split] += 1
        count += 1
        if total is None:
            total = max(val + 1, math.ceil(gigabytes * 1e9 / written))
    return {"images": count, "bytes": written, "files": files, "train_bytes": tree_bytes(root / "train")}


def convert(images: Path, work: Path, chunk_bytes: str) -> float:
    """``runjob data convert`` of the images to the S3 server (2 writer workers); its seconds."""
    # lazy: the run's process never converts
    from runjob.commands.cli import main

    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = str(work / "staging")  # this conversion's own staging
    started = time.perf_counter()
    location = f"s3://{BUCKET}/{PREFIX}"
    if main(["data", "convert", str(images), location, "--chunk-bytes", chunk_bytes, "--workers", "2"]) != 0:
        raise RuntimeError(f"runjob data convert to {location} failed")
    return time.perf_counter() - started


def stored_objects(split: str) -> list[int]:
    """The sizes of the split's chunk files on the S3 server."""
    # lazy: boto3 is for the parent's look at the bucket; the environment points it at the server
    import boto3

    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{PREFIX}/{split}/")
    return [item["Size"] for page in pages for item in page.get("Contents", []) if item["Key"].endswith(".bin")]


def train_epoch(args: argparse.Namespace) -> dict[str, Any]:
    """One epoch of the train split, streamed, with a linear classifier's SGD step on each batch."""
    # lazy: the run's process only (its modules are imported before the clock by preload())
    import torch

    # lazy: the same (runjob's loader and the dataset)
    from runjob.record.prediction import collate
    from runjob.train.streaming import StreamLoader
    from runjob_builtins.streamed import StreamedImagesOptions, build_streamed_images

    torch.manual_seed(SEED)
    started, (main_cpu, workers_cpu) = time.perf_counter(), cpu_seconds()
    options = StreamedImagesOptions(
        location=f"s3://{BUCKET}/{PREFIX}",
        image_size=args.image_size,
        cache_dir=str(args.cache),
        cache_limit=args.cache_limit,
    )
    splits = build_streamed_images(options)
    one_process = SimpleNamespace(num_processes=1, process_index=0, device=torch.device("cpu"))
    loader = StreamLoader(
        splits.train,
        one_process,
        seed=SEED,
        batch_size=args.batch,
        training=True,
        drop_last=False,
        num_workers=args.workers,
        collate=collate,
    )
    model = torch.nn.Linear(3 * args.image_size * args.image_size, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader.set_epoch(0)
    samples, batches, first, loss = 0, 0, 0.0, float("nan")
    for inputs, labels in loader:
        optimizer.zero_grad()
        step_loss = torch.nn.functional.cross_entropy(model(inputs.flatten(1)), labels)
        step_loss.backward()
        optimizer.step()
        samples, batches, loss = samples + len(inputs), batches + 1, float(step_loss.detach())
        first = first or time.perf_counter() - started
    wall = time.perf_counter() - started
    main_after, workers_after = cpu_seconds()
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "samples": samples,
        "batches": batches,
        "last_loss": loss,
        "wall_s": wall,
        "cpu_s": main_after - main_cpu + workers_after - workers_cpu,
        "main_cpu_s": main_after - main_cpu,
        "workers_cpu_s": workers_after - workers_cpu,
        "first_batch_s": first,
        "samples_per_s": samples / wall,
        "main_maxrss_bytes": own.ru_maxrss * 1024,  # Linux: KiB
        "largest_worker_maxrss_bytes": children.ru_maxrss * 1024,
    }


def worker(args: argparse.Namespace) -> int:
    """The run's process (``--run``): its numbers on the last line."""
    preload()
    common.emit(train_epoch(args))
    return 0


def watch(run: subprocess.Popen[bytes], cache: Path, server_pid: int, interval: float) -> dict[str, Any]:
    """Sample the cache folder's bytes and the RSS of ``run``'s process tree every ``interval`` s (PSS
    every second) until it exits; the peaks and the samples (seconds, cache bytes, main RSS, workers' RSS)."""
    import psutil  # lazy: the run's process never watches

    main, server = psutil.Process(run.pid), psutil.Process(server_pid)
    peak: dict[str, int] = dict.fromkeys(("cache", "tree_rss", "main_rss", "workers_rss", "worker_rss"), 0)
    peak |= {"tree_pss": 0, "server_rss": 0, "most_workers": 0}
    series: list[tuple[float, int, int, int]] = []
    started, next_pss = time.perf_counter(), 0.0
    while run.poll() is None:
        now = time.perf_counter() - started
        try:
            children = main.children(recursive=True)
            main_rss = main.memory_info().rss
        except psutil.NoSuchProcess:
            break
        worker_rss = []
        for child in children:
            try:
                worker_rss.append(child.memory_info().rss)
            except psutil.NoSuchProcess:
                pass
        if now >= next_pss:
            pss = 0
            for process in [main, *children]:
                try:
                    pss += process.memory_full_info().pss
                except psutil.NoSuchProcess:
                    pass
            peak["tree_pss"], next_pss = max(peak["tree_pss"], pss), now + 1.0
        cache_now = tree_bytes(cache)
        series.append((round(now, 3), cache_now, main_rss, sum(worker_rss)))
        for key, value in (
            ("cache", cache_now),
            ("tree_rss", main_rss + sum(worker_rss)),
            ("main_rss", main_rss),
            ("workers_rss", sum(worker_rss)),
            ("worker_rss", max(worker_rss, default=0)),
            ("most_workers", len(worker_rss)),
            ("server_rss", server.memory_info().rss),
        ):
            peak[key] = max(peak[key], value)
        time.sleep(max(0.0, interval - (time.perf_counter() - started - now)))
    return {"peaks": peak, "samples_taken": len(series), "series": series}


def run_and_watch(args: argparse.Namespace, workers: int, work: Path, server_pid: int) -> dict[str, Any]:
    """The run's process with ``workers`` loader workers and a fresh cache folder, watched: its numbers
    and the watch's; ``error`` holds the last line of its output when it failed."""
    cache = Path(tempfile.mkdtemp(dir=work, prefix=f"cache-{workers}-"))
    command = [sys.executable, __file__, "--run", "--cache", str(cache)]
    command += ["--image-size", str(args.image_size), "--cache-limit", args.cache_limit]
    command += ["--workers", str(workers), "--batch", str(args.batch)]
    log = work / f"run-{workers}.log"
    started = time.perf_counter()
    with log.open("wb") as out:
        run = subprocess.Popen(
            command,
            cwd=common.REPO,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **common.thread_env(args.threads)},
        )
        try:
            watched = watch(run, cache, server_pid, args.interval)
            run.wait(timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    text = log.read_text(encoding="utf-8", errors="replace")
    lines = [line for line in text.splitlines() if line.startswith(common.RESULT_MARK)]
    result: dict[str, Any] = {"workers": workers, "exit": run.returncode}
    if run.returncode == 0 and lines:
        result |= json.loads(lines[-1][len(common.RESULT_MARK) :])
    else:
        result["error"] = ([line for line in text.splitlines() if line.strip()] or ["(no output)"])[-1]
        print("\n".join(text.splitlines()[-15:]), flush=True)
    result["process_wall_s"] = time.perf_counter() - started
    shutil.rmtree(cache)
    return result | watched


def megabytes(value: float) -> str:
    return f"{value / 1e6:,.1f} MB"


def run_rows(run: dict[str, Any], data: dict[str, Any], limit: int) -> list[str]:
    """One run's column of the table."""
    peaks, ok = run["peaks"], "error" not in run
    missing = "-"
    return [
        "finished" if ok else f"failed after {run['process_wall_s']:.0f} s (exit {run['exit']})",
        f"{megabytes(peaks['cache'])} ({peaks['cache'] / limit:.2f} of the limit)",
        megabytes(peaks["tree_rss"]),
        f"{megabytes(peaks['main_rss'])}" + (f" (getrusage {megabytes(run['main_maxrss_bytes'])})" if ok else ""),
        f"{megabytes(peaks['workers_rss'])} ({peaks['most_workers']} at most at once)",
        f"{megabytes(peaks['worker_rss'])}"
        + (f" (getrusage {megabytes(run['largest_worker_maxrss_bytes'])})" if ok and run["workers"] else ""),
        megabytes(peaks["tree_pss"]),
        f"{data['bytes'] / peaks['tree_rss']:.2f}x" if peaks["tree_rss"] else missing,
        f"{run['samples']:,} / {data['files']['train']:,}" if ok else f"- / {data['files']['train']:,}",
        f"{run['samples_per_s']:.1f}" if ok else missing,
        f"{run['wall_s']:.1f} ({run['process_wall_s']:.1f})" if ok else f"- ({run['process_wall_s']:.1f})",
        f"{run['cpu_s']:.1f} ({run['main_cpu_s']:.1f} + {run['workers_cpu_s']:.1f})" if ok else missing,
        f"{run['first_batch_s']:.1f}" if ok else missing,
        megabytes(peaks["server_rss"]),
        f"{run['samples_taken']:,}",
    ]


ROW_NAMES = [
    "result",
    "cache folder's peak",
    "process tree's peak RSS",
    "  the run's process (main)",
    "  its loader workers together",
    "  the largest loader worker",
    "process tree's peak PSS (every 1 s)",
    "data set / tree's peak RSS",
    "samples read / train split",
    "samples/s (build, workers' start included)",
    "wall s (process, imports included)",
    "CPU s (main + workers)",
    "first batch s",
    "S3 server's peak RSS (not in the tree)",
    "samples of cache and memory taken",
]


def report(info: dict[str, Any], runs: list[dict[str, Any]], limit: int) -> list[str]:
    """The table of the runs, and the checks that fail."""
    data = info["data"]
    print(
        f"\ndata set: {megabytes(data['bytes'])} of PNG ({data['images']:,} noise images {info['size']}; train "
        f"{data['files']['train']:,}, val {data['files']['val']:,}); train split on S3: "
        f"{megabytes(sum(info['train_chunks']))} in {len(info['train_chunks'])} chunks; cache limit "
        f"{info['cache_limit']} ({megabytes(limit)}): the data set is {data['bytes'] / limit:.1f}x the limit; "
        f"sampled every {info['interval']:g} s"
    )
    columns = [run_rows(run, data, limit) for run in runs]
    rows = [[name, *(column[i] for column in columns)] for i, name in enumerate(ROW_NAMES)]
    print(common.table(rows, ["", *(f"{run['workers']} loader workers" for run in runs)]))
    failed = []
    for run in runs:
        peaks, name = run["peaks"], f"{run['workers']} loader workers"
        if "error" in run:
            failed.append(f"{name}: the run failed: {run['error']}")
        elif run["samples"] != data["files"]["train"]:
            failed.append(
                f"{name}: the epoch read {run['samples']} samples, the train split holds {data['files']['train']}"
            )
        if not 0 < peaks["cache"] <= limit:
            failed.append(f"{name}: the cache folder's peak {peaks['cache']} bytes is not within (0, {limit}]")
        if not data["bytes"] > peaks["tree_rss"]:
            failed.append(
                f"{name}: the data set ({data['bytes']} bytes) is not above the tree's peak RSS ({peaks['tree_rss']})"
            )
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gigabytes", type=float, default=3.0, help="the data set's size in GB (1e9 bytes)")
    parser.add_argument("--size", type=int, default=512, help="the images' side in pixels (512: ~0.79 MB a PNG)")
    parser.add_argument("--val", type=int, default=32, help="images in val/ (the rest in train/)")
    parser.add_argument("--chunk-bytes", default="8MB", help="runjob data convert's --chunk-bytes")
    parser.add_argument("--cache-limit", default="200MB", help="the streamed dataset's cache_limit")
    parser.add_argument("--image-size", type=int, default=64, help="the side images are resized to for training")
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="loader workers: one run for each, in turn")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (0: torch's default)")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between samples of cache and memory")
    parser.add_argument("--json", type=Path, help="where to write the raw numbers (default: not written)")
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)  # the run's process
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        args.workers = args.workers[0]
        return worker(args)

    from runjob.host.streams import parse_size  # lazy: the run's process imports it with the dataset

    limit = parse_size(args.cache_limit)
    info = common.machine() | {"cache_limit": args.cache_limit, "interval": args.interval}
    info["size"] = f"{args.size}x{args.size}"
    common.print_machine(info)
    print(f"uptime before: {uptime()}", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="runjob-bench-streaming-memory-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        info["data"] = write_noise_images(work / "images", args.gigabytes, args.size, args.val)
        info["write_s"] = time.perf_counter() - started
        print(
            f"wrote {info['data']['images']:,} images, {megabytes(info['data']['bytes'])}, in {info['write_s']:.1f} s",
            flush=True,
        )
        with s3_server(work / "moto.log") as server:
            info["convert_s"] = convert(work / "images", work, args.chunk_bytes)
            info["train_chunks"], info["val_chunks"] = stored_objects("train"), stored_objects("val")
            print(
                f"converted in {info['convert_s']:.1f} s: train {len(info['train_chunks'])} chunks, "
                f"{megabytes(sum(info['train_chunks']))}; uptime {uptime()}",
                flush=True,
            )
            for workers in args.workers:
                load = [round(x, 2) for x in os.getloadavg()]
                when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                runs.append(run_and_watch(args, workers, work, server.pid) | {"started": when, "load_avg_start": load})
                print(
                    f"{workers} loader workers: {'finished' if 'error' not in runs[-1] else 'FAILED'} in "
                    f"{runs[-1]['process_wall_s']:.1f} s (started {when}, load {load}); uptime {uptime()}",
                    flush=True,
                )
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    failed = report(info, runs, limit)
    if args.json:
        data = {"machine": info, "settings": vars(args) | {"json": str(args.json)}, "runs": runs}
        print(f"raw numbers: {common.write_json('streaming_memory', data, args.json)}")
    for problem in failed:
        print(f"FAILED: {problem}")
    print("checks: " + ("FAILED" if failed else "every sample read; cache under its limit; data set > tree's peak RSS"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
