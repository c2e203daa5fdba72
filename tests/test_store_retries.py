"""A busy store loses nothing: each failed MLflow write is tried again, a row another run inserted
first counts as written, one refused write never stops the rest of the record, and only a store
that stays unreachable turns the run local-only. And the suite never reads the user's environment."""

from __future__ import annotations

import json

import pytest
from helpers import SMALL_DIGITS

# What MLflow's sqlite store raises when two runs log the same dataset at the same moment
# (sqlalchemy's IntegrityError, wrapped by mlflow.store.db.utils), word for word.
DUPLICATE_DATASET = (
    "(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, datasets.name, datasets.digest"
)


def no_wait():
    from runjob.record.mlflow_writer import Retrying

    return Retrying(sleep=lambda seconds: None)


def failing(times: int, error: Exception, calls: list[str], name: str):
    """A write that raises ``error`` its first ``times`` calls, then succeeds (noted in ``calls``)."""
    left = [times]

    def call() -> None:
        if left[0] > 0:
            left[0] -= 1
            raise error
        calls.append(name)

    return call


def mlflow_error(message: str, code: str):
    """The ``MlflowException`` MLflow raises with error code ``code`` (a name of its protocol's codes)."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos import databricks_pb2

    return MlflowException(message, error_code=getattr(databricks_pb2, code))


def test_a_duplicate_row_is_tried_again_and_the_rest_of_the_record_is_still_sent():
    from runjob.record.mlflow_writer import Uploader

    calls: list[str] = []
    uploader = Uploader(lambda points: calls.append(f"{len(points)} points"), no_wait())
    uploader.submit(failing(1, mlflow_error(DUPLICATE_DATASET, "BAD_REQUEST"), calls, "dataset"), "dataset digits")
    uploader.submit_metrics([1, 2], 1)
    uploader.submit(failing(2, mlflow_error("database is locked", "TEMPORARILY_UNAVAILABLE"), calls, "end"), "end")
    assert uploader.close(timeout=30)
    assert calls == ["dataset", "2 points", "end"]
    assert uploader.retried == 2 and uploader.missed == [] and uploader.failure is None


def test_a_row_that_stays_duplicate_is_taken_as_written():
    from runjob.record.mlflow_writer import Uploader

    calls: list[str] = []
    uploader = Uploader(lambda points: None, no_wait())
    uploader.submit(failing(99, mlflow_error(DUPLICATE_DATASET, "BAD_REQUEST"), calls, "never"), "dataset digits")
    uploader.submit(lambda: calls.append("tags"), "tags")
    assert uploader.close(timeout=30), "the row is in the store: nothing is missing"
    assert calls == ["tags"] and uploader.retried == 1


def test_a_write_mlflow_refuses_for_good_is_skipped_and_the_rest_still_sent():
    from runjob.record.mlflow_writer import Uploader

    calls: list[str] = []
    refused = mlflow_error("Param value '0.1' had length 9000, which exceeded length limit", "INVALID_PARAMETER_VALUE")
    uploader = Uploader(lambda points: calls.append("points"), no_wait())
    uploader.submit(failing(99, refused, calls, "never"), "params")
    uploader.submit_metrics([1], 1)
    uploader.submit(lambda: calls.append("end"), "the run's end")
    assert not uploader.close(timeout=30), "a write is missing: the run is not fully synced"
    assert calls == ["points", "end"], "one refused write does not end the recording of the rest"
    assert uploader.missed == ["params"] and uploader.failed_at == "params" and not uploader.stopped
    assert uploader.retried == 0, "a refusal another try cannot change is not retried"


def test_only_a_store_that_stays_unreachable_stops_the_sending():
    from runjob.record.mlflow_writer import UNREACHABLE_AFTER, UNREACHABLE_TRIES, Uploader

    calls: list[str] = []
    gone = ConnectionError("[Errno 111] Connection refused")
    uploader = Uploader(lambda points: None, no_wait())
    uploader.submit(failing(UNREACHABLE_TRIES - 1, gone, calls, "tags"), "tags")  # back on its last try: a restart
    uploader.submit(failing(99, gone, calls, "never"), "metrics of step 5")
    uploader.submit(lambda: calls.append("never"), "the run's end")
    assert not uploader.close(timeout=30)
    assert calls == ["tags"] and uploader.stopped
    assert uploader.failed_at == "metrics of step 5" and uploader.missed == ["metrics of step 5", "the run's end"]

    # answers, but every write fails with an error that is not a refusal: gone all the same
    busy = Uploader(lambda points: None, no_wait())
    for n in range(UNREACHABLE_AFTER + 2):
        busy.submit(failing(99, mlflow_error("internal error", "INTERNAL_ERROR"), calls, "never"), f"write {n}")
    assert not busy.close(timeout=30)
    assert busy.stopped and len(busy.missed) == UNREACHABLE_AFTER + 2 and "never" not in calls


def test_a_run_whose_dataset_row_another_run_inserted_first_is_whole_in_mlflow(tester, monkeypatch):
    # MLflow imported here first: the run then records in a thread of this process, where it is patched
    from mlflow import MlflowClient

    real = MlflowClient.log_inputs
    raised: list[str] = []

    def racing(self, run_id, datasets=None, models=None):
        if not raised:  # as when another trial's identical dataset row landed a moment before
            raised.append(run_id)
            raise mlflow_error(DUPLICATE_DATASET, "BAD_REQUEST")
        return real(self, run_id, datasets=datasets, models=models)

    monkeypatch.setattr(MlflowClient, "log_inputs", racing)
    tester.write_job("job.toml", SMALL_DIGITS.format(name="busy") + "max_steps = 6\nlog_every = 1\n")
    run = tester.run("job.toml", output_dir="out")
    assert raised, "the dataset input was logged through the patched client"
    mlflow_run = run.mlflow
    assert mlflow_run is not None and mlflow_run.status == "FINISHED"
    assert run.status == "FINISHED" and "unsynced" not in run.record
    assert mlflow_run.inputs, "the dataset input is there after its second try"
    assert mlflow_run.history("train/loss") == run.local_history("train/loss")
    assert len(mlflow_run.history("train/loss")) == 6
    assert mlflow_run.tags["runjob.tracking.retried"] == "1"
    assert "MLflow write retried" in (tester.path / "out" / "runjob.log").read_text()


def test_the_suite_never_sees_the_users_mlflow_hf_optuna_or_runjob_settings(pytester, monkeypatch):
    """A developer whose shell exports a team's tracking server (here one that is not there), a
    Hugging Face token and runjob settings: a suite using the kit sees none of them, and its runs
    record into each test's own store."""
    from runjob.commands.cli import main  # imported out here: pytester forgets the inner session's modules

    assert main
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team-experiment")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("OPTUNA_STORAGE", "postgresql://team/optuna")
    monkeypatch.setenv("RUNJOB_DISABLE_PLUGINS", "digits")
    pytester.makeconftest('pytest_plugins = ["runjob.testing"]')
    pytester.makepyfile(
        """
        import os, subprocess, sys

        def test_settings_removed_and_mlflow_in_the_tests_folder(tmp_path):
            assert os.environ["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path / 'mlflow.db'}"
            assert os.environ["HF_HOME"] == str(tmp_path / "hf_home") and os.environ["HF_HUB_OFFLINE"] == "1"
            for name in ("MLFLOW_EXPERIMENT_NAME", "HF_TOKEN", "OPTUNA_STORAGE", "RUNJOB_DISABLE_PLUGINS"):
                assert name not in os.environ, name

        def test_processes_a_test_starts_see_the_same():
            seen = subprocess.run(
                [sys.executable, "-c", "import os; print(os.environ['MLFLOW_TRACKING_URI'], 'HF_TOKEN' in os.environ)"],
                capture_output=True, text=True, check=True,
            ).stdout.split()
            assert seen[0].startswith("sqlite:///") and seen[1] == "False"

        def test_a_command_reads_the_tests_own_store_not_the_users_server(tmp_path, capsys):
            from runjob.commands.cli import main

            main(["runs"])  # nothing recorded yet: it names the store it looked in
            said = capsys.readouterr().err
            assert str(tmp_path / "mlflow.db") in said and "127.0.0.1:9" not in said
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=3)
    import os

    assert os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:9", "put back after the session"


LOSE_TRIAL_0S_SERVER = """
import runjob


@runjob.hookimpl
def runjob_after_step(run, step, epoch, loss):
    # from trial 0's step 3 on, its process gets no answer from MLflow (a network cut on its
    # machine): its MLflow run is left RUNNING with part of its points, its local record goes on whole
    if step == 3 and run.output_dir.name == "trial-000":
        from mlflow import MlflowClient

        def no_answer(*args, **kwargs):
            raise ConnectionError("[Errno 111] Connection refused")

        MlflowClient.log_batch = no_answer
        MlflowClient.set_terminated = no_answer
"""


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_sweep_sends_a_trials_lost_record_when_the_trial_ends_and_leaves_no_trial_running(tester):
    tester.install_plugin("network-cut", {"network_cut": LOSE_TRIAL_0S_SERVER}, {"network_cut": "network_cut"})
    tester.write_job(
        "job.toml",
        SMALL_DIGITS.format(name="lost")
        + """
    max_steps = 8
    log_every = 1
    [tracking]
    log_model = "none"
    [sweep]
    [sweep.parameters]
    "optimizer.lr" = [0.01, 0.005]
    """,
    )
    result = tester.cli("sweep", "job.toml", "--output-dir", "sweep")
    assert result.returncode == 0, result.stderr[-3000:]
    synced = [tester.record(tester.path / f"sweep/trial-00{n}").record.get("synced_at") for n in (0, 1)]
    assert synced[0] and not synced[1], "trial 0 lost MLflow and the sweep sent its record"
    children = [r for r in tester.runs("lost") if r.tags.get("runjob.sweep") != "true"]
    assert sorted(r.tags["runjob.sweep.trial"] for r in children) == ["0", "1"]
    for child in children:
        local = tester.record(tester.path / f"sweep/trial-00{child.tags['runjob.sweep.trial']}")
        assert child.status == "FINISHED", "no trial of a finished sweep is left RUNNING in MLflow"
        assert (
            child.history("train/loss") == local.local_history("train/loss")
            and len(local.local_history("train/loss")) == 8
        )
        assert "unsynced" not in local.record, "the sweep sent what the trial's MLflow run lacked"
    assert "warning" not in result.stdout
    assert all(row["unsynced"] is None for row in json.loads((tester.path / "sweep/trials.json").read_text()))


def test_a_trial_record_the_sweep_cannot_send_is_named_with_runjob_sync(tmp_path):
    from runjob.record.local import RunRecord
    from runjob.record.sync import make_whole

    record = RunRecord(run_id="0123456789abcdef", tracking_uri="http://127.0.0.1:9", experiment="e", run_name="r")
    record.status, record.unsynced = "FINISHED", "metrics of step 5: ConnectionError: Connection refused"
    record.write(tmp_path)
    said = make_whole(tmp_path)
    assert said is not None and said.endswith(f"`runjob sync {tmp_path}`")
    assert "metrics of step 5" in said
