"""Never lose work: atomic checkpoints, exact resume after SIGKILL, SIGTERM preemption, refusals.

The kills are real: the run is a process of its own that a plugin kills at a given step (a test
may only SIGTERM itself, and never SIGKILL). The model is the kit's tiny CNN: what is checked is
the checkpoint and the resume, which do not depend on the model."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    name = "tiny_cnn"
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

RUN_TIMEOUT = 600  # a run takes seconds; a busy machine may make it minutes


@pytest.fixture
def killer(tester):
    """``tester`` with the killing plugin installed and the job written; it kills nothing until
    KILL_AT_STEP is set."""
    tester.install_plugin("fake-killer", {"fake_killer": KILLER_PLUGIN}, {"killer": "fake_killer"})
    tester.write_job("job.toml", JOB)
    return tester


def uninterrupted_weights(tester) -> bytes:
    """The weights of the job run without interruption (in this process, recorded offline: the
    test's MLflow store keeps only the run under test)."""
    run = tester.run("job.toml", "tracking.offline=true", output_dir="baseline")
    assert run.status == "FINISHED"
    return (run.output_dir / "model.safetensors").read_bytes()


@pytest.mark.e2e
@pytest.mark.timeout(1200)
def test_the_same_command_resubmitted_after_kills_and_sigterm_continues_the_same_run(killer, monkeypatch):
    """``--resume auto``, as a Slurm or Kubernetes restart would resubmit it: killed before its
    first checkpoint, the command starts afresh (the attempt kept aside); stopped by SIGTERM, it
    checkpoints; resubmitted again, it continues that run. The SIGKILL is a process's own; the
    SIGTERM and the resubmissions after it run in this process (runjob's handler stops the run
    and is put back, as test_resume_refuses_another_job_and_reports_bad_checkpoints shows)."""
    out = killer.path / "out"
    command = ("job.toml", "--output-dir", "out", "--resume", "auto")
    early = killer.cli_subprocess(*command, env={"KILL_AT_STEP": "2", "KILL_SIGNAL": "SIGKILL"}, timeout=RUN_TIMEOUT)
    assert early.returncode == -9 and not (out / "checkpoints").exists()
    abandoned = killer.record("out").run_id

    monkeypatch.setenv("KILL_AT_STEP", "7")
    monkeypatch.setenv("KILL_SIGNAL", "SIGTERM")
    stopped = killer.cli(*command)
    monkeypatch.delenv("KILL_AT_STEP")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert (
        f"runjob: --resume auto: no complete checkpoint in out; the earlier attempt (MLflow run {abandoned}, now "
        f"marked KILLED) is kept in {Path('out', 'attempts', '1')}; starting afresh"
    ) in stopped.stdout
    assert "runjob: stopped by signal 15" in stopped.stderr
    assert (out / "checkpoints" / "step-00000007").is_dir()  # the current step, not the last periodic one
    run = killer.record("out")
    run_id = run.run_id
    assert run.status == "KILLED" and run_id != abandoned
    first = killer.record(out / "attempts" / "1")
    assert first.run_id == abandoned and first.status == "KILLED" and "runjob.abandoned" in first.tags

    # the same command again (the stopped run has ended either way)
    resumed = killer.cli(*command, "--set", "train.log_every=5")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming step-00000007" in resumed.stdout
    assert (out / "model.safetensors").read_bytes() == uninterrupted_weights(killer)
    run = killer.record("out")
    steps = run.mlflow.steps("train/loss")
    assert run.run_id == run_id and run.status == "FINISHED"
    assert steps == sorted(set(steps)) and steps[0] == 5 and steps[-1] == 44  # continuing, not restarting
    assert len(killer.runs("resume")) == 2  # the abandoned attempt and the run resuming continued


def test_resume_refuses_another_job_and_reports_bad_checkpoints(killer, monkeypatch):
    # SIGTERM to this very process: runjob's handler checkpoints and stops the run, then is put back
    monkeypatch.setenv("KILL_AT_STEP", "5")
    monkeypatch.setenv("KILL_SIGNAL", "SIGTERM")
    stopped = killer.cli("job.toml", "--output-dir", "out")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "runjob: stopped by signal 15" in stopped.stderr
    monkeypatch.delenv("KILL_AT_STEP")

    other = killer.cli(
        "job.toml", "--output-dir", "out", "--resume", "--set", "dataset.image_size=8", "--set", "optimizer.lr=0.1"
    )
    assert other.returncode == 2
    assert "made by a different job; these values differ: dataset.image_size: 16 -> 8" in other.stderr
    assert "optimizer.lr" not in other.stderr  # a learning rate may change on resume

    nothing = killer.cli("job.toml", "--output-dir", "empty", "--resume")
    assert nothing.returncode == 2 and "no complete checkpoint in" in nothing.stderr

    (killer.path / "out" / "checkpoints" / "step-00000005" / "model.safetensors").write_bytes(b"garbage")
    corrupt = killer.cli("job.toml", "--output-dir", "out", "--resume")
    assert corrupt.returncode == 2
    assert "cannot load checkpoint out/checkpoints/step-00000005: SafetensorError" in corrupt.stderr
    assert "Traceback" not in corrupt.stderr


@pytest.mark.e2e
@pytest.mark.timeout(1200)
def test_sigkill_then_resume_gives_bit_identical_weights_with_stateful_callbacks(killer):
    """Killed with SIGKILL and resumed from its last complete checkpoint, the run ends with the
    weights an uninterrupted run ends with, bit for bit; ema (its average) and early_stopping (its
    best and patience count) keep their state in the checkpoints, so the averaged weights match too."""
    callbacks = (
        "    eval_every = 4\n    [callbacks.ema]\n    decay = 0.9\n    [callbacks.early_stopping]\n    patience = 20\n"
    )
    killer.write_job("job.toml", JOB + callbacks)
    out = killer.path / "out"
    killed = killer.cli_subprocess(
        "job.toml", "--output-dir", "out", env={"KILL_AT_STEP": "11", "KILL_SIGNAL": "SIGKILL"}, timeout=RUN_TIMEOUT
    )
    assert killed.returncode == -9
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints == ["step-00000004", "step-00000008"]  # keep_checkpoints = 2
    # a checkpoint being written when the process died is not taken for a complete one
    (out / "checkpoints" / ".tmp-step-00000012").mkdir()

    resumed = killer.cli_subprocess("job.toml", "--output-dir", "out", "--resume", timeout=RUN_TIMEOUT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming step-00000008" in resumed.stdout
    assert (out / "model.safetensors").read_bytes() == uninterrupted_weights(killer)
    run = killer.record("out")
    assert run.status == "FINISHED"
    assert run.tags["runjob.resumed.step_8"] == "no changes"
    import torch

    saved = torch.load(out / "checkpoints" / "step-00000044" / "callbacks.pt", weights_only=True)
    assert saved["early_stopping"]["best"] is not None and saved["ema"]


def test_resume_auto_needs_a_folder_that_survives_the_restart(killer):
    for how in (("--resume", "auto"), ("--set", "train.resume=auto")):
        result = killer.cli("job.toml", *how)
        assert result.returncode == 2 and result.stderr_lines == [
            "runjob: --resume auto (train.resume = 'auto') needs --output-dir DIR: a folder that survives restarts, "
            "where the same command finds its checkpoints (e.g. runs/$SLURM_JOB_ID)"
        ], how
    assert not (killer.path / "runs").exists(), "nothing was started"
