"""The built-in task ``segmentation``: its loss, its metrics on hand-counted masks, its first-batch
check and its options as ``runjob validate`` reports them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import runjob
from runjob_builtins.segmentation import SegmentationOptions, build_segmentation


def make_task(num_classes: int | None = 4, **options) -> runjob.Task:
    data = runjob.DatasetSplits(train=[], val=[], num_classes=num_classes)
    return build_segmentation(SegmentationOptions.model_validate(options), data)


def logits_for(predictions: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Logits ``(N, classes, H, W)`` whose argmax is ``predictions`` ``(N, H, W)``."""
    return F.one_hot(predictions, num_classes).permute(0, 3, 1, 2).float() * 10


def host_totals(values: dict[str, torch.Tensor]) -> dict:
    """What the host hands ``summarize``: each value summed over the samples, as floats."""
    totals = {}
    for name, value in values.items():
        summed = value.sum(0).double()
        totals[name] = summed.tolist() if summed.dim() else summed.item()
    return totals


# Two 2x3 masks; -100 (ignore_index) marks one pixel of each, predicted as something else
MASKS = torch.tensor([[[0, 0, 1], [1, 2, -100]], [[2, 2, 2], [0, 0, -100]]])
PREDICTIONS = torch.tensor([[[0, 1, 1], [1, 2, 2]], [[2, 2, 0], [0, 1, 0]]])


def test_metrics_match_hand_counts():
    task = make_task(num_classes=4)
    outputs = logits_for(PREDICTIONS, 4)
    values = task.evaluate(outputs, (torch.zeros(2, 1, 2, 3), MASKS))
    assert all(value.shape[0] == 2 for value in values.values())
    assert values["valid_pixels"].tolist() == [5, 5]
    assert values["correct_pixels"].tolist() == [4, 3]
    # class 0: mask 4 pixels, predicted 3, both 2 -> IoU 2/5; class 1: 2, 4, 2 -> 2/4;
    # class 2: 4, 3 (the ignored pixel predicted 2 is not counted), 3 -> 3/4; class 3: in neither
    assert values["intersection"].sum(0).tolist() == [2, 2, 3, 0]
    assert values["union"].sum(0).tolist() == [5, 4, 4, 0]
    assert values["union"].tolist() == [[2, 3, 1, 0], [3, 1, 3, 0]]

    metrics = task.summarize(host_totals(values), count=2)
    assert set(metrics) == set(SegmentationOptions().metrics())
    assert metrics["pixel_accuracy"] == pytest.approx(7 / 10)
    assert metrics["miou"] == pytest.approx((2 / 5 + 2 / 4 + 3 / 4) / 3)  # class 3 left out, not a 0


def test_evaluation_loss_is_each_samples_mean_over_counted_pixels():
    task = make_task(num_classes=4, label_smoothing=0.1)
    outputs = torch.randn(2, 4, 2, 3, generator=torch.Generator().manual_seed(0))
    values = task.evaluate(outputs, (torch.zeros(2, 1, 2, 3), MASKS))
    for i in range(2):
        expected = F.cross_entropy(outputs[i : i + 1], MASKS[i : i + 1], ignore_index=-100, label_smoothing=0.1)
        assert values["loss"][i].item() == pytest.approx(expected.item())
    metrics = task.summarize(host_totals(values), count=2)
    assert metrics["loss"] == pytest.approx(values["loss"].mean().item())


def test_loss_leaves_out_ignored_pixels():
    task = make_task(num_classes=3, ignore_index=255)
    masks = torch.tensor([[[0, 1], [255, 2]]])
    outputs = torch.randn(1, 3, 2, 2, generator=torch.Generator().manual_seed(1), requires_grad=True)
    loss = task.loss(outputs, (torch.zeros(1, 1, 2, 2), masks))
    kept = [(0, 0, 0), (0, 1, 1), (1, 1, 2)]  # (row, column, class) of the counted pixels
    expected = sum(-F.log_softmax(outputs[0, :, r, c], 0)[k] for r, c, k in kept) / len(kept)
    assert loss.dim() == 0 and loss.item() == pytest.approx(expected.item())

    loss.backward()
    assert outputs.grad[0, :, 1, 0].abs().sum() == 0  # the ignored pixel pulls on nothing
    changed = outputs.detach().clone()
    changed[0, :, 1, 0] = torch.tensor([50.0, -50.0, 0.0])
    assert task.loss(changed, (None, masks)).item() == pytest.approx(loss.item())


