"""Adapters (issue 23): ``[model.adapters.lora]`` puts PEFT's low-rank adapters into a model after
``init_from`` and before ``freeze``. A LoRA run starts from a full run's weights, trains only the
adapters (and ``modules_to_save``), writes the adapter's own files, and its own output folder is
all ``evaluate``, ``predict``, ``export`` and the MLflow model need."""

from __future__ import annotations

import shutil

import pytest

from runjob.testing import RunjobTester, read_run

pytest.importorskip("peft")

pytestmark = pytest.mark.timeout(300)

BASE = """
    [job]
    name = "{name}"
    [model]
    name = "mlp"
    hidden = [32]
    [dataset]
    name = "digits"
    image_size = 8
    [optimizer]
    lr = 0.01
    [train]
    batch_size = 64
    max_steps = 8
    eval_every = 8
    log_every = 4
"""

LORA = """
    init_from = "{init_from}"
    [model.adapters.lora]
    r = 4
    target_modules = {targets}
    modules_to_save = ["3"]
"""


def lora_job(base, targets='["1"]'):
    """The base job with LoRA on the hidden layer (``1``) and the output layer (``3``) trained in full."""
    head, _, rest = BASE.partition("    [dataset]")
    return head + LORA.format(init_from=base, targets=targets) + "    [dataset]" + rest


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, empty_mlflow_db):
    """The full run LoRA runs start from (its folder), trained once for the module: each test only
    reads it, or copies it where it deletes it."""
    tester = RunjobTester(tmp_path_factory.mktemp("adapters-base"), empty_mlflow_db)
    tester._setup()
    try:
        tester.write_job("base.toml", BASE.format(name="base"))
        base = tester.run("base.toml", output_dir="base")
        assert base.status == "FINISHED"
        yield base.output_dir.resolve()  # the tests run in folders of their own
    finally:
        tester._teardown()


def test_lora_starts_from_a_full_run_and_its_folder_alone_serves_it(runjob_tester, base_run):
    from importlib.metadata import version

    from safetensors.torch import load_file

    base = runjob_tester.path / "base"
    shutil.copytree(base_run, base)  # this test deletes it below
    runjob_tester.write_job("lora.toml", lora_job(base).format(name="lora"))
    result = runjob_tester.cli("run", "lora.toml", "--output-dir", "lora")
    assert result.returncode == 0, result.stderr
    # 192 inputs (3 x 8 x 8) -> 32 -> 10: rank 4 on the hidden layer, the output layer in full
    adapters, head = 4 * 192 + 32 * 4, 32 * 10 + 10
    total = 192 * 32 + 32 + adapters + 2 * head  # PEFT keeps the original head beside its trained copy
    trained = adapters + head
    line = f"adapters lora: trainable {trained:,} of {total:,} parameters ({100 * trained / total:.2f}%)"
    assert line == "adapters lora: trainable 1,226 of 7,732 parameters (15.86%)"  # as the README shows it
    assert f"runjob: {line}" in result.stdout
    run = runjob_tester.path / "lora"
    weights, started = load_file(run / "model.safetensors"), load_file(base / "model.safetensors")
    assert weights["1.base_layer.weight"].equal(started["1.weight"]), "the base weights are frozen"
    assert not weights["3.modules_to_save.default.weight"].equal(started["3.weight"]), "the head trained"
    own = load_file(run / "adapters" / "lora" / "adapter_model.safetensors")
    assert sorted(own) == ["1.lora_A.weight", "1.lora_B.weight", "3.bias", "3.weight"], "PEFT's names"
    assert (run / "adapters" / "lora" / "adapter_config.json").is_file()
    lora = read_run(run)
    assert lora.tags["runjob.library.peft"] == version("peft")
    assert "adapters/lora/adapter_model.safetensors" in lora.mlflow.artifacts("adapters/lora")

    shutil.rmtree(base)  # the run it started from is gone: the LoRA run is whole on its own
    evaluated = runjob_tester.cli("evaluate", run)
    assert evaluated.returncode == 0, evaluated.stderr
    scans = runjob_tester.path / "scans"
    scans.mkdir()
    _write_scan(scans / "a.png")
    predicted = runjob_tester.cli("predict", run, "--input", scans)
    assert predicted.returncode == 0 and '"class"' in predicted.stdout, predicted.stderr
    exported = runjob_tester.cli("export", run, "--format", "pt2")
    assert exported.returncode == 0, exported.stderr
    assert "max abs difference" in exported.stdout


def test_export_folds_the_adapters_into_the_plain_model(runjob_tester, base_run):
    import torch

    from runjob.host.model_build import merge_adapters
    from runjob.host.plugin_host import load_plugins
    from runjob.train.trained import build_trained, find_run, load_job

    runjob_tester.write_job("lora.toml", lora_job(base_run).format(name="lora"))
    lora = runjob_tester.run("lora.toml", "optimizer.lr=0.1", output_dir="lora")
    found = find_run(str(lora.output_dir), None, runjob_tester.path)
    job = load_job(found, [], load_plugins())
    model, adapters = build_trained(job, found.model_file, found.folder)
    scans = torch.rand(5, 3, 8, 8)
    with torch.no_grad():
        adapted = model(scans)
        merged = merge_adapters(model, adapters)
        assert not any("lora" in name for name, _ in merged.named_parameters())
        assert [type(layer).__name__ for layer in merged] == ["Flatten", "Linear", "ReLU", "Linear"]
        assert torch.allclose(merged(scans), adapted, atol=1e-5)


def test_an_adapter_is_checked_like_any_component(runjob_tester):
    runjob_tester.write_job("base.toml", BASE.format(name="base"))
    job = lora_job(runjob_tester.path / "nowhere", targets='["1"]').replace(
        "[model.adapters.lora]", "[model.adapters.lorra]"
    )
    runjob_tester.write_job("job.toml", job.format(name="typo"))
    result = runjob_tester.cli("validate", "job.toml")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert any(
        line.startswith("runjob: job.toml:")
        and "model.adapters.lorra: unknown adapter 'lorra'; did you mean 'lora'?" in line
        for line in result.stderr_lines
    ), result.stderr


def test_an_adapter_naming_no_layer_of_the_model_is_one_line_at_its_table(runjob_tester):
    job = BASE.replace("    [dataset]", '    [model.adapters.lora]\n    target_modules = ["q_proj"]\n    [dataset]')
    runjob_tester.write_job("job.toml", job.format(name="no-layer"))
    result = runjob_tester.cli("run", "job.toml")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr_lines[-1] == (
        "runjob: job.toml:6: [model.adapters.lora]: ValueError: target_modules ['q_proj'] name no layer of the "
        "model; its Linear layers: 1, 3"
    )


def _write_scan(path):
    import numpy as np
    from PIL import Image

    Image.fromarray((np.arange(64).reshape(8, 8) * 4).astype("uint8")).save(path)


BROKEN = """
import runjob


@runjob.hookimpl
def runjob_register_adapters(register):
    register("broken", lambda options: object())
"""


def test_an_adapter_factory_that_returns_no_adapter_is_one_line(runjob_tester):
    runjob_tester.install_plugin("broken-adapter", {"broken_adapter": BROKEN})
    job = BASE.replace("    [dataset]", "    [model.adapters.broken]\n    [dataset]")
    runjob_tester.write_job("job.toml", job.format(name="broken"))
    result = runjob_tester.cli("run", "job.toml")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr_lines[-1] == (
        "runjob: adapter 'broken' (plugin broken_adapter): its factory returned a object, not a runjob.Adapter"
    )
