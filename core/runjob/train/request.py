"""What one training run is asked to do: :class:`RunRequest`, made once by :func:`runjob.run` from
its arguments, and :class:`Resume`, whether and from where it continues."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from runjob.errors import RunjobError
from runjob.host.run_folder import RunFolder
from runjob.record.messages import Recording
from runjob.train.checkpoints import AUTO, AUTO_NEEDS_FOLDER

if TYPE_CHECKING:
    from runjob.job.validation import ResolvedJob


@dataclass(frozen=True)
class Resume:
    """Whether the run continues: ``"no"`` (a new run), ``"newest"`` (the newest complete
    checkpoint in the output folder), ``"auto"`` (that one when there is one, else start afresh in
    the folder) or ``"checkpoint"`` (the folder ``checkpoint``)."""

    mode: Literal["no", "newest", "auto", "checkpoint"] = "no"
    checkpoint: Path | None = None

    @classmethod
    def parse(cls, value: str | Path | bool | None, job_default: str | None = None) -> Resume:
        """From :func:`runjob.run`'s ``resume`` (``True``, ``"auto"``, a checkpoint path, ``None``)
        and ``train.resume`` (the job's default when ``resume`` is ``None``)."""
        if value is None:
            return cls("auto") if job_default == AUTO else cls()
        if value is False:
            return cls()
        if value is True:
            return cls("newest")
        if str(value) == AUTO:  # --resume auto (a folder named so: ./auto)
            return cls("auto")
        return cls("checkpoint", Path(value))

    def __bool__(self) -> bool:
        return self.mode != "no"

    @property
    def argument(self) -> list[str]:
        """``--resume`` as the command line gives it, for a worker or a resume command."""
        if self.mode == "no":
            return []
        return ["--resume", *(["auto"] if self.mode == "auto" else [str(self.checkpoint)] if self.checkpoint else [])]


@dataclass(frozen=True)
class RunRequest:
    """One training run, as asked: the job, its output folder (chosen once, before anything
    starts), whether it resumes, extra MLflow tags, where to record when the job names no
    ``tracking.uri``, the plugins left out (name -> what left it out) and where recording runs."""

    job: ResolvedJob
    output_dir: Path
    resume: Resume = Resume()
    tags: Mapping[str, str] = field(default_factory=dict)
    tracking_uri: str | None = None
    disabled_plugins: Mapping[str, str] = field(default_factory=dict)
    recording: Recording = "process"
    """Where the main process's MLflow recording runs: a process of its own (training never imports
    MLflow) or a thread of the training process (where MLflow is imported anyway: a notebook, a
    test). Always one of the two: :func:`runjob.run` decides once."""


def output_folder(job_name: str, output_dir: Path | None, resume: Resume, launched: bool = False) -> Path:
    """The run's folder, chosen once for all of its processes: ``output_dir``; when resuming from a
    checkpoint path without one, the run folder that holds it; for a new run without one,
    ``runs/<job name>/<UTC time>``. A new run never goes into a folder that holds one (checked
    unless ``launched``: the launcher that started this worker checked it)."""
    from runjob.record.outputs import choose_output_dir

    if output_dir is None:
        if resume.mode == "checkpoint" and resume.checkpoint is not None:
            return RunFolder.of_checkpoint(resume.checkpoint).root
        if resume.mode == "auto":
            raise RunjobError(AUTO_NEEDS_FOLDER)
        if resume:
            raise RunjobError(
                "--resume needs --output-dir DIR (the folder of the run to continue) or a checkpoint path"
            )
    elif resume or launched:
        return output_dir
    return choose_output_dir(job_name, output_dir)
