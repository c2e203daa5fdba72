"""The three distributions as a user gets them from a release: runjob-train, runjob-timm and runjob-hf
built with ``uv build`` from the files git would commit, checked by ``twine check --strict``,
installed into a fresh virtual environment from the built files alone (the extras name the plugin
packages, which resolve to the built wheels; torch and the other dependencies come from the package
index or uv's cache, at the versions uv.lock holds), and the quick start run there from a folder
outside the checkout. Also the release workflow (.github/workflows/release.yml) and the one place
each version is written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers import REPO

import runjob
from runjob.testing import clean_env, run_process_group

PACKAGES = {  # distribution -> its project folder in the checkout
    "runjob-train": REPO,
    "runjob-timm": REPO / "plugins" / "runjob-timm",
    "runjob-hf": REPO / "plugins" / "runjob-hf",
}
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


def project(name: str) -> dict[str, object]:
    with open(PACKAGES[name] / "pyproject.toml", "rb") as file:
        table: dict[str, object] = tomllib.load(file)["project"]
        return table


def uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv")  # `uv run` names itself in UV
    assert found, "uv is not on PATH: the distributions are built and installed with uv"
    return found


def check(command: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    """Run ``command`` to the end (its process group killed at ``timeout``); its stdout, or the test
    fails with both streams' tails."""
    result = run_process_group(command, cwd, env, timeout)
    assert result.returncode == 0, (
        f"{command} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result.stdout


def test_each_version_is_written_once_and_read_from_the_installed_metadata() -> None:
    runjob_hf = pytest.importorskip("runjob_hf")  # installed with the hf extra
    assert runjob.__version__ == project("runjob-train")["version"]
    assert runjob_hf.__version__ == project("runjob-hf")["version"]
    # the plugin packages are released with runjob-train, at its version
    assert project("runjob-timm")["version"] == project("runjob-hf")["version"] == runjob.__version__


def test_release_workflow_builds_checks_and_publishes_each_package_through_trusted_publishing() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads the bare key `on` as true
    assert triggers["push"]["tags"] == ["v*"]
    assert workflow["permissions"] == {"contents": "read"}  # only the publishing jobs get a token
    jobs = workflow["jobs"]
    assert set(jobs["build"]["strategy"]["matrix"]["package"]) == set(PACKAGES)
    build_steps = " ".join(step.get("run", "") for step in jobs["build"]["steps"])
    assert "uv build --package" in build_steps and "twine check --strict" in build_steps
    published: list[str] = []
    for job in jobs.values():
        steps = [step.get("uses", "") for step in job["steps"]]
        if not any(uses.startswith("pypa/gh-action-pypi-publish@") for uses in steps):
            assert "id-token" not in job.get("permissions", {})
            continue
        assert job["permissions"] == {"id-token": "write"} and job["environment"] == "pypi"
        assert job["if"] == "startsWith(github.ref, 'refs/tags/v')"  # a manual run publishes nothing
        published += job.get("strategy", {}).get("matrix", {}).get("package", []) or ["runjob-train"]
    assert sorted(published) == sorted(PACKAGES)
    assert jobs["publish-plugins"]["needs"] == "publish-runjob-train"  # the plugins depend on it
    # GitHub's workflow schema, as check-jsonschema (dev group) ships it: every key, value and type
    # (actionlint is not installable without a download of its binary)
    checker = [str(Path(sys.executable).parent / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows"]
    lint = subprocess.run([*checker, str(WORKFLOW)], capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A folder outside the checkout, removed afterwards (the virtual environment is large)."""
    assert not tmp_path.is_relative_to(REPO)
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


def committed_copy(target: Path) -> Path:
    """The files git would commit (tracked, and new ones not ignored) copied to ``target``: what a
    release job checks out, without the checkout's build/, *.egg-info or data."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.mark.e2e
@pytest.mark.timeout(1500)
def test_built_distributions_install_from_their_files_and_run_the_quick_start(scratch: Path) -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs runjob's git checkout: the distributions are built from the files git would commit")
    started = time.monotonic()
    version = str(project("runjob-train")["version"])
    source, dist, venv, work = (scratch / name for name in ("source", "dist", "venv", "work"))
    committed_copy(source)
    for name in PACKAGES:
        check([uv(), "build", "--package", name, "--out-dir", str(dist)], source, 300)

    stem = {name: f"{name.replace('-', '_')}-{version}" for name in PACKAGES}
    files = sorted(p for p in dist.iterdir() if p.name.endswith((".whl", ".tar.gz")))  # uv adds a .gitignore
    built = [p.name for p in files]
    assert built == sorted([f"{s}-py3-none-any.whl" for s in stem.values()] + [f"{s}.tar.gz" for s in stem.values()])
    for name, s in stem.items():
        with zipfile.ZipFile(dist / f"{s}-py3-none-any.whl") as wheel:
            assert f"{s}.dist-info/licenses/LICENSE" in wheel.namelist(), name
            metadata = wheel.read(f"{s}.dist-info/METADATA").decode()
        assert "License-Expression: Apache-2.0" in metadata and f"Version: {version}" in metadata, name
        with tarfile.open(dist / f"{s}.tar.gz") as sdist:
            assert f"{s}/LICENSE" in sdist.getnames() and f"{s}/README.md" in sdist.getnames(), name
            if name == "runjob-train":  # the changelog and its deprecation policy go with the source
                assert f"{s}/CHANGELOG.md" in sdist.getnames(), sdist.getnames()
    check([sys.executable, "-m", "twine", "check", "--strict", *map(str, files)], scratch, 120)

    # A fresh environment: runjob's packages from dist/ only, the rest at uv.lock's versions (so
    # from uv's cache where the checkout was synced).
    constraints = scratch / "constraints.txt"
    exported = [uv(), "export", "--frozen", "--all-extras", "--no-dev", "--no-emit-workspace", "--no-hashes"]
    check([*exported, "--output-file", str(constraints)], REPO, 120)
    uv_env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "UV_PROJECT_ENVIRONMENT")}
    check([uv(), "venv", "--python", sys.executable, str(venv)], scratch, 120, uv_env)
    python = venv / "bin" / "python"
    pins = [f"runjob-train[digits,timm,hf]=={version}", f"runjob-timm=={version}", f"runjob-hf=={version}"]
    install = [uv(), "pip", "install", "--python", str(python), "--find-links", str(dist), "-c", str(constraints)]
    check([*install, *pins], scratch, 900, uv_env)

    work.mkdir()
    env = clean_env(work, threads=1)
    for name in ("PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(name, None)
    cli = str(venv / "bin" / "runjob")
    # the installed files are the built ones: in the new environment, not the checkout's editable
    # install, and the same bytes as dist/'s wheels (their RECORD's hashes), not a namesake from the index
    where = check(
        [str(python), "-c", "import runjob, runjob_timm; print(runjob.__file__, runjob_timm.__file__)"], work, 120, env
    )
    assert all(Path(path).is_relative_to(venv) for path in where.split()), where
    site = Path(where.split()[0]).parents[1]
    for name, module in (("runjob-train", "runjob"), ("runjob-timm", "runjob_timm"), ("runjob-hf", "runjob_hf")):
        with zipfile.ZipFile(dist / f"{stem[name]}-py3-none-any.whl") as wheel:
            built_record = wheel.read(f"{stem[name]}.dist-info/RECORD").decode().splitlines()
        installed_record = (site / f"{stem[name]}.dist-info" / "RECORD").read_text().splitlines()
        line = next(entry for entry in built_record if entry.startswith(f"{module}/__init__.py,"))
        assert line in installed_record, (name, line)
    assert check([cli, "--version"], work, 120, env).strip() == f"runjob {version}"
    plugins = check([cli, "plugins"], work, 120, env)
    assert f"timm  (runjob-timm {version}, runjob_timm)" in plugins, plugins
    assert f"hf  (runjob-hf {version}, runjob_hf)" in plugins and "FAILED" not in plugins, plugins
    shutil.copy(REPO / "jobs" / "digits.toml", work / "digits.toml")
    result = run_process_group([cli, "digits.toml", "--set", "train.epochs=1"], work, env, 600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "runjob: finished digits-resnet18" in result.stdout + result.stderr
    assert list((work / "runs" / "digits-resnet18").glob("*/model.safetensors"))
    print(f"built, checked, installed and ran the quick start in {time.monotonic() - started:.0f} s")
