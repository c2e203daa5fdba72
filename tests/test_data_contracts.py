"""What a dataset gives the rest of a run (issue 23), through a plugin that is not runjob's: its
facts reach the model factory and are saved with the run; its collate function batches every
split; its artifacts (a vocabulary) are kept in the run's folder, logged and bundled into the
MLflow model; ``runjob predict`` reads the run's saved predictor, so the corpus may be gone; a
plugin's export format; the versions of the libraries a component wraps; FLOPs a model states."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(300)

PLUGIN = '''
import json
from pathlib import Path

import runjob


class SumsOptions(runjob.Options):
    corpus: str


class Sequences:
    """Rows of the corpus: space-separated words of a 6-word vocabulary, labelled by whether
    "up" is among them; of varying lengths, so a batch must be padded."""

    def __init__(self, rows, vocabulary):
        self.rows, self.vocabulary = rows, vocabulary

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        import torch

        words = self.rows[index].split()
        return torch.tensor([self.vocabulary[w] for w in words]), int("up" in words)


def pad(items):
    """Dynamic padding: a batch is as long as its longest row; 0 pads."""
    import torch

    inputs = [x for x, *_ in items] if isinstance(items[0], tuple) else list(items)
    length = max(len(x) for x in inputs)
    padded = torch.zeros(len(inputs), length, dtype=torch.long)
    for row, x in enumerate(inputs):
        padded[row, : len(x)] = x
    if isinstance(items[0], tuple):
        return padded, torch.tensor([y for _, y in items])
    return padded


class Words(runjob.Inputs):
    columns = {"text": "string"}

    def __init__(self, vocabulary):
        self.vocabulary = vocabulary

    def read(self, path):
        lines = Path(path).read_text().splitlines()
        return [(f"line {i + 1}", {"text": line}) for i, line in enumerate(lines) if line.strip()]

    def encode(self, record):
        import torch

        unknown = [w for w in record["text"].split() if w not in self.vocabulary]
        if unknown:
            raise ValueError(f"words not in the vocabulary: {unknown}")
        return torch.tensor([self.vocabulary[w] for w in record["text"].split()])

    def collate(self, samples):  # prediction from the finished run pads as training did
        return pad(samples)


def build_data(options):
    corpus = Path(options.corpus)
    if not corpus.is_file():
        raise runjob.DataError(f"{corpus}: no such corpus")
    rows = corpus.read_text().splitlines()
    vocabulary = {w: i + 1 for i, w in enumerate(sorted({w for row in rows for w in row.split()}))}
    saved = corpus.with_name("vocabulary.json")
    saved.write_text(json.dumps(vocabulary))
    return runjob.DatasetSplits(
        Sequences(rows[:48], vocabulary),
        Sequences(rows[48:], vocabulary),
        num_classes=2,
        classes=["flat", "up"],
        inputs=Words(vocabulary),
        collate=pad,
        artifacts={"vocabulary.json": saved},
        vocab_size=len(vocabulary) + 1,
        pad_id=0,
    )


SEEN = []


class BagOptions(runjob.Options):
    width: int = 8


def build_bag(options, data: runjob.DataFacts):
    import torch

    SEEN.append(data)

    class Bag(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.EmbeddingBag(data.vocab_size, options.width, padding_idx=data.pad_id)
            self.out = torch.nn.Linear(options.width, data.num_classes)

        def forward(self, x):
            return self.out(self.embed(x))

        def training_flops(self, batch):
            return 6.0 * sum(p.numel() for p in self.parameters()) * batch[0].shape[0]

    return Bag()


def export_vocabulary(request: runjob.ExportRequest) -> str:
    if request.inputs is None:
        raise ValueError("the run has no inputs to export")
    request.output.mkdir()
    (request.output / "vocabulary.json").write_text(json.dumps(request.inputs.vocabulary))
    (request.output / "kept.json").write_text(request.artifacts["vocabulary.json"].read_text())
    return f"{len(request.inputs.vocabulary)} words"


def export_nothing(request):
    raise ValueError("this model has no such form")


@runjob.hookimpl
def runjob_register_datasets(register):
    register("sums", build_data, options=SumsOptions, libraries=("numpy",))


@runjob.hookimpl
def runjob_register_inputs(register):
    register("words", Words, description="lines of words of the corpus's vocabulary")


@runjob.hookimpl
def runjob_register_models(register):
    register("bag", build_bag, options=BagOptions)


@runjob.hookimpl
def runjob_register_exporters(register):
    register("vocabulary", export_vocabulary, description="the words the model knows")
    register("refused", export_nothing)
'''

JOB = """
    [job]
    name = "sums"
    [model]
    name = "bag"
    [dataset]
    name = "sums"
    corpus = "corpus/rows.txt"
    [optimizer]
    lr = 0.05
    [train]
    batch_size = 8
    max_steps = 12
    eval_every = 12
    log_every = 6
