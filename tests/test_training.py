"""End to end: real data trains, the record is complete, and failures end clearly and FAILED."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_plugin_dist, write_job
from test_validation import CONTRACT

pytestmark = pytest.mark.timeout(900)


def mlflow_client(tmp_path):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")


def only_run(tmp_path, experiment: str):
    client = mlflow_client(tmp_path)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r}"
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1, f"expected one run, found {len(runs)}"
    return client, runs[0]


def evaluate_saved_weights(weights: Path, val_root: Path) -> float:
    """Accuracy of model.safetensors on the validation images, computed independently of runjob."""
    import torch
    import torchvision
    from safetensors.torch import load_file
    from torchvision import transforms

    model = torchvision.models.resnet18(num_classes=10)
    model.load_state_dict(load_file(weights))
    model.eval()
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    data = torchvision.datasets.ImageFolder(str(val_root), transform=tf)
    loader = torch.utils.data.DataLoader(data, batch_size=128)
    correct = 0
    with torch.no_grad():
        for inputs, targets in loader:
            correct += (model(inputs).argmax(1) == targets).sum().item()
    return correct / len(data)


def test_contract_job_learns_and_leaves_a_complete_record(runjob_cli, tmp_path, digits_folder):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "digits").symlink_to(digits_folder)
    write_job(tmp_path / "job.toml", CONTRACT.format(root="data/digits"))  # exactly the contract job

    result = runjob_cli("job.toml")
    assert result.returncode == 0, result.stderr[-3000:]
    (out,) = (tmp_path / "runs" / "digits-resnet18").iterdir()
    assert {p.name for p in out.iterdir()} >= {"job.toml", "metrics.jsonl", "model.safetensors"}
    assert "epoch 3/3" in result.stdout

    client, run = only_run(tmp_path, "digits-resnet18")
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "digits-resnet18"
    params = run.data.params
    assert params["optimizer.lr"] == "0.001" and params["model.name"] == "resnet18"
    assert params["train.epochs"] == "3" and params["dataset.root"] == str(tmp_path / "data" / "digits")
    assert run.data.tags["runjob.distributed_type"] == "NO" and run.data.tags["runjob.world_size"] == "1"
    assert run.data.tags["runjob.plugin.torchvision_models"] == "runjob-train 0.1.0"

    accuracy = client.get_metric_history(run.info.run_id, "val/accuracy")
    assert [m.step for m in accuracy] == [44, 88, 132]  # 1,437 training images, 32 a batch, last partial dropped
    assert accuracy[-1].value > 0.8, "ResNet-18 should learn the digits well above chance (0.1)"
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in losses][:3] == [10, 20, 30]
    assert losses[-1].value < losses[0].value
    assert {m.key for m in client.get_metric_history(run.info.run_id, "lr")} == {"lr"}

    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert {(l["key"], l["step"], l["value"]) for l in lines if l["key"] == "val/accuracy"} == {
        ("val/accuracy", m.step, m.value) for m in accuracy
    }
    assert len([l for l in lines if l["key"] == "train/loss"]) == len(losses)

    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"job.toml", "model.safetensors"} <= artifacts
    # the saved weights are the trained model: evaluated independently, they score what was logged
    assert evaluate_saved_weights(out / "model.safetensors", digits_folder / "val") == pytest.approx(
        accuracy[-1].value, abs=1e-6
    )
    # the recorded job reruns as it is
    rerun = runjob_cli("validate", str(out / "job.toml"))
    assert rerun.returncode == 0 and rerun.stdout == (out / "job.toml").read_text()


EVENT_PLUGIN = """
    import json, os
    import runjob

    def note(**fields):
        with open(os.environ["EVENTS_FILE"], "a") as f:
            f.write(json.dumps(fields) + "\\n")

    @runjob.hookimpl
    def runjob_run_start(run):
        note(event="start", steps=len(run.train_loader), run_id=run.mlflow_run_id)

    @runjob.hookimpl
    def runjob_after_step(run, step, loss):
        note(event="step", step=step, loss=float(loss))

    @runjob.hookimpl
    def runjob_after_log(step, metrics):
        note(event="log", step=step, metrics=metrics)

    @runjob.hookimpl
    def runjob_after_evaluation(epoch, step, metrics):
        note(event="eval", epoch=epoch, step=step, metrics=metrics)

    @runjob.hookimpl
    def runjob_run_end(status, error):
        note(event="end", status=status, error=repr(error) if error else None)
