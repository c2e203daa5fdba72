"""Streamed datasets: shards converted by `runjob data convert`, read by LitData from a local folder or
moto's S3 server on 127.0.0.1; every sample once per epoch, exact positions, padding counted, a bounded
cache, one-line errors. The whole runs (several processes, SIGKILL) are tests/test_streaming_runs.py's."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("litdata")

MEAN_STD = ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])


@pytest.fixture(autouse=True)
def cache_here(tmp_path, monkeypatch):
    """Downloaded shards in the test's folder, never the user's ~/.cache."""
    monkeypatch.setenv("RUNJOB_CACHE_DIR", str(tmp_path / "stream-cache"))


def export_digits(folder: Path, image_size: int = 8) -> Path:
    from runjob_builtins.digits import export_image_folder

    export_image_folder(folder, image_size=image_size)
    return folder


def convert(source: Path, location: str, *extra: str) -> None:
    from runjob.commands.cli import main

    assert main(["data", "convert", str(source), location, "--chunk-bytes", "16KB", "--workers", "2", *extra]) == 0


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """The digits scans as an image folder (8x8 PNG files, 1,438 training and 359 validation)."""
    return export_digits(tmp_path_factory.mktemp("digits") / "images")


@pytest.fixture(scope="module")
def shards(tmp_path_factory, digits) -> Path:
    """``digits`` converted to a local folder of shards (16 KB chunks: many, for several workers)."""
    folder = tmp_path_factory.mktemp("shards") / "digits"
    convert(digits, str(folder))
    return folder


def row_hashes(inputs) -> list[str]:
    return [hashlib.sha1(row.contiguous().numpy().tobytes()).hexdigest() for row in inputs]


def expected_hashes(folder: Path, split: str = "train") -> Counter:
    """What each image of the folder's split is as a sample (the validation transform: no draws)."""
    from runjob_builtins.streamed import ImageRecords

    transform = ImageRecords(None, *MEAN_STD, flip=False)
    images = [transform({"image": path.read_bytes(), "label": 0}, None)[0] for path in (folder / split).rglob("*.png")]
    return Counter(row_hashes(images))


def streamed_split(location: str, split: str = "train", training: bool = True, **options):
    from runjob_builtins.streamed import StreamedImagesOptions, build_streamed_images

    dataset = build_streamed_images(
        StreamedImagesOptions(location=location, mean=MEAN_STD[0], std=MEAN_STD[1], **options)
    )
    return dataset.train if split == "train" else dataset.val


def one_process():
    import torch

    return SimpleNamespace(num_processes=1, process_index=0, device=torch.device("cpu"))


def loader(
    streamed, accelerator=None, *, workers: int = 2, batch_size: int = 64, training: bool = True, drop_last=False
):
    from runjob.record.prediction import collate
    from runjob.train.streaming import StreamLoader

    return StreamLoader(
        streamed,
        accelerator or one_process(),
        seed=3,
        batch_size=batch_size,
        training=training,
        drop_last=drop_last,
        num_workers=workers,
        collate=collate,
    )


def epoch_rows(stream, epoch: int, batches: int | None = None) -> list[list[str]]:
    """Each batch of ``epoch`` as the hashes of its rows (the first ``batches`` only, when given)."""
    stream.set_epoch(epoch)
    found = []
    for inputs, _ in stream:
        found.append([h for h, valid in zip(row_hashes(inputs), stream.valid.tolist(), strict=True) if valid])
        if batches is not None and len(found) == batches:
            break
    return found


@pytest.mark.slow
def test_every_sample_once_per_epoch_in_a_seeded_order_that_changes_with_the_epoch(shards, digits):
    stream = loader(streamed_split(str(shards)))
    first, second = epoch_rows(stream, 0), epoch_rows(stream, 1)
    for rows in (first, second):
        assert len(rows) == len(stream) == 23  # 1,438 samples in batches of 64, the last one short
        assert Counter(h for batch in rows for h in batch) == expected_hashes(digits)
    assert first != second  # shuffled anew each epoch
    assert epoch_rows(loader(streamed_split(str(shards))), 0) == first  # by the seed and the epoch
    # the order also depends on the number of loader workers (LitData splits a process's chunks among them)
    other = epoch_rows(loader(streamed_split(str(shards)), workers=1), 0)
    assert other != first and Counter(h for batch in other for h in batch) == expected_hashes(digits)


