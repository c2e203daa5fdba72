"""Plugins under control: switching one off (``--disable-plugin``, ``RUNJOB_DISABLE_PLUGINS``),
naming one plugin's component (``plugin:name``), and built-ins winning for a bare name."""

from __future__ import annotations

import tomllib

import pytest

from runjob.commands.cli import _with_default_command
from runjob.host.plugin_host import ComponentLookupError, DisabledPlugin, load_plugins

MODEL_PLUGIN = """
    import runjob

    @runjob.hookimpl
    def runjob_register_models(register):
        register("{model}", lambda options: None, description="{owner}'s model")
"""

EXPLODING = "raise RuntimeError('this plugin must not be imported')\n"

JOB = """
    [model]
    name = "{model}"
    [dataset]
    name = "digits"
"""


def install_model(tester, dist: str, entry_point: str, model: str) -> None:
    module = f"{entry_point}_module"
    source = MODEL_PLUGIN.format(model=model, owner=entry_point)
    tester.install_plugin(dist, {module: source}, {entry_point: module})


# --- disabling ------------------------------------------------------------------------------


@pytest.fixture
def exploding(runjob_tester):
    """A plugin ``exploding`` whose module raises when imported: loaded, it is a failure."""
    runjob_tester.install_plugin("fake-exploding", {"fake_exploding": EXPLODING}, {"exploding": "fake_exploding"})
    assert [f.name for f in load_plugins().failures] == ["exploding"]
    return runjob_tester


def test_a_plugin_disabled_by_flag_is_not_imported(exploding):
    result = exploding.cli("plugins", "--disable-plugin", "exploding")
    assert result.returncode == 0, result.stderr
    assert "DISABLED: exploding  (fake-exploding 1.0) by --disable-plugin" in result.stdout
    assert "FAILED" not in result.stdout
    # the flag also goes before the command, and before a job file given without one
    job = exploding.write_job("job.toml", JOB.format(model="resnet18"))
    assert exploding.cli("--disable-plugin", "exploding", "validate", job).returncode == 0
    assert _with_default_command(["--disable-plugin=a", "--disable-plugin", "b", "job.toml"]) == [
        "--disable-plugin=a",
        "--disable-plugin",
        "b",
        "run",
        "job.toml",
    ]


def test_a_plugin_disabled_by_environment_is_not_imported(exploding, monkeypatch):
    monkeypatch.setenv("RUNJOB_DISABLE_PLUGINS", " exploding , ")
    host = load_plugins()
    assert host.failures == []
    assert host.disabled == [DisabledPlugin("exploding", "fake-exploding", "1.0", "RUNJOB_DISABLE_PLUGINS")]
    result = exploding.cli("plugins")
    assert "DISABLED: exploding  (fake-exploding 1.0) by $RUNJOB_DISABLE_PLUGINS" in result.stdout


def test_the_flag_reaches_processes_the_command_starts_and_is_put_back(exploding, monkeypatch):
    import os

    from runjob.commands import validate

    seen = []
    original = validate.cmd_validate

    def watching(args):
        seen.append(os.environ.get("RUNJOB_DISABLE_PLUGINS"))
        return original(args)

    monkeypatch.setattr(validate, "cmd_validate", watching)
    job = exploding.write_job("job.toml", JOB.format(model="resnet18"))
    assert exploding.cli("validate", job, "--disable-plugin", "exploding").returncode == 0
    assert seen == ["exploding"]  # what workers and sweep trials inherit
    assert "RUNJOB_DISABLE_PLUGINS" not in os.environ


def test_a_disabled_builtin_leaves_its_names_unknown(runjob_tester):
    job = runjob_tester.write_job("job.toml", JOB.format(model="resnet18"))
    result = runjob_tester.cli("validate", job, "--disable-plugin", "torchvision_models")
    assert result.returncode == 2
    assert "unknown model 'resnet18'" in result.stderr
    assert "Disabled plugins, which may provide it: torchvision_models" in result.stderr


@pytest.mark.parametrize("where", ["flag", "environment"])
def test_an_unknown_disabled_name_is_one_line_with_a_suggestion(runjob_tester, monkeypatch, where):
    if where == "flag":
        result = runjob_tester.cli("plugins", "--disable-plugin", "torchvision_model")
        expected = "runjob: --disable-plugin torchvision_model: no plugin is named 'torchvision_model'"
    else:
        monkeypatch.setenv("RUNJOB_DISABLE_PLUGINS", "digits,torchvision_model")
        result = runjob_tester.cli("validate", runjob_tester.write_job("job.toml", JOB.format(model="resnet18")))
        expected = "runjob: RUNJOB_DISABLE_PLUGINS=torchvision_model: no plugin is named 'torchvision_model'"
    assert result.returncode == 2
    (line,) = result.stderr_lines
    assert line.startswith(expected)
    assert "did you mean 'torchvision_models'?" in line and "digits, gpt" in line


