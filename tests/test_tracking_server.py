"""Recording to a real MLflow tracking server on 127.0.0.1, configured by [tracking] uri."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import write_job
from test_training import SMALL_DIGITS

pytestmark = pytest.mark.timeout(300)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` with its own database and artifact store; stopped afterwards."""
    port = free_port()
    folder = tmp_path / "server"
    folder.mkdir()
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination", str(folder / "artifacts"),
        "--workers", "1",
    ]
    server = subprocess.Popen(command, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"mlflow server did not start: {server.stderr.read().decode()[-2000:] if server.poll() is not None else 'timeout'}")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_run_is_recorded_on_the_tracking_server(runjob_cli, tmp_path, mlflow_server):
    write_job(tmp_path / "job.toml", SMALL_DIGITS.format(name="served") + '\n[tracking]\nexperiment = "server-test"\nrun_name = "first"\n[tracking.tags]\nteam = "vision"\n')
    result = runjob_cli("job.toml", "--set", f"tracking.uri={mlflow_server}", "--set", "train.max_steps=6", "--set", "train.log_every=2")
    assert result.returncode == 0, result.stderr[-3000:]
    from mlflow import MlflowClient

    local = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert local.get_experiment_by_name("server-test") is None, "the local default store must not be used"

    client = MlflowClient(tracking_uri=mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name("server-test").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "first"
    assert run.data.tags["team"] == "vision"
    assert run.data.params["tracking.uri"] == mlflow_server
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [2, 4, 6]
    assert len(client.get_metric_history(run.info.run_id, "val/accuracy")) == 1
    assert {"job.toml", "model.safetensors"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
