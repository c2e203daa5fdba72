"""``runjob.testing``: a test kit for runjob plugins, and for runjob's own tests.

Enable it in your ``conftest.py`` (it is a pytest plugin, but it is not registered through an
entry point, so it never loads into projects that do not ask for it)::

    pytest_plugins = ["runjob.testing"]

Then a test asks for the ``runjob_tester`` fixture: it gives the test a folder of its own as the
working directory, a private MLflow store (sqlite, copied from an initialised empty one), its own
``HF_HOME``, and no ``MLFLOW_*``, ``ACCELERATE_*`` or ``RUNJOB_*`` variables from the outside::

    def test_my_model_trains(runjob_tester):
        runjob_tester.install_plugin("my-plugin", {"my_plugin": SOURCE})   # or install_project(PATH)
        runjob_tester.write_job("job.toml", '''
            [model]
            name = "my_model"
            [dataset]
            name = "digits"
            [train]
            max_steps = 5
        ''')
        run = runjob_tester.run("job.toml")                 # in this process; a RecordedRun
        assert run.status == "FINISHED" and run.mlflow.history("train/loss")
        bad = runjob_tester.cli("validate", "job.toml", "--set", "model.width=0")
        assert bad.returncode == 2 and "model.width" in bad.stderr

At import time this module loads only the standard library, pytest and runjob's light top-level
package; torch, accelerate and mlflow are imported by the calls that need them.

Every test of a suite that enables it runs isolated from the user's environment (the autouse
fixture ``runjob_isolated_environment``): no ``MLFLOW_*``, ``ACCELERATE_*``, ``RUNJOB_*``, ``HF_*``,
``HUGGINGFACE_*``, ``TRANSFORMERS_*`` or ``OPTUNA_*`` variable from outside, MLflow recording to a
store in the test's ``tmp_path``, ``HF_HOME`` there and Hugging Face offline.

What it offers: the fixtures ``runjob_tester`` (a :class:`RunjobTester`), ``mlflow_server`` (the
URL of a real ``mlflow server``) and ``empty_mlflow_db``; and, for use without them,
:func:`free_port`, :func:`write_job`, :func:`make_plugin_dist`, :func:`install_project`,
:func:`clean_env`, :func:`run_process_group`, :func:`running_mlflow_server`,
:func:`init_mlflow_store`, :func:`read_run` (a :class:`RecordedRun`, with its :class:`MlflowRun`)
and :data:`TINY_MODELS`, a plugin with a tiny test model (``tiny_cnn``).

For unit tests of a task or a callback, in milliseconds and without a run: :func:`evaluate_task`
(a task's metrics over ``(outputs, batch)`` pairs, by the loop's own evaluation code),
:class:`FakeRun` (a run context that records what a callback does through it) and :func:`drive`
(a callback sent the loop's events in the loop's order)::

    run = drive(MyCallback(options), steps=20, log_every=5, losses=[3.0] * 20)
    assert run.history("train/plateau_steps") == [(5, 0), (10, 1), (15, 2)] and run.stop_reason

For a dataset's :class:`runjob.Inputs`, :func:`round_trip_inputs` checks that a finished run can
keep it as data and rebuild it (its ``to_data``/``from_data``), as ``runjob predict`` will::

    rebuilt = round_trip_inputs(MyRows(mean=[0.5], std=[2.0]), tmp_path)
    assert rebuilt.encode({"x": 1.5}) == 0.5
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

import pytest

import runjob
from runjob import hookimpl
from runjob.commands.cli import main
from runjob.errors import describe, first_line
from runjob.host.events import Destination, Event, MetricsDestination
from runjob.host.run_context import Clock, Run
from runjob.host.run_folder import METRICS_FILE, WEIGHTS_FILE, RunFolder

if TYPE_CHECKING:
    import torch
    from mlflow import MlflowClient
    from mlflow.entities import DatasetInput
    from mlflow.entities import Run as MlflowEntitiesRun

    from runjob.host.callback import Callback
    from runjob.host.components import Batch, Inputs, ModelOutputs, Options
    from runjob.host.hookspecs import Register
    from runjob.host.task import Task, TaskOptions
    from runjob.train.checkpoints import Position

T = TypeVar("T")

__all__ = [
    "CliResult",
    "FakeJob",
    "FakeRun",
    "MlflowRun",
    "NotFaked",
    "OneProcessAccelerator",
    "RecordedRun",
    "RunjobTester",
    "TINY_MODELS",
    "build_tiny_cnn",
    "clean_env",
    "drive",
    "evaluate_task",
    "free_port",
    "init_mlflow_store",
    "install_project",
    "make_plugin_dist",
    "read_run",
    "round_trip_inputs",
    "run_process_group",
    "running_mlflow_server",
    "write_job",
]

ISOLATED_PREFIXES = ("MLFLOW_", "ACCELERATE_", "RUNJOB_")
"""Environment variables a test must not inherit: they would change where and how a run records."""
USER_ENVIRONMENT_PREFIXES = (*ISOLATED_PREFIXES, "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "OPTUNA_")
"""The user's own settings that no test of a suite using the kit sees (a team's exported
``MLFLOW_TRACKING_URI``, a Hugging Face token or cache): see :func:`runjob_isolated_environment`."""


# ---------------------------------------------------------------------------------------------
# Small helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for a server or a rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_job(path: str | Path, text: str) -> Path:
    """Write a job file: ``text`` is dedented and its leading blank lines dropped, so a job can be
    written as an indented triple-quoted string. Creates missing folders; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def make_plugin_dist(
    root: str | Path,
    dist: str,
    version: str = "1.0",
    entry_points: Mapping[str, str] | None = None,
    modules: Mapping[str, str] | None = None,
    *,
    group: str = "runjob",
) -> Path:
    """Lay out an installed distribution in folder ``root``, as pip would: a
    ``<dist>-<version>.dist-info`` with its ``METADATA`` and ``entry_points.txt``, and one file a
    module. Put ``root`` on ``sys.path`` (or ``PYTHONPATH``) and ``importlib.metadata``, and so
    runjob, finds its entry points.

    ``entry_points``: entry-point name -> target (``"module"`` or ``"module:attribute"``) in the
    ``group`` group (``runjob`` by default). ``modules``: module name -> source, dedented; a
    dotted name (``"pkg.mod"``) becomes a package folder. Returns ``root``."""
    root = Path(root)
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n", encoding="utf-8")
    lines = [f"[{group}]", *(f"{name} = {target}" for name, target in (entry_points or {}).items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for module, source in (modules or {}).items():
        *packages, name = module.split(".")
        folder = root.joinpath(*packages)
        for depth in range(1, len(packages) + 1):
            init = root.joinpath(*packages[:depth], "__init__.py")
            init.parent.mkdir(parents=True, exist_ok=True)
            if not init.exists():
                init.write_text("", encoding="utf-8")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.py").write_text(textwrap.dedent(source).lstrip(), encoding="utf-8")
    return root


def install_project(project: str | Path, target: str | Path, *, timeout: float = 300) -> Path:
    """Build the Python project in folder ``project`` (a ``pyproject.toml``) and install it into
    folder ``target`` with pip (``--no-deps --no-build-isolation --target``: nothing is downloaded,
    so its build backend must be installed already). It is built from a copy, so the project's
    folder gets no ``build/`` or ``*.egg-info``. Returns ``target``; put it on ``sys.path`` or
    ``PYTHONPATH``. A failed install fails the test with pip's output."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    left_out = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".*")
    with tempfile.TemporaryDirectory(prefix="runjob-build-") as scratch:
        source = Path(scratch) / Path(project).name
        shutil.copytree(project, source, ignore=left_out)
        command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet"]
        command += ["--disable-pip-version-check", "--no-input", "--target", str(target), str(source)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=scratch)
    if proc.returncode != 0:
        pytest.fail(f"pip could not install {project}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}", pytrace=False)
    return target


def clean_env(
    workdir: str | Path, extra_path: Sequence[str | Path] | None = None, *, threads: int | None = None
) -> dict[str, str]:
    """The environment for a runjob subprocess run in ``workdir``: this process's environment
    without any ``MLFLOW_*``, ``ACCELERATE_*`` or ``RUNJOB_*`` variable, recording to
    ``workdir/mlflow.db``, with ``HF_HOME`` in ``workdir``, unbuffered output, ``extra_path`` (where
    plugin distributions were laid out) first on ``PYTHONPATH`` and, when given, ``threads`` torch
    threads (``OMP_NUM_THREADS``)."""
    workdir = Path(workdir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(ISOLATED_PREFIXES)}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{workdir / 'mlflow.db'}"
    env["HF_HOME"] = str(workdir / "hf_home")
    env["PYTHONUNBUFFERED"] = "1"
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    path = [str(p) for p in extra_path or ()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    return env


@dataclass
class CliResult:
    """What a ``runjob`` command gave: its exit code and everything it wrote to stdout and stderr."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def stderr_lines(self) -> list[str]:
        """stderr as a list of lines (blank ones dropped): one ``runjob: ...`` line per problem."""
        return [line for line in self.stderr.splitlines() if line.strip()]


def run_process_group(
    command: Sequence[str], cwd: str | Path, env: Mapping[str, str] | None, timeout: float
) -> CliResult:
    """Run ``command`` in its own process group and wait for it. On timeout the whole group (its
    workers too) is killed and the test fails with the tail of its stderr; nothing of the group
    outlives the call."""
    proc = subprocess.Popen(
        list(command),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{list(command)} did not finish in {timeout} s:\n{stderr[-3000:]}", pytrace=False)
    finally:
        _kill_group(proc)  # a worker left behind by a crashed launcher
    return CliResult(proc.returncode, stdout, stderr)


def _kill_group(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------------------------------------
# MLflow: an empty store, a real server


def init_mlflow_store(path: str | Path) -> Path:
    """Create an initialised, empty MLflow sqlite store at ``path``. Copying it for each test saves
    the seconds MLflow's schema migrations take on a new database."""
    # lazy: the kit is a pytest plugin, imported by every test session: mlflow only when used
    from mlflow import MlflowClient

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@contextlib.contextmanager
def running_mlflow_server(
    folder: str | Path,
    port: int | None = None,
    template: str | Path | None = None,
    *,
    start_timeout: float = 120,
    backend_store_uri: str | None = None,
) -> Iterator[str]:
    """A real ``mlflow server`` on 127.0.0.1 that keeps its database (``mlflow.db``), artifacts and
    log (``server.log``) in ``folder``; yields its URL once ``/health`` answers, and stops it on
    exit. The same folder and port may be served again later (a server that comes back).
    ``template``: an initialised empty store to start from (see :func:`init_mlflow_store`).
    ``backend_store_uri``: another database instead (a ``postgresql://`` URL; MLflow creates its
    tables on the first start, so give it a longer ``start_timeout``)."""
    folder = Path(folder)
    port = port or free_port()
    folder.mkdir(parents=True, exist_ok=True)
    if template is not None and backend_store_uri is None and not (folder / "mlflow.db").exists():
        shutil.copy(template, folder / "mlflow.db")
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--backend-store-uri", backend_store_uri or f"sqlite:///{folder / 'mlflow.db'}"]
    command += ["--artifacts-destination", str(folder / "artifacts"), "--workers", "1"]
    log = folder / "server.log"  # a file, not a pipe: a full pipe would stall the server
    # MLflow 3's server also starts a pool of job-runner processes (huey) unless told not to: they
    # cost seconds of start-up and a core's worth of CPU, and runjob needs none of them
    env = {k: v for k, v in os.environ.items() if not k.startswith(ISOLATED_PREFIXES)}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    with log.open("ab") as stderr:
        server = subprocess.Popen(
            command, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start: {log.read_text(errors='replace')[-2000:]}", pytrace=False)
            time.sleep(0.25)
        yield url
    finally:
        if server.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=5)  # a test needs no graceful shutdown
        except subprocess.TimeoutExpired:
            _kill_group(server)
            server.wait()


# ---------------------------------------------------------------------------------------------
# A run's record, read back


class MlflowRun:
    """One MLflow run, read back through ``MlflowClient``: ``run_id``, ``status``, ``run_name``,
    ``params``, ``tags``, ``metrics`` (the last value of each), ``inputs`` (dataset inputs);
    :meth:`history` for a metric's points, :meth:`artifacts` and :meth:`download` for its files.
    ``client`` and ``run`` (MLflow's own ``Run``) are there for anything else."""

    def __init__(self, client: MlflowClient, run: MlflowEntitiesRun) -> None:
        self.client = client
        self.run = run

    @classmethod
    def get(cls, tracking_uri: str | None, run_id: str) -> MlflowRun:
        """The run ``run_id`` of the store at ``tracking_uri``."""
        # lazy: the kit is a pytest plugin, imported by every test session: mlflow only when used
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        return cls(client, client.get_run(run_id))

    def reload(self) -> MlflowRun:
        """The same run read again (after something changed it)."""
        return MlflowRun(self.client, self.client.get_run(self.run_id))

    @property
    def run_id(self) -> str:
        return str(self.run.info.run_id)

    @property
    def status(self) -> str:
        """FINISHED, FAILED, KILLED or RUNNING."""
        return str(self.run.info.status)

    @property
    def run_name(self) -> str:
        return str(self.run.info.run_name)

    @property
    def experiment_id(self) -> str:
        return str(self.run.info.experiment_id)

    @property
    def params(self) -> dict[str, str]:
        return dict(self.run.data.params)

    @property
    def tags(self) -> dict[str, str]:
        return dict(self.run.data.tags)

    @property
    def metrics(self) -> dict[str, float]:
        """The last value logged for each metric."""
        return dict(self.run.data.metrics)

    @property
    def inputs(self) -> list[DatasetInput]:
        """The run's dataset inputs (MLflow ``DatasetInput`` objects)."""
        return list(self.run.inputs.dataset_inputs)  # type: ignore[union-attr]  # read from a store: always there

    def history(self, key: str) -> list[tuple[int, float]]:
        """Every point of metric ``key`` as ``(step, value)``, in the order MLflow returns them."""
        return [(m.step, m.value) for m in self.client.get_metric_history(self.run_id, key)]

    def steps(self, key: str) -> list[int]:
        """The steps at which metric ``key`` was logged."""
        return [step for step, _ in self.history(key)]

    def artifacts(self, path: str | None = None) -> set[str]:
        """The paths of the artifacts in folder ``path`` (the top level by default)."""
        return {a.path for a in self.client.list_artifacts(self.run_id, path)}

    def models(self) -> set[str]:
        """The names of the run's logged models (MLflow 3's "Logged models": the MLflow model)."""
        found = self.client.search_logged_models([self.experiment_id], filter_string=f"source_run_id = '{self.run_id}'")
        return {model.name for model in found}

    def download(self, path: str, folder: str | Path) -> Path:
        """Download artifact ``path`` into ``folder``; returns the local path."""
        Path(folder).mkdir(parents=True, exist_ok=True)
        return Path(self.client.download_artifacts(self.run_id, path, str(folder)))

    def __repr__(self) -> str:
        return f"MlflowRun({self.run_id!r}, {self.status}, {self.run_name!r})"


class RecordedRun:
    """What a run left behind, read back as a user would: the output folder's local record and,
    when the run was recorded to MLflow, the MLflow run.

    ``output_dir``, ``exit_code`` (when known), ``files`` (names in the output folder),
    ``record`` (``mlflow_run.json`` as a dict), ``run_id``, ``tracking_uri``;
    :meth:`points` and :meth:`local_history` read ``metrics*.jsonl``. ``mlflow`` is the
    :class:`MlflowRun` (``None`` for a run recorded offline). ``status``, ``params``, ``tags``,
    ``metrics`` and ``artifacts`` come from MLflow when the run is there, else from the local
    record; ``.record`` and ``.mlflow`` give each side on its own, to assert both."""

    def __init__(self, output_dir: str | Path, exit_code: int | None = None) -> None:
        self.output_dir = Path(output_dir)
        self.exit_code = exit_code
        path = RunFolder(self.output_dir).run_record_file
        self.record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    @property
    def files(self) -> set[str]:
        """The names of the files and folders in the output folder."""
        return {p.name for p in self.output_dir.iterdir()} if self.output_dir.is_dir() else set()

    @property
    def run_id(self) -> str | None:
        return self.record.get("run_id")

    @property
    def tracking_uri(self) -> str | None:
        return self.record.get("tracking_uri")

    @functools.cached_property
    def mlflow(self) -> MlflowRun | None:
        """The run read back from MLflow (``None`` when the local record names no MLflow run)."""
        run_id = self.run_id
        if not run_id:
            return None
        return MlflowRun.get(self.tracking_uri, run_id)

    def points(self, key: str | None = None, pattern: str = METRICS_FILE) -> list[dict[str, Any]]:
        """The metric points of the local record (``{"key", "value", "step", "timestamp"}``, in file
        order), of metric ``key`` only when given. ``pattern``: which files (``"metrics*.jsonl"``
        for other machines' too)."""
        found = []
        for path in sorted(self.output_dir.glob(pattern)):
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    point = json.loads(line)
                    if key is None or point["key"] == key:
                        found.append(point)
        return found

    def local_history(self, key: str) -> list[tuple[int, float]]:
        """Every ``(step, value)`` of metric ``key`` in ``metrics.jsonl``, in file order."""
        return [(p["step"], p["value"]) for p in self.points(key)]

    @property
    def status(self) -> str | None:
        return self.mlflow.status if self.mlflow else self.record.get("status")

    @property
    def params(self) -> dict[str, str]:
        return self.mlflow.params if self.mlflow else dict(self.record.get("params", {}))

    @property
    def tags(self) -> dict[str, str]:
        return self.mlflow.tags if self.mlflow else dict(self.record.get("tags", {}))

    @property
    def metrics(self) -> dict[str, float]:
        """The last value of each metric."""
        if self.mlflow:
            return self.mlflow.metrics
        return {p["key"]: p["value"] for p in self.points()}

    @property
    def artifacts(self) -> set[str]:
        """Top-level artifact paths (MLflow's, or the local record's ``artifact_path`` or file name)."""
        if self.mlflow:
            return self.mlflow.artifacts()
        return {a.get("artifact_path") or Path(a["path"]).name for a in self.record.get("artifacts", [])}

    def __repr__(self) -> str:
        return f"RecordedRun({str(self.output_dir)!r}, exit_code={self.exit_code}, run_id={self.run_id!r})"


def read_run(output_dir: str | Path, exit_code: int | None = None) -> RecordedRun:
    """The :class:`RecordedRun` of the run in ``output_dir`` (its MLflow side is read on first use)."""
    return RecordedRun(output_dir, exit_code)


# ---------------------------------------------------------------------------------------------
# A plugin of tiny models, for tests where ResNet-18 proves nothing


class _TinyCNNSettings(Protocol):
    """What :func:`build_tiny_cnn` reads of its options (``TinyCNNOptions``)."""

    channels: int
    num_classes: int


def build_tiny_cnn(options: _TinyCNNSettings) -> torch.nn.Sequential:
    """``tiny_cnn``: a 3x3 convolution (3 -> ``channels``), ReLU, average pooling to 4x4 and a linear
    layer to ``num_classes``; any image size from 1x1 up. A few thousand parameters."""
    # lazy: the kit is a pytest plugin, imported by every test session: torch only when used
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(3, options.channels, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(options.channels * 16, options.num_classes),
    )


@functools.cache
def _tiny_cnn_options() -> type[Options]:
    # lazy: the kit is a pytest plugin, imported by every test session: pydantic only when used
    from pydantic import Field

    class TinyCNNOptions(runjob.Options):
        """Options of ``tiny_cnn``."""

        num_classes: int = Field(10, ge=2)
        channels: int = Field(8, ge=1)

    return TinyCNNOptions


def __getattr__(name: str) -> type[Options]:
    # pydantic is imported when the options class is first asked for, not with this module
    if name == "TinyCNNOptions":
        return _tiny_cnn_options()
    raise AttributeError(f"module 'runjob.testing' has no attribute {name!r}")


class _TinyModels:
    """The runjob plugin behind :data:`TINY_MODELS`."""

    @hookimpl
    def runjob_register_models(self, register: Register) -> None:
        register(
            "tiny_cnn",
            build_tiny_cnn,
            options=_tiny_cnn_options(),
            description="test model: one 3x3 convolution, 4x4 pooling, a linear layer",
        )


TINY_MODELS = _TinyModels()
"""A runjob plugin registering the model ``tiny_cnn`` (see :func:`build_tiny_cnn`). Install it
into a test with :meth:`RunjobTester.install_tiny_models` (entry point
``tiny_models = runjob.testing:TINY_MODELS`` of distribution ``runjob-testing-tiny-models``)."""

TINY_MODELS_DIST = "runjob-testing-tiny-models"


# ---------------------------------------------------------------------------------------------
# Unit tests without a run: a task's evaluation, a callback's events


def evaluate_task(
    task: Task,
    evaluated: Iterable[tuple[ModelOutputs, Batch]],
    options: TaskOptions | None = None,
    *,
    prefix: str = "val",
    name: str | None = None,
) -> dict[str, float]:
    """The metrics the host reports for ``task`` over ``evaluated``, a list of ``(outputs, batch)``
    pairs (the model's outputs for each batch of a split), computed by the training loop's own code
    (``runjob.train.loop.add_up`` and ``summarize_totals``): ``task.evaluate`` of each pair,
    checked, summed over the samples in float64, then ``task.summarize(totals, count)``, checked
    against ``options.metrics()`` and named ``prefix/name`` (``"val/accuracy"``; ``prefix="test"``
    for the test split), the declared metrics first. This is what ``on_evaluation`` receives.

    ``options``: the task's options (default ``runjob.TaskOptions()``, what a task registered
    without options has: it declares ``loss``). ``name``: the task's name in messages (default its
    class name). A mistake the host stops a run for raises ``runjob.errors.TrainingError`` with the
    host's message. One process: nothing is gathered."""
    import torch  # lazy: the kit is a pytest plugin, imported by every test session: torch only when used

    # lazy: the kit is a pytest plugin, imported by every test session: pydantic, the host and the loop (+1.2 s)
    from runjob.host.task import TaskOptions
    from runjob.train.loop import add_up, summarize_totals

    name = name or type(task).__name__
    with torch.no_grad():  # as the loop evaluates
        totals, count = add_up(task, name, evaluated)
        return summarize_totals(task, name, TaskOptions() if options is None else options, totals, count, prefix)


class NotFaked(AttributeError):
    """What a :class:`FakeRun` cannot give: an attribute the test did not set, or one only a real
    run (a real ``Accelerator``, a resolved job) has."""


class _Unset:
    def __repr__(self) -> str:
        return "<not set>"


UNSET = _Unset()
"""The value of a :class:`FakeRun` attribute the test did not give: reading it raises :class:`NotFaked`."""


class FakeJob:
    """A stand-in for ``run.job`` (a resolved job) in a :class:`FakeRun`: ``metrics`` (every metric
    the run can report, with ``"max"`` or ``"min"``) and whatever else is given by keyword (e.g.
    ``train=SimpleNamespace(log_every=5)``); anything else raises :class:`NotFaked`."""

    def __init__(self, metrics: Mapping[str, str] | None = None, **attributes: object) -> None:
        self.metrics = dict(metrics or {})
        self.__dict__.update(attributes)

    def __getattr__(self, name: str) -> Any:
        raise NotFaked(f"FakeJob has no {name!r}: give it, FakeJob(metrics=..., {name}=...), or a real resolved job")


class OneProcessAccelerator:
    """``run.accelerator`` of a :class:`FakeRun`: one process, the main one, on the CPU
    (``num_processes``, ``process_index``, ``is_main_process``, ``device``, ``wait_for_everyone``,
    ``unwrap_model``, ``print``, and ``save_model`` writing ``model.safetensors`` as Accelerate does
    on one process). Anything else raises :class:`NotFaked`: give ``FakeRun(accelerator=
    accelerate.Accelerator(cpu=True))`` for it."""

    num_processes = 1
    process_index = local_process_index = 0
    is_main_process = is_local_main_process = is_last_process = True

    @property
    def device(self) -> torch.device:
        import torch  # lazy: the kit is a pytest plugin, imported by every test session: torch only when used

        return torch.device("cpu")

    def wait_for_everyone(self) -> None:
        """One process waits for nobody."""

    def unwrap_model(self, model: torch.nn.Module, **_: object) -> torch.nn.Module:
        return model

    def print(self, *args: object, **kwargs: Any) -> None:
        print(*args, **kwargs)

    def save_model(
        self, model: torch.nn.Module, save_directory: str | Path, safe_serialization: bool = True, **_: object
    ) -> None:
        # lazy: the kit is a pytest plugin, imported by every test session: safetensors only when used
        from safetensors.torch import save_model

        if not safe_serialization:
            raise NotFaked("FakeRun's accelerator writes safetensors only (safe_serialization=True)")
        Path(save_directory).mkdir(parents=True, exist_ok=True)
        save_model(model, str(Path(save_directory) / WEIGHTS_FILE))  # shared (tied) weights stored once

    def __getattr__(self, name: str) -> NoReturn:
        raise NotFaked(
            f"FakeRun's accelerator (one process, on the CPU) has no {name!r}: give "
            "FakeRun(accelerator=accelerate.Accelerator(cpu=True)) for it"
        )


class _FakeRecord:
    """The run's record, for a :class:`FakeRun`: what would go into ``metrics.jsonl`` and MLflow is
    kept on the fake run instead."""

    def __init__(self, run: FakeRun) -> None:
        self.run = run

    def log_training_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.logs.append((step, dict(metrics)))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.run.tags.update(tags)

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None:
        self.run.artifacts.append((Path(path), folder))


class _FakeParts:
    """A :class:`FakeRun`'s state: what the test gave; reading anything else raises :class:`NotFaked`."""

    def __init__(self, given: dict[str, object]) -> None:
        self.__dict__.update(given)

    def __getattr__(self, name: str) -> Any:
        raise NotFaked(f"this FakeRun has no run.{name}: give it, FakeRun({name}=...), or set run.{name}")


class FakeRun(Run):
    """A :class:`runjob.Run` for unit tests of a callback, built without an Accelerator, a model
    or a job: what a callback does through it (``log``, ``set_tags``, ``log_artifact``,
    ``save_model``, ``request_stop``) goes through ``Run``'s own methods into a record kept here for
    the test to assert on:

    - ``logs``: every ``(step, metrics)`` recorded, as ``metrics.jsonl`` would hold them (under
      :func:`drive`, runjob's own ``train/loss``, ``lr`` and evaluation metrics too);
      :meth:`history` gives one metric's ``(step, value)`` points;
    - ``tags``, ``artifacts`` (``(path, folder)``), ``saved_models`` (the folders),
      ``stop_requests`` (``(step, reason)``; :attr:`stop_reason` is the first, the one the run ends
      with), ``events`` (``(event, step, epoch)`` as :func:`drive` sent them), and ``logged`` as on
      a real run.

    The test plays the loop, so here (unlike on a real run) the state is settable, by keyword or
    later: ``step``, ``epoch``, ``job`` (a :class:`FakeJob` or a real resolved job), ``model``,
    ``optimizer``, ``scheduler``, ``task``, the loaders, ``output_dir`` (needed by
    ``log_artifact``), ``callbacks``; ``accelerator`` is a :class:`OneProcessAccelerator` unless
    given. Reading one that was not given raises :class:`NotFaked` naming it."""

    SETTABLE = frozenset(
        {"job", "accelerator", "model", "optimizer", "scheduler", "train_loader", "val_loader", "test_loader"}
        | {"output_dir", "task", "mlflow_run_id", "callbacks"}
    )

    def __init__(self, *, step: int = 0, epoch: int = 0, **given: Any) -> None:
        unknown = sorted(set(given) - self.SETTABLE)
        if unknown:
            raise TypeError(
                f"FakeRun() got unexpected keyword(s) {', '.join(unknown)}: it takes step, epoch and "
                f"{', '.join(sorted(self.SETTABLE))}"
            )
        given.setdefault("accelerator", OneProcessAccelerator())
        given.setdefault("mlflow_run_id", None)
        given.setdefault("callbacks", {})
        if given.get("output_dir") is not None:
            given["output_dir"] = Path(given["output_dir"])
        self.logs: list[tuple[int, dict[str, float]]] = []
        self.tags: dict[str, str] = {}
        self.artifacts: list[tuple[Path, str | None]] = []
        self.saved_models: list[Path] = []
        self.stop_requests: list[tuple[int, str]] = []
        self.events: list[tuple[str, int, int]] = []
        super().__init__(_FakeParts(given), clock=Clock(step, epoch), record=_FakeRecord(self))  # type: ignore[arg-type]

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("step", "epoch"):
            setattr(self._clock, name, int(value))
        elif name in self.SETTABLE:
            setattr(self._parts, name, Path(value) if name == "output_dir" else value)
        else:
            super().__setattr__(name, value)

    if TYPE_CHECKING:  # settable here (see __setattr__), unlike on a real Run
        step: int
        epoch: int

    @property
    def callbacks(self) -> Mapping[str, Callback]:
        return self._parts.callbacks

    @callbacks.setter
    def callbacks(self, value: Mapping[str, Callback]) -> None:  # what __setattr__ does
        setattr(self._parts, "callbacks", value)  # noqa: B010 - a frozen RunParts to the type checker

    def request_stop(self, reason: str) -> None:
        self.stop_requests.append((self.step, reason))
        super().request_stop(reason)

    def save_model(self, folder: str | Path) -> Path:
        self.saved_models.append(Path(folder))
        return super().save_model(folder)

    @property
    def stop_reason(self) -> str:
        """Why the run would stop: the first ``request_stop`` reason ("" when none was asked)."""
        return self._stop.reason

    def history(self, name: str) -> list[tuple[int, float]]:
        """Every ``(step, value)`` recorded for metric ``name``, in order."""
        return [(step, metrics[name]) for step, metrics in self.logs if name in metrics]

    def __repr__(self) -> str:
        return f"FakeRun(step={self.step}, epoch={self.epoch}, logs={len(self.logs)}, stop={self.stop_reason!r})"


def _per_step(value: T | Sequence[T] | Callable[[int], T], what: str, steps: int) -> Callable[[int], T]:
    """A value a step from a constant, a sequence (item i for step i + 1) or a function of the step."""
    if callable(value):
        return value  # a function of the step, as documented
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) < steps:
            raise ValueError(f"drive(): {what} has {len(value)} items for {steps} steps: give one a step")
        return lambda step: value[step - 1]
    return lambda step: value


class _FakeWork:
    """The loop's work (:class:`runjob.train.loop.LoopWork`) for :func:`drive`, on the CPU without a
    model: the losses, learning rates, evaluations and batches the test gave, by step."""

    def __init__(
        self,
        run: FakeRun,
        *,
        steps_per_epoch: int,
        losses: Callable[[int], float],
        lr: Callable[[int], float],
        evaluations: Mapping[int, Mapping[str, float]] | Callable[[int], Mapping[str, float]] | None,
        batches: Callable[[int], Batch] | None,
        loss_tensors: bool,
    ) -> None:
        self.run = run
        self.batches_per_epoch = steps_per_epoch
        self.losses, self.lr, self.evaluations, self.batches = losses, lr, evaluations, batches
        self.loss_tensors = loss_tensors  # on_step gets a 0-dim tensor when a callback listens to it
        self.unlogged_losses: list[float] = []
        self.synced = True

    def start_epoch(self, epoch: int, skip: int) -> Iterator[Batch]:
        for _ in range(self.batches_per_epoch - skip):
            yield self.batches(self.run.step) if self.batches is not None else None  # None: nobody listens

    def train_batch(self, batch: Batch, step: int, first: bool) -> tuple[torch.Tensor | float, bool]:
        loss = float(self.losses(step))
        self.unlogged_losses.append(loss)
        return (_loss_tensor(loss) if self.loss_tensors else loss), True

    def after_step(self, stepped: bool) -> None:
        """No scheduler."""

    @property
    def unlogged(self) -> int:
        return len(self.unlogged_losses)

    def log_metrics(self) -> dict[str, float]:
        losses, self.unlogged_losses = self.unlogged_losses, []
        return {"train/loss": sum(losses) / len(losses), "lr": float(self.lr(self.run.step))}

    def evaluate(self, why: str) -> dict[str, float]:
        evaluations, step = self.evaluations, self.run.step
        if evaluations is None:
            return {}
        if callable(evaluations):
            return dict(evaluations(step))
        if step not in evaluations:
            raise ValueError(f"drive(): the loop evaluates at step {step} ({why}): evaluations has no metrics for it")
        return dict(evaluations[step])

    def test(self) -> None:
        """No test split."""

    def agree(self) -> tuple[int, bool]:
        return 0, bool(self.run.stop_reason)

    def checkpoint(self, position: Position) -> None:
        """No checkpoint."""


class _EventLog(Destination):
    """Every event :func:`drive` sends, with the step and epoch then, into ``run.events``."""

    BEFORE = frozenset(Event)

    def __init__(self, run: FakeRun) -> None:
        self.run = run

    def before(self, event: Event, values: tuple[object, ...]) -> None:
        self.run.events.append((event.method, self.run.step, self.run.epoch))


def drive(
    callbacks: Callback | Mapping[str, Callback],
    *,
    steps: int,
    run: FakeRun | None = None,
    steps_per_epoch: int | None = None,
    log_every: int = 10,
    eval_every: int | None = None,
    losses: float | Sequence[float] | Callable[[int], float] = 1.0,
    lr: float | Sequence[float] | Callable[[int], float] = 1e-3,
    evaluations: Mapping[int, Mapping[str, float]] | Callable[[int], Mapping[str, float]] | None = None,
    batches: Batch = None,
) -> FakeRun:
    """Drive ``callbacks`` (one :class:`runjob.Callback`, or a dict of them by name, called in its
    order) through the events of a one-process training run of ``steps`` optimizer steps: the
    training loop itself (``runjob.train.loop.TrainingLoop``, its order and its own dispatcher) with
    CPU fakes for the model's work (only overridden events are called; one that raises ends in
    ``runjob.errors.TrainingError`` naming the callback, event and step), with ``run`` (a
    :class:`FakeRun`, a new one by default; its ``step`` and ``epoch`` start at 0) as the run
    context; returns the run, whose record (``logs``, ``history``, ``tags``, ``stop_requests``,
    ``events``, ...) says what they did. Where the runner only reports a callback that fails in
    ``on_run_end``, here the error is raised, for the test to see.

    The order, as the loop has it (the keys ``train.log_every``, ``train.eval_every``):
    ``on_run_start``; per epoch (``steps_per_epoch``, default all steps in one) ``on_epoch_start``,
    then per step ``on_batch`` (steps done so far) and ``on_step`` (steps done, a 0-dim tensor
    loss), ``on_log`` every ``log_every`` steps and at the end of an epoch when steps are unlogged
    (``train/loss``, the mean since the last log, and ``lr``; what callbacks log then joins them),
    an evaluation every ``eval_every`` steps and at the end of the epoch (``on_evaluation_start``,
    ``on_evaluation`` with the metrics, ``on_evaluation_end``), then ``on_epoch_end``; a stop
    request is honoured after each step (as on one process), then the run evaluates unless it just
    did; ``on_train_end`` and ``on_run_end(run, "FINISHED", None)`` close it. No checkpoint is
    written and no global hook called.

    ``losses`` and ``lr``: a number, a list (one a step) or a function of the step. ``evaluations``:
    the metrics of each evaluation by step (a dict or a function of the step), e.g. from
    :func:`evaluate_task`; needed when a callback listens to ``on_evaluation``. ``batches``: what
    ``on_batch`` gets (a list, one a step, or a function of the steps done); needed when a callback
    listens to ``on_batch``."""
    # lazy: the kit is a pytest plugin, imported by every test session: pydantic, the host and the loop (+1.2 s)
    from runjob.host.callback import Callback
    from runjob.host.run_context import dispatcher
    from runjob.train.loop import LoopSettings, Schedule, TrainingLoop

    run = FakeRun() if run is None else run
    run.callbacks = {type(callbacks).__name__: callbacks} if isinstance(callbacks, Callback) else dict(callbacks)

    def listens(event: str) -> bool:
        base = getattr(Callback, event)
        return any(getattr(type(item), event) is not base for item in run.callbacks.values())

    if listens("on_batch") and batches is None:
        raise ValueError("drive(): a callback listens to on_batch: give batches= (a list, one a step, or a function)")
    if listens("on_evaluation") and evaluations is None:
        raise ValueError("drive(): a callback listens to on_evaluation: give evaluations= ({step: metrics})")
    per_epoch = steps_per_epoch or steps
    work = _FakeWork(
        run,
        steps_per_epoch=per_epoch,
        losses=_per_step(losses, "losses", steps),
        lr=_per_step(lr, "lr", steps),
        evaluations=evaluations,
        batches=_per_step(batches, "batches", steps) if batches is not None else None,
        loss_tensors=listens("on_step"),
    )
    events = dispatcher(run)  # the loop's own dispatcher: order, error policy, what run.log does
    events.add_destination(_EventLog(run))
    events.add_destination(MetricsDestination(_FakeRecord(run).log_training_metrics))  # into run.logs
    schedule = Schedule(math.ceil(steps / per_epoch), per_epoch, steps)
    settings = LoopSettings(log_every, eval_every, max_steps=steps)
    loop = TrainingLoop(run, events, run._clock, schedule, work, settings, stop=run._stop, quiet=True)
    events.send(Event.RUN_START)
    loop.fit()
    run.events.append(("on_run_end", run.step, run.epoch))
    for listener in events.listeners(Event.RUN_END):  # as the runner ends a run, but a failure is raised
        listener.call(run, "FINISHED", None)
    return run


def _loss_tensor(loss: float) -> torch.Tensor:
    import torch  # lazy: the kit is a pytest plugin, imported by every test session: torch only when used

    return torch.tensor(loss)


def round_trip_inputs(inputs: object, folder: str | Path) -> Inputs:
    """``inputs`` (a dataset's :class:`runjob.Inputs`) written as data into ``folder`` and rebuilt
    from it, as a finished run's predictor is read back by ``runjob predict``, ``runjob export`` and
    the run's MLflow model (:func:`runjob.host.plain_data.round_trip`); returns the rebuilt object.

    ``AssertionError`` with the one-line reason when it does not survive (its state is not plain
    data, an ``__init__`` argument is not kept under its name, ``from_data`` refuses what
    ``to_data`` gave or rebuilds another object), so a plugin's own test shows why a run of it
    would save no predictor."""
    # lazy: the kit is a pytest plugin, imported by every test session: pydantic and the host (+1.2 s) only when used
    from runjob.host.components import Inputs
    from runjob.host.plain_data import round_trip

    if not isinstance(inputs, Inputs):
        raise AssertionError(f"{type(inputs).__qualname__} is not a runjob.Inputs")
    try:
        return round_trip(inputs, Path(folder))
    except (TypeError, ValueError) as error:
        reason = first_line(error)
    except Exception as error:  # noqa: BLE001 - a plugin's to_data or from_data may raise anything
        reason = describe(error)
    raise AssertionError(f"{type(inputs).__qualname__} cannot be kept as data: {reason}")


# ---------------------------------------------------------------------------------------------
# The fixture


class RunjobTester:
    """A test's own runjob world (the ``runjob_tester`` fixture), modelled on pytest's ``pytester``.

    ``path`` is the test's folder and working directory; ``tracking_uri`` its MLflow store
    (``sqlite:///<path>/mlflow.db``), also in ``$MLFLOW_TRACKING_URI``; ``HF_HOME`` is
    ``<path>/hf_home``. Plugins installed with :meth:`install_plugin`, :meth:`install_project` or
    :meth:`install_tiny_models` are seen by runs in this process and by the processes it starts;
    everything is put back after the test."""

    def __init__(self, path: Path, template: Path | None) -> None:
        self.path = path
        self.tracking_uri = f"sqlite:///{path / 'mlflow.db'}"
        self.sites: list[Path] = []
        self._template = template
        self._patch = pytest.MonkeyPatch()
        self._environ_before = set(os.environ)
        self._modules_before = set(sys.modules)
        self._processes: list[subprocess.Popen[Any]] = []

    # set-up and tear-down, by the fixture

    def _setup(self) -> None:
        patch = self._patch
        for name in list(os.environ):
            if name.startswith(ISOLATED_PREFIXES):
                patch.delenv(name)
        patch.setenv("MLFLOW_TRACKING_URI", self.tracking_uri)
        patch.setenv("HF_HOME", str(self.path / "hf_home"))
        patch.chdir(self.path)
        if self._template is not None and not (self.path / "mlflow.db").exists():
            shutil.copy(self._template, self.path / "mlflow.db")

    def _teardown(self) -> None:
        for proc in self._processes:
            if proc.poll() is None:
                _kill_group(proc)
                proc.wait()
        # what a run set in the environment (MLflow's HTTP retry bounds, Accelerate's switches)
        for name in set(os.environ) - self._environ_before:
            if name.startswith(ISOLATED_PREFIXES):
                del os.environ[name]
        self._patch.undo()
        for name in set(sys.modules) - self._modules_before:  # a later test may lay out its own version
            file = getattr(sys.modules[name], "__file__", None) or ""
            if any(file.startswith(str(site)) for site in self.sites):
                del sys.modules[name]
        importlib.invalidate_caches()

    # files

    def write_job(self, name: str | Path, text: str) -> Path:
        """Write a job file (``name`` relative to :attr:`path`; see :func:`write_job`)."""
        return write_job(self.path / name, text)

    # plugins

    def add_site(self, folder: str | Path) -> Path:
        """Make the installed distributions in ``folder`` visible: on ``sys.path`` (entry points
        found again at once) and on ``PYTHONPATH`` for processes started from this test."""
        folder = Path(folder)
        self._patch.syspath_prepend(str(folder))  # also invalidates import and metadata caches
        self.sites.append(folder)
        self._patch.setenv("PYTHONPATH", str(folder), prepend=os.pathsep)
        return folder

    def install_plugin(
        self,
        dist: str,
        modules: Mapping[str, str],
        entry_points: Mapping[str, str] | None = None,
        *,
        version: str = "1.0",
    ) -> Path:
        """Install a plugin distribution made on the fly: ``modules`` maps module names to their
        source; ``entry_points`` maps entry-point names to targets in the ``runjob`` group (by
        default one entry point per module, named like it). Returns its site folder; see
        :func:`make_plugin_dist` and :meth:`add_site`."""
        if entry_points is None:
            entry_points = {module.rsplit(".", 1)[-1]: module for module in modules}
        site = self.path / f"site-{len(self.sites)}-{dist}"
        make_plugin_dist(site, dist, version, entry_points, modules)
        return self.add_site(site)

    def install_project(self, project: str | Path) -> Path:
        """Build and install the plugin project in folder ``project`` (with pip, offline; see
        :func:`install_project`) into a site folder of this test; returns the site folder."""
        site = self.path / f"site-{len(self.sites)}-{Path(project).name}"
        return self.add_site(install_project(project, site))

    def install_tiny_models(self) -> Path:
        """Install :data:`TINY_MODELS`: the model ``tiny_cnn`` (options ``num_classes = 10``,
        ``channels = 8``), for tests where a large model proves nothing."""
        site = self.path / f"site-{len(self.sites)}-tiny-models"
        make_plugin_dist(site, TINY_MODELS_DIST, "1.0", {"tiny_models": "runjob.testing:TINY_MODELS"})
        return self.add_site(site)

    # running runjob

    def cli(self, *args: str | Path) -> CliResult:
        """Run ``runjob ARGS`` in this process (``runjob.commands.cli.main``) and return its exit
        code and what it wrote to stdout and stderr (also echoed, so pytest shows it on failure).
        An argparse error or ``--help`` gives the exit code it would give the shell."""
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main([str(a) for a in args])
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        sys.stdout.write(stdout.getvalue())
        sys.stderr.write(stderr.getvalue())
        return CliResult(code, stdout.getvalue(), stderr.getvalue())

    def run(
        self,
        job_file: str | Path,
        *overrides: str,
        output_dir: str | Path | None = None,
        resume: str | Path | bool | None = None,
        tags: Mapping[str, str] | None = None,
        tracking_uri: str | None = None,
    ) -> RecordedRun:
        """Train ``job_file`` with ``overrides`` (``"table.key=value"``) in this process, through
        runjob's library entry (``runjob.train.entry.run``), and return its :class:`RecordedRun`.
        A user's mistake raises ``runjob.RunjobError`` as the library does (use ``pytest.raises``,
        or :meth:`cli` to see the message the command line prints)."""
        # lazy: the kit is a pytest plugin, imported by every test session: the run's modules only when used
        from runjob.train.entry import run

        outcome = run(
            job_file, list(overrides), output_dir=output_dir, resume=resume, tags=tags, tracking_uri=tracking_uri
        )
        if outcome.output_dir is None:
            raise AssertionError(f"the run ended with exit code {outcome.exit_code} and no output folder")
        return RecordedRun(outcome.output_dir, outcome.exit_code)

    def env(self, *, threads: int | None = None, **extra: str) -> dict[str, str]:
        """The environment for a runjob subprocess of this test (see :func:`clean_env`): its store,
        its ``HF_HOME``, its plugins on ``PYTHONPATH``, and ``extra`` variables."""
        env = clean_env(self.path, threads=threads)  # os.environ's PYTHONPATH holds the sites already
        env.update(extra)
        return env

    def cli_subprocess(
        self, *args: str | Path, timeout: float = 600, env: Mapping[str, str] | None = None, threads: int | None = None
    ) -> CliResult:
        """Run ``python -m runjob ARGS`` as a process of its own (group) in :attr:`path` and wait
        for it, at most ``timeout`` seconds (then it and its workers are killed and the test fails).
        ``env``: extra variables. For what needs a real process: signals, exit codes of a process,
        several processes, what a fresh interpreter imports."""
        command = [sys.executable, "-m", "runjob", *(str(a) for a in args)]
        return run_process_group(command, self.path, self.env(threads=threads, **(env or {})), timeout)

    def popen(self, *args: str | Path, env: Mapping[str, str] | None = None, **options: Any) -> subprocess.Popen[Any]:
        """Start ``python -m runjob ARGS`` in :attr:`path` in a new process group without waiting
        (text pipes for stdout and stderr unless ``options`` say otherwise). Whatever of it still
        runs after the test is killed."""
        options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **options}
        proc = subprocess.Popen(
            [sys.executable, "-m", "runjob", *(str(a) for a in args)],
            cwd=self.path,
            env={**self.env(), **(env or {})},
            start_new_session=True,
            **options,
        )
        self._processes.append(proc)
        return proc

    # reading records

    def record(self, output_dir: str | Path) -> RecordedRun:
        """The :class:`RecordedRun` of the run in ``output_dir`` (relative to :attr:`path`)."""
        return RecordedRun(self.path / output_dir)

    @functools.cached_property
    def client(self) -> MlflowClient:
        """An ``MlflowClient`` of this test's store."""
        # lazy: the kit is a pytest plugin, imported by every test session: mlflow only when used
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri)

    def runs(self, experiment: str, tracking_uri: str | None = None) -> list[MlflowRun]:
        """Every run of MLflow experiment ``experiment`` (newest first), in this test's store or the
        one at ``tracking_uri``; fails the test when there is no such experiment."""
        # lazy: the kit is a pytest plugin, imported by every test session: mlflow only when used
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri) if tracking_uri else self.client
        found = client.get_experiment_by_name(experiment)
        assert found is not None, f"no MLflow experiment {experiment!r} at {tracking_uri or self.tracking_uri}"
        return [MlflowRun(client, run) for run in client.search_runs([found.experiment_id])]

    def only_run(self, experiment: str, tracking_uri: str | None = None) -> MlflowRun:
        """The one run of MLflow experiment ``experiment``; fails the test unless there is exactly one."""
        runs = self.runs(experiment, tracking_uri)
        assert len(runs) == 1, f"expected one run in experiment {experiment!r}, found {len(runs)}"
        return runs[0]

    def has_experiment(self, experiment: str) -> bool:
        """Whether MLflow experiment ``experiment`` exists in this test's store."""
        return self.client.get_experiment_by_name(experiment) is not None


