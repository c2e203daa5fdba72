"""A run's predictor is data (issue 31), as a plugin author meets the contract: a dataset's
``runjob.Inputs`` is kept by ``to_data`` and rebuilt by ``from_data`` (by default its ``__init__``'s
arguments, read back from its attributes and checked against their annotations), a task's state by
``Task.to_data``/``restore``; ``runjob.testing.round_trip_inputs`` checks a class in a plugin's own
tests; a registration of something that is not an Inputs class is the plugin's failure; and a run
whose Inputs class no plugin registers finishes, says in one line that it saved no predictor, and
``runjob predict`` builds the dataset instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import runjob
from runjob.testing import round_trip_inputs

pytestmark = pytest.mark.timeout(300)


class Scaled(runjob.Inputs):
    """Plain ``__init__`` arguments kept under their names: the default to_data/from_data suffice."""

    columns = {"a": "double", "b": "double"}

    def __init__(self, mean: list[float], std: float, name: str = "scaled", clip: tuple[float, float] = (-5.0, 5.0)):
        self.mean, self.std, self.name, self.clip = mean, std, name, clip

    def read(self, path):
        return []

    def encode(self, record):
        low, high = self.clip
        return [min(high, max(low, (record[k] - m) / self.std)) for k, m in zip(self.columns, self.mean, strict=True)]


class Tokenizer:
    def __init__(self, words):
        self.words = list(words)


class HoldsASet(runjob.Inputs):
    columns = {"text": "string"}

    def __init__(self, stopwords: set[str]):
        self.stopwords = stopwords

    def read(self, path):
        return []

    def encode(self, record):
        return [w for w in record["text"].split() if w not in self.stopwords]


class HoldsAnObject(runjob.Inputs):
    columns = {"text": "string"}

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def read(self, path):
        return []

    def encode(self, record):
        return [self.tokenizer.words.index(w) for w in record["text"].split()]


class Renamed(runjob.Inputs):
    """Keeps its argument under another name: the default to_data cannot read it back."""

    columns = {"text": "string"}

    def __init__(self, vocabulary: dict[str, int]):
        self.vocab = vocabulary

    def read(self, path):
        return []

    def encode(self, record):
        return [self.vocab[w] for w in record["text"].split()]


class Starred(runjob.Inputs):
    columns = {"text": "string"}

    def __init__(self, *words: str):
        self.words = words

    def read(self, path):
        return []

    def encode(self, record):
        return record


class Vocabulary(runjob.Inputs):
    """Its own to_data: the words go to a file in the folder, from_data reads them back."""

    columns = {"text": "string"}

    def __init__(self, words: list[str]):
        self.index = {word: i + 1 for i, word in enumerate(words)}

    def read(self, path):
        return []

    def encode(self, record):
        return [self.index.get(word, 0) for word in record["text"].split()]

    def to_data(self, folder: Path) -> dict:
        (folder / "vocabulary.txt").write_text("\n".join(self.index) + "\n", encoding="utf-8")
        return {"file": "vocabulary.txt", "size": len(self.index)}

    @classmethod
    def from_data(cls, data: dict, folder: Path) -> Vocabulary:
        words = (folder / data["file"]).read_text(encoding="utf-8").splitlines()
        if len(words) != data["size"]:
            raise ValueError(f"{data['file']} holds {len(words)} words, not {data['size']}")
        return cls(words)


class Forgetful(runjob.Inputs):
    """A from_data that drops what to_data kept: the rebuilt object is another one."""

    columns = {"x": "double"}

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def read(self, path):
        return []

    def encode(self, record):
        return record["x"] * self.scale

    @classmethod
    def from_data(cls, data, folder):
        return cls()


class NeedsAKey(Forgetful):
    @classmethod
    def from_data(cls, data, folder):
        return cls(data["factor"])


def test_plain_init_arguments_round_trip_by_default(tmp_path):
    scaled = Scaled(mean=[1.0, -2.0], std=0.5, clip=(-1.0, 1.0))
    assert scaled.to_data(tmp_path) == {"mean": [1.0, -2.0], "std": 0.5, "name": "scaled", "clip": (-1.0, 1.0)}
    rebuilt = round_trip_inputs(scaled, tmp_path / "kept")
    assert type(rebuilt) is Scaled and rebuilt is not scaled
    assert (rebuilt.mean, rebuilt.std, rebuilt.name) == ([1.0, -2.0], 0.5, "scaled")
    assert tuple(rebuilt.clip) == (-1.0, 1.0), "a tuple comes back from JSON's list as the annotation says"
    record = {"a": 1.2, "b": -3.0}
    assert rebuilt.encode(record) == scaled.encode(record) == pytest.approx([0.4, -1.0])
    assert not any((tmp_path / "kept").iterdir()), "the default keeps no files"


@pytest.mark.parametrize(
    ("inputs", "said"),
    [
        (HoldsASet({"the", "a"}), "HoldsASet's arguments['stopwords'] is a builtins.set, not plain data"),
        (
            HoldsAnObject(Tokenizer(["a", "b"])),
            f"HoldsAnObject's arguments['tokenizer'] is a {__name__}.Tokenizer, not plain data",
        ),
        (Scaled(mean=[float("nan"), 0.0], std=1.0), "Scaled's arguments['mean'][0] = nan: not a finite number"),
        (
            Renamed({"up": 1}),
            "Renamed.__init__ takes 'vocabulary' but the object has no attribute 'vocabulary' to read it back from",
        ),
        (Starred("a", "b"), "Starred.__init__ takes *words, which cannot be read back by name"),
    ],
    ids=["set", "object", "nan", "renamed", "starred"],
)
def test_state_the_default_cannot_keep_is_refused_naming_the_attribute(inputs, said, tmp_path):
    with pytest.raises(TypeError) as refused:
        inputs.to_data(tmp_path)
    assert said in str(refused.value) and len(str(refused.value).splitlines()) == 1
    with pytest.raises(AssertionError) as failed:  # what a plugin's own test shows
        round_trip_inputs(inputs, tmp_path / "kept")
    assert str(failed.value).startswith(f"{type(inputs).__qualname__} cannot be kept as data: ")
    assert said in str(failed.value) and len(str(failed.value).splitlines()) == 1


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"mean": ["zero", 1.0], "std": 1.0}, 'mean.0 = "zero": Input should be a valid number'),
        ({"mean": [0.0, 1.0], "std": "wide"}, 'std = "wide": Input should be a valid number'),
        ({"mean": 0.0, "std": 1.0}, "mean = 0.0: Input should be a valid list"),
        ({"mean": [0.0, 1.0]}, "std: Field required"),
        ({"mean": [0.0, 1.0], "std": 1.0, "shift": 2.0}, "Scaled.__init__ takes no 'shift'"),
    ],
    ids=["item", "value", "list", "missing", "unknown"],
)
def test_from_data_with_the_wrong_data_names_the_key(data, said, tmp_path):
    with pytest.raises(ValueError) as refused:
        Scaled.from_data(data, tmp_path)
    assert str(refused.value).startswith(said), str(refused.value)
    assert len(str(refused.value).splitlines()) == 1


def test_an_inputs_with_its_own_to_data_keeps_a_file_in_the_folder(tmp_path):
    vocabulary = Vocabulary(["up", "down", "flat"])
    with pytest.raises(TypeError, match="no attribute 'words'"):  # the default could not keep it
        runjob.Inputs.to_data(vocabulary, tmp_path)
    rebuilt = round_trip_inputs(vocabulary, tmp_path / "kept")
    assert (tmp_path / "kept" / "vocabulary.txt").read_text() == "up\ndown\nflat\n"
    assert rebuilt.index == {"up": 1, "down": 2, "flat": 3}
    assert rebuilt.encode({"text": "flat up sideways"}) == [3, 1, 0]
    (tmp_path / "kept" / "vocabulary.txt").write_text("up\n")  # its file changed since: its own error
    with pytest.raises(ValueError, match="vocabulary.txt holds 1 words, not 3"):
        Vocabulary.from_data({"file": "vocabulary.txt", "size": 3}, tmp_path / "kept")


def test_round_trip_inputs_fails_a_class_that_does_not_survive(tmp_path):
    with pytest.raises(AssertionError) as lost:
        round_trip_inputs(Forgetful(scale=3.0), tmp_path / "a")
    assert str(lost.value) == (
        "Forgetful cannot be kept as data: Forgetful rebuilt by from_data(to_data()) gives other data for 'scale': "
        "from_data must rebuild the object to_data describes"
    )
    with pytest.raises(AssertionError) as raised:
        round_trip_inputs(NeedsAKey(scale=3.0), tmp_path / "b")
    assert str(raised.value) == "NeedsAKey cannot be kept as data: KeyError: 'factor'"
    with pytest.raises(AssertionError, match="^Tokenizer is not a runjob.Inputs$"):
        round_trip_inputs(Tokenizer([]), tmp_path / "c")
    assert round_trip_inputs(Forgetful(), tmp_path / "d").scale == 1.0, "nothing lost: it survives"


STATEFUL_PLUGIN = '''
from pathlib import Path

import runjob
from runjob_builtins.tasks import Regression, RegressionOptions


class Vocabulary(runjob.Inputs):
    columns = {"text": "string"}

    def __init__(self, words):
        self.index = {word: i + 1 for i, word in enumerate(words)}

    def read(self, path):
        return []

    def encode(self, record):
        import torch

        return torch.tensor([float(len(record["text"].split()))])

    def to_data(self, folder):
        (folder / "vocabulary.txt").write_text("\\n".join(self.index) + "\\n", encoding="utf-8")
        return {"file": "vocabulary.txt"}

    @classmethod
    def from_data(cls, data, folder):
        return cls((Path(folder) / data["file"]).read_text(encoding="utf-8").splitlines())


class Weighted(Regression):
    """Weights fitted on the training labels: not in its options, so kept with to_data."""

    weights = None

    def to_data(self):
        return {"weights": self.weights}

    def restore(self, data):
        weights = data["weights"]
        if not (isinstance(weights, list) and all(isinstance(w, float) for w in weights)):
            raise ValueError(f"weights = {weights!r}: not a list of numbers")
        self.weights = weights


class Forgets(Regression):
    """Keeps state with to_data but leaves restore as it is."""

    def to_data(self):
        return {"weights": [1.0]}


@runjob.hookimpl
def runjob_register_inputs(register):
    register("vocabulary", Vocabulary, description="words, one a line in vocabulary.txt")


@runjob.hookimpl
def runjob_register_tasks(register):
    register("weighted", lambda options, data: Weighted(options), options=RegressionOptions)
    register("forgets", lambda options, data: Forgets(options), options=RegressionOptions)
'''


def _stateful(runjob_tester):
    """The plugin above installed, and the plugins loaded as a command loads them."""
    from runjob.host.plugin_host import load_plugins

    runjob_tester.install_plugin("stateful", {"stateful": STATEFUL_PLUGIN})
    host = load_plugins()
    assert not host.failures, host.failures
    return host


def _task_table(host, name):
    """The job's ``[task]`` table, as a finished run's job gives it."""
    from runjob.job.validation import Chosen
    from runjob_builtins.tasks import RegressionOptions

    return Chosen(host.lookup("task", name), RegressionOptions())


def test_a_tasks_state_is_kept_with_to_data_and_handed_back_to_restore(runjob_tester):
    from runjob.record.prediction import Predictor, PredictorError, load_predictor, save_predictor
    from runjob_builtins.tasks import Regression, RegressionOptions

    host = _stateful(runjob_tester)
    import stateful

    assert Regression(RegressionOptions()).to_data() == {}, "a task keeps nothing by default"
    table = _task_table(host, "weighted")
    task = table.component.factory(table.options, runjob.DataFacts())
    task.weights = [0.25, 4.0]  # fitted on the training labels
    out = runjob_tester.path / "run"
    predictor = Predictor(task, stateful.Vocabulary(["up", "down"]), None, None, {"value": "double"})
    saved_file = save_predictor(predictor, out, host, table, runjob.DataFacts())
    assert saved_file == out / "predictor" / "predictor.json"
    saved = json.loads(saved_file.read_text())
    assert saved["task"] == {"weights": [0.25, 4.0]}
    assert saved["inputs"] == {"name": "vocabulary", "plugin": "stateful", "data": {"file": "vocabulary.txt"}}
    assert (out / "predictor" / "inputs" / "vocabulary.txt").read_text() == "up\ndown\n"
    assert sorted(p.name for p in out.iterdir()) == ["predictor"], "written whole: no partial folder left"

    rebuilt = load_predictor(out, host, table)
    assert type(rebuilt.task) is stateful.Weighted and rebuilt.task is not task
    assert rebuilt.task.weights == [0.25, 4.0], "restore() got what to_data() kept"
    assert type(rebuilt.inputs) is stateful.Vocabulary and rebuilt.inputs.index == {"up": 1, "down": 2}
    assert rebuilt.output_columns == {"value": "double"}

    saved["task"]["weights"] = "heavy"  # predictor.json changed since the run: restore refuses it, in one line
    saved_file.write_text(json.dumps(saved))
    with pytest.raises(PredictorError) as refused:
        load_predictor(out, host, table)
    assert str(refused.value) == (
        f"{saved_file}: task: task 'weighted' cannot be rebuilt from the run's data: "
        "ValueError: weights = 'heavy': not a list of numbers"
    )


def test_the_default_restore_refuses_data_so_no_predictor_is_saved(runjob_tester):
    from runjob.record.prediction import Predictor, save_predictor

    host = _stateful(runjob_tester)
    import stateful

    table = _task_table(host, "forgets")
    task = table.component.factory(table.options, runjob.DataFacts())
    task.restore({})  # nothing kept: nothing to refuse
    refusal = "Forgets keeps no data but was given ['weights']: define restore() beside to_data()"
    with pytest.raises(ValueError) as refused:
        task.restore(task.to_data())
    assert str(refused.value) == refusal
    out = runjob_tester.path / "run"
    out.mkdir()
    with pytest.raises(ValueError) as unsaved:
        save_predictor(Predictor(task, stateful.Vocabulary(["up"]), None, None, None), out, host, table, None)
    assert str(unsaved.value) == f"its task (Forgets) cannot be rebuilt from data: ValueError: {refusal}"
    assert not list(out.iterdir()), "nothing of it is left in the run's folder"


NOT_INPUTS = """
import runjob