def test_a_sample_of_ignored_pixels_only_counts_nothing():
    task = make_task(num_classes=2)
    masks = torch.tensor([[[-100, -100]], [[0, 1]]])
    values = task.evaluate(logits_for(torch.tensor([[[1, 1]], [[0, 1]]]), 2), (None, masks))
    assert values["loss"][0].item() == 0 and torch.isfinite(values["loss"]).all()
    assert values["valid_pixels"].tolist() == [0, 2] and values["union"][0].tolist() == [0, 0]
    assert task.summarize(host_totals(values), count=2)["miou"] == pytest.approx(1.0)


def test_check_accepts_fitting_outputs():
    task = make_task(num_classes=3)
    masks = torch.randint(0, 3, (8, 16, 16))
    masks[0, 0, 0] = -100
    task.check(torch.zeros(8, 3, 16, 16), (torch.zeros(8, 1, 16, 16), masks))


@pytest.mark.parametrize(
    ("outputs", "expected"),
    [
        (
            (8, 5, 16, 16),
            "outputs of shape (8, 5, 16, 16), but the dataset has 3 classes and masks of shape (8, 16, 16): "
            "set model.num_classes = 3",
        ),
        (
            (8, 3, 8, 8),
            "outputs of shape (8, 3, 8, 8), but the dataset has 3 classes and masks of shape (8, 16, 16): "
            "the model must return logits of shape (8, 3, 16, 16)",
        ),
        ((8, 3), "outputs of shape (8, 3), but the dataset has 3 classes"),
    ],
)
def test_check_names_the_shapes_and_the_fix(outputs, expected):
    task = make_task(num_classes=3)
    with pytest.raises(ValueError) as caught:
        task.check(torch.zeros(outputs), (torch.zeros(8, 1, 16, 16), torch.zeros(8, 16, 16, dtype=torch.long)))
    assert expected in str(caught.value)


def test_check_rejects_class_indices_out_of_range():
    task = make_task(num_classes=3)
    masks = torch.zeros(2, 4, 4, dtype=torch.long)
    masks[1, 2, 2] = 255
    with pytest.raises(ValueError, match=r"masks hold class index 255, but the dataset has 3 classes \(0 to 2\)"):
        task.check(torch.zeros(2, 3, 4, 4), (None, masks))
    make_task(num_classes=3, ignore_index=255).check(torch.zeros(2, 3, 4, 4), (None, masks))


