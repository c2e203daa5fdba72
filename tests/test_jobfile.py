"""Reading job files: syntax errors, extends, overrides and where each value came from."""

from __future__ import annotations

import pytest

from runjob.errors import JobError
from runjob.job.jobfile import key_lines, load_job, parse_override_value
from runjob.testing import write_job


def test_syntax_error_names_file_line_and_column(tmp_path):
    job = write_job(
        tmp_path / "bad.toml",
        """
        [train]
        epochs = 3
        batch_size = = 4
    """,
    )
    with pytest.raises(JobError) as caught:
        load_job(job)
    assert str(caught.value).startswith(f"{job}:3:")
    assert "TOML syntax error" in str(caught.value)


def test_missing_job_file_is_named(tmp_path):
    with pytest.raises(JobError, match="job file not found"):
        load_job(tmp_path / "nope.toml")


def test_key_lines_follow_tables_and_dotted_keys():
    text = '[job]\nname = "x"\n\n[optimizer]\nlr = 0.1\nbetas = [0.9,\n  0.99]\n[train]\n"log_every" = 5\nsub.key = 1\n'
    lines = key_lines(text)
    assert lines["job.name"] == 2
    assert lines["optimizer"] == 4
    assert lines["optimizer.lr"] == 5
    assert lines["train.log_every"] == 9
    assert lines["train.sub.key"] == 10


def test_extends_deep_merges_and_keeps_origins(tmp_path):
    base = write_job(
        tmp_path / "base" / "base.toml",
        """
        [model]
        name = "resnet18"
        num_classes = 10
        [train]
        epochs = 3
        batch_size = 32
    """,
    )
    child = write_job(
        tmp_path / "child.toml",
        """
        extends = "base/base.toml"
        [train]
        epochs = 5
    """,
    )
    job = load_job(child)
    assert job.data["train"] == {"epochs": 5, "batch_size": 32}
    assert job.data["model"] == {"name": "resnet18", "num_classes": 10}
    assert "extends" not in job.data
    assert job.origin("train.epochs").file == str(child)
    assert job.origin("train.batch_size").file == str(base)
    assert job.origin("train.batch_size").line == 6


def test_extends_chain_and_loop(tmp_path):
    write_job(tmp_path / "a.toml", 'extends = "b.toml"\n[job]\nname = "a"\n')
    write_job(tmp_path / "b.toml", 'extends = "c.toml"\n[job]\nseed = 1\n')
    write_job(tmp_path / "c.toml", '[job]\nname = "c"\ndescription = "from c"\n')
    assert load_job(tmp_path / "a.toml").data["job"] == {"name": "a", "seed": 1, "description": "from c"}
    write_job(tmp_path / "c.toml", 'extends = "a.toml"\n')
    with pytest.raises(JobError, match="loop"):
        load_job(tmp_path / "a.toml")


def test_missing_base_names_the_path(tmp_path):
    job = write_job(tmp_path / "child.toml", 'extends = "missing.toml"\n')
    with pytest.raises(JobError) as caught:
        load_job(job)
    assert f"{job}:1: extends: base job file not found: {tmp_path / 'missing.toml'}" == str(caught.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0.05", 0.05),
        ("3", 3),
        ("true", True),
        ("ddp", "ddp"),
        ('"quoted"', "quoted"),
        ("[1, 2]", [1, 2]),
        ("http://h:5000", "http://h:5000"),
    ],
)
def test_override_values_are_toml_or_bare_strings(text, value):
    assert parse_override_value(text) == value


def test_overrides_apply_in_order_and_are_marked(tmp_path):
    job = write_job(tmp_path / "job.toml", '[optimizer]\nname = "sgd"\nlr = 0.1\n')
    loaded = load_job(job, ["optimizer.lr=0.05", "strategy.name=ddp", "optimizer.lr=0.01"])
    assert loaded.data["optimizer"]["lr"] == 0.01
    assert loaded.data["strategy"] == {"name": "ddp"}
    assert loaded.origin("optimizer.lr").file == "--set optimizer.lr=0.01", "the override that set it last"
    assert loaded.origin("strategy").file == "--set strategy.name=ddp", "the table it created"
    assert loaded.origin("optimizer").file == str(job), "a table of the file stays the file's"


@pytest.mark.parametrize("override", ["optimizer.lr", "=3", "optimizer..lr=1", "optimizer.name.x=1"])
def test_malformed_overrides_are_reported(tmp_path, override):
    job = write_job(tmp_path / "job.toml", '[optimizer]\nname = "sgd"\n')
    with pytest.raises(JobError) as caught:
        load_job(job, [override])
    assert str(caught.value).startswith(f"--set {override}: ")
