"""A run is data, not code (issue 31): what runjob reads back from a run folder or a run's MLflow
model is JSON, TOML, safetensors, text and torch checkpoints loaded with ``weights_only=True``,
never a pickle; a planted ``prediction.pkl`` is never unpickled, whatever the user says; a
tampered predictor is one line and exit code 2, not a traceback.

Three kinds of check:

* dynamic: Python audit hooks record, while a command runs in this process, every file opened for
  reading under the run's (or model's) folder, every global an unpickler looked up
  (``pickle.find_class``: torch's own ``weights_only`` unpickler raises none), and every
  ``torch.load`` and ``yaml.load`` call (wrapped), for ``runjob predict``, ``evaluate``,
  ``export``, the MLflow model and a resume from a checkpoint;
* static: the AST of runjob's and its plugins' sources holds no ``eval``, ``exec``, unpickling,
  ``torch.load`` without ``weights_only=True`` or unsafe ``yaml.load``;
* tampering: a planted pickle that writes a file when unpickled, and damaged ``predictor.json``
  and ``data_facts.json`` files.

One tiny run (a 3-feature MLP regression on a CSV the module writes) is trained once for the module."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import pickle
import shutil
import sys
import threading
import tomllib
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO

from runjob.testing import RunjobTester

pytestmark = pytest.mark.timeout(600)

JOB = """
    [job]
    name = "run-is-data"
    [task]
    name = "regression"
    [model]
    name = "mlp"
    in_features = 3
    hidden = [8]
    outputs = 1
    [dataset]
    name = "csv"
    path = "table.csv"
    target = "y"
    [train]
    max_steps = 8
    batch_size = 16
    checkpoint_every = 4
"""

ROWS = [(0.5, -1.0, 0.25), (-0.2, 0.4, 1.0), (1.0, 1.0, -1.0)]
"""Raw rows (a, b, c) to predict."""

EXPORTER_PLUGIN = '''
"""An export format that needs the run's predictor: the inputs' columns as JSON."""
import json

import runjob


def export_columns(request):
    if request.inputs is None:
        raise ValueError("the run saved no inputs")
    request.output.write_text(json.dumps(dict(request.inputs.columns)))
    return "wrote the input columns"


@runjob.hookimpl
def runjob_register_exporters(register):
    register("columns", export_columns, description="the run's input columns as JSON")
'''


@pytest.fixture(scope="module")
def trained(tmp_path_factory, empty_mlflow_db):
    """The module's run (``runs/data``), with ``new.csv`` (ROWS) to predict; the ``columns``
    exporter installed (a plugin export format reads the run's saved predictor)."""
    tester = RunjobTester(tmp_path_factory.mktemp("run-is-data"), empty_mlflow_db)
    tester._setup()
    try:
        tester.install_plugin("columns-exporter", {"columns_exporter": EXPORTER_PLUGIN})
        lines = ["a,b,c,y"]
        for i in range(64):
            a, b, c = (i % 7) / 3 - 1, (i % 5) / 2 - 1, (i % 11) / 5 - 1
            lines.append(f"{a},{b},{c},{2 * a - b + 3 * c + 0.5}")
        (tester.path / "table.csv").write_text("\n".join(lines) + "\n")
        (tester.path / "new.csv").write_text("c,b,a\n" + "".join(f"{c},{b},{a}\n" for a, b, c in ROWS))
        tester.write_job("job.toml", JOB)
        run = tester.run("job.toml", output_dir="runs/data")
        assert run.status == "FINISHED"
        assert (run.output_dir / "predictor" / "predictor.json").is_file()
        assert not (run.output_dir / "prediction.pkl").exists()
        assert list((run.output_dir / "checkpoints").glob("step-*")), "the run kept a checkpoint to resume from"
        yield tester, run.output_dir
    finally:
        tester._teardown()


@pytest.fixture(scope="module")
def expected(trained) -> list[dict[str, Any]]:
    """``runjob predict``'s rows for new.csv from the untouched run (its saved predictor)."""
    tester, out = trained
    return predicted(tester.cli("predict", out, "--input", "new.csv"))


def predicted(result) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["input"] for row in rows] == ["line 2", "line 3", "line 4"]
    return rows


