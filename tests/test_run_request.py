"""What a run is asked to do is decided once: whether and from where it resumes (Resume), and its
output folder, for every process and every command that starts a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from runjob.errors import RunjobError
from runjob.train.entry import run_arguments
from runjob.train.request import Resume, output_folder


@pytest.mark.parametrize(
    ("given", "job_default", "expected"),
    [
        (None, None, Resume()),
        (None, "auto", Resume("auto")),
        (False, "auto", Resume()),
        (True, None, Resume("newest")),
        ("auto", None, Resume("auto")),
        (Path("auto"), None, Resume("auto")),
        ("out/checkpoints/step-00000010", None, Resume("checkpoint", Path("out/checkpoints/step-00000010"))),
    ],
)
def test_resume_is_read_once_from_what_the_caller_gives_and_the_job_default(given, job_default, expected):
    assert Resume.parse(given, job_default) == expected


def test_the_output_folder_is_chosen_once_and_never_one_that_holds_a_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fresh = output_folder("digits", None, Resume())
    assert fresh.parent == Path("runs/digits") and not fresh.exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "job.toml").write_text("")
    with pytest.raises(RunjobError, match="already holds a run"):
        output_folder("digits", taken, Resume())
    assert output_folder("digits", taken, Resume(), launched=True) == taken, "the launcher checked it already"
    assert output_folder("digits", taken, Resume("newest")) == taken
    checkpoint = taken / "checkpoints" / "step-00000010"
    assert output_folder("digits", None, Resume("checkpoint", checkpoint)) == taken
    with pytest.raises(RunjobError, match="--resume auto .* needs --output-dir"):
        output_folder("digits", None, Resume("auto"))
    with pytest.raises(RunjobError, match="--resume needs --output-dir DIR"):
        output_folder("digits", None, Resume("newest"))


def test_a_worker_is_started_with_the_same_resume_and_the_plugins_left_out():
    words = run_arguments(Path("job.toml"), ["a=1"], Path("out"), Resume("auto"), {}, None, {"shadow": "flag"})
    assert words == [
        "run",
        "job.toml",
        "--output-dir",
        "out",
        "--resume",
        "auto",
        "--disable-plugin",
        "shadow",
        "--set",
        "a=1",
    ]
    assert run_arguments(Path("j.toml"), resume=Resume("newest")) == ["run", "j.toml", "--resume"]
