"""Starting from a trained model: ``model.init_from`` (a run's folder, an MLflow run, a file),
``model.weights`` (torchvision's pretrained weights, offline), ``model.freeze`` and the optimizer's
parameter groups. The kit's ``tiny_cnn`` (parameters ``0.weight``, ``0.bias``: the convolution;
``4.weight``, ``4.bias``: the linear head) trains a few steps, so each run takes seconds."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def job_text(name: str, model: str = "", optimizer: str = "", tracking: str = 'log_model = "none"') -> str:
    return f"""
    [job]
    name = "{name}"
    [model]
    name = "tiny_cnn"
    {model}
    [dataset]
    name = "digits"
    image_size = 16
    [optimizer]
    name = "adamw"
    {optimizer}
    [train]
    batch_size = 32
    max_steps = 2
    log_every = 1
    [tracking]
    {tracking}
    """


def test_fine_tune_from_a_run_folder_frozen_part_and_groups(tester, capsys):
    tester.write_job("first.toml", job_text("first"))
    first = tester.run("first.toml", output_dir=tester.path / "first")
    assert first.run_id

    tester.write_job(
        "second.toml",
        job_text(
            "second",
            model=f'init_from = "{first.output_dir}"\n    freeze = ["0\\\\."]',
            optimizer="lr = 0.001\n    weight_decay = 0.05\n    no_decay_norm_and_bias = true\n"
            '    groups = [{ params = "4\\\\.weight", lr = 0.01 }]',
        ),
    )
    capsys.readouterr()
    second = tester.run("second.toml", output_dir=tester.path / "second")
    said = capsys.readouterr().out

    # the convolution came from the first run and, frozen, stayed as it was; the head trained on
    before, after = weights(first.output_dir / "model.safetensors"), weights(second.output_dir / "model.safetensors")
    assert before["0.weight"].equal(after["0.weight"]) and before["0.bias"].equal(after["0.bias"])
    assert not before["4.weight"].equal(after["4.weight"])
    assert (
        f"runjob: model.init_from: {first.output_dir / 'model.safetensors'} (MLflow run {first.run_id}): 4 of 4" in said
    )
    assert "runjob: frozen: 2 of 4 parameter tensors (224 of 1,514 weights), e.g. 0.weight, 0.bias" in said
    assert (
        "runjob: optimizer groups: default 1 tensors, 1 of them without weight decay; '4\\\\.weight' 1 tensors" in said
    )

    # lineage on the MLflow run and in the local record
    for tags in (second.mlflow.tags, second.tags):
        assert tags["runjob.init_from"] == str(first.output_dir)
        assert tags["runjob.init_from.run_id"] == first.run_id
    assert second.params["model.init_from"] == str(first.output_dir)

    # the optimizer's groups, as the checkpoint keeps them: frozen parameters left out
    import torch

    (checkpoint,) = (second.output_dir / "checkpoints").iterdir()
    groups = torch.load(checkpoint / "optimizer.bin", weights_only=True)["param_groups"]
    assert [(g["param_names"], g["lr"], g["weight_decay"]) for g in groups] == [
        (["4.bias"], 0.001, 0.0),
        (["4.weight"], 0.01, 0.05),
    ]
    # and a resume loads that state into the same groups and goes on
    resumed = tester.run("second.toml", "train.max_steps=3", output_dir=second.output_dir, resume=True)
    assert [step for step, _ in resumed.local_history("train/loss")] == [1, 2, 3]
    assert weights(resumed.output_dir / "model.safetensors")["0.weight"].equal(before["0.weight"])


def test_init_from_an_mlflow_run_and_a_file_with_another_head(tester, capsys):
    from safetensors.torch import save_file

    tester.write_job("first.toml", job_text("first"))
    first = tester.run("first.toml", output_dir=tester.path / "first")

    tester.write_job("from_run.toml", job_text("from_run", model=f'init_from = "runs:/{first.run_id}"'))
    capsys.readouterr()
    from_run = tester.run("from_run.toml", output_dir=tester.path / "from_run")
    assert (
        f"model.safetensors of MLflow run {first.run_id} (MLflow run {first.run_id}): 4 of 4" in capsys.readouterr().out
    )
    assert from_run.mlflow.tags["runjob.init_from"] == f"runs:/{first.run_id}"
    assert from_run.mlflow.tags["runjob.init_from.run_id"] == first.run_id

    # its one evaluation was the best: MLflow stores those weights once, the record of models names them
    assert first.mlflow.artifacts("best") == set()
    best, tags = json.loads((first.output_dir / "models.json").read_text())["best"], first.mlflow.tags
    assert (best["weights"], best["artifact"]) == ("best/model.safetensors", "model.safetensors")
    assert best["summary"] == f"val/accuracy {float(tags['runjob.best.value']):.4g} at step {tags['runjob.best.step']}"
    assert "models.json" in first.mlflow.artifacts()
    tester.write_job("from_best.toml", job_text("from_best", model=f'init_from = "runs:/{first.run_id}/best"'))
    capsys.readouterr()
    tester.run("from_best.toml", "tracking.offline=true", output_dir=tester.path / "from_best")
    assert f"best/model.safetensors of MLflow run {first.run_id} (MLflow run {first.run_id}): 4 of 4" in (
        capsys.readouterr().out
    )

    # a file whose head has 12 classes: the convolution is loaded, the head keeps the fresh init
    state = weights(first.output_dir / "model.safetensors")
    state["4.weight"], state["4.bias"] = state["4.weight"].new_zeros(12, 128), state["4.bias"].new_zeros(12)
    save_file(state, str(tester.path / "twelve.safetensors"))
    tester.write_job(
        "from_file.toml",
        job_text("from_file", model='init_from = "twelve.safetensors"', tracking="offline = true"),
    )
    capsys.readouterr()
    tester.run("from_file.toml", output_dir=tester.path / "from_file")
    said = capsys.readouterr().out
    assert (
        "2 of 4 tensors; re-initialised, their shape differs (the model's fresh init kept): "
        "4.weight [10, 128] here, [12, 128] there, 4.bias [10] here, [12] there"
    ) in said, said


def test_mistakes_found_when_the_model_is_built_are_one_line_naming_the_key(tester):
    from safetensors.torch import save_file

    tester.write_job("first.toml", job_text("first", tracking="offline = true"))
    first = tester.run("first.toml", output_dir=tester.path / "first")
    state = weights(first.output_dir / "model.safetensors")
    state["extra.weight"] = state.pop("4.weight")
    save_file(state, str(tester.path / "other.safetensors"))

    cases = {
        'init_from = "other.safetensors"': (
            "job.toml:5: model.init_from: the weights in "
            f"{tester.path / 'other.safetensors'} do not fit model 'tiny_cnn' (names differ: another model, or other "
            "options): 1 missing from the weights (4.weight); 1 not in the model (extra.weight)"
        ),
        'freeze = ["conv"]': (
            "job.toml:5: model.freeze: 'conv' matches no parameter of model 'tiny_cnn' (matched from the start of "
            "the name); its parameters are under: 0, 4"
        ),
        'freeze = ["0", "4"]': "job.toml:5: model.freeze: ['0', '4'] freezes every parameter: nothing would be trained",
        'init_from = "runs:/0123456789abcdef"': "job.toml:5: model.init_from: cannot download model.safetensors of "
        "MLflow run 0123456789abcdef from ",
    }
    for model, message in cases.items():
        tester.write_job("job.toml", job_text("mistake", model=model, tracking="offline = true"))
        result = tester.cli("job.toml")
        assert result.returncode == 2 and len(result.stderr_lines) == 1, result.stderr
        assert result.stderr_lines[0].startswith(f"runjob: {message}"), result.stderr
        assert "Traceback" not in result.stderr

    tester.write_job(
        "job.toml", job_text("mistake", optimizer='groups = [{ params = "4", lr = 0.1 }, { params = "4\\\\.bias" }]')
    )
    result = tester.cli("job.toml", "--set", "tracking.offline=true")
    assert result.returncode == 2 and result.stderr_lines == [
        "runjob: job.toml:11: optimizer.groups.1.params: '4\\\\.bias' matches only parameters that are frozen "
        "(model.freeze) or taken by an earlier group (the first matching group wins): the group would be empty"
    ]


def test_validate_checks_the_new_keys_without_torch(tester):
    tester.write_job(
        "job.toml",
        """
        [model]
        name = "resnet18"
        num_classes = 10
        weights = "IMAGENET1K_V2"
        init_from = "missing_run_folder"
        freeze = ["layer1("]
        frezee = []
        [dataset]
        name = "digits"
        [optimizer]
        name = "sgd"
        groups = [{ params = "fc", lr = 0.1, momentun = 0.5 }]
        """,
    )
    code = (
        "import sys; from runjob.commands.cli import main; code = main(['validate', 'job.toml']); "
        "print([m for m in ('torch', 'torchvision', 'mlflow') if m in sys.modules]); sys.exit(code)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tester.path, env=tester.env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and result.stdout.strip() == "[]", result.stderr
    where = tester.path
    assert result.stderr.splitlines() == [
        "runjob: job.toml:4: model.weights: resnet18 has no weights 'IMAGENET1K_V2'; did you mean 'IMAGENET1K_V1'? "
        "torchvision has: IMAGENET1K_V1, DEFAULT (got 'IMAGENET1K_V2')",
        f"runjob: job.toml:5: model.init_from: not found: {where / 'missing_run_folder'} (a run's output folder, a "
        ".safetensors file or runs:/RUN_ID) (got 'missing_run_folder')",
        "runjob: job.toml:6: model.freeze: 'layer1(' is not a regular expression: missing ), unterminated subpattern "
        "at position 6 (got ['layer1('])",
        "runjob: job.toml:7: model.frezee: unknown key; did you mean 'freeze'? Accepted keys: name, adapters, "
        "cifar_stem, freeze, init_from, num_classes, weights, zero_init_residual",
        "runjob: job.toml:12: optimizer.groups.0.momentun: unknown key. Accepted keys: lr, params, weight_decay",
    ]


def test_resume_refuses_changed_parameter_groups():
    from runjob.train.checkpoints import compare_jobs

    saved = {"optimizer": {"name": "adamw", "lr": 0.1, "groups": [{"params": "fc", "lr": 0.01}]}}
    changed = {"optimizer": {"name": "adamw", "lr": 0.1, "groups": [{"params": "fc", "lr": 0.02}]}}
    refused, _ = compare_jobs(saved, changed)
    assert refused == ['optimizer.groups: [{"params": "fc", "lr": 0.01}] -> [{"params": "fc", "lr": 0.02}]']
    refused, _ = compare_jobs(saved, {"optimizer": {**saved["optimizer"], "no_decay_norm_and_bias": True}})
    assert refused == ["optimizer.no_decay_norm_and_bias: (unset) -> true"]


# ---------------------------------------------------------------------------------------------
# torchvision's pretrained weights, offline: the test writes the file into $TORCH_HOME's cache


@pytest.fixture
def torch_home(tmp_path, monkeypatch):
    home = tmp_path / "torch_home"
    monkeypatch.setenv("TORCH_HOME", str(home))
    return home / "hub" / "checkpoints"


def resnet18_options(**values):
    from runjob_builtins.torchvision_models import ResNetOptions, _options_for

    return _options_for("resnet18", ResNetOptions)(**values)


def test_torchvision_weights_offline_hash_checked_and_a_new_head(torch_home, monkeypatch, capsys):
    import torch
    import torchvision

    from runjob import RunjobError
    from runjob_builtins.torchvision_models import build

    entry = torchvision.models.ResNet18_Weights.IMAGENET1K_V1
    # not in the cache, no network: one line naming the file and the folder to place it in
    with pytest.raises(RunjobError) as error:
        build("resnet18", resnet18_options(num_classes=10, weights="DEFAULT"))
    assert str(error.value).startswith(
        "model.weights = 'DEFAULT' (ResNet18_Weights.IMAGENET1K_V1): resnet18-f37072fd.pth is not in "
        f"{torch_home} and cannot be downloaded ("
    )
    assert str(error.value).endswith(
        "place the file from https://download.pytorch.org/models/resnet18-f37072fd.pth there (the folder is "
        "$TORCH_HOME/hub/checkpoints)"
    )

    # a file of our own under torchvision's name: its sha256 does not start f37072fd, so it is refused
    torch.manual_seed(1)
    state = torchvision.models.resnet18().state_dict()
    torch_home.mkdir(parents=True, exist_ok=True)
    torch.save(state, torch_home / "resnet18-f37072fd.pth")
    with pytest.raises(RunjobError, match=r"is not the file torchvision published: its sha256 starts [0-9a-f]{8}, its"):
        build("resnet18", resnet18_options(num_classes=10, weights="IMAGENET1K_V1"))

    # The file name carries the sha256 prefix of the content torchvision published, and our file
    # cannot match f37072fd. So the test points the enum's URL at a name carrying our file's own
    # prefix: the check runs exactly as it does for users, on a file that passes it.
    ours = hashlib.sha256((torch_home / "resnet18-f37072fd.pth").read_bytes()).hexdigest()[:8]
    (torch_home / "resnet18-f37072fd.pth").rename(torch_home / f"resnet18-{ours}.pth")
    monkeypatch.setattr(entry.value, "url", f"https://download.pytorch.org/models/resnet18-{ours}.pth")
    capsys.readouterr()
    model = build("resnet18", resnet18_options(num_classes=10, weights="DEFAULT"))
    assert model.conv1.weight.equal(state["conv1.weight"]) and model.layer4[1].bn2.running_var.equal(
        state["layer4.1.bn2.running_var"]
    )
    assert model.fc.weight.shape == (10, 512)
    assert capsys.readouterr().out == (
        f"runjob: model.weights: resnet18 from ResNet18_Weights.IMAGENET1K_V1 ({torch_home}/resnet18-{ours}.pth): "
        "120 of 122 tensors; re-initialised, their shape differs (the model's fresh init kept): fc.weight [10, 512] "
        "here, [1000, 512] in the weights, fc.bias [10] here, [1000] in the weights\n"
    )
