"""Every stop keeps the work and says how to go on.

Ctrl-C checkpoints even when it reaches runjob twice (a wrapper such as ``uv run`` passes the
terminal's SIGINT on again); a second Ctrl-C, pressed later, stops at once and names the newest
checkpoint. Each stop prints the command that goes on, records it in the MLflow run, and the command
works as printed. The signals are real: the whole process group gets SIGINT, as from a terminal, or
a plugin sends them to the run's own process. The model is the kit's tiny CNN."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO

from runjob.testing import run_process_group

PAUSER_PLUGIN = """
    import os, pathlib, signal, time
    import runjob

    @runjob.hookimpl
    def runjob_after_step(run, step):
        if str(step) == os.environ.get("PAUSE_AT_STEP") and os.environ.get("RANK", "0") == "0":
            # tell the test the run is mid-training, and wait for its Ctrl-C; then train on while
            # the copy a wrapper passes on arrives
            pathlib.Path("ready").touch()
            deadline = time.monotonic() + 120
            while not run.stopping and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(float(os.environ.get("PAUSE_AFTER", "1")))
        if str(step) == os.environ.get("SIGNAL_AT_STEP"):
            os.kill(os.getpid(), getattr(signal, os.environ["SIGNAL"]))
            if os.environ.get("PRESS_AGAIN_AFTER"):  # a person pressing Ctrl-C again, later
                time.sleep(float(os.environ["PRESS_AGAIN_AFTER"]))
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(60)  # the run stops at once, inside this sleep
"""

JOB = """
    [job]
    name = "stops"
    [model]
    name = "tiny_cnn"
    [dataset]
    name = "digits"
    image_size = 16
    [train]
    epochs = 2
    batch_size = 64
    log_every = 5
    checkpoint_every = 4
    keep_checkpoints = 2
"""
# 2 epochs of 22 steps; checkpoints every 4 steps

WRAPPER = """
    import signal, subprocess, sys, threading
    # like `uv run` without a terminal: the child shares this process group (so a terminal's Ctrl-C
    # reaches it directly) and each SIGINT this process gets is passed on to it 0.2 s later
    child = subprocess.Popen(sys.argv[1:])
    def forward(signum, frame):
        threading.Timer(0.2, lambda: child.poll() is None and child.send_signal(signum)).start()
    signal.signal(signal.SIGINT, forward)
    sys.exit(child.wait())
"""

RUN_TIMEOUT = 600
VENV_BIN = Path(os.path.abspath(sys.executable)).parent


def path_without_venv() -> str:
    """$PATH without the virtual environment's bin folder: a user's shell where it is not active, so
    a printed command that starts with ``python`` or ``runjob`` would not work there; runjob's does."""
    return os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if os.path.abspath(p) != str(VENV_BIN))


@pytest.fixture
def stops(tester):
    """``tester`` with the pausing plugin installed and the job written."""
    tester.install_plugin("fake-pauser", {"fake_pauser": PAUSER_PLUGIN}, {"pauser": "fake_pauser"})
    tester.write_job("job.toml", JOB)
    return tester


