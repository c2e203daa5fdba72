"""The task component: what is learned is chosen by the job, checked before the run, and a plugin's
task (or its batches) goes through the same loop as the built-ins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import SMALL_DIGITS

pytestmark = pytest.mark.timeout(300)


def resolved(tester, text: str):
    from runjob.host.plugin_host import load_plugins
    from runjob.job.validation import load_resolved

    return load_resolved(tester.write_job("job.toml", text), [], load_plugins())


def test_the_task_decides_the_best_metric_and_the_sweep_direction(tester):
    job = resolved(tester, SMALL_DIGITS.format(name="plain"))
    assert job.task.name == "classification" and job.train.best_metric == "val/accuracy"
    regression = SMALL_DIGITS.format(name="values") + '[task]\nname = "regression"\n'
    job = resolved(tester, regression + '[sweep]\n[sweep.parameters]\n"optimizer.lr" = [0.1, 0.01]\n')
    assert job.train.best_metric == "val/r2"
    assert (job.sweep.metric, job.sweep.direction) == ("val/r2", "maximize")
    job = resolved(tester, regression + '[sweep]\nmetric = "val/rmse"\n[sweep.parameters]\n"optimizer.lr" = [0.1]\n')
    assert (job.sweep.metric, job.sweep.direction) == ("val/rmse", "minimize")
    assert job.to_dict()["train"]["best_metric"] == "val/r2", "the resolved job says which metric picks the best"


def test_metrics_the_task_does_not_declare_are_refused_with_their_lines(tester):
    tester.write_job(
        "job.toml",
        SMALL_DIGITS.format(name="wrong")
        + """
    best_metric = "val/accuracy"
    [task]
    name = "regression"
    [sweep]
    metric = "val/r22"
    [sweep.parameters]
    "optimizer.lr" = [0.1, 0.01]
    """,
    )
    result = tester.cli("validate", "job.toml")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr_lines == [
        "runjob: job.toml:11: train.best_metric: 'val/accuracy' is not a metric of task 'regression'; it reports: "
        "val/r2, val/mae, val/rmse, val/loss",
        "runjob: job.toml:15: sweep.metric: 'val/r22' is not a metric of task 'regression' or the callbacks; did you "
        "mean 'val/r2'? it reports: val/r2, val/mae, val/rmse, val/loss, test/r2, test/mae, test/rmse, test/loss, "
        "train/loss, train/tflops, train/mfu, train/peak_memory_gib, train/peak_rss_gib",
    ]
    tester.write_job(
        "job.toml",
        SMALL_DIGITS.format(name="way")
        + '[sweep]\nmetric = "val/loss"\ndirection = "maximize"\n[sweep.parameters]\n"optimizer.lr" = [0.1]\n',
    )
    result = tester.cli("validate", "job.toml")
    assert result.returncode == 2
    assert result.stderr_lines == [
        "runjob: job.toml:12: sweep.direction: 'maximize' is the wrong way for val/loss: task 'classification' says "
        "lower is better (direction = 'minimize', or leave it out)"
    ]


BROKEN_TASKS = """
import runjob


class Forgetful(runjob.TaskOptions):
    def metrics(self):
        raise KeyError("mae")


class NoTask(runjob.TaskOptions):
    def metrics(self):
        return {"loss": "min"}


class PlainOptions(runjob.Options):
    pass


@runjob.hookimpl
def runjob_register_tasks(register):
    register("forgetful", lambda options, data: None, options=Forgetful)
    register("not_a_task", lambda options, data: "a string", options=NoTask)


@runjob.hookimpl
def runjob_register_models(register):
    pass
"""

WRONG_OPTIONS = """
import runjob


class PlainOptions(runjob.Options):
    pass


@runjob.hookimpl
def runjob_register_tasks(register):
    register("plain", lambda options, data: None, options=PlainOptions)
