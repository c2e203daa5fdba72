"""The run's output directory: job.toml, metrics.jsonl and model.safetensors."""

from __future__ import annotations

import time
from pathlib import Path

from runjob.errors import RunjobError
from runjob.host.run_folder import JOB_FILE, RunFolder

RUNS_ROOT = Path("runs")


def choose_output_dir(job_name: str, requested: Path | None) -> Path:
    """``requested``, or ``runs/<job name>/<UTC time>``; never a folder that already holds a run."""
    if requested is None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        candidate = RUNS_ROOT / job_name / stamp
        suffix = 1
        while candidate.exists():
            candidate = RUNS_ROOT / job_name / f"{stamp}-{suffix}"
            suffix += 1
        return candidate
    if RunFolder(requested).job_file.exists():
        raise RunjobError(
            f"--output-dir {requested}: this folder already holds a run ({JOB_FILE}); choose another so nothing is "
            "overwritten"
        )
    if requested.exists() and not requested.is_dir():
        raise RunjobError(f"--output-dir {requested}: exists and is not a folder")
    return requested