@pytest.fixture(scope="session", autouse=True)
def runjob_user_environment_removed() -> Iterator[None]:
    """For the whole session (each xdist worker's): none of the user's ``MLFLOW_*``,
    ``ACCELERATE_*``, ``RUNJOB_*``, ``HF_*``, ``HUGGINGFACE_*``, ``TRANSFORMERS_*`` or ``OPTUNA_*``
    variables, so session fixtures and every process a test starts never see them; put back after."""
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(USER_ENVIRONMENT_PREFIXES):
                patch.delenv(name)
        yield


@pytest.fixture(autouse=True)
def runjob_isolated_environment(
    runjob_user_environment_removed: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every test of a suite that loads the kit: with the user's settings removed for the session
    (a developer whose shell exports ``MLFLOW_TRACKING_URI`` to a team's server, a Hugging Face cache
    or token), MLflow points at a store in the test's ``tmp_path`` and ``HF_HOME`` there, offline,
    so a test neither depends on the machine's environment nor writes runs into a real server or a
    shared cache. What the session's own fixtures set stays (a module's shared ``RunjobTester``
    points MLflow at its store); a test sets its own values on top (``monkeypatch.setenv``);
    ``runjob_tester`` uses the same folder."""
    if "MLFLOW_TRACKING_URI" not in os.environ:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    if "HF_HOME" not in os.environ:
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if name not in os.environ:
            monkeypatch.setenv(name, "1")


@pytest.fixture(scope="session")
def empty_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An initialised, empty MLflow sqlite store (made once per session, or per xdist worker);
    ``runjob_tester`` and ``mlflow_server`` start from copies of it."""
    return init_mlflow_store(tmp_path_factory.mktemp("mlflow-template") / "mlflow.db")


@pytest.fixture
def runjob_tester(tmp_path: Path, empty_mlflow_db: Path) -> Iterator[RunjobTester]:
    """A :class:`RunjobTester`: ``tmp_path`` as the working directory with a private MLflow store
    and ``HF_HOME``, and none of the outside ``MLFLOW_*``, ``ACCELERATE_*``, ``RUNJOB_*`` variables;
    ways to install plugins, write jobs, run runjob in this process or another and read records."""
    tester = RunjobTester(tmp_path, empty_mlflow_db)
    tester._setup()
    try:
        yield tester
    finally:
        tester._teardown()


@pytest.fixture
def mlflow_server(tmp_path: Path, empty_mlflow_db: Path) -> Iterator[str]:
    """The URL of a real ``mlflow server`` on 127.0.0.1 with its own store in ``tmp_path/server``,
    started for the test and stopped after it (see :func:`running_mlflow_server`)."""
    with running_mlflow_server(tmp_path / "server", template=empty_mlflow_db) as url:
        yield url