@pytest.mark.parametrize("workers_after", [2, pytest.param(1, marks=pytest.mark.slow)])
def test_a_position_taken_mid_epoch_gives_the_rest_of_that_epoch_exactly(shards, workers_after):
    """What a checkpoint holds: the position after 9 batches of the second epoch, JSON, taken back by a
    fresh loader (even with fewer workers): the rest is the uninterrupted epoch's, and the epoch after
    it too."""
    whole = loader(streamed_split(str(shards)))
    uninterrupted = epoch_rows(whole, 1)
    following = epoch_rows(whole, 2)

    first = loader(streamed_split(str(shards)))
    assert epoch_rows(first, 1, batches=9) == uninterrupted[:9]
    position = json.loads(json.dumps(first.position()))
    assert position["epoch"] == 1 and position["batches"] == 9

    again = loader(streamed_split(str(shards)), workers=workers_after)
    again.restore(position, "test")
    assert epoch_rows(again, 1) == uninterrupted[9:]
    if workers_after != 2:  # the next epoch's order is that of its number of workers
        following = epoch_rows(loader(streamed_split(str(shards)), workers=workers_after), 2)
    assert epoch_rows(again, 2) == following  # the next epoch starts afresh: no off-by-one


def test_a_position_of_another_data_set_seed_or_process_count_is_refused(shards):
    from runjob.errors import DataError

    position = loader(streamed_split(str(shards))).position()
    for key, value in (("seed", 4), ("processes", 2), ("digest", "0" * 64)):
        with pytest.raises(DataError, match=rf"{key} .* -> .*a streamed run resumes mid-epoch with the same"):
            loader(streamed_split(str(shards))).restore({**position, key: value}, "step-4/data_position-0.json")


def two_ranks(streamed, env_patch, *, batch_size: int, training: bool, drop_last: bool = False):
    """The two processes' loaders of a 2-process run, made in this process (LitData reads its rank
    from WORLD_SIZE and GLOBAL_RANK without a process group); each gathers both counts."""
    import torch
    from litdata import StreamingDataset

    env_patch.setenv("WORLD_SIZE", "2")
    counts = []
    for rank in (0, 1):
        env_patch.setenv("GLOBAL_RANK", str(rank))
        counts.append(StreamingDataset(streamed.url, drop_last=False).get_len(2, batch_size))
    loaders = []
    for rank in (0, 1):
        env_patch.setenv("GLOBAL_RANK", str(rank))
        accelerator = SimpleNamespace(
            num_processes=2, process_index=rank, device=torch.device("cpu"), gather=lambda _: torch.tensor(counts)
        )
        loaders.append(loader(streamed, accelerator, batch_size=batch_size, training=training, drop_last=drop_last))
    return loaders, counts


