"""The recording process: the training process says what it will do at once, never imports MLflow,
and the MLflow run is still complete (params, every metric point, the logged model) when the
command returns; a broken pipe to it loses nothing."""

from __future__ import annotations

import json

import pytest
from helpers import SMALL_DIGITS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

WATCHER = '''
"""Notes what the training process had imported when the run ended."""
import json
import os
import sys

import runjob


@runjob.hookimpl
def runjob_run_end(run, status, error):
    seen = {name: name in sys.modules for name in ("mlflow", "torch")}
    with open(os.environ["WATCH_FILE"], "w") as file:
        json.dump(seen, file)
'''


def test_training_never_imports_mlflow_and_the_mlflow_run_is_complete_when_the_command_returns(tester):
    tester.install_plugin("import-watch", {"import_watch": WATCHER}, {"import_watch": "import_watch"})
    tester.write_job("job.toml", SMALL_DIGITS.format(name="apart") + "epochs = 2\nlog_every = 5\n")
    watch = tester.path / "watch.json"
    result = tester.cli_subprocess("job.toml", "--output-dir", "out", env={"WATCH_FILE": str(watch)}, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]

    first, second = result.stdout.splitlines()[:2]
    assert first == "runjob: apart: tiny_cnn on digits (classification), 2 epoch(s); output in out", (
        "the first line: what will run and where, said before torch is imported"
    )
    run = tester.only_run("apart")
    assert second == f"runjob: 1 process(es) on cpu, MLflow run {run.run_id}"
    assert json.loads(watch.read_text()) == {"mlflow": False, "torch": True}, "MLflow stays in the recording process"

    # ... which made the run whole before the command returned
    local = [json.loads(line) for line in (tester.path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert run.status == "FINISHED"
    for key in ("train/loss", "val/accuracy"):
        assert run.history(key) == [(p["step"], p["value"]) for p in local if p["key"] == key], key
    assert run.params["train.epochs"] == "2" and run.tags["runjob.device"] == "cpu"
    assert run.models() == {"apart"}, "the MLflow model, written and logged by the recording process"
    assert "model.safetensors" not in run.artifacts(), "the final weights are stored once, in the logged model"
    record = tester.record(tester.path / "out").record
    assert record["run_id"] == run.run_id and "unsynced" not in record


def test_a_recording_process_that_dies_loses_nothing_sync_restores_the_run(tester):
    killer = """
import os, signal
import psutil
import runjob


@runjob.hookimpl
def runjob_after_step(run, step, epoch, loss):
    if step == 3:
        for child in psutil.Process().children():
            if "runjob.record.mirror" in " ".join(child.cmdline()):
                child.send_signal(signal.SIGKILL)
                child.wait(30)
"""
    tester.install_plugin("mirror-killer", {"mirror_killer": killer}, {"mirror_killer": "mirror_killer"})
    tester.write_job("job.toml", SMALL_DIGITS.format(name="cut") + "max_steps = 12\nlog_every = 1\n")
    result = tester.cli_subprocess("job.toml", "--output-dir", "out", timeout=240)
    assert result.returncode == 0, "training goes on: " + result.stderr[-2000:]
    assert "stopped taking the run's record" in result.stdout and " -m runjob sync out`" in result.stdout
    record = tester.record(tester.path / "out").record
    assert record["status"] == "FINISHED" and record["unsynced"]

    synced = tester.cli("sync", "out")
    assert synced.returncode == 0, synced.stderr[-2000:]
    run = tester.only_run("cut")
    assert run.status == "FINISHED"
    assert [step for step, _ in run.history("train/loss")] == list(range(1, 13)), "every point, after sync"
