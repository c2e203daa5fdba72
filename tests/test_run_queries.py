"""`runjob runs`, `runjob diff` and `runjob rerun`: reading recorded runs back from MLflow.

`runs` and `diff` read runs written straight into a sqlite store, as runjob records them (dotted
job keys as params, `val/accuracy` and friends as metrics); only `rerun` trains, once end to end.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest
from helpers import RESNET18_DIGITS, SMALL_DIGITS

from runjob.commands.cli import main

T0 = 1_780_000_000_000  # ms; the runs start a minute apart from here
JOB_KEYS = {
    "model.name": "resnet18",
    "train.epochs": "6",
    "dataset.root": "data/digits",
    "tracking.tags.api_token": "***",
}
VALID_JOB = textwrap.dedent(RESNET18_DIGITS).format(name="recorded") + '[tracking.tags]\napi_token = "***"\n'


def _record(
    client,
    experiment_id: str,
    name: str,
    minute: int,
    params: dict,
    metrics: dict,
    status: str,
    job_toml: str | None = None,
    tags: dict | None = None,
) -> str:
    """A run as runjob leaves it: params, metric histories (the last point is the final value), status."""
    run = client.create_run(experiment_id, start_time=T0 + minute * 60_000, run_name=name, tags=tags)
    run_id = run.info.run_id
    for key, value in params.items():
        client.log_param(run_id, key, value)
    for key, values in metrics.items():
        for step, value in enumerate(values, start=1):
            client.log_metric(run_id, key, value, step=step)
    if job_toml is not None:
        client.log_text(run_id, job_toml, "job.toml")
    client.set_terminated(run_id, status, end_time=T0 + minute * 60_000 + 95_000)
    return run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory, empty_mlflow_db):
    """A store with experiment `digits` (three runs: lr 0.001 FINISHED, lr 0.01 FAILED, lr 0.001
    again with a hidden secret in its job.toml), `cifar` (one run, not made by runjob) and `empty`."""
    from mlflow import MlflowClient

    folder = tmp_path_factory.mktemp("queries")
    shutil.copy(empty_mlflow_db, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    digits = client.create_experiment("digits", artifact_location=str(folder / "artifacts"))
    cifar = client.create_experiment("cifar", artifact_location=str(folder / "artifacts"))
    client.create_experiment("empty", artifact_location=str(folder / "artifacts"))
    ids = {
        "slow": _record(
            client,
            digits,
            "slow",
            0,
            {**JOB_KEYS, "optimizer.lr": "0.001"},
            {"val/accuracy": [0.5, 0.8], "val/loss": [0.9, 0.4], "train/loss": [0.3]},
            "FINISHED",
        ),
        "fast": _record(
            client,
            digits,
            "fast",
            1,
            {**JOB_KEYS, "optimizer.lr": "0.01"},
            {"val/accuracy": [0.9], "val/loss": [0.3], "train/loss": [0.35], "lr": [0.01]},
            "FAILED",
        ),
        "secret": _record(
            client, digits, "secret", 2, {**JOB_KEYS, "optimizer.lr": "0.001"}, {}, "FINISHED", job_toml=VALID_JOB
        ),
        "foreign": _record(client, cifar, "foreign", 3, {"epochs": "3"}, {"acc": [0.5]}, "FINISHED"),
    }
    return uri, ids


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(code: int, err: str) -> str:
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("runjob: "), err
    return err


@pytest.mark.timeout(60)
def test_runs_lists_newest_first_with_differing_keys_and_final_metrics(store, capsys):
    uri, ids = store
    code, out, _ = _cli(capsys, "runs", "--experiment", "digits", "--tracking-uri", uri)
    assert code == 0
    overview, results = (part.splitlines() for part in out.split("\n\n"))
    newest_first = [ids["secret"], ids["fast"], ids["slow"]]
    assert overview[0].split() == ["run", "id", "experiment", "run", "name", "status", "start", "duration"]
    assert [line.split()[0] for line in overview[1:]] == newest_first
    assert overview[2].split()[1:4] == ["digits", "fast", "FAILED"] and overview[3].endswith(" 1m35s")
    # only the key that differs, then the final (not the first) metric values
    assert results[0].split() == ["run", "id", "optimizer.lr", "val/accuracy", "val/loss", "train/loss"]
    assert [line.split() for line in results[1:]] == [
        [ids["secret"], "0.001"],
        [ids["fast"], "0.01", "0.9", "0.3", "0.35"],
        [ids["slow"], "0.001", "0.8", "0.4", "0.3"],
    ]
    assert all(len(line) <= 120 for line in out.splitlines())


@pytest.mark.timeout(60)
def test_runs_shows_the_keys_a_sweeps_trials_differ_in_not_those_against_its_parent(tmp_path, empty_mlflow_db, capsys):
    from mlflow import MlflowClient

    shutil.copy(empty_mlflow_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("sw", artifact_location=str(tmp_path / "artifacts"))
    job = {"job.name": "sw", "dataset.root": "data/digits", "model.name": "resnet18", "train.epochs": "6"}
    parent = _record(
        client, experiment, "sw-sweep", 0, {"sweep.method": "random"}, {"sweep/val/accuracy": [0.8]}, "FINISHED"
    )
    trials = [
        _record(
            client,
            experiment,
            f"lr={lr} bs={batch_size} · sw",
            minute,
            {**job, "optimizer.lr": lr, "train.batch_size": batch_size},
            {"val/accuracy": [accuracy]},
            "FINISHED",
        )
        for minute, lr, batch_size, accuracy in [(1, "0.0031622776601683794", "32", 0.8), (2, "0.01", "64", 0.9)]
    ]
    # another job recorded into the same experiment: every key of its own differs from the sweep's
    other = {"job.name": "other", "dataset.root": "data/cifar", "model.name": "resnet50", "optimizer.lr": "0.1"}
    _record(client, experiment, "other", 3, other, {"val/accuracy": [0.5]}, "FINISHED")

    code, out, _ = _cli(capsys, "runs", "--tracking-uri", uri)
    assert code == 0
    overview, results = (part.splitlines() for part in out.split("\n\n"))
    assert [line.split("  ")[0] for line in overview[2:4]] == trials[::-1]
    assert "lr=0.01 bs=64 · sw" in overview[2] and "lr=0.0031622776601683794 ..." in overview[3], "cut at the end"
    assert results[0].split() == ["run", "id", "optimizer.lr", "train.batch_size", "val/accuracy"]
    rows = {line.split()[0]: line.split()[1:] for line in results[1:]}
    assert rows[trials[0]] == ["0.003162", "32", "0.8"], "a long number to 4 significant digits, as metrics"
    assert rows[parent] == ["-", "-"]


def _sweep_store(tmp_path, empty_mlflow_db):
    """An empty store and its client, with experiment `sw`."""
    from mlflow import MlflowClient

    shutil.copy(empty_mlflow_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    return uri, client, client.create_experiment("sw", artifact_location=str(tmp_path / "artifacts"))


def _sweep_parent(client, experiment: str, minute: int, swept: dict[str, list]) -> str:
    """A sweep's parent run as runjob records it: tagged runjob.sweep, the sweep's settings as params."""
    params = {"sweep.method": "random", **{f"sweep.parameters.{k}": json.dumps(v) for k, v in swept.items()}}
    return _record(client, experiment, "sw-sweep", minute, params, {}, "FINISHED", tags={"runjob.sweep": "true"})


def _trial_tags(parent: str, number: int, swept: list[str]) -> dict[str, str]:
    return {
        "mlflow.parentRunId": parent,
        "runjob.sweep.parent": parent,
        "runjob.sweep.trial": str(number),
        "runjob.sweep.keys": json.dumps(swept),
    }


def _results(out: str) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """The results table of `runs`: its header cells, each run's cells by run id, the lines after it."""
    lines = out.split("\n\n")[1].splitlines()
    table = [line for line in lines if line.split()[0] == "run" or len(line.split()[0]) == 32]
    rows = {line.split()[0]: line.split()[1:] for line in table[1:]}
    return table[0].split()[2:], rows, lines[len(table) :]


