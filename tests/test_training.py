"""Training: real data trains, the record is complete, and failures end clearly and FAILED.

The contract job runs as the user runs it (``runjob job.toml`` in a process of its own, ResNet-18
for three epochs); everything else runs the command line in this process (``runjob_tester.cli``)
with the kit's tiny model wherever the model plays no part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import REPO, SMALL_DIGITS, installed_plugin_tags, write_cifar_batches
from test_validation import CONTRACT

pytestmark = pytest.mark.timeout(900)


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


@pytest.mark.e2e
def test_contract_job_learns_and_leaves_a_complete_record(runjob_tester, digits_folder):
    tmp_path = runjob_tester.path
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "digits").symlink_to(digits_folder)
    runjob_tester.write_job("job.toml", CONTRACT.format(root="data/digits"))  # exactly the contract job

    # one torch thread: the other xdist worker has the other core (a busy machine must not fail it)
    result = runjob_tester.cli_subprocess("job.toml", timeout=850)
    assert result.returncode == 0, result.stderr[-3000:]
    (out,) = (tmp_path / "runs" / "digits-png-resnet18").iterdir()
    assert {p.name for p in out.iterdir()} >= {"job.toml", "metrics.jsonl", "model.safetensors"}
    assert "epoch 3/3" in result.stdout

    run = runjob_tester.only_run("digits-png-resnet18")
    assert run.status == "FINISHED"
    assert run.run_name == f"{out.name} · digits-png-resnet18", "its folder's name (the time), then the job's"
    params = run.params
    assert params["optimizer.lr"] == "0.001" and params["model.name"] == "resnet18"
    assert params["train.epochs"] == "3" and params["dataset.root"] == str(tmp_path / "data" / "digits")
    assert run.tags["runjob.distributed_type"] == "NO" and run.tags["runjob.world_size"] == "1"
    assert run.tags["runjob.version"] == "0.1.0", "the built-in plugins' version: no runjob.plugin.* tag for them"
    assert {tag for tag in run.tags if tag.startswith("runjob.plugin.")} == installed_plugin_tags()
    assert not [key for key in run.params if key.startswith("callbacks.")], "the callbacks on by default, as they are"

    accuracy = run.history("val/accuracy")
    assert [step for step, _ in accuracy] == [44, 88, 132]  # 1,437 training images, 32 a batch, last partial dropped
    assert accuracy[-1][1] > 0.8, "ResNet-18 should learn the digits well above chance (0.1)"
    losses = run.history("train/loss")
    assert [step for step, _ in losses][:3] == [10, 20, 30]
    assert losses[-1][1] < losses[0][1]
    assert run.history("lr")

    record = runjob_tester.record(out)
    assert record.run_id == run.run_id
    assert set(record.local_history("val/accuracy")) == set(accuracy)
    assert len(record.local_history("train/loss")) == len(losses)

    assert "job.toml" in run.artifacts() and run.models() == {"digits-png-resnet18"}, "the weights, named after the job"
    # the saved weights are the trained model: evaluated independently, they score what was logged
    assert evaluate_saved_weights(out / "model.safetensors", digits_folder / "val") == pytest.approx(
        accuracy[-1][1], abs=1e-6
    )
    # the recorded job reruns as it is
    rerun = runjob_tester.cli("validate", str(out / "job.toml"))
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


def test_event_hooks_schedule_and_accumulation(tester, monkeypatch):
    tester.install_plugin("fake-events", {"fake_events": EVENT_PLUGIN}, {"events": "fake_events"})
    events_file = tester.path / "events.jsonl"
    monkeypatch.setenv("EVENTS_FILE", str(events_file))
    tester.write_job("job.toml", SMALL_DIGITS.format(name="hooks"))
    result = tester.cli(
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
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and events[-1]["status"] == "FINISHED"
    assert events[0]["run_id"]
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 8))
    logs = [e for e in events if e["event"] == "log"]
    assert [e["step"] for e in logs] == [3, 6, 7]
    assert [e["step"] for e in events if e["event"] == "eval"] == [7]

    from runjob_builtins.schedulers import cosine_factor

    # lr after `step` optimizer steps follows warm-up then cosine over the 7 steps
    for log in logs:
        assert log["metrics"]["lr"] == pytest.approx(0.01 * cosine_factor(log["step"], 7, 2, 0.0))

    run = tester.only_run("hooks")
    assert run.tags["runjob.overrides"].startswith("train.max_steps=7")
    assert run.params["train.gradient_accumulation_steps"] == "2"
    assert run.steps("train/loss") == [3, 6, 7]


def test_model_that_does_not_fit_the_data_fails_clearly(tester):
    tester.write_job("job.toml", SMALL_DIGITS.format(name="misfit"))
    result = tester.cli("job.toml", "--set", "model.num_classes=5")
    assert result.returncode == 2
    assert (
        "runjob: model 'tiny_cnn' does not fit task 'classification' with dataset 'digits': outputs of shape "
        "(32, 5), but the dataset has 10 classes: set model.num_classes = 10" in result.stderr
    )
    assert "Traceback" not in result.stderr
    run = tester.only_run("misfit")
    assert run.status == "FAILED"
    assert "set model.num_classes = 10" in run.tags["runjob.error"]


def test_fp16_on_a_cpu_is_refused_before_anything_runs(tester):
    tester.write_job("job.toml", SMALL_DIGITS.format(name="fp16"))
    result = tester.cli("job.toml", "--set", "train.mixed_precision=fp16")
    assert result.returncode == 2
    assert "train.mixed_precision = 'fp16' needs a GPU" in result.stderr and "bf16" in result.stderr
    assert not (tester.path / "runs").exists()
    assert not tester.has_experiment("fp16")


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
    name = "tiny_cnn"
    num_classes = 2
    [dataset]
    name = "imagefolder"
    root = "imgs"
    [train]
    batch_size = 4
    max_steps = 1
"""


