"""Using a trained model: ``runjob evaluate``, ``predict`` and ``export`` on a finished digits run
(trained once for the module), and the dataset and task pieces they rest on."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from helpers import SMALL_DIGITS

from runjob.errors import RunjobError
from runjob.testing import RunjobTester


@pytest.fixture(scope="module")
def trained(tmp_path_factory, empty_mlflow_db):
    """A finished 2-epoch tiny_cnn digits run (its RecordedRun) in a test world shared by the
    module: training it once keeps these tests quick."""
    tester = RunjobTester(tmp_path_factory.mktemp("use-model"), empty_mlflow_db)
    tester._setup()
    try:
        tester.install_tiny_models()
        tester.write_job("job.toml", SMALL_DIGITS.format(name="use-model"))
        run = tester.run("job.toml", "train.epochs=2", output_dir="runs/digits")
        assert run.status == "FINISHED"
        yield tester, run
    finally:
        tester._teardown()


def _table(stdout: str) -> dict[str, float]:
    rows = [line.split() for line in stdout.splitlines()[1:] if line.strip()]
    return {name: float(value) for name, value in rows}


def _model_and_data(run):
    """The run's model with its weights, its dataset splits and task, built as the commands build them."""
    from runjob.host.plugin_host import load_plugins
    from runjob.train.trained import build_model, find_run, load_data, load_job

    found = find_run(str(run.output_dir), None, run.output_dir / "unused")
    job = load_job(found, [], load_plugins())
    splits, task = load_data(job)
    return build_model(job, found.model_file), splits, task


def _write_val_pngs(folder: Path, count: int) -> list[int]:
    """The first ``count`` validation scans at 16x16 as PNG files, as ``digits export`` writes them; their indices."""
    import torch
    from PIL import Image

    from runjob_builtins.digits import digits_tensors, split_indices

    images, labels = digits_tensors(16)
    _, val_idx = split_indices(len(labels), 0.2, 0)
    folder.mkdir(parents=True, exist_ok=True)
    chosen = val_idx[:count].tolist()
    for order, index in enumerate(chosen):
        pixels = (images[index, 0] * 255).round().to(torch.uint8).numpy()
        Image.fromarray(pixels, mode="L").save(folder / f"{order:03d}.png")
    return chosen


def test_evaluate_repeats_the_runs_own_metrics_and_records_them(trained):
    tester, run = trained
    result = tester.cli("evaluate", run.output_dir)
    assert result.returncode == 0, result.stderr
    metrics = _table(result.stdout)
    last = {key: run.local_history(key)[-1][1] for key in ("val/accuracy", "val/loss")}
    assert metrics["val/accuracy"] == pytest.approx(last["val/accuracy"], abs=1e-6)
    assert metrics["val/loss"] == pytest.approx(last["val/loss"], rel=1e-5)

    evaluations = [r for r in tester.runs("use-model") if r.tags.get("runjob.evaluated_from")]
    assert len(evaluations) == 1
    recorded = evaluations[0]
    assert recorded.tags["runjob.evaluated_from"] == run.run_id
    assert recorded.tags["runjob.evaluated_from.output_dir"] == str(run.output_dir.resolve())
    assert recorded.status == "FINISHED"
    assert recorded.metrics["val/accuracy"] == pytest.approx(last["val/accuracy"], abs=1e-6)
    assert recorded.params["model.name"] == "tiny_cnn"


def test_evaluate_finds_the_run_by_id_and_downloads_it_when_the_folder_is_gone(trained):
    tester, run = trained
    moved = run.output_dir.with_name("moved")
    run.output_dir.rename(moved)
    try:
        result = tester.cli("evaluate", f"runs:/{run.run_id}", "--no-record")
    finally:
        moved.rename(run.output_dir)
    assert result.returncode == 0, result.stderr
    assert _table(result.stdout)["val/accuracy"] == pytest.approx(run.local_history("val/accuracy")[-1][1], abs=1e-6)