SW_JOB = {"job.name": "sw", "dataset.root": "data/digits", "model.name": "resnet18", "train.epochs": "6"}
EARLY_STOPPING = {  # what a run that lists [callbacks.early_stopping] records; the default callbacks are left out
    "callbacks.early_stopping.enabled": "true",
    "callbacks.early_stopping.patience": "3",
    "callbacks.early_stopping.min_delta": "0.0",
}


@pytest.mark.timeout(60)
def test_runs_shows_the_swept_key_not_the_enabled_flag_of_a_callback_one_trial_lists(tmp_path, empty_mlflow_db, capsys):
    """The issue's listing: two sweeps of one job (their parents never count, though their
    settings differ), one trial listing early stopping, and a run recorded when the default
    callbacks' `enabled = true` was still recorded (best_weights and peak_memory have no other
    option): the key the sweep varies comes first; `enabled = true` against no such key is no
    difference, the options early stopping brings are."""
    uri, client, experiment = _sweep_store(tmp_path, empty_mlflow_db)
    defaults = {"callbacks.best_weights.enabled": "true", "callbacks.peak_memory.enabled": "true"}
    old = _record(client, experiment, "lr=0.3 · sw", 0, {**SW_JOB, "optimizer.lr": "0.3", **defaults}, {}, "FINISHED")
    first = _sweep_parent(client, experiment, 1, {"optimizer.lr": [0.1, 0.2]})
    parent = _sweep_parent(client, experiment, 2, {"optimizer.lr": [0.001, 0.01, 0.1]})
    trials = [
        _record(
            client,
            experiment,
            f"lr={lr} · sw",
            minute,
            {**SW_JOB, "optimizer.lr": lr, **extra},
            {"val/accuracy": [accuracy]},
            "FINISHED",
            tags=_trial_tags(parent, minute - 3, ["optimizer.lr"]),
        )
        for minute, lr, extra, accuracy in [
            (3, "0.001", {}, 0.7),
            (4, "0.01", EARLY_STOPPING, 0.9),
            (5, "0.1", {}, 0.8),
        ]
    ]

    code, out, _ = _cli(capsys, "runs", "--tracking-uri", uri)
    assert code == 0
    headers, rows, after = _results(out)
    assert headers == ["optimizer.lr", "early_...min_delta", "early_s...patience", "val/accuracy"], out
    assert "enabled" not in out and "sweep." not in out, "no enabled flag against none, no parent's settings"
    assert rows[trials[1]] == ["0.01", "0.0", "3", "0.9"]
    assert rows[trials[0]] == ["0.001", "-", "-", "0.7"] and rows[old] == ["0.3", "-", "-"]
    assert rows[parent] == rows[first] == ["-", "-", "-"]
    assert after == []


