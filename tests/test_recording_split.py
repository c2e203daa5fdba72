"""The record split by side: the training side's recorder by role as a type, used in its order;
the pipe's messages as typed records; the recording process chosen explicitly and exercised here,
in this process; and the runs commands record themselves (an evaluation, a sweep's parent) written
locally first, so `runjob sync` restores what MLflow missed."""

from __future__ import annotations

import argparse
import json
import math
from types import SimpleNamespace

import pytest
from helpers import SMALL_DIGITS

from runjob.record import messages
from runjob.record.recorder import (
    MainRecorder,
    NodeRecorder,
    NoRecorder,
    Recorder,
    RecorderStateError,
    recorder_for,
)
from runjob.testing import MlflowRun, free_port, running_mlflow_server

pytestmark = pytest.mark.timeout(120)


def test_the_recorder_of_a_role_is_a_type_and_the_old_constructor_still_makes_it(tmp_path):
    for role, kind in (("main", MainRecorder), ("node", NodeRecorder), ("none", NoRecorder)):
        made = Recorder(tmp_path, role=role, machine_rank=1)
        assert type(made) is kind and isinstance(made, Recorder) and made.role == role
        assert type(recorder_for(role, tmp_path, 1)) is kind
    assert type(Recorder(tmp_path)) is MainRecorder, "role defaults to main, as before"
    assert Recorder(tmp_path, "main").active and not Recorder(tmp_path, "node").active
    with pytest.raises(ValueError, match="recorder role 'worker': expected one of main, node, none"):
        Recorder(tmp_path, role="worker")
    with pytest.raises(ValueError, match="NodeRecorder: role 'main'"):
        NodeRecorder(tmp_path, role="main")


def test_no_recorder_does_nothing_and_misuse_of_the_others_is_an_error(tmp_path):
    nothing = NoRecorder(tmp_path)
    nothing.start(tracking=None, experiment="x", run_name="x", params={}, tags={})
    nothing.log_metrics({"a": 1.0}, 1)
    nothing.set_tags({"a": "b"})
    nothing.end("FINISHED")
    assert list(tmp_path.iterdir()) == [], "a process that records nothing writes nothing"

    main = MainRecorder(tmp_path)
    with pytest.raises(RecorderStateError, match=r"MainRecorder.log_metrics: called before start\(\)"):
        main.log_metrics({"a": 1.0}, 1)
    with pytest.raises(RecorderStateError, match=r"MainRecorder.end: called before start\(\)"):
        main.end("FINISHED")
    tracking = SimpleNamespace(offline=True, log_model="none")
    main.start(tracking=tracking, experiment="x", run_name="x", params={}, tags={})
    with pytest.raises(RecorderStateError, match="called twice"):
        main.start(tracking=tracking, experiment="x", run_name="x", params={}, tags={})
    main.log_metrics({"a": 1.0}, 1)
    main.end("FINISHED")
    with pytest.raises(RecorderStateError, match=r"MainRecorder.set_tags: called after end\(\)"):
        main.set_tags({"late": "1"})

    node = NodeRecorder(tmp_path / "node", machine_rank=2)
    with pytest.raises(RecorderStateError, match=r"NodeRecorder.log_metrics at step 3: before join\(\)"):
        node.log_metrics({"system/cpu": 1.0}, 3)
    node.join(None, None, offline=True)
    node.log_metrics({"system/cpu": 1.0}, 3)
    node.end("FINISHED")
    assert (tmp_path / "node" / "metrics.node2.jsonl").read_text().count("system/cpu") == 1


def test_every_message_survives_the_pipe_and_a_wrong_one_names_its_kind():
    point = messages.Point("train/loss", 0.5, 3, 1000)
    said = [
        messages.Start("out", None, False, None, "e", "r", 1, {"t": "1"}, {"p": "2"}, True, "weights", "job", {}),
        messages.Join("out", "http://h", "abc"),
        messages.Metrics((point,)),
        messages.Tags({"a": "b"}),
        messages.Artifact("record/job.toml", None),
        messages.Input({"name": "digits", "context": "training"}),
        messages.Model("", {}, None),
        messages.End("FINISHED", 2),
        messages.Close(),
        messages.Started("abc", "sqlite:///m.db", "1", "sqlite:///m.db"),
        messages.Refused("no"),
        messages.ModelWritten(folder="mlflow_model", notes=("a note",)),
        messages.Ended(True, None, None, True),
    ]
    for message in said:
        assert messages.decode(messages.encode(message)) == message
    with pytest.raises(ValueError, match=r"tags message: fields \['tag'\], expected \['tags'\]"):
        messages.decode(json.dumps({"kind": "tags", "tag": {}}))
    with pytest.raises(ValueError, match="no known kind"):
        messages.decode(json.dumps({"metrics": []}))
    with pytest.raises(ValueError, match=r"^end message: end_time = 'soon': Input should be a valid integer"):
        messages.decode(json.dumps({"kind": "end", "status": "FINISHED", "end_time": "soon"}))
    odd = messages.decode(messages.encode(messages.Metrics((messages.Point("train/loss", float("nan"), 1, 2),))))
    assert math.isnan(odd.points[0].value)  # a NaN loss is recorded as one, not as null


