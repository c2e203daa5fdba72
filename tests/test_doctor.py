"""``runjob doctor``: the environment checks, their verdicts and the two report formats."""

from __future__ import annotations

import http.server
import json
import shutil
import subprocess
import sys
import threading
import time
from collections import namedtuple

import pytest
import torch

from runjob.commands import doctor
from runjob.host.plugin_host import PluginFailure, PluginHost, load_plugins
from runjob.job.validation import load_resolved
from runjob.testing import free_port, write_job

NO_CUDA = not torch.cuda.is_available()
cpu_only = pytest.mark.skipif(not NO_CUDA, reason="asserts what happens on a machine without CUDA")


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return load_plugins()


@pytest.fixture(autouse=True)
def private_tracking(tmp_path, monkeypatch):
    """No test reads the real MLflow settings or touches the working directory's mlflow.db."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")


@pytest.fixture
def make_job(tmp_path, host):
    def make(*overrides: str):
        path = write_job(
            tmp_path / "job.toml",
            """
            [model]
            name = "resnet18"
            num_classes = 10
            [dataset]
            name = "digits"
            """,
        )
        return load_resolved(path, list(overrides), host)

    return make


def by_name(checks: list[doctor.Check], name: str) -> doctor.Check:
    found = [c for c in checks if c.name == name]
    assert len(found) == 1, f"expected one {name!r} check in {checks}"
    return found[0]


@pytest.fixture
def health_server():
    """A tiny HTTP server on 127.0.0.1 answering GET /health with the status the test sets."""
    answer = {"status": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = answer["status"] if self.path == "/health" else 404
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answer
    finally:
        server.shutdown()
        server.server_close()


# --- the whole doctor -------------------------------------------------------------------------


@cpu_only
def test_plain_environment_passes_with_no_cuda_as_a_warning(tmp_path, host):
    checks = doctor.collect_checks(host=host)

    torch_check = by_name(checks, "torch")
    assert torch_check.status == "warn"
    assert torch.__version__ in torch_check.detail and "CUDA is not available" in torch_check.detail
    assert by_name(checks, "gloo").status == "ok"
    assert by_name(checks, "tracking").status == "ok"
    assert by_name(checks, "plugins").detail == f"{len(host.plugins)} plugin(s) loaded"
    assert [c for c in checks if c.status == "fail"] == []
    assert doctor.exit_code(checks) == 0
    assert not (tmp_path / "mlflow.db").exists(), "checking the tracking store must not create it"


def test_versions_are_reported():
    import accelerate
    import mlflow

    import runjob

    checks = doctor.collect_checks(host=PluginHost())
    assert by_name(checks, "runjob").detail == runjob.__version__
    assert by_name(checks, "accelerate").detail == accelerate.__version__
    assert by_name(checks, "mlflow").detail == mlflow.__version__
    assert by_name(checks, "python").detail.startswith(f"{sys.version_info.major}.{sys.version_info.minor}.")


def test_importing_the_doctor_imports_no_heavy_library():
    code = (
        "import sys, runjob.commands.doctor; "
        "heavy = ('torch', 'mlflow', 'accelerate', 'boto3', 'botocore', 'litdata'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_check_that_raises_becomes_its_failure_and_the_others_still_run(monkeypatch):
    def broken() -> list[doctor.Check]:
        raise ImportError("No module named 'accelerate'\nmore lines")

    monkeypatch.setattr(doctor, "check_accelerate", broken)
    checks = doctor.collect_checks(host=PluginHost())

    assert by_name(checks, "accelerate") == doctor.Check(
        "accelerate", "fail", "the check failed: ImportError: No module named 'accelerate'"
    )
    assert by_name(checks, "mlflow").status == "ok"
    assert doctor.exit_code(checks) == 1


# --- mixed precision --------------------------------------------------------------------------


@cpu_only
def test_fp16_without_cuda_fails(make_job):
    job = make_job("train.mixed_precision=fp16", "dataset.num_workers=4")
    checks = doctor.check_torch(job)

    precision = by_name(checks, "mixed precision")
    assert precision.status == "fail"
    assert "'fp16' needs a GPU" in precision.detail and "'bf16'" in precision.detail
    assert doctor.exit_code(checks) == 1


@cpu_only
def test_bf16_and_no_precision_pass_on_the_cpu(make_job):
    for precision in ("bf16", "no"):
        check = by_name(doctor.check_torch(make_job(f"train.mixed_precision={precision}")), "mixed precision")
        assert check.status == "ok", check


@cpu_only
def test_compile_on_the_cpu_needs_a_cxx_compiler(make_job, monkeypatch):
    assert [c.name for c in doctor.check_torch(make_job())] == ["torch", "mixed precision"]  # not asked, not checked
    assert (
        by_name(doctor.check_torch(make_job("train.compile=true")), "compile").status == "ok"
    )  # g++ is on this machine
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    check = by_name(doctor.check_torch(make_job("train.compile=true")), "compile")
    assert check.status == "fail" and "C++ compiler" in check.detail


def test_no_precision_check_without_a_job():
    assert [c.name for c in doctor.check_torch()] == ["torch"]


@pytest.fixture
def simulated_gpus(monkeypatch):
    """torch.cuda answering as on a machine with two GPUs without bf16 (this machine has none)."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: SimpleNamespace(name="Tesla V100", total_memory=32 << 30)
    )
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Tesla V100")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)