@pytest.mark.timeout(60)
def test_runs_shows_the_swept_keys_first_in_the_sweeps_order_whatever_the_width(tmp_path, empty_mlflow_db, capsys):
    """The trials' runjob.sweep.keys name the keys first, in the sweep's order (not alphabetical),
    all of them though they leave no room for the other keys that differ; a run of the job that is
    no trial changes nothing in that; runs without the tag are listed as before."""
    uri, client, experiment = _sweep_store(tmp_path, empty_mlflow_db)
    swept = ["train.batch_size", "optimizer.weight_decay", "optimizer.lr", "model.dropout"]
    parent = _sweep_parent(client, experiment, 0, dict.fromkeys(swept, [1, 2]))
    trials = [
        _record(
            client,
            experiment,
            f"bs={bs} wd={wd} lr={float(lr):.4g} dropout={dropout} · sw",
            minute,
            {
                **SW_JOB,
                "train.batch_size": bs,
                "optimizer.weight_decay": wd,
                "optimizer.lr": lr,
                "model.dropout": dropout,
                "dataset.augment": augment,
            },
            {"val/accuracy": [0.5 + minute / 10], "val/loss": [0.5], "train/loss": [0.4]},
            "FINISHED",
            tags=_trial_tags(parent, minute, swept),
        )
        for minute, bs, wd, lr, dropout, augment in [
            (1, "32", "0.0001", "0.0031622776601683794", "0.1", "false"),
            (2, "64", "0.001", "0.01", "0.1", "true"),
        ]
    ]
    other = {**SW_JOB, "train.batch_size": "16", "optimizer.weight_decay": "0.0", "optimizer.lr": "0.1"}
    other_run = _record(client, experiment, "bs=16 · sw", 3, {**other, "model.dropout": "0.0"}, {}, "FINISHED")

    code, out, _ = _cli(capsys, "runs", "--tracking-uri", uri)
    assert code == 0
    headers, rows, after = _results(out)
    assert headers[:4] == ["train.batch_size", "opt...weight_decay", "optimizer.lr", "model.dropout"], out
    assert rows[trials[0]][:4] == ["32", "0.0001", "0.003162", "0.1"]
    assert rows[other_run][:4] == ["16", "0.0", "0.1", "0.0"] and rows[parent] == ["-"] * 4
    assert "dataset.augment" not in headers and after[0].startswith("1 more job key(s) differ: dataset.augment ")