@pytest.mark.e2e
def test_unreadable_image_is_named(tester):
    make_images(tester.path / "imgs", {f"{i}.png": (16, 16) for i in range(6)})
    (tester.path / "imgs" / "train" / "class0" / "broken.png").write_bytes(b"not a png")
    tester.write_job("job.toml", IMAGE_JOB.format(name="broken"))
    # a DataLoader worker process reads the broken image: its error is shown without the worker traceback
    result = tester.cli("job.toml", "--set", "train.batch_size=7", "--set", "dataset.num_workers=1")
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"runjob: cannot read image {tester.path / 'imgs' / 'train' / 'class0' / 'broken.png'}" in result.stderr
    assert "Traceback" not in result.stderr

    # as a command of its own: the recording process (MLflow's side of the run) is told to end, not
    # left waiting for its pipe to close while the failed DataLoader's worker still holds a copy
    ended = tester.cli_subprocess(
        "job.toml", "--set", "train.batch_size=7", "--set", "dataset.num_workers=1", "--output-dir", "sub", timeout=120
    )
    assert ended.returncode == 2 and "broken.png" in ended.stderr, ended.stderr[-2000:]
    assert tester.record(tester.path / "sub").record["status"] == "FAILED"


def test_images_of_different_sizes_get_advice(tester):
    make_images(tester.path / "imgs", {"a.png": (16, 16), "b.png": (20, 16), "c.png": (16, 16), "d.png": (20, 16)})
    tester.write_job("job.toml", IMAGE_JOB.format(name="sizes"))
    result = tester.cli("job.toml")
    assert result.returncode == 2
    assert "inputs in one batch have different shapes" in result.stderr and "dataset.image_size" in result.stderr
    resized = tester.cli("job.toml", "--set", "dataset.image_size=16", "--output-dir", "resized")
    assert resized.returncode == 0, resized.stderr[-2000:]


def test_output_dir_holding_a_run_is_not_overwritten(tester):
    (tester.path / "out").mkdir()
    (tester.path / "out" / "job.toml").write_text("# an earlier run\n")
    tester.write_job("job.toml", SMALL_DIGITS.format(name="exists"))
    result = tester.cli("job.toml", "--output-dir", "out")
    assert result.returncode == 2
    assert "already holds a run" in result.stderr
    assert (tester.path / "out" / "job.toml").read_text() == "# an earlier run\n"


