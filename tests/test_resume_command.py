"""The command a stop prints for going on starts as the user started runjob, so it can be pasted.

``uv run runjob JOB`` leaves ``runjob`` off the user's PATH: ``runjob JOB --resume`` would fail
there (exit 127). The printed command repeats ``uv run ...``, ``python -m runjob``, the virtual
environment's full path, ``torchrun ...`` or ``accelerate launch ...``, as it was typed. The
detection is checked on faked command lines (the parent's, as the system shows them); a real run
started by the full path checks that what it prints, pasted into a shell, goes on. ``uv run``,
``python -m runjob`` (its command pasted into a shell too) and runjob's own launcher of several
processes are test_stops.py's."""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path

import pytest
from test_stops import JOB, VENV_BIN, path_without_venv, stops  # noqa: F401 - stops: the fixture

from runjob.record import invocation
from runjob.record.invocation import command_prefix, detect
from runjob.testing import run_process_group

VENV = "/proj/.venv"
UV = "/home/me/.local/bin/uv"
ARGUMENTS = ["job.toml", "--output-dir", "out"]
SCRIPTS = {f"{VENV}/bin/torchrun", f"{VENV}/bin/accelerate", f"{VENV}/bin/runjob"}


def fake_which(*found: str):
    """shutil.which for a PATH that holds exactly the files ``found`` (full paths)."""

    def which(name: str, path: str | None = None) -> str | None:
        folders = (path or "").split(os.pathsep)
        for folder in folders:
            candidate = os.path.join(folder, name)
            if candidate in found:
                return candidate
        return None

    return which


def detected(own, ancestors, *, path, found=(), **environ):
    environ = {"PATH": os.pathsep.join(path), **environ}
    return detect(own, ARGUMENTS, ancestors, environ, fake_which(*found), lambda word: word in SCRIPTS)


SHELL = ["-bash"]


def test_under_uv_run_the_command_is_uvs_as_typed():
    """uv puts the project's .venv/bin on its child's PATH only: the command is uv's own."""
    path, found = [f"{VENV}/bin", "/home/me/.local/bin", "/usr/bin"], [UV, f"{VENV}/bin/runjob"]
    uv_env = {"UV": UV, "VIRTUAL_ENV": VENV}
    uv_run = [UV, "run", "--locked", "--project", "/proj", "runjob", *ARGUMENTS]
    own = [f"{VENV}/bin/runjob"]
    assert detected(own, [uv_run, SHELL], path=path, found=found, **uv_env) == [
        "uv",
        "run",
        "--locked",
        "--project",
        "/proj",
        "runjob",
    ]
    python_m = [UV, "run", "python", "-m", "runjob", *ARGUMENTS]
    own = [f"{VENV}/bin/python", "-m", "runjob"]
    assert detected(own, [python_m], path=path, found=found, **uv_env) == ["uv", "run", "python", "-m", "runjob"]
    # uv not on the PATH by its name (a shim, another copy): its full path, which works anywhere
    assert detected([f"{VENV}/bin/runjob"], [uv_run], path=path, found=[f"{VENV}/bin/runjob"], **uv_env) == [
        UV,
        "run",
        "--locked",
        "--project",
        "/proj",
        "runjob",
    ]
    # a uv binary of another name, known by $UV
    renamed = ["/opt/uv-0.13", "run", "runjob", *ARGUMENTS]
    assert detected(own, [renamed], path=path, UV="/opt/uv-0.13", VIRTUAL_ENV=VENV)[:3] == [
        "/opt/uv-0.13",
        "run",
        "runjob",
    ]


def test_under_uv_but_started_by_something_else_the_environments_own_paths_stay_whole():
    """``uv run ./train.sh`` whose script runs runjob: the PATH that finds ``runjob`` is uv's doing."""
    path, found = [f"{VENV}/bin", "/usr/bin"], [f"{VENV}/bin/runjob"]
    script = ["bash", "./train.sh"]
    own = [f"{VENV}/bin/runjob"]
    assert detected(own, [script], path=path, found=found, UV=UV, VIRTUAL_ENV=VENV) == own
    # the same PATH of the user's own making (an activated environment): the name is enough
    assert detected(own, [script], path=path, found=found, VIRTUAL_ENV=VENV) == ["runjob"]


def test_python_m_runjob_keeps_the_interpreter_it_was_given():
    assert detected(["python", "-m", "runjob"], [SHELL], path=["/usr/bin"]) == ["python", "-m", "runjob"]
    interpreter = f"{VENV}/bin/python"
    own = [interpreter, "-m", "runjob"]
    assert detected(own, [SHELL], path=["/usr/bin"], found=["/usr/bin/python"]) == own, "another python on PATH"
    assert detected(own, [SHELL], path=[f"{VENV}/bin"], found=[interpreter]) == ["python", "-m", "runjob"]


def test_the_runjob_script_is_named_by_its_full_path_unless_the_path_finds_that_very_file():
    own = [f"{VENV}/bin/runjob"]
    assert detected(own, [SHELL], path=["/usr/bin"]) == own, "not on the PATH"
    assert detected(own, [SHELL], path=["/usr/local/bin", f"{VENV}/bin"], found=["/usr/local/bin/runjob", *own]) == own
    assert detected(own, [SHELL], path=[f"{VENV}/bin"], found=own) == ["runjob"]
    assert detected([".venv/bin/runjob"], [SHELL], path=["/usr/bin"]) == [".venv/bin/runjob"], "as typed"


