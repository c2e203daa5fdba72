"""`runjob sweep`: the [sweep] table's checks, the study workers share, and real sweeps: a grid
sweep whose trials are child runs of one parent MLflow run."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import signal
import sys
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from helpers import RESNET18_DIGITS, SMALL_DIGITS
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from runjob.commands.cli import main
from runjob.errors import RunjobError
from runjob.host.plugin_host import load_plugins
from runjob.job.jobfile import REMOVE, RawJob, apply_override, parse_override_value
from runjob.job.schema import SweepRange, SweepTable
from runjob.job.validation import load_resolved
from runjob.sweep.devices import plan_workers, visible_gpus
from runjob.sweep.study import Claim, FileLock, SweepStudy, grid_points
from runjob.sweep.worker import override, read_outcome, toml_value
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
        "runjob: job.toml:13: sweep.method: Input should be 'grid', 'random', 'tpe', 'cmaes' or 'gp' (got 'bayes')",
        "runjob: job.toml:14: sweep.trails: unknown key; did you mean 'trials'? "
        "Accepted keys: direction, gpus_per_trial, method, metric, parameters, pruner, seed, storage, study, trials",
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
        'runjob: job.toml:18: sweep.parameters.optimizer.weight_decay: a range needs method = "random", "tpe", '
        '"cmaes" or "gp"; '
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
def test_a_toml_date_to_sweep_is_refused_at_its_line(tmp_path, monkeypatch, capsys):
    """A trial gets its values as JSON (its TrialContext): a TOML date would reach it as a string."""
    code, _, err = validate(
        tmp_path,
        monkeypatch,
        capsys,
        """
    [sweep]
    [sweep.parameters]
    "job.description" = ["x", { at = [1979-05-27] }]
    """,
    )
    assert code == 2
    assert err == [
        "runjob: job.toml:14: sweep.parameters.job.description: 1979-05-27 is a TOML date or time: a trial gets "
        "its values as JSON (strings, numbers, booleans, arrays, tables); quote it "
        "(got ['x', {'at': [datetime.date(1979, 5, 27)]}])"
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


def _sweep(method: str, seed: int, trials: int = 12, **extra) -> SweepTable:
    return SweepTable(
        method=method,
        trials=trials,
        seed=seed,
        metric="val/accuracy",
        direction="maximize",
        parameters={
            "optimizer.lr": SweepRange(low=1e-4, high=1e-1, log=True),
            "train.batch_size": SweepRange(low=8, high=64),
            "optimizer.betas": [[0.9, 0.999], [0.8, 0.99]],
        },
        **extra,
    )


def _draw(study: SweepStudy, fail: int | None = None) -> list[dict]:
    """Take every trial of ``study`` as one worker would, telling each a made-up result."""
    points = []
    while (claim := study.claim()) is not None:
        claim.lock.release()
        value = -abs(claim.values.get("optimizer.lr", 0.01) - 0.01)
        study.tell(
            claim.number, None if claim.number == fail else value, "fail" if claim.number == fail else "complete"
        )
        points.append(claim.values)
    return points


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["random", "tpe", "cmaes", "gp"])
def test_samplers_draw_inside_the_ranges_reproducibly_and_stop_at_the_budget(tmp_path, method):
    def draws(seed: int, folder: str) -> list[dict]:
        study = SweepStudy.create(_sweep(method, seed, trials=6), tmp_path / folder, "s")
        study.join()
        return _draw(study, fail=3)  # a failed trial counts against the budget too

    points = draws(0, "a")
    assert len(points) == 6
    for point in points:
        assert 1e-4 <= point["optimizer.lr"] <= 1e-1 and isinstance(point["optimizer.lr"], float)
        assert 8 <= point["train.batch_size"] <= 64 and isinstance(point["train.batch_size"], int)
        assert point["optimizer.betas"] in ([0.9, 0.999], [0.8, 0.99]), "an array choice comes back as the array"
    assert len({p["optimizer.lr"] for p in points}) == 6
    assert draws(0, "b") == points
    assert draws(1, "c") != points
    assert sorted(p.name for p in (tmp_path / "a").iterdir() if p.is_dir()) == [f"trial-00{n}" for n in range(6)]


@pytest.mark.timeout(30)
def test_a_grid_is_its_combinations_in_order_each_taken_once(tmp_path):
    sweep = SweepTable(parameters={"optimizer.lr": [0.1, 0.01, 1e-5], "train.batch_size": [16, 32]}, metric="val/loss")
    points = grid_points(sweep.parameters)
    assert points == [{"optimizer.lr": lr, "train.batch_size": bs} for lr in (0.1, 0.01, 1e-5) for bs in (16, 32)]
    study = SweepStudy.create(sweep.model_copy(update={"direction": "minimize"}), tmp_path, "g")
    study.join()
    assert _draw(study) == points
    assert study.claim() is None
    for value in [1e-5, 0.1, 3, True, "ddp", [0.9, 0.999], {"a": "b c"}, 'say "hi"']:
        assert parse_override_value(toml_value(value)) == value


_OFFSETS = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
_TOML_TEXT = st.text(st.characters(exclude_categories=["Cs"]))  # TOML strings hold no lone surrogates
_TOML_SCALARS = (
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)  # inf and -inf too: a TOML job may list them as choices
    | _TOML_TEXT
    | st.dates()
    | st.datetimes(timezones=st.none() | _OFFSETS)
    | st.times()
)
TOML_VALUES = st.recursive(
    _TOML_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TOML_TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=TOML_VALUES)
def test_a_trial_value_passed_as_set_reads_back_as_the_same_value_on_one_line(value):
    """A sweep trial's value reaches its run as ``--set KEY=TEXT``: whatever a job file can list
    (or Optuna draw from a range), the run's job gets exactly it, and the flag is one line."""
    assume(value != REMOVE)
    text = override("optimizer.choice", value)
    assert "\n" not in text and "\r" not in text
    job = RawJob(path=Path("job.toml"), data={})
    assert apply_override(job, text) is None
    assert job.data == {"optimizer": {"choice": value}}
    assert type(job.data["optimizer"]["choice"]) is type(value)


