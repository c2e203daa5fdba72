"""Packaging: a plain wheel holds runjob, its plugins and its test kit; a plugin package plugs in by
entry point alone. (The example plugin's own tests, written with the kit, are collected with these:
testpaths in pyproject.toml.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest
from helpers import REPO

from runjob.testing import clean_env, install_project, run_process_group

pytestmark = pytest.mark.timeout(600)
EXAMPLE = REPO / "examples" / "runjob-tinymlp"


def pip(*args: str, cwd) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel of this repository, built from a copy of its sources (the checkout stays clean)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in ("core", "plugins/runjob_builtins"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(work / "dist"), str(source), cwd=work)
    (built,) = (work / "dist").glob("runjob_train-*.whl")
    return built


def test_wheel_holds_the_package_plugins_and_entry_points(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "runjob/commands/cli.py" in names and "runjob/host/hookspecs.py" in names
    assert "runjob/testing.py" in names  # the public test kit ships with runjob
    assert "runjob/py.typed" in names  # so a type checker reads the plugin API's types
    assert "runjob_builtins/torchvision_models.py" in names and "runjob_builtins/digits.py" in names
    (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[console_scripts]\nrunjob = runjob.commands.cli:main" in text
    assert "[runjob]" in text and "torchvision_models = runjob_builtins.torchvision_models" in text


@pytest.mark.e2e
def test_installed_wheel_runs_without_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    pip("install", "--no-deps", "--target", str(target), str(wheel), cwd=tmp_path)
    code = (
        "import runjob, runjob_builtins; print(runjob.__file__); "
        "from runjob.commands.cli import main; main(['plugins'])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=clean_env(tmp_path, [target]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(str(target))
    assert "torchvision_models  (runjob-train 0.1.0" in proc.stdout
    assert "FAILED" not in proc.stdout


def project_files() -> list[str]:
    return sorted(str(p.relative_to(EXAMPLE)) for p in EXAMPLE.rglob("*") if "__pycache__" not in p.parts)


@pytest.mark.e2e
def test_example_plugin_package_plugs_in_through_its_entry_point(runjob_tester):
    before = project_files()
    target = install_project(EXAMPLE, runjob_tester.path / "site")
    assert project_files() == before, "built from a copy: no build/ or *.egg-info in the project"
    # a fresh interpreter with the installed package on its path lists it and checks its options
    listed = run_process_group(
        [sys.executable, "-m", "runjob", "plugins"], runjob_tester.path, clean_env(runjob_tester.path, [target]), 120
    )
    assert listed.returncode == 0, listed.stderr
    assert "tinymlp  (runjob-tinymlp 0.1.0, runjob_tinymlp)" in listed.stdout
    assert "models: tiny_mlp" in listed.stdout

    runjob_tester.write_job(
        "job.toml",
        """
        [job]
        name = "tiny"
        [model]
        name = "tiny_mlp"
        num_classes = 10
        in_features = 768
        hidden_size = 32
        [dataset]
        name = "digits"
        image_size = 16
        [optimizer]
        name = "adam"
        lr = 0.01
        [train]
        epochs = 3
        batch_size = 64
    """,
    )
    bad = run_process_group(
        [sys.executable, "-m", "runjob", "validate", "job.toml", "--set", "model.hidden_size=0"],
        runjob_tester.path,
        clean_env(runjob_tester.path, [target]),
        120,
    )
    assert bad.returncode == 2 and "model.hidden_size: Input should be greater than or equal to 1 (got 0)" in bad.stderr
    # and it trains (here, in this process: the plugin is found through the same entry point)
    runjob_tester.add_site(target)
    result = runjob_tester.cli("job.toml")
    assert result.returncode == 0, result.stderr[-3000:]
    run = runjob_tester.only_run("tiny")
    assert run.status == "FINISHED"
    assert run.tags["runjob.plugin.tinymlp"] == "runjob-tinymlp 0.1.0"
    assert run.metrics["val/accuracy"] > 0.8  # a small MLP learns the digits too
