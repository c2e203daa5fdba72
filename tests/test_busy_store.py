"""One MLflow store written by several runs at once (issue 30): runs logging every step together
into the default sqlite store and into an `mlflow server`; a sweep whose Optuna study is on
PostgreSQL, joined by its URL; and 2-worker sweeps on the default store, whose two first trials start together and
write the same dataset row at once. Every run must end FINISHED in MLflow with every point of its
metrics.jsonl: a busy store is retried, never a reason to stop recording.

Every run here is a process of its own (or a trial forked from a sweep worker), as a user's runs
are; each test's processes are killed after it (runjob.testing), PostgreSQL and the MLflow
server are stopped on the way out."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from helpers import NO_POSTGRES, SMALL_DIGITS, local_points, postgres_bin, running_postgres, server_points

from runjob.testing import RecordedRun, running_mlflow_server

pytestmark = pytest.mark.e2e

RETRIED_TAG = "runjob.tracking.retried"  # writes that needed another try (absent: none)
RETRY_LINE = "runjob: MLflow write retried"  # one line of OUTPUT_DIR/runjob.log a retry
# no MLflow model, no system metrics: what is left is what a busy store contends for, the run's
# creation, params and tags, its dataset input, a point every step, its end
QUIET = ("--set", "tracking.log_model=none", "--set", "tracking.system_metrics_interval=0")
EVERY_STEP = ("--set", "train.log_every=1", "--set", "train.max_steps={steps}")


# The model tiny_cnn, built only once every run of the test (TOGETHER of them) has come to build
# it: they leave their build at the same moment, so their MLflow runs are created and their
# dataset inputs logged at about the same moment too (runjob.train.runner: build, open the record,
# log the input). Where a run records from its training process (a sweep's forked trial, through
# a thread), its store's insert of the dataset row waits for the others' too (a SQLAlchemy
# before_flush listener: MLflow's sqlite store looks for the row, finds none and inserts it, in
# one session), so each inserts a row none of them saw: the race issue 30 found, on every try
# rather than on a lucky one.
TOGETHER_PLUGIN = """
    import os, time
    from pathlib import Path

    import runjob
    from runjob.testing import TinyCNNOptions, build_tiny_cnn

    def meet(folder):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / str(os.getpid())).touch()
        deadline = time.monotonic() + 120
        while len(list(folder.iterdir())) < int(os.environ["TOGETHER"]) and time.monotonic() < deadline:
            time.sleep(0.002)

    def inserting_dataset(session, context, instances):
        if any(getattr(row, "__tablename__", None) == "datasets" for row in session.new):
            meet(Path(os.environ["TOGETHER_DIR"]) / "dataset")

    def build(options):
        import sqlalchemy.event
        import sqlalchemy.orm

        meet(Path(os.environ["TOGETHER_DIR"]) / "build")
        if not sqlalchemy.event.contains(sqlalchemy.orm.Session, "before_flush", inserting_dataset):
            sqlalchemy.event.listen(sqlalchemy.orm.Session, "before_flush", inserting_dataset)
        return build_tiny_cnn(options)

    @runjob.hookimpl
    def runjob_register_models(register):
        register("tiny_cnn_together", build, options=TinyCNNOptions, description="tiny_cnn, built together")
