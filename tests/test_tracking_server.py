"""Recording to a real MLflow tracking server on 127.0.0.1: the complete record of a run, read
back through MlflowClient; a server that is down at the start, or goes away mid-run; offline
runs; and `runjob sync`, which makes the MLflow run complete from the local record.

The servers are real processes. The complete record is that of a run in a process of its own,
and so is the run whose server goes away under it; the other runs and syncs run in this process."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from helpers import RESNET18_DIGITS, SMALL_DIGITS, installed_plugin_tags, local_points, server_points, uploaded_best

from runjob.testing import MlflowRun, free_port, running_mlflow_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
RUN_TIMEOUT = 600


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def logged_losses(out: Path) -> int:
    """train/loss lines written so far (read while the run writes)."""
    path = out / "metrics.jsonl"
    return path.read_text().count('"train/loss"') if path.exists() else 0


def test_a_run_carries_its_complete_record(runjob_tester, mlflow_server):
    import io

    import mlflow.pytorch
    import pandas as pd
    import torch
    import torchvision
    from PIL import Image
    from safetensors.torch import load_file

    tmp_path = runjob_tester.path
    repo = tmp_path / "repo"
    runjob_tester.write_job(
        repo / "base.toml",
        RESNET18_DIGITS.format(name="complete")
        + '\n[tracking]\nexperiment = "server-test"\n[tracking.tags]\nteam = "vision"\n',
    )
    runjob_tester.write_job(repo / "job.toml", 'extends = "base.toml"\n[optimizer]\nname = "sgd"\nlr = 0.05\n')
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "jobs")
    (repo / "job.toml").write_text((repo / "job.toml").read_text() + "# an uncommitted note\n")
    result = runjob_tester.cli_subprocess(
        repo / "job.toml",
        "--set",
        f"tracking.uri={mlflow_server}",
        "--set",
        "train.max_steps=6",
        "--set",
        "train.log_every=2",
        "--set",
        "tracking.system_metrics_interval=1",
        "--output-dir",
        "out",
        timeout=RUN_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "out"
    assert not runjob_tester.has_experiment("server-test"), "the local default store must not be used"

    run = runjob_tester.only_run("server-test", tracking_uri=mlflow_server)
    assert runjob_tester.record(out).run_id == run.run_id
    run_id, tags, params = run.run_id, run.tags, run.params
    assert run.status == "FINISHED" and run.run_name == "max_steps=6 log_every=2 · complete"
    # params: the whole resolved job, flattened
    assert params["optimizer.name"] == "sgd" and params["optimizer.lr"] == "0.05" and params["train.max_steps"] == "6"
    assert params["tracking.uri"] == mlflow_server and params["job.seed"] == "0"
    # tags: versions, plugins, git, the actual setup, the best evaluation
    assert tags["team"] == "vision" and tags["runjob.version"] == "0.1.0"
    assert tags["runjob.torch_version"]
    assert {tag for tag in tags if tag.startswith("runjob.plugin.")} == installed_plugin_tags(), "none for built-ins"
    assert tags["runjob.accelerate_version"] and tags["runjob.cuda_version"]
    assert tags["mlflow.source.git.commit"] == git(repo, "rev-parse", "HEAD") and tags["runjob.git.dirty"] == "true"
    assert (
        tags["runjob.distributed_type"],
        tags["runjob.world_size"],
        tags["runjob.num_machines"],
        tags["runjob.mixed_precision"],
    ) == ("NO", "1", "1", "no")
    assert float(tags["runjob.flops_per_sample"]) > 1e6
    # metrics, each also in metrics.jsonl
    assert run.steps("train/loss") == [2, 4, 6]
    keys = set(run.metrics)
    assert {"lr", "train/samples_per_s", "train/tflops", "train/peak_rss_gib", "val/loss", "val/accuracy"} <= keys
    assert len(run.history("system/node0/cpu_utilization_percentage")) >= 2
    assert "system/node0/system_memory_usage_megabytes" in keys
    assert server_points(run, local_points(out)) == local_points(out)
    accuracy_step = run.steps("val/accuracy")[-1]
    assert (tags["runjob.best.metric"], tags["runjob.best.step"]) == ("val/accuracy", str(accuracy_step))
    # dataset lineage
    (data,) = run.inputs
    assert data.dataset.name == "digits" and len(data.dataset.digest) >= 8
    assert json.loads(data.dataset.profile) == {"train_samples": 1438, "val_samples": 359, "num_classes": 10}
    # artifacts: the resolved job, where each value came from, the record of named models (best), the predictor
    # as data (runjob predict runs:/ID reads it), the MLflow model
    assert {"job.toml", "job_sources.json", "models.json", "predictor"} <= run.artifacts()
    assert run.artifacts("predictor") == {"predictor/predictor.json"}
    assert run.models() == {"complete"}, "the MLflow model is the run's logged model, named after the job"
    folder = tmp_path / "downloaded"
    sources = json.loads(run.download("job_sources.json", folder).read_text())
    assert sources["optimizer.lr"]["from"] == "job file" and sources["optimizer.lr"]["line"] == 4
    assert sources["model.name"]["from"] == "extends" and sources["model.name"]["file"] == str(repo / "base.toml")
    assert sources["train.max_steps"] == {"value": "6", "from": "--set"} and sources["job.seed"] == {
        "value": "0",
        "from": "default",
    }
    assert run.download("job.toml", folder).read_text() == (out / "job.toml").read_text()
    assert run.artifacts("best") == uploaded_best(out)
    # the final model loads back with MLflow's own API and is the trained one
    previous_uri = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(mlflow_server)
    try:
        logged = mlflow.pyfunc.load_model(f"runs:/{run_id}/complete")
    finally:
        mlflow.set_tracking_uri(previous_uri)
    reference = torchvision.models.resnet18(num_classes=10)
    reference.load_state_dict(load_file(out / "model.safetensors"))
    images = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        expected = reference.eval()(images)
        assert torch.equal(logged.get_raw_model()(images), expected), "the module, with the final weights"
    # predict: an image file's bytes in, the class and its probability out, as runjob predict gives them
    png = io.BytesIO()
    Image.fromarray((torch.rand(8, 8) * 255).to(torch.uint8).numpy(), mode="L").save(png, format="PNG")
    rows = logged.predict(pd.DataFrame({"image": [png.getvalue()]}))
    encoded = logged._model_impl.predictor.inputs.encode({"image": png.getvalue()})  # rebuilt from predictor.json
    with torch.no_grad():
        probabilities = reference(encoded[None]).softmax(-1)[0]
    assert rows["class"].tolist() == [str(int(probabilities.argmax()))]
    assert rows["probability"][0] == pytest.approx(float(probabilities.max()), rel=1e-5)


def test_server_down_at_start_is_an_error_unless_offline_and_sync_uploads_later(tester, empty_mlflow_db):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    tester.write_job("job.toml", SMALL_DIGITS.format(name="offline") + f'[tracking]\nuri = "{uri}"\n')
    refused = tester.cli("job.toml", "--set", "train.max_steps=2")
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert (
        f"cannot reach the MLflow tracking server at {uri} (tracking.uri)" in line and "tracking.offline = true" in line
    )

    result = tester.cli(
        "job.toml",
        "--set",
        "train.max_steps=4",
        "--set",
        "train.log_every=1",
        "--set",
        "tracking.offline=true",
        "--output-dir",
        "out",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "recording offline" in result.stdout
    out = tester.path / "out"
    assert tester.record(out).run_id is None

    with running_mlflow_server(tester.path / "server", port, empty_mlflow_db):
        for _ in range(2):  # syncing again changes nothing
            synced = tester.cli("sync", "out")
            assert synced.returncode == 0, synced.stderr[-3000:]
        run = tester.only_run("offline", tracking_uri=uri)
        assert run.status == "FINISHED" and run.run_id == tester.record(out).run_id
        assert run.params["train.max_steps"] == "4" and run.tags["runjob.version"] == "0.1.0"
        assert server_points(run, local_points(out)) == local_points(out)
        assert run.steps("train/loss") == [1, 2, 3, 4]
        assert {"job.toml", "job_sources.json"} <= run.artifacts() and run.models() == {"offline"}
        assert run.inputs[0].dataset.name == "digits"


GATE_PLUGIN = """
    import os, time
    import runjob

    @runjob.hookimpl
    def runjob_after_step(step):
        # after the first logged step, wait until the test says the server is gone
        if step == 2:
            deadline = time.monotonic() + 600
            while not os.path.exists(os.environ["GATE_FILE"]) and time.monotonic() < deadline:
                time.sleep(0.05)
