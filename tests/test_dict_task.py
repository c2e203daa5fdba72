"""A third-party task whose batches are dicts and whose model takes keyword arguments: it trains,
and ``runjob evaluate``, ``predict`` and ``export`` go through the task (``inputs``,
``call_model``) as training does, so the model is never called with a batch it cannot take."""

from __future__ import annotations

import json

import pytest

from runjob.testing import RunjobTester

pytestmark = pytest.mark.timeout(300)

DICT_PLUGIN = '''
"""Rows y = 2 a - b + 3 c + 0.5 as dicts {"x": (2,), "z": (1,), "y": ()}; a linear model called
as model(x=..., z=...); a task that reads those dicts; raw inputs from a CSV of a, b, c."""
import csv

import runjob


def sample(a, b, c):
    import torch

    return {"x": torch.tensor([a, b]), "z": torch.tensor([c])}


class Rows:
    def __init__(self, count, seed):
        self.count, self.seed = count, seed

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        import torch

        k = index * 7 + self.seed
        a, b, c = (k % 11) / 5 - 1, (k % 13) / 6 - 1, (k % 5) / 2 - 1
        return {**sample(a, b, c), "y": torch.tensor(2 * a - b + 3 * c + 0.5)}


class RowInputs(runjob.Inputs):
    columns = {"a": "double", "b": "double", "c": "double"}

    def read(self, path):
        with open(path, newline="") as file:
            rows = list(csv.DictReader(file))
        return [(f"line {n}", {k: float(row[k]) for k in self.columns}) for n, row in enumerate(rows, 2)]

    def encode(self, record):  # one sample of the model's inputs: what DictTask.inputs gives, unbatched
        return sample(record["a"], record["b"], record["c"])


def build_model(options):
    import torch  # here, not at the top: runjob validate loads plugins without torch

    class KeywordLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 1)

        def forward(self, x, z):
            return self.fc(torch.cat([x, z], dim=1)).squeeze(1)

    return KeywordLinear()


class DictOptions(runjob.TaskOptions):
    def metrics(self):
        return {"mae": "min"}


class DictTask(runjob.Task):
    def inputs(self, batch):
        return {"x": batch["x"], "z": batch["z"]}

    def targets(self, batch):
        return batch["y"]

    def call_model(self, model, inputs):
        return model(**inputs)

    def loss(self, outputs, batch):
        return (outputs - self.targets(batch)).square().mean()

    def evaluate(self, outputs, batch):
        return {"error": (outputs - self.targets(batch)).abs()}

    def summarize(self, totals, count):
        return {"mae": totals["error"] / count}

    def predict(self, outputs):
        return {"value": outputs}


@runjob.hookimpl
def runjob_register_datasets(register):
    register("dict_rows", lambda options: runjob.DatasetSplits(Rows(256, 0), Rows(40, 3), inputs=RowInputs()))


@runjob.hookimpl
def runjob_register_inputs(register):
    register("dict_rows", RowInputs, description="rows of a, b, c from a CSV file")


@runjob.hookimpl
def runjob_register_models(register):
    register("keyword_linear", build_model)


@runjob.hookimpl
def runjob_register_tasks(register):
    register("dict_regression", lambda options, data: DictTask(), options=DictOptions)
'''

JOB = """
    [job]
    name = "dict-task"
    [model]
    name = "keyword_linear"
    [dataset]
    name = "dict_rows"
    [task]
    name = "dict_regression"
    [optimizer]
    lr = 0.05
    [train]
    batch_size = 32
    max_steps = 16
"""

ROWS = [(0.5, -1.0, 0.25), (-0.2, 0.4, 1.0), (1.0, 1.0, -1.0)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, empty_mlflow_db):
    """A finished run of the dict-batch task, trained once for the module."""
    tester = RunjobTester(tmp_path_factory.mktemp("dict-task"), empty_mlflow_db)
    tester._setup()
    try:
        tester.install_plugin("dict-task", {"dict_task": DICT_PLUGIN})
        tester.write_job("job.toml", JOB)
        run = tester.run("job.toml", output_dir="runs/dict")
        assert run.status == "FINISHED"
        yield tester, run
    finally:
        tester._teardown()


