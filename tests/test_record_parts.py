"""Parts of the run's record, checked in-process: where each value came from, FLOP counting, the
local metric record that `runjob sync` reads, and a tracking server that is not there."""

from __future__ import annotations

import json

import pytest
from helpers import SMALL_DIGITS

from runjob.errors import RunjobError, TrackingError
from runjob.host.plugin_host import load_plugins
from runjob.job.validation import load_resolved
from runjob.record.provenance import job_sources
from runjob.testing import free_port, write_job

pytestmark = pytest.mark.timeout(120)


def test_job_sources_name_the_file_line_base_override_or_default(tmp_path):
    write_job(
        tmp_path / "base.toml",
        '[job]\nname = "src"\n[model]\nname = "resnet18"\n[dataset]\nname = "synthetic"\n[tracking]\nuri = "https://me:pw@host"\n',
    )
    write_job(tmp_path / "job.toml", 'extends = "base.toml"\n[optimizer]\nname = "sgd"\nlr = 0.2\n')
    job = load_resolved(tmp_path / "job.toml", ["train.batch_size=8"], load_plugins())
    sources = job_sources(job)
    assert sources["optimizer.lr"] == {
        "value": "0.2",
        "from": "job file",
        "file": str(tmp_path / "job.toml"),
        "line": 4,
    }
    assert sources["model.name"] == {
        "value": "resnet18",
        "from": "extends",
        "file": str(tmp_path / "base.toml"),
        "line": 4,
    }
    assert sources["train.batch_size"] == {"value": "8", "from": "--set"}
    assert sources["train.log_every"] == {"value": "10", "from": "default"}
    assert sources["tracking.uri"]["value"] == "https://me:***@host", "secrets never leave the machine"
    assert set(sources) == set(json.loads(json.dumps(sources)))


def test_flops_are_counted_on_a_shapes_only_model():
    import torch

    from runjob.train.flops import meta_model, training_flops_per_unit
    from runjob_builtins.tasks import Classification, ClassificationOptions, Regression, RegressionOptions

    def build():
        return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))

    rng = torch.get_rng_state()
    shapes_only = meta_model(build)
    assert next(shapes_only.parameters()).device.type == "meta"
    assert torch.equal(rng, torch.get_rng_state()), "building it must not move the seeded random stream"
    # forward: 8*4 multiply-adds = 64 FLOPs; backward: the weight gradient, as many again (the
    # input needs no gradient); BatchNorm's elementwise work is not counted
    regression = Regression(RegressionOptions())
    batch = (torch.zeros(3, 8), torch.zeros(3, 4))
    assert training_flops_per_unit(shapes_only, regression, batch) == pytest.approx(4 * 8 * 4, rel=0.01)
    wrong = (torch.zeros(3, 5), torch.zeros(3, 4))
    assert training_flops_per_unit(meta_model(lambda: torch.nn.Linear(8, 4)), regression, wrong) is None
    import torchvision

    resnet = meta_model(lambda: torchvision.models.resnet18(num_classes=10))
    # ~0.037 GMAC forward on 32x32 (shared/TRAPS.md): 2 FLOPs a MAC, backward about twice forward
    classification = Classification(ClassificationOptions(), num_classes=10)
    images = (torch.zeros(4, 3, 32, 32), torch.zeros(4, dtype=torch.long))
    assert training_flops_per_unit(resnet, classification, images) == pytest.approx(6 * 0.037e9, rel=0.15)


def test_sync_reads_every_point_and_leaves_out_only_a_torn_last_line(tmp_path):
    from runjob.record.local import read_metric_points

    lines = [json.dumps({"key": "train/loss", "value": 1.0 / s, "step": s, "timestamp": 1000 + s}) for s in range(1, 4)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"key": "train/lo')
    (tmp_path / "metrics.node1.jsonl").write_text(
        json.dumps({"key": "system/node1/cpu", "value": 5.0, "step": 0, "timestamp": 9}) + "\n"
    )
    points = read_metric_points(tmp_path)
    assert [(p["key"], p["step"]) for p in points] == [
        ("train/loss", 1),
        ("train/loss", 2),
        ("train/loss", 3),
        ("system/node1/cpu", 0),
    ]
    (tmp_path / "metrics.jsonl").write_text("garbage\n" + "\n".join(lines) + "\n")
    with pytest.raises(RunjobError, match=r"metrics.jsonl:1: not a metric record"):
        read_metric_points(tmp_path)


def test_a_tracking_server_that_is_not_there_is_named_with_the_way_out():
    from runjob.record.uri import check_reachable

    uri = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TrackingError) as refused:
        check_reachable(uri)
    message = str(refused.value)
    assert f"cannot reach the MLflow tracking server at {uri} (tracking.uri)" in message
    assert "tracking.offline = true" in message and "runjob sync" in message
    check_reachable("sqlite:///nowhere/mlflow.db")  # only servers are asked; stores fail on their own