"""

SMALL_DIGITS = """
    [job]
    name = "{name}"
    [model]
    name = "resnet18"
    num_classes = 10
    [dataset]
    name = "digits"
    image_size = 16
    [train]
    batch_size = 32
"""


def test_event_hooks_schedule_and_accumulation(runjob_cli, tmp_path, monkeypatch):
    site = make_plugin_dist(
        tmp_path / "site", "fake-events", "1.0", {"events": "fake_events"}, {"fake_events": EVENT_PLUGIN}
    )
    events_file = tmp_path / "events.jsonl"
    monkeypatch.setenv("EVENTS_FILE", str(events_file))
    write_job(tmp_path / "job.toml", SMALL_DIGITS.format(name="hooks"))
    result = runjob_cli(
        "job.toml",
        "--set",
        "train.max_steps=7",
        "--set",
        "train.log_every=3",
        "--set",
        "train.gradient_accumulation_steps=2",
        "--set",
        "scheduler.name=cosine",
        "--set",
        "scheduler.warmup_steps=2",
        "--set",
        "optimizer.lr=0.01",
        extra_path=[site],
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(l) for l in events_file.read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and events[-1]["status"] == "FINISHED"
    assert events[0]["run_id"]
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 8))
    logs = [e for e in events if e["event"] == "log"]
    assert [e["step"] for e in logs] == [3, 6, 7]
    assert [e["step"] for e in events if e["event"] == "eval"] == [7]

    from runjob.plugins.schedulers import cosine_factor

    # lr after `step` optimizer steps follows warm-up then cosine over the 7 steps
    for log in logs:
        assert log["metrics"]["lr"] == pytest.approx(0.01 * cosine_factor(log["step"], 7, 2, 0.0))

    client, run = only_run(tmp_path, "hooks")
    assert run.data.tags["runjob.overrides"].startswith("train.max_steps=7")
    assert run.data.params["train.gradient_accumulation_steps"] == "2"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [3, 6, 7]


def test_model_that_does_not_fit_the_data_fails_clearly(runjob_cli, tmp_path):
    write_job(tmp_path / "job.toml", SMALL_DIGITS.format(name="misfit"))
    result = runjob_cli("job.toml", "--set", "model.num_classes=5")
    assert result.returncode == 2
    assert (
        "runjob: model 'resnet18' gives outputs of shape (32, 5), but dataset 'digits' has 10 classes: set model.num_classes = 10"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
    _, run = only_run(tmp_path, "misfit")
    assert run.info.status == "FAILED"
    assert "set model.num_classes = 10" in run.data.tags["runjob.error"]


def test_fp16_on_a_cpu_is_refused_before_anything_runs(runjob_cli, tmp_path):
    write_job(tmp_path / "job.toml", SMALL_DIGITS.format(name="fp16"))
    result = runjob_cli("job.toml", "--set", "train.mixed_precision=fp16")
    assert result.returncode == 2
    assert "train.mixed_precision = 'fp16' needs a GPU" in result.stderr and "bf16" in result.stderr
    assert not (tmp_path / "runs").exists()
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_experiment_by_name("fp16") is None


def make_images(root: Path, sizes: dict[str, tuple[int, int]]) -> Path:
    from PIL import Image

    for split in ("train", "val"):
        for index, (name, size) in enumerate(sizes.items()):
            folder = root / split / f"class{index % 2}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", size, color=(index * 40, 0, 0)).save(folder / name)
    return root


IMAGE_JOB = """
    [job]
    name = "{name}"
    [model]
    name = "resnet18"
    num_classes = 2
    [dataset]
    name = "imagefolder"
    root = "imgs"
    [train]
    batch_size = 4
    max_steps = 1