@pytest.mark.timeout(60)
def test_runs_shows_what_a_run_name_says_the_run_varies_whole(tmp_path, empty_mlflow_db, capsys):
    """A name runjob gave (what the run varies, `` · ``, its job) that does not fit is shown without
    the job's name where keeping it would cut what the run varies; else cut at its end."""
    uri, client, experiment = _sweep_store(tmp_path, empty_mlflow_db)
    names = {
        "bs=32 wd=0.0001 lr=0.003162 · digits": "bs=32 wd=0.0001 lr=0.003162",
        "lr=0.00466 bs=32 · diabetes-mlp": "lr=0.00466 bs=32 · diabet...",
        "lr=0.003162 · digits": "lr=0.003162 · digits",
        "bs=32 wd=0.0001 lr=0.003162 · other": "bs=32 wd=0.0001 lr=0.0031...",  # not its job's name
    }
    for minute, (name, job) in enumerate(zip(names, ["digits", "diabetes-mlp", "digits", "digits"], strict=True)):
        _record(client, experiment, name, minute, {"job.name": job}, {}, "FINISHED")

    code, out, _ = _cli(capsys, "runs", "--tracking-uri", uri)
    assert code == 0
    overview = out.split("\n\n")[0].splitlines()
    name, status = overview[0].index("run name"), overview[0].index("status")
    assert [line[name:status].strip() for line in overview[1:]] == list(names.values())[::-1]


@pytest.mark.timeout(60)
def test_runs_shows_a_callback_switched_off_as_a_difference(tmp_path, empty_mlflow_db, capsys):
    """`enabled = false` in one run differs from no such key (a default callback switched off),
    and from `true` (a listed callback switched off); `True` in the spelling of another recorder
    against no key does not."""
    uri, client, experiment = _sweep_store(tmp_path, empty_mlflow_db)
    base = {**SW_JOB, "optimizer.lr": "0.01"}
    runs = [
        _record(client, experiment, name, minute, {**base, **extra}, {}, "FINISHED")
        for minute, name, extra in [
            (0, "a", {"callbacks.throughput.enabled": "false", "callbacks.best_weights.enabled": "True"}),
            (1, "b", {"callbacks.ema.enabled": "true", "callbacks.ema.decay": "0.999"}),
            (2, "c", {"callbacks.ema.enabled": "false", "callbacks.ema.decay": "0.999"}),
        ]
    ]

    code, out, _ = _cli(capsys, "runs", "--tracking-uri", uri)
    assert code == 0
    headers, rows, after = _results(out)
    assert headers == ["ema.decay", "ema.enabled", "throughput.enabled"], out
    assert rows[runs[0]] == ["-", "-", "false"]
    assert rows[runs[1]] == ["0.999", "true", "-"] and rows[runs[2]] == ["0.999", "false", "-"]
    assert "best_weights" not in out and after == []


@pytest.mark.timeout(60)
def test_runs_across_experiments_limit_and_no_runs(store, capsys):
    uri, ids = store
    code, out, _ = _cli(capsys, "runs", "--limit", "2", "--tracking-uri", uri)
    assert code == 0
    assert ids["foreign"] in out and ids["secret"] in out and ids["slow"] not in out
    assert "cifar" in out and "epochs" in out  # a key only one run has differs too
    assert "--limit" in out.splitlines()[-1]

    code, out, _ = _cli(capsys, "runs", "--experiment", "empty", "--tracking-uri", uri)
    assert code == 0 and out.startswith("no runs in experiment empty")


@pytest.mark.timeout(60)
def test_runs_errors_are_one_line(store, capsys, tmp_path):
    uri, _ = store
    err = _one_line_error(*_cli(capsys, "runs", "--experiment", "digts", "--tracking-uri", uri)[::2])
    assert "digts" in err and "did you mean 'digits'?" in err and "cifar, digits, empty" in err

    missing = tmp_path / "nowhere.db"
    err = _one_line_error(*_cli(capsys, "runs", "--tracking-uri", f"sqlite:///{missing}")[::2])
    assert str(missing) in err
    assert not missing.exists(), "a mistyped store must not be created"


@pytest.mark.timeout(60)
def test_diff_shows_changed_keys_and_metric_deltas(store, capsys):
    uri, ids = store
    code, out, _ = _cli(capsys, "diff", ids["slow"], ids["fast"], "--tracking-uri", uri)
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
    assert rows["optimizer.lr"] == ["optimizer.lr", "0.001", "0.01"]
    assert "train.epochs" not in rows and "model.name" not in rows
    assert rows["val/accuracy"] == ["val/accuracy", "0.8", "0.9", "+0.1", "+12.5%"]
    assert rows["val/loss"] == ["val/loss", "0.4", "0.3", "-0.1", "-25.0%"]
    assert rows["lr"] == ["lr", "(absent)", "0.01"]
    assert "FINISHED" in out.splitlines()[0] and "FAILED" in out.splitlines()[1]

    code, out, _ = _cli(capsys, "diff", ids["slow"], ids["secret"], "--tracking-uri", uri)
    assert code == 0 and "job keys: identical (5 keys)" in out
    assert "val/accuracy" in out and "(absent)" in out


