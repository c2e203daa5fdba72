"""The pieces the MLflow model predicts with: a dataset's ``runjob.Inputs`` (kept as data in the
run's predictor and rebuilt from it: the same preprocessing ``runjob predict`` applies), the run's
predictor, and the wheels of distributions no index has."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runjob import DatasetSplits, Inputs
from runjob.testing import round_trip_inputs


def test_image_inputs_travel_as_data_and_read_bytes_as_predict_reads_files(tmp_path):
    import torch
    from PIL import Image

    from runjob_builtins.digits import DigitsOptions, build_digits

    splits = build_digits(DigitsOptions(image_size=16))
    pixels = (torch.arange(64, dtype=torch.uint8).reshape(8, 8) * 4).numpy()
    Image.fromarray(pixels, mode="L").save(tmp_path / "scan.png")
    ((name, from_file),) = list(splits.read_inputs(tmp_path / "scan.png"))
    travelled = round_trip_inputs(splits.inputs, tmp_path / "kept")  # as the run's predictor keeps it
    from_bytes = travelled.encode({"image": (tmp_path / "scan.png").read_bytes()})
    assert name == "scan.png" and from_file.shape == (3, 16, 16)
    assert torch.equal(from_file, from_bytes)
    with pytest.raises(ValueError, match="cannot read the image"):
        travelled.encode({"image": b"not an image"})


def test_csv_inputs_standardize_raw_rows_with_the_training_rows_scale(tmp_path):
    import torch

    from runjob_builtins.tabular import CSVOptions, build_csv

    (tmp_path / "t.csv").write_text("a,b,y\n" + "".join(f"{i},{i % 3},{i * 2}\n" for i in range(20)))
    splits = build_csv(CSVOptions(path=str(tmp_path / "t.csv"), target="y"))
    inputs = round_trip_inputs(splits.inputs, tmp_path / "kept")  # the fitted scale, as the run keeps it
    assert inputs.columns == {"a": "double", "b": "double"}
    features, _ = splits.val[0]
    train = torch.stack([row for row, _ in splits.train])
    assert train.mean(0).abs().max() < 1e-5  # the training rows are standardized
    raw = dict(
        zip(
            ["b", "a"],
            (features.double() * torch.tensor(inputs.std) + torch.tensor(inputs.mean)).tolist()[::-1],
            strict=True,
        )
    )
    assert torch.allclose(inputs.encode(raw), features, atol=1e-6)
    with pytest.raises(ValueError, match="missing feature column"):
        inputs.encode({"a": 1.0})
    with pytest.raises(ValueError, match="'b': 'x' is not a number"):
        inputs.encode({"a": 1.0, "b": "x"})


def test_text_prompts_are_their_utf8_bytes_and_decode_back(tmp_path):
    from runjob_builtins.text import TextPrompts

    prompts = round_trip_inputs(TextPrompts(), tmp_path)
    tokens = prompts.encode({"prompt": "déf"})
    assert tokens.tolist() == list("déf".encode())
    assert prompts.decodes and prompts.decode(tokens.tolist()) == "déf"
    with pytest.raises(ValueError, match="non-empty text"):
        prompts.encode({"prompt": ""})


def test_inputs_set_read_inputs_and_decode_and_must_be_inputs():
    class Words(Inputs):
        columns = {"text": "string"}

        def read(self, path):
            return [("line 1", {"text": "a b"})]

        def encode(self, record):
            return len(record["text"].split())

        def decode(self, ids):
            return " ".join(map(str, ids))

    splits = DatasetSplits(train=[], val=[], inputs=Words())
    assert list(splits.read_inputs("anything")) == [("line 1", 2)]
    assert splits.decode([1, 2]) == "1 2"
    with pytest.raises(TypeError, match="runjob.Inputs"):
        DatasetSplits(train=[], val=[], inputs=object())


def test_a_dataset_without_inputs_is_said_not_hidden(tmp_path):
    """Its MLflow model takes the model's tensors; the end of the run says so, naming the dataset."""
    from runjob.train.predictor import save_predictor

    job = SimpleNamespace(dataset=SimpleNamespace(name="my_data"))
    splits = DatasetSplits(train=[], val=[], read_inputs=lambda path: [])
    prediction, said = save_predictor(job, None, None, splits, None, tmp_path, None, None)
    assert prediction is None
    assert "dataset 'my_data' gives no runjob.Inputs" in said and "input tensors as they are" in said
    assert not list(tmp_path.iterdir())


