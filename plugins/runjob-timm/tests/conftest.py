"""runjob-timm's tests, written with runjob's test kit (a private MLflow store, working folder and
HF_HOME per test). The plugin is the one installed beside runjob (a uv workspace member, or
`pip install`); where it is not installed, this folder's project is built and installed once."""

import importlib.util
from importlib import metadata
from pathlib import Path

import pytest

pytest_plugins = ["runjob.testing"]

# without timm (runjob's checkout synced without the timm extra) these tests are not collected
collect_ignore_glob = [] if importlib.util.find_spec("timm") else ["test_*.py"]

PROJECT = Path(__file__).resolve().parents[1]


def _installed() -> bool:
    return any(ep.name == "timm" for ep in metadata.entry_points(group="runjob"))


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory):
    """Where the plugin is installed: None when runjob finds it already, else a folder it was
    installed into (with pip, offline) for this session."""
    if _installed():
        return None
    from runjob.testing import install_project

    return install_project(PROJECT, tmp_path_factory.mktemp("runjob-timm") / "site")


@pytest.fixture
def tester(runjob_tester, plugin_site):
    """runjob_tester with runjob-timm findable through its entry point."""
    if plugin_site is not None:
        runjob_tester.add_site(plugin_site)
    return runjob_tester
