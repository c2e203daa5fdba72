"""The README's route for a plugin in one's own uv project: runjob-train is on no package index, so
the project names it as a path source first, then adds the plugin; `uv run runjob plugins` lists it.
A run in such a project (no pip in its environment) prints runjob's own lines only.

Offline (UV_OFFLINE=1): uv resolves from its cache. A cache filled only by `uv sync --locked` lacks
the package index pages a new project's resolution reads (one `uv lock` of such a project online
fills it); the test is then skipped, with uv's words as the reason."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PROJECT = """\
[project]
name = "my-training"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = []
"""

PLUGIN = """\
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "my-plugin"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["runjob-train"]

[project.entry-points.runjob]
my_plugin = "my_plugin"
"""

PLUGIN_MODULE = '''\
"""A plugin of one's own: one model."""
import runjob


class MyNetOptions(runjob.Options):
    outputs: int = 10


def build_my_net(options):
    import torch

    return torch.nn.LazyLinear(options.outputs)


@runjob.hookimpl
def runjob_register_models(register):
    register("my_net", build_my_net, options=MyNetOptions)
'''


def copy_of_runjob(folder: Path) -> None:
    """The checkout's sources (what a path source builds), so building leaves the checkout as it is."""
    folder.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, folder / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache")
    # the workspace members too: pyproject names them (the plugin packages as extras' sources)
    for name in ("core", "plugins", "examples/runjob-tinymlp"):
        shutil.copytree(REPO / name, folder / name, ignore=ignore)


NOT_CACHED = ("network was disabled", "Network connectivity is disabled")  # uv's words for "not in my cache"


def uv(*args: str, cwd: Path, timeout: float = 150, **extra: str) -> subprocess.CompletedProcess:
    """``uv ARGS`` offline, with this interpreter's Python (``extra``: more variables); skips the
    test when uv's cache lacks what it needs (said in the skip reason), fails it on any other error."""
    isolated = ("VIRTUAL_ENV", "PYTHONPATH", "UV_PROJECT_ENVIRONMENT")
    env = {k: v for k, v in os.environ.items() if k not in isolated and not k.startswith(("MLFLOW_", "RUNJOB_"))}
    env.update(UV_OFFLINE="1", UV_PYTHON=sys.executable, UV_NO_PROGRESS="1", **extra)
    done = subprocess.run(["uv", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode and any(words in done.stderr for words in NOT_CACHED):
        pytest.skip(f"uv {' '.join(args)}: uv's cache cannot serve it offline: {' '.join(done.stderr.split())[:400]}")
    assert done.returncode == 0, f"uv {' '.join(args)}: {done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def own_project(tmp_path_factory) -> Path:
    """A new uv project with runjob as an editable path source (the README's first step), its
    environment built: shared by this module's tests, as building it takes a while."""
    if shutil.which("uv") is None:
        pytest.skip("uv is not installed")
    folder = tmp_path_factory.mktemp("uv_project")
    copy_of_runjob(folder / "runjob")
    project = folder / "my-training"
    project.mkdir()
    (project / "pyproject.toml").write_text(PROJECT)
    uv("add", "--editable", "../runjob", cwd=project)
    return project


def test_a_plugin_added_to_ones_own_uv_project_is_listed(own_project):
    project = own_project
    plugin = project.parent / "my-plugin"
    (plugin / "my_plugin").mkdir(parents=True)
    (plugin / "pyproject.toml").write_text(PLUGIN)
    (plugin / "my_plugin" / "__init__.py").write_text(PLUGIN_MODULE)

    # the README's steps, in order (the first: the fixture's)
    uv("add", "--editable", "../my-plugin", cwd=project)
    text = (project / "pyproject.toml").read_text()
    assert 'runjob-train = { path = "../runjob", editable = true }' in text
    assert 'my-plugin = { path = "../my-plugin", editable = true }' in text, "kept by uv sync: it is in the project"
    listed = uv("run", "runjob", "plugins", cwd=project)
    assert "my_plugin  (my-plugin 0.1.0, my_plugin)" in listed.stdout and "models: my_net" in listed.stdout


REGRESSION_JOB = """\
[job]
name = "own-project"
[task]
name = "regression"
loss = "mse"
[model]
name = "mlp"
in_features = 3
hidden = [8]
outputs = 1
[dataset]
name = "csv"
path = "data.csv"
target = "target"
[train]
epochs = 2
batch_size = 16
"""

OWN_LINE = re.compile(r"runjob: |epoch \d+/\d+  step \d+  |epoch \d+/\d+: ")
"""runjob's lines: its messages, the epoch lines, the progress bar (tests/test_quiet.py)."""


@pytest.mark.timeout(420)
def test_a_run_in_ones_own_uv_project_prints_runjobs_lines_only(own_project):
    """No pip in a uv project's environment: MLflow's note that it cannot pin pip in the logged
    model's conda.yaml goes to runjob.log, not the terminal."""
    project = own_project
    rows = [f"{i % 7 / 7},{i % 5 / 5},{i % 3 / 3},{i % 7 / 7 + 2 * (i % 5 / 5)}" for i in range(64)]
    (project / "data.csv").write_text("a,b,c,target\n" + "\n".join(rows) + "\n")
    (project / "job.toml").write_text(REGRESSION_JOB)
    no_pip = uv("run", "python", "-c", "import importlib.util; print(importlib.util.find_spec('pip'))", cwd=project)
    assert no_pip.stdout.strip() == "None", "uv makes environments without pip"
    ran = uv("run", "runjob", "job.toml", "--output-dir", "out", cwd=project, timeout=400, OMP_NUM_THREADS="1")
    printed = [line for line in re.split(r"[\r\n]", ran.stdout + ran.stderr) if line.strip()]
    assert [line for line in printed if not OWN_LINE.match(line)] == [], "runjob's own lines only"
    assert any(line.startswith("runjob: finished own-project") for line in printed)
    kept = (project / "out" / "runjob.log").read_text(encoding="utf-8")
    assert "recording WARNING mlflow.utils.environment: Failed to resolve installed pip version" in kept