def test_two_processes_share_an_epoch_and_the_shorter_pads_with_its_first_samples(shards, digits, monkeypatch):
    """Every sample once across the processes, each with as many batches as the longest; the copies a
    process adds are its own epoch's first samples, counted; evaluation masks its copies out."""
    (zero, one), counts = two_ranks(streamed_split(str(shards)), monkeypatch, batch_size=32, training=True)
    assert sum(counts) == 1438 and len(zero) == len(one) == max(-(-n // 32) for n in counts)
    seen: Counter = Counter()
    for rank, stream in enumerate((zero, one)):
        monkeypatch.setenv("GLOBAL_RANK", str(rank))
        rows = epoch_rows(stream, 0)
        assert len(rows) == len(stream)
        own = rows[: -stream.shares.padded_batches or None]
        padding = rows[len(own) :]
        assert sum(len(batch) for batch in padding) == stream.shares.padded_samples()
        assert all(h in {x for batch in own for x in batch} for batch in padding for h in batch)
        seen.update(h for batch in own for h in batch)
    assert seen == expected_hashes(digits)

    (zero, one), counts = two_ranks(streamed_split(str(shards), "val"), monkeypatch, batch_size=32, training=False)
    valid = 0
    for rank, stream in enumerate((zero, one)):
        monkeypatch.setenv("GLOBAL_RANK", str(rank))
        stream.set_epoch(0)
        for inputs, _ in stream:
            assert len(inputs) == 32  # one shape on every process
            valid += int(stream.valid.sum())
    assert valid == 359 == sum(counts)  # the copies are not counted


def test_drop_last_leaves_out_each_process_short_batch_and_counts_it(shards, monkeypatch):
    (zero, one), counts = two_ranks(
        streamed_split(str(shards)), monkeypatch, batch_size=64, training=True, drop_last=True
    )
    for rank, stream in enumerate((zero, one)):
        assert stream.shares.dropped_samples() == counts[rank] % 64
        assert len(stream) == max(n // 64 for n in counts)


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under ``folder`` now (files deleted while it looks are left out)."""
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


def noise_images(root: Path, size: int, count: int) -> Path:
    """``count`` training and 20 validation images of random pixels (PNG cannot compress them)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, number in (("train", count), ("val", 20)):
        for i in range(number):
            folder = root / split / str(i % 2)
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


@pytest.mark.slow
@pytest.mark.parametrize(
    ("size", "count", "chunk", "limit", "workers"),
    [
        (64, 800, "16KB", "2MB", 2),  # many tiny chunks: LitData's own slot count stays off under 10 MiB
        # chunks of 1 MB and a limit LitData also counts slots under: the reader of the first sample
        # (read in the training process) once kept every slot and the workers gave up after 120 s
        (128, 1200, "1MB", "18MB", 2),
    ],
)
def test_a_data_set_three_times_the_cache_limit_streams_with_the_cache_under_it(
    tmp_path, s3, size, count, chunk, limit, workers
):
    """Random images on the S3 server, at least 3 times ``cache_limit``: every sample read, the cache
    folder never above the limit (sampled every 10 ms)."""
    from runjob.host.streams import parse_size

    images = noise_images(tmp_path / "noise", size, count)
    source = folder_bytes(images / "train")
    from runjob.commands.cli import main

    assert main(["data", "convert", str(images), s3.url("noise"), "--chunk-bytes", chunk, "--workers", "2"]) == 0
    cache = tmp_path / "cache"
    streamed = streamed_split(s3.url("noise"), cache_dir=str(cache), cache_limit=limit, chunks_ahead=1)
    assert source > 3 * parse_size(limit)

    peak, done, watcher_alive = [0], threading.Event(), [False]

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], folder_bytes(cache))
            time.sleep(0.01)
        watcher_alive[0] = True  # it watched to the end

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        rows = epoch_rows(loader(streamed, batch_size=50, workers=workers), 0)
    finally:
        done.set()
        watcher.join()
    assert sum(len(batch) for batch in rows) == count
    assert watcher_alive[0]
    print(f"peak cache {peak[0]} bytes of a {limit} limit; {source} bytes of images")
    assert 0 < peak[0] <= parse_size(limit), peak[0]


@pytest.mark.slow
def test_two_conversions_at_once_on_one_machine_each_write_their_own_shards(tmp_path, s3):
    """LitData stages chunks in one folder per machine by default: two conversions at once uploaded
    each other's chunks. Each conversion stages in its own."""
    import subprocess
    import sys

    sources = {size: export_digits(tmp_path / f"d{size}", image_size=size) for size in (8, 12)}
    processes = {
        size: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runjob",
                "data",
                "convert",
                str(folder),
                s3.url(f"d{size}"),
                "--chunk-bytes",
                "16KB",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for size, folder in sources.items()
    }
    for process in processes.values():
        out, _ = process.communicate(timeout=300)
        assert process.returncode == 0, out[-2000:]
    for size, folder in sources.items():
        rows = epoch_rows(loader(streamed_split(s3.url(f"d{size}"), "val", training=False), training=False), 0)
        assert Counter(h for batch in rows for h in batch) == expected_hashes(folder, "val"), size


@pytest.mark.slow
def test_streaming_from_the_s3_server_reads_what_the_local_folder_holds(digits, shards, s3, tmp_path):
    convert(digits, s3.url("digits"))
    assert s3.keys("digits")[-1] == "digits/val/index.json" and "digits/runjob.json" in s3.keys("digits")
    remote = streamed_split(s3.url("digits"), cache_dir=str(tmp_path / "cache"))
    assert epoch_rows(loader(remote), 0) == epoch_rows(loader(streamed_split(str(shards))), 0)


def test_converting_again_keeps_a_finished_conversion_and_refuses_other_data(digits, tmp_path, capsys):
    from runjob.commands.cli import main

    target = tmp_path / "shards"
    convert(digits, str(target))
    written = {p: p.stat().st_mtime_ns for p in target.rglob("*")}
    capsys.readouterr()
    convert(digits, str(target))
    assert "already holds this conversion (train 1438, val 359): nothing to do" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in target.rglob("*")} == written

    changed = tmp_path / "changed"
    shutil.copytree(digits, changed)
    next((changed / "train" / "3").iterdir()).unlink()
    assert main(["data", "convert", str(changed), str(target)]) == 2
    error = capsys.readouterr().err
    assert "already holds a finished conversion of other data (train 1438, val 359" in error
    assert "pass --overwrite to replace it" in error and "Traceback" not in error
    convert(changed, str(target), "--overwrite")
    assert json.loads((target / "runjob.json").read_text())["splits"]["train"]["samples"] == 1437


