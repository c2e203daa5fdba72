"""Recording to a real MLflow tracking server on 127.0.0.1: the complete record of a run, read
back through MlflowClient; a server that is down at the start, or goes away mid-run; offline
runs; and `runjob sync`, which makes the MLflow run complete from the local record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import clean_env, free_port, running_mlflow_server, write_job
from test_training import SMALL_DIGITS

pytestmark = pytest.mark.timeout(300)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def local_points(out: Path) -> dict[str, list[tuple[int, float]]]:
    """Every metric point of the run's local record, by key."""
    points: dict[str, list[tuple[int, float]]] = {}
    for path in out.glob("metrics*.jsonl"):
        for line in path.read_text().splitlines():
            point = json.loads(line)
            points.setdefault(point["key"], []).append((point["step"], point["value"]))
    return {key: sorted(values) for key, values in points.items()}


def logged_losses(out: Path) -> int:
    """train/loss lines written so far (read while the run writes)."""
    path = out / "metrics.jsonl"
    return path.read_text().count('"train/loss"') if path.exists() else 0


def server_points(client, run_id: str, keys) -> dict[str, list[tuple[int, float]]]:
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in keys}


def test_a_run_carries_its_complete_record(runjob_cli, tmp_path, mlflow_server):
    from mlflow import MlflowClient

    repo = tmp_path / "repo"
    write_job(
        repo / "base.toml",
        SMALL_DIGITS.format(name="complete")
        + '\n[tracking]\nexperiment = "server-test"\n[tracking.tags]\nteam = "vision"\n',
    )
    write_job(repo / "job.toml", 'extends = "base.toml"\n[optimizer]\nname = "sgd"\nlr = 0.05\n')
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "jobs")
    (repo / "job.toml").write_text((repo / "job.toml").read_text() + "# an uncommitted note\n")
    result = runjob_cli(
        str(repo / "job.toml"),
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
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "out"
    local = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert local.get_experiment_by_name("server-test") is None, "the local default store must not be used"

    client = MlflowClient(tracking_uri=mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name("server-test").experiment_id])
    run_id, tags, params = run.info.run_id, run.data.tags, run.data.params
    assert run.info.status == "FINISHED" and run.info.run_name == "complete"
    # params: the whole resolved job, flattened
    assert params["optimizer.name"] == "sgd" and params["optimizer.lr"] == "0.05" and params["train.max_steps"] == "6"
    assert params["tracking.uri"] == mlflow_server and params["job.seed"] == "0"
    # tags: versions, plugins, git, the actual setup, the best evaluation
    assert tags["team"] == "vision" and tags["runjob.version"] == "0.1.0"
    assert tags["runjob.plugin.torchvision_models"] == "runjob-train 0.1.0" and tags["runjob.torch_version"]
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
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [2, 4, 6]
    keys = set(run.data.metrics)
    assert {"lr", "train/samples_per_s", "train/tflops", "train/peak_rss_gib", "val/loss", "val/accuracy"} <= keys
    assert len(client.get_metric_history(run_id, "system/node0/cpu_utilization_percentage")) >= 2
    assert "system/node0/system_memory_usage_megabytes" in keys
    assert server_points(client, run_id, local_points(out)) == local_points(out)
    accuracy = client.get_metric_history(run_id, "val/accuracy")[-1]
    assert (tags["runjob.best.metric"], tags["runjob.best.step"]) == ("val/accuracy", str(accuracy.step))
    # dataset lineage
    (data,) = run.inputs.dataset_inputs
    assert data.dataset.name == "digits" and len(data.dataset.digest) >= 8
    assert json.loads(data.dataset.profile) == {"train_samples": 1438, "val_samples": 359, "num_classes": 10}
    # artifacts: the resolved job, where each value came from, final weights, best weights, the MLflow model
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"job.toml", "job_sources.json", "model.safetensors", "best", "model"} <= artifacts
    folder = tmp_path / "downloaded"
    sources = json.loads(Path(client.download_artifacts(run_id, "job_sources.json", str(folder))).read_text())
    assert sources["optimizer.lr"]["from"] == "job file" and sources["optimizer.lr"]["line"] == 4
    assert sources["model.name"]["from"] == "extends" and sources["model.name"]["file"] == str(repo / "base.toml")
    assert sources["train.max_steps"] == {"value": "6", "from": "--set"} and sources["job.seed"] == {
        "value": "0",
        "from": "default",
    }
    assert (
        Path(client.download_artifacts(run_id, "job.toml", str(folder))).read_text() == (out / "job.toml").read_text()
    )
    assert {a.path for a in client.list_artifacts(run_id, "best")} == {"best/model.safetensors", "best/best.json"}
    # the final model loads back with MLflow's own API and is the trained one
    import mlflow.pytorch
    import torch
    import torchvision
    from safetensors.torch import load_file

    previous_uri = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(mlflow_server)
    try:
        logged = mlflow.pytorch.load_model(f"runs:/{run_id}/model")
    finally:
        mlflow.set_tracking_uri(previous_uri)
    reference = torchvision.models.resnet18(num_classes=10)
    reference.load_state_dict(load_file(out / "model.safetensors"))
    images = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(logged.eval()(images), reference.eval()(images))


