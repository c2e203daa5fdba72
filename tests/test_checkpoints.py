"""Checkpoint files: atomic writes, pruning, and a full disk that loses nothing already saved."""

from __future__ import annotations

import errno
from pathlib import Path
from types import SimpleNamespace

import pytest

import runjob
from runjob.errors import RunjobError, TrainingError
from runjob.host.events import Dispatcher
from runjob.train.checkpoints import (
    Position,
    compare_jobs,
    complete_checkpoints,
    load_checkpoint,
    save_checkpoint,
    tidy_finished,
)


class OneProcess:
    """Just enough of an Accelerator for one process: save_state writes a marker file."""

    is_main_process = True

    def __init__(self, fail_with: OSError | None = None):
        self.fail_with = fail_with

    def wait_for_everyone(self):
        pass

    def load_state(self, folder):
        pass

    def save_state(self, folder, safe_serialization=True):
        if self.fail_with:
            (Path(folder) / "partial.bin").write_bytes(b"half")
            raise self.fail_with
        (Path(folder) / "model.safetensors").write_bytes(b"weights")


def run_in(tmp_path, accelerator):
    return SimpleNamespace(accelerator=accelerator, output_dir=tmp_path, scheduler=None, callbacks={})


def test_checkpoints_are_kept_to_the_limit(tmp_path):
    run = run_in(tmp_path, OneProcess())
    for step in (3, 6, 9):
        save_checkpoint(run, Position(step, 0, step), keep=2, extra={}, events=Dispatcher(run, {}))
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-00000006", "step-00000009"]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path):
    first = run_in(tmp_path, OneProcess())
    save_checkpoint(first, Position(5, 0, 5), keep=2, extra={}, events=Dispatcher(first, {}))
    full = run_in(tmp_path, OneProcess(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(RunjobError) as caught:
        save_checkpoint(full, Position(10, 0, 10), keep=2, extra={}, events=Dispatcher(full, {}))
    message = str(caught.value)
    assert f"cannot write checkpoint {tmp_path / 'checkpoints' / 'step-00000010'}: No space left on device" in message
    assert f"the last complete checkpoint, {tmp_path / 'checkpoints' / 'step-00000005'}, is intact" in message
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-00000005"]
    assert (tmp_path / "checkpoints" / "step-00000005" / "model.safetensors").read_bytes() == b"weights"


class Counting(runjob.Callback):
    """Keeps a count in its checkpointed state; told to fail on saving or on loading it."""

    def __init__(self, fail_on: str = ""):
        self.count, self.fail_on = 7, fail_on

    def state_dict(self):
        if self.fail_on == "save":
            raise RuntimeError("cannot count")
        return {"count": self.count}

    def load_state_dict(self, state):
        if self.fail_on == "load":
            raise KeyError("total")  # a callback whose state's keys changed between versions
        self.count = state["count"]


def test_a_callbacks_state_goes_through_the_dispatcher_and_comes_back(tmp_path):
    run = run_in(tmp_path, OneProcess())
    saved = save_checkpoint(
        run, Position(4, 0, 4), keep=2, extra={"job": {}}, events=Dispatcher(run, {"c": Counting()})
    )
    (saved / "runjob_state.json").write_text('{"step": 4, "epoch": 0, "batches_done": 4}')
    again = Counting()
    again.count = 0
    assert load_checkpoint(run, saved, Dispatcher(run, {"c": again})) == Position(4, 0, 4)
    assert again.count == 7


def test_a_callback_failing_to_save_or_load_its_state_is_named_not_a_damaged_checkpoint(tmp_path):
    run = run_in(tmp_path, OneProcess())
    with pytest.raises(
        TrainingError, match=r"^callback 'c' \(plugin 'counts'\) failed in state_dict at step 9: RuntimeError"
    ):
        save_checkpoint(
            run,
            Position(9, 0, 9),
            keep=2,
            extra={},
            events=Dispatcher(run, {"c": Counting("save")}, plugins={"c": "counts"}, step=lambda: 9),
        )
    saved = save_checkpoint(run, Position(4, 0, 4), keep=2, extra={}, events=Dispatcher(run, {"c": Counting()}))
    (saved / "runjob_state.json").write_text('{"step": 4, "epoch": 0, "batches_done": 4}')
    with pytest.raises(TrainingError) as caught:
        load_checkpoint(run, saved, Dispatcher(run, {"c": Counting("load")}, step=lambda: 4))
    assert str(caught.value) == f"callback 'c' failed in load_state_dict loading {saved}: KeyError: 'total'"
    (saved / "callbacks.pt").write_bytes(b"not a torch file")  # a damaged file is the checkpoint's
    with pytest.raises(RunjobError, match=r"^cannot load checkpoint .*step-00000004: "):
        load_checkpoint(run, saved, Dispatcher(run, {"c": Counting()}))


def test_job_comparison_separates_refused_and_allowed_changes():
    saved = {
        "model": {"name": "resnet18", "num_classes": 10},
        "optimizer": {"name": "sgd", "lr": 0.1},
        "dataset": {"name": "digits", "num_workers": 0},
    }
    now = {
        "model": {"name": "resnet34", "num_classes": 10},
        "optimizer": {"name": "sgd", "lr": 0.05},
        "dataset": {"name": "digits", "num_workers": 4},
    }
    refused, allowed = compare_jobs(saved, now)
    assert refused == ["model.name: resnet18 -> resnet34"]
    assert allowed == ["dataset.num_workers: 0 -> 4", "optimizer.lr: 0.1 -> 0.05"]


def finished_run(folder: Path, steps: list[int], weights: bytes) -> Path:
    """An output folder as a finished run leaves it: checkpoints (each with its weights and its
    optimizer), the final weights, and best/ holding the same bytes as the final ones."""
    for step in steps:
        checkpoint = folder / "checkpoints" / f"step-{step:08d}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "runjob_state.json").write_text("{}")
        (checkpoint / "model.safetensors").write_bytes(weights if step == steps[-1] else b"older" * 1000)
        (checkpoint / "optimizer.bin").write_bytes(b"o" * 20_000)
    (folder / "best").mkdir()
    (folder / "best" / "model.safetensors").write_bytes(weights)  # named by best_weights, as a run does:
    (folder / "models.json").write_text('{"best": {"weights": "best/model.safetensors", "summary": ""}}')
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def test_a_finished_run_keeps_what_resume_needs_and_its_weights_once(tmp_path):
    weights = bytes(range(256)) * 400
    out = finished_run(tmp_path / "out", [40, 80], weights)
    said = tidy_finished(out, keep=1)
    assert [p.name for p in complete_checkpoints(out)] == ["step-00000080"], "the newest: --resume can extend the run"
    final = out / "model.safetensors"
    for copy in (out / "best" / "model.safetensors", out / "checkpoints" / "step-00000080" / "model.safetensors"):
        assert copy.read_bytes() == weights and copy.samefile(final), copy
    assert said.startswith("kept 1 checkpoint(s) of the finished run (train.keep_checkpoints_finished); ")
    assert tidy_finished(out, keep=1) is None, "nothing more to do: nothing said"

    bare = finished_run(tmp_path / "bare", [40], weights)
    tidy_finished(bare, keep=0)
    assert complete_checkpoints(bare) == [] and (bare / "best" / "model.safetensors").read_bytes() == weights
