"""The plugin's tests use runjob's test kit: a private MLflow store and working folder per test,
the plugin installed the way a user installs it, and runjob run in the test's own process."""

from pathlib import Path

import pytest

pytest_plugins = ["runjob.testing"]

PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory):
    """This project built and installed (with pip, offline) into a folder of its own, once."""
    from runjob.testing import install_project

    return install_project(PROJECT, tmp_path_factory.mktemp("tinymlp") / "site")


@pytest.fixture
def runjob_with_plugin(runjob_tester, plugin_site):
    """runjob_tester with this plugin installed: runjob finds it through its entry point."""
    runjob_tester.add_site(plugin_site)
    return runjob_tester