@pytest.mark.timeout(60)
def test_diff_and_rerun_of_an_unknown_run_exit_2(store, capsys):
    uri, ids = store
    unknown = "0" * 32
    err = _one_line_error(*_cli(capsys, "diff", ids["slow"], unknown, "--tracking-uri", uri)[::2])
    assert f"no run {unknown} at {uri}" in err
    err = _one_line_error(*_cli(capsys, "rerun", unknown, "--tracking-uri", uri)[::2])
    assert f"no run {unknown} at {uri}" in err


@pytest.mark.timeout(60)
def test_rerun_refuses_hidden_secrets_and_runs_without_job_toml(store, capsys, tmp_path, monkeypatch):
    uri, ids = store
    monkeypatch.chdir(tmp_path)
    err = _one_line_error(*_cli(capsys, "rerun", ids["secret"], "--tracking-uri", uri)[::2])
    assert "tracking.tags.api_token" in err and "--set" in err
    err = _one_line_error(*_cli(capsys, "rerun", ids["foreign"], "--tracking-uri", uri)[::2])
    assert "not made by runjob" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.timeout(60)
def test_rerun_hands_the_run_entry_the_job_tags_and_store(store, capsys, tmp_path, monkeypatch):
    """What `rerun` gives the run entry (which is tested on its own): the downloaded job kept in the
    new output folder, the overrides and launch flags, the rerun tag and the store the run was read
    from; nothing passes through the environment."""
    from runjob.train.entry import RunOutcome

    uri, ids = store
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    seen = {}

    def fake_run(job_file, overrides, **options):
        seen.update(options, job_file=job_file, overrides=overrides, text=Path(job_file).read_text())
        return RunOutcome(0, options["output_dir"])

    monkeypatch.setattr("runjob.commands.rerun.run", fake_run)  # the command calls the entry it imported
    code, _, err = _cli(
        capsys,
        "rerun",
        ids["secret"],
        "--tracking-uri",
        uri,
        "--set",
        "tracking.tags.api_token=abc",
        "--num-processes",
        "1",
        "--output-dir",
        "again",
    )
    assert code == 0, err
    assert seen["job_file"] == Path("again/rerun_source.toml") and seen["text"] == VALID_JOB
    assert seen["overrides"] == ["tracking.tags.api_token=abc", "launch.num_processes=1"]
    assert seen["output_dir"] == Path("again")
    assert seen["tags"] == {"runjob.rerun_of": ids["secret"]}
    assert seen["tracking_uri"] == uri
    assert seen["job"].source.path == Path("again/rerun_source.toml"), "validated once, from the kept copy"
    assert "MLFLOW_TRACKING_URI" not in os.environ


@pytest.mark.timeout(300)
def test_rerun_trains_the_recorded_job_again(tester):
    """One real training: the rerun of a run recorded as runjob records one (the first training is
    not needed to test rerun, and would double the cost)."""
    import tomli_w
    from mlflow.entities import Param

    from runjob.host.plugin_host import load_plugins
    from runjob.job.redaction import redact_tables
    from runjob.job.validation import load_resolved
    from runjob.record.naming import recorded_params

    tester.write_job(
        "job.toml",
        SMALL_DIGITS.format(name="again") + '[tracking]\nlog_model = "none"\nsystem_metrics_interval = 0\n',
    )
    resolved = load_resolved(tester.path / "job.toml", ["train.max_steps=2", "optimizer.lr=0.001"], load_plugins())
    job = redact_tables(resolved.to_dict())
    client = tester.client
    experiment = client.create_experiment("again", artifact_location=str(tester.path / "artifacts"))
    old = client.create_run(experiment, run_name="again").info.run_id
    client.log_batch(old, params=[Param(k, v) for k, v in recorded_params(resolved).items()])  # as runjob records them
    client.log_text(old, tomli_w.dumps(job), "job.toml")
    client.set_terminated(old, "FINISHED")

    result = tester.cli("rerun", old, "--set", "optimizer.lr=0.01")
    assert result.returncode == 0, result.stderr[-3000:]
    (new,) = [run for run in tester.runs("again") if run.tags.get("runjob.rerun_of") == old]
    assert new.status == "FINISHED"
    params = client.get_run(old).data.params
    changed = {k for k in params.keys() | new.params.keys() if params.get(k) != new.params.get(k)}
    assert changed == {"optimizer.lr"} and new.params["optimizer.lr"] == "0.01"
    source = Path(new.tags["runjob.job_file"])
    assert source.name == "rerun_source.toml" and source.parent == Path(new.tags["runjob.output_dir"])
