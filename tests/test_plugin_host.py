"""The plugin host: built-ins and third-party plugins load the same way; failures stay contained."""

from __future__ import annotations

import inspect

import pytest
from helpers import SMALL_DIGITS

from runjob.host import hookspecs
from runjob.host.plugin_host import ComponentLookupError, load_plugins
from runjob.job.validation import load_resolved

TINY_MODEL_PLUGIN = """
    import runjob

    @runjob.hookimpl
    def runjob_register_models(register):
        register("{model}", lambda options: None, description="test model")
"""


def test_builtins_come_through_the_entry_point_group():
    host = load_plugins()
    names = {p.name: p for p in host.plugins}
    assert {"torchvision_models", "image_datasets", "digits", "optimizers", "schedulers", "strategies"} <= set(names)
    assert names["optimizers"].distribution == "runjob-train"
    assert names["optimizers"].registers == {"optimizer": ["sgd", "adam", "adamw"]}
    assert host.failures == []


def test_broken_plugin_is_reported_and_only_matters_when_needed(runjob_tester):
    runjob_tester.install_plugin(
        "fake-broken", {"fake_broken": "import no_such_module_here\n"}, {"broken": "fake_broken"}, version="2.3"
    )
    host = load_plugins()
    (failure,) = host.failures
    assert (failure.name, failure.distribution, failure.version) == ("broken", "fake-broken", "2.3")
    assert "ModuleNotFoundError" in failure.error and "no_such_module_here" in failure.error
    assert "resnet18" in host.components["model"]  # the others still loaded
    with pytest.raises(ComponentLookupError) as caught:
        host.lookup("model", "fancy_net")
    assert "Plugins that failed to load, which may have provided it: broken (ModuleNotFoundError" in str(caught.value)


def test_a_builtin_name_registered_again_goes_to_the_builtin(runjob_tester):
    # more in test_plugin_control.py: plugin:name, two third-party registrations, the CLI's warning
    runjob_tester.install_plugin(
        "fake-dupe", {"fake_dupe": TINY_MODEL_PLUGIN.format(model="resnet18")}, {"dupe": "fake_dupe"}
    )
    host = load_plugins()
    job = runjob_tester.write_job("job.toml", '[model]\nname = "resnet18"\n[dataset]\nname = "digits"\n')
    assert load_resolved(job, [], host).model.component.plugin == "torchvision_models"
    assert load_resolved(job, ["model.name=dupe:resnet18"], host).model.component.plugin == "dupe"
    (warning,) = host.warnings
    assert warning.startswith("plugin dupe (fake-dupe 1.0) also registers model 'resnet18'; jobs get the built-in")


def test_misspelt_hook_is_a_failure_not_silence(runjob_tester):
    source = "import runjob\n\n@runjob.hookimpl\ndef runjob_register_model(register):\n    register('x', print)\n"
    runjob_tester.install_plugin("fake-typo", {"fake_typo": source}, {"typo": "fake_typo"}, version="0.1")
    host = load_plugins()
    (failure,) = host.failures
    assert failure.name == "typo" and "runjob_register_model" in failure.error
    assert failure.error == "unknown hook 'runjob_register_model'; did you mean 'runjob_register_models'?"
    assert "typo" not in {p.name for p in host.plugins}


def test_registration_that_raises_keeps_nothing(runjob_tester):
    source = """
        import runjob

        @runjob.hookimpl
        def runjob_register_models(register):
            register("half_registered", print)
            raise RuntimeError("plugin bug")
    """
    runjob_tester.install_plugin("fake-raises", {"fake_raises": source}, {"raises": "fake_raises"}, version="0.1")
    host = load_plugins()
    assert [f.name for f in host.failures] == ["raises"]
    assert "RuntimeError: plugin bug" in host.failures[0].error
    assert "half_registered" not in host.components["model"]


