"""Whole runs on streamed data: two processes with two loader workers each read digits shards from
moto's S3 server, every sample once per epoch (noted by a callback, each input row by its hash),
killed with SIGKILL mid-epoch and resumed to the uninterrupted run's weights, bit for bit."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from test_streaming import convert, expected_hashes, export_digits

pytest.importorskip("litdata")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
RUN_TIMEOUT = 600

PLUGIN = """
    import hashlib, json, os, signal
    import runjob

    class NoteBatches(runjob.Callback):
        \"\"\"Each training batch's input rows, by hash, with the epoch: CHECK_DIR/seen-RANK.jsonl.\"\"\"
        def __init__(self, options):
            pass
        def on_batch(self, run, step, epoch, batch):
            rows = [hashlib.sha1(row.contiguous().numpy().tobytes()).hexdigest() for row in batch[0].cpu()]
            path = os.path.join(os.environ["CHECK_DIR"], f"seen-{os.environ.get('RANK', '0')}.jsonl")
            with open(path, "a") as f:
                f.write(json.dumps({"epoch": epoch, "rows": rows}) + "\\n")

    @runjob.hookimpl
    def runjob_register_callbacks(register):
        register("note_batches", NoteBatches)

    @runjob.hookimpl
    def runjob_after_step(step):
        if str(step) == os.environ.get("KILL_AT_STEP"):
            os.kill(os.getpid(), signal.SIGKILL)
"""

JOB = """
    [job]
    name = "streamed-runs"
    seed = 1
    [model]
    name = "mlp"
    hidden = [16]
    [dataset]
    name = "streamed_images"
    location = "{location}"
    mean = [0.5, 0.5, 0.5]
    std = [0.5, 0.5, 0.5]
    num_workers = 2
    cache_limit = "50MB"
    [optimizer]
    name = "sgd"
    lr = 0.1
    momentum = 0.9
    [train]
    epochs = 2
    batch_size = 32
    drop_last = false
    log_every = 4
    checkpoint_every = 8
    [callbacks.note_batches]
"""


def noted(folder) -> dict[int, list[Counter]]:
    """Per epoch, each process's training rows (hash -> count)."""
    found: dict[int, list[Counter]] = {}
    for rank in (0, 1):
        for line in (folder / f"seen-{rank}.jsonl").read_text().splitlines():
            entry = json.loads(line)
            found.setdefault(entry["epoch"], [Counter(), Counter()])[rank].update(entry["rows"])
    return found


def test_two_processes_stream_every_sample_once_and_resume_after_sigkill_bit_identical(tester, s3, tmp_path):
    digits = export_digits(tmp_path / "digits")
    convert(digits, s3.url("digits"))
    tester.install_plugin("fake-note-batches", {"note_batches_plugin": PLUGIN})
    tester.write_job("job.toml", JOB.format(location=s3.url("digits")))
    expected = expected_hashes(digits)

    straight_notes = tmp_path / "straight-notes"
    straight_notes.mkdir()
    straight = tester.cli_subprocess(
        "job.toml",
        "--num-processes",
        "2",
        "--output-dir",
        "straight",
        env={"CHECK_DIR": str(straight_notes)},
        timeout=RUN_TIMEOUT,
    )
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "2 process(es) x 2 loader worker(s)" in straight.stdout
    run = tester.record("straight")
    padded = int(run.tags["runjob.data.padded_samples_per_epoch"])
    assert run.tags["runjob.data.dropped_samples_per_epoch"] == "0"
    shares = [int(n) for n in run.tags["runjob.data.samples_per_process"].split(",")]
    assert sum(shares) == 1438 and len(shares) == 2
    assert run.metrics["data/retries"] == 0  # the store's transient errors, counted (none on this server)
    for epoch, (zero, one) in noted(straight_notes).items():
        both = zero + one
        # every sample at least once; the repeats are the padding the record states, each a process's own sample
        assert set(both) == set(expected), epoch
        assert sum((both - expected).values()) == padded, epoch
        assert sum(both.values()) == 1438 + padded
    assert sorted(noted(straight_notes)) == [0, 1]

    killed_notes = tmp_path / "killed-notes"
    killed_notes.mkdir()
    # 23 batches of 32 per process and epoch: step 20 is in the first epoch, its last checkpoint step 16
    killed = tester.cli_subprocess(
        "job.toml",
        "--num-processes",
        "2",
        "--output-dir",
        "out",
        env={"CHECK_DIR": str(killed_notes), "KILL_AT_STEP": "20"},
        timeout=RUN_TIMEOUT,
    )
    assert killed.returncode != 0
    assert sorted(p.name for p in (tester.path / "out" / "checkpoints").iterdir())[-1] == "step-00000016"
    positions = sorted((tester.path / "out" / "checkpoints" / "step-00000016").glob("data_position-*.json"))
    assert [p.name for p in positions] == ["data_position-0.json", "data_position-1.json"]
    assert json.loads(positions[0].read_text())["batches"] == 16

    resumed = tester.cli_subprocess(
        "job.toml",
        "--num-processes",
        "2",
        "--output-dir",
        "out",
        "--resume",
        env={"CHECK_DIR": str(killed_notes)},
        timeout=RUN_TIMEOUT,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming step-00000016" in resumed.stdout
    final = (tester.path / "out" / "model.safetensors").read_bytes()
    assert final == (tester.path / "straight" / "model.safetensors").read_bytes()


def test_the_shipped_streamed_job_runs_on_shards_converted_by_the_readme_command(tester):
    """jobs/digits_streamed.toml as written, from a folder where the README's two commands made
    data/digits and data/digits-shards (10 steps of it: what is checked is that it runs)."""
    from helpers import REPO

    from runjob.commands.cli import main

    export_digits(tester.path / "data" / "digits", image_size=32)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tester.path)
        assert main(["data", "convert", "data/digits", "data/digits-shards"]) == 0
    result = tester.cli_subprocess(
        REPO / "jobs" / "digits_streamed.toml",
        "--set",
        "train.max_steps=10",
        "--output-dir",
        "out",
        timeout=RUN_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"streaming {tester.path / 'data' / 'digits-shards' / 'train'}: 1438 samples" in result.stdout
    run = tester.record("out")
    assert run.status == "FINISHED" and "val/accuracy" in run.metrics