@pytest.mark.timeout(60)
def test_an_interrupted_trial_is_taken_over_once_its_lock_is_free_and_never_while_held(tmp_path):
    study = SweepStudy.create(_sweep("random", 0, trials=2), tmp_path, "r")
    study.join()
    first = study.claim()
    assert first is not None and not first.resumed
    second = study.claim()
    assert second is not None and second.number == 1, "the held trial 0 is not taken again"
    assert study.claim() is None, "the budget is 2"
    assert study.running_elsewhere() == [0, 1] and study.interrupted() == []
    first.lock.release()  # trial 0's worker died: its lock is free, the trial still RUNNING in the study
    assert study.interrupted() == [0]
    again = study.claim()
    assert again is not None and again.resumed and (again.number, again.values) == (0, first.values)
    assert again.output_dir == first.output_dir
    assert study.claim() is None
    other = FileLock(second.output_dir / ".trial.lock")
    assert not other.acquire(blocking=False), "a second worker cannot take a trial whose lock is held"


@pytest.mark.timeout(30)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="a trial is forked from its worker where it can be")
def test_a_trials_lock_stays_held_by_its_run_when_the_worker_lets_go_and_goes_when_the_run_dies(tmp_path):
    """A trial's run holds its trial's lock with its worker: started with the lock's file
    (``pass_fds``) or forked from the worker, it still holds it once the worker is gone (killed:
    the run checkpoints on its way out), so no other worker resumes the trial until the run is dead."""
    import subprocess

    for how in ("pass_fds", "fork"):
        path = tmp_path / f"{how}.lock"
        worker = FileLock(path)
        assert worker.acquire(blocking=False)
        assert worker.fd is not None
        if how == "pass_fds":
            run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(worker.fd,))
        else:
            pid = os.fork()
            if pid == 0:  # the forked run
                time.sleep(60)
                os._exit(0)
            run = psutil.Process(pid)
        worker.release()  # the worker's own hold is gone
        assert FileLock.held_elsewhere(path), f"a run started by {how} holds its trial's lock"
        run.kill()
        run.wait()
        assert not FileLock.held_elsewhere(path), f"a run started by {how} lets go when it dies"


