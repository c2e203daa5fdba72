"""Streaming speed (issue 33): one epoch of images streamed from an S3 server on this machine against
the same images read from a local image folder.

The data: scikit-learn's digits exported as 32x32 PNG (``export_image_folder``), each file copied
``--copies`` times under new names (10: 17,970 images, 14,380 of them in train/), converted with
``runjob data convert`` (in this process, 2 writer workers, ``--chunk-bytes`` auto: its default) to
moto's S3 server, started here on 127.0.0.1 (a free port, fake credentials, stopped at the end),
and to a local folder of shards. Contestants, each one epoch of the train split, shuffled, batch
``--batch``, ``--workers`` loader workers, the same transform (RGB, resize 32, ToTensor, Normalize
with ImageNet's mean and std) and runjob's collate:

* ``folder``: the ``imagefolder`` dataset (torchvision ``ImageFolder``) and a torch ``DataLoader``,
  as runjob's training loop builds them;
* ``s3``: the ``streamed_images`` dataset on the ``s3://`` location and runjob's ``StreamLoader``,
  with a fresh (cold) cache folder each time;
* ``shards``: the same on the local folder of shards (a fresh cache folder too).

Each run is a process of its own, rounds interleaved (folder s3 shards, folder s3 shards, ...);
torch, torchvision, PIL, LitData and boto3 are imported before the clock starts. Timed: from
building the dataset (listing the folder, reading the conversion's ``runjob.json``) and its loader,
the workers' start included, to the epoch's last batch, wall and CPU seconds of the process and its
loader workers (``getrusage`` of itself and of its waited-for children), and the S3 server's CPU
seconds over the run. The ratios to folder's samples/s and CPU seconds are paired by round
(geometric mean, 95% t interval).
``--profile`` adds one in-process epoch of each with 0 loader workers under cProfile.

    uv run --locked python benchmarks/streaming_speed.py --repeats 5
    uv run --locked python benchmarks/streaming_speed.py --repeats 1 --profile --json /tmp/streaming_speed.json
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

CONTESTANTS = ("folder", "s3", "shards")
BUCKET = "bench"
SEED = 0
COLUMNS = ("wall_s", "cpu_s", "main_cpu_s", "first_batch_s", "server_cpu_s")


def cpu_seconds() -> tuple[float, float]:
    """User + system CPU seconds of this process, and of its children that have exited and been waited
    for (the loader workers, once an epoch ends)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def make_loader(name: str, work: Path, cache: Path, batch: int, workers: int) -> Any:
    """The contestant's training loader, as runjob's training loop builds it."""
    # lazy: a timed run's process imports these before its clock starts (worker()); the parent needs none
    import torch

    from runjob.record.prediction import collate

    if name == "folder":
        from runjob_builtins.image_datasets import ImageFolderOptions, build_imagefolder

        splits = build_imagefolder(ImageFolderOptions(root=str(work / "images"), image_size=32))
        return torch.utils.data.DataLoader(
            splits.train,
            batch_size=batch,
            shuffle=True,
            num_workers=workers,
            collate_fn=collate,
            generator=torch.Generator().manual_seed(SEED),
        )
    from runjob.train.streaming import StreamLoader
    from runjob_builtins.streamed import StreamedImagesOptions, build_streamed_images

    location = f"s3://{BUCKET}/digits" if name == "s3" else str(work / "shards")
    splits = build_streamed_images(StreamedImagesOptions(location=location, image_size=32, cache_dir=str(cache)))
    one_process = SimpleNamespace(num_processes=1, process_index=0, device=torch.device("cpu"))
    return StreamLoader(
        splits.train,
        one_process,
        seed=SEED,
        batch_size=batch,
        training=True,
        drop_last=False,
        num_workers=workers,
        collate=collate,
    )