def test_gpus_are_listed_with_name_and_memory(simulated_gpus, monkeypatch):
    [check] = doctor.check_torch()
    assert check.status == "ok"
    assert "2 GPU(s): cuda:0 Tesla V100 32.0 GiB; cuda:1 Tesla V100 32.0 GiB" in check.detail

    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    [nccl] = doctor.check_distributed()
    assert (nccl.name, nccl.status) == ("nccl", "warn")


def test_bf16_on_a_gpu_without_it_fails_and_fp16_passes(simulated_gpus, make_job):
    bf16 = by_name(doctor.check_torch(make_job("train.mixed_precision=bf16")), "mixed precision")
    assert bf16.status == "fail" and "Tesla V100 does not support bf16" in bf16.detail
    assert by_name(doctor.check_torch(make_job("train.mixed_precision=fp16")), "mixed precision").status == "ok"


def test_fp16_with_train_cpu_fails_even_with_gpus(simulated_gpus, make_job):
    check = by_name(doctor.check_torch(make_job("train.mixed_precision=fp16", "train.cpu=true")), "mixed precision")
    assert check.status == "fail" and "train.cpu = true" in check.detail


# --- MLflow tracking URI ----------------------------------------------------------------------


def test_unreachable_tracking_server_fails_quickly_naming_the_uri(monkeypatch):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)

    started = time.monotonic()
    [check] = doctor.check_tracking()
    assert time.monotonic() - started < 4

    assert check.status == "fail"
    assert uri in check.detail and "unreachable" in check.detail and "$MLFLOW_TRACKING_URI" in check.detail
    assert "Connection refused" in check.detail and "\n" not in check.detail


def test_tracking_server_answering_health_passes(monkeypatch, health_server):
    uri, _ = health_server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri + "/")
    [check] = doctor.check_tracking()
    assert check.status == "ok"
    assert "answered /health with 200" in check.detail


def test_tracking_server_answering_an_error_fails(monkeypatch, health_server):
    uri, answer = health_server
    answer["status"] = 503
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    [check] = doctor.check_tracking()
    assert check.status == "fail"
    assert "503" in check.detail


def test_the_jobs_tracking_uri_wins_over_the_environment(make_job, health_server):
    uri, _ = health_server  # the environment points at a sqlite file (private_tracking)
    [check] = doctor.check_tracking(make_job(f"tracking.uri={uri}"))
    assert check.status == "ok"
    assert f"{uri} (from tracking.uri)" in check.detail


def test_sqlite_in_a_missing_folder_fails(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-folder"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{missing / 'mlflow.db'}")
    [check] = doctor.check_tracking()
    assert check.status == "fail"
    assert f"folder {missing} does not exist" in check.detail
    assert not missing.exists()


def test_relative_sqlite_path_is_taken_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    [check] = doctor.check_tracking()
    assert check.status == "ok"
    assert str(tmp_path / "mlflow.db") in check.detail
    assert not (tmp_path / "mlflow.db").exists()