def test_uploads_gather_queued_points_into_few_calls_in_order_and_stop_when_the_server_is_gone():
    from runjob.record.mlflow_writer import Retrying, Uploader

    sent, calls = [], []
    uploader = Uploader(lambda metrics: sent.append(list(metrics)))
    for step in range(1, 301):  # logging every step: 300 steps, 4 points each
        uploader.submit_metrics([(step, k) for k in range(4)], step)
    uploader.submit(lambda: calls.append("tags after step 300"), "tags")
    assert uploader.close(timeout=30)
    assert [point for batch in sent for point in batch] == [(s, k) for s in range(1, 301) for k in range(4)]
    assert len(sent) <= 3 and all(len(batch) <= 1000 for batch in sent)
    assert calls == ["tags after step 300"]

    def refuse(metrics):
        raise ConnectionError("server gone")

    failing = Uploader(refuse, Retrying(sleep=lambda seconds: None))
    failing.submit_metrics([(1, 0)], 1)
    failing.submit(lambda: calls.append("never"), "the run's end")
    assert not failing.close(timeout=30)
    assert failing.failure == "ConnectionError: server gone" and failing.failed_at == "metrics of step 1"
    assert calls == ["tags after step 300"], "nothing is sent once the server stays gone through every retry"


@pytest.mark.parametrize("kind", ["pickle", "pt2"])
def test_the_final_model_is_an_mlflow_model_with_the_saved_weights(tmp_path, kind):
    from types import SimpleNamespace

    import mlflow.pytorch
    import torch
    from safetensors.torch import save_file

    from runjob.record.model_logging import save_mlflow_model

    def build(options):
        return torch.nn.Sequential(torch.nn.Linear(4, 3))

    trained = build(None)
    save_file(trained.state_dict(), tmp_path / "model.safetensors")
    job = SimpleNamespace(
        model=SimpleNamespace(name="tiny", options=None, component=SimpleNamespace(factory=build)),
        tracking=SimpleNamespace(log_model=kind),
    )
    folder = save_mlflow_model(job, tmp_path, torch.zeros(2, 4))
    loaded = mlflow.pytorch.load_model(str(folder))
    inputs = torch.randn(5, 4)
    with torch.no_grad():
        assert torch.equal(loaded(inputs), trained(inputs)), "the logged model must be the trained one, not a fresh one"


def test_a_model_torch_export_refuses_is_an_error_not_a_fallback(tmp_path):
    from types import SimpleNamespace

    import torch
    from safetensors.torch import save_file

    from runjob.errors import TrainingError
    from runjob.record.model_logging import save_mlflow_model

    class DataDependent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x):
            if x.sum() > 0:  # control flow on values: torch.export cannot trace it
                return self.linear(x)
            return -self.linear(x)

    save_file(DataDependent().state_dict(), tmp_path / "model.safetensors")
    job = SimpleNamespace(
        model=SimpleNamespace(
            name="branchy", options=None, component=SimpleNamespace(factory=lambda options: DataDependent())
        ),
        tracking=SimpleNamespace(log_model="pt2"),
    )
    with pytest.raises(
        TrainingError, match=r"tracking.log_model = 'pt2': torch.export could not export model 'branchy'.*'pickle'"
    ):
        save_mlflow_model(job, tmp_path, torch.ones(4))


def test_sync_of_a_folder_that_holds_no_run_is_one_clear_line(tmp_path, capsys):
    from runjob.commands.cli import main

    assert main(["sync", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"runjob: {tmp_path}: no mlflow_run.json here: not the output folder of a runjob run"
    ]


def test_the_logged_model_requires_torch_and_the_package_that_defines_the_model():
    """Not torchvision for every model: the distribution of the model's own class, pinned."""
    import importlib.metadata

    import torch
    import torchvision

    from runjob.record.model_logging import model_requirements

    torch_pin = f"torch=={torch.__version__.split('+')[0]}"
    assert model_requirements(torch.nn.Sequential(torch.nn.Linear(4, 3))) == [torch_pin]
    vision_pin = f"torchvision=={importlib.metadata.version('torchvision').split('+')[0]}"
    assert model_requirements(torchvision.models.resnet18(num_classes=10)) == [torch_pin, vision_pin]


def test_a_pickled_mlflow_model_is_built_by_the_recording_side_from_the_saved_weights(tester):
    """``log_model = "pickle"``: the example input crosses to the recording side as a file, the
    model is rebuilt there from the final weights, and ``mlflow.pytorch`` loads it back."""
    import mlflow.pytorch
    import torch
    from safetensors.torch import load_file

    tester.write_job("job.toml", SMALL_DIGITS.format(name="pickled") + "max_steps = 2\n")
    run = tester.run("job.toml", "tracking.log_model=pickle", output_dir="out")
    assert run.mlflow.models() == {"pickled"} and "model.safetensors" in run.mlflow.artifacts()
    logged = mlflow.pytorch.load_model(f"runs:/{run.run_id}/pickled")
    weights = load_file(str(run.output_dir / "model.safetensors"))
    assert all(torch.equal(logged.state_dict()[k], v) for k, v in weights.items()), "the trained weights"
    with torch.no_grad():
        assert logged.eval()(torch.randn(3, 3, 16, 16)).shape == (3, 10)