def test_check_needs_the_number_of_classes():
    task = make_task(num_classes=None)
    batch = (torch.zeros(2, 1, 4, 4), torch.zeros(2, 4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"DatasetSplits\.num_classes is None"):
        task.check(torch.zeros(2, 3, 4, 4), batch)


def test_check_rejects_masks_with_a_channel_dimension():
    task = make_task(num_classes=3)
    with pytest.raises(ValueError, match=r"masks of shape \(2, 1, 4, 4\): .* \(batch, height, width\)"):
        task.check(torch.zeros(2, 3, 4, 4), (None, torch.zeros(2, 1, 4, 4, dtype=torch.long)))


def test_segmentation_is_registered_with_its_metrics():
    from runjob.host.plugin_host import load_plugins

    component = load_plugins().components["task"]["segmentation"]
    assert component.options is SegmentationOptions
    assert list(SegmentationOptions().metrics()) == ["miou", "pixel_accuracy", "loss"]


def test_validate_reports_bad_task_options_with_lines(runjob_tester):
    runjob_tester.write_job(
        "job.toml",
        """
        [model]
        name = "resnet18"
        [dataset]
        name = "synthetic"
        [task]
        name = "segmentation"
        label_smoothing = 1.0
        ignore_index = 2.5
        """,
    )
    result = runjob_tester.cli("validate", "job.toml")
    assert result.returncode == 2
    assert result.stderr_lines[:2] == [
        "runjob: job.toml:7: task.label_smoothing: Input should be less than 1 (got 1.0)",
        "runjob: job.toml:8: task.ignore_index: Input should be a valid integer (got 2.5)",
    ]
    assert "Traceback" not in result.stderr


def test_validate_shows_the_task_defaults(runjob_tester):
    import tomllib

    runjob_tester.write_job(
        "job.toml", '[model]\nname = "resnet18"\n[dataset]\nname = "synthetic"\n[task]\nname = "segmentation"\n'
    )
    result = runjob_tester.cli("validate", "job.toml")
    assert result.returncode == 0, result.stderr
    task = tomllib.loads(result.stdout)["task"]
    assert task == {"name": "segmentation", "ignore_index": -100, "label_smoothing": 0.0}


# ---------------------------------------------------------------------------------------------
# Through the real host: a synthetic shapes dataset and a tiny fully-convolutional model

SHAPES_PLUGIN = """
    import torch
    from pydantic import Field

    import runjob

    IGNORE = 255  # the border of each rectangle, as Pascal VOC marks object borders


    class ShapesOptions(runjob.Options):
        num_train: int = Field(384, ge=1)
        num_val: int = Field(128, ge=1)
        size: int = Field(16, ge=12)
        num_classes: int = Field(4, ge=2)
        seed: int = 0


    def make_split(count, size, num_classes, seed):
        # noise, and one rectangle a sample: class 1.. its brightness, its border pixels IGNORE
        g = torch.Generator().manual_seed(seed)
        images = torch.randn(count, 1, size, size, generator=g) * 0.5
        labels = torch.randint(1, num_classes, (count,), generator=g)
        height = torch.randint(5, 11, (count,), generator=g)
        width = torch.randint(5, 11, (count,), generator=g)
        top = (torch.rand(count, generator=g) * (size - height + 1)).long()
        left = (torch.rand(count, generator=g) * (size - width + 1)).long()
        rows = torch.arange(size).view(1, size, 1)
        columns = torch.arange(size).view(1, 1, size)

        def box(top, left, height, width):
            top, left, height, width = (t.view(-1, 1, 1) for t in (top, left, height, width))
            return (rows >= top) & (rows < top + height) & (columns >= left) & (columns < left + width)

        inside = box(top, left, height, width)
        border = inside & ~box(top + 1, left + 1, height - 2, width - 2)
        masks = torch.where(inside, labels.view(-1, 1, 1), 0)
        masks = torch.where(border, IGNORE, masks)
        images = images + inside.unsqueeze(1) * labels.float().view(-1, 1, 1, 1)
        return images, masks


    def build_shapes(options):
        from torch.utils.data import TensorDataset

        train = make_split(options.num_train, options.size, options.num_classes, options.seed)
        val = make_split(options.num_val, options.size, options.num_classes, options.seed + 1)
        return runjob.DatasetSplits(TensorDataset(*train), TensorDataset(*val), num_classes=options.num_classes)


    class TinyFCNOptions(runjob.Options):
        num_classes: int = Field(4, ge=2)
        channels: int = Field(16, ge=1)


    def build_tiny_fcn(options):
        from torch import nn

        width = options.channels
        return nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, options.num_classes, 3, padding=1),
        )


    @runjob.hookimpl
    def runjob_register_datasets(register):
        register("shapes", build_shapes, options=ShapesOptions, description="test data: a bright rectangle a class")


    @runjob.hookimpl
    def runjob_register_models(register):
        register("tiny_fcn", build_tiny_fcn, options=TinyFCNOptions, description="test model: three 3x3 convolutions")
"""

SHAPES_JOB = """
    [job]
    name = "shapes"
    [model]
    name = "tiny_fcn"
    num_classes = 4
    [dataset]
    name = "shapes"
    num_classes = 4
    [task]
    name = "segmentation"
    ignore_index = 255
    [optimizer]
    name = "adamw"
    lr = 0.01
    [train]
    epochs = 8
    batch_size = 32
    cpu = true
    [tracking]
    log_model = "none"
"""


def all_background_miou(masks: torch.Tensor, ignore_index: int) -> float:
    """The mIoU of predicting class 0 everywhere: background's IoU is its share of the counted
    pixels; every other class in the masks has an IoU of 0."""
    counted = masks[masks != ignore_index]
    background = (counted == 0).sum().item() / counted.numel()
    return background / counted.unique().numel()


def test_segmentation_learns_through_the_host(runjob_tester):
    runjob_tester.install_plugin("fake-shapes", {"fake_shapes": SHAPES_PLUGIN})
    runjob_tester.write_job("job.toml", SHAPES_JOB)
    run = runjob_tester.run("job.toml")
    assert run.status == "FINISHED", run

    import fake_shapes

    _, val_masks = fake_shapes.make_split(128, 16, 4, seed=1)
    baseline = all_background_miou(val_masks, ignore_index=255)
    metrics = run.mlflow.metrics
    print(f"val/miou {metrics['val/miou']:.3f} against {baseline:.3f} for all background")
    assert metrics["val/miou"] > baseline + 0.5
    assert len(run.mlflow.history("val/miou")) == 8
    assert metrics["val/pixel_accuracy"] > 0.95
    losses = [value for _, value in run.mlflow.history("val/loss")]
    assert losses[-1] < losses[0]


def test_a_model_with_the_wrong_classes_stops_at_the_first_batch(runjob_tester):
    runjob_tester.install_plugin("fake-shapes", {"fake_shapes": SHAPES_PLUGIN})
    runjob_tester.write_job("job.toml", SHAPES_JOB)
    result = runjob_tester.cli("job.toml", "--set", "model.num_classes=3", "--set", "tracking.offline=true")
    assert result.returncode != 0
    expected = (
        "model 'tiny_fcn' does not fit task 'segmentation' with dataset 'shapes': outputs of shape (32, 3, 16, 16), "
        "but the dataset has 4 classes and masks of shape (32, 16, 16): set model.num_classes = 4"
    )
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