def ctrl_c_to_the_group(
    tester,
    command: list[str],
    again_after: float | None = None,
    timeout: float = RUN_TIMEOUT,
    signum: int = signal.SIGINT,
    **env: str,
) -> tuple[int, str, str]:
    """Start ``command`` in a process group of its own, wait until the run pauses at step 10, send
    SIGINT (or ``signum``) to the whole group (as a terminal does; again ``again_after`` seconds
    later) and wait for the end."""
    proc = subprocess.Popen(
        command,
        cwd=tester.path,
        env=tester.env(PAUSE_AT_STEP="10", **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while not (tester.path / "ready").exists():
            assert proc.poll() is None, f"the run ended before step 10:\n{proc.communicate()[1][-3000:]}"
            assert time.monotonic() < deadline, "the run did not reach step 10"
            time.sleep(0.05)
        os.killpg(proc.pid, signum)
        if again_after is not None:
            time.sleep(again_after)
            os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, stdout, stderr


def assert_stopped_at_step_10_and_resumes(
    tester, code: int, stderr: str, started: list[str], shell: dict[str, str] | None = None
) -> None:
    """... and the command that goes on starts as runjob was ``started`` (the words before its
    arguments); it is run as printed in this process, or pasted into a shell with the environment
    ``shell``."""
    out = tester.path / "out"
    assert code == 130, stderr[-3000:]
    assert "runjob: Ctrl-C: writing a checkpoint, then stopping; press Ctrl-C again to stop at once" in stderr
    assert stderr.count("press Ctrl-C again") == 1, "the copy passed on again is the same Ctrl-C"
    checkpoint = Path("out", "checkpoints", "step-00000010")
    assert f"runjob: stopped by signal 2 (SIGINT) at step 10 after writing checkpoint {checkpoint}" in stderr
    assert (out / checkpoint.relative_to("out")).is_dir()
    command = f"{shlex.join(started)} job.toml --output-dir out --resume --set train.log_every=5"
    assert f"runjob: to go on: {command}\n" in stderr
    run = tester.record("out")
    assert run.status == "KILLED" and run.tags["runjob.resume_command"] == command

    if shell is None:
        resumed = tester.cli(*shlex.split(command)[len(started) :])  # as printed, in this process
    else:
        resumed = run_process_group(["bash", "-c", command], tester.path, shell, timeout=RUN_TIMEOUT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming step-00000010" in resumed.stdout
    run = tester.record("out")
    assert run.status == "FINISHED" and run.mlflow.steps("train/loss")[-1] == 44


@pytest.mark.e2e
@pytest.mark.timeout(1200)
def test_ctrl_c_passed_on_again_by_a_wrapper_still_checkpoints_and_the_run_resumes(stops):
    """Started as ``python -m runjob`` from a shell where the environment is not active: the printed
    command, pasted into such a shell, goes on (test_resume_command.py has the full path's)."""
    (stops.path / "wrapper.py").write_text(WRAPPER.replace("\n    ", "\n"))
    runjob = [sys.executable, "-m", "runjob", "job.toml", "--output-dir", "out", "--set", "train.log_every=5"]
    code, _, stderr = ctrl_c_to_the_group(stops, [sys.executable, "wrapper.py", *runjob], PATH=path_without_venv())
    shell = stops.env(PATH=path_without_venv())
    shell.pop("UV", None)  # the user's shell, not uv run
    assert_stopped_at_step_10_and_resumes(stops, code, stderr, runjob[:3], shell)


@pytest.mark.e2e
@pytest.mark.timeout(1200)
def test_ctrl_c_under_uv_run_still_checkpoints_and_the_run_resumes(stops):
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    command = [uv, "run", "--locked", "--project", str(REPO), "runjob", "job.toml", "--output-dir", "out"]
    code, _, stderr = ctrl_c_to_the_group(stops, [*command, "--set", "train.log_every=5"])
    assert_stopped_at_step_10_and_resumes(stops, code, stderr, ["uv", *command[1:6]])  # uv's command, as typed


def test_sigterm_says_and_records_the_command_that_goes_on(stops, monkeypatch):
    """A SIGTERM stop prints its checkpoint and a command to paste (overrides quoted), records the
    command as a tag and in the run's description; the command, pasted, finishes the run."""
    monkeypatch.setenv("SIGNAL_AT_STEP", "6")
    monkeypatch.setenv("SIGNAL", "SIGTERM")
    description = 'job.description="digits, stopped once"'
    stopped = stops.cli("job.toml", "--output-dir", "out", "--set", description)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    checkpoint = Path("out", "checkpoints", "step-00000006")
    command = f"runjob job.toml --output-dir out --resume --set '{description}'"
    assert stopped.stderr_lines[-2:] == [
        f"runjob: stopped by signal 15 (SIGTERM) at step 6 after writing checkpoint {checkpoint}",
        f"runjob: to go on: {command}",
    ]
    assert "runjob: SIGTERM: writing a checkpoint, then stopping" in stopped.stderr
    run = stops.record("out")
    assert run.status == "KILLED" and run.tags["runjob.resume_command"] == command
    assert run.mlflow.tags["mlflow.note.content"] == (
        f"digits, stopped once\n\nStopped by SIGTERM at step 6 after writing checkpoint {checkpoint}. "
        f"To go on: `{command}`"
    )

    monkeypatch.delenv("SIGNAL_AT_STEP")
    resumed = stops.cli(*shlex.split(command)[1:])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming step-00000006" in resumed.stdout
    run = stops.record("out")
    assert run.status == "FINISHED"
    assert run.mlflow.tags["mlflow.note.content"] == "digits, stopped once", "the stop's note is done with"


@pytest.mark.parametrize(
    ("step", "newest"),
    [(6, "the newest complete checkpoint is out/checkpoints/step-00000004"), (2, "there is no complete checkpoint")],
)
def test_a_second_ctrl_c_stops_at_once_and_names_the_newest_checkpoint(stops, monkeypatch, step, newest):
    """Ctrl-C, and again 1.7 s later (a new press): the run stops at once, without writing a
    checkpoint, and names the newest complete one, or says there is none and how to start again;
    ``--resume auto`` then says it starts afresh."""
    monkeypatch.setenv("SIGNAL_AT_STEP", str(step))
    monkeypatch.setenv("SIGNAL", "SIGINT")
    monkeypatch.setenv("PRESS_AGAIN_AFTER", "1.7")
    stopped = stops.cli("job.toml", "--output-dir", "out")
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    command = "runjob job.toml --output-dir out --resume" + ("" if step == 6 else " auto")
    assert stopped.stderr_lines[-2:] == [
        f"runjob: interrupted: stopped at once by a second Ctrl-C, without a checkpoint; {newest}",
        f"runjob: to {'go on' if step == 6 else 'start again there'}: {command}",
    ]
    found = sorted(p.name for p in (stops.path / "out" / "checkpoints").glob("step-*"))
    assert found == (["step-00000004"] if step == 6 else [])
    run = stops.record("out")
    assert run.status == "KILLED" and run.tags["runjob.resume_command"] == command
    assert run.mlflow.tags["mlflow.note.content"].startswith(f"Stopped at once by a second Ctrl-C at step {step}")
    if step == 2:  # the command as printed starts the run again in the same folder
        monkeypatch.delenv("SIGNAL_AT_STEP")
        again = stops.cli(*shlex.split(command)[1:])
        assert again.returncode == 0, again.stderr[-3000:]
        assert again.stdout.splitlines()[0].endswith("; starting afresh in out")
        assert stops.record("out").status == "FINISHED"


@pytest.mark.e2e
@pytest.mark.timeout(1200)
def test_the_launcher_of_two_processes_takes_a_repeated_ctrl_c_once_and_a_second_one_at_once(stops):
    """runjob's own process, starting two workers, gets each Ctrl-C twice (the group's and the
    wrapper's copy). The first is passed on to the workers once; the second, pressed 2.5 s later,
    is passed on again and stops them at once, while the first worker still waits at step 10. The
    launcher waits for them (no worker is left running) and names the newest checkpoint."""
    import psutil

    (stops.path / "wrapper.py").write_text(WRAPPER.replace("\n    ", "\n"))
    runjob = [sys.executable, "-m", "runjob", "job.toml", "--output-dir", "out", "--num-processes", "2"]
    command = [sys.executable, "wrapper.py", *runjob]
    code, _, stderr = ctrl_c_to_the_group(stops, command, again_after=2.5, PAUSE_AFTER="120", PATH=path_without_venv())
    left = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.cwd() == str(stops.path):  # this test runs there too
                left.append(process)
        except psutil.Error:
            pass
    for process in left:
        process.kill()
    assert not left, f"still running after runjob exited: {[p.pid for p in left]}"
    assert code == 130, stderr[-3000:]
    assert stderr.count("press Ctrl-C again") == 1, "said once, by the first worker"
    assert [line for line in stderr.splitlines() if line.startswith("runjob: ")][-2:] == [
        "runjob: stopped at once by a second Ctrl-C; newest complete checkpoint out/checkpoints/step-00000008",
        f"runjob: to go on: {shlex.join(runjob[:3])} job.toml --output-dir out --resume --set launch.num_processes=2",
    ]
    assert sorted(p.name for p in (stops.path / "out" / "checkpoints").glob("step-*")) == [
        "step-00000004",
        "step-00000008",
    ]
    run = stops.record("out")
    assert run.status == "KILLED" and "Stopped at once by a second Ctrl-C" in run.mlflow.tags["mlflow.note.content"]
    assert run.tags["runjob.resume_command"].startswith(f"{shlex.join(runjob[:3])} job.toml"), "the workers' too"


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_sent_to_the_whole_group_leaves_dataloader_workers_alive_until_the_checkpoint(stops, signum):
    """Slurm's and Kubernetes' SIGTERM, a closed terminal's SIGHUP, reach every process of the group,
    DataLoader workers included: the run still checkpoints and ends KILLED, not FAILED on a dead worker."""
    loaded = ("dataset.name=synthetic", "dataset.in_memory=false", "dataset.num_train=1408", "dataset.num_val=64")
    sets = [part for value in (*loaded, "dataset.num_workers=1") for part in ("--set", value)]
    command = [sys.executable, "-m", "runjob", "job.toml", "--output-dir", "out", *sets]
    code, _, stderr = ctrl_c_to_the_group(stops, command, signum=signum, PAUSE_AFTER="0.5")
    assert code == 128 + signum, stderr[-3000:]
    assert "is killed by signal" not in stderr
    run = stops.record("out")
    assert run.status == "KILLED" and "DataLoader" not in run.tags.get("runjob.error", "")
    assert (stops.path / "out" / "checkpoints" / "step-00000010").is_dir()