"""


def test_server_lost_mid_run_training_goes_on_and_sync_restores_every_point(tester, empty_mlflow_db):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    tester.install_plugin("fake-gate", {"fake_gate": GATE_PLUGIN}, {"gate": "fake_gate"})
    tester.write_job("job.toml", SMALL_DIGITS.format(name="lost") + f'[tracking]\nuri = "{uri}"\n')
    out = tester.path / "out"
    gate = tester.path / "server-stopped"
    with running_mlflow_server(tester.path / "server", port, empty_mlflow_db):
        proc = tester.popen(
            "job.toml",
            "--set",
            "train.max_steps=60",
            "--set",
            "train.log_every=1",
            "--output-dir",
            "out",
            env={"GATE_FILE": str(gate)},
        )  # killed after the test if still running
        while not logged_losses(out):  # the run has begun recording to the server
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.2)
    gate.touch()  # the server is gone; training must carry on to the end
    stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, stderr[-3000:]
    assert "upload it with `" in stdout and " -m runjob sync out`" in stdout, "runjob sync, as runjob was started"
    record = tester.record(out)
    assert record.record["status"] == "FINISHED" and record.record["unsynced"]

    with running_mlflow_server(tester.path / "server", port):
        run = MlflowRun.get(uri, record.run_id)
        losses = local_points(out)["train/loss"]
        assert len(losses) == 60
        assert len(run.history("train/loss")) < 60, "points sent after the server died cannot be there yet"
        synced = tester.cli("sync", "out")
        assert synced.returncode == 0, synced.stderr[-3000:]
        run = run.reload()
        assert run.status == "FINISHED"
        assert server_points(run, local_points(out)) == local_points(out)
        assert {"job.toml", "models.json"} <= run.artifacts() and run.models() == {"lost"}
        assert "unsynced" not in tester.record(out).record
