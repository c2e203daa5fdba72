"""What the rooms promise each other and a plugin author: a strategy states its facts at
registration and validate warns with them (built-in or not), extra tags reach a run as arguments,
the resume check compares whole values, and the local record is one typed file."""

from __future__ import annotations

import json

import pytest
from helpers import SMALL_DIGITS

from runjob.errors import RunjobError
from runjob.host.plugin_host import load_plugins
from runjob.record.local import RUN_RECORD, RunRecord, read_metric_points
from runjob.train.checkpoints import compare_jobs

GPU_STRATEGY = """
    import runjob

    def build(options):
        return runjob.StrategyPlan()

    @runjob.hookimpl
    def runjob_register_strategies(register):
        register("my_gpu_only", build, needs_gpu=True)
        register("my_one_process", build, max_processes=1)
"""


def test_a_third_party_strategy_gets_the_built_ins_warnings_from_what_it_states(tester):
    tester.install_plugin("fake-strategies", {"fake_strategies": GPU_STRATEGY}, {"mine": "fake_strategies"})
    tester.write_job("job.toml", SMALL_DIGITS.format(name="facts"))
    host = load_plugins()
    assert host.components["strategy"]["my_gpu_only"].facts == {
        "needs_gpu": True,
        "max_processes": None,
        "libraries": (),
    }
    assert host.components["strategy"]["fsdp"].facts["needs_gpu"] is True  # the built-ins state theirs the same way

    gpu = tester.cli("validate", "job.toml", "--set", "strategy.name=my_gpu_only", "--set", "train.cpu=true")
    assert gpu.returncode == 0, gpu.stderr
    assert "runjob: plan: warning: strategy 'my_gpu_only' needs CUDA GPUs and none is used here" in gpu.stderr
    several = tester.cli("validate", "job.toml", "--set", "strategy.name=my_one_process", "--num-processes", "2")
    assert "strategy 'my_one_process' runs at most 1 process(es), but launch.num_processes = 2" in several.stderr
    single = tester.cli("validate", "job.toml", "--set", "strategy.name=single", "--num-processes", "2")
    assert "strategy 'single' runs at most 1 process(es), but launch.num_processes = 2" in single.stderr
    plain = tester.cli("validate", "job.toml", "--set", "strategy.name=my_one_process")
    assert "warning" not in plain.stderr


def test_a_fact_the_kind_does_not_have_is_the_plugins_failure(runjob_tester):
    source = GPU_STRATEGY.replace("max_processes=1", "max_procs=1")
    runjob_tester.install_plugin("fake-typo-fact", {"fake_typo_fact": source}, {"typofact": "fake_typo_fact"})
    host = load_plugins()
    (failure,) = host.failures
    assert failure.name == "typofact"
    assert "register() got unknown fact(s) max_procs; strategies take: needs_gpu, max_processes" in failure.error
    assert "my_gpu_only" not in host.components["strategy"], "a failed plugin keeps nothing"


def test_extra_tags_reach_the_run_and_a_malformed_one_is_refused(tester):
    tester.write_job("job.toml", SMALL_DIGITS.format(name="tagged"))
    result = tester.cli("job.toml", "--set", "train.max_steps=1", "--tag", "team=vision", "--tag", "ticket=ML-7")
    assert result.returncode == 0, result.stderr
    run = tester.only_run("tagged")
    assert run.tags["team"] == "vision" and run.tags["ticket"] == "ML-7"
    bad = tester.cli("job.toml", "--tag", "no-equals-sign")
    assert bad.returncode == 2
    assert bad.stderr_lines == ["runjob: --tag no-equals-sign: a tag must look like KEY=VALUE, e.g. --tag team=vision"]


def test_the_resume_check_compares_whole_values_not_mlflow_params():
    """MLflow cuts a param at 6,000 characters; two jobs that differ after that are still different."""
    long = "x" * 7000
    saved = {"dataset": {"name": "imagefolder", "root": long + "a"}, "optimizer": {"name": "sgd", "lr": [0.9, 0.99]}}
    now = {"dataset": {"name": "imagefolder", "root": long + "b"}, "optimizer": {"name": "sgd", "lr": [0.9, 0.999]}}
    refused, allowed = compare_jobs(saved, now)
    assert len(refused) == 1 and refused[0].startswith("dataset.root: xxx")
    assert refused[0].endswith("a -> " + long + "b")
    assert allowed == ["optimizer.lr: [0.9, 0.99] -> [0.9, 0.999]"]


def test_the_local_record_round_trips_and_a_broken_one_is_one_line(tmp_path):
    record = RunRecord(run_id="abc", tracking_uri="sqlite:///x.db", experiment="e", run_name="r", start_time=1)
    record.params["optimizer.lr"] = "0.1"
    assert record.add_artifact("model.safetensors", None) and not record.add_artifact("model.safetensors", None)
    record.write(tmp_path)
    data = json.loads((tmp_path / RUN_RECORD).read_text())
    assert data["run_id"] == "abc" and data["end_time"] is None and "unsynced" not in data
    assert RunRecord.read(tmp_path) == record
    assert RunRecord.read(tmp_path / "nothing-here") is None

    (tmp_path / RUN_RECORD).write_text("{not json")
    with pytest.raises(RunjobError, match=rf"{RUN_RECORD}: not a runjob run record"):
        RunRecord.read(tmp_path)


def test_metric_points_of_every_machine_are_read_back(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"key": "train/loss", "value": 1.0, "step": 1, "timestamp": 5}\n')
    node = '{"key": "system/node1/cpu", "value": 3.0, "step": 0, "timestamp": 6}\n'
    (tmp_path / "metrics.node1.jsonl").write_text(node)
    assert [p["key"] for p in read_metric_points(tmp_path)] == ["train/loss", "system/node1/cpu"]
    assert [p["key"] for p in read_metric_points(tmp_path, "metrics.jsonl")] == ["train/loss"]
