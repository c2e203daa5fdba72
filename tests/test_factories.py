"""A component's factory: its failure is the job's mistake, reported in one line that names the
component's table and where the job names it (exit 2, no traceback); the model's factory runs once
per run, the FLOP count included."""

from __future__ import annotations

import sys

import pytest
from helpers import SMALL_DIGITS

pytestmark = pytest.mark.timeout(300)

COUNTED = '''
"""A model that counts how often its factory is called, and fails when told to."""
import runjob
from pydantic import Field

from runjob.testing import build_tiny_cnn

CALLS = []


class CountedOptions(runjob.Options):
    num_classes: int = Field(10, ge=2)
    channels: int = Field(8, ge=1)
    fail: str = ""
    refuse: str = ""


def build(options):
    CALLS.append(options)
    if options.fail:
        raise ValueError(f"the architecture takes no {options.fail!r}\\nsecond line")
    if options.refuse:
        raise runjob.RunjobError(f"cannot use {options.refuse}")
    return build_tiny_cnn(options)


@runjob.hookimpl
def runjob_register_models(register):
    register("counted", build, options=CountedOptions)
'''


@pytest.fixture
def counted(tester):
    tester.install_plugin("counted", {"counted": COUNTED}, {"counted": "counted"})
    return tester


def calls() -> list[object]:
    return sys.modules["counted"].CALLS  # type: ignore[no-any-return]


def job(name: str, extra: str = "") -> str:
    return SMALL_DIGITS.format(name=name).replace('name = "tiny_cnn"', 'name = "counted"' + extra) + "epochs = 1\n"


def test_a_failing_factory_is_one_line_naming_its_table_and_line(counted):
    counted.write_job("job.toml", job("broken", '\n    fail = "depth"'))
    result = counted.cli("job.toml")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr_lines == [
        "runjob: job.toml:4: [model] counted: ValueError: the architecture takes no 'depth'"
    ], "where the job names the model: its name line"
    (log,) = (counted.path / "runs" / "broken").glob("*/runjob.log")
    kept = log.read_text(encoding="utf-8")
    assert "Traceback" in kept and "raise ValueError" in kept, "where it happened is kept in the run's log"


def test_a_runjob_error_from_a_factory_keeps_its_message_and_gains_the_place(counted):
    counted.write_job("job.toml", job("refused"))
    result = counted.cli("job.toml", "--set", "model.refuse=fp8")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr_lines == ["runjob: --set model.refuse=fp8: [model] counted: cannot use fp8"], "the override's"


def test_a_failing_callback_factory_names_its_table(tester):
    tester.install_plugin(
        "sour",
        {
            "sour": (
                "import runjob\n"
                "def build(options):\n"
                "    raise KeyError('threshold')\n"
                "@runjob.hookimpl\n"
                "def runjob_register_callbacks(register):\n"
                "    register('sour', build)\n"
            )
        },
        {"sour": "sour"},
    )
    tester.write_job("job.toml", SMALL_DIGITS.format(name="sour") + "epochs = 1\n[callbacks.sour]\n")
    result = tester.cli("job.toml")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr_lines == ["runjob: job.toml:11: [callbacks.sour] sour: KeyError: 'threshold'"]


def test_the_model_factory_runs_once_per_run_and_the_flops_are_still_counted(counted):
    counted.write_job("job.toml", job("once"))
    run = counted.run("job.toml")
    assert len(calls()) == 1, "the FLOP count works on a meta copy of the built model, not a second build"
    assert run.local_history("train/tflops") and all(value > 0 for _, value in run.local_history("train/tflops"))
    assert float(run.tags["runjob.flops_per_sample"]) > 0


def test_the_meta_copy_of_a_built_model_counts_like_a_meta_build_and_leaves_it_alone(capsys):
    import torch

    from runjob.train.flops import meta_model, training_flops_per_unit

    class Regression:
        unit = "samples"

        def forward(self, model, batch):
            return model(batch[0])

        def loss(self, outputs, batch):
            return torch.nn.functional.mse_loss(outputs, batch[1])

        def count(self, batch):
            return len(batch[0])

    built = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    before = {k: v.clone() for k, v in built.state_dict().items()}
    copy = meta_model(built)
    assert all(p.is_meta for p in copy.parameters()) and all(b.is_meta for b in copy.buffers())
    batch = (torch.randn(16, 8), torch.randn(16, 4))
    counted = training_flops_per_unit(copy, Regression(), batch)
    assert counted == pytest.approx(
        training_flops_per_unit(
            meta_model(lambda: torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))), Regression(), batch
        )
    )
    assert counted and counted > 0
    assert all(not p.is_meta for p in built.parameters()), "the run's model is untouched"
    assert all(torch.equal(before[k], v) for k, v in built.state_dict().items())
    assert capsys.readouterr().out == ""
    assert training_flops_per_unit(meta_model(built), Regression(), (torch.randn(16, 3), batch[1])) is None
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1 and said[0].startswith(
        "runjob: the model's FLOPs were not counted (no train/tflops, train/mfu): "
    )
