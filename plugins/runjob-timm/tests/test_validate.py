"""The model `timm` seen from `runjob plugins` and `runjob validate`: listed, its architecture
checked against the shipped name list (with close names) without importing torch or timm."""

import subprocess
import sys

import pytest
from runjob_timm import TimmOptions, names
from timm_jobs import VIT, digits_job

JOB = digits_job("timm-validate", VIT, image_size=16)


def line_of(path, start: str) -> int:
    """The line number of the first line of job file ``path`` that starts with ``start``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.startswith(start))


def test_runjob_lists_the_timm_model(tester):
    result = tester.cli("plugins", "--long")
    assert result.returncode == 0, result.stderr
    assert "timm  (runjob-timm 0.1.0, runjob_timm)" in result.stdout
    assert "models: timm" in result.stdout
    assert "any timm image model by name" in result.stdout
    assert "FAILED: timm" not in result.stdout


def test_a_wrong_arch_is_refused_at_its_line_with_close_names(tester):
    job = tester.write_job("job.toml", JOB.replace('"test_vit"', '"vit_tiny_patch16_2244"'))
    result = tester.cli("validate", "job.toml")
    assert result.returncode == 2
    listed = names.known()
    assert result.stderr_lines == [
        f"runjob: job.toml:{line_of(job, 'arch')}: model.arch: 'vit_tiny_patch16_2244' is not a timm "
        f"{listed.version} architecture; did you mean 'vit_tiny_patch16_224' or 'deit_tiny_patch16_224' or "
        f"'vit_tiny_patch16_384'? the {len(listed.tags)} names are in runjob_timm/architectures.txt "
        "(got 'vit_tiny_patch16_2244')"
    ]
    assert result.stdout == ""


def test_tags_and_kwargs_are_checked_too(tester):
    job = tester.write_job("job.toml", JOB.replace("patch_size = 4", "patch_size = 4, img_size = 8"))
    result = tester.cli("validate", "job.toml", "--set", "model.arch=test_vit.r160_in1")
    assert result.returncode == 2
    assert sorted(result.stderr_lines) == [
        f"runjob: --set model.arch=test_vit.r160_in1: model.arch: timm {names.known().version} has no pretrained "
        "tag 'r160_in1' for test_vit; did you mean 'r160_in1k'? its tags: r160_in1k (got 'test_vit.r160_in1')",
        f"runjob: job.toml:{line_of(job, 'kwargs')}: model.kwargs: 'img_size' is an option of its own: set "
        "model.img_size, not model.kwargs.img_size (got {'patch_size': 4, 'img_size': 8})",
    ]


def test_validate_imports_neither_torch_nor_timm(tester):
    tester.write_job("job.toml", JOB)
    tester.write_job("bad.toml", JOB.replace('"test_vit"', '"test_vitt"'))
    heavy = ("torch", "timm", "torchvision", "mlflow", "accelerate", "huggingface_hub")
    code = (
        "import sys\nfrom runjob.commands.cli import main\n"
        "codes = [main(['validate', 'job.toml']), main(['validate', 'bad.toml'])]\n"
        f"print('CODES', codes, 'HEAVY', [m for m in {heavy!r} if m in sys.modules])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tester.path, env=tester.env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "CODES [0, 2] HEAVY []", proc.stderr
    assert "did you mean 'test_vit'" in proc.stderr


def test_a_name_only_a_newer_timm_knows_is_left_to_it(monkeypatch):
    """The list is timm 1.0.31's; with another timm installed, a name the list lacks passes
    validation with a warning, and the installed timm decides at build time."""
    monkeypatch.setattr(names, "installed_timm", lambda: "99.0.0")
    with pytest.warns(UserWarning, match="'vit_from_the_future' is not among the architectures of timm 1.0.31"):
        options = TimmOptions(arch="vit_from_the_future", num_classes=10)
    from runjob_timm import build_timm

    with pytest.raises(ValueError, match=r"model.arch: 'vit_from_the_future' is not an architecture of timm \d"):
        build_timm(options, None)
    monkeypatch.setattr(names, "installed_timm", lambda: names.known().version)
    with pytest.raises(ValueError, match="is not a timm 1.0.31 architecture"):
        TimmOptions(arch="vit_from_the_future")


def test_the_shipped_list_is_the_installed_timm_s():
    import timm

    listed = names.known()
    if timm.__version__ != listed.version:
        pytest.skip(f"the list is timm {listed.version}'s, timm {timm.__version__} is installed")
    assert names.LIST.read_text(encoding="utf-8") == names.from_timm(), "run python -m runjob_timm.names"
    assert "test_vit" in listed.tags and listed.tags["test_vit"] == ("r160_in1k",)
    assert listed.deprecated["convnext_tiny_in22ft1k"] == "convnext_tiny.fb_in22k_ft_in1k"
