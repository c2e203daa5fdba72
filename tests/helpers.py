"""Test data only runjob's own tests need (the kit, runjob.testing, has the rest): job texts, fake
CIFAR-10 files, a run's metric points on both sides, a private PostgreSQL server and an `mlflow
server` over it (benchmarks/load_test.py uses these too). A module of its own, not conftest.py:
the example plugin's tests, collected in the same session, have a conftest.py too, and only one
module can be called ``conftest``."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def documentation_pages() -> list[Path]:
    """What users read: the README and the site's pages (docs/)."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def documentation() -> str:
    """The README and every page of the site, one text (for a sentence or block that must be there)."""
    return "\n".join(page.read_text(encoding="utf-8") for page in documentation_pages())


def documented_python(first_line: str) -> tuple[Path, str]:
    """The page that holds the Python block beginning with ``first_line``, and the block: what
    users copy, run as it is written there."""
    fence = "```python\n" + first_line
    for page in documentation_pages():
        text = page.read_text(encoding="utf-8")
        if fence in text:
            start = text.index(fence) + len("```python\n")
            return page, text[start : text.index("```", start)]
    raise AssertionError(f"no page holds a Python block beginning {first_line!r}")


def write_cifar_batches(root: Path, per_batch: int = 20, seed: int = 0) -> Path:
    """CIFAR-10's python format with random pixels, ``per_batch`` images in each batch file (the
    ``cifar10`` plugin's own writer); the md5 sums are not CIFAR's."""
    from runjob_builtins.image_datasets import write_cifar10_files

    return write_cifar10_files(root, per_batch, seed=seed)


SMALL_DIGITS = """
    [job]
    name = "{name}"
    [model]
    name = "tiny_cnn"
    [dataset]
    name = "digits"
    image_size = 16
    [train]
    batch_size = 32
"""
"""A small job on the digits: the kit's tiny_cnn (a few thousand parameters) on 16x16 scans;
``{name}`` is the job's name (and its MLflow experiment's)."""

TINY_GPT = """
    [job]
    name = "{name}"
    [task]
    name = "language_modeling"
    [model]
    name = "gpt"
    context = 16
    layers = 1
    width = 16
    heads = 2
    [dataset]
    name = "text_files"
    paths = "corpus/*.txt"
    context = 16
    val_fraction = 0.2
"""
"""A one-layer, width-16 GPT on the text files in ``corpus/`` (the test writes them); add ``[train]``
and ``[optimizer]`` tables after it."""

RESNET18_DIGITS = """
    [job]
    name = "{name}"
    [model]
    name = "resnet18"
    num_classes = 10
    [dataset]
    name = "digits"
    image_size = 16
    [train]
    batch_size = 32
"""
"""The same job with the built-in ResNet-18, for tests about what that model gives (and for job
files that are only checked, never trained)."""


def uploaded_best(output_dir: Path) -> set[str]:
    """What MLflow's ``best/`` of the run in ``output_dir`` holds: the best weights, unless the
    run's record of models (``models.json``) says they are the final ``model.safetensors`` (stored
    once)."""
    import json

    named = json.loads((Path(output_dir) / "models.json").read_text())["best"]["artifact"]
    return set() if named == "model.safetensors" else {"best/model.safetensors"}


def installed_plugin_tags():
    """The ``runjob.plugin.NAME`` tag of every plugin installed here that is not a built-in (the
    plugin packages of this repository, runjob-timm and runjob-hf, when their extras are)."""
    from runjob.host.plugin_host import load_plugins

    return {f"runjob.plugin.{plugin.name}" for plugin in load_plugins().plugins if not plugin.builtin}


def local_points(out: Path) -> dict[str, list[tuple[int, float]]]:
    """Every metric point of the run's local record in folder ``out`` (all machines' files), by key."""
    import json

    points: dict[str, list[tuple[int, float]]] = {}
    for path in out.glob("metrics*.jsonl"):
        for line in path.read_text().splitlines():
            point = json.loads(line)
            points.setdefault(point["key"], []).append((point["step"], point["value"]))
    return {key: sorted(values) for key, values in points.items()}