"""


def together(tester, monkeypatch, runs: int, name: str) -> str:
    """Install the plugin above: the next ``runs`` runs started from this test (they inherit its
    environment) build their model together. Returns SMALL_DIGITS with that model, named ``name``
    (a name of its own each time: it names the meeting place too)."""
    if not any("together" in site.name for site in tester.sites):
        tester.install_plugin("together", {"runjob_together": TOGETHER_PLUGIN})
    monkeypatch.setenv("TOGETHER_DIR", str(tester.path / f"together-{name}"))
    monkeypatch.setenv("TOGETHER", str(runs))
    return SMALL_DIGITS.format(name=name).replace('"tiny_cnn"', '"tiny_cnn_together"')


@pytest.fixture
def postgres():
    """The URL of a private PostgreSQL server with an empty database ``optuna``; skipped only where
    PostgreSQL is not installed (CI installs it)."""
    if postgres_bin() is None:
        pytest.skip(NO_POSTGRES)
    with running_postgres(["optuna"]) as url:
        yield url


def assert_complete(record: RecordedRun) -> None:
    """The run's MLflow record is whole: FINISHED, every point of its metrics.jsonl there, its
    dataset input; and a run whose runjob.log has retried writes says so in MLflow (the tag)."""
    run = record.mlflow
    assert run is not None, f"{record.output_dir}: no MLflow run recorded"
    assert run.status == "FINISHED", f"{record.output_dir}: {run.status} in MLflow"
    local = local_points(record.output_dir)
    assert local, f"{record.output_dir}: nothing in metrics.jsonl"
    assert server_points(run, local) == local, f"{record.output_dir}: points missing in MLflow"
    assert [data.dataset.name for data in run.inputs] == ["digits"], "its dataset input too"
    retries = (record.output_dir / "runjob.log").read_text(errors="replace").count(RETRY_LINE)
    retried = int(run.tags.get(RETRIED_TAG, "0"))  # writes retried; a write retried twice has two lines
    assert retried <= retries and bool(retried) == bool(retries), (
        f"{record.output_dir}: {retried} tagged, {retries} in runjob.log"
    )


@pytest.mark.timeout(600)
def test_runs_logging_every_step_at_once_all_finish_with_every_point(tester, empty_mlflow_db, monkeypatch):
    """Four runs started together, each logging every step: two into the default sqlite store
    (two writers of one file: `database is locked`), two into an `mlflow server`; in each store the
    two insert the same dataset row at their start."""
    tester.write_job("job.toml", together(tester, monkeypatch, 4, "busy"))
    every_step = [part.format(steps=40) for part in EVERY_STEP]
    with running_mlflow_server(tester.path / "server", template=empty_mlflow_db) as server:
        stores = [None, None, server, server]  # None: the default store ($MLFLOW_TRACKING_URI, sqlite)
        runs = []
        for n, uri in enumerate(stores):
            store = ("--set", f"tracking.uri={uri}") if uri else ()
            with open(tester.path / f"run-{n}.log", "w") as log:  # a file: four full pipes would stall them
                command = ("job.toml", *QUIET, *every_step, *store, "--output-dir", f"run-{n}")
                runs.append(tester.popen(*command, stdout=log, stderr=subprocess.STDOUT))
        codes = [run.wait(timeout=500) for run in runs]
        logs = [(tester.path / f"run-{n}.log").read_text()[-2000:] for n in range(4)]
        assert codes == [0] * 4, logs
        for n, uri in enumerate(stores):
            record = tester.record(f"run-{n}")
            assert record.tracking_uri == (uri or tester.tracking_uri)
            assert len(record.local_history("train/loss")) == 40
            assert_complete(record)


def sweep_children(tester, experiment: str) -> list:
    """The trials' MLflow runs of the sweep recorded in ``experiment``, by trial number, after
    checking there is one parent and it FINISHED."""
    runs = tester.runs(experiment)
    [parent] = [run for run in runs if run.tags.get("runjob.sweep") == "true"]
    assert parent.status == "FINISHED"
    children = [run for run in runs if run is not parent]
    assert {child.tags["mlflow.parentRunId"] for child in children} == {parent.run_id}
    return sorted(children, key=lambda child: int(child.tags["runjob.sweep.trial"]))


@pytest.mark.timeout(600)
def test_a_sweep_with_its_study_on_postgresql_joined_by_its_url_runs_each_trial_once(tester, postgres, monkeypatch):
    """`[sweep] storage = "postgresql://..."`: the sweep starts with one worker, a second process
    joins it by the storage's URL (`--join postgresql://...`, as a job on another machine would),
    the two take the study's four trials from PostgreSQL, each trial once, and every trial ends
    COMPLETE in the study and FINISHED with its whole record in MLflow."""
    optuna = pytest.importorskip("optuna")
    storage = f"{postgres}/optuna"
    tester.write_job(
        "job.toml",
        together(tester, monkeypatch, 2, "pg")  # the first trial waits for the joiner's
        + f"""
    [sweep]
    method = "random"
    trials = 4
    storage = "{storage}"
    study = "busy"
    [sweep.parameters]
    "optimizer.lr" = {{ low = 1e-4, high = 1e-1, log = true }}
    """,
    )
    every_step = [part.format(steps=4) for part in EVERY_STEP]
    commands = [("--workers", "1", "--output-dir", "sweep"), ("--join", storage)]
    workers = []
    for n, where in enumerate(commands):
        if n:  # the joiner finds the sweep's folder in the study: once the sweep is created
            deadline = time.monotonic() + 300
            while not (tester.path / "sweep/sweep.json").exists():
                assert workers[0].poll() is None and time.monotonic() < deadline, (tester.path / "w0.log").read_text()
                time.sleep(0.1)
        with open(tester.path / f"w{n}.log", "w") as log:
            command = ("sweep", "job.toml", *QUIET, *every_step, *where)
            workers.append(tester.popen(*command, stdout=log, stderr=subprocess.STDOUT))
    codes = [worker.wait(timeout=500) for worker in workers]
    outputs = [(tester.path / f"w{n}.log").read_text() for n in range(2)]
    assert codes == [0, 0], [output[-2000:] for output in outputs]
    took = [output.count(": starting in ") for output in outputs]
    assert sum(took) == 4 and all(took), took

    study = optuna.load_study(study_name="busy", storage=storage)
    assert sorted(t.number for t in study.trials) == [0, 1, 2, 3]
    assert {t.state.name for t in study.trials} == {"COMPLETE"}
    children = sweep_children(tester, "pg")
    assert [child.tags["runjob.sweep.trial"] for child in children] == ["0", "1", "2", "3"], "no trial run twice"
    trials = json.loads((tester.path / "sweep/trials.json").read_text())
    assert [(t["trial"], t["state"]) for t in trials] == [(n, "finished") for n in range(4)]
    for trial, child in zip(trials, children, strict=True):
        record = tester.record(f"sweep/trial-{trial['trial']:03d}")
        assert record.run_id == child.run_id == trial["run_id"]
        assert [value for _, value in record.local_history("val/accuracy")][-1] == study.trials[trial["trial"]].value
        assert_complete(record)


@pytest.mark.timeout(600)
def test_a_two_worker_sweep_on_the_default_store_leaves_every_trial_finished_with_every_point(tester, monkeypatch):
    """The done-when of issue 30: a 2-worker sweep into the default sqlite store whose two workers'
    first trials insert the same dataset row at the same moment (before the fix, such a sweep left a
    trial RUNNING in MLflow without its points; on a user's machine, 1 sweep in 2). Issue 30 ran five
    of them; the plugin above makes the two inserts meet on every sweep, so one sweep is the race."""
    every_step = [part.format(steps=3) for part in EVERY_STEP]
    sweep = '    [sweep]\n    [sweep.parameters]\n    "optimizer.lr" = [0.01, 0.005]\n'
    tester.write_job("job.toml", together(tester, monkeypatch, 2, "busy-sweep") + sweep)
    result = tester.cli("sweep", "job.toml", "--workers", "2", *QUIET, *every_step, "--output-dir", "s")
    assert result.returncode == 0, result.stderr[-3000:]
    children = sweep_children(tester, "busy-sweep")
    assert [child.tags["runjob.sweep.trial"] for child in children] == ["0", "1"]
    for trial, child in enumerate(children):
        record = tester.record(f"s/trial-{trial:03d}")
        assert record.run_id == child.run_id
        assert_complete(record)
