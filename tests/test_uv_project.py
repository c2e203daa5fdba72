"""The README's route for a plugin in one's own uv project: runjob-train is on no package index, so
the project names it as a path source first, then adds the plugin; `uv run runjob plugins` lists it.

Offline (UV_OFFLINE=1): uv resolves from its cache. A cache filled only by `uv sync --locked` lacks
the package index pages a new project's resolution reads (one `uv lock` of such a project online
fills it); the test is then skipped, with uv's words as the reason."""

from __future__ import annotations

import os
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
    for name in ("core", "plugins", "examples/runjob-tinymlp", "packages/runjob-timm", "packages/runjob-hf"):
        shutil.copytree(REPO / name, folder / name, ignore=ignore)


NOT_CACHED = ("network was disabled", "Network connectivity is disabled")  # uv's words for "not in my cache"


def uv(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``uv ARGS`` offline, with this interpreter's Python; skips the test when uv's cache lacks
    what it needs (said in the skip reason), fails it on any other error."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "UV_PROJECT_ENVIRONMENT")}
    env.update(UV_OFFLINE="1", UV_PYTHON=sys.executable, UV_NO_PROGRESS="1")
    done = subprocess.run(["uv", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=150)
    if done.returncode and any(words in done.stderr for words in NOT_CACHED):
        pytest.skip(f"uv {' '.join(args)}: uv's cache cannot serve it offline: {' '.join(done.stderr.split())[:400]}")
    assert done.returncode == 0, f"uv {' '.join(args)}: {done.stderr[-3000:]}"
    return done


def test_a_plugin_added_to_ones_own_uv_project_is_listed(tmp_path):
    if shutil.which("uv") is None:
        pytest.skip("uv is not installed")
    copy_of_runjob(tmp_path / "runjob")
    plugin = tmp_path / "my-plugin"
    (plugin / "my_plugin").mkdir(parents=True)
    (plugin / "pyproject.toml").write_text(PLUGIN)
    (plugin / "my_plugin" / "__init__.py").write_text(PLUGIN_MODULE)
    project = tmp_path / "my-training"
    project.mkdir()
    (project / "pyproject.toml").write_text(PROJECT)

    # the README's steps, in order
    uv("add", "--editable", "../runjob", cwd=project)
    uv("add", "--editable", "../my-plugin", cwd=project)
    text = (project / "pyproject.toml").read_text()
    assert 'runjob-train = { path = "../runjob", editable = true }' in text
    assert 'my-plugin = { path = "../my-plugin", editable = true }' in text, "kept by uv sync: it is in the project"
    listed = uv("run", "runjob", "plugins", cwd=project)
    assert "my_plugin  (my-plugin 0.1.0, my_plugin)" in listed.stdout and "models: my_net" in listed.stdout