"""


def test_a_broken_task_plugin_is_reported_not_raised(tester):
    tester.install_plugin("broken-tasks", {"broken_tasks": BROKEN_TASKS}, {"broken": "broken_tasks"})
    tester.install_plugin("plain-task", {"plain_task": WRONG_OPTIONS}, {"plain": "plain_task"})
    tester.write_job("job.toml", SMALL_DIGITS.format(name="forgetful") + '[task]\nname = "forgetful"\n')
    result = tester.cli("validate", "job.toml")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr_lines == [
        "runjob: job.toml:11: task.name: task 'forgetful': its options' metrics() failed: KeyError: 'mae' "
        "(plugin broken)"
    ]
    plugins = tester.cli("plugins")
    assert "plain" in plugins.stdout and "options must be a subclass of runjob.TaskOptions" in plugins.stdout

    tester.write_job("job.toml", SMALL_DIGITS.format(name="notask") + '[task]\nname = "not_a_task"\n')
    result = tester.cli("job.toml")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr_lines[-1] == (
        "runjob: task 'not_a_task' (plugin broken): its factory returned a str, not a runjob.Task"
    )
    assert tester.only_run("notask").status == "FAILED"


def test_eval_every_evaluates_within_the_epoch_and_once_at_its_end(tester):
    tester.write_job("job.toml", SMALL_DIGITS.format(name="often"))
    result = tester.cli("job.toml", "--set", "train.max_steps=10", "--set", "train.eval_every=4")
    assert result.returncode == 0, result.stderr[-2000:]
    run = tester.only_run("often")
    assert run.steps("val/accuracy") == [4, 8, 10], "every 4 steps, then the end of the (shortened) epoch"
    assert [line.split()[:2] for line in result.stdout.splitlines() if line.startswith("step ")] == [
        ["step", "4/10"],
        ["step", "8/10"],
    ]
    assert run.tags["runjob.best.metric"] == "val/accuracy" and run.tags["runjob.best.step"] in ("4", "8", "10")


def test_classification_options_reach_the_loss_and_the_metrics(tester):
    tester.write_job("job.toml", SMALL_DIGITS.format(name="topk") + "[task]\nlabel_smoothing = 0.1\ntop_k = 3\n")
    result = tester.cli("job.toml", "--set", "train.max_steps=20")
    assert result.returncode == 0, result.stderr[-2000:]
    run = tester.only_run("topk")
    assert run.metrics["val/top3"] >= run.metrics["val/accuracy"] > 0.2
    assert json.loads(run.tags["runjob.metrics"]) == {"val/accuracy": "max", "val/loss": "min", "val/top3": "max"}


def test_the_classification_loss_takes_label_smoothing_and_probabilities():
    import torch
    import torch.nn.functional as F

    from runjob_builtins.tasks import Classification, ClassificationOptions

    logits, labels = torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 0, 1])
    smoothed = Classification(ClassificationOptions(label_smoothing=0.2), 4)
    assert torch.equal(smoothed.loss(logits, (None, labels)), F.cross_entropy(logits, labels, label_smoothing=0.2))
    soft = F.one_hot(labels, 4).float()
    plain = Classification(ClassificationOptions(), 4)
    assert torch.allclose(plain.loss(logits, (None, soft)), F.cross_entropy(logits, labels))
    values = plain.evaluate(logits, (None, soft))
    assert torch.equal(values["correct"], logits.argmax(1) == labels), "probabilities are scored by their top class"
    with pytest.raises(ValueError, match=r"outputs of shape \(6, 4\), but the dataset has 5 classes"):
        Classification(ClassificationOptions(), 5).check(logits, (None, labels))


def test_regression_metrics_match_scikit_learn():
    import torch
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    from runjob_builtins.tasks import Regression, RegressionOptions

    generator = torch.Generator().manual_seed(0)
    targets = torch.randn(40, 2, generator=generator) * 3 + 5
    outputs = targets + torch.randn(40, 2, generator=generator)
    task = Regression(RegressionOptions())
    halves = [task.evaluate(outputs[i : i + 20], (None, targets[i : i + 20])) for i in (0, 20)]
    totals = {name: (halves[0][name].double().sum(0) + halves[1][name].double().sum(0)).tolist() for name in halves[0]}
    summary = task.summarize(totals, 40)
    y, p = targets.numpy(), outputs.numpy()
    assert summary["r2"] == pytest.approx(r2_score(y, p), rel=1e-5)
    assert summary["mae"] == pytest.approx(mean_absolute_error(y, p), rel=1e-5)
    assert summary["rmse"] == pytest.approx(mean_squared_error(y, p) ** 0.5, rel=1e-5)
    one = Regression(RegressionOptions())
    assert torch.equal(one.loss(outputs[:, :1], (None, targets[:, 0])), ((outputs[:, 0] - targets[:, 0]) ** 2).mean())
    with pytest.raises(ValueError, match=r"outputs of shape \(40, 2\) do not match targets of shape \(40,\)"):
        one.check(outputs, (None, targets[:, 0]))


def test_language_modeling_reads_windows_pairs_and_tokenizer_dicts():
    import torch
    import torch.nn.functional as F

    from runjob_builtins.tasks import LanguageModeling, LanguageModelingOptions

    task = LanguageModeling(LanguageModelingOptions(), 7)
    tokens = torch.randint(0, 7, (3, 9))
    logits = torch.randn(3, 8, 7)
    expected = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    mask = torch.ones_like(tokens)
    for batch in (tokens, (tokens[:, :-1], tokens[:, 1:]), {"input_ids": tokens, "attention_mask": mask}):
        assert torch.equal(task.inputs(batch), tokens[:, :-1])
        assert torch.allclose(task.loss(logits, batch), expected)
        assert task.count(batch) == 24
    mask[:, -3:] = 0  # padding: the last three tokens are not targets
    values = task.evaluate(logits, {"input_ids": tokens, "attention_mask": mask})
    assert values["tokens"].tolist() == [5, 5, 5]
    summary = task.summarize({name: float(value.sum()) for name, value in values.items()}, 3)
    kept = F.cross_entropy(logits[:, :5].flatten(0, 1), tokens[:, 1:6].flatten())
    assert summary["loss"] == pytest.approx(float(kept), rel=1e-5)
    assert summary["perplexity"] == pytest.approx(float(kept.exp()), rel=1e-5)


COUNTING = '''
"""Token sequences that count 0, 1, 2, 3, 4, 0, ... from a random start, as a tokenizer would give
them: dicts of input_ids and an attention_mask that pads the end of every other sequence."""
import runjob


class Counting:
    def __init__(self, count, length, seed):
        self.count, self.length, self.seed = count, length, seed

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        import torch

        start = (index * 7 + self.seed) % 5
        ids = (torch.arange(self.length) + start) % 5
        mask = torch.ones(self.length, dtype=torch.long)
        if index % 2:
            ids[-4:] = 0  # padding breaks the pattern: only the mask keeps it out of the loss
            mask[-4:] = 0
        return {"input_ids": ids, "attention_mask": mask}


@runjob.hookimpl
def runjob_register_datasets(register):
    register("counting", lambda options: runjob.DatasetSplits(Counting(320, 12, 0), Counting(64, 12, 3), 5))


@runjob.hookimpl
def runjob_register_models(register):
    def build(options):
        import torch.nn as nn

        return nn.Sequential(nn.Embedding(5, 16), nn.Linear(16, 5))

    register("bigram", build)
'''


def test_a_tokenizers_dict_batches_train_a_language_model(tester):
    tester.install_plugin("counting", {"counting": COUNTING}, {"counting": "counting"})
    tester.write_job(
        "job.toml",
        """
        [job]
        name = "counting"
        [model]
        name = "bigram"
        [dataset]
        name = "counting"
        [task]
        name = "language_modeling"
        [optimizer]
        lr = 0.05
        [train]
        epochs = 3
        batch_size = 16
        """,
    )
    result = tester.cli("job.toml")
    assert result.returncode == 0, result.stderr[-2000:]
    run = tester.only_run("counting")
    assert run.metrics["val/perplexity"] < 1.2, "the next count is certain once padding is masked out"
    assert "train/tokens_per_s" in run.metrics and "train/samples_per_s" not in run.metrics
    assert run.tags["runjob.best.metric"] == "val/perplexity"


def test_runs_shows_the_metrics_each_runs_task_declared():
    from types import SimpleNamespace

    from runjob.commands.runs import results_table

    def run(run_id, task_metrics, metrics):
        tags = {"runjob.metrics": json.dumps(task_metrics)} if task_metrics is not None else {}
        return SimpleNamespace(
            info=SimpleNamespace(run_id=run_id),
            data=SimpleNamespace(params={"task.name": run_id}, tags=tags, metrics=metrics),
        )

    runs = [
        run("regression", {"val/r2": "max", "val/mae": "min"}, {"val/r2": 0.47, "val/mae": 44.0, "train/loss": 3000.0}),
        run("older", None, {"val/accuracy": 0.9, "val/loss": 0.3, "train/loss": 0.2}),  # before tasks: the old columns
        run("lm", {"val/perplexity": "min"}, {"val/perplexity": 3.2, "train/loss": 1.1}),
    ]
    lines = results_table(runs)
    assert lines == [
        "run id      task.name   val/r2  val/mae  val/accuracy  val/loss  val/perplexity  train/loss",
        "regression  regression    0.47       44                                                3000",
        "older       older                                 0.9       0.3                         0.2",
        "lm          lm                                                              3.2         1.1",
    ]


def readme_python(first_line: str) -> str:
    """The README's Python block that begins with ``first_line``: the README is what users copy."""
    from helpers import documented_python

    return documented_python(first_line)[1]


