"""The hook surface a plugin author codes against: typed specifications, the ``Register`` protocol,
argument order that does not matter to implementations, and ``runjob plugins --long``."""

from __future__ import annotations

import inspect
import json

from helpers import SMALL_DIGITS

import runjob
from runjob.host import hookspecs
from runjob.host.plugin_host import _register_into

SPECS = {name: f for name, f in vars(hookspecs).items() if name.startswith("runjob_") and callable(f)}

# the annotation of each argument name, wherever it appears (``from __future__ import annotations``
# keeps them as written)
ANNOTATIONS = {
    "register": "Register",
    "run": "Run",
    "step": "int",
    "epoch": "int",
    "loss": "torch.Tensor",
    "metrics": "dict[str, float]",
    "status": "str",
    "error": "BaseException | None",
}


def test_every_hook_spec_is_documented_and_annotated():
    assert len(SPECS) >= 12
    for name, spec in SPECS.items():
        assert len(inspect.getdoc(spec) or "") > 80, f"{name} needs a docstring"
        signature = inspect.signature(spec)
        assert signature.return_annotation == "None", f"{name} needs '-> None'"
        for argument, parameter in signature.parameters.items():
            assert parameter.annotation == ANNOTATIONS[argument], f"{name}({argument}) is annotated wrongly"


def test_training_events_take_step_before_epoch():
    for name, spec in SPECS.items():
        arguments = list(inspect.signature(spec).parameters)
        assert arguments[0] == "register" if name.startswith("runjob_register_") else "run", name
        if "epoch" in arguments:
            assert arguments.index("step") + 1 == arguments.index("epoch"), f"{name}: {arguments}"


def test_register_protocol_matches_the_callback_plugins_get():
    assert runjob.Register is hookspecs.Register
    protocol = inspect.signature(hookspecs.Register.__call__)
    protocol = protocol.replace(parameters=list(protocol.parameters.values())[1:])  # without self
    assert inspect.signature(_register_into([], "model", "plugin")) == protocol
    assert "register(name, factory" in inspect.getdoc(hookspecs)


def _evaluation_plugin(signature: str) -> str:
    return f"""
import json, os
import runjob

@runjob.hookimpl
def runjob_after_step(run, step, epoch):
    with open(os.environ["EVENTS_FILE"], "a") as f:
        f.write(json.dumps({{"hook": "step", "step": step, "epoch": epoch}}) + "\\n")

@runjob.hookimpl
def runjob_after_evaluation({signature}):
    with open(os.environ["EVENTS_FILE"], "a") as f:
        f.write(json.dumps({{"hook": __name__, "step": step, "epoch": epoch, "loss": metrics["val/loss"]}}) + "\\n")
"""


def test_after_evaluation_gets_its_arguments_by_name_in_either_order(tester, monkeypatch):
    tester.install_plugin(
        "fake-evaluation-order",
        {
            "eval_epoch_first": _evaluation_plugin("run, epoch, step, metrics"),
            "eval_step_first": _evaluation_plugin("run, step, epoch, metrics"),
        },
    )
    events_file = tester.path / "events.jsonl"
    monkeypatch.setenv("EVENTS_FILE", str(events_file))
    tester.write_job("job.toml", SMALL_DIGITS.format(name="order"))
    # 256 a batch: an epoch of the digits is a few steps, so evaluations fall in more than one epoch
    result = tester.cli(
        "job.toml", "--set", "train.batch_size=256", "--set", "train.max_steps=10", "--set", "train.eval_every=4"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    epoch_at = {e["step"]: e["epoch"] for e in events if e["hook"] == "step"}
    assert len(set(epoch_at.values())) > 1, "the run should cross an epoch boundary"
    seen = {
        module: [(e["step"], e["epoch"], e["loss"]) for e in events if e["hook"] == module]
        for module in ("eval_epoch_first", "eval_step_first")
    }
    assert seen["eval_epoch_first"] == seen["eval_step_first"]
    assert {step for step, _, _ in seen["eval_step_first"]} >= {4, 8}
    for step, epoch, _ in seen["eval_step_first"]:
        assert epoch == epoch_at[step], (step, epoch)


def test_plugins_long_lists_each_component_with_its_plugin_and_description(tester, capsys):
    short = tester.cli("plugins")
    assert short.returncode == 0, short.stderr
    assert "tiny_models  (runjob-testing-tiny-models 1.0" in short.stdout
    assert "test model: one 3x3 convolution" not in short.stdout  # the default listing stays short

    result = tester.cli("plugins", "--long")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "\nmodels:\n" in out
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("tiny_cnn "))
    entry = " ".join(lines[at : at + 2])  # a long name column puts the description on the next line
    assert "(tiny_models)" in entry and "test model: one 3x3 convolution" in entry
    assert all(len(line) <= 100 for line in out.splitlines() if line.startswith("    "))