def test_server_down_at_start_is_an_error_unless_offline_and_sync_uploads_later(runjob_cli, tmp_path, empty_mlflow_db):
    from mlflow import MlflowClient

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    write_job(tmp_path / "job.toml", SMALL_DIGITS.format(name="offline") + f'[tracking]\nuri = "{uri}"\n')
    refused = runjob_cli("job.toml", "--set", "train.max_steps=2", timeout=120)
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert (
        f"cannot reach the MLflow tracking server at {uri} (tracking.uri)" in line and "tracking.offline = true" in line
    )

    result = runjob_cli(
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
    out = tmp_path / "out"
    assert json.loads((out / "mlflow_run.json").read_text())["run_id"] is None

    with running_mlflow_server(tmp_path / "server", port, empty_mlflow_db):
        for _ in range(2):  # syncing again changes nothing
            synced = runjob_cli("sync", "out")
            assert synced.returncode == 0, synced.stderr[-3000:]
        client = MlflowClient(tracking_uri=uri)
        (run,) = client.search_runs([client.get_experiment_by_name("offline").experiment_id])
        assert (
            run.info.status == "FINISHED"
            and run.info.run_id == json.loads((out / "mlflow_run.json").read_text())["run_id"]
        )
        assert run.data.params["train.max_steps"] == "4" and run.data.tags["runjob.version"] == "0.1.0"
        assert server_points(client, run.info.run_id, local_points(out)) == local_points(out)
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [1, 2, 3, 4]
        assert {"job.toml", "job_sources.json", "model.safetensors", "model"} <= {
            a.path for a in client.list_artifacts(run.info.run_id)
        }
        assert run.inputs.dataset_inputs[0].dataset.name == "digits"


def test_server_lost_mid_run_training_goes_on_and_sync_restores_every_point(tmp_path, empty_mlflow_db):
    from mlflow import MlflowClient

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    write_job(tmp_path / "job.toml", SMALL_DIGITS.format(name="lost") + f'[tracking]\nuri = "{uri}"\n')
    out = tmp_path / "out"
    env = clean_env(tmp_path)
    command = [
        sys.executable,
        "-m",
        "runjob",
        "job.toml",
        "--set",
        "train.max_steps=60",
        "--set",
        "train.log_every=1",
        "--output-dir",
        "out",
    ]
    with running_mlflow_server(tmp_path / "server", port, empty_mlflow_db):
        proc = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            while not logged_losses(out):
                assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
                time.sleep(0.2)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    try:  # the server is gone; training must carry on to the end
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, stderr[-3000:]
    assert "upload it with `runjob sync out`" in stdout
    record = json.loads((out / "mlflow_run.json").read_text())
    assert record["status"] == "FINISHED" and record["unsynced"]

    with running_mlflow_server(tmp_path / "server", port):
        client = MlflowClient(tracking_uri=uri)
        losses = local_points(out)["train/loss"]
        assert len(losses) == 60
        assert len(client.get_metric_history(record["run_id"], "train/loss")) < 60, (
            "points sent after the server died cannot be there yet"
        )
        synced = subprocess.run(
            [sys.executable, "-m", "runjob", "sync", "out"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert synced.returncode == 0, synced.stderr[-3000:]
        run = client.get_run(record["run_id"])
        assert run.info.status == "FINISHED"
        assert server_points(client, record["run_id"], local_points(out)) == local_points(out)
        assert {"job.toml", "model.safetensors", "model", "best"} <= {
            a.path for a in client.list_artifacts(record["run_id"])
        }
        assert "unsynced" not in json.loads((out / "mlflow_run.json").read_text())
