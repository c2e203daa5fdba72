"""A stop that nobody reads still keeps the work and says how to go on.

``runjob ... 2>&1 | tee log`` and Ctrl-C: the terminal's SIGINT ends ``tee`` too, and every later
line runjob prints meets a broken pipe; a closed SSH session sends SIGHUP and leaves a terminal
that cannot be written; a run may be started with its output closed. Each stop still writes its
checkpoint, ends KILLED in the local record and in MLflow with the command that goes on (the tag
``runjob.resume_command`` and ``OUTPUT_DIR/runjob.log``), exits 128 + the signal, and that command
finishes the run. The run and its reader are real processes, and the signals real (the reader's
first, as a terminal sends one to a whole pipeline, in the order where everything said after it
meets the broken pipe). The job and its pausing plugin are test_stops.py's."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_stops import JOB, path_without_venv, stops  # noqa: F401 - stops: the fixture

RUNJOB = [sys.executable, "-m", "runjob", "job.toml", "--output-dir", "out"]
RUN_TIMEOUT = 120
SHORT_JOB = JOB + "    max_steps = 12\n"  # test_stops.py's, 12 steps: it stops at 10, the command that goes on does 2


def _wait_for_step_10(tester, proc: subprocess.Popen, timeout: float = RUN_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not (tester.path / "ready").exists():
        assert proc.poll() is None, f"the run ended with exit code {proc.returncode} before step 10"
        assert time.monotonic() < deadline, "the run did not reach step 10"
        time.sleep(0.05)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stopped_while_its_reader_dies(tester, signum: int) -> int:
    """``RUNJOB 2>&1 | tee seen.log``; at step 10, ``signum`` to ``tee`` and, once it has died of
    it, to the run's process group: as a terminal sends it to a pipeline, in the order where every
    line said after the signal meets the broken pipe. Returns runjob's exit code."""
    reader = subprocess.Popen(
        ["tee", "seen.log"], cwd=tester.path, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True
    )
    run = None
    try:
        run = subprocess.Popen(
            RUNJOB,
            cwd=tester.path,
            env=tester.env(PAUSE_AT_STEP="10", PATH=path_without_venv()),
            stdout=reader.stdin,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        reader.stdin.close()  # runjob holds the only way into the pipe
        _wait_for_step_10(tester, run)
        reader.send_signal(signum)
        assert reader.wait(timeout=30) == -signum, "the reader was not ended by the signal"
        os.killpg(run.pid, signum)
        return run.wait(timeout=RUN_TIMEOUT)
    finally:
        _kill_group(reader.pid)
        if run is not None:
            _kill_group(run.pid)


def stopped_with_its_output_closed(tester, signum: int, closed: str) -> subprocess.CompletedProcess:
    """``RUNJOB {closed}`` (``>&-``: stdout closed) from a shell; ``signum`` to it at step 10."""
    command = f"exec {shlex.join(RUNJOB)} {closed}"
    run = subprocess.Popen(
        ["bash", "-c", command],
        cwd=tester.path,
        env=tester.env(PAUSE_AT_STEP="10", PATH=path_without_venv()),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_step_10(tester, run)
        os.killpg(run.pid, signum)
        stdout, stderr = run.communicate(timeout=RUN_TIMEOUT)
    finally:
        _kill_group(run.pid)
    return subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)


def assert_killed_with_a_command_that_goes_on(tester, signum: int) -> str:
    """The checkpoint of step 10 written; the run KILLED in the local record and in MLflow, the
    command that goes on in its tag and in runjob.log; that command finishes the run. Returns the
    command."""
    out = tester.path / "out"
    assert (out / "checkpoints" / "step-00000010").is_dir()
    run = tester.record("out")
    assert run.record["status"] == "KILLED", run.record.get("tags", {}).get("runjob.error")
    assert run.mlflow.status == "KILLED", run.mlflow.tags.get("runjob.error")
    recorded = run.mlflow.tags["runjob.resume_command"]
    assert run.record["tags"]["runjob.resume_command"] == recorded
    log = (out / "runjob.log").read_text(encoding="utf-8")
    name = signal.Signals(signum).name
    checkpoint = Path("out", "checkpoints", "step-00000010")
    said = f"stopped by signal {signum} ({name}) at step 10 after writing checkpoint {checkpoint}"
    assert said in log
    found = re.findall(r"runjob: to go on: (.*)", log)
    assert found, log[-3000:]
    command = found[-1]
    assert command == recorded  # nothing secret in this job: the record is the command itself
    assert command == f"{shlex.join(RUNJOB[:3])} job.toml --output-dir out --resume"

    resumed = tester.cli(*shlex.split(command)[3:])  # as printed, in this process (test_resume_command.py pastes)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming step-00000010" in resumed.stdout
    assert tester.record("out").status == "FINISHED"
    return command


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_whose_reader_died_of_the_same_signal_keeps_the_work_and_says_how_to_go_on(stops, signum):  # noqa: F811
    stops.write_job("job.toml", SHORT_JOB)
    code = stopped_while_its_reader_dies(stops, signum)
    assert code == 128 + signum, (stops.path / "out" / "runjob.log").read_text()[-3000:]
    assert_killed_with_a_command_that_goes_on(stops, signum)
    seen = (stops.path / "seen.log").read_text()
    assert "runjob: stops: tiny_cnn on digits" in seen, "what the reader got before it died"
    said = "Ctrl-C" if signum == signal.SIGINT else signum.name
    log = (stops.path / "out" / "runjob.log").read_text()
    assert f"stderr: runjob: {said}: writing a checkpoint, then stopping" in log, "what it got no more is kept"


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("closed", "signum"), [(">&-", signal.SIGINT), (">&- 2>&-", signal.SIGTERM)], ids=["stdout", "stdout-and-stderr"]
)
def test_a_stop_of_a_run_with_its_output_closed_keeps_the_work_and_says_how_to_go_on(stops, closed, signum):  # noqa: F811
    stops.write_job("job.toml", SHORT_JOB)
    stopped = stopped_with_its_output_closed(stops, signum, closed)
    assert stopped.returncode == 128 + signum, stopped.stderr[-3000:]
    command = assert_killed_with_a_command_that_goes_on(stops, signum)
    if "2>&-" not in closed:
        assert f"runjob: to go on: {command}" in stopped.stderr