def copy_run(out: Path, target: Path) -> Path:
    """A copy of the run folder without its MLflow model and checkpoints (what predict reads)."""
    shutil.copytree(out, target, ignore=shutil.ignore_patterns("mlflow_model", "checkpoints"))
    return target


def one_line(result, *fragments: str) -> str:
    """The one ``runjob: `` line a refused command printed, with exit code 2 and no traceback;
    it holds each of ``fragments``."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr_lines
    assert len(lines) == 1 and lines[0].startswith("runjob: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


# ---------------------------------------------------------------------------------------------
# Watching what a command reads: audit hooks (they cannot be removed: the hook records only while
# a `watching` block is open) and wrappers of torch.load and yaml.load


class Watched:
    """What one :func:`watching` block saw: the files opened for reading under ``folders`` (their
    bytes as they were when opened), the globals unpicklers looked up, and each ``torch.load``
    (the file, its ``weights_only``) and ``yaml.load`` (its loader class) call."""

    def __init__(self, folders: tuple[Path, ...]) -> None:
        self.folders = tuple(os.path.join(os.path.abspath(folder), "") for folder in folders)
        self.read: dict[str, bytes | None] = {}
        self.find_class: list[tuple[str, str]] = []
        self.torch_loads: list[tuple[str, Any]] = []
        self.yaml_loaders: list[Any] = []

    def under(self, path: str) -> bool:
        return path.startswith(self.folders)


_WATCHING: list[Watched] = []  # the open block's, if any: read by the audit hook
_IN_HOOK = threading.local()
_HOOKED = False


def _snapshot(path: str) -> bytes | None:
    try:
        with open(path, "rb") as file:  # noqa: PTH123 - in the audit hook: the plain call
            return file.read()
    except OSError:
        return None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _WATCHING or getattr(_IN_HOOK, "busy", False):
        return
    watched = _WATCHING[-1]
    if event == "pickle.find_class":
        watched.find_class.append((str(args[0]), str(args[1])))
    elif event == "open":
        path, _mode, flags = args
        if path is None or isinstance(path, int):
            return
        if isinstance(flags, int) and flags >= 0 and flags & os.O_ACCMODE == os.O_WRONLY:
            return  # written, not read back
        _IN_HOOK.busy = True
        try:
            name = os.path.abspath(os.fsdecode(path))
            # a folder opened to sync or list it holds no contents to read
            if watched.under(name) and name not in watched.read and not os.path.isdir(name):
                watched.read[name] = _snapshot(name)
        except Exception:  # noqa: BLE001, S110 - a hook must never break the open it watches
            pass
        finally:
            _IN_HOOK.busy = False


def _file_name(f: Any) -> str:
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.path.abspath(os.fsdecode(f))
    return str(getattr(f, "name", type(f).__name__))


@contextlib.contextmanager
def watching(*folders: Path) -> Iterator[Watched]:
    """Record what is read under ``folders`` and every unpickling while the block runs."""
    global _HOOKED
    import torch
    import yaml

    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED = True
    watched = Watched(folders)
    real_torch_load, real_yaml_load = torch.load, yaml.load

    def torch_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        watched.torch_loads.append((_file_name(f), kwargs.get("weights_only", "not given")))
        return real_torch_load(f, *args, **kwargs)

    def yaml_load(stream: Any, Loader: Any = None) -> Any:  # noqa: N803 - yaml's own argument name
        watched.yaml_loaders.append(Loader)
        return real_yaml_load(stream, Loader)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "load", torch_load)
        patch.setattr(torch.serialization, "load", torch_load)
        patch.setattr(yaml, "load", yaml_load)  # yaml.safe_load calls the module's load
        _WATCHING.append(watched)
        try:
            yield watched
        finally:
            _WATCHING.remove(watched)


MLFLOW_METADATA = ("MLmodel", "conda.yaml", "python_env.yaml")


def kind_of(path: str, data: bytes | None, safe_torch_files: set[str]) -> str:
    """What the file read at ``path`` is, judged by its bytes when it was opened; a name that
    starts with "NOT DATA" for anything that is not one of the kinds a run may be read as."""
    name = os.path.basename(path)
    if data is None:
        return "NOT DATA: could not be read back when it was opened"
    try:
        if name.endswith(".json"):
            json.loads(data)
            return "JSON"
        if name.endswith(".jsonl"):
            for line in data.decode().splitlines():
                if line.strip():
                    json.loads(line)
            return "JSON lines"
        if name.endswith(".toml"):
            tomllib.loads(data.decode())
            return "TOML"
        if name.endswith(".safetensors"):
            size = int.from_bytes(data[:8], "little")
            json.loads(data[8 : 8 + size])
            return "safetensors"
        if name in ("runjob.log", "requirements.txt"):
            data.decode()
            return "text"
        if name in MLFLOW_METADATA:
            import yaml

            yaml.safe_load(data)
            return "YAML (MLflow's, read with a safe loader)"
    except (ValueError, UnicodeDecodeError) as error:
        return f"NOT DATA: {error}"
    if zipfile.is_zipfile(io.BytesIO(data)) and path in safe_torch_files:
        return "torch zip, loaded with weights_only=True"
    return (
        f"NOT DATA: a {name.rpartition('.')[2]} file not loaded by torch.load(weights_only=True), starts {data[:16]!r}"
    )


def assert_read_as_data(watched: Watched, *must_read: str) -> dict[str, str]:
    """Nothing was unpickled, every torch.load had ``weights_only=True``, every yaml.load a safe
    loader, and every file read under the watched folders is data; ``must_read``: file names (ends
    of paths) that must be among them (so the watch is seen to work). Returns path -> kind."""
    import yaml

    assert not watched.find_class, f"unpickled (pickle.find_class): {watched.find_class}"
    unsafe = [(path, given) for path, given in watched.torch_loads if given is not True]
    assert not unsafe, f"torch.load without weights_only=True: {unsafe}"
    safe_loaders = (yaml.SafeLoader, yaml.BaseLoader, getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    unsafe_yaml = [loader for loader in watched.yaml_loaders if not issubclass(loader, safe_loaders)]
    assert not unsafe_yaml, f"yaml.load with unsafe loaders: {unsafe_yaml}"
    safe_torch_files = {path for path, given in watched.torch_loads if given is True}
    kinds = {path: kind_of(path, data, safe_torch_files) for path, data in sorted(watched.read.items())}
    listing = "\n".join(f"  {path}: {kind}" for path, kind in kinds.items())
    assert not any(kind.startswith("NOT DATA") for kind in kinds.values()), f"files read that are not data:\n{listing}"
    for name in must_read:
        assert any(path.endswith(name) for path in kinds), f"{name} was not seen read; read:\n{listing}"
    return kinds


# ---------------------------------------------------------------------------------------------
# Dynamic: each way a run is read back, watched


def test_predict_reads_the_saved_predictor_as_data(trained, expected):
    tester, out = trained
    with watching(out) as watched:
        rows = predicted(tester.cli("predict", out, "--input", "new.csv"))
    assert rows == expected
    assert_read_as_data(watched, "predictor/predictor.json", "job.toml", "data_facts.json")


def test_evaluate_reads_the_run_as_data(trained):
    tester, out = trained
    with watching(out) as watched:
        result = tester.cli("evaluate", out, "--no-record")
    assert result.returncode == 0, result.stderr
    assert "val/r2" in result.stdout
    assert_read_as_data(watched, "job.toml")


def test_export_reads_the_run_as_data(trained, tmp_path):
    """pt2 (built in: the dataset is built again), onnx when its extra is installed, and a plugin's
    format, which is given the run's saved predictor."""
    tester, out = trained
    formats = ["pt2", "columns"]
    if all(importlib_find(name) for name in ("onnx", "onnxruntime", "onnxscript")):
        formats.append("onnx")
    for format in formats:
        with watching(out) as watched:
            result = tester.cli("export", out, "--format", format, "--output", tmp_path / f"model.{format}")
        assert result.returncode == 0, result.stderr
        assert (tmp_path / f"model.{format}").exists()
        assert_read_as_data(watched, "job.toml", *(["predictor/predictor.json"] if format == "columns" else []))
    assert json.loads((tmp_path / "model.columns").read_text()) == {"a": "double", "b": "double", "c": "double"}


