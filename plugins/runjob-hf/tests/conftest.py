"""The package's tests use runjob's test kit: each test gets its own working folder, MLflow store
and HF_HOME (so nothing from the machine's Hugging Face cache is seen, and nothing is downloaded).
runjob-hf itself is found through its entry point, as installed in the environment."""

import importlib.util

import pytest

pytest_plugins = ["runjob.testing"]

# without runjob-hf and datasets (runjob's checkout synced without the hf extra) these tests are not collected
collect_ignore_glob = (
    [] if importlib.util.find_spec("runjob_hf") and importlib.util.find_spec("datasets") else ["test_*.py"]
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """No test may reach the network: the hub and datasets are told they are offline."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
