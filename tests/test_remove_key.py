"""The value "!remove" takes out a key (or a table) a base job file or an earlier --set set:
in a job file that extends another (key = "!remove") and on the command line (--set key=!remove)."""

from __future__ import annotations

import pytest

from runjob.errors import JobError
from runjob.job.jobfile import load_job

BASE = """
[job]
name = "base"
[model]
name = "resnet18"
pretrained = true
[train]
lr = 0.1
epochs = 3
"""


@pytest.fixture
def base(tmp_path):
    (tmp_path / "base.toml").write_text(BASE, encoding="utf-8")
    return tmp_path


def test_a_job_that_extends_another_removes_a_key_it_sets(base):
    (base / "job.toml").write_text('extends = "base.toml"\n[model]\npretrained = "!remove"\n', encoding="utf-8")
    job = load_job(base / "job.toml")
    assert job.data["model"] == {"name": "resnet18"}
    assert "model.pretrained" not in job.origins
    assert job.origin("model.name").file.endswith("base.toml")


def test_a_whole_table_is_removed_and_a_later_file_may_set_it_again(base):
    (base / "middle.toml").write_text('extends = "base.toml"\ntrain = "!remove"\n', encoding="utf-8")
    (base / "job.toml").write_text('extends = "middle.toml"\n[train]\nepochs = 1\n', encoding="utf-8")
    job = load_job(base / "job.toml")
    assert job.data["train"] == {"epochs": 1}, "the base's lr is gone with its table"
    assert "train.lr" not in job.origins


def test_set_removes_a_key(base):
    job = load_job(base / "base.toml", ["model.pretrained=!remove", "train.lr=0.5"])
    assert job.data["model"] == {"name": "resnet18"} and job.data["train"]["lr"] == 0.5
    assert "model.pretrained" not in job.origins


def test_a_later_set_may_set_a_removed_key_again(base):
    job = load_job(base / "base.toml", ["model.pretrained=!remove", "model.pretrained=false"])
    assert job.data["model"]["pretrained"] is False
    assert job.origin("model.pretrained").from_override


def test_removing_what_nothing_sets_is_a_mistake(base):
    with pytest.raises(JobError) as raised:
        load_job(base / "base.toml", ["model.pretraned=!remove"])
    assert str(raised.value) == (
        '--set model.pretraned=!remove: model.pretraned: "!remove" removes a key set by a base job file '
        "(extends) or before it; nothing sets model.pretraned there"
    )
    (base / "job.toml").write_text('extends = "base.toml"\n[model]\npretraned = "!remove"\n', encoding="utf-8")
    with pytest.raises(JobError) as raised:
        load_job(base / "job.toml")
    assert str(raised.value).startswith(f"{base / 'job.toml'}:3: model.pretraned: ")


def test_a_removed_option_falls_back_to_its_default_when_validated(tester):
    tester.write_job(
        "base.toml",
        """
        [job]
        name = "removed"
        [model]
        name = "resnet18"
        num_classes = 10
        weights = "DEFAULT"
        [dataset]
        name = "digits"
        """,
    )
    tester.write_job("job.toml", 'extends = "base.toml"\n[model]\nweights = "!remove"\n')
    result = tester.cli("validate", "job.toml", "--set", "model.num_classes=!remove")
    assert result.returncode == 0, result.stderr
    model = result.stdout.split("[model]")[1].split("\n[")[0]
    assert "weights" not in model and "num_classes" not in model, "the options' defaults: none, the dataset's classes"
    assert "zero_init_residual = false" in model
