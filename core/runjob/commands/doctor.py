"""``runjob doctor``: check the environment before anyone spends GPU hours on a job.

Each check is a short function returning :class:`Check` results: "ok", "warn" (worth knowing, not
blocking) or "fail" (the job would not run as asked). A check that raises becomes that check's
"fail" with the exception in one line; the doctor itself does not crash. torch, accelerate and
mlflow are imported inside the checks, never at module import.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from runjob import __version__
from runjob.errors import DataError, describe
from runjob.host.plugin_host import load_plugins
from runjob.host.streams import StreamOptions
from runjob.job.plan import fp16_problem
from runjob.job.validation import load_resolved
from runjob.record.uri import probe_health, sqlite_path, tracking_uri_and_source
from runjob.train import stores

if TYPE_CHECKING:
    from runjob.host.plugin_host import PluginHost
    from runjob.job.validation import ResolvedJob

SHM_PATH = "/dev/shm"
MIN_SHM_BYTES = 1 << 30  # 1 GiB
HEALTH_TIMEOUT_S = 5.0
STATUSES = ("ok", "warn", "fail")
_LABELS = {"ok": "[ ok ]", "warn": "[warn]", "fail": "[FAIL]"}


@dataclass(frozen=True)
class Check:
    """One finding: what was checked, "ok" / "warn" / "fail" ("fail" blocks the job), and why."""

    name: str
    status: str
    detail: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def check_python() -> list[Check]:
    """The Python interpreter and runjob versions."""
    return [
        Check("python", "ok", f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})"),
        Check("runjob", "ok", __version__),
    ]


def check_torch(job: ResolvedJob | None = None) -> list[Check]:
    """torch's version, CUDA and the GPUs; then whether the job's mixed precision can run here."""
    import torch  # lazy: the doctor reports a missing or broken torch as a failed check (tests/test_doctor.py)

    if not torch.cuda.is_available():
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
        checks = [
            Check("torch", "warn", f"{torch.__version__} ({built}); CUDA is not available: training runs on the CPU")
        ]
    else:
        gpus = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        listed = "; ".join(f"cuda:{i} {gpu.name} {_gib(gpu.total_memory)}" for i, gpu in enumerate(gpus))
        checks = [Check("torch", "ok", f"{torch.__version__}, CUDA {torch.version.cuda}, {len(gpus)} GPU(s): {listed}")]
    if job is not None:
        checks.append(_mixed_precision(job, torch))
        if job.train.compile:
            checks.append(_compile_toolchain(job, torch))
    return checks


def _compile_toolchain(job: ResolvedJob, torch: ModuleType) -> Check:
    """train.compile: inductor writes C++ kernels on a CPU (a C++ compiler) and Triton kernels on CUDA."""
    if torch.cuda.is_available() and not job.train.cpu:
        if importlib.util.find_spec("triton") is None:
            return Check(
                "compile", "fail", "train.compile = true on CUDA needs Triton (pip install triton), which is missing"
            )
        return Check("compile", "ok", "train.compile = true: Triton is installed for CUDA kernels")
    compiler = os.environ.get("CXX") or next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)
    if compiler is None:
        return Check(
            "compile",
            "fail",
            "train.compile = true on the CPU needs a C++ compiler (g++ or clang++; or set CXX); none found",
        )
    return Check("compile", "ok", f"train.compile = true on the CPU: C++ compiler {compiler}")


def _mixed_precision(job: ResolvedJob, torch: ModuleType) -> Check:
    """fp16 needs CUDA; bf16 on CUDA needs a GPU that supports it."""
    asked = job.train.mixed_precision
    on_cuda = torch.cuda.is_available() and not job.train.cpu
    fp16 = fp16_problem(asked, on_cuda, "train.cpu = true" if torch.cuda.is_available() else "there is no CUDA here")
    if fp16:
        return Check("mixed precision", "fail", fp16)
    if asked == "bf16" and on_cuda and not torch.cuda.is_bf16_supported():
        return Check(
            "mixed precision",
            "fail",
            f"train.mixed_precision = 'bf16', but {torch.cuda.get_device_name(0)} does not support bf16; use 'fp16' "
            "or 'no'",
        )
    return Check("mixed precision", "ok", f"train.mixed_precision = {asked!r} on {'CUDA' if on_cuda else 'the CPU'}")


def check_distributed() -> list[Check]:
    """The collective backend multi-process runs would use: NCCL with GPUs, gloo without."""
    # lazy: the doctor reports a missing or broken torch as a failed check (tests/test_doctor.py)
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return [
            Check(
                "distributed",
                "warn",
                "torch was built without torch.distributed: only single-process runs are possible",
            )
        ]
    if torch.cuda.is_available():
        if not dist.is_nccl_available():
            return [Check("nccl", "warn", "NCCL is not available in this torch build: multi-GPU runs cannot use it")]
        version = ".".join(str(part) for part in torch.cuda.nccl.version())
        return [Check("nccl", "ok", f"NCCL {version} available for multi-GPU runs")]
    if dist.is_gloo_available():
        return [Check("gloo", "ok", "no GPU: multi-process CPU runs use gloo, which is available")]
    return [
        Check(
            "gloo",
            "warn",
            "no GPU and gloo is not available in this torch build: multi-process CPU runs are impossible",
        )
    ]


def check_accelerate() -> list[Check]:
    """Hugging Face Accelerate imports; its version."""
    # lazy: the doctor reports a missing or broken accelerate as a failed check (tests/test_doctor.py)
    import accelerate

    return [Check("accelerate", "ok", accelerate.__version__)]


def check_mlflow() -> list[Check]:
    """MLflow imports; its version."""
    import mlflow  # lazy: the doctor reports a missing or broken mlflow as a failed check (tests/test_doctor.py)

    return [Check("mlflow", "ok", mlflow.__version__)]


def check_shared_memory(job: ResolvedJob | None = None) -> list[Check]:
    """/dev/shm against the DataLoader workers: with num_workers > 0, under 1 GiB free is a warning."""
    workers = job.loader.num_workers if job is not None else 0
    advice = "DataLoader workers pass batches through shared memory; in Docker use --shm-size=8g"
    try:
        usage = shutil.disk_usage(SHM_PATH)
    except FileNotFoundError:
        return [Check("/dev/shm", "warn", f"{SHM_PATH} does not exist; {advice}")]
    size = f"{_gib(usage.free)} free of {_gib(usage.total)}, dataset.num_workers = {workers}"
    if workers > 0 and usage.free < MIN_SHM_BYTES:
        return [Check("/dev/shm", "warn", f"{size}: less than 1 GiB with workers may crash them (bus error). {advice}")]
    return [Check("/dev/shm", "ok", f"{size} (under 1 GiB with num_workers > 0 would be a warning)")]


def check_tracking(job: ResolvedJob | None = None) -> list[Check]:
    """The tracking URI is reachable: an http(s) server answers /health, a sqlite folder is writable."""
    uri, source = tracking_uri_and_source(job.tracking.uri if job is not None else None)
    scheme = uri.partition(":")[0].lower() if ":" in uri else ""
    if scheme in ("http", "https"):
        return [_check_http(uri, source)]
    if scheme == "sqlite":
        return [_check_sqlite(uri, source)]
    return [
        Check("tracking", "warn", f"{uri} (from {source}): not checked; doctor checks http(s) and sqlite URIs only")
    ]


def _check_http(uri: str, source: str) -> Check:
    """GET ``<uri>/health`` with a short timeout; anything but an answer is a failure."""
    health = probe_health(uri, HEALTH_TIMEOUT_S)
    if health.error is not None:  # refused, timed out, an HTTP error: not a server that works
        return Check(
            "tracking",
            "fail",
            f"MLflow at {uri} (from {source}) is unreachable: GET {health.url}: {describe(health.error)}",
        )
    return Check("tracking", "ok", f"MLflow at {uri} (from {source}) answered /health with {health.status}")


def _check_sqlite(uri: str, source: str) -> Check:
    """The database's folder must exist and be writable; no database file is created."""
    path = sqlite_path(uri) or ""
    if path in ("", ":memory:"):
        return Check("tracking", "warn", f"{uri} (from {source}) is an in-memory database: runs are lost at exit")
    database = Path(path).absolute()
    folder = database.parent
    if not folder.is_dir():
        return Check("tracking", "fail", f"{uri} (from {source}): folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        return Check("tracking", "fail", f"{uri} (from {source}): folder {folder} is not writable")
    if database.exists() and not os.access(database, os.R_OK | os.W_OK):
        return Check("tracking", "fail", f"{uri} (from {source}): {database} is not writable")
    state = "exists" if database.exists() else "will be created on the first run"
    return Check("tracking", "ok", f"{uri} (from {source}): {database} {state}")


def check_data(job: ResolvedJob | None = None) -> list[Check]:
    """A streamed dataset's location (options derived from StreamOptions) can be read; nothing to
    check for other datasets."""
    if job is None or not isinstance(job.dataset.options, StreamOptions):
        return []
    return [check_stream(job.dataset.options)]


def check_stream(stream: StreamOptions) -> Check:
    """List the location and read its runjob.json: ok with what it holds, or the store's problem."""
    try:
        return Check("data", "ok", stores.check_readable(stream))
    except DataError as error:
        return Check("data", "fail", str(error))


def check_plugins(host: PluginHost | None = None) -> list[Check]:
    """A failure per plugin that did not load and per bare name several third-party plugins register;
    a warning per name a plugin registers that a built-in has; a line per disabled plugin."""
    if host is None:
        host = load_plugins()
    checks = [
        Check(f"plugin {f.name}", "fail", f"{f.name} ({f.distribution} {f.version}) failed to load: {f.error}")
        for f in host.failures
    ]
    for kind, name in sorted(host.duplicates):
        checks.append(Check(f"{kind} {name}", "fail", host.conflict(kind, name)))
    checks += [Check("plugin shadows a built-in", "warn", warning) for warning in host.warnings]
    checks += [
        Check(f"plugin {d.name}", "ok", f"{d.name} ({d.distribution} {d.version}) disabled by {d.by}")
        for d in host.disabled
    ]
    checks.append(Check("plugins", "ok", f"{len(host.plugins)} plugin(s) loaded"))
    return checks


def _safely(name: str, check: Callable[..., list[Check]], *args: object) -> list[Check]:
    """Run one check; an exception becomes that check's failure instead of stopping the doctor."""
    try:
        return check(*args)
    except Exception as error:  # noqa: BLE001 - report it, go on with the other checks
        return [Check(name, "fail", f"the check failed: {describe(error)}")]


def collect_checks(job: ResolvedJob | None = None, host: PluginHost | None = None) -> list[Check]:
    """Every check, in report order. ``job`` is a validated ``ResolvedJob`` or None; ``host`` a
    ``PluginHost`` (loaded here if None)."""
    return [
        *_safely("python", check_python),
        *_safely("torch", check_torch, job),
        *_safely("distributed", check_distributed),
        *_safely("accelerate", check_accelerate),
        *_safely("mlflow", check_mlflow),
        *_safely("/dev/shm", check_shared_memory, job),
        *_safely("tracking", check_tracking, job),
        *_safely("data", check_data, job),
        *_safely("plugins", check_plugins, host),
    ]


def exit_code(checks: list[Check]) -> int:
    """1 if any check failed, else 0."""
    return 1 if any(c.status == "fail" for c in checks) else 0


def report_text(checks: list[Check]) -> str:
    """One line a check, then a summary line."""
    lines = [f"{_LABELS[c.status]} {c.name}: {c.detail}" for c in checks]
    counts = {status: sum(c.status == status for c in checks) for status in STATUSES}
    verdict = "fix the failures before training" if counts["fail"] else "ready to train"
    lines.append(f"{counts['ok']} ok, {counts['warn']} warning(s), {counts['fail']} failure(s): {verdict}")
    return "\n".join(lines) + "\n"


def report_json(checks: list[Check]) -> str:
    """``{"ok": bool, "checks": [{"name", "status", "detail"}, ...]}`` as JSON text."""
    return json.dumps({"ok": exit_code(checks) == 0, "checks": [asdict(c) for c in checks]}, indent=2) + "\n"


def cmd_doctor(args: argparse.Namespace) -> int:
    host = load_plugins()
    job = load_resolved(args.job, args.overrides, host) if args.job else None
    checks = collect_checks(job, host)
    print(report_json(checks) if args.json else report_text(checks))
    return exit_code(checks)
