"""`runjob sweep`: the [sweep] table's checks, the values each method chooses, and one real grid
sweep whose trials are child runs of one parent MLflow run."""

from __future__ import annotations

import json
import sys
import tomllib

import pytest
from helpers import RESNET18_DIGITS, SMALL_DIGITS

from runjob.commands.cli import main
from runjob.commands.sweep import Trial, grid_points, make_plan, read_result, toml_value
from runjob.host.plugin_host import load_plugins
from runjob.job.jobfile import parse_override_value
from runjob.job.schema import SweepRange, SweepTable
from runjob.job.validation import load_resolved
from runjob.testing import write_job

BASE = RESNET18_DIGITS.format(name="sw")  # checked only: the line numbers below are its lines


def validate(tmp_path, monkeypatch, capsys, text: str, *extra: str):
    """``runjob validate job.toml`` in-process; returns (exit code, stdout, stderr lines)."""
    write_job(tmp_path / "job.toml", BASE + text)
    monkeypatch.chdir(tmp_path)
    code = main(["validate", "job.toml", *extra])
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


@pytest.mark.timeout(30)
def test_sweep_table_mistakes_are_reported_together_with_file_and_line(tmp_path, monkeypatch, capsys):
    code, out, err = validate(
        tmp_path,
        monkeypatch,
        capsys,
        """
    [sweep]
    method = "bayes"
    trails = 4

    [sweep.parameters]
    "optimizer.lr" = []
    "optimizer.weight_decay" = { low = 0.1, high = 0.01 }
    "train.batch_size" = 64
    "train.epochs" = { low = "1", high = 3 }
    """,
    )
    assert code == 2 and out == ""
    assert err == [
        "runjob: job.toml:13: sweep.method: Input should be 'grid', 'random' or 'tpe' (got 'bayes')",
        "runjob: job.toml:14: sweep.trails: unknown key; did you mean 'trials'? "
        "Accepted keys: direction, method, metric, parameters, seed, trials",
        "runjob: job.toml:17: sweep.parameters.optimizer.lr: must be a non-empty list of values to try, "
        "or a range { low = ..., high = ..., log = false } (got [])",
        "runjob: job.toml:18: sweep.parameters.optimizer.weight_decay: low (0.1) must be below high (0.01)",
        "runjob: job.toml:19: sweep.parameters.train.batch_size: must be a non-empty list of values to try, "
        "or a range { low = ..., high = ..., log = false } (got 64)",
        "runjob: job.toml:20: sweep.parameters.train.epochs: low must be a number (got '1')",
    ]


@pytest.mark.timeout(30)
def test_grid_refuses_ranges_and_a_budget_below_its_size(tmp_path, monkeypatch, capsys):
    code, _, err = validate(
        tmp_path,
        monkeypatch,
        capsys,
        """
    [sweep]
    trials = 3
    metric = "val/loss"
    [sweep.parameters]
    optimizer.lr = [0.1, 0.01]
    "train.batch_size" = [16, 32]
    "optimizer.weight_decay" = { low = 1e-5, high = 1e-2, log = true }
    """,
    )
    assert code == 2
    assert err == [
        "runjob: job.toml:13: sweep.trials: the grid has 4 combinations, more than trials = 3: raise trials or leave "
        "it out to run them all",
        'runjob: job.toml:18: sweep.parameters.optimizer.weight_decay: a range needs method = "random" or "tpe"; '
        "a grid takes a list of values to try (got {'low': 1e-05, 'high': 0.01, 'log': True})",
    ]
    code, _, err = validate(
        tmp_path,
        monkeypatch,
        capsys,
        """
    [sweep]
    trials = 3
    [sweep.parameters]
    optimizer.lr = [0.1, 0.01]
    "train.batch_size" = [16, 32]
    """,
    )
    assert err == [
        "runjob: job.toml:13: sweep.trials: the grid has 4 combinations, more than trials = 3: "
        "raise trials or leave it out to run them all"
    ]


