"""Property-based: malformed job files and overrides always get exit code 2 and one-line messages,
never a traceback (hypothesis generates them)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runjob.commands import cli
from runjob.host import plugin_host

KNOWN_KEYS = [
    "name",
    "seed",
    "epochs",
    "batch_size",
    "lr",
    "num_classes",
    "root",
    "max_steps",
    "mixed_precision",
    "uri",
    "tags",
    "num_processes",
]
TABLES = [
    "job",
    "model",
    "dataset",
    "optimizer",
    "scheduler",
    "strategy",
    "train",
    "launch",
    "tracking",
    "trian",
    "extra",
]

scalars = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["resnet18", "digits", "adam", "sgd", "ddp", "fsdp", "bf16", "fp16"]),
)
values = st.one_of(
    scalars, st.lists(scalars, max_size=3), st.dictionaries(st.sampled_from(KNOWN_KEYS), scalars, max_size=3)
)
tables = st.dictionaries(st.sampled_from(KNOWN_KEYS) | st.text(min_size=1, max_size=8), values, max_size=5)
jobs = st.dictionaries(st.sampled_from(TABLES), tables | scalars, max_size=6)
override_keys = st.lists(
    st.sampled_from(TABLES) | st.sampled_from(KNOWN_KEYS) | st.text(max_size=5), min_size=0, max_size=3
).map(".".join)
overrides = st.lists(
    st.tuples(override_keys, st.sampled_from(["=", "", "=="]), st.text(max_size=10)).map("".join), max_size=3
)


@pytest.fixture(scope="module", autouse=True)
def loaded_once():
    host = plugin_host.load_plugins()
    original = plugin_host.load_plugins
    plugin_host.load_plugins = lambda: host  # the CLI loads plugins on each call; once is enough here
    yield
    plugin_host.load_plugins = original


def check_cli(capsys, text: str, sets: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "job.toml"
        path.write_text(text, encoding="utf-8")
        arguments = ["validate", str(path)]
        for override in sets:
            arguments.append(f"--set={override}")  # one word: a value that starts with "-" stays a value
        code = cli.main(arguments)
    out, err = capsys.readouterr()
    assert code in (0, 2), err
    assert "Traceback" not in err
    if code == 2:
        lines = err.strip().splitlines()
        assert lines and all(line.startswith("runjob: ") for line in lines), err
        assert out == ""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job=jobs, sets=overrides)
def test_generated_jobs_and_overrides_get_clean_errors(capsys, job, sets):
    try:
        text = tomli_w.dumps(job)
    except (TypeError, ValueError):  # not representable in TOML (e.g. a bare scalar at the top)
        text = "\n".join(f"{k} = {v!r}" for k, v in job.items())
    check_cli(capsys, text, sets)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from(list("[]=\"'.=#\n abc123-_{},")), max_size=60))
def test_garbage_text_gets_clean_errors(capsys, text):
    check_cli(capsys, text, [])
