"""The command line: quick help, validate's output and exit codes, clean one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from runjob.commands.cli import _with_default_command
from runjob.testing import clean_env, write_job

HEAVY = ("torch", "torchvision", "mlflow", "accelerate")


def imported_after(tmp_path, call: str) -> list[str]:
    """Which heavy modules are imported after running ``call`` (Python source) in a fresh process."""
    code = (
        "import sys\nfrom runjob.commands.cli import main\n"
        f"try:\n    {call}\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=clean_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    line = [text for text in proc.stdout.splitlines() if text.startswith("HEAVY=")][-1]
    return [m for m in line.removeprefix("HEAVY=").split(",") if m]


@pytest.mark.e2e
def test_help_imports_no_heavy_library(tmp_path):
    assert imported_after(tmp_path, "main(['--help'])") == []


@pytest.mark.e2e
def test_validate_imports_no_torch_mlflow_or_accelerate(tmp_path, digits_folder):
    job = write_job(
        tmp_path / "job.toml",
        f'[model]\nname = "resnet18"\n[dataset]\nname = "imagefolder"\nroot = "{digits_folder}"\n',
    )
    assert imported_after(tmp_path, f"main(['validate', {str(job)!r}])") == []


def test_validate_prints_the_resolved_job(runjob_tester, digits_folder):
    runjob_tester.write_job(
        "job.toml", f'[model]\nname = "resnet18"\n[dataset]\nname = "imagefolder"\nroot = "{digits_folder}"\n'
    )
    result = runjob_tester.cli("validate", "job.toml", "--set", "optimizer.lr=0.05", "--set", "strategy.name=ddp")
    assert result.returncode == 0, result.stderr
    resolved = tomllib.loads(result.stdout)
    assert resolved["optimizer"] == {
        "name": "adamw",
        "lr": 0.05,
        "betas": [0.9, 0.999],
        "eps": 1e-08,
        "weight_decay": 0.01,
    }
    assert resolved["train"]["epochs"] == 1 and resolved["train"]["batch_size"] == 32
    assert resolved["dataset"]["root"] == str(digits_folder)


def test_bad_job_exits_2_with_one_line_per_problem(runjob_tester):
    runjob_tester.write_job(
        "job.toml",
        '[model]\nname = "resnet18"\nnum_classes = 1\n[dataset]\nname = "imagefolder"\nroot = "missing"\n'
        "[train]\nepochs = -1\n",
    )
    result = runjob_tester.cli("validate", "job.toml")
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3, result.stderr
    assert all(line.startswith("runjob: job.toml:") for line in lines)
    assert "Traceback" not in result.stderr


def test_syntax_error_exits_2(runjob_tester):
    runjob_tester.write_job("job.toml", "[model\nname = 1\n")
    result = runjob_tester.cli("job.toml")
    assert result.returncode == 2
    assert result.stderr.startswith("runjob: job.toml:1:")
    assert "Traceback" not in result.stderr


def test_bad_override_exits_2(runjob_tester):
    runjob_tester.write_job("job.toml", '[model]\nname = "resnet18"\n')
    result = runjob_tester.cli("validate", "job.toml", "--set", "optimizer.lr")
    assert result.returncode == 2
    assert "an override must look like table.key=value" in result.stderr


def test_no_command_shows_help(runjob_tester):
    result = runjob_tester.cli()
    assert result.returncode == 2
    assert "runjob JOB.toml" in result.stdout


def test_doctor_command_reports_and_exits_by_severity(runjob_tester):
    runjob_tester.write_job("job.toml", '[model]\nname = "resnet18"\n[dataset]\nname = "digits"\n')
    fine = runjob_tester.cli("doctor", "job.toml", "--json")
    assert fine.returncode == 0, fine.stdout + fine.stderr
    report = json.loads(fine.stdout)
    assert report["ok"] is True and {"torch", "plugins", "tracking"} <= {c["name"] for c in report["checks"]}
    blocked = runjob_tester.cli(
        "doctor", "job.toml", "--set", "train.mixed_precision=fp16", "--set", "tracking.uri=http://127.0.0.1:9"
    )
    assert blocked.returncode == 1
    assert "[FAIL] tracking" in blocked.stdout and "http://127.0.0.1:9" in blocked.stdout
    assert "[FAIL] mixed precision" in blocked.stdout


def test_validate_prints_the_plan_on_stderr(runjob_tester):
    runjob_tester.write_job(
        "job.toml", '[model]\nname = "resnet18"\n[dataset]\nname = "digits"\n[train]\nbatch_size = 16\n'
    )
    result = runjob_tester.cli(
        "validate", "job.toml", "--num-processes", "4", "--set", "train.gradient_accumulation_steps=2"
    )
    assert result.returncode == 0
    assert (
        "runjob: plan: batch: 16 per process x 4 = 64 global; gradient accumulation 2 -> 128 samples per optimizer step"
        in result.stderr
    )
    assert "[launch]\nnum_processes = 4" in result.stdout


def test_a_misspelt_command_is_one_line_with_the_closest_command(runjob_tester):
    runjob_tester.write_job("job.toml", '[model]\nname = "resnet18"\n[dataset]\nname = "digits"\n')
    result = runjob_tester.cli("swep", "job.toml")
    assert result.returncode == 2
    assert result.stderr == (
        "runjob: swep: no such command; did you mean 'sweep'? Commands: run, validate, doctor, plugins, runs, diff, "
        "rerun, sync, sweep, evaluate, predict, export, data\n"
    )
    # a job file is still a job without a command: one that is there, or one named *.toml
    (runjob_tester.path / "swep").write_text('[model]\nname = "resnet18"\n')
    assert _with_default_command(["swep"]) == ["run", "swep"]
    assert _with_default_command(["--disable-plugin", "x", "sweep.toml"]) == [
        "--disable-plugin",
        "x",
        "run",
        "sweep.toml",
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("validate", "job.toml", "--sett", "a.b=1"), "runjob: validate: unknown option --sett; did you mean '--set'?"),
        (("runs", "--limt", "3"), "runjob: runs: unknown option --limt; did you mean '--limit'?"),
        (
            ("validate", "job.toml", "--output-dir", "o"),
            "runjob: validate: unknown option --output-dir; it is an option of run, rerun, sweep",
        ),
        (
            ("--disable-plugn", "x", "validate", "job.toml"),
            "runjob: unknown option --disable-plugn before the command; did you mean '--disable-plugin'?",
        ),
        (("validate",), "runjob: validate: the following arguments are required: job"),
        (
            ("run", "job.toml", "--num-processes", "two"),
            "runjob: run: argument --num-processes: invalid int value: 'two'",
        ),
    ],
)
def test_argparse_errors_are_one_line_with_the_closest_option(runjob_tester, args, said):
    runjob_tester.write_job("job.toml", '[model]\nname = "resnet18"\n')
    result = runjob_tester.cli(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(said) and result.stderr.count("\n") == 1, result.stderr


def test_runs_shows_every_number_to_the_same_significant_digits():
    """A job value as long as the column (18 characters) was shown in full beside rounded ones."""
    from types import SimpleNamespace

    from runjob.commands.runs import results_table

    def run(run_id, lr, accuracy):
        params = {"job.name": "digits", "optimizer.lr": lr, "optimizer.weight_decay": "0.0", "train.batch_size": "32"}
        metrics = {"val/accuracy": accuracy, "train/loss": 0.25}
        return SimpleNamespace(
            info=SimpleNamespace(run_id=run_id), data=SimpleNamespace(params=params, metrics=metrics, tags={})
        )

    runs = [
        run("a", "0.8212461922256864", 0.8212461922256864),
        run("b", "0.0031622776601683794", 0.9),
        run("c", "0.001", 0.95),
    ]
    assert results_table(runs) == [
        "run id  optimizer.lr  val/accuracy  train/loss",
        "a       0.8212              0.8212        0.25",
        "b       0.003162               0.9        0.25",
        "c       0.001                 0.95        0.25",
    ]


def test_each_shipped_job_has_a_name_of_its_own():
    """``job.name`` names the MLflow experiment: two jobs sharing one mix their runs in `runjob runs`."""
    from helpers import REPO

    names: dict[str, list[str]] = {}
    for path in sorted((REPO / "jobs").glob("*.toml")):
        job = tomllib.loads(path.read_text(encoding="utf-8"))
        names.setdefault(job.get("job", {}).get("name", ""), []).append(path.name)
    assert {name: files for name, files in names.items() if len(files) > 1} == {}


CSV_JOB = """
[task]
name = "regression"
[model]
name = "mlp"
in_features = 1
outputs = 1
[dataset]
name = "csv"
path = "rows.csv"
target = "y"
{extra}
"""


@pytest.mark.parametrize(
    ("extra", "overrides", "blamed"),
    [
        ("", ["dataset.val_fraction=0.99"], "--set dataset.val_fraction=0.99: [dataset] csv: "),
        ("val_fraction = 0.99", [], "job.toml:8: [dataset] csv: "),  # the line of [dataset]'s name
    ],
)
def test_a_mistake_found_as_the_data_loads_names_the_override_that_made_it(runjob_tester, extra, overrides, blamed):
    """val_fraction = 0.99 of 5 rows leaves no training row: found only when the file is read."""
    from runjob.errors import RunjobError
    from runjob.host.plugin_host import load_plugins
    from runjob.job.validation import load_resolved

    (runjob_tester.path / "rows.csv").write_text("x,y\n" + "".join(f"{i},{2 * i}\n" for i in range(5)))
    job_file = runjob_tester.write_job("job.toml", CSV_JOB.format(extra=extra))
    job = load_resolved(job_file, overrides, load_plugins())
    with pytest.raises(RunjobError) as raised:
        job.dataset.component.factory(job.dataset.options)
    said = str(raised.value).replace(f"{runjob_tester.path}/", "")
    assert said.startswith(blamed) and "too few for a training and a validation split" in said, said


@pytest.mark.parametrize(
    ("resume", "said"),
    [
        (
            ["--resume", "job.toml"],
            "runjob: --resume job.toml: a file, not a checkpoint folder; give a checkpoint folder",
        ),
        (["--resume", "nowhere"], "runjob: --resume nowhere: no such folder; give a checkpoint folder"),
        (["--output-dir", "out", "--resume"], "runjob: --resume: no complete checkpoint in out/checkpoints"),
    ],
)
def test_a_resume_with_nothing_to_resume_is_refused_before_anything_is_said(runjob_tester, resume, said):
    runjob_tester.write_job("job.toml", '[model]\nname = "resnet18"\n[dataset]\nname = "digits"\n')
    (runjob_tester.path / "out").mkdir()
    result = runjob_tester.cli("run", "job.toml", *resume)
    assert result.returncode == 2
    assert result.stdout == "", "no `resuming in ...` line"
    assert result.stderr.startswith(said) and result.stderr.count("\n") == 1, result.stderr