def test_headline_job_runs_on_cifar_files_the_test_wrote(runjob_tester):
    write_cifar_batches(runjob_tester.path / "cifar", per_batch=16)
    result = runjob_tester.cli(
        REPO / "jobs" / "resnet_cifar.toml",
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
    run = runjob_tester.only_run("cifar10")
    assert run.status == "FINISHED"
    assert run.params["model.cifar_stem"] == "true"
    assert run.params["scheduler.name"] == "onecycle"


def test_same_job_and_seed_give_the_same_weights(tester):
    tester.write_job("job.toml", SMALL_DIGITS.format(name="seeded"))
    steps = ("--set", "train.max_steps=3")
    for out in ("a", "b"):
        result = tester.cli("job.toml", *steps, "--output-dir", out)
        assert result.returncode == 0, result.stderr[-2000:]
    other = tester.cli("job.toml", *steps, "--set", "job.seed=1", "--output-dir", "c")
    assert other.returncode == 0, other.stderr[-2000:]
    weights = {out: (tester.path / out / "model.safetensors").read_bytes() for out in "abc"}
    assert weights["a"] == weights["b"]
    assert weights["a"] != weights["c"]


def test_fsdp_on_a_cpu_stops_instead_of_training_ddp(tester):
    tester.write_job("job.toml", SMALL_DIGITS.format(name="fsdp"))
    result = tester.cli("job.toml", "--set", "strategy.name=fsdp")
    assert result.returncode == 2
    assert "strategy.name = 'fsdp' needs FSDP (FSDP needs CUDA GPUs), but Accelerate set up NO" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tester.path / "runs").exists()  # stopped before the output folder or an MLflow run


def test_deepspeed_without_its_extra_says_how_to_install(tester):
    tester.write_job("job.toml", SMALL_DIGITS.format(name="ds"))
    result = tester.cli("job.toml", "--set", "strategy.name=deepspeed", "--set", "strategy.zero_stage=3")
    assert result.returncode == 2
    assert "pip install 'runjob-train[deepspeed]'" in result.stderr


def test_secrets_never_reach_mlflow(tester):
    tester.write_job(
        "job.toml",
        SMALL_DIGITS.format(name="secrets") + '\n[tracking.tags]\nwarehouse = "postgresql://me:hunter2@db/x"\n',
    )
    result = tester.cli("job.toml", "--set", "train.max_steps=1", "--set", "tracking.tags.api_token=abc123")
    assert result.returncode == 0, result.stderr[-2000:]
    run = tester.only_run("secrets")
    recorded = json.dumps([run.params, run.tags])
    artifact = run.download("job.toml", tester.path / "downloaded").read_text()
    for secret in ("hunter2", "abc123"):
        assert secret not in recorded and secret not in artifact
    assert run.tags["warehouse"] == "postgresql://me:***@db/x" and run.tags["api_token"] == "***"
    (out,) = (tester.path / "runs" / "secrets").iterdir()
    assert "abc123" in (out / "job.toml").read_text()  # the local job stays complete, to run again


def test_poisoned_learning_rate_stops_with_advice(tester):
    tester.write_job("job.toml", SMALL_DIGITS.format(name="poison"))
    poison = ("--set", "optimizer.name=sgd", "--set", "optimizer.lr=1e6", "--set", "train.max_steps=20")
    result = tester.cli("job.toml", *poison, "--set", "train.log_every=5")
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert (
        "became NaN or infinite at step" in message
        and "a lower learning rate (now 1e+06)" in message
        and "train.max_grad_norm" in message
    )
    assert "Traceback" not in result.stderr
    run = tester.only_run("poison")
    assert run.status == "FAILED" and "NaN or infinite" in run.tags["runjob.error"]
    skipping = tester.cli(
        "job.toml", *poison, "--set", "train.log_every=5", "--set", "train.on_nonfinite=skip", "--output-dir", "skip"
    )
    assert skipping.returncode == 0, skipping.stderr[-2000:]
    skipped = tester.record("skip").local_history("train/nonfinite_skipped")
    assert skipped and skipped[-1][1] > 0


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


def test_out_of_memory_names_the_batch_size_and_remedies(runjob_tester):
    runjob_tester.install_plugin("fake-greedy", {"fake_greedy": OOM_PLUGIN}, {"greedy": "fake_greedy"})
    runjob_tester.write_job("job.toml", SMALL_DIGITS.format(name="oom").replace('name = "tiny_cnn"', 'name = "greedy"'))
    result = runjob_tester.cli("job.toml")
    assert result.returncode == 2, result.stderr[-2000:]
    message = result.stderr.strip().splitlines()[-1]
    assert "out of memory on cpu at step 3 with train.batch_size = 32 per process" in message
    assert "train.gradient_accumulation_steps" in message and "bf16" in message
    assert "Traceback" not in result.stderr