def one_epoch(name: str, work: Path, cache: Path, batch: int, workers: int) -> dict[str, float]:
    """Build the loader and read one epoch: samples, wall and CPU seconds, seconds to the first batch."""
    started, (main_cpu, workers_cpu) = time.perf_counter(), cpu_seconds()
    loader = make_loader(name, work, cache, batch, workers)
    built = time.perf_counter() - started
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(0)
    samples, first = 0, 0.0
    for inputs, _ in loader:
        samples += len(inputs)
        first = first or time.perf_counter() - started
    wall = time.perf_counter() - started
    main_after, workers_after = cpu_seconds()
    return {
        "samples": samples,
        "wall_s": wall,
        "cpu_s": main_after - main_cpu + workers_after - workers_cpu,
        "main_cpu_s": main_after - main_cpu,
        "build_s": built,
        "first_batch_s": first,
        "samples_per_s": samples / wall,
    }


def preload() -> None:
    """The modules both kinds of loader use, imported before any clock starts."""
    # lazy: only the timed runs' processes and the profile need them
    import boto3  # noqa: F401
    import litdata  # noqa: F401
    import PIL.Image  # noqa: F401
    import torchvision.transforms  # noqa: F401

    import runjob.train.streaming  # noqa: F401


def worker(args: argparse.Namespace) -> int:
    """One timed epoch in this process (``--run NAME``): its numbers on the last line."""
    preload()
    common.emit(one_epoch(args.run, args.work, args.cache, args.batch, args.workers))
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def s3_server(log: Path):
    """moto's S3 server on 127.0.0.1, the AWS variables of this process pointed at it, a bucket made."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not start; its log: {log}") from None
                time.sleep(0.2)
        for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            os.environ.pop(name, None)
        os.environ.update(
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_EC2_METADATA_DISABLED="true",
            AWS_ENDPOINT_URL=endpoint,
            AWS_CONFIG_FILE=os.devnull,
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        )
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def make_data(work: Path, copies: int, chunk_bytes: str) -> dict[str, float]:
    """The image folder (digits x ``copies``) and its conversions to S3 and to a local folder."""
    from runjob.commands.cli import main
    from runjob_builtins.digits import export_image_folder

    images = work / "images"
    export_image_folder(images, image_size=32)
    for path in sorted(images.rglob("*.png")):
        for copy in range(1, copies):
            shutil.copyfile(path, path.with_name(f"{path.stem}-{copy}.png"))
    # LitData stages a remote conversion's chunks in $TMPDIR/chunks, shared by every conversion on the
    # machine: two at once take each other's files (RESULTS.md, streaming speed); this one stages its own
    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = str(work / "staging")
    seconds = {}
    for name, location in (("s3", f"s3://{BUCKET}/digits"), ("shards", str(work / "shards"))):
        started = time.perf_counter()
        if main(["data", "convert", str(images), location, "--chunk-bytes", chunk_bytes, "--workers", "2"]) != 0:
            raise RuntimeError(f"runjob data convert to {location} failed")
        seconds[name] = time.perf_counter() - started
    return seconds


def profile(work: Path, batch: int, top: int) -> None:
    """One epoch of folder and of s3 in this process with 0 loader workers, plain and then under
    cProfile: the cost of a sample, and where it goes."""
    preload()
    for name in CONTESTANTS[:2]:
        plain = one_epoch(name, work, Path(tempfile.mkdtemp(dir=work)), batch, 0)
        profiler = cProfile.Profile()
        profiler.enable()
        profiled = one_epoch(name, work, Path(tempfile.mkdtemp(dir=work)), batch, 0)
        profiler.disable()
        print(
            f"\nprofile {name}, 0 loader workers, {plain['samples']} samples: {plain['wall_s']:.2f} s, CPU "
            f"{plain['cpu_s']:.2f} s ({1e6 * plain['cpu_s'] / plain['samples']:.0f} us CPU a sample; building "
            f"{plain['build_s']:.2f} s, first batch at {plain['first_batch_s']:.2f} s); "
            f"under cProfile {profiled['wall_s']:.2f} s"
        )
        for order in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(top)
            print("\n".join(line for line in text.getvalue().splitlines()[4:] if line.strip()))


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def spread(values: list[float]) -> str:
    return f"{common.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def report(results: dict[str, list[dict[str, float]]], loads: list[float]) -> dict[str, Any]:
    """Each contestant's median (min-max), its samples/s and CPU seconds against folder's (paired by round)."""
    rows, ratios = [], {}
    base = results["folder"]
    for name, runs in results.items():
        rate = [r["samples_per_s"] for r in runs]
        row = [name, spread(rate)] + [spread([r[k] for r in runs]) for k in COLUMNS]
        if name != "folder":
            ratios[name] = {
                key: common.paired_ratio([r[key] for r in runs], [r[key] for r in base])
                for key in ("samples_per_s", "cpu_s")
            }
            for ratio in ratios[name].values():
                row.append(
                    f"{ratio['paired']:.3f} ({ratio['low']:.3f}-{ratio['high']:.3f}; "
                    f"{min(ratio['ratios']):.3f}-{max(ratio['ratios']):.3f})"
                )
        else:
            row += ["1", "1"]
        rows.append(row)
    print(f"\nmedian (min-max) of {len(base)} interleaved rounds; load average at each round's start {loads}")
    header = ["contestant", "samples/s", "wall s", "CPU s", "main's CPU s", "first batch s", "S3 server CPU s"]
    header += ["samples/s / folder's (95% CI; rounds)", "CPU s / folder's"]
    print(common.table(rows, header))
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--copies", type=int, default=10, help="copies of each digits image (10: 17,970 images)")
    parser.add_argument("--workers", type=int, default=2, help="loader workers")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--chunk-bytes", default="auto", help="runjob data convert's --chunk-bytes (its default: auto)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (0: torch's default)")
    parser.add_argument("--profile", action="store_true", help="then profile one epoch of folder and s3 in-process")
    parser.add_argument("--top", type=int, default=25, help="functions listed per profile")
    parser.add_argument("--json", type=Path, help="where to write the raw numbers (default: not written)")
    parser.add_argument("--run", choices=CONTESTANTS, help=argparse.SUPPRESS)  # a timed run's process
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        return worker(args)

    import psutil

    info = common.machine()
    common.print_machine(info)
    print(f"uptime before: {uptime()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="runjob-bench-streaming-") as tmp:
        work = Path(tmp)
        with s3_server(work / "moto.log") as server:
            info["convert_s"] = make_data(work, args.copies, args.chunk_bytes)
            chunks = sorted((work / "shards" / "train").glob("*.bin"))
            info["train_chunks"] = [path.stat().st_size for path in chunks]
            print(
                f"converted in {info['convert_s']['s3']:.1f} s (S3) and {info['convert_s']['shards']:.1f} s (folder); "
                f"train: {len(chunks)} chunks, {sum(info['train_chunks']) / 1e6:.1f} MB",
                flush=True,
            )
            env = {**os.environ, **common.thread_env(args.threads)}
            results: dict[str, list[dict[str, float]]] = {name: [] for name in CONTESTANTS}
            loads = []
            for rep in range(args.repeats):
                loads.append(common.load_now())
                for name in CONTESTANTS:
                    cache = Path(tempfile.mkdtemp(dir=work, prefix=f"cache-{name}-"))
                    served = sum(psutil.Process(server.pid).cpu_times()[:2])
                    command = [__file__, "--run", name, "--work", str(work), "--cache", str(cache)]
                    command += ["--batch", str(args.batch), "--workers", str(args.workers)]
                    result = common.run_worker(command, env=env)
                    result["server_cpu_s"] = sum(psutil.Process(server.pid).cpu_times()[:2]) - served
                    results[name].append(result)
                    shutil.rmtree(cache)
                print(
                    f"round {rep + 1}/{args.repeats} (load {loads[-1]}): "
                    + "  ".join(f"{n} {r[-1]['samples_per_s']:.0f}/s" for n, r in results.items()),
                    flush=True,
                )
            samples = {r["samples"] for runs in results.values() for r in runs}
            if samples != {len(list((work / "images" / "train").rglob("*.png")))}:
                raise RuntimeError(f"the epochs read {sorted(samples)} samples, not the train split's")
            ratios = report(results, loads)
            if args.profile:
                profile(work, args.batch, args.top)
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"\nuptime after: {uptime()}")
    if args.json:
        data = {"machine": info, "settings": vars(args) | {"json": str(args.json)}, "raw": results, "ratios": ratios}
        print(f"raw numbers: {common.write_json('streaming_speed', data, args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