@pytest.mark.timeout(30)
def test_a_trials_outcome_is_read_from_its_folder(tmp_path):
    claim = Claim(0, {"optimizer.lr": 0.1}, tmp_path, FileLock(tmp_path / ".lock"), resumed=False)
    record = {"run_id": "abc", "tags": {}}
    (tmp_path / "mlflow_run.json").write_text(json.dumps(record))
    lines = [
        {"key": "val/loss", "value": 0.5, "step": 3, "timestamp": 1},
        {"key": "train/loss", "value": 0.4, "step": 3, "timestamp": 1},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    outcome = read_outcome(claim, 0, None, "val/acc")
    assert (outcome.state, outcome.run_id, outcome.value) == ("fail", "abc", None)
    assert outcome.message == "logged no 'val/acc'; it logged: train/loss, val/loss"
    assert (read_outcome(claim, 0, None, "val/loss").state, read_outcome(claim, 0, None, "val/loss").value) == (
        "complete",
        0.5,
    )
    (tmp_path / "mlflow_run.json").write_text(json.dumps({**record, "tags": {"runjob.sweep.pruned": "true"}}))
    assert read_outcome(claim, 0, None, "val/loss").state == "pruned"
    assert read_outcome(claim, 143, 15, "val/loss").state == "interrupted", "stopped by the worker's signal"
    failed = read_outcome(claim, 1, None, "val/loss")
    assert (failed.state, failed.message) == ("fail", "exit code 1")


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


SWEEP_OPTIONS = ("--set", "tracking.log_model=none", "--set", "tracking.system_metrics_interval=0")
CHECKPOINTED = ("--set", "train.epochs=2", "--set", "train.checkpoint_every=5")


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_grid_sweep_records_children_under_a_parent_and_its_pruner_stops_hopeless_rates(tester):
    """The sweep runs here; each trial is a process of its own, as a user's sweep runs them. The
    median pruner stops the two learning rates that learn nothing after their first evaluation."""
    tester.write_job(
        "job.toml",
        SMALL_DIGITS.format(name="sw")
        + """
    [sweep]
    pruner = { name = "median", n_startup_trials = 2 }
    [sweep.parameters]
    "optimizer.lr" = [0.01, 0.005, 1e-9]
    """,
    )
    result = tester.cli("sweep", "job.toml", *SWEEP_OPTIONS, "--set", "train.epochs=3", "--output-dir", "sweep")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[sweep] table is used" not in result.stderr  # trials don't repeat the note

    runs = tester.runs("sw")
    [parent] = [r for r in runs if r.tags.get("runjob.sweep") == "true"]
    children = sorted((r for r in runs if r is not parent), key=lambda r: int(r.tags["runjob.sweep.trial"]))
    rates = ["0.01", "0.005", "1e-09"]
    assert len(children) == 3 and parent.run_name == "sw-sweep" and parent.status == "FINISHED"
    for index, (child, lr) in enumerate(zip(children, rates, strict=True)):
        assert child.tags["mlflow.parentRunId"] == parent.run_id
        assert child.tags["runjob.sweep.trial"] == str(index)
        assert json.loads(child.tags["runjob.sweep.keys"]) == ["optimizer.lr"]
        assert child.params["optimizer.lr"] == lr and child.params["train.epochs"] == "3"
        assert child.run_name == f"lr={lr} · sw", "the trial's own value, not the sweep's --set"
        assert next(iter(child.metrics)) == "val/accuracy", "MLflow's first metric: the compare view opens on it"
        assert not any(key.startswith("sweep") for key in child.params)
        assert "sweep" not in tomllib.loads((tester.path / f"sweep/trial-00{index}/job.toml").read_text())

    # pruned: a clean early stop, FINISHED, tagged, its model kept; PRUNED in the study and the summary
    assert [c.status for c in children] == ["FINISHED"] * 3
    assert [c.tags.get("runjob.sweep.pruned") for c in children] == [None, None, "true"]
    for index, pruned in enumerate(children[2:], 2):
        assert pruned.tags["runjob.stopped"].startswith("pruned by the sweep's median pruner at evaluation 1 ")
        assert len(pruned.history("val/accuracy")) <= 2, "stopped after its first evaluation (and its final one)"
        assert (tester.path / f"sweep/trial-00{index}/model.safetensors").exists()
    assert len(children[0].history("val/accuracy")) >= 3
    assert "runjob: sweep: 2 finished, 1 pruned of 3 trial(s) in " in result.stdout

    accuracy = [c.metrics["val/accuracy"] for c in children]
    best = max(range(2), key=lambda i: (accuracy[i], -i))
    tags = parent.tags
    assert tags["runjob.sweep.best_trial"] == str(best)
    assert tags["runjob.sweep.best_run_id"] == children[best].run_id
    assert tags["runjob.sweep.best_params"] == f"optimizer.lr={rates[best]}"
    assert parent.metrics["best/val/accuracy"] == accuracy[best]
    assert [step for step, _ in parent.history("sweep/val/accuracy")] == [0, 1, 2]
    assert parent.history("sweep/val/accuracy")[:2] == [(0, accuracy[0]), (1, accuracy[1])]
    assert parent.params["sweep.parameters.optimizer.lr"] == "[0.01, 0.005, 1e-09]"
    assert parent.params["sweep.method"] == "grid" and parent.params["sweep.trials"] == "3"
    assert parent.params["sweep.pruner"] == "median"
    assert parent.artifacts() >= {"job.toml", "trials.json", "optimization_history.png"}

    trials = json.loads((tester.path / "sweep/trials.json").read_text())
    assert [(t["state"], t["run_id"]) for t in trials] == [
        (state, c.run_id) for state, c in zip(["finished", "finished", "pruned"], children, strict=True)
    ]
    assert f"runjob: best: trial {best}, val/accuracy {accuracy[best]:.4f}" in result.stdout
    assert f"--set optimizer.lr={rates[best]}" in result.stdout
    # the study loads in Optuna's API (and so in optuna-dashboard) from the storage the parent records
    optuna = pytest.importorskip("optuna")
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(parent.params["sweep.storage"]))
    study = optuna.load_study(study_name=parent.params["sweep.study"], storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert [t.value for t in study.trials[:2]] == accuracy[:2]


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_sweep_killed_mid_trial_resumes_with_one_parent_its_finished_trials_kept(tester):
    """SIGKILL to a worker: its trial gets SIGTERM as its parent dies and checkpoints, and the sweep
    starts another worker, which resumes it. SIGKILL to the sweep itself: its worker passes SIGTERM on
    to the trial, which checkpoints; the resumed sweep continues the same study and parent run, the
    trial from its checkpoint."""
    tester.write_job(
        "job.toml",
        SMALL_DIGITS.format(name="rs")
        + """
    [sweep]
    [sweep.parameters]
    "optimizer.lr" = [0.01, 0.005]
    """,
    )
    sweep = tester.popen(
        "sweep", "job.toml", *SWEEP_OPTIONS, *CHECKPOINTED, "--output-dir", "sweep", stdout=None, stderr=None
    )

    def paused_after_a_checkpoint(trial: int) -> tuple[psutil.Process, psutil.Process]:
        """The sweep's worker and its running trial, the trial paused (SIGSTOP) once it wrote a
        checkpoint, so it cannot finish before it is killed, however fast this machine is."""
        checkpoints = tester.path / f"sweep/trial-00{trial}/checkpoints"
        deadline = time.monotonic() + 400
        while not (checkpoints.is_dir() and any(checkpoints.glob("step-*"))):  # renamed into place once whole
            assert sweep.poll() is None and time.monotonic() < deadline, f"trial {trial} never wrote a checkpoint"
            time.sleep(0.02)
        [worker] = [p for p in psutil.Process(sweep.pid).children() if "--join" in p.cmdline()]
        [running] = worker.children()  # the trial, forked from its worker
        running.suspend()
        return worker, running

    worker, running = paused_after_a_checkpoint(0)
    worker.send_signal(signal.SIGKILL)  # the trial gets SIGTERM as its parent dies: it stops at a checkpoint
    running.resume()
    _, running = paused_after_a_checkpoint(1)  # trial 0 was resumed by the next worker, which went on to trial 1
    first_run = tester.record("sweep/trial-000").run_id
    assert tester.record("sweep/trial-000").status == "FINISHED"
    sweep.send_signal(signal.SIGKILL)
    sweep.wait(timeout=30)
    running.resume()

    result = tester.cli("sweep", "job.toml", *SWEEP_OPTIONS, *CHECKPOINTED, "--resume", "sweep")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "runjob: resuming the sweep in sweep" in result.stdout
    runs = tester.runs("rs")
    parents = [r for r in runs if r.tags.get("runjob.sweep") == "true"]
    children = sorted((r for r in runs if r not in parents), key=lambda r: int(r.tags["runjob.sweep.trial"]))
    assert len(parents) == 1 and parents[0].status == "FINISHED"
    assert [c.tags["runjob.sweep.trial"] for c in children] == ["0", "1"], "no trial run twice"
    assert children[0].run_id == first_run and [c.status for c in children] == ["FINISHED"] * 2
    for resumed in children:
        assert any(key.startswith("runjob.resumed.step_") for key in resumed.tags), "went on from its checkpoint"
    assert parents[0].history("sweep/val/accuracy") == [(n, c.metrics["val/accuracy"]) for n, c in enumerate(children)]
    trials = json.loads((tester.path / "sweep/trials.json").read_text())
    assert [t["state"] for t in trials] == ["finished"] * 2


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_two_joined_workers_share_one_study_with_no_trial_run_twice(tester):
    """As a Slurm array runs a sweep: the same command started twice against one folder; the
    first creates the sweep there, both take trials from its journal file."""
    tester.write_job(
        "job.toml",
        SMALL_DIGITS.format(name="jn")
        + """
    [sweep]
    method = "random"
    trials = 4
    [sweep.parameters]
    "optimizer.lr" = { low = 1e-4, high = 1e-1, log = true }
    """,
    )
    command = ("sweep", "job.toml", *SWEEP_OPTIONS, "--set", "train.max_steps=3", "--join", "shared")
    # the second starts each trial as an interpreter of its own, as on a machine without fork
    workers = [tester.popen(*command, env={"OMP_NUM_THREADS": "1", "RUNJOB_SWEEP_FORK": fork}) for fork in "10"]
    outputs = [worker.communicate(timeout=600) for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], [err[-2000:] for _, err in outputs]
    took = [[line for line in out.splitlines() if ": starting in " in line] for out, _ in outputs]
    assert all(took), "both workers ran trials"
    assert sum(map(len, took)) == 4
    runs = tester.runs("jn")
    [parent] = [r for r in runs if r.tags.get("runjob.sweep") == "true"]
    children = [r for r in runs if r is not parent]
    assert sorted(int(c.tags["runjob.sweep.trial"]) for c in children) == [0, 1, 2, 3]
    assert {c.tags["mlflow.parentRunId"] for c in children} == {parent.run_id}
    assert parent.status == "FINISHED", "the last worker out (or the creator) records the end"
    assert sum("created the sweep" in out for out, _ in outputs) == 1


@pytest.mark.timeout(30)
def test_each_worker_gets_its_own_gpus_or_its_share_of_the_cores():
    four = ["0", "1", "2", "3"]
    assert plan_workers(None, four, None, 1, 8) == [{"CUDA_VISIBLE_DEVICES": d} for d in four], "one a GPU, all used"
    assert plan_workers(2, four, 2, 2, 8) == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    assert plan_workers(None, four, None, 2, 8) == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    assert plan_workers(1, ["5", "7"], 1, 1, 8) == [{"CUDA_VISIBLE_DEVICES": "5"}], "the visible devices' own names"
    with pytest.raises(
        RunjobError,
        match=r"^--workers 3 with sweep.gpus_per_trial = 2 needs 6 GPU\(s\); this "
        r"machine shows 4 \(0, 1, 2, 3\)$",
    ):
        plan_workers(3, four, 2, 1, 8)
    with pytest.raises(RunjobError, match="launch.num_processes = 2 processes, one a GPU: give each trial at least 2"):
        plan_workers(None, four, 1, 2, 8)
    with pytest.raises(RunjobError, match="gpus_per_trial = 1: this machine shows no GPU"):
        plan_workers(2, [], 1, 1, 8)
    # no GPU: the cores divided between the workers (and each trial's processes)
    assert plan_workers(None, [], None, 1, 8) == [{}]
    assert plan_workers(2, [], None, 1, 8) == [{"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}] * 2
    assert plan_workers(2, [], None, 2, 2) == [{"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}] * 2
    cpus = plan_workers(2, four, 0, 1, 8)
    assert cpus == [{"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": ""}] * 2
    # which GPUs are visible: CUDA_VISIBLE_DEVICES first (a Slurm allocation), "-1" or "" hides them all
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"PATH": ""}) == [], "no nvidia-smi on PATH: no GPU"


@pytest.mark.timeout(60)
def test_more_workers_than_gpus_is_one_line_before_anything_is_recorded(tmp_path, monkeypatch, capsys):
    write_job(tmp_path / "job.toml", BASE + '\n    [sweep]\n    [sweep.parameters]\n    "optimizer.lr" = [0.1, 0.01]\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert main(["sweep", "job.toml", "--workers", "3", "--set", "sweep.gpus_per_trial=1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "runjob: --workers 3 with sweep.gpus_per_trial = 1 needs 3 GPU(s); this machine shows 2 (0, 1)"
    ]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.timeout(30)
def test_a_pruner_is_a_name_or_a_table_of_its_own_options(tmp_path, monkeypatch, capsys):
    code, _, err = validate(
        tmp_path,
        monkeypatch,
        capsys,
        """
    [sweep]
    pruner = { name = "median", min_resource = 2 }
    [sweep.parameters]
    "optimizer.lr" = [0.1, 0.01]
    """,
    )
    assert code == 2
    assert err == [
        "runjob: job.toml:13: sweep.pruner: min_resource: not an option of the 'median' pruner (its options: "
        "n_startup_trials, n_warmup_steps, interval_steps, n_min_trials) (got {'name': 'median', 'min_resource': 2})"
    ]
    code, _, err = validate(
        tmp_path,
        monkeypatch,
        capsys,
        '\n    [sweep]\n    pruner = "medain"\n    [sweep.parameters]\n    "optimizer.lr" = [0.1]\n',
    )
    assert code == 2 and len(err) == 1 and "sweep.pruner" in err[0] and "'median'" in err[0]
    job = load_resolved(
        tmp_path / "job.toml", ['sweep.pruner={ name = "hyperband", reduction_factor = 2 }'], load_plugins()
    )
    assert (job.sweep.pruner.name, job.sweep.pruner.options()) == ("hyperband", {"reduction_factor": 2})


class _ServerDown:
    """What a parent's MLflow writer does while the tracking server is down."""

    def __getattr__(self, name):
        def refuse(*args, **kwargs):
            raise ConnectionError("Connection refused: the tracking server is down")

        return refuse


@pytest.mark.timeout(120)
def test_a_parent_recorded_while_the_server_is_down_is_restored_by_sync(tmp_path, monkeypatch, capsys):
    from runjob.sweep.parent import ParentRun, sweep_params
    from runjob.sweep.study import SweepInfo, budget_of
    from runjob.testing import MlflowRun

    write_job(
        tmp_path / "job.toml",
        BASE + '\n    [sweep]\n    [sweep.parameters]\n    "optimizer.lr" = [0.1, 0.01, 0.001]\n',
    )
    monkeypatch.chdir(tmp_path)
    job = load_resolved(tmp_path / "job.toml", [], load_plugins())
    folder = tmp_path / "sweep"
    study = SweepStudy.create(job.sweep, folder, "s")
    params = sweep_params(job.sweep, budget_of(job.sweep), "s", study.storage)
    parent = ParentRun.start(job, params, {"runjob.sweep": "true"}, folder)
    SweepInfo("s", study.storage, parent.run_id, str(tmp_path / "job.toml"), params).write(folder)
    parent.recorded.writer = _ServerDown()  # the server goes down after the sweep began
    study.join()
    for value in (0.5, 0.9, 0.7):
        claim = study.claim()
        claim.lock.release()
        study.tell(claim.number, value, "complete")
        parent.progress(study)
    parent.finish(study, "FINISHED", None)
    assert "upload it with `runjob sync" in capsys.readouterr().err
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert MlflowRun.get(uri, parent.run_id).status == "RUNNING", "MLflow missed the end"

    # a trial recorded while the server was down: its own folder, synced with the sweep's
    from runjob.record.local import RunRecord

    trial = folder / "trial-000"
    RunRecord(tracking_uri=uri, experiment="sw", run_name="lr=0.1 · sw", start_time=1, offline=True).write(trial)
    (trial / "metrics.jsonl").write_text(json.dumps({"key": "val/accuracy", "value": 0.5, "step": 3, "timestamp": 2}))

    assert main(["sync", str(folder)]) == 0
    assert f"runjob: synced the trial {trial} to MLflow run " in capsys.readouterr().out
    trial_run = MlflowRun.get(uri, RunRecord.read(trial).run_id)
    assert trial_run.history("val/accuracy") == [(3, 0.5)]
    run = MlflowRun.get(uri, parent.run_id)
    assert run.status == "FINISHED"
    assert run.history("sweep/val/accuracy") == [(0, 0.5), (1, 0.9), (2, 0.7)]
    assert run.history("best/val/accuracy") == [(1, 0.5), (2, 0.9), (3, 0.9)]
    assert run.tags["runjob.sweep.best_trial"] == "1" and run.tags["runjob.sweep.best_params"] == "optimizer.lr=0.01"
    assert "importance/optimizer.lr" in run.metrics
    assert {"job.toml", "trials.json", "optimization_history.png"} <= run.artifacts()
    assert (folder / "record" / "job.toml").is_file()


@pytest.mark.timeout(120)
def test_join_finds_the_sweep_by_its_parent_run_or_its_storage_url(tmp_path, monkeypatch):
    """What `--join` accepts besides a folder: the parent run's id (the folder from its tags) or
    the study's storage URL with [sweep] study (the folder from the study)."""
    from runjob.sweep.session import _create, _where

    write_job(
        tmp_path / "job.toml",
        BASE
        + """
    [sweep]
    storage = "sqlite:///study.db"
    study = "shared"
    [sweep.parameters]
    "optimizer.lr" = [0.1, 0.01]
    """,
    )
    monkeypatch.chdir(tmp_path)
    job = load_resolved(tmp_path / "job.toml", [], load_plugins())
    folder = tmp_path / "sweeps" / "a"
    folder.mkdir(parents=True)
    args = SimpleNamespace(overrides=[])
    study, parent = _create(job, args, folder)
    assert _where(job, parent.run_id, None) == folder.resolve()
    assert _where(job, "sqlite:///study.db", None) == folder.resolve()
    assert _where(job, "sqlite:///study.db", tmp_path / "elsewhere") == tmp_path / "elsewhere", "--output-dir wins"
    assert _where(job, "sweeps/a", None) == Path("sweeps/a")
    unnamed = dataclasses.replace(job, sweep=job.sweep.model_copy(update={"study": None}))
    with pytest.raises(RunjobError, match=r"name the study to join with \[sweep\] study"):
        _where(unnamed, "sqlite:///study.db", None)
    with pytest.raises(RunjobError, match="no such MLflow run"):
        _where(job, "0" * 32, None)


@pytest.mark.timeout(120)
def test_a_study_name_taken_in_the_storage_is_one_line_and_the_parent_run_fails(tmp_path, monkeypatch, capsys):
    from runjob.testing import MlflowRun

    write_job(
        tmp_path / "job.toml",
        BASE
        + """
    [sweep]
    storage = "shared.journal"
    study = "taken"
    [sweep.parameters]
    "optimizer.lr" = [0.1]
    """,
    )
    monkeypatch.chdir(tmp_path)
    job = load_resolved(tmp_path / "job.toml", [], load_plugins())
    SweepStudy.create(job.sweep, tmp_path / "earlier", "taken")  # another sweep's study, same storage and name
    assert main(["sweep", "job.toml", "--output-dir", "sweep"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("runjob: sweep.study = 'taken': the storage ") and line.endswith(
        "already holds a study of that name; join it with `runjob sweep JOB --join ...` or name another"
    )
    run_id = json.loads((tmp_path / "sweep/mlflow_run.json").read_text())["run_id"]
    parent = MlflowRun.get(f"sqlite:///{tmp_path / 'mlflow.db'}", run_id)
    assert parent.status == "FAILED" and "already holds a study" in parent.tags["runjob.error"]