# --- plugin:name ----------------------------------------------------------------------------


def test_plugin_name_picks_between_two_third_party_registrations(runjob_tester):
    install_model(runjob_tester, "fake-alpha", "alpha", "wide_net")
    install_model(runjob_tester, "fake-beta", "beta", "wide_net")
    host = load_plugins()
    with pytest.raises(ComponentLookupError) as caught:
        host.lookup("model", "wide_net")
    message = str(caught.value)
    assert "plugin alpha (fake-alpha 1.0) and plugin beta (fake-beta 1.0)" in message
    assert 'write "alpha:wide_net" or "beta:wide_net"' in message
    assert host.lookup("model", "beta:wide_net").plugin == "beta"
    assert host.lookup("model", "alpha:wide_net").plugin == "alpha"

    job = runjob_tester.write_job("job.toml", JOB.format(model="wide_net"))
    result = runjob_tester.cli("validate", job)
    assert result.returncode == 2
    assert "job.toml:2: model.name: model 'wide_net' is registered by more than one plugin" in result.stderr
    result = runjob_tester.cli("validate", job, "--set", "model.name=beta:wide_net")
    assert result.returncode == 0, result.stderr
    resolved = tomllib.loads(result.stdout)
    assert resolved["model"]["name"] == "beta:wide_net"
    # the resolved job (what a run writes as job.toml) reads back as the same component
    again = runjob_tester.write_job("resolved.toml", result.stdout)
    assert runjob_tester.cli("validate", again).stdout == result.stdout
    plugins = runjob_tester.cli("plugins").stdout
    assert "CONFLICT: model 'wide_net' is registered by more than one plugin" in plugins


def test_a_wrong_plugin_name_is_a_job_problem(runjob_tester):
    install_model(runjob_tester, "fake-alpha", "alpha", "wide_net")
    host = load_plugins()
    with pytest.raises(ComponentLookupError, match="no plugin is named 'alpah'; did you mean 'alpha'?"):
        host.lookup("model", "alpah:wide_net")
    with pytest.raises(ComponentLookupError, match="registers no model 'wide_nt'; did you mean 'wide_net'?"):
        host.lookup("model", "alpha:wide_nt")
    job = runjob_tester.write_job("job.toml", JOB.format(model="digits:resnet18"))
    result = runjob_tester.cli("validate", job)
    assert result.returncode == 2
    assert result.stderr_lines == [
        "runjob: "
        + str(job)
        + ":2: model.name: digits:resnet18: plugin digits (runjob-train 0.1.0) registers no model 'resnet18'; "
        "its models: none"
    ]


# --- built-ins win for a bare name ----------------------------------------------------------


def test_a_third_party_resnet18_does_not_break_builtin_jobs(runjob_tester):
    install_model(runjob_tester, "fake-shadow", "shadow", "resnet18")
    host = load_plugins()
    assert host.lookup("model", "resnet18").plugin == "torchvision_models"
    assert host.lookup("model", "shadow:resnet18").plugin == "shadow"
    assert host.duplicates == {}
    warning = (
        "plugin shadow (fake-shadow 1.0) also registers model 'resnet18'; jobs get the built-in; "
        'write "shadow:resnet18" for the plugin\'s'
    )
    assert host.warnings == [warning]

    job = runjob_tester.write_job("job.toml", JOB.format(model="resnet18"))
    result = runjob_tester.cli("validate", job)
    assert result.returncode == 0, result.stderr
    assert result.stderr_lines.count(f"runjob: warning: {warning}") == 1
    assert tomllib.loads(result.stdout)["model"]["name"] == "resnet18"
    result = runjob_tester.cli("validate", job, "--set", "model.name=shadow:resnet18")
    assert result.returncode == 0, result.stderr
    assert tomllib.loads(result.stdout)["model"] == {"name": "shadow:resnet18"}  # the plugin's takes no options
    assert f"WARNING: {warning}" in runjob_tester.cli("plugins").stdout
    assert "runjob: warning" not in runjob_tester.cli("plugins").stderr


def test_two_third_party_registrations_beside_a_builtin_only_warn(runjob_tester):
    install_model(runjob_tester, "fake-alpha", "alpha", "resnet18")
    install_model(runjob_tester, "fake-beta", "beta", "resnet18")
    host = load_plugins()
    assert host.lookup("model", "resnet18").plugin == "torchvision_models"
    assert [w.split(" (")[0] for w in host.warnings] == ["plugin alpha", "plugin beta"]