def test_mlflow_default_uri_is_used_without_job_or_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(tmp_path)
    [check] = doctor.check_tracking()
    assert check.status == "ok"
    assert "from MLflow's default" in check.detail and "sqlite:" in check.detail
    assert not (tmp_path / "mlflow.db").exists()


def test_other_schemes_are_a_warning_that_nothing_was_checked(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "databricks")
    [check] = doctor.check_tracking()
    assert check.status == "warn"
    assert "not checked" in check.detail


# --- /dev/shm ---------------------------------------------------------------------------------

Usage = namedtuple("Usage", "total used free")
SMALL_SHM = Usage(64 << 20, 0, 64 << 20)  # Docker's default 64 MiB


def test_small_shm_with_workers_warns(make_job, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SMALL_SHM)
    [check] = doctor.check_shared_memory(make_job("dataset.num_workers=4"))
    assert check.status == "warn"
    assert "num_workers = 4" in check.detail and "--shm-size=8g" in check.detail


def test_small_shm_without_workers_is_fine(make_job, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SMALL_SHM)
    assert doctor.check_shared_memory(make_job("dataset.num_workers=0"))[0].status == "ok"
    assert doctor.check_shared_memory(None)[0].status == "ok"


def test_large_shm_with_workers_is_fine(make_job, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(8 << 30, 0, 8 << 30))
    [check] = doctor.check_shared_memory(make_job("dataset.num_workers=4"))
    assert check.status == "ok"
    assert "8.0 GiB free" in check.detail


def test_missing_shm_warns(monkeypatch):
    def missing(path):
        raise FileNotFoundError(path)

    monkeypatch.setattr(shutil, "disk_usage", missing)
    [check] = doctor.check_shared_memory()
    assert check.status == "warn"
    assert "does not exist" in check.detail


# --- plugins ----------------------------------------------------------------------------------


def test_failed_plugin_fails_with_its_name_distribution_version_and_error():
    host = PluginHost()
    host.failures.append(PluginFailure("broken", "runjob-broken", "1.2.3", "ImportError: no module named 'nope'"))
    checks = doctor.check_plugins(host)

    assert by_name(checks, "plugin broken").status == "fail"
    assert (
        by_name(checks, "plugin broken").detail
        == "broken (runjob-broken 1.2.3) failed to load: ImportError: no module named 'nope'"
    )
    assert by_name(checks, "plugins").status == "ok"
    assert doctor.exit_code(checks) == 1


def test_duplicate_component_fails(host):
    component = host.components["model"]["resnet18"]
    duplicated = PluginHost()
    duplicated.plugins = host.plugins
    duplicated.duplicates[("model", "resnet18")] = [component, component]
    [duplicate, _] = doctor.check_plugins(duplicated)
    assert duplicate.status == "fail"
    assert "'resnet18' is registered by more than one plugin" in duplicate.detail


def test_plugins_are_loaded_when_no_host_is_given(host):
    assert by_name(doctor.check_plugins(), "plugins").detail == f"{len(host.plugins)} plugin(s) loaded"


# --- reports ----------------------------------------------------------------------------------

MIXED = [
    doctor.Check("torch", "warn", "no CUDA"),
    doctor.Check("mlflow", "ok", "3.0"),
    doctor.Check("tracking", "fail", "unreachable"),
]


def test_text_report_has_a_line_a_check_and_a_summary():
    lines = doctor.report_text(MIXED).splitlines()
    assert lines == [
        "[warn] torch: no CUDA",
        "[ ok ] mlflow: 3.0",
        "[FAIL] tracking: unreachable",
        "1 ok, 1 warning(s), 1 failure(s): fix the failures before training",
    ]
    assert doctor.report_text(MIXED[:2]).splitlines()[-1].endswith("ready to train")


def test_json_report_parses_and_is_not_ok_with_a_failure():
    report = json.loads(doctor.report_json(MIXED))
    assert report["ok"] is False
    assert report["checks"][2] == {"name": "tracking", "status": "fail", "detail": "unreachable"}
    assert json.loads(doctor.report_json(MIXED[:2]))["ok"] is True


def test_exit_code_and_status_values():
    assert doctor.exit_code(MIXED) == 1
    assert doctor.exit_code(MIXED[:2]) == 0
    assert doctor.exit_code([]) == 0
    with pytest.raises(ValueError):
        doctor.Check("x", "error", "not a status")
