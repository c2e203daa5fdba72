"""The command line: quick help, validate's output and exit codes, clean one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

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
