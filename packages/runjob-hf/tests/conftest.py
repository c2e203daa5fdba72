"""The package's tests use runjob's test kit: each test gets its own working folder, MLflow store
and HF_HOME (so nothing from the machine's Hugging Face cache is seen, and nothing is downloaded).
runjob-hf itself is found through its entry point, as installed in the environment."""

import pytest

pytest_plugins = ["runjob.testing"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """No test may reach the network: the hub and datasets are told they are offline."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
