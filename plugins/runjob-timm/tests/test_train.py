"""A timm ConvNeXt learns the digits end to end, sized by the dataset's facts, and is exported to
ONNX; a timm ViT with a LoRA adapter on its attention and MLP trains too."""

import importlib.util

import pytest
from timm_jobs import VIT, digits_job

QUICK = """
    [tracking]
    log_model = "none"   # no MLflow model: export reads the output folder
"""


@pytest.mark.slow
def test_a_timm_convnext_learns_the_digits_and_exports_to_onnx(tester):
    import timm

    tester.write_job("job.toml", digits_job("timm-digits", more=QUICK))
    run = tester.run("job.toml", output_dir="out")
    assert run.exit_code == 0 and run.status == "FINISHED"
    assert run.params["model.arch"] == "test_convnext"
    assert run.tags["runjob.plugin.timm"] == "runjob-timm 0.1.0"
    assert run.tags["runjob.library.timm"] == timm.__version__
    assert run.metrics["val/accuracy"] > 0.6  # one epoch of 22 steps; chance is 0.1
    assert {"model.safetensors", "data_facts.json"} <= run.files  # the facts rebuild the model without the data

    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    result = tester.cli("export", run.output_dir, "--format", "onnx", "--output", "convnext.onnx")
    assert result.returncode == 0, result.stderr
    assert float(result.stdout.split("max abs difference ")[1].split()[0]) < 1e-4
    session = onnxruntime.InferenceSession(str(tester.path / "convnext.onnx"))
    import numpy as np

    (logits,) = session.run(None, {session.get_inputs()[0].name: np.zeros((3, 3, 32, 32), np.float32)})
    assert logits.shape == (3, 10), "10 classes, 3 channels and 32x32 images, all from the dataset's facts"


LORA = """
    [tracking]
    offline = true       # the run's record in its output folder only
    log_model = "none"
    [model.adapters.lora]
    r = 4
    alpha = 8
    target_modules = ["qkv", "fc1"]
"""


@pytest.mark.skipif(
    importlib.util.find_spec("runjob_builtins.adapters") is None,
    reason="runjob has no adapters yet (issue 23, contract 5)",
)
def test_lora_on_a_timm_vit(tester, capsys):
    pytest.importorskip("peft")
    tester.write_job("job.toml", digits_job("timm-lora", VIT, image_size=16, train="    max_steps = 4", more=LORA))
    run = tester.run("job.toml", output_dir="out")
    assert run.exit_code == 0 and run.status == "FINISHED"
    assert "val/accuracy" in run.metrics
    assert "adapters" in run.files, "the LoRA weights and config, in adapters/lora/"
    # r = 4 on qkv and fc1 (64 -> 192 each) of test_vit's 6 blocks: 6 x 2 x (4 x 64 + 192 x 4)
    assert "runjob: adapters lora: trainable 12,288 of 267,722 parameters (4.59%)" in capsys.readouterr().out