@pytest.mark.slow
def test_a_run_in_a_process_that_imported_mlflow_records_in_its_own_process_when_asked(runjob_tester, monkeypatch):
    """MLflow is imported here, so by default a run would record in a thread: ``recording="process"``
    runs the production recording process (``python -m runjob.record.mirror``) all the same, and
    its MLflow run is whole."""
    import psutil

    from runjob.record import mirror
    from runjob.train.entry import run as run_job

    spawned = []
    real_spawn = mirror._spawn

    def spawn():
        process = real_spawn()
        spawned.append(psutil.Process(process.pid).cmdline())
        return process

    monkeypatch.setattr(mirror, "_spawn", spawn)
    tester = runjob_tester
    tester.install_tiny_models()
    tester.write_job("job.toml", SMALL_DIGITS.format(name="inproc"))
    outcome = run_job(
        tester.path / "job.toml", ["train.max_steps=3", "train.log_every=1"], output_dir="out", recording="process"
    )
    done = tester.record(outcome.output_dir)
    assert spawned and mirror.MODULE in " ".join(spawned[0])
    run = tester.only_run("inproc")
    assert outcome.exit_code == 0 and run.status == "FINISHED" and run.run_id == done.run_id
    assert run.steps("train/loss") == [1, 2, 3] and run.params["train.max_steps"] == "3"
    assert run.history("val/accuracy") == done.local_history("val/accuracy")
    assert run.models() == {"inproc"}, "the MLflow model, written by the recording process"
    assert "unsynced" not in done.record


def _digits_job(tester, name: str, extra: str = ""):
    from runjob.host.plugin_host import load_plugins
    from runjob.job.validation import load_resolved

    tester.install_tiny_models()
    path = tester.write_job("job.toml", SMALL_DIGITS.format(name=name) + extra)
    return load_resolved(path, [], load_plugins())


@pytest.mark.slow
def test_an_evaluation_recorded_while_the_server_is_down_is_restored_by_sync(runjob_tester, empty_mlflow_db):
    from runjob.commands.evaluate import record_evaluation
    from runjob.errors import TrackingError

    tester = runjob_tester
    job = _digits_job(tester, "judged")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    evaluated = SimpleNamespace(tracking_uri=uri, experiment=None, run_id="0123abc", output_dir=None, run_name="r1")
    folder = tester.path / "evaluation"
    args = argparse.Namespace(tracking_uri=None, split="val", overrides=[], output_dir=folder)
    with pytest.raises(TrackingError) as refused:
        record_evaluation(evaluated, job, args, {"val/accuracy": 0.75, "val/loss": 0.5})
    assert f"evaluated and recorded in {folder}, but MLflow at {uri} did not take the evaluation" in str(refused.value)
    assert f"`runjob sync {folder}` uploads it" in str(refused.value)
    record = tester.record(folder).record
    assert record["run_id"] is None and record["status"] == "FINISHED" and record["unsynced"]

    with running_mlflow_server(tester.path / "server", port, empty_mlflow_db):
        synced = tester.cli("sync", folder)
        assert synced.returncode == 0, synced.stderr
        run = MlflowRun.get(uri, tester.record(folder).run_id)
        assert run.status == "FINISHED" and run.run_name == "evaluate val · r1"
        assert run.metrics == {"val/accuracy": 0.75, "val/loss": 0.5}
        assert run.tags["runjob.evaluated_from"] == "0123abc" and run.tags["runjob.evaluated_split"] == "val"
        assert run.params["model.name"] == "tiny_cnn"
    assert "unsynced" not in tester.record(folder).record


def test_a_sweep_whose_server_is_down_at_the_start_stops_and_leaves_no_record(runjob_tester):
    from runjob.errors import TrackingError
    from runjob.sweep.parent import ParentRun

    uri = f"http://127.0.0.1:{free_port()}"
    extra = f'[tracking]\nuri = "{uri}"\n[sweep]\n[sweep.parameters]\n"optimizer.lr" = [0.001, 0.1]\n'
    job = _digits_job(runjob_tester, "unswept", extra)
    folder = runjob_tester.path / "sweep"
    with pytest.raises(TrackingError, match=f"cannot reach the MLflow tracking server at {uri} \\(tracking.uri\\)"):
        ParentRun.start(job, {"sweep.trials": "2"}, {"runjob.sweep": "true"}, folder)
    assert not (folder / "mlflow_run.json").exists(), "no sweep began: nothing for sync"
