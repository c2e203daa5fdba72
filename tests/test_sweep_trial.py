"""A sweep trial's typed context (values as values, never re-parsed text) and the outcome it sends
its worker through a pipe (issue 32: one sweep room)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runjob.errors import RunjobError
from runjob.job.jobfile import RawJob
from runjob.sweep.study import Claim, FileLock
from runjob.sweep.trial import TrialOutcome, receive, send, trial_callbacks
from runjob.sweep.worker import read_outcome
from runjob.train.request import TRIAL_ENVIRONMENT, TrialContext


def _context(**values: object) -> TrialContext:
    return TrialContext(
        study="s", number=3, storage="/tmp/s.journal", parent_run_id="p" * 32, keys=list(values), values=values
    )


@pytest.mark.timeout(30)
def test_a_trials_values_reach_its_job_as_the_values_themselves():
    """Through the environment (JSON checked by pydantic) and into the job, each value keeps its
    type, a float its every digit, an array or a table its shape; the run's record shows each as a
    --set would, and the trial's tags make its run a child of the parent."""
    context = _context(**{"optimizer.lr": 0.1 + 0.2, "train.batch_size": 64, "model.sizes": [8, {"a": "b"}]})
    back = TrialContext.from_environment({TRIAL_ENVIRONMENT: context.to_environment()})
    assert back == context
    raw = RawJob(Path("job.toml"), {"optimizer": {"lr": 1.0, "name": "adam"}}, overrides=["train.epochs=2"])
    back.apply(raw)
    assert raw.data["optimizer"] == {"lr": 0.30000000000000004, "name": "adam"}
    assert raw.data["train"]["batch_size"] == 64 and type(raw.data["train"]["batch_size"]) is int
    assert raw.data["model"]["sizes"] == [8, {"a": "b"}]
    assert raw.overrides[1:] == [
        "optimizer.lr=0.30000000000000004",
        "train.batch_size=64",
        'model.sizes=[8, { a = "b" }]',
    ]
    assert raw.origin("optimizer.lr").file == "--set optimizer.lr=0.30000000000000004"
    tags = back.tags()
    assert (tags["mlflow.parentRunId"], tags["runjob.sweep.trial"]) == ("p" * 32, "3")
    assert json.loads(tags["runjob.sweep.keys"]) == ["optimizer.lr", "train.batch_size", "model.sizes"]
    assert TrialContext.from_environment({}) is None
    with pytest.raises(RunjobError, match="RUNJOB_SWEEP_TRIAL: not a sweep trial's context"):
        TrialContext.from_environment({TRIAL_ENVIRONMENT: '{"study": "s"}'})


@pytest.mark.timeout(30)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="a trial is forked from its worker where it can be")
def test_a_forked_trials_outcome_comes_back_through_its_pipe_without_its_folder(tmp_path):
    """The worker learns the run, the metric and the pruning from what the trial sent: its folder
    holds no record and no metrics.jsonl; a trial that sent nothing failed, saying what it logged."""
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # the trial
        os.close(reading)
        send(writing, TrialOutcome(status="FINISHED", run_id="r1", metrics={"val/loss": 0.25}, pruned="pruned at 1"))
        os._exit(0)
    os.close(writing)
    os.waitpid(pid, 0)
    sent = receive(reading)
    assert sent == TrialOutcome(status="FINISHED", run_id="r1", metrics={"val/loss": 0.25}, pruned="pruned at 1")
    claim = Claim(0, {"optimizer.lr": 0.1}, tmp_path, FileLock(tmp_path / ".lock"), resumed=False)
    outcome = read_outcome(claim, 0, None, "val/loss", sent)
    assert (outcome.state, outcome.value, outcome.run_id, outcome.message) == ("pruned", 0.25, "r1", "pruned at 1")
    assert not any(tmp_path.iterdir()), "nothing read from, or written to, the trial's folder"
    unpruned = read_outcome(claim, 0, None, "val/loss", sent.model_copy(update={"pruned": None}))
    assert (unpruned.state, unpruned.value) == ("complete", 0.25)
    empty_read, empty_write = os.pipe()
    os.close(empty_write)
    assert receive(empty_read) is None
    failed = read_outcome(claim, 0, None, "val/loss", None)
    assert (failed.state, failed.message) == ("fail", "logged no 'val/loss'; it logged: nothing")


@pytest.mark.timeout(30)
def test_a_trial_gets_its_pruner_only_under_a_pruner_and_its_report_only_with_a_pipe(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    plain = _context(**{"optimizer.lr": 0.1})
    assert trial_callbacks(None) == {} and trial_callbacks(plain) == {}
    piped = plain.model_copy(update={"outcome_fd": 9, "pruner": "median"})
    assert sorted(trial_callbacks(piped)) == ["sweep_outcome", "sweep_pruning"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert sorted(trial_callbacks(piped)) == ["sweep_pruning"], "a launched trial's processes send nothing"