def importlib_find(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_the_mlflow_model_loads_and_predicts_from_data(trained, expected):
    import mlflow.pyfunc
    import pandas as pd

    _, out = trained
    folder = out / "mlflow_model"
    assert not (folder / "python_model.pkl").exists()
    with watching(folder) as watched:
        model = mlflow.pyfunc.load_model(str(folder))
        got = model.predict(pd.DataFrame([{"a": a, "b": b, "c": c} for a, b, c in ROWS]))
    assert got["value"].tolist() == pytest.approx([row["value"] for row in expected], abs=1e-5)
    kinds = assert_read_as_data(watched, "MLmodel", "data/run/predictor/predictor.json", "data/run/job.toml")
    assert not any(path.endswith(".pkl") for path in kinds)


def test_a_resume_reads_its_checkpoint_as_data(trained, tmp_path, capsys):
    """The run continued from its checkpoint (four more steps): Accelerate's states (optimizer,
    RNG) are torch files loaded with weights_only=True, the rest JSON, TOML and safetensors."""
    tester, out = trained
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed, ignore=shutil.ignore_patterns("mlflow_model"))
    with watching(resumed) as watched:
        run = tester.run("job.toml", "train.max_steps=12", output_dir=resumed, resume=True)
    assert run.status == "FINISHED"
    assert "resuming step-00000008" in capsys.readouterr().out
    kinds = assert_read_as_data(watched, "runjob_state.json", "optimizer.bin")
    assert any(kind.startswith("torch zip") for kind in kinds.values())


