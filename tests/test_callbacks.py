"""Callbacks a job switches on: validated like components, able to log into the run's record, stop
the run cleanly and keep state across a resume; one that breaks is named."""

from __future__ import annotations

import json
import re

import pytest
from helpers import SMALL_DIGITS, uploaded_best

from runjob.host.plugin_host import load_plugins

pytestmark = pytest.mark.timeout(300)

WATCHER = '''
"""A callback that logs a metric of its own and can be told to fail."""
import runjob
from pydantic import Field


class WatcherOptions(runjob.CallbackOptions):
    fail_at: int = Field(0, ge=0)

    def metrics(self):
        return {"val/error_rate": "min"}


class Watcher(runjob.Callback):
    def __init__(self, options):
        self.fail_at = options.fail_at
        self.evaluations = 0

    def on_step(self, run, step, epoch, loss):
        if step == self.fail_at:
            raise ZeroDivisionError("the watcher was told to fail")

    def on_evaluation(self, run, step, epoch, metrics):
        self.evaluations += 1
        run.log({"val/error_rate": 1.0 - metrics["val/accuracy"], "val/evaluations": self.evaluations})

    def state_dict(self):
        return {"evaluations": self.evaluations}

    def load_state_dict(self, state):
        self.evaluations = state["evaluations"]


@runjob.hookimpl
def runjob_register_callbacks(register):
    register("watcher", Watcher, options=WatcherOptions)
'''


@pytest.fixture
def watched(tester):
    tester.install_plugin("watcher", {"watcher": WATCHER}, {"watcher": "watcher"})
    return tester


def test_callbacks_are_checked_before_the_run(watched):
    job = (
        SMALL_DIGITS.format(name="checked")
        + """
    best_metric = "val/error_rate"
    [callbacks.early_stoping]
    [callbacks.watcher]
    fail_at = "3"
    [callbacks.early_stopping]
    metric = "val/acuracy"
    """
    )
    watched.write_job("job.toml", job)
    result = watched.cli("validate", "job.toml")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    known = ", ".join(sorted(load_plugins().components["callback"]))  # the installed plugin packages' too
    assert {"early_stopping", "ema", "watcher"} <= set(known.split(", "))
    assert result.stderr_lines == [
        "runjob: job.toml:12: callbacks.early_stoping: unknown callback 'early_stoping'; did you mean "
        f"'early_stopping'? Known callbacks: {known}",
        "runjob: job.toml:14: callbacks.watcher.fail_at: Input should be a valid integer (got '3')",
    ], "metrics are checked once the callbacks are right: the watcher may be what declares one"
    watched.write_job("job.toml", job.replace("[callbacks.early_stoping]", "").replace('"3"', "3"))
    result = watched.cli("validate", "job.toml")
    assert result.returncode == 2
    assert result.stderr_lines == [
        "runjob: job.toml:16: callbacks.early_stopping.metric: 'val/acuracy' is not a metric of the task or the "
        "callbacks; did you mean 'val/accuracy'? they report: val/accuracy, val/loss, test/accuracy, test/loss, "
        "train/loss, train/tflops, train/mfu, train/peak_memory_gib, train/peak_rss_gib, val/error_rate"
    ], "best_metric = val/error_rate is the watcher's: no problem there"


def test_early_stopping_ends_the_run_finished_with_its_models(watched):
    watched.write_job(
        "job.toml",
        SMALL_DIGITS.format(name="patience")
        + """
    epochs = 6
    [callbacks.early_stopping]
    metric = "val/loss"
    patience = 1
    min_delta = 100.0
    """,
    )
    result = watched.cli("job.toml")
    assert result.returncode == 0, result.stderr[-2000:]
    run = watched.only_run("patience")
    assert run.status == "FINISHED"
    assert run.tags["runjob.stopped"].startswith("early_stopping: val/loss did not improve on")
    assert run.tags["runjob.stopped.step"] == "88", "two evaluations: the first sets the best, the second waits"
    assert run.steps("val/loss") == [44, 88]
    assert run.models() == {"patience"}, "the final weights, in the logged model"
    assert run.artifacts("best") == uploaded_best(run.tags["runjob.output_dir"])
    assert "runjob: stopping at step 88: early_stopping" in result.stdout


def test_a_callbacks_metric_reaches_the_record_and_can_pick_the_best(watched):
    watched.write_job(
        "job.toml",
        SMALL_DIGITS.format(name="logged")
        + """
    epochs = 2
    best_metric = "val/error_rate"
    [tracking]
    offline = true
    [callbacks.watcher]
    """,
    )
    result = watched.cli("job.toml", "--output-dir", "out")
    assert result.returncode == 0, result.stderr[-2000:]
    points = [json.loads(line) for line in (watched.path / "out" / "metrics.jsonl").read_text().splitlines()]
    rates = [(p["step"], p["value"]) for p in points if p["key"] == "val/error_rate"]
    accuracy = [(p["step"], p["value"]) for p in points if p["key"] == "val/accuracy"]
    assert [step for step, _ in rates] == [44, 88]
    assert [value for _, value in rates] == pytest.approx([1 - value for _, value in accuracy])
    best = json.loads((watched.path / "out" / "best" / "best.json").read_text())
    assert best["metric"] == "val/error_rate" and best["value"] == pytest.approx(min(v for _, v in rates))
    epoch_lines = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    shown = [re.search(r"  val/error_rate (\S+)  ", line) for line in epoch_lines]
    assert len(epoch_lines) == 2 and all(shown), "each epoch line shows the callback's metric, as the task's"
    assert [float(found.group(1)) for found in shown] == pytest.approx([value for _, value in rates], abs=5e-4)
    (finished,) = [line for line in result.stdout.splitlines() if line.startswith("runjob: finished logged")]
    assert finished.endswith(f": val/error_rate {rates[-1][1]:.4g}"), "the run ends with the best_metric's value"
    synced = watched.cli("sync", "out")
    assert synced.returncode == 0, synced.stderr[-2000:]
    run = watched.only_run("logged")
    assert run.history("val/error_rate") == rates


def test_a_failing_callback_is_named_and_the_run_fails(watched):
    watched.write_job("job.toml", SMALL_DIGITS.format(name="failing") + "[callbacks.watcher]\nfail_at = 3\n")
    result = watched.cli("job.toml")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr_lines[-1] == (
        "runjob: callback 'watcher' failed in on_step at step 3: ZeroDivisionError: the watcher was told to fail"
    )
    assert watched.only_run("failing").status == "FAILED"


def test_a_callbacks_state_goes_into_checkpoints_and_comes_back(watched):
    watched.write_job("job.toml", SMALL_DIGITS.format(name="stateful") + "epochs = 3\n[callbacks.watcher]\n")
    first = watched.cli("job.toml", "--output-dir", "out", "--set", "train.max_steps=88")
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = watched.cli("job.toml", "--output-dir", "out", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    points = [json.loads(line) for line in (watched.path / "out" / "metrics.jsonl").read_text().splitlines()]
    counted = [(p["step"], p["value"]) for p in points if p["key"] == "val/evaluations"]
    assert counted == [(44, 1.0), (88, 2.0), (132, 3.0)], "the count went on from the checkpoint"
