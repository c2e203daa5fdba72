"""runjob's own lines go through one object (runjob.host.output): the main process's lines are said
once, by it alone; a line never lands in the middle of a progress bar; a stream nobody reads any more
costs a line, never the run; quiet silences the main process's lines, not a process's own failure."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import types

import pytest

import runjob
from runjob.host.output import Output, screen
from runjob.testing import FakeRun


@pytest.fixture
def streams(capsys):
    """What was said so far on stdout and stderr (``streams.out()``, ``streams.err()``)."""
    said = {"out": "", "err": ""}

    def read(name: str) -> str:
        captured = capsys.readouterr()
        said["out"] += captured.out
        said["err"] += captured.err
        return said[name]

    return types.SimpleNamespace(out=lambda: read("out"), err=lambda: read("err"))


def test_the_main_process_says_a_line_once_and_the_others_say_nothing(streams, monkeypatch):
    """Each of a run's processes calls say(); only the main one writes. Before the Accelerator
    exists the launcher's RANK decides; once built, the Accelerator does; forgotten, RANK again."""
    monkeypatch.delenv("RANK", raising=False)
    processes = {rank: Output() for rank in range(3)}
    for rank, output in processes.items():
        monkeypatch.setenv("RANK", str(rank))
        output.say("runjob: 3 process(es) on cpu")
        output.say("runjob: to go on: runjob run job.toml --resume", err=True)
    assert streams.out() == "runjob: 3 process(es) on cpu\n"
    assert streams.err() == "runjob: to go on: runjob run job.toml --resume\n"

    # the Accelerator's word outranks the environment, until it is forgotten
    monkeypatch.setenv("RANK", "0")
    other = Output()
    other.set_main(False)
    other.say("not from a second process")
    assert not other.main and "second process" not in streams.out()
    other.set_main(None)
    assert other.main