def server_points(run, keys) -> dict[str, list[tuple[int, float]]]:
    """Every point MLflow holds of each metric in ``keys`` of ``run`` (a runjob.testing.MlflowRun),
    by key, in the order of local_points: the two are equal when MLflow has the whole record."""
    return {key: sorted(run.history(key)) for key in keys}


# ---------------------------------------------------------------------------------------------
# A private PostgreSQL server (MLflow's backend store, an Optuna storage), for the tests and
# benchmarks/load_test.py


def postgres_bin() -> Path | None:
    """The programs folder of the newest PostgreSQL installed as Debian installs it
    (``/usr/lib/postgresql/N/bin``), or None where there is none."""
    found = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb") if p.parts[-3].isdigit()]
    return max(found, key=lambda folder: int(folder.parts[-2]), default=None)


NO_POSTGRES = (
    "PostgreSQL is not installed here (no /usr/lib/postgresql/*/bin/initdb); "
    ".ci/run installs it (apt-get install postgresql)"
)


@contextlib.contextmanager
def running_postgres(
    databases: Sequence[str] = (), *, durable: bool = False, start_timeout: float = 60
) -> Iterator[str]:
    """A private PostgreSQL server on 127.0.0.1 (a free port), its cluster in a new temporary
    folder, the user ``runjob`` let in without a password; yields its URL,
    ``postgresql://runjob@127.0.0.1:PORT`` (add ``/DATABASE``), once it takes connections and
    ``databases`` exist; stops it and removes the folder on exit.

    PostgreSQL refuses to run as root: as root (CI), the folder is handed to the ``postgres``
    system user (Debian's package creates it) and initdb and the server run as that user.
    ``durable=False`` turns off fsync and synchronous commit: a test's data is thrown away, and the
    flushes cost it seconds; a benchmark asks for ``durable=True``, as a real server runs."""
    import psycopg

    from runjob.testing import free_port

    programs = postgres_bin()
    if programs is None:
        raise RuntimeError(NO_POSTGRES)
    as_user = "postgres" if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="runjob-postgres-"))
    log_path = folder / "server.log"
    server: subprocess.Popen[bytes] | None = None
    try:
        if as_user:
            shutil.chown(folder, as_user)
        initdb = [programs / "initdb", "-D", folder / "data", "-U", "runjob", "--auth=trust", "-E", "UTF8"]
        initdb += ["--locale=C"] + ([] if durable else ["--no-sync"])
        with log_path.open("ab") as log:
            subprocess.run(
                initdb,
                cwd=folder,
                user=as_user,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=start_timeout,
            )
        port = free_port()
        settings = {"listen_addresses": "127.0.0.1", "unix_socket_directories": "", "max_connections": "200"}
        if not durable:
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        command = [programs / "postgres", "-D", folder / "data", "-p", str(port)]
        command += [part for key, value in settings.items() for part in ("-c", f"{key}={value}")]
        with log_path.open("ab") as log:  # a file, not a pipe: a full pipe would stall the server
            server = subprocess.Popen(
                command, cwd=folder, user=as_user, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        url = f"postgresql://runjob@127.0.0.1:{port}"
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                connection = psycopg.connect(f"{url}/postgres", connect_timeout=2, autocommit=True)
                break
            except psycopg.OperationalError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"PostgreSQL did not start: {log_path.read_text(errors='replace')[-2000:]}"
                    ) from None
                time.sleep(0.1)
        try:
            for name in databases:  # autocommit: CREATE DATABASE cannot run inside a transaction
                connection.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()
        yield url
    finally:
        if server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGQUIT)  # immediate shutdown: the data is thrown away
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def running_mlflow_server_on(backend_store_uri: str, folder: Path, *, start_timeout: float = 180):
    """``runjob.testing.running_mlflow_server`` over the backend store ``backend_store_uri`` (a
    ``postgresql://`` URL: MLflow creates its tables on the first start), artifacts and
    ``server.log`` in ``folder``."""
    from runjob.testing import running_mlflow_server

    return running_mlflow_server(folder, start_timeout=start_timeout, backend_store_uri=backend_store_uri)
