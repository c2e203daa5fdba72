"""Never lose work: atomic checkpoints, exact resume after SIGKILL, SIGTERM preemption, refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import clean_env, make_plugin_dist, write_job

pytestmark = pytest.mark.timeout(600)

KILLER_PLUGIN = """
    import os, signal
    import runjob

    @runjob.hookimpl
    def runjob_after_step(step):
        if str(step) == os.environ.get("KILL_AT_STEP"):
            os.kill(os.getpid(), getattr(signal, os.environ["KILL_SIGNAL"]))
"""

JOB = """
    [job]
    name = "resume"
    [model]
    name = "resnet18"
    num_classes = 10
    [dataset]
    name = "digits"
    image_size = 16
    [optimizer]
    name = "sgd"
    lr = 0.05
    [scheduler]
    name = "cosine"
    warmup_steps = 5
    [train]
    epochs = 2
    batch_size = 64
    log_every = 5
    checkpoint_every = 4
    keep_checkpoints = 2
"""


@pytest.fixture
def killer(tmp_path):
    return make_plugin_dist(
        tmp_path / "site", "fake-killer", "1.0", {"killer": "fake_killer"}, {"fake_killer": KILLER_PLUGIN}
    )


@pytest.fixture(scope="module")
def baseline_weights(tmp_path_factory):
    """The weights of the job run without interruption (once for the module)."""
    folder = tmp_path_factory.mktemp("baseline")
    write_job(folder / "job.toml", JOB)
    proc = subprocess.run(
        [sys.executable, "-m", "runjob", "job.toml", "--output-dir", "out"],
        cwd=folder,
        env=clean_env(folder),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return (folder / "out" / "model.safetensors").read_bytes()


@pytest.fixture
def baseline(tmp_path, baseline_weights):
    write_job(tmp_path / "job.toml", JOB)
    return baseline_weights


def steps_of(tmp_path, run_id, key="train/loss"):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    return client.get_run(run_id), [m.step for m in client.get_metric_history(run_id, key)]


def test_sigkill_then_resume_gives_bit_identical_weights(runjob_cli, tmp_path, killer, monkeypatch, baseline):
    monkeypatch.setenv("KILL_AT_STEP", "11")
    monkeypatch.setenv("KILL_SIGNAL", "SIGKILL")
    killed = runjob_cli("job.toml", "--output-dir", "out", extra_path=[killer])
    assert killed.returncode == -9
    checkpoints = sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir())
    assert checkpoints == ["step-00000004", "step-00000008"]  # keep_checkpoints = 2
    # a checkpoint being written when the process died is not taken for a complete one
    (tmp_path / "out" / "checkpoints" / ".tmp-step-00000012").mkdir()

    monkeypatch.delenv("KILL_AT_STEP")
    resumed = runjob_cli("job.toml", "--output-dir", "out", "--resume", extra_path=[killer])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming step-00000008" in resumed.stdout
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == baseline

    run_id = json.loads((tmp_path / "out" / "mlflow_run.json").read_text())["run_id"]
    run, _ = steps_of(tmp_path, run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["runjob.resumed.step_8"] == "no changes"


def test_sigterm_checkpoints_ends_killed_and_resumes_the_same_run(runjob_cli, tmp_path, killer, monkeypatch, baseline):
    monkeypatch.setenv("KILL_AT_STEP", "7")
    monkeypatch.setenv("KILL_SIGNAL", "SIGTERM")
    stopped = runjob_cli("job.toml", "--output-dir", "out", extra_path=[killer])
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "runjob: stopped by signal 15" in stopped.stderr
    assert (tmp_path / "out" / "checkpoints" / "step-00000007").is_dir()  # the current step, not the last periodic one
    run_id = json.loads((tmp_path / "out" / "mlflow_run.json").read_text())["run_id"]
    run, _ = steps_of(tmp_path, run_id)
    assert run.info.status == "KILLED"

    monkeypatch.delenv("KILL_AT_STEP")
    resumed = runjob_cli(
        "job.toml", "--output-dir", "out", "--resume", "--set", "train.log_every=5", extra_path=[killer]
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == baseline
    run, steps = steps_of(tmp_path, run_id)
    assert run.info.status == "FINISHED"
    assert steps == sorted(set(steps)) and steps[0] == 5 and steps[-1] == 44  # continuing, not restarting
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("resume").experiment_id])
    assert len(runs) == 1  # resuming made no new run


def test_resume_refuses_another_job_and_reports_bad_checkpoints(runjob_cli, tmp_path, killer, monkeypatch):
    write_job(tmp_path / "job.toml", JOB)
    monkeypatch.setenv("KILL_AT_STEP", "5")
    monkeypatch.setenv("KILL_SIGNAL", "SIGTERM")
    assert runjob_cli("job.toml", "--output-dir", "out", extra_path=[killer]).returncode == 143
    monkeypatch.delenv("KILL_AT_STEP")

    other = runjob_cli(
        "job.toml", "--output-dir", "out", "--resume", "--set", "dataset.image_size=8", "--set", "optimizer.lr=0.1"
    )
    assert other.returncode == 2
    assert "made by a different job; these values differ: dataset.image_size: 16 -> 8" in other.stderr
    assert "optimizer.lr" not in other.stderr  # a learning rate may change on resume

    nothing = runjob_cli("job.toml", "--output-dir", "empty", "--resume")
    assert nothing.returncode == 2 and "no complete checkpoint in" in nothing.stderr

    (tmp_path / "out" / "checkpoints" / "step-00000005" / "model.safetensors").write_bytes(b"garbage")
    corrupt = runjob_cli("job.toml", "--output-dir", "out", "--resume")
    assert corrupt.returncode == 2
    assert "cannot load checkpoint out/checkpoints/step-00000005: SafetensorError" in corrupt.stderr
    assert "Traceback" not in corrupt.stderr