"""


def test_unreadable_image_is_named(runjob_cli, tmp_path):
    make_images(tmp_path / "imgs", {f"{i}.png": (16, 16) for i in range(6)})
    (tmp_path / "imgs" / "train" / "class0" / "broken.png").write_bytes(b"not a png")
    write_job(tmp_path / "job.toml", IMAGE_JOB.format(name="broken"))
    result = runjob_cli("job.toml", "--set", "train.batch_size=7", "--set", "dataset.num_workers=1")
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"runjob: cannot read image {tmp_path / 'imgs' / 'train' / 'class0' / 'broken.png'}" in result.stderr
    assert "Traceback" not in result.stderr


def test_images_of_different_sizes_get_advice(runjob_cli, tmp_path):
    make_images(tmp_path / "imgs", {"a.png": (16, 16), "b.png": (20, 16), "c.png": (16, 16), "d.png": (20, 16)})
    write_job(tmp_path / "job.toml", IMAGE_JOB.format(name="sizes"))
    result = runjob_cli("job.toml")
    assert result.returncode == 2
    assert "inputs in one batch have different shapes" in result.stderr and "dataset.image_size" in result.stderr
    resized = runjob_cli("job.toml", "--set", "dataset.image_size=16", "--output-dir", "resized")
    assert resized.returncode == 0, resized.stderr[-2000:]


def test_output_dir_holding_a_run_is_not_overwritten(runjob_cli, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "job.toml").write_text("# an earlier run\n")
    write_job(tmp_path / "job.toml", SMALL_DIGITS.format(name="exists"))
    result = runjob_cli("job.toml", "--output-dir", "out")
    assert result.returncode == 2
    assert "already holds a run" in result.stderr
    assert (tmp_path / "out" / "job.toml").read_text() == "# an earlier run\n"


def test_headline_job_runs_on_cifar_files_the_test_wrote(runjob_cli, tmp_path):
    from conftest import REPO, write_cifar_batches

    write_cifar_batches(tmp_path / "cifar", per_batch=16)
    result = runjob_cli(
        str(REPO / "jobs" / "resnet_cifar.toml"),
        "--set",
        "dataset.root=cifar",
        "--set",
        "dataset.download=false",
        "--set",
        "dataset.verify=false",
        "--set",
        "dataset.num_workers=0",
        "--set",
        "dataset.persistent_workers=false",
        "--set",
        "train.max_steps=2",
        "--set",
        "train.batch_size=8",
        "--set",
        "train.mixed_precision=no",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _, run = only_run(tmp_path, "cifar10")
    assert run.info.status == "FINISHED"
    assert run.data.params["model.cifar_stem"] == "true"
    assert run.data.params["scheduler.name"] == "onecycle"


def test_same_job_and_seed_give_the_same_weights(runjob_cli, tmp_path):
    write_job(tmp_path / "job.toml", SMALL_DIGITS.format(name="seeded"))
    steps = ("--set", "train.max_steps=3")
    for out in ("a", "b"):
        result = runjob_cli("job.toml", *steps, "--output-dir", out)
        assert result.returncode == 0, result.stderr[-2000:]
    other = runjob_cli("job.toml", *steps, "--set", "job.seed=1", "--output-dir", "c")
    assert other.returncode == 0, other.stderr[-2000:]
    weights = {out: (tmp_path / out / "model.safetensors").read_bytes() for out in "abc"}
    assert weights["a"] == weights["b"]
    assert weights["a"] != weights["c"]


def test_fsdp_on_a_cpu_stops_instead_of_training_ddp(runjob_cli, tmp_path):
    write_job(tmp_path / "job.toml", SMALL_DIGITS.format(name="fsdp"))
    result = runjob_cli("job.toml", "--set", "strategy.name=fsdp")
    assert result.returncode == 2
    assert "strategy.name = 'fsdp' needs FSDP (FSDP needs CUDA GPUs), but Accelerate set up NO" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()  # stopped before the output folder or an MLflow run


def test_deepspeed_without_its_extra_says_how_to_install(runjob_cli, tmp_path):
    write_job(tmp_path / "job.toml", SMALL_DIGITS.format(name="ds"))
    result = runjob_cli("job.toml", "--set", "strategy.name=deepspeed", "--set", "strategy.zero_stage=3")
    assert result.returncode == 2
    assert "pip install 'runjob-train[deepspeed]'" in result.stderr


def test_secrets_never_reach_mlflow(runjob_cli, tmp_path):
    write_job(
        tmp_path / "job.toml",
        SMALL_DIGITS.format(name="secrets") + '\n[tracking.tags]\nwarehouse = "postgresql://me:hunter2@db/x"\n',
    )
    result = runjob_cli("job.toml", "--set", "train.max_steps=1", "--set", "tracking.tags.api_token=abc123")
    assert result.returncode == 0, result.stderr[-2000:]
    client, run = only_run(tmp_path, "secrets")
    recorded = json.dumps([run.data.params, run.data.tags])
    artifact = Path(client.download_artifacts(run.info.run_id, "job.toml", str(tmp_path))).read_text()
    for secret in ("hunter2", "abc123"):
        assert secret not in recorded and secret not in artifact
    assert run.data.tags["warehouse"] == "postgresql://me:***@db/x" and run.data.tags["api_token"] == "***"
    (out,) = (tmp_path / "runs" / "secrets").iterdir()
    assert "abc123" in (out / "job.toml").read_text()  # the local job stays complete, to run again


def test_poisoned_learning_rate_stops_with_advice(runjob_cli, tmp_path):
    write_job(tmp_path / "job.toml", SMALL_DIGITS.format(name="poison"))
    result = runjob_cli(
        "job.toml",
        "--set",
        "optimizer.name=sgd",
        "--set",
        "optimizer.lr=1e6",
        "--set",
        "train.max_steps=20",
        "--set",
        "train.log_every=5",
    )
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert (
        "became NaN or infinite at step" in message
        and "optimizer.lr, now 1e+06" in message
        and "train.max_grad_norm" in message
    )
    assert "Traceback" not in result.stderr
    _, run = only_run(tmp_path, "poison")
    assert run.info.status == "FAILED" and "NaN or infinite" in run.data.tags["runjob.error"]
    skipping = runjob_cli(
        "job.toml",
        "--set",
        "optimizer.name=sgd",
        "--set",
        "optimizer.lr=1e6",
        "--set",
        "train.max_steps=20",
        "--set",
        "train.log_every=5",
        "--set",
        "train.on_nonfinite=skip",
        "--output-dir",
        "skip",
    )
    assert skipping.returncode == 0, skipping.stderr[-2000:]
    skipped = [
        json.loads(l)
        for l in (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()
        if "nonfinite_skipped" in l
    ]
    assert skipped and skipped[-1]["value"] > 0


OOM_PLUGIN = """
    import runjob

    class Greedy:
        def __init__(self):
            import torch
            self.calls = 0
            self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(768, 10))
        def __call__(self, inputs):
            import torch
            self.calls += 1
            if self.calls == 3:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
            return self.net(inputs)

    def build(options):
        import torch

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.greedy = Greedy()
                self.net = self.greedy.net
            def forward(self, inputs):
                return self.greedy(inputs)
        return Model()

    @runjob.hookimpl
    def runjob_register_models(register):
        register("greedy", build)
"""


def test_out_of_memory_names_the_batch_size_and_remedies(runjob_cli, tmp_path):
    site = make_plugin_dist(
        tmp_path / "site", "fake-greedy", "1.0", {"greedy": "fake_greedy"}, {"fake_greedy": OOM_PLUGIN}
    )
    write_job(
        tmp_path / "job.toml",
        SMALL_DIGITS.format(name="oom").replace('name = "resnet18"\n    num_classes = 10', 'name = "greedy"'),
    )
    result = runjob_cli("job.toml", extra_path=[site])
    assert result.returncode == 2, result.stderr[-2000:]
    message = result.stderr.strip().splitlines()[-1]
    assert "out of memory on cpu at step 3 with train.batch_size = 32 per process" in message
    assert "train.gradient_accumulation_steps" in message and "bf16" in message
    assert "Traceback" not in result.stderr