@pytest.mark.timeout(30)
def test_each_value_is_checked_against_the_job_before_any_trial(tmp_path, monkeypatch, capsys):
    code, out, err = validate(
        tmp_path,
        monkeypatch,
        capsys,
        """
    [sweep]
    method = "random"
    trials = 4
    [sweep.parameters]
    "optimizer.lr" = [0.1, -1]
    "optimizer.lrr" = [0.1, 0.2]
    "train.batch_size" = { low = 0, high = 64 }
    """,
    )
    assert code == 2 and out == ""
    assert err == [
        "runjob: job.toml:16: sweep.parameters.optimizer.lr: optimizer.lr=-1 is refused: "
        "Input should be greater than 0 (got -1)",
        "runjob: job.toml:17: sweep.parameters.optimizer.lrr: optimizer.lrr=0.1 is refused: "
        "unknown key; did you mean 'lr'? "
        "Accepted keys: name, betas, eps, foreach, fused, groups, lr, no_decay_norm_and_bias, weight_decay",
        "runjob: job.toml:18: sweep.parameters.train.batch_size: train.batch_size=0 is refused: "
        "Input should be greater than or equal to 1 (got 0)",
    ]
    # values that are fine alone but not together: the grid's combinations are checked too
    code, _, err = validate(
        tmp_path,
        monkeypatch,
        capsys,
        """
    [sweep.parameters]
    "launch.num_processes" = [6, 4]
    "launch.num_machines" = [2, 3]
    """,
        "--set",
        "launch.num_processes=6",
        "--set",
        "launch.main_process_ip=10.0.0.1",
        "--set",
        "launch.main_process_port=29500",
    )
    assert code == 2
    assert err == [
        "runjob: job.toml:12: sweep.parameters: "
        "the combination launch.num_processes=4 launch.num_machines=3 is refused: "
        "launch: num_processes (4) must be a multiple of num_machines (3)"
    ]


@pytest.mark.timeout(30)
def test_validate_prints_the_base_job_and_says_the_sweep_is_for_runjob_sweep(tmp_path, monkeypatch, capsys):
    code, out, err = validate(
        tmp_path,
        monkeypatch,
        capsys,
        """
    [sweep]
    [sweep.parameters]
    "optimizer.lr" = [0.1, 0.01]
    """,
        "--set",
        "optimizer.lr=0.5",
    )
    assert code == 0
    resolved = tomllib.loads(out)
    assert "sweep" not in resolved and resolved["optimizer"]["lr"] == 0.5
    notes = [line for line in err if "[sweep]" in line]
    assert notes == [
        "runjob: note: the job's [sweep] table is used by `runjob sweep`; "
        "the resolved job printed is the base job, without it (its values were checked)"
    ]
    job = load_resolved(tmp_path / "job.toml", [], load_plugins())
    assert (
        job.sweep.method == "grid"
        and job.sweep.direction == "maximize"
        and job.sweep.parameters == {"optimizer.lr": [0.1, 0.01]}
    )
    assert "sweep" not in job.to_dict()


def _sweep(method: str, seed: int, trials: int = 12) -> SweepTable:
    return SweepTable(
        method=method,
        trials=trials,
        seed=seed,
        parameters={
            "optimizer.lr": SweepRange(low=1e-4, high=1e-1, log=True),
            "train.batch_size": SweepRange(low=8, high=64),
            "optimizer.betas": [[0.9, 0.999], [0.8, 0.99]],
        },
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["random", "tpe"])
def test_random_and_tpe_draw_inside_the_ranges_reproducibly(method):
    def draws(seed: int) -> list[dict]:
        plan = make_plan(_sweep(method, seed))
        points = []
        for index in range(plan.total):
            point = plan.ask(index)
            plan.tell(index, None if index == 3 else -abs(point["optimizer.lr"] - 0.01))  # a failed trial too
            points.append(point)
        return points

    points = draws(seed=0)
    assert len(points) == 12
    for point in points:
        assert 1e-4 <= point["optimizer.lr"] <= 1e-1 and isinstance(point["optimizer.lr"], float)
        assert 8 <= point["train.batch_size"] <= 64 and isinstance(point["train.batch_size"], int)
        assert point["optimizer.betas"] in ([0.9, 0.999], [0.8, 0.99])
    assert len({p["optimizer.lr"] for p in points}) == 12
    assert draws(seed=0) == points
    assert draws(seed=1) != points


@pytest.mark.timeout(30)
def test_grid_is_every_combination_and_values_survive_the_trip_through_set():
    points = grid_points({"optimizer.lr": [0.1, 0.01, 1e-5], "train.batch_size": [16, 32]})
    assert points == [{"optimizer.lr": lr, "train.batch_size": bs} for lr in (0.1, 0.01, 1e-5) for bs in (16, 32)]
    for value in [1e-5, 0.1, 3, True, "ddp", [0.9, 0.999], {"a": "b c"}, 'say "hi"']:
        assert parse_override_value(toml_value(value)) == value