def test_plugins_command_lists_plugins_versions_and_failures(runjob_tester):
    runjob_tester.install_plugin(
        "fake-broken-cli",
        {"fake_brokencli": "raise ImportError('needs libfoo')\n"},
        {"brokencli": "fake_brokencli"},
        version="9.9",
    )
    result = runjob_tester.cli("plugins")
    assert result.returncode == 0, result.stderr
    assert "optimizers  (runjob-train 0.1.0, runjob_builtins.optimizers)" in result.stdout
    assert "optimizers: sgd, adam, adamw" in result.stdout
    assert "FAILED: brokencli  (fake-broken-cli 9.9): ImportError: needs libfoo" in result.stdout


def test_every_hook_is_documented_with_each_argument():
    specs = [f for name, f in vars(hookspecs).items() if name.startswith("runjob_") and callable(f)]
    assert len(specs) >= 10
    for spec in specs:
        doc = inspect.getdoc(spec) or ""
        assert len(doc) > 80, f"{spec.__name__} needs a docstring"
        for argument in inspect.signature(spec).parameters:
            assert f"``{argument}``" in doc or f"``{argument}(" in doc, f"{spec.__name__} does not document {argument}"


def test_builtin_model_names_exist_in_torchvision():
    import torchvision.models

    from runjob_builtins.torchvision_models import OTHERS, RESNETS

    available = set(torchvision.models.list_models(module=torchvision.models))
    assert set(RESNETS + OTHERS) <= available


def test_cifar_stem_changes_the_first_layers():
    import torch

    from runjob_builtins.torchvision_models import ResNetOptions, build

    model = build("resnet18", ResNetOptions(num_classes=10, cifar_stem=True))
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, torch.nn.Identity)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


CARELESS_PLUGIN = """
    import runjob

    @runjob.hookimpl
    def runjob_register_models(register):
        register("careless_net", lambda options: None)

    @runjob.hookimpl
    def runjob_after_evaluation(run, epoch, step, metric):  # the spec says `metrics`
        pass
"""


def test_a_hook_with_a_wrong_argument_name_only_matters_to_jobs_that_need_its_plugin(tester):
    tester.install_plugin("fake-careless", {"fake_careless": CARELESS_PLUGIN}, {"careless": "fake_careless"})
    reason = (
        "hook runjob_after_evaluation(run, epoch, step, metric) takes 'metric', "
        "which the specification runjob_after_evaluation(run, step, epoch, metrics) does not have"
    )
    listed = tester.cli("plugins")
    assert listed.returncode == 0, listed.stderr
    assert f"FAILED: careless  (fake-careless 1.0): {reason}" in listed.stdout.splitlines()
    assert "tiny_models  (runjob-testing-tiny-models 1.0, runjob.testing:TINY_MODELS)" in listed.stdout
    doctor = tester.cli("doctor")
    assert f"[FAIL] plugin careless: careless (fake-careless 1.0) failed to load: {reason}" in doctor.stdout
    assert doctor.returncode == 1  # a failed plugin is a failure to fix

    # a job that does not use it validates and trains
    tester.write_job("job.toml", SMALL_DIGITS.format(name="other"))
    valid = tester.cli("validate", "job.toml")
    assert valid.returncode == 0, valid.stderr
    run = tester.run("job.toml", "train.max_steps=2", "tracking.log_model=none")
    assert run.exit_code == 0 and run.status == "FINISHED"
    assert "runjob.plugin.careless" not in run.tags
    # a job that needs what it would have provided is told why it is missing, before the list of names
    needs = tester.cli("validate", "job.toml", "--set", "model.name=careless_net")
    assert needs.returncode == 2
    (line,) = needs.stderr_lines
    assert line.startswith("runjob: --set model.name=careless_net: model.name: unknown model 'careless_net'")
    failed = f"Plugins that failed to load, which may have provided it: careless ({reason})."
    assert failed in line and line.index(failed) < line.index("Known models: ")