"""


@pytest.fixture
def trained(runjob_tester):
    import random

    words = ["a", "b", "c", "d", "up"]
    draw = random.Random(0)
    rows = [" ".join(draw.choice(words) for _ in range(draw.randint(1, 7))) for _ in range(64)]
    (runjob_tester.path / "corpus").mkdir()
    (runjob_tester.path / "corpus" / "rows.txt").write_text("\n".join(rows) + "\n")
    runjob_tester.install_plugin("sums-plugin", {"sums_plugin": PLUGIN})
    runjob_tester.write_job("job.toml", JOB)
    run = runjob_tester.run("job.toml", output_dir="run")
    assert run.status == "FINISHED"
    return runjob_tester, run


def test_the_data_reaches_the_model_and_stays_with_the_run(trained):
    from importlib.metadata import version

    import sums_plugin

    tester, run = trained
    [facts] = sums_plugin.SEEN  # the factory ran once, with the dataset's facts
    assert (facts.vocab_size, facts.pad_id, facts.num_classes, facts.classes) == (6, 0, 2, ["flat", "up"])
    saved = json.loads((run.output_dir / "data_facts.json").read_text())
    assert saved == {"num_classes": 2, "classes": ["flat", "up"], "vocab_size": 6, "pad_id": 0}
    kept = run.output_dir / "data" / "vocabulary.json"
    assert json.loads(kept.read_text()) == json.loads((tester.path / "corpus" / "vocabulary.json").read_text())
    assert {"data/vocabulary.json", "data_facts.json"} <= run.mlflow.artifacts() | run.mlflow.artifacts("data")
    assert (run.output_dir / "mlflow_model" / "data" / "run" / "data" / "vocabulary.json").is_file()
    # the fitted vocabulary is kept as data, under the name the plugin registered Words by
    predictor = json.loads((run.output_dir / "predictor" / "predictor.json").read_text())
    assert predictor["inputs"] == {
        "name": "words",
        "plugin": "sums_plugin",
        "data": {"vocabulary": json.loads(kept.read_text())},
    }
    assert (run.output_dir / "mlflow_model" / "data" / "run" / "predictor" / "predictor.json").is_file()
    assert run.tags["runjob.library.numpy"] == version("numpy")
    # the model states its FLOPs: 6 x parameters x samples per batch
    parameters = 6 * 8 + 8 * 2 + 2
    assert run.tags["runjob.flops_counted"] == "stated"
    assert float(run.tags["runjob.flops_per_sample"]) == pytest.approx(6.0 * parameters)


def test_predict_reads_the_runs_predictor_not_the_corpus(trained):
    tester, run = trained
    (tester.path / "corpus" / "rows.txt").unlink()  # the dataset cannot be built any more
    rows = tester.path / "new.txt"
    rows.write_text("a b up\nc\nd d d d d d d d d d d\n")
    result = tester.cli("predict", run.output_dir, "--input", rows)
    assert result.returncode == 0, result.stderr
    predicted = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["input"] for row in predicted] == ["line 1", "line 2", "line 3"]
    assert {row["class"] for row in predicted} <= {"flat", "up"}
    # the MLflow model speaks the same raw text, with the same padding
    import mlflow.pyfunc
    import pandas as pd

    model = mlflow.pyfunc.load_model(str(run.output_dir / "mlflow_model"))
    frame = model.predict(pd.DataFrame({"text": ["a b up", "c", "d d d d d d d d d d d"]}))
    assert frame["class"].tolist() == [row["class"] for row in predicted]
    unknown = tester.cli("predict", run.output_dir, "--prompt", "x")
    assert unknown.returncode == 2 and "language model" in unknown.stderr


def test_a_plugin_export_format(trained):
    tester, run = trained
    result = tester.cli("export", run.output_dir, "--format", "vocabulary", "--output", "out")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "5 words"
    assert json.loads((tester.path / "out" / "vocabulary.json").read_text())["up"] == 5
    assert (tester.path / "out" / "kept.json").is_file()
    again = tester.cli("export", run.output_dir, "--format", "vocabulary", "--output", "out")
    assert again.returncode == 2 and "already exists" in again.stderr
    refused = tester.cli("export", run.output_dir, "--format", "refused", "--output", "nothing")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr_lines == [
        "runjob: export --format refused (plugin sums_plugin): ValueError: this model has no such form"
    ]
    assert not (tester.path / "nothing").exists()
    unknown = tester.cli("export", run.output_dir, "--format", "tflite")
    assert unknown.returncode == 2
    assert "--format tflite: not an export format; the formats: onnx, pt2" in unknown.stderr
    assert "refused, vocabulary" in unknown.stderr


def test_flops_are_counted_on_a_real_forward_where_the_meta_device_cannot_run_the_model():
    import torch

    from runjob.train.flops import model_flops_per_unit
    from runjob_builtins.tasks import Classification, ClassificationOptions

    class ReadsValues(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x):
            if x.abs().max().item() > 1e6:  # a value read: impossible on the meta device
                x = x.clamp(-1e6, 1e6)
            return self.linear(x)

    model = ReadsValues().train()
    task = Classification(ClassificationOptions(), 3)
    batch = (torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1]))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    per_sample, how = model_flops_per_unit(model, task, batch)
    assert how == "forward x3"
    assert per_sample == 3 * 2 * 4 * 3, "one 4x3 matrix product per sample, x3 for the backward"
    assert model.training and all(v.equal(state[k]) for k, v in model.state_dict().items())


def test_reading_the_datas_facts_moves_no_random_generator():
    """The facts of a dataset whose items draw random numbers (a random crop) are read without
    moving torch's or Python's generator: the model's initialisation and the batches stay the same."""
    import random

    import torch

    from runjob.host.components import DatasetSplits
    from runjob.train.runner import _facts_of

    class Cropped:
        def __len__(self):
            return 4

        def __getitem__(self, index):
            random.random()
            return torch.rand(3, 8, 8), 0

    torch.manual_seed(0)
    random.seed(0)
    facts = _facts_of(DatasetSplits(Cropped(), Cropped(), num_classes=2))
    assert (facts.input_shape, facts.channels, facts.image_size) == ((3, 8, 8), 3, 8)
    after = torch.rand(1).item(), random.random()
    torch.manual_seed(0)
    random.seed(0)
    assert (torch.rand(1).item(), random.random()) == after
