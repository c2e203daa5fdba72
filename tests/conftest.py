"""Shared fixtures: running the CLI in a clean folder, fake plugin distributions, small data sets."""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def clean_env(workdir: Path, extra_path: list[Path] | None = None) -> dict[str, str]:
    """The environment for a runjob subprocess: its own MLflow store, HF_HOME and plugin path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ACCELERATE_", "RUNJOB_"))}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{workdir / 'mlflow.db'}"
    env["HF_HOME"] = str(workdir / "hf_home")
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "2"
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in extra_path)
    else:
        env.pop("PYTHONPATH", None)
    return env


@pytest.fixture(scope="session")
def empty_mlflow_db(tmp_path_factory) -> Path:
    """An initialised, empty MLflow sqlite store; copying it saves each run MLflow's migrations."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def runjob_cli(tmp_path, empty_mlflow_db):
    """Run ``python -m runjob ARGS`` in ``tmp_path`` with a private MLflow store; returns a Result."""
    if not (tmp_path / "mlflow.db").exists():
        shutil.copy(empty_mlflow_db, tmp_path / "mlflow.db")

    def run(*args: str, extra_path: list[Path] | None = None, timeout: float = 600, cwd: Path | None = None) -> Result:
        proc = subprocess.run(
            [sys.executable, "-m", "runjob", *args],
            cwd=cwd or tmp_path,
            env=clean_env(tmp_path, extra_path),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running_mlflow_server(folder: Path, port: int | None = None, template: Path | None = None):
    """A real ``mlflow server`` on 127.0.0.1 keeping its database and artifacts in ``folder``;
    yields its URL and stops it on exit. The same folder and port may be served again later.
    ``template``: an initialised empty database to start from (saves MLflow's migrations)."""
    port = port or free_port()
    folder.mkdir(parents=True, exist_ok=True)
    if template is not None and not (folder / "mlflow.db").exists():
        shutil.copy(template, folder / "mlflow.db")
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--backend-store-uri",
        f"sqlite:///{folder / 'mlflow.db'}",
        "--artifacts-destination",
        str(folder / "artifacts"),
        "--workers",
        "1",
    ]
    log = folder / "server.log"  # a file, not a pipe: a full pipe would stall the server
    # MLflow 3's server also starts a pool of job-runner processes (huey) unless told not to: they
    # cost tests seconds of start-up and a core's worth of CPU, and runjob needs none of them
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        command, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=log.open("ab"), start_new_session=True
    )
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
                raise AssertionError(f"mlflow server did not start: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=5)  # a test needs no graceful shutdown
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture
def mlflow_server(tmp_path, empty_mlflow_db):
    """A real ``mlflow server`` with its own database and artifact store; stopped afterwards."""
    with running_mlflow_server(tmp_path / "server", template=empty_mlflow_db) as url:
        yield url


def write_job(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def make_plugin_dist(
    root: Path, dist: str, version: str, entry_points: dict[str, str], modules: dict[str, str]
) -> Path:
    """Lay out an installed distribution (dist-info + modules) in ``root``, as pip would.

    Put ``root`` on sys.path (or PYTHONPATH) and importlib.metadata finds its entry points.
    """
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n", encoding="utf-8")
    lines = ["[runjob]", *(f"{name} = {target}" for name, target in entry_points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source).lstrip(), encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def digits_folder(tmp_path_factory) -> Path:
    """scikit-learn's digits written as PNGs in train/<digit>/ and val/<digit>/ (the contract layout)."""
    from runjob.plugins.digits import export_image_folder

    root = tmp_path_factory.mktemp("digits") / "digits"
    export_image_folder(root, image_size=32)
    return root


def write_cifar_batches(root: Path, per_batch: int = 20, seed: int = 0) -> Path:
    """CIFAR-10's python format (five training batches, a test batch, meta) with random pixels.

    The files are real pickles in torchvision's layout, but their md5 sums are not CIFAR's.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        batch = {
            "batch_label": name,
            "data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
            "labels": [int(x) for x in rng.integers(0, 10, size=per_batch)],
        }
        with open(folder / name, "wb") as file:
            pickle.dump(batch, file)
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    with open(folder / "batches.meta", "wb") as file:
        pickle.dump({"label_names": classes, "num_cases_per_batch": per_batch, "num_vis": 3072}, file)
    return root


def run_process_group(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> Result:
    """Run ``command`` in its own process group; on timeout, kill the whole group (workers too)."""
    import signal

    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"{command} did not finish in {timeout} s:\n{stderr[-3000:]}") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of the group may outlive the test
        except ProcessLookupError:
            pass
    return Result(proc.returncode, stdout, stderr)