class Words:
    # reads like a runjob.Inputs, but is not one

    columns = {"text": "string"}

    def read(self, path):
        return []

    def encode(self, record):
        return record


def words():
    return Words()


@runjob.hookimpl
def runjob_register_inputs(register):
    register("words", REGISTERED)
"""


@pytest.mark.parametrize(
    ("registered", "shown"),
    [("Words", "<class 'not_inputs.Words'>"), ("words", "<function words at 0x")],
    ids=["class", "function"],
)
def test_registering_what_is_not_an_inputs_class_is_the_plugins_failure(runjob_tester, registered, shown):
    from runjob.host.plugin_host import load_plugins

    runjob_tester.install_plugin("not-inputs", {"not_inputs": NOT_INPUTS.replace("REGISTERED", registered)})
    host = load_plugins()
    [failure] = host.failures
    assert failure.name == "not_inputs"
    assert failure.error.startswith(f"TypeError: inputs 'words': {shown}")
    assert failure.error.endswith(" is not a subclass of runjob.Inputs")
    assert "words" not in host.components["inputs"] and "csv_rows" in host.components["inputs"]
    listed = runjob_tester.cli("plugins")
    assert listed.returncode == 0, listed.stderr
    [line] = [line for line in listed.stdout.splitlines() if "not_inputs" in line]
    assert line.startswith(f"FAILED: not_inputs  (not-inputs 1.0): TypeError: inputs 'words': {shown}")
    assert line.endswith("is not a subclass of runjob.Inputs")


UNKEPT_PLUGIN = '''
"""Rows y = 2 a - b + 0.5; raw inputs from a CSV of a, b, read by an Inputs class no plugin registers."""
import csv

import runjob


def sample(a, b):
    import torch

    return torch.tensor([a, b])


class Rows:
    def __init__(self, count, seed):
        self.count, self.seed = count, seed

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        import torch

        k = index * 7 + self.seed
        a, b = (k % 11) / 5 - 1, (k % 13) / 6 - 1
        return sample(a, b), torch.tensor(2 * a - b + 0.5)


class UnkeptRows(runjob.Inputs):
    columns = {"a": "double", "b": "double"}

    def read(self, path):
        with open(path, newline="") as file:
            rows = list(csv.DictReader(file))
        return [(f"line {n}", {k: float(row[k]) for k in self.columns}) for n, row in enumerate(rows, 2)]

    def encode(self, record):
        return sample(record["a"], record["b"])


@runjob.hookimpl
def runjob_register_datasets(register):
    register("unkept_rows", lambda options: runjob.DatasetSplits(Rows(64, 0), Rows(16, 3), inputs=UnkeptRows()))
'''

UNKEPT_JOB = """
    [job]
    name = "unkept"
    [model]
    name = "mlp"
    hidden = []
    [dataset]
    name = "unkept_rows"
    [task]
    name = "regression"
    [optimizer]
    lr = 0.05
    [train]
    batch_size = 16
    max_steps = 4