def test_the_predictor_is_kept_as_data_and_declares_the_signature(tmp_path):
    import json

    import torch

    from runjob.host.plugin_host import load_plugins
    from runjob.job.validation import Chosen
    from runjob.record.prediction import load_predictor
    from runjob.train.predictor import save_predictor
    from runjob.train.runner import _facts_of
    from runjob_builtins.tabular import CSVInputs, CSVOptions, build_csv
    from runjob_builtins.tasks import Regression, RegressionOptions

    (tmp_path / "t.csv").write_text("a,y\n" + "".join(f"{i},{i * 2}\n" for i in range(10)))
    splits = build_csv(CSVOptions(path=str(tmp_path / "t.csv"), target="y"))
    host = load_plugins()
    job = SimpleNamespace(
        task=Chosen(host.lookup("task", "regression"), RegressionOptions()), dataset=SimpleNamespace(name="csv")
    )
    accelerator = SimpleNamespace(distributed_type=SimpleNamespace(name="NO"), unwrap_model=lambda model, **how: model)
    model = torch.nn.Linear(1, 1)
    task = Regression(RegressionOptions())
    prediction, said = save_predictor(job, accelerator, model, splits, task, tmp_path, host, _facts_of(splits))
    assert said is None
    assert prediction == {"inputs": {"a": "double"}, "outputs": {"value": "double"}, "generates": False}
    saved = json.loads((tmp_path / "predictor" / "predictor.json").read_text())
    assert (saved["inputs"]["name"], saved["inputs"]["plugin"]) == ("csv_rows", "tabular")
    assert saved["inputs"]["data"]["mean"] == pytest.approx(splits.inputs.mean)
    assert saved["outputs"] == {"value": "double"} and not (tmp_path / "prediction.pkl").exists()
    predictor = load_predictor(tmp_path, host, job.task)
    assert isinstance(predictor.inputs, CSVInputs) and isinstance(predictor.task, Regression)
    rows = predictor.rows(model, [("0", predictor.inputs.encode({"a": 3.0}))])
    assert set(rows[0]) == {"input", "value"} and model.training
    with torch.no_grad():
        expected = model(splits.inputs.encode({"a": 3.0})[None])[0, 0]
    assert rows[0]["value"] == pytest.approx(float(expected), abs=1e-6), "the fitted scale came back with the data"


def test_a_source_digest_follows_the_code_not_the_data(tmp_path):
    from runjob.record.wheels import source_digest

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("x = 1\n")
    (tmp_path / "data").mkdir()
    before = source_digest(tmp_path)
    (tmp_path / "data" / "big.csv").write_text("1,2\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "notes.md").write_text("a run")
    assert source_digest(tmp_path) == before
    (tmp_path / "pkg" / "mod.py").write_text("x = 22\n")
    assert source_digest(tmp_path) != before


def test_a_distribution_from_an_index_needs_no_wheel():
    from runjob.record.wheels import local_source, wheel_for

    assert local_source("pluggy") is None and wheel_for("pluggy") is None
    assert local_source("no-such-distribution") is None


def test_predict_names_a_missing_input_before_loading_anything(runjob_tester):
    """Said at once: before the run is looked up (here it does not exist either) and torch is loaded."""
    result = runjob_tester.cli("predict", "no-such-run", "--input", "missing.csv")
    assert result.returncode == 2
    assert result.stderr.strip() == "runjob: --input missing.csv: no such file or folder"