# ---------------------------------------------------------------------------------------------
# Static: no code path of runjob or its plugins unpickles, evals or loads unsafely

SOURCE_ROOTS = [
    REPO / "core",
    REPO / "plugins" / "runjob_builtins",
    *sorted(REPO.glob("plugins/*/src")),
    *sorted(REPO.glob("examples/*/src")),
]
UNPICKLERS = ("pickle", "_pickle", "cPickle")
SAFE_YAML_LOADERS = ("SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader")


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Names bound by the module's imports (in any scope) -> the dotted names they stand for."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.partition(".")[0]] = (
                    alias.name if alias.asname else alias.name.partition(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    return None


def _keyword(call: ast.Call, name: str, position: int | None = None) -> ast.AST | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    if position is not None and len(call.args) > position:
        return call.args[position]
    return None


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _unsafe(called: str, call: ast.Call, aliases: dict[str, str]) -> str | None:
    """Why calling ``called`` (a dotted name) this way may run code a file holds, or None."""
    module, _, function = called.rpartition(".")
    if called in ("eval", "exec", "builtins.eval", "builtins.exec"):
        return f"{function or called}()"
    if module in UNPICKLERS and function in ("load", "loads", "Unpickler"):
        return called
    if called.partition(".")[0] in ("cloudpickle", "dill", "jsonpickle"):
        return called
    if called in ("marshal.load", "marshal.loads", "joblib.load", "pandas.read_pickle", "shelve.open"):
        return called
    if called in ("torch.load", "torch.serialization.load") and not _is_true(_keyword(call, "weights_only")):
        return f"{called} without weights_only=True"
    if called == "numpy.load" and _is_true(_keyword(call, "allow_pickle")):
        return "numpy.load(allow_pickle=True)"
    if called in ("yaml.unsafe_load", "yaml.full_load", "yaml.unsafe_load_all", "yaml.full_load_all"):
        return called
    if called in ("yaml.load", "yaml.load_all"):
        loader = _keyword(call, "Loader", 1)
        name = _dotted(loader, aliases) if loader is not None else None
        if name is None or name.rpartition(".")[2] not in SAFE_YAML_LOADERS:
            return f"{called} without a safe Loader"
    return None


def unsafe_calls(source: str, filename: str) -> list[tuple[str, int, str, str]]:
    """``(file, line, enclosing function, what)`` for each call in ``source`` that may run code a
    file holds, and each class derived from an unpickler."""
    tree = ast.parse(source, filename)
    aliases = _aliases(tree)
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inside = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                called = _dotted(child.func, aliases)
                why = _unsafe(called, child, aliases) if called else None
                if why:
                    found.append((filename, child.lineno, function, why))
            if isinstance(child, ast.ClassDef):
                for base in child.bases:
                    named = _dotted(base, aliases) or ""
                    if named.rpartition(".")[0] in UNPICKLERS and named.endswith(".Unpickler"):
                        found.append((filename, child.lineno, function, f"class {child.name}({named})"))
            visit(child, inside)

    visit(tree, "")
    return found


def test_the_static_check_finds_each_kind_of_unsafe_call():
    """The checker itself: every forbidden call is found at its line, and what is safe is not
    (``model.eval()``, ``torch.load(..., weights_only=True)``, ``yaml.safe_load``)."""
    source = "\n".join(
        [
            "import pickle as p, torch, yaml, marshal, cloudpickle",  # 1
            "from pickle import Unpickler",  # 2
            "eval('1')",  # 3
            "exec('x = 1')",  # 4
            "p.loads(b'')",  # 5
            "Unpickler(f)",  # 6
            "cloudpickle.loads(b'')",  # 7
            "marshal.loads(b'')",  # 8
            "torch.load(f)",  # 9
            "torch.load(f, weights_only=False)",  # 10
            "yaml.load(s)",  # 11
            "yaml.load(s, Loader=yaml.FullLoader)",  # 12
            "class Mine(p.Unpickler): pass",  # 13
            "model.eval()",
            "torch.load(f, weights_only=True, map_location='cpu')",
            "yaml.load(s, Loader=yaml.SafeLoader)",
            "yaml.safe_load(s)",
            "json.loads(s)",
            "pickle.dumps(x)",
        ]
    )
    assert [line for _, line, _, _ in unsafe_calls(source, "x.py")] == list(range(3, 14))


def test_no_source_of_runjob_or_its_plugins_runs_code_a_file_holds():
    sources = [path for root in SOURCE_ROOTS for path in sorted(root.rglob("*.py"))]
    assert len(sources) > 50 and any(path.name == "prediction.py" for path in sources)
    found = [
        f"{file}:{line} in {function or '<module>'}: {what}"
        for path in sources
        for file, line, function, what in unsafe_calls(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    ]
    assert not found, "calls that may run code a file holds:\n" + "\n".join(found)


# ---------------------------------------------------------------------------------------------
# A planted pickle


class Planted:
    """Unpickled, it opens ``marker`` for writing: the file appears."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def test_a_planted_pickle_is_never_unpickled(trained, expected, tmp_path):
    """The run's predictor/ replaced by a prediction.pkl that writes a file when unpickled: predict
    and a plugin's export refuse it in one line offering --from-data; evaluate, export pt2 and
    predict --from-data do not need the predictor; nothing is unpickled."""
    tester, out = trained
    marker = tmp_path / "unpickled"
    planted = copy_run(out, tmp_path / "planted")
    shutil.rmtree(planted / "predictor")
    (planted / "prediction.pkl").write_bytes(pickle.dumps(Planted(marker)))
    with watching(planted) as watched:
        predict = tester.cli("predict", planted, "--input", "new.csv")
        columns = tester.cli("export", planted, "--format", "columns", "--output", tmp_path / "columns.json")
        pt2 = tester.cli("export", planted, "--format", "pt2", "--output", tmp_path / "model.pt2")
        evaluate = tester.cli("evaluate", planted, "--no-record")
        from_data = tester.cli("predict", planted, "--input", "new.csv", "--from-data")
    assert not marker.exists()
    for refused in (predict, columns):
        one_line(refused, str(planted / "prediction.pkl"), "never reads it", "--from-data")
    assert not (tmp_path / "columns.json").exists()
    assert pt2.returncode == 0, pt2.stderr
    assert evaluate.returncode == 0 and "val/r2" in evaluate.stdout, evaluate.stderr
    assert [row["value"] for row in predicted(from_data)] == pytest.approx([row["value"] for row in expected], abs=1e-6)
    kinds = assert_read_as_data(watched, "job.toml")
    assert not any(path.endswith("prediction.pkl") for path in kinds)
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(Planted(control)))  # noqa: S301 - the plant works: unpickled, it writes its file
    assert control.exists()


def test_the_mlflow_model_never_unpickles_a_planted_pickle(trained, expected, tmp_path):
    """A copy of the run's MLflow model with a planted pickle as data/run/prediction.pkl and as
    python_model.pkl beside MLmodel: it loads and predicts from its predictor/ as data; without
    predictor/ it refuses the pickle in one line; the marker is never written."""
    import mlflow.pyfunc
    import pandas as pd

    from runjob.errors import RunjobError

    _, out = trained
    marker = tmp_path / "unpickled"
    model = tmp_path / "model"
    shutil.copytree(out / "mlflow_model", model)
    plant = pickle.dumps(Planted(marker))
    (model / "python_model.pkl").write_bytes(plant)
    (model / "data" / "run" / "prediction.pkl").write_bytes(plant)
    frame = pd.DataFrame([{"a": a, "b": b, "c": c} for a, b, c in ROWS])
    with watching(model) as watched:
        got = mlflow.pyfunc.load_model(str(model)).predict(frame)
    assert got["value"].tolist() == pytest.approx([row["value"] for row in expected], abs=1e-5)
    assert_read_as_data(watched, "data/run/predictor/predictor.json")
    shutil.rmtree(model / "data" / "run" / "predictor")
    with watching(model) as watched, pytest.raises(RunjobError, match=r"prediction\.pkl.*never reads it") as refused:
        mlflow.pyfunc.load_model(str(model))
    assert "\n" not in str(refused.value)
    assert_read_as_data(watched)
    assert not marker.exists()


def test_a_genuine_pickled_predictor_is_refused_too(trained, tmp_path):
    """A run whose prediction.pkl is a genuine pickled Predictor (the run's own, as runjob's
    development versions wrote it) is refused like a planted one: no flag makes runjob unpickle
    what a run holds (``--trust-pickle`` is no option); nothing is unpickled."""
    from runjob.host.plugin_host import load_plugins
    from runjob.record.prediction import Predictor
    from runjob.train.trained import find_run, saved

    tester, out = trained
    _, predictor = saved(find_run(str(out), None, tmp_path), load_plugins())
    assert isinstance(predictor, Predictor)
    older = copy_run(out, tmp_path / "older")
    shutil.rmtree(older / "predictor")
    (older / "prediction.pkl").write_bytes(pickle.dumps(predictor))
    with watching(older) as watched:
        refused = tester.cli("predict", older, "--input", "new.csv")
        flag = tester.cli("predict", older, "--input", "new.csv", "--trust-pickle")
    one_line(refused, str(older / "prediction.pkl"), "never reads it", "--from-data")
    one_line(flag, "--trust-pickle")
    assert watched.find_class == [] and str(older / "prediction.pkl") not in watched.read


# ---------------------------------------------------------------------------------------------
# Tampered data: one line, exit code 2


def _set(key_path: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def change(saved: dict[str, Any]) -> dict[str, Any]:
        *parents, last = key_path.split(".")
        place = saved
        for part in parents:
            place = place[part]
        place[last] = value
        return saved

    return change


TAMPERED = {
    "unknown-inputs-name": (
        "predictor/predictor.json",
        _set("inputs.name", "no_such_inputs"),
        ["inputs.name", '"no_such_inputs"'],
    ),
    "plugin-without-the-name": (
        "predictor/predictor.json",
        _set("inputs.plugin", "tasks"),
        ["inputs.name", "plugin tasks"],
    ),
    "unknown-plugin-and-name": (
        "predictor/predictor.json",
        lambda saved: _set("inputs.plugin", "no_such_plugin")(_set("inputs.name", "rows_v9")(saved)),
        ["inputs.name", '"rows_v9"', "no_such_plugin"],
    ),
    "inputs-data-wrong-type": (
        "predictor/predictor.json",
        _set("inputs.data.mean", "high"),
        ["inputs.data", "mean", "CSVInputs"],
    ),
    "inputs-data-unknown-key": (
        "predictor/predictor.json",
        _set("inputs.data.code", "import os"),
        ["inputs.data", "'code'"],
    ),
    "inputs-data-not-a-dict": ("predictor/predictor.json", _set("inputs.data", ["a"]), ["inputs.data"]),
    "classes-not-a-list": ("predictor/predictor.json", _set("classes", "cat"), ["classes", '"cat"']),
    "format-2": ("predictor/predictor.json", _set("format", 2), ["format = 2"]),
    "task-not-a-dict": ("predictor/predictor.json", _set("task", "x"), ["task"]),
    "not-json": ("predictor/predictor.json", lambda saved: b"\x80\x04K\x01.", ["not a runjob predictor"]),
    "a-json-list": ("predictor/predictor.json", lambda saved: [saved], ["(the file)"]),
    "facts-wrong-type": ("data_facts.json", _set("input_shape", "three"), ["input_shape"]),
}


def _tamper(folder: Path, file: str, change: Callable[[Any], Any]) -> Path:
    path = folder / file
    changed = change(json.loads(path.read_text()))
    path.write_bytes(changed if isinstance(changed, bytes) else json.dumps(changed).encode())
    return path


@pytest.mark.parametrize("case", list(TAMPERED), ids=list(TAMPERED))
def test_a_tampered_predictor_is_one_line_not_a_traceback(trained, tmp_path, case):
    tester, out = trained
    file, change, fragments = TAMPERED[case]
    folder = copy_run(out, tmp_path / "tampered")
    path = _tamper(folder, file, change)
    with watching(folder) as watched:
        result = tester.cli("predict", folder, "--input", "new.csv")
    one_line(result, f"runjob: {path}: ", *fragments)
    assert not watched.find_class


def test_a_tampered_predictor_in_a_process_of_its_own(trained, tmp_path):
    """The real exit code and stderr of ``python -m runjob predict``: a component name no plugin
    provides."""
    tester, out = trained
    folder = copy_run(out, tmp_path / "tampered")
    path = _tamper(folder, "predictor/predictor.json", _set("inputs.name", "no_such_inputs"))
    result = tester.cli_subprocess(
        "predict",
        folder,
        "--input",
        tester.path / "new.csv",
        env={"MLFLOW_TRACKING_URI": tester.tracking_uri},
        timeout=300,
    )
    line = one_line(result, f'runjob: {path}: inputs.name = "no_such_inputs"', "install the plugin that made the run")
    assert result.stdout == "", (result.stdout, line)
