"""The plugin's task, focal_classification: its loss and balanced accuracy by hand, its metrics
checked by `runjob validate`, and tiny_mlp trained with it on the digits."""

import math

import pytest
from digits_jobs import ADAM, tiny_mlp_digits

JOB = tiny_mlp_digits(
    "focal",
    tables=ADAM + '    [task]\n    name = "focal_classification"\n    gamma = 2.0\n',
    train='    best_metric = "val/balanced_accuracy"\n',
)


@pytest.fixture
def focal(runjob_with_plugin):
    """A focal_classification task factory, from the plugin as installed."""
    from runjob_tinymlp import FocalClassification, FocalOptions

    return lambda **options: FocalClassification(FocalOptions(**options))


def metrics_of(task, *pairs):
    """What a run reports for the task over these (logits, batch) pairs: runjob's own evaluation
    (evaluate, summed over the samples, summarize, checked against the declared metrics)."""
    from runjob_tinymlp import FocalOptions

    from runjob.testing import evaluate_task

    return evaluate_task(task, pairs, FocalOptions())  # the options declare the metrics; gamma is the task's


def test_gamma_zero_is_cross_entropy_and_gamma_spares_easy_samples(focal):
    import torch
    import torch.nn.functional as F

    logits = torch.tensor([[4.0, 0.0, 0.0], [0.5, 0.0, 0.2], [0.0, 3.0, -1.0], [1.0, 1.0, 1.0]])
    targets = torch.tensor([0, 2, 1, 0])
    batch = (torch.zeros(4, 1), targets)
    assert torch.equal(focal(gamma=0.0).loss(logits, batch), F.cross_entropy(logits, targets))
    assert metrics_of(focal(gamma=0.0), (logits, batch))["val/loss"] == pytest.approx(
        F.cross_entropy(logits, targets).item()
    )

    per_sample = focal(gamma=2.0)._focal(logits, targets)
    cross_entropy = F.cross_entropy(logits, targets, reduction="none")
    p_t = torch.exp(-cross_entropy)
    torch.testing.assert_close(per_sample, (1 - p_t) ** 2 * cross_entropy)
    # sample 0 (p_t = 0.96) keeps 0.15% of its cross-entropy, sample 1 (p_t = 0.30) half of it
    kept = (per_sample / cross_entropy).tolist()
    assert kept[0] < 0.002 and 0.45 < kept[1] < 0.55
    assert per_sample[0] < per_sample[1] and (per_sample < cross_entropy).all()

    # alpha weighs each sample by its class
    weighted = focal(gamma=2.0, alpha=[1.0, 3.0, 0.5])._focal(logits, targets)
    torch.testing.assert_close(weighted, per_sample * torch.tensor([1.0, 0.5, 3.0, 1.0]))


def test_balanced_accuracy_sees_through_the_majority_class(focal):
    import torch

    task = focal()
    targets = torch.tensor([0] * 9 + [1])  # 9 of class 0, 1 of class 1
    always_zero = torch.tensor([[2.0, -2.0]]).expand(10, 2)
    values = task.evaluate(always_zero, (torch.zeros(10, 1), targets))
    assert values["support"].shape == values["hit"].shape == (10, 2)
    # in two batches, as a split comes: the sums run over both
    metrics = metrics_of(
        task, (always_zero[:6], (torch.zeros(6, 1), targets[:6])), (always_zero[6:], (torch.zeros(4, 1), targets[6:]))
    )
    assert list(metrics) == ["val/accuracy", "val/balanced_accuracy", "val/loss"]
    assert metrics["val/accuracy"] == pytest.approx(0.9)
    assert metrics["val/balanced_accuracy"] == pytest.approx(0.5)  # recall 1 for class 0, 0 for class 1

    # three classes, one absent from the split: recall (2/3 + 1/1) / 2, accuracy 3/4
    logits = torch.eye(3)[[0, 0, 2, 2]]
    metrics = metrics_of(task, (logits, (torch.zeros(4, 1), torch.tensor([0, 0, 0, 2]))))
    assert metrics["val/accuracy"] == pytest.approx(0.75)
    assert metrics["val/balanced_accuracy"] == pytest.approx((2 / 3 + 1) / 2)
    assert math.isfinite(metrics["val/loss"])


def test_validate_checks_best_metric_against_the_task(runjob_with_plugin):
    runjob_with_plugin.write_job("job.toml", JOB)
    assert runjob_with_plugin.cli("validate", "job.toml").returncode == 0

    runjob_with_plugin.write_job("bad.toml", JOB.replace('"val/balanced_accuracy"', '"val/f1"'))
    result = runjob_with_plugin.cli("validate", "bad.toml")
    assert result.returncode == 2
    assert result.stderr_lines == [
        "runjob: bad.toml:22: train.best_metric: 'val/f1' is not a metric of task 'focal_classification'; "
        "it reports: val/accuracy, val/balanced_accuracy, val/loss"
    ]


def test_tiny_mlp_learns_the_digits_with_focal_loss(runjob_with_plugin):
    runjob_with_plugin.write_job("job.toml", JOB)
    run = runjob_with_plugin.run("job.toml", output_dir="out")
    assert run.exit_code == 0 and run.status == "FINISHED"
    assert run.params["task.name"] == "focal_classification"
    assert run.metrics["val/balanced_accuracy"] > 0.8  # chance is 0.1
    assert run.metrics["val/accuracy"] > 0.8


def test_alpha_of_the_wrong_length_stops_at_the_first_batch(runjob_with_plugin):
    runjob_with_plugin.write_job("job.toml", JOB)
    result = runjob_with_plugin.cli("job.toml", "--set", "task.alpha=[1.0, 2.0, 3.0]")
    assert result.returncode == 2
    assert result.stderr_lines[-1] == (
        "runjob: model 'tiny_mlp' does not fit task 'focal_classification' with dataset 'digits': "
        "task.alpha has 3 weights, but the outputs have 10 classes: give one weight per class"
    )
    assert "Traceback" not in result.stderr


def test_runjob_lists_the_task(runjob_with_plugin):
    result = runjob_with_plugin.cli("plugins")
    assert result.returncode == 0, result.stderr
    assert "    models: tiny_mlp\n    tasks: focal_classification\n" in result.stdout