def test_the_readmes_task_plugin_trains_on_the_readmes_diabetes_file(tester, monkeypatch):
    monkeypatch.chdir(tester.path)
    (tester.path / "data").mkdir()
    exec(readme_python("import csv\n"), {})  # writes data/diabetes.csv, as the README tells a user to
    tester.install_plugin("my-tasks", {"my_tasks": readme_python("# my_tasks/__init__.py\n")}, {"median": "my_tasks"})
    tester.write_job(
        "job.toml",
        """
        [job]
        name = "median"
        [task]
        name = "median"
        [model]
        name = "mlp"
        in_features = 10
        hidden = [32]
        [dataset]
        name = "csv"
        path = "data/diabetes.csv"
        target = "target"
        [optimizer]
        lr = 0.03
        [scheduler]
        name = "cosine"
        [train]
        epochs = 30
        best_metric = "val/mae"
        """,
    )
    result = tester.cli("job.toml")
    assert result.returncode == 0, result.stderr[-2000:]
    run = tester.only_run("median")
    assert run.metrics["val/r2"] > 0.2, "well above the mean predictor's 0"
    assert run.metrics["val/mae"] < float(run.tags["runjob.baseline.mean_predictor_val_mae"])
    assert run.tags["runjob.best.metric"] == "val/mae"
    import mlflow
    import numpy as np
    import pandas as pd

    logged = mlflow.pyfunc.load_model(f"runs:/{run.run_id}/median")  # any task's model loads back
    columns = logged.metadata.get_input_schema().input_names()  # the CSV's raw feature columns
    assert columns == ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"]
    predicted = logged.predict(pd.DataFrame(np.zeros((3, 10)), columns=columns))
    assert list(predicted.columns) == ["output_0"] and len(predicted) == 3  # the README task's default predict()
    requirements = mlflow.artifacts.download_artifacts(f"runs:/{run.run_id}/median/requirements.txt")
    assert "torchvision" not in Path(requirements).read_text()
