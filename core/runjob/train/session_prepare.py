"""The session's first step: the Accelerator, the output folder and, when resuming, the checkpoint
to continue from (:class:`Prepared`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from runjob.errors import RunjobError
from runjob.host.output import screen
from runjob.host.run_folder import RunFolder
from runjob.job.redaction import redact_tables
from runjob.record import logfile
from runjob.record.mlflow_writer import close_abandoned_run
from runjob.train.accelerator import build_accelerator, check_setup
from runjob.train.checkpoints import compare_jobs, complete_checkpoints, find_checkpoint, read_state, set_aside_attempt
from runjob.train.request import Resume, RunRequest

if TYPE_CHECKING:
    from accelerate import Accelerator

    from runjob.host.json_types import JSONObject
    from runjob.job.validation import ResolvedJob


@dataclass(frozen=True)
class Prepared:
    """The session's first step: the Accelerator, the output folder (made, with ``job.toml``, for a
    new run) and, when resuming, the checkpoint, its saved state and what the job changed since."""

    accelerator: Accelerator
    output_dir: Path
    checkpoint: Path | None = None
    saved: JSONObject = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)


def prepare(request: RunRequest) -> Prepared:
    """The Accelerator for the job's strategy; the checkpoint to continue from (``--resume auto``
    with none: the earlier attempt set aside, a new run); the folder with ``job.toml`` for a new
    run; the log file; the seed."""
    # lazy: `runjob JOB` says its first line and starts its recording process before accelerate loads (train.entry)
    from accelerate.utils import set_seed

    job = request.job
    plan = job.strategy.component.factory(job.strategy.options)
    accelerator = build_accelerator(job, plan)
    check_setup(accelerator, job, plan)
    output_dir = _same_on_all_processes(accelerator, request.output_dir)
    resume = request.resume
    if resume.mode == "auto" and not _auto_resume(accelerator, output_dir):
        resume = Resume()
    prepared = Prepared(accelerator, output_dir)
    if resume:
        checkpoint, saved, changes = _resume_point(job, output_dir, resume)
        prepared = Prepared(accelerator, output_dir, checkpoint, saved, changes)
    elif accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        RunFolder(output_dir).job_file.write_text(job.to_toml(), encoding="utf-8")
    logfile.open_in(output_dir)
    set_seed(job.job.seed)
    return prepared


def _resume_point(job: ResolvedJob, output_dir: Path, resume: Resume) -> tuple[Path, JSONObject, list[str]]:
    """The checkpoint and saved state to continue from, and what the job changed (recorded); refuses
    another job's."""
    checkpoint = find_checkpoint(output_dir, resume.checkpoint)
    saved = read_state(checkpoint)
    refused, _ = compare_jobs(saved.get("job", {}), job.to_dict())
    _, allowed = compare_jobs(redact_tables(saved.get("job", {})), redact_tables(job.to_dict()))  # recorded as a tag
    if refused:
        raise RunjobError(f"--resume {checkpoint}: made by a different job; these values differ: {'; '.join(refused)}")
    return checkpoint, saved, allowed


def _auto_resume(accelerator: Accelerator, output_dir: Path) -> bool:
    """``--resume auto``: whether ``output_dir`` holds a complete checkpoint to continue from. When
    it holds none but an earlier attempt's files (killed before its first checkpoint), the main
    process moves them to ``attempts/N`` and marks that attempt's run KILLED; then all start afresh."""
    if complete_checkpoints(output_dir):
        return True
    if accelerator.is_main_process and RunFolder(output_dir).job_file.exists():
        kept = set_aside_attempt(output_dir)
        run_id = close_abandoned_run(kept, "killed before its first checkpoint; the same command started afresh")
        named = f" (MLflow run {run_id}, now marked KILLED)" if run_id else ""
        screen.say(
            f"runjob: --resume auto: no complete checkpoint in {output_dir}; the earlier attempt{named} is kept in "
            f"{kept}; starting afresh"
        )
    accelerator.wait_for_everyone()
    return False


def _same_on_all_processes(accelerator: Accelerator, output_dir: Path) -> Path:
    """The main process's choice (default folders are named by the time, which may differ)."""
    if accelerator.num_processes == 1:
        return output_dir
    # lazy: `runjob JOB` says its first line and starts its recording process before accelerate loads (train.entry)
    from accelerate.utils import broadcast_object_list

    return Path(broadcast_object_list([str(output_dir)])[0])