@pytest.mark.parametrize(
    ("launcher", "expected"),
    [
        (
            [f"{VENV}/bin/python", f"{VENV}/bin/torchrun", "--nproc-per-node", "2", "-m", "runjob", *ARGUMENTS],
            ["torchrun", "--nproc-per-node", "2", "-m", "runjob"],
        ),
        (
            ["python3", "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "runjob", *ARGUMENTS],
            ["python3", "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "runjob"],
        ),
        (
            [f"{VENV}/bin/python", f"{VENV}/bin/accelerate", "launch", "--num_processes", "2", "-m", "runjob"]
            + ARGUMENTS,
            ["accelerate", "launch", "--num_processes", "2", "-m", "runjob"],
        ),
    ],
    ids=["torchrun", "python-m-torch.distributed.run", "accelerate-launch"],
)
def test_a_worker_of_a_launcher_gives_the_launchers_command(launcher, expected):
    """The worker runs ``python -u -m runjob ARGS``; the user typed the launcher's command (shown
    by the system as its interpreter and script)."""
    own = [f"{VENV}/bin/python", "-m", "runjob"]
    found = [f"{VENV}/bin/torchrun", f"{VENV}/bin/accelerate", f"{VENV}/bin/python"]
    assert detected(own, [launcher, SHELL], path=[f"{VENV}/bin", "/usr/bin"], found=found) == expected


def test_a_launcher_under_uv_run_gives_the_whole_command():
    torchrun = [f"{VENV}/bin/python", f"{VENV}/bin/torchrun", "--nproc-per-node", "2", "-m", "runjob", *ARGUMENTS]
    uv_run = [UV, "run", "torchrun", "--nproc-per-node", "2", "-m", "runjob", *ARGUMENTS]
    own = [f"{VENV}/bin/python", "-m", "runjob"]
    found = [UV, f"{VENV}/bin/torchrun"]
    got = detected(own, [torchrun, uv_run, SHELL], path=[f"{VENV}/bin", "/home/me/.local/bin"], found=found, UV=UV)
    assert got == ["uv", "run", "torchrun", "--nproc-per-node", "2", "-m", "runjob"]


def test_a_parent_that_is_no_launcher_or_ran_another_command_is_not_the_users_command():
    own = ["python", "-m", "runjob"]
    # a script called with the same arguments: it may not pass on --resume, so it is not repeated
    assert detected(own, [["bash", "train.sh", *ARGUMENTS]], path=["/usr/bin"]) == own
    # uv ran something else, which started runjob with other arguments
    assert detected(own, [[UV, "run", "sweep.py"]], path=["/usr/bin"], UV=UV) == own


def test_a_process_runjob_started_says_what_its_starter_was_given(monkeypatch):
    """runjob's own launcher passes its answer to its workers (their parent's command line ends
    with its own arguments, not theirs)."""
    monkeypatch.setenv(invocation.ENVIRONMENT, "uv run --locked runjob")
    assert command_prefix() == ["uv", "run", "--locked", "runjob"]


def test_the_library_called_from_a_program_that_is_not_runjob_says_runjob(monkeypatch):
    monkeypatch.delenv(invocation.ENVIRONMENT, raising=False)
    assert command_prefix() == ["runjob"]  # pytest is this process's program


def test_the_recorded_command_hides_a_password_in_how_runjob_was_started(monkeypatch):
    from runjob.train.entry import resume_command

    monkeypatch.setenv(invocation.ENVIRONMENT, "uv run --index-url https://me:s3cret@pypi.example/simple runjob")
    printed = resume_command("job.toml", [], Path("out"))
    recorded = resume_command("job.toml", [], Path("out"), redacted=True)
    assert printed.startswith("uv run --index-url https://me:s3cret@pypi.example/simple runjob job.toml ")
    assert recorded.startswith("uv run --index-url 'https://me:***@pypi.example/simple' runjob job.toml ")


# ---------------------------------------------------------------------------------------------
# Real runs: the printed command, pasted into a shell


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_command_printed_by_a_stopped_run_pasted_into_a_shell_goes_on(stops):  # noqa: F811
    """Started by the virtual environment's full path, from a shell where it is not active."""
    start = [str(VENV_BIN / "runjob")]
    stops.write_job("job.toml", JOB + "    max_steps = 10\n")  # test_stops.py's, 10 steps: stopped at 6
    env = stops.env(SIGNAL_AT_STEP="6", SIGNAL="SIGTERM", PATH=path_without_venv())
    env.pop("UV", None)  # started from the user's shell, not under uv run
    stopped = run_process_group([*start, *ARGUMENTS], stops.path, env, timeout=240)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    command = f"{shlex.join(start)} job.toml --output-dir out --resume"
    assert stopped.stderr.splitlines()[-1] == f"runjob: to go on: {command}"
    assert stops.record("out").tags["runjob.resume_command"] == command

    del env["SIGNAL_AT_STEP"]
    resumed = run_process_group(["bash", "-c", command], stops.path, env, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming step-00000006" in resumed.stdout
    assert stops.record("out").status == "FINISHED"