def test_bad_locations_are_refused_by_validate_in_one_line_without_network(tester):
    tester.write_job(
        "job.toml",
        """
        [job]
        name = "streamed"
        [model]
        name = "mlp"
        [dataset]
        name = "streamed_images"
        location = "s3://bucket/digits"
        [optimizer]
        name = "sgd"
        lr = 0.1
        [train]
        epochs = 1
        """,
    )
    good = tester.cli("validate", "job.toml")
    assert good.returncode == 0, good.stderr
    for override, message in (
        ("dataset.location=http://bucket/digits", "runjob streams from s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or a"),
        ("dataset.location=s3://A_/x", "'A_' is not a bucket name"),
        ("dataset.endpoint_url=localhost:9000", "is not an endpoint URL: give http(s)://HOST[:PORT]"),
        ("dataset.cache_limit=lots", "'lots' is not a size"),
    ):
        result = tester.cli("validate", "job.toml", "--set", override)
        assert result.returncode == 2, override
        assert len(result.stderr_lines) == 1 and message in result.stderr, result.stderr
        assert override.split("=")[0] in result.stderr


def streamed_job(tester, location: str, **extra: str) -> None:
    keys = "".join(f"{key} = {value}\n        " for key, value in extra.items())
    tester.write_job(
        "job.toml",
        f"""
        [job]
        name = "streamed"
        [model]
        name = "mlp"
        hidden = [16]
        [dataset]
        name = "streamed_images"
        location = "{location}"
        mean = [0.5, 0.5, 0.5]
        std = [0.5, 0.5, 0.5]
        {keys}
        [optimizer]
        name = "sgd"
        lr = 0.1
        [train]
        epochs = 1
        batch_size = 64
        """,
    )


@pytest.mark.slow
def test_store_problems_stop_the_run_before_training_in_one_line(tester, s3, digits, tmp_path, monkeypatch):
    """A missing bucket, a location holding no finished conversion, wrong credentials, an endpoint
    nobody answers: exit 2 with the location and what to do, before any training."""
    convert(digits, s3.url("half"))
    s3.client.delete_object(Bucket=s3.bucket, Key="half/runjob.json")  # as an interrupted conversion leaves it
    cases = [
        (f"s3://no-such-bucket-{os.getpid()}/digits", {}, "no-such-bucket"),
        (s3.url("half"), {}, "runjob.json not found"),
        (s3.url("half"), {"dataset.endpoint_url": "http://127.0.0.1:9"}, "127.0.0.1:9"),
    ]
    for location, sets, words in cases:
        streamed_job(tester, location)
        result = tester.cli("job.toml", *(f"--set={k}={v}" for k, v in sets.items()), "--output-dir", "out")
        assert result.returncode == 2, result.stderr[-2000:]
        assert words in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert "epoch 1/1" not in result.stdout + result.stderr
        shutil.rmtree(tester.path / "out", ignore_errors=True)


@pytest.mark.slow
def test_a_damaged_shard_stops_the_run_in_one_line_naming_the_location(tester, digits, tmp_path):
    target = tmp_path / "damaged"
    convert(digits, str(target))
    chunk = sorted((target / "train").glob("*.bin"))[3]
    chunk.write_bytes(chunk.read_bytes()[: len(chunk.read_bytes()) // 3])
    streamed_job(tester, str(target), cache_dir=f'"{tmp_path / "cache"}"')
    result = tester.cli("job.toml", "--output-dir", "out")
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{target}/train" in result.stderr and "convert the data again" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
