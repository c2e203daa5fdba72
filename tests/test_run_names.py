"""What a run is called and records about itself, so runs read apart in `mlflow ui`: default names
that lead with what differs, params without the values nobody set, the headline metrics first.

All in-process: the real sweep (trials named, the headline metric first in MLflow) is in
test_sweep.py, and `runjob runs`' choice of keys in test_run_queries.py.
"""

from __future__ import annotations

import pytest
from helpers import RESNET18_DIGITS

from runjob.host.plugin_host import load_plugins
from runjob.job.validation import load_resolved
from runjob.record.naming import HeadlineFirst, headline_metrics, recorded_params, run_name
from runjob.sweep.study import SweepStudy
from runjob.sweep.worker import override
from runjob.testing import write_job
from runjob.train.entry import SWEEP_TRIAL_TAG
from runjob.train.runner import default_run_name

NESTED_NAME_SHOWN = 14  # characters of a sweep trial's name mlflow ui's runs table showed (MLflow 3.17, 1600 px)

SWEEP = """
    [sweep]
    method = "random"
    trials = 3
    seed = 3
    [sweep.parameters]
    "optimizer.lr" = { low = 0.003, high = 0.1, log = true }
    "train.batch_size" = [32, 64]
"""


@pytest.mark.timeout(60)
def test_three_sweep_trials_are_named_apart_within_what_the_runs_table_shows(tmp_path):
    job_file = tmp_path / "job.toml"
    write_job(job_file, RESNET18_DIGITS.format(name="sw") + SWEEP)
    host = load_plugins()
    sweep = load_resolved(job_file, [], host).sweep
    study = SweepStudy.create(sweep, tmp_path / "sweep", "names")
    study.join()
    names = []
    for index in range(3):
        claim = study.claim()
        claim.lock.release()
        study.tell(claim.number, 0.0, "complete")
        # as `runjob sweep JOB --set train.epochs=2` starts the trial: the sweep's --set, then the trial's
        sets = [override(key, value) for key, value in claim.values.items()]
        job = load_resolved(job_file, ["train.epochs=2", *sets], host)
        names.append(default_run_name(job, claim.output_dir, {SWEEP_TRIAL_TAG: str(index)}))

    assert len({name[:NESTED_NAME_SHOWN] for name in names}) == 3, names
    assert len({name[:25] for name in names}) == 3, names
    for name in names:
        lr, batch_size, rest = name.split(" ", 2)
        assert lr.startswith("lr=0.") and len(lr) <= 11, "the learning rate to 4 significant digits"
        assert batch_size in ("bs=32", "bs=64") and rest == "· sw", "not the sweep's own --set train.epochs=2"


@pytest.mark.timeout(30)
def test_a_plain_run_is_named_by_its_overrides_abbreviated_or_its_folder():
    overrides = [
        "optimizer.lr=0.1",
        "optimizer.lr=0.0031622776601683794",  # the last value of a key is the job's
        "train.batch_size=64",
        "model.name=resnet50",
        "dataset.api_token=abc",
        "tracking.uri=http://host:5000",  # where it is recorded does not tell the training apart
        "model.dropout=0.1",
        "dataset.dropout=0.2",
    ]
    assert run_name(overrides, "20261204-094512", "digits") == (
        "lr=0.003162 bs=64 model=resnet50 api_token=*** model.dropout=0.1 dataset.dropout=0.2 · digits"
    )
    assert run_name(["tracking.experiment=x"], "20261204-094512", "digits") == "20261204-094512 · digits"


@pytest.mark.timeout(60)
def test_params_leave_out_the_default_callbacks_options_nobody_set(tmp_path):
    job_file = tmp_path / "job.toml"
    write_job(job_file, RESNET18_DIGITS.format(name="params") + "[callbacks.ema]\ndecay = 0.99\n")
    host = load_plugins()
    params = recorded_params(load_resolved(job_file, [], host))
    callbacks = {key: value for key, value in params.items() if key.startswith("callbacks.")}
    assert callbacks == {
        "callbacks.ema.enabled": "true",
        "callbacks.ema.decay": "0.99",
        "callbacks.ema.warmup_steps": "0",
    }
    assert params["optimizer.name"] == "adamw" and params["train.cpu"] == "false", "the job's own defaults stay"

    switched = recorded_params(
        load_resolved(job_file, ["callbacks.throughput.enabled=false", "callbacks.best_weights.enabled=true"], host)
    )
    assert switched["callbacks.throughput.enabled"] == "false"
    assert "callbacks.best_weights.enabled" not in switched, "set, but to what it is anyway"


@pytest.mark.timeout(30)
def test_a_new_runs_first_metrics_reach_mlflow_headline_first():
    headline = headline_metrics(
        {"train.best_metric": "val/r2"}, {"runjob.metrics": '{"val/mae": "min", "val/r2": "max", "val/loss": "min"}'}
    )
    assert headline == ["val/r2", "val/mae", "val/loss"]
    now = [0.0]
    first = HeadlineFirst(headline, clock=lambda: now[0])

    def points(step: int, *keys: str) -> list[dict]:
        return [{"key": key, "value": 1.0, "step": step, "timestamp": step} for key in keys]

    assert first.take(points(10, "train/loss", "lr")) == [], "held until the first evaluation"
    assert first.take(points(20, "train/loss", "lr")) == []
    sent = first.take(points(22, "val/loss", "val/mae", "val/r2"))
    assert [(p["key"], p["step"]) for p in sent] == [
        ("val/r2", 22),
        ("val/mae", 22),
        ("val/loss", 22),
        ("train/loss", 10),
        ("lr", 10),
        ("train/loss", 20),
        ("lr", 20),
    ]
    assert first.take(points(30, "train/loss")) == points(30, "train/loss"), "then everything goes as it comes"

    slow = HeadlineFirst(headline, clock=lambda: now[0])  # a long first epoch: live charts wait a minute at most
    assert slow.take(points(10, "train/loss")) == []
    now[0] = HeadlineFirst.WAIT_S
    assert slow.take(points(20, "train/loss")) == points(10, "train/loss") + points(20, "train/loss")
    ended = HeadlineFirst(headline, clock=lambda: now[0])  # a run that ends before evaluating sends what it has
    ended.take(points(10, "train/loss"))
    assert ended.release() == points(10, "train/loss") and ended.release() == []