def test_a_stream_nobody_reads_goes_to_devnull_and_what_is_printed_to_it_to_the_runs_log(tmp_path):
    """The first failed write (a pipe whose reader has gone) marks the stream gone: its descriptor
    then points at /dev/null (so the interpreter's own flush at exit, a C library, a process
    started afterwards all write without failing), and each line printed, the failed one first, is
    kept in runjob.log as a terminal would have shown it (a progress bar's last drawing)."""
    from runjob.record.logfile import LibraryLog
    from runjob.record.terminal import TerminalStream

    read, write = os.pipe()
    os.close(read)  # the reader has gone
    raw = os.fdopen(write, "w")
    stream = TerminalStream(raw, "stderr")
    try:
        with LibraryLog("train") as log:
            log.open_in(tmp_path)
            assert stream.write("epoch 1/2  step 10\n") == len("epoch 1/2  step 10\n")
            assert stream.gone and not stream.isatty()
            print("train  10%\r train  50%\r train 100%", file=stream)
            print("half a line, ", end="", file=stream)
            stream.write("ended\n")
            stream.flush()
        assert os.path.samestat(os.fstat(write), os.stat(os.devnull))
        raw.write("after\n")
        raw.flush()  # no BrokenPipeError: the interpreter's last flush would not fail either
    finally:
        raw.close()
    kept = [line.split(" stderr: ", 1)[1] for line in (tmp_path / "runjob.log").read_text().splitlines()]
    assert kept == ["epoch 1/2  step 10", " train 100%", "half a line, ended"]
