"""runjob's own tests use the public test kit, ``runjob.testing`` (the ``runjob_tester`` fixture and
its helpers); here: the suite's settings and the fixtures only runjob's tests need (test data is in
helpers.py)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# pytester: the kit's own tests run pytest inside; s3_server: moto's S3 server and a bucket (tests/s3_server.py)
pytest_plugins = ["runjob.testing", "pytester", "s3_server"]

# Two xdist workers share two cores, and each test's torch would start a thread a core (four busy
# threads on two cores spin: shared/TRAPS.md). One torch thread in this process and in every
# process a test starts (tests that need otherwise say so).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Every test that starts runjob starts a fresh interpreter that imports torch, accelerate and MLflow.
# Where PYTHONDONTWRITEBYTECODE is set (and the virtual environment holds no .pyc), each of those
# interpreters compiles thousands of modules from source again: seconds of CPU per process, many
# times per test. Compiled bytecode goes to one folder outside the source trees instead (no
# __pycache__ appears in the repository or in a test's folder), shared by this process, the xdist
# workers and every process a test starts; Python checks each file against its source, as always.
if "PYTHONPYCACHEPREFIX" not in os.environ:
    _pycache = Path(tempfile.gettempdir()) / f"runjob-tests-pycache-{os.getuid()}"
    os.environ["PYTHONPYCACHEPREFIX"] = str(_pycache)
    sys.pycache_prefix = str(_pycache)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@pytest.fixture(scope="session")
def empty_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kit's empty MLflow store (``runjob.testing.empty_mlflow_db``), made once per MLflow and
    SQLAlchemy version instead of once per session and xdist worker: MLflow's schema migrations take
    seconds of CPU (twice per run with two workers), and every store a test gets is a copy of this
    empty one anyway. Written under another name and renamed, so a worker never copies half a file."""
    import shutil
    from importlib.metadata import version

    from runjob.testing import init_mlflow_store

    cache = Path(tempfile.gettempdir()) / f"runjob-tests-mlflow-store-{os.getuid()}"
    made = cache / f"mlflow-{version('mlflow')}-sqlalchemy-{version('sqlalchemy')}.db"
    if not made.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        fresh = init_mlflow_store(tmp_path_factory.mktemp("mlflow-template") / "mlflow.db")
        partial = cache / f"{made.name}.{os.getpid()}"
        shutil.copy(fresh, partial)
        os.replace(partial, made)
    template = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    shutil.copy(made, template)  # the session's own copy: a test may not change the shared one
    return template


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that start processes (marked e2e, the longest) first: the two xdist workers share
    them out, and the quick in-process tests fill in the end instead of one long test ending alone."""
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


@pytest.fixture(scope="session")
def digits_folder(tmp_path_factory) -> Path:
    """scikit-learn's digits written as PNGs in train/<digit>/ and val/<digit>/ (the contract layout)."""
    from runjob_builtins.digits import export_image_folder

    root = tmp_path_factory.mktemp("digits") / "digits"
    export_image_folder(root, image_size=32)
    return root


@pytest.fixture
def tester(runjob_tester):
    """``runjob_tester`` with the kit's tiny models installed (``tiny_cnn``, for SMALL_DIGITS)."""
    runjob_tester.install_tiny_models()
    return runjob_tester