def test_mistakes_are_one_line_errors(trained, tmp_path):
    tester, run = trained
    no_test = tester.cli("evaluate", run.output_dir, "--split", "test")
    assert no_test.returncode == 2 and len(no_test.stderr_lines) == 1
    assert "has no test split" in no_test.stderr and "--split val" in no_test.stderr

    model_key = tester.cli("evaluate", run.output_dir, "--set", "model.channels=4")
    assert model_key.returncode == 2 and "only the dataset can be changed" in model_key.stderr

    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copy(run.output_dir / "job.toml", unfinished / "job.toml")
    for command in (("evaluate",), ("predict", "--input", tmp_path), ("export", "--format", "pt2")):
        result = tester.cli(command[0], unfinished, *command[1:])
        assert result.returncode == 2, result.stderr
        assert len(result.stderr_lines) == 1 and "has no model" in result.stderr, result.stderr

    unknown = tester.cli("evaluate", tmp_path / "nowhere")
    assert unknown.returncode == 2 and "no such folder, and not an MLflow run id" in unknown.stderr


def test_predict_gives_the_models_classes_and_probabilities(trained):
    import torch

    tester, run = trained
    chosen = _write_val_pngs(tester.path / "scans", 20)
    result = tester.cli("predict", run.output_dir, "--input", "scans", "--output", "out/predictions.csv")
    assert result.returncode == 0, result.stderr
    with open(tester.path / "out" / "predictions.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["input"] for row in rows] == [f"{i:03d}.png" for i in range(20)]

    model, splits, _ = _model_and_data(run)
    inputs = torch.stack([image for _, image in splits.read_inputs(tester.path / "scans")])
    probabilities = model(inputs).softmax(dim=-1)
    assert [int(row["class"]) for row in rows] == probabilities.argmax(dim=-1).tolist()
    assert [float(row["probability"]) for row in rows] == pytest.approx(probabilities.max(dim=-1).values.tolist())

    # the PNGs hold the validation images to 1/255: the model sees nearly what evaluation saw
    val = splits.val
    in_memory = model((val.images[: len(chosen)] - 0.5) / 0.5).argmax(dim=-1)
    agree = sum(int(row["class"]) == int(c) for row, c in zip(rows, in_memory, strict=True))
    assert agree >= 18

    lines = tester.cli("predict", run.output_dir, "--input", "scans/003.png")
    assert lines.returncode == 0, lines.stderr
    assert [json.loads(line) for line in lines.stdout.splitlines()] == [
        {"input": "003.png", "class": rows[3]["class"], "probability": pytest.approx(float(rows[3]["probability"]))}
    ]


def test_predict_from_a_folder_without_images_writes_nothing(trained):
    tester, run = trained
    (tester.path / "notes").mkdir()
    (tester.path / "notes" / "readme.txt").write_text("no images here")
    result = tester.cli("predict", run.output_dir, "--input", "notes", "--output", "none.jsonl")
    assert result.returncode == 2
    assert len(result.stderr_lines) == 1 and "no image files" in result.stderr
    assert not (tester.path / "none.jsonl").exists()
    assert not [p for p in tester.path.iterdir() if "partial" in p.name]


def test_export_onnx_agrees_with_onnxruntime(trained):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")  # the exporter's; both come with the onnx extra
    tester, run = trained
    result = tester.cli("export", run.output_dir, "--format", "onnx", "--output", "exported/model.onnx")
    assert result.returncode == 0, result.stderr
    difference = float(result.stdout.split("max abs difference ")[1].split()[0])
    assert difference < 1e-4

    # any batch size, checked here on samples the command did not use
    model, splits, _ = _model_and_data(run)
    inputs = (splits.val.images[20:23] - 0.5) / 0.5
    session = onnxruntime.InferenceSession(str(tester.path / "exported" / "model.onnx"))
    got = session.run(None, {session.get_inputs()[0].name: inputs.numpy()})[0]
    assert abs(got - model(inputs).detach().numpy()).max() < 1e-4


def test_export_pt2_loads_back(trained):
    import torch

    tester, run = trained
    result = tester.cli("export", run.run_id, "--format", "pt2")
    assert result.returncode == 0, result.stderr
    exported = run.output_dir / "model.pt2"  # beside model.safetensors by default
    model, splits, _ = _model_and_data(run)
    inputs = (splits.val.images[:5] - 0.5) / 0.5
    got = torch.export.load(str(exported)).module()(inputs)
    assert (got - model(inputs)).abs().max() < 1e-5


def test_a_model_the_exporter_cannot_take_is_one_line_and_nothing_is_written(tmp_path):
    import torch

    from runjob.commands.export import export_pt2

    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x  # a branch on the values: torch.export cannot trace it

    inputs = torch.ones(4, 3)
    with pytest.raises(RunjobError) as error:
        export_pt2(DataDependent(), inputs, inputs * 2, tmp_path / "model.pt2", "branchy")
    message = str(error.value)
    assert "model 'branchy' cannot be exported with torch.export" in message and "\n" not in message
    assert not list(tmp_path.iterdir())


def test_csv_inputs_are_standardized_as_the_training_rows(tmp_path):
    import torch

    from runjob_builtins.tabular import CSVOptions, build_csv, split_rows

    rows = [[i, (i * 7) % 5, i * 0.5 + 1] for i in range(30)]
    data = tmp_path / "table.csv"
    data.write_text("a,b,y\n" + "".join(f"{a},{b},{y}\n" for a, b, y in rows))
    splits = build_csv(CSVOptions(path=str(data), target="y"))
    _, val_idx, _ = split_rows(len(rows), 0.2, 0.0, 0, str(data))  # the job's split: the defaults
    val_rows = [rows[i] for i in val_idx.tolist()]
    new = tmp_path / "new.csv"  # the feature columns in another order, no target
    new.write_text("b,a\n" + "".join(f"{b},{a}\n" for a, b, _ in val_rows))
    items = splits.read_inputs(new)
    assert [name for name, _ in items] == [f"line {n}" for n in range(2, 2 + len(val_rows))]
    expected = torch.stack([splits.val[k][0] for k in range(len(splits.val))])
    assert torch.allclose(torch.stack([x for _, x in items]), expected, atol=1e-6)

    (tmp_path / "short.csv").write_text("a\n1\n")
    with pytest.raises(RunjobError, match="no column 'b'"):
        splits.read_inputs(tmp_path / "short.csv")


def test_language_model_continues_a_prompt(tmp_path):
    import torch

    import runjob
    from runjob_builtins.tasks import LanguageModeling, LanguageModelingOptions
    from runjob_builtins.text import TextFilesOptions, build_text_files

    class NextByte(torch.nn.Module):
        """Logits that make byte b + 1 follow byte b."""

        def forward(self, tokens):
            return torch.nn.functional.one_hot((tokens + 1) % 256, 256).float() * 10

    (tmp_path / "a.txt").write_text("abcdefgh" * 40)
    (tmp_path / "b.txt").write_text("hgfedcba" * 40)
    splits = build_text_files(TextFilesOptions(paths=str(tmp_path / "*.txt"), context=8, val_fraction=0.5))
    task = LanguageModeling(LanguageModelingOptions(), 256)
    assert isinstance(task, runjob.Generating)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("abc")
    [(name, tokens)] = splits.read_inputs(prompt)
    new = task.generate(NextByte(), tokens[None], 4, 8, 0.0, torch.Generator())
    assert name == "prompt.txt" and splits.decode(new[0].tolist()) == "defg"
    sampled = task.generate(NextByte(), tokens[None], 3, 8, 1.0, torch.Generator().manual_seed(0))
    assert sampled.shape == (1, 3)


def test_prediction_columns_of_the_built_in_tasks():
    import torch

    from runjob.record.prediction import columns_of
    from runjob_builtins.tasks import Classification, ClassificationOptions, Regression, RegressionOptions

    logits = torch.tensor([[0.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    classes = columns_of(Classification(ClassificationOptions(), 3).predict(logits), ["cat", "dog", "emu"])
    assert classes["class"] == ["dog", "cat"]
    assert classes["probability"] == pytest.approx(logits.softmax(dim=-1).max(dim=-1).values.tolist())

    regression = Regression(RegressionOptions())
    assert columns_of(regression.predict(torch.tensor([[1.5], [2.5]])), None) == {"value": [1.5, 2.5]}
    assert columns_of(regression.predict(torch.tensor([[1.0, 2.0]])), None) == {"value_0": [1.0], "value_1": [2.0]}