def test_every_process_says_its_own_lines(streams, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    worker = Output()
    worker.each("runjob: worker rank 1 exited with code 3", err=True)
    worker.each("runjob: sweep trial 4: starting in out/trial-0004")
    worker.say("runjob: the main process's line", err=True)
    assert streams.err() == "runjob: worker rank 1 exited with code 3\n"
    assert streams.out() == "runjob: sweep trial 4: starting in out/trial-0004\n"


def test_quiet_silences_the_main_process_lines_but_not_a_failure(streams, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    output = Output()
    with output.quieted():
        assert not output.speaks
        output.say("epoch 1/2  step 10  val/loss 0.5")
        output.say("runjob: the data's baselines: val/accuracy 0.1", err=True)
        output.each("runjob: failed", err=True)
    output.say("epoch 2/2  step 20  val/loss 0.4")
    assert streams.out() == "epoch 2/2  step 20  val/loss 0.4\n"
    assert streams.err() == "runjob: failed\n"


def test_a_line_said_under_a_live_progress_bar_takes_the_bar_out_of_its_way(monkeypatch):
    """The terminal shows stdout and stderr on one screen: the bar (stderr) is cleared to the start
    of its line before the line (stdout) is written, and drawn again after it, all under tqdm's lock."""
    from tqdm.auto import tqdm

    screen_text = io.StringIO()  # one terminal: both streams write into it
    monkeypatch.setattr(sys, "stdout", screen_text)
    monkeypatch.setattr(sys, "stderr", screen_text)
    monkeypatch.delenv("RANK", raising=False)
    lock = type(tqdm.get_lock()).th_lock  # the threads' lock under tqdm's write lock
    held = []
    write = screen_text.write

    def watched(text: str) -> int:
        if "val/loss" in text:  # the said line: is the bars' lock held while it is written?
            held.append(_held_elsewhere(lock))
        return write(text)

    monkeypatch.setattr(screen_text, "write", watched)
    bar = tqdm(total=10, desc="epoch 1/1", file=sys.stderr, mininterval=0, ascii=True, ncols=60)
    try:
        bar.update(4)
        before = screen_text.getvalue()
        assert "epoch 1/1:  40%" in before
        Output().say("step 4/10  val/loss 0.5")
        after = screen_text.getvalue()[len(before) :]
    finally:
        bar.close()
    head, said, tail = after.partition("step 4/10  val/loss 0.5\n")
    assert said, after
    assert head.endswith("\r") and "epoch" not in head, "the bar is cleared before the line"
    assert "epoch 1/1:  40%" in tail, "and drawn again after it"
    assert held == [True]


def _held_elsewhere(lock) -> bool:
    """Whether another thread would have to wait for ``lock`` (an RLock this thread may hold)."""
    got = []

    def take() -> None:
        got.append(lock.acquire(blocking=False))
        if got[-1]:
            lock.release()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join()
    return not got[0]


@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_a_stream_nobody_reads_any_more_costs_the_line_not_the_run(monkeypatch, closed):
    """A pipe whose reader has gone (EPIPE), a closed file, no stream at all: nothing raises."""
    read, write = os.pipe()
    os.close(read)  # the reader (tee, head) has gone
    dead = os.fdopen(write, "w")
    finished = io.StringIO()
    finished.close()
    monkeypatch.delenv("RANK", raising=False)
    output = Output()
    try:
        for stream in (dead, finished, None):
            monkeypatch.setattr(sys, closed, stream)
            output.say("runjob: finished digits in 3s", err=closed == "stderr")
            output.each("runjob: stopped by SIGTERM", err=closed == "stderr")
    finally:
        monkeypatch.undo()
        try:
            dead.close()
        except BrokenPipeError:
            pass


def test_a_command_keeps_a_line_its_terminal_did_not_take_in_the_runs_log(tmp_path, monkeypatch):
    """During a command the streams are runjob.record.terminal's: the line said to a dead pipe is
    kept in runjob.log, as the stop's lines of tests/test_broken_pipe.py are."""
    from runjob.record.logfile import LibraryLog
    from runjob.record.terminal import TerminalStream

    read, write = os.pipe()
    os.close(read)
    raw = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stderr", TerminalStream(raw, "stderr"))
    monkeypatch.delenv("RANK", raising=False)
    try:
        with LibraryLog("train") as log:
            log.open_in(tmp_path)
            Output().say("runjob: SIGTERM: writing a checkpoint, then stopping", err=True)
    finally:
        monkeypatch.undo()
        raw.close()  # its descriptor now points at /dev/null: closing does not fail
    assert "stderr: runjob: SIGTERM: writing a checkpoint, then stopping" in (tmp_path / "runjob.log").read_text()


def test_a_plugin_says_a_line_through_its_run_or_runjob_say(streams, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(screen, "_main", None)
    FakeRun().say("runjob: ema: the model now holds the average of 10 step(s)")
    other = types.SimpleNamespace(is_main_process=False, num_processes=2, process_index=1)
    FakeRun(accelerator=other).say("runjob: from a second process")
    runjob.say("runjob: model.pretrained: resnet18 from the cache")
    assert streams.out().splitlines() == [
        "runjob: ema: the model now holds the average of 10 step(s)",
        "runjob: model.pretrained: resnet18 from the cache",
    ]


def test_the_output_module_imports_no_heavy_library():
    """runjob validate and --help use it: it imports neither torch, accelerate, mlflow nor tqdm."""
    code = (
        "import sys, runjob.host.output as o; o.screen.say('ok'); "
        "print(sorted(m for m in ('torch', 'accelerate', 'mlflow', 'tqdm') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == "ok\n[]\n"


@pytest.mark.parametrize(("value", "bars"), [(None, True), ("1", False), ("true", False), ("0", True), ("", True)])
def test_tqdm_disable_turns_the_progress_bars_off(monkeypatch, value, bars):
    """``TQDM_DISABLE=1``, tqdm's own switch, turns runjob's bars off too (the training loop's,
    ``runjob data convert``'s); runjob's lines are still said."""
    monkeypatch.delenv("RANK", raising=False)
    if value is None:
        monkeypatch.delenv("TQDM_DISABLE", raising=False)
    else:
        monkeypatch.setenv("TQDM_DISABLE", value)
    assert screen.bars is bars
    assert screen.speaks
