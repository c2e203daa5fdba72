"""runjob.testing itself: what it promises plugin authors (isolation put back after each test, the
record read back from both sides, the command line in-process, a light import)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import pytest
from helpers import SMALL_DIGITS

from runjob.testing import make_plugin_dist, read_run


def test_importing_the_kit_imports_no_heavy_library():
    code = (
        "import sys, runjob.testing; "
        "print(sorted(m for m in ('torch', 'mlflow', 'accelerate', 'torchvision') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_laid_out_distribution_is_found_by_its_entry_points(tmp_path, monkeypatch):
    make_plugin_dist(
        tmp_path / "site",
        "fake-layout",
        "2.0",
        {"layout": "fake_layout_pkg.plugin:THING"},
        {"fake_layout_pkg.plugin": "THING = 42\n"},
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    (entry_point,) = [ep for ep in importlib.metadata.entry_points(group="runjob") if ep.name == "layout"]
    assert entry_point.dist.metadata["Name"] == "fake-layout" and entry_point.dist.version == "2.0"
    assert entry_point.load() == 42
    monkeypatch.delitem(sys.modules, "fake_layout_pkg.plugin")
    monkeypatch.delitem(sys.modules, "fake_layout_pkg")


def test_the_tester_isolates_each_test_and_puts_everything_back(pytester, monkeypatch, empty_mlflow_db):
    # pytester forgets the modules first imported by the inner session: import them out here first
    from runjob.commands.cli import main
    from runjob.host.plugin_host import load_plugins

    assert main and load_plugins().failures == []
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://outside:5000")
    monkeypatch.setenv("RUNJOB_SOMETHING", "outside")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    pytester.makeconftest('pytest_plugins = ["runjob.testing"]')
    pytester.makepyfile(
        """
        import os, sys

        PLUGIN = (
            "import runjob\\nVERSION = {}\\n"
            "@runjob.hookimpl\\ndef runjob_register_models(register):\\n    register('m', print)\\n"
        )

        def test_first(runjob_tester, tmp_path):
            assert os.getcwd() == str(tmp_path) == str(runjob_tester.path)
            assert os.environ["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path / 'mlflow.db'}"
            assert (tmp_path / "mlflow.db").is_file()  # a copy of the initialised store
            assert os.environ["HF_HOME"] == str(tmp_path / "hf_home")
            assert "RUNJOB_SOMETHING" not in os.environ
            site = runjob_tester.install_plugin("fake-inside", {"fake_inside": PLUGIN.format(1)})
            assert sys.path[0] == str(site) and os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(site)
            assert "fake_inside  (fake-inside 1.0, fake_inside)" in runjob_tester.cli("plugins").stdout
            import fake_inside
            assert fake_inside.VERSION == 1
            os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "2"  # as a run sets it

        def test_second(runjob_tester):
            assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
            runjob_tester.install_plugin("fake-inside", {"fake_inside": PLUGIN.format(2)}, version="2.0")
            assert "fake_inside  (fake-inside 2.0, fake_inside)" in runjob_tester.cli("plugins").stdout
            import fake_inside
            assert fake_inside.VERSION == 2  # this test's own version, not the one the first test imported
        """
    )
    cwd, path = os.getcwd(), list(sys.path)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=2)
    assert os.getcwd() == cwd and sys.path == path
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://outside:5000" and os.environ["RUNJOB_SOMETHING"] == "outside"
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
    assert "fake_inside" not in sys.modules


def test_the_command_line_in_process_gives_the_shells_exit_codes(runjob_tester):
    version = runjob_tester.cli("--version")
    assert (version.returncode, version.stdout) == (0, "runjob 0.1.0\n")
    usage = runjob_tester.cli("validate")
    assert usage.returncode == 2 and "the following arguments are required: job" in usage.stderr


def test_a_recorded_run_reads_both_sides(tester):
    tester.write_job("job.toml", SMALL_DIGITS.format(name="sides"))
    online = tester.run("job.toml", "train.max_steps=2", "train.log_every=1", output_dir="online")
    assert online.exit_code == 0 and online.mlflow is not None
    assert online.run_id == online.mlflow.run_id and online.record["status"] == online.status == "FINISHED"
    assert online.params["train.max_steps"] == online.record["params"]["train.max_steps"] == "2"
    assert online.mlflow.steps("train/loss") == [step for step, _ in online.local_history("train/loss")] == [1, 2]
    assert online.metrics["train/loss"] == online.local_history("train/loss")[-1][1]
    assert "job.toml" in online.artifacts and online.mlflow.models() == {"sides"}, "the weights: in the logged model"
    assert tester.only_run("sides").run_id == online.run_id

    offline = tester.run("job.toml", "train.max_steps=2", "tracking.offline=true", output_dir="offline")
    assert offline.mlflow is None and offline.run_id is None
    assert offline.status == "FINISHED" and offline.params["tracking.offline"] == "true"
    assert offline.tags["runjob.version"] == "0.1.0" and "train/loss" in offline.metrics
    assert {"job.toml", "sides"} <= offline.artifacts, "the MLflow model folder, for sync to log as the logged model"
    assert read_run(offline.output_dir).record == offline.record


def test_a_users_mistake_raises_from_the_run_entry(tester):
    from runjob.errors import RunjobError

    tester.write_job("job.toml", SMALL_DIGITS.format(name="mistake"))
    with pytest.raises(RunjobError, match="train.mixed_precision = 'fp16' needs a GPU"):
        tester.run("job.toml", "train.mixed_precision=fp16")