def _trained_model(run):
    from runjob.host.plugin_host import load_plugins
    from runjob.train.trained import build_model, find_run, load_job

    found = find_run(str(run.output_dir), None, run.output_dir / "unused")
    return build_model(load_job(found, [], load_plugins()), found.model_file)


def _expected(run, rows):
    import torch

    x = torch.tensor([[a, b] for a, b, _ in rows])
    z = torch.tensor([[c] for _, _, c in rows])
    with torch.no_grad():
        return _trained_model(run)(x=x, z=z), {"x": x, "z": z}


def test_a_dict_task_trains_and_its_mlflow_model_knows_its_columns(trained):
    _, run = trained
    assert run.local_history("val/mae"), "evaluation ran through the task"
    saved = json.loads((run.output_dir / "predictor" / "predictor.json").read_text())
    assert saved["outputs"] == {"value": "double"}, "prediction ran on dict inputs at the end of training"
    assert saved["inputs"] == {"name": "dict_rows", "plugin": "dict_task", "data": {}}, "RowInputs keeps no state"


def test_evaluate_a_dict_task_repeats_the_runs_metric(trained):
    tester, run = trained
    result = tester.cli("evaluate", run.output_dir, "--no-record")
    assert result.returncode == 0, result.stderr
    [(name, value)] = [line.split() for line in result.stdout.splitlines()[1:] if line.strip()]
    assert name == "val/mae" and float(value) == pytest.approx(run.local_history("val/mae")[-1][1], rel=1e-5)


def test_predict_a_dict_task_from_raw_rows(trained):
    tester, run = trained
    (tester.path / "new.csv").write_text("c,b,a\n" + "".join(f"{c},{b},{a}\n" for a, b, c in ROWS))
    result = tester.cli("predict", run.output_dir, "--input", "new.csv")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    expected, _ = _expected(run, ROWS)
    assert [row["input"] for row in rows] == ["line 2", "line 3", "line 4"]
    assert [row["value"] for row in rows] == pytest.approx(expected.tolist(), abs=1e-5)


def test_export_pt2_of_a_dict_task_takes_the_tasks_inputs(trained):
    import torch

    tester, run = trained
    result = tester.cli("export", run.output_dir, "--format", "pt2", "--output", "dict.pt2")
    assert result.returncode == 0, result.stderr
    expected, inputs = _expected(run, ROWS)  # 3 rows: not the batch size the export was checked on
    got = torch.export.load(str(tester.path / "dict.pt2")).module()(inputs)
    assert (got - expected).abs().max() < 1e-5


def test_export_onnx_of_a_dict_task_names_its_inputs(trained):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    tester, run = trained
    result = tester.cli("export", run.output_dir, "--format", "onnx", "--output", "dict.onnx")
    assert result.returncode == 0, result.stderr
    expected, inputs = _expected(run, ROWS)
    session = onnxruntime.InferenceSession(str(tester.path / "dict.onnx"))
    assert [i.name for i in session.get_inputs()] == ["x", "z"]
    got = session.run(None, {name: tensor.numpy() for name, tensor in inputs.items()})[0]
    assert abs(got - expected.numpy()).max() < 1e-4


def test_a_task_that_generates_without_the_capability_still_continues_prompts_with_a_warning():
    import runjob
    from runjob.host.task import generates
    from runjob_builtins.tasks import Regression, RegressionOptions

    class OldLanguageModel(runjob.Task):  # written against the release where Task had generate()
        def loss(self, outputs, batch): ...

        def evaluate(self, outputs, batch): ...

        def summarize(self, totals, count): ...

        def generate(self, model, tokens, max_new_tokens, context, temperature, generator): ...

    old = OldLanguageModel()
    with pytest.warns(DeprecationWarning, match="runjob.Generating"):
        assert generates(old)
    with pytest.warns(DeprecationWarning, match="Task.generates is deprecated"):
        assert old.generates
    assert not generates(Regression(RegressionOptions()))


def test_the_mlflow_model_of_a_dict_task_predicts_raw_rows(trained):
    import mlflow.pyfunc
    import pandas as pd

    _, run = trained
    model = mlflow.pyfunc.load_model(str(run.output_dir / "mlflow_model"))
    got = model.predict(pd.DataFrame([{"a": a, "b": b, "c": c} for a, b, c in ROWS]))
    expected, _ = _expected(run, ROWS)
    assert got["value"].tolist() == pytest.approx(expected.tolist(), abs=1e-5)
