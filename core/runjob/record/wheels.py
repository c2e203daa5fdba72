"""Wheels of the distributions an MLflow model needs that no package index has: runjob itself when
it runs from a checkout, and plugins installed from a folder.

MLflow rebuilds a model's environment from its ``requirements.txt`` (``mlflow models serve``,
``mlflow models predict``, ``spark_udf`` with an environment manager). A pin such as
``runjob-train==0.1.0`` fails there when the distribution was installed from a local path, so such
a distribution travels inside the model as a wheel (``wheels/NAME.whl``, named in the
requirements by its path in the model folder, which MLflow installs from). A distribution
installed from an index stays a plain pin.

A wheel is built once per state of its source files (cached under ``$XDG_CACHE_HOME/runjob/wheels``
or ``~/.cache/runjob/wheels``) with pip's ``wheel`` command without build isolation (offline: the
environment's own setuptools), else ``uv build``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

SKIPPED_ANYWHERE = {"build", "dist", "__pycache__", "node_modules"}
SKIPPED_AT_TOP = {"runs", "data", "mlruns", "mlartifacts", "wandb", "outputs"}  # a checkout's data and runs
SOURCE_SUFFIXES = {".py", ".toml", ".cfg", ".txt", ".md", ".json", ".yaml", ".yml", ".typed", ".in"}


class WheelError(Exception):
    """A local distribution whose wheel could not be built (the message says why)."""


def local_source(name: str) -> Path | None:
    """Where distribution ``name`` was installed from, when that is a folder or a wheel file on
    this machine (``direct_url.json``, PEP 610); ``None`` when it came from an index."""
    # every copy of its metadata on sys.path: a checkout's own `*.egg-info` (left by a build) can
    # shadow the installed `.dist-info`, which alone says where the distribution came from
    texts = [d.read_text("direct_url.json") for d in importlib.metadata.distributions(name=name)]
    text = next(filter(None, texts), None)
    if not text:
        return None
    url = json.loads(text).get("url", "")
    if not url.startswith("file://"):
        return None
    path = Path(unquote(urlparse(url).path))
    return path if path.exists() else None


def wheel_for(name: str, cache: Path | None = None) -> Path | None:
    """A wheel of distribution ``name`` as it is installed here, when it was installed from a local
    path (else ``None``: an index has it). Raises :class:`WheelError` when one cannot be made."""
    source = local_source(name)
    if source is None:
        return None
    if source.is_file() and source.suffix == ".whl":
        return source
    version = importlib.metadata.version(name)
    digest = source_digest(source)
    folder = (cache or cache_folder()) / f"{_normalized(name)}-{version}-{digest}"
    built = sorted(folder.glob("*.whl"))
    if built:
        return built[0]
    return _build(name, source, folder, build_tag=f"0{digest}")


def cache_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "runjob" / "wheels"


def source_digest(source: Path) -> str:
    """A fingerprint of a project folder's source files (paths, sizes, modification times), so an
    edited checkout gets a new wheel; data, build and hidden folders are skipped."""
    hasher = hashlib.sha256()
    for root, folders, files in os.walk(source):
        folders[:] = sorted(f for f in folders if not _skipped(Path(root), f, source))
        for file in sorted(files):
            path = Path(root, file)
            if path.suffix not in SOURCE_SUFFIXES:
                continue
            stat = path.stat()
            hasher.update(f"{path.relative_to(source)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return hasher.hexdigest()[:16]


def _skipped(parent: Path, folder: str, source: Path) -> bool:
    """Folders that are not the project's source: hidden ones, build output, and at the top a
    checkout's data and runs."""
    return (
        folder.startswith(".")
        or folder in SKIPPED_ANYWHERE
        or folder.endswith(".egg-info")
        or (parent == source and folder in SKIPPED_AT_TOP)
    )


def _build(name: str, source: Path, folder: Path, build_tag: str) -> Path:
    """Build the wheel into a temporary folder, then move it into ``folder`` (whole or not at all).
    Its file name gets ``build_tag`` (a wheel's optional build number, which starts with a digit):
    MLflow reuses an environment whose requirements read the same, so a wheel of changed source must
    be named differently, or a served model would run the code of an earlier one."""
    if importlib.util.find_spec("pip") is not None and importlib.util.find_spec("setuptools") is not None:
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w"]
    elif shutil.which("uv"):
        command = ["uv", "build", "--wheel", "-q", "--out-dir"]
    else:
        raise WheelError(f"neither pip (with setuptools) nor uv is here to build a wheel of {name} from {source}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".building-") as scratch:
        # built from a copy of the source: setuptools leaves build/ and *.egg-info where it builds,
        # and a build/ kept from an earlier build would put modules deleted since into the wheel
        copy = Path(scratch) / "source"
        shutil.copytree(source, copy, ignore=lambda root, names: [n for n in names if _skipped(Path(root), n, source)])
        result = subprocess.run(
            [*command, scratch, str(copy)], capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
        )
        wheels = sorted(Path(scratch).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            said = (result.stderr or result.stdout).strip().splitlines()
            raise WheelError(f"building a wheel of {name} from {source} failed: {said[-1] if said else 'no wheel'}")
        partial = Path(scratch) / "done"
        partial.mkdir()
        parts = wheels[0].name.split("-")  # name, version, python tag, abi tag, platform tag (PEP 427)
        shutil.move(str(wheels[0]), partial / "-".join([*parts[:2], build_tag, *parts[-3:]]))
        try:
            partial.rename(folder)
        except OSError:  # another run built it meanwhile
            pass
    return sorted(folder.glob("*.whl"))[0]


def _normalized(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")
