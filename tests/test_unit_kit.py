"""runjob.testing's unit kit: evaluate_task runs the loop's own evaluation code, a FakeRun records
what a callback does through the run, and drive() sends a callback the loop's events in the
loop's order (checked against a real run)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import SMALL_DIGITS, documented_python

import runjob
from runjob.errors import TrainingError
from runjob.host.run_context import Run, RunParts
from runjob.testing import FakeJob, FakeRun, NotFaked, drive, evaluate_task


def classification(top_k=None):
    from runjob_builtins.tasks import Classification, ClassificationOptions

    options = ClassificationOptions(top_k=top_k)
    return Classification(options, 4), options


def test_evaluate_task_reports_what_the_loops_evaluation_reports():
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    from runjob.train.accelerator import forget_accelerator
    from runjob.train.loop import evaluate

    torch.manual_seed(0)
    inputs, targets = torch.randn(30, 5), torch.randint(0, 4, (30,))
    model = torch.nn.Linear(5, 4)
    task, options = classification(top_k=2)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=7)  # an uneven last batch
    job = SimpleNamespace(train=SimpleNamespace(channels_last=False), task=SimpleNamespace(name="c", options=options))
    try:
        run = Run(RunParts(job, Accelerator(cpu=True), model, task, Path("."), val_loader=loader))
        from_the_loop = evaluate(run, loader, "test")
    finally:
        forget_accelerator()

    with torch.no_grad():
        pairs = [(model(x), (x, y)) for x, y in loader]
    metrics = evaluate_task(task, pairs, options, prefix="test")
    assert metrics == from_the_loop
    assert list(metrics) == ["test/accuracy", "test/loss", "test/top2"], "declared first, with the split's prefix"
    with torch.no_grad():
        right = (model(inputs).argmax(1) == targets).double().mean().item()
    assert metrics["test/accuracy"] == pytest.approx(right)
    assert evaluate_task(task, pairs, options)["val/accuracy"] == metrics["test/accuracy"]


def test_evaluate_task_stops_where_the_host_stops_a_run():
    import torch

    task, options = classification()
    logits, batch = torch.eye(4)[[0, 1, 2, 3]], (None, torch.tensor([0, 1, 2, 0]))
    assert evaluate_task(task, [(logits, batch)], options)["val/accuracy"] == 0.75

    class NoLoss(type(task)):
        def summarize(self, totals, count):
            return {"accuracy": totals["correct"] / count}

    with pytest.raises(TrainingError) as missing:
        evaluate_task(NoLoss(options, 4), [(logits, batch)], options, name="no_loss")
    assert str(missing.value) == (
        "task 'no_loss' declares loss but its summarize() did not return it (it returned: accuracy)"
    )

    class Scalar(type(task)):
        def evaluate(self, outputs, batch):
            return {"loss": outputs.sum()}

    with pytest.raises(TrainingError, match=r"evaluate\(\) must return a dict of tensors whose first dimension"):
        evaluate_task(Scalar(options, 4), [(logits, batch)], options)


def test_a_fake_run_records_what_a_callback_does_through_the_run_context(tmp_path):
    import torch
    from safetensors.torch import load_file

    run = FakeRun(output_dir=tmp_path, job=FakeJob({"val/accuracy": "max"}), model=torch.nn.Linear(2, 1))
    assert isinstance(run, runjob.Run) and run.accelerator.is_main_process
    assert run.job.metrics == {"val/accuracy": "max"}
    run.step = 7
    run.log({"val/gap": 1})
    run.set_tags({"verdict": 3})
    (tmp_path / "notes.txt").write_text("x")
    run.log_artifact(tmp_path / "notes.txt", "notes")
    with pytest.raises(ValueError, match="artifacts must be inside the output folder"):
        run.log_artifact(tmp_path.parent / "elsewhere.txt")
    saved = run.save_model(tmp_path / "snapshot")
    run.request_stop("first")
    run.request_stop("second")

    assert (
        run.logs == [(7, {"val/gap": 1.0})] and run.logged == {"val/gap": 1.0} and run.history("val/gap") == [(7, 1.0)]
    )
    assert run.tags == {"verdict": "3"}
    assert run.artifacts == [(tmp_path / "notes.txt", "notes")]
    assert run.saved_models == [tmp_path / "snapshot"] and set(load_file(saved)) == {"weight", "bias"}
    assert run.stop_requests == [(7, "first"), (7, "second")] and run.stop_reason == "first", "the first reason wins"

    bare = FakeRun()
    with pytest.raises(NotFaked, match=r"no run\.model: give it, FakeRun\(model=\.\.\.\)"):
        _ = bare.model
    with pytest.raises(NotFaked, match=r"no run\.output_dir"):
        bare.log_artifact("x")
    with pytest.raises(NotFaked, match=r"has no 'gather'.*Accelerator\(cpu=True\)"):
        _ = bare.accelerator.gather
    with pytest.raises(NotFaked, match="FakeJob has no 'train'"):
        _ = FakeJob({}).train


def test_a_fake_run_has_everything_the_readme_promises_a_callback():
    page, _ = documented_python("# my_callbacks/__init__.py\n")  # the page on writing a callback
    section = page.read_text(encoding="utf-8")
    promised = set(re.findall(r"\brun\.(\w+)", section))
    assert {"log", "request_stop", "save_model", "job", "accelerator"} <= promised
    assert [name for name in sorted(promised) if not hasattr(FakeRun, name) and name not in FakeRun.SETTABLE] == []


JOURNAL = '''
import json
from pathlib import Path

import runjob
from pydantic import Field


class JournalOptions(runjob.CallbackOptions):
    stop_at: int = Field(0, ge=0)

    def metrics(self):
        return {"train/journal": "min"}


class Journal(runjob.Callback):
    """Notes every event it gets; logs at each log step; asks to stop at step stop_at."""

    def __init__(self, options):
        self.stop_at = options.stop_at
        self.events = []

    def note(self, run, event, step, epoch):
        self.events.append([event, step, epoch])

    def on_run_start(self, run):
        self.note(run, "on_run_start", run.step, run.epoch)

    def on_epoch_start(self, run, step, epoch):
        self.note(run, "on_epoch_start", step, epoch)

    def on_batch(self, run, step, epoch, batch):
        self.note(run, "on_batch", step, epoch)

    def on_step(self, run, step, epoch, loss):
        self.note(run, "on_step", step, epoch)
        if step == self.stop_at:
            run.request_stop("journal: enough")

    def on_log(self, run, step, epoch, metrics):
        self.note(run, "on_log", step, epoch)
        run.log({"train/journal": step + epoch})

    def on_evaluation_start(self, run, step, epoch):
        self.note(run, "on_evaluation_start", step, epoch)

    def on_evaluation(self, run, step, epoch, metrics):
        self.note(run, "on_evaluation", step, epoch)

    def on_evaluation_end(self, run, step, epoch):
        self.note(run, "on_evaluation_end", step, epoch)

    def on_epoch_end(self, run, step, epoch):
        self.note(run, "on_epoch_end", step, epoch)

    def on_train_end(self, run, step, epoch):
        self.note(run, "on_train_end", step, epoch)

    def on_run_end(self, run, status, error):
        self.note(run, "on_run_end", run.step, run.epoch)
        if run.accelerator.is_main_process:
            Path(run.output_dir, "journal.json").write_text(json.dumps(self.events))


@runjob.hookimpl
def runjob_register_callbacks(register):
    register("journal", Journal, options=JournalOptions)
'''


@pytest.mark.timeout(300)
def test_drive_sends_the_events_a_real_run_sends_in_its_order(tester, tmp_path):
    site = tester.install_plugin("journal", {"journal_cb": JOURNAL}, {"journal": "journal_cb"})
    tester.write_job("job.toml", SMALL_DIGITS.format(name="journal") + "    [callbacks.journal]\n    stop_at = 14\n")
    # 5 full batches an epoch (180 training scans of 32); logs every 4 and at each epoch's end,
    # evaluations every 3 and at each epoch's end; the stop asked at step 14 is in the third epoch
    settings = ["dataset.val_fraction=0.9", "train.epochs=3", "train.log_every=4", "train.eval_every=3"]
    real = tester.run("job.toml", *settings, "tracking.offline=true", output_dir="out")
    assert real.status == "FINISHED" and real.tags["runjob.stopped.step"] == "14"
    events = [tuple(event) for event in json.loads((real.output_dir / "journal.json").read_text())]
    per_epoch = next(step for event, step, epoch in events if event == "on_epoch_start" and epoch == 1)
    assert per_epoch == 5

    journal = site / "journal_cb.py"
    namespace: dict = {}
    exec(compile(journal.read_text(), str(journal), "exec"), namespace)  # the same callback, without a run
    accuracy = dict(real.local_history("val/accuracy"))
    (tmp_path / "driven").mkdir()
    driven = drive(
        namespace["Journal"](namespace["JournalOptions"](stop_at=14)),
        steps=15,
        steps_per_epoch=per_epoch,
        log_every=4,
        eval_every=3,
        evaluations=lambda step: {"val/accuracy": accuracy[step]},
        batches=lambda done: None,  # the journal notes on_batch, not the batch
        run=FakeRun(output_dir=tmp_path / "driven"),
    )
    assert driven.events == events
    assert json.loads((tmp_path / "driven" / "journal.json").read_text()) == [list(event) for event in events]
    assert driven.history("train/journal") == real.local_history("train/journal")
    assert [step for step, _ in driven.history("val/accuracy")] == list(accuracy)
    assert driven.stop_reason == "journal: enough" and driven.step == 14


def test_drive_says_what_it_needs_and_names_a_failing_callback():
    class Reader(runjob.Callback):
        def on_evaluation(self, run, step, epoch, metrics):
            run.log({"val/seen": metrics["val/accuracy"]})

    with pytest.raises(ValueError, match="a callback listens to on_evaluation: give evaluations="):
        drive(Reader(), steps=3)
    with pytest.raises(ValueError, match=r"evaluates at step 3 \(the end of epoch 0\): evaluations has no metrics"):
        drive(Reader(), steps=3, evaluations={2: {"val/accuracy": 0.5}})
    with pytest.raises(ValueError, match="losses has 2 items for 3 steps"):
        drive(Reader(), steps=3, losses=[1.0, 2.0], evaluations={3: {"val/accuracy": 0.5}})

    run = drive({"reader": Reader()}, steps=4, log_every=2, losses=[4, 2, 1, 1], evaluations={4: {"val/accuracy": 0.5}})
    assert run.logs == [
        (2, {"train/loss": 3.0, "lr": 0.001}),
        (4, {"train/loss": 1.0, "lr": 0.001}),
        (4, {"val/accuracy": 0.5}),
        (4, {"val/seen": 0.5}),
    ]

    class Broken(runjob.Callback):
        def on_log(self, run, step, epoch, metrics):
            raise KeyError("train/nothing")

    with pytest.raises(TrainingError, match=r"callback 'broken' failed in on_log at step 2: KeyError"):
        drive({"broken": Broken()}, steps=4, log_every=2)


def test_the_old_name_runcontext_still_builds_a_run_with_a_deprecation_warning(tmp_path):
    with pytest.warns(DeprecationWarning, match=r"runjob.RunContext is now runjob.Run"):
        legacy = runjob.RunContext
    run = legacy(FakeJob({}), None, "model", None, None, None, "loader", tmp_path, task="task")
    assert isinstance(run, runjob.Run) and (run.model, run.val_loader, run.task) == ("model", "loader", "task")
    with pytest.raises(AttributeError):
        run.step = 3  # the loop alone moves a real run's position