@pytest.mark.timeout(30)
def test_a_finished_trial_without_the_metric_fails_naming_what_it_logged(tmp_path):
    trial = Trial(0, {"optimizer.lr": 0.1}, tmp_path)
    (tmp_path / "mlflow_run.json").write_text(json.dumps({"run_id": "abc"}))
    lines = [
        {"key": "val/loss", "value": 0.5, "step": 3, "timestamp": 1},
        {"key": "train/loss", "value": 0.4, "step": 3, "timestamp": 1},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    read_result(trial, "val/acc")
    assert (trial.status, trial.run_id, trial.value) == ("failed", "abc", None)
    assert trial.message == "logged no 'val/acc'; it logged: train/loss, val/loss"
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({**line, "value": 0.3}) + "\n" for line in lines[:1]), encoding="utf-8"
    )
    read_result(trial, "val/loss")
    assert (trial.status, trial.value) == ("finished", 0.3)


@pytest.mark.timeout(30)
def test_random_without_optuna_stops_before_anything_is_recorded(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna -> ImportError
    write_job(
        tmp_path / "job.toml",
        BASE
        + """
    [sweep]
    method = "random"
    trials = 2
    [sweep.parameters]
    "optimizer.lr" = { low = 1e-4, high = 1e-1 }
    """,
    )
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "job.toml"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "runjob: sweep.method = \"random\" needs Optuna: pip install 'runjob-train[sweep]'"
    ]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlruns").exists()


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_grid_sweep_records_children_under_a_parent_that_names_the_best(tester):
    """The sweep runs here; each trial is a process of its own, as a user's sweep runs them."""
    tester.write_job(
        "job.toml",
        SMALL_DIGITS.format(name="sw")
        + """
    [sweep]
    [sweep.parameters]
    "optimizer.lr" = [0.001, 0.1]
    """,
    )
    result = tester.cli(
        "sweep",
        "job.toml",
        "--set",
        "train.max_steps=2",
        "--set",
        "tracking.log_model=none",
        "--set",
        "tracking.system_metrics_interval=0",
        "--output-dir",
        "sweep",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[sweep] table is used" not in result.stderr  # trials don't repeat the note

    runs = tester.runs("sw")
    [parent] = [r for r in runs if r.tags.get("runjob.sweep") == "true"]
    children = sorted((r for r in runs if r is not parent), key=lambda r: r.tags["runjob.sweep.trial"])
    assert len(children) == 2 and parent.run_name == "sw-sweep" and parent.status == "FINISHED"
    for index, (child, lr) in enumerate(zip(children, ["0.001", "0.1"], strict=True)):
        assert child.tags["mlflow.parentRunId"] == parent.run_id
        assert child.tags["runjob.sweep.trial"] == str(index)
        assert child.params["optimizer.lr"] == lr and child.params["train.max_steps"] == "2"
        assert child.run_name == f"lr={lr} · sw", "the trial's own value, not the sweep's --set"
        assert next(iter(child.metrics)) == "val/accuracy", "MLflow's first metric: the compare view opens on it"
        assert not any(key.startswith("sweep") for key in child.params)
        assert "sweep" not in tomllib.loads((tester.path / f"sweep/trial-00{index}/job.toml").read_text())

    accuracy = [c.metrics["val/accuracy"] for c in children]
    best = max(range(2), key=lambda i: (accuracy[i], -i))
    tags = parent.tags
    assert tags["runjob.sweep.best_trial"] == str(best)
    assert tags["runjob.sweep.best_run_id"] == children[best].run_id
    assert tags["runjob.sweep.best_params"] == f"optimizer.lr={['0.001', '0.1'][best]}"
    assert parent.metrics["best/val/accuracy"] == accuracy[best]
    assert parent.history("sweep/val/accuracy") == [(0, accuracy[0]), (1, accuracy[1])]
    assert parent.params["sweep.parameters.optimizer.lr"] == "[0.001, 0.1]"
    assert parent.params["sweep.method"] == "grid" and parent.params["sweep.trials"] == "2"
    assert parent.artifacts() == {"job.toml", "trials.json"}

    trials = json.loads((tester.path / "sweep/trials.json").read_text())
    assert [(t["status"], t["run_id"]) for t in trials] == [("finished", c.run_id) for c in children]
    assert f"runjob: best: trial {best}, val/accuracy {accuracy[best]:.4f}" in result.stdout
    assert result.stdout.rstrip().endswith(f"--set optimizer.lr={['0.001', '0.1'][best]}")