"""


@pytest.mark.slow
def test_a_run_whose_inputs_no_plugin_registers_finishes_and_predict_builds_the_dataset(runjob_tester, capfd):
    import torch

    from runjob.host.plugin_host import load_plugins
    from runjob.train.trained import build_model, find_run, load_job

    runjob_tester.install_plugin("unkept", {"unkept": UNKEPT_PLUGIN})
    runjob_tester.write_job("job.toml", UNKEPT_JOB)
    run = runjob_tester.run("job.toml", output_dir="run")
    said = capfd.readouterr().out
    assert run.status == "FINISHED"
    lines = [line for line in said.splitlines() if "predictor" in line]
    assert lines == [
        "runjob: the MLflow model takes the model's input tensors as they are (not raw inputs as `runjob predict` "
        "does): dataset 'unkept_rows''s predictor is not saved: its runjob.Inputs class unkept.UnkeptRows is "
        "registered by no plugin (runjob_register_inputs), so it cannot be rebuilt from data; `runjob predict` reads "
        "inputs by building the dataset again"
    ]
    assert not (run.output_dir / "predictor").exists() and not (run.output_dir / "prediction.pkl").exists()
    assert not any(path.name.startswith(".predictor") for path in run.output_dir.iterdir()), "no partial folder"
    model_data = run.output_dir / "mlflow_model" / "data" / "run"
    assert (model_data / "model.safetensors").is_file() and not (model_data / "predictor").exists()

    rows = [(0.5, -1.0), (-0.2, 0.4), (1.0, 1.0)]
    (runjob_tester.path / "new.csv").write_text("b,a\n" + "".join(f"{b},{a}\n" for a, b in rows))
    result = runjob_tester.cli("predict", run.output_dir, "--input", "new.csv")
    assert result.returncode == 0, result.stderr
    predicted = [json.loads(line) for line in result.stdout.splitlines()]
    found = find_run(str(run.output_dir), None, runjob_tester.path / "unused")
    model = build_model(load_job(found, [], load_plugins()), found.model_file)
    with torch.no_grad():
        expected = model(torch.tensor(rows)).flatten().tolist()
    assert [row["input"] for row in predicted] == ["line 2", "line 3", "line 4"]
    assert [row["value"] for row in predicted] == pytest.approx(expected, abs=1e-5)
