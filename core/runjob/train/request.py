"""What one training run is asked to do: :class:`RunRequest`, made once by :func:`runjob.run` from
its arguments; :class:`Resume`, whether and from where it continues; :class:`TrialContext`, the
sweep trial it is, when it is one."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pydantic
import tomli_w

from runjob.errors import RunjobError
from runjob.host.run_folder import RunFolder
from runjob.job.jobfile import load_job, override_origin, split_dotted
from runjob.job.validation import resolve
from runjob.record.messages import Recording
from runjob.record.outputs import choose_output_dir
from runjob.tags import (
    PARENT_RUN_TAG,
    SWEEP_DEVICES_TAG,
    SWEEP_KEYS_TAG,
    SWEEP_PARENT_TAG,
    SWEEP_STUDY_TAG,
    SWEEP_TRIAL_TAG,
)
from runjob.train.checkpoints import AUTO, AUTO_NEEDS_FOLDER

if TYPE_CHECKING:
    from runjob.host.callback import Callback
    from runjob.host.plugin_host import PluginHost
    from runjob.job.jobfile import RawJob
    from runjob.job.validation import ResolvedJob

TRIAL_ENVIRONMENT = "RUNJOB_SWEEP_TRIAL"
"""Set by a sweep's worker for the process of one trial (and inherited by the processes a launched
trial starts): the trial's :class:`TrialContext` as JSON."""


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


def toml_value(value: Any) -> str:
    """``value`` as one line of TOML (``0.01``, ``"ddp"``, ``[0.9, 0.99]``): how a trial's value is
    shown in its run's record (its name, its overrides tag), as ``--set`` would give it.

    tomli-w writes documents, not values: a table as a document's value would be a ``[v]`` section,
    so the value goes in an array beside a number, where everything is written inline; with
    ``indent=0`` its only line breaks are an array's (a string's are escaped), joined here."""
    document = tomli_w.dumps({"v": [value, 0]}, indent=0)
    inline = document.removeprefix("v = [\n").removesuffix(",\n0,\n]\n")
    return inline.replace("[\n", "[").replace(",\n]", "]").replace(",\n", ", ")


class TrialContext(pydantic.BaseModel):
    """One trial of a sweep, as its run is given it by the sweep's worker: the study and the trial's
    number (for its pruner and its tags), the trial's values for the swept job keys (values, set in
    the job as they are), the parent MLflow run, the GPUs it was given, and where it sends its
    outcome. It reaches the trial's process as JSON in ``$RUNJOB_SWEEP_TRIAL``, checked here."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    study: str
    number: int = pydantic.Field(ge=0)
    storage: str
    """The study's Optuna storage (a journal file or a URL, which may hold a password: never recorded)."""
    parent_run_id: str
    keys: list[str]
    """Every swept key, in the ``[sweep]`` table's order."""
    values: dict[str, Any]
    """This trial's value of each swept key."""
    pruner: str = "none"
    """The sweep's pruner (its name): a trial under one reports each evaluation to it."""
    devices: str | None = None
    outcome_fd: int | None = None
    """The write end of the pipe to the worker: the trial's process sends its outcome there."""

    def tags(self) -> dict[str, str]:
        """The MLflow tags that make the trial's run a child of the sweep's parent run."""
        tags = {
            PARENT_RUN_TAG: self.parent_run_id,
            SWEEP_PARENT_TAG: self.parent_run_id,
            SWEEP_TRIAL_TAG: str(self.number),
            SWEEP_STUDY_TAG: self.study,
            SWEEP_KEYS_TAG: json.dumps(self.keys),
        }
        if self.devices:
            tags[SWEEP_DEVICES_TAG] = self.devices  # which GPUs this trial had, readable in mlflow ui
        return tags

    def shown(self) -> list[str]:
        """The values as ``key=value`` texts, for the record (never read back)."""
        return [f"{key}={toml_value(value)}" for key, value in self.values.items()]

    def apply(self, raw: RawJob) -> None:
        """Set each value in ``raw`` (its origin the value shown as a ``--set``), and list the values
        among ``raw``'s overrides, so the run's name and record show them as they show a ``--set``."""
        for (key, value), text in zip(self.values.items(), self.shown(), strict=True):
            origin = override_origin(text)
            parts = split_dotted(key)
            table = raw.data
            for depth, part in enumerate(parts[:-1]):
                inner = ".".join(parts[: depth + 1])
                if part not in table:
                    raw.origins[inner] = origin
                existing = table.setdefault(part, {})
                if not isinstance(existing, dict):
                    raise RunjobError(f"{text}: cannot set a key inside {inner}, which is a value, not a table")
                table = existing
            dotted = ".".join(parts)
            for old in [k for k in raw.origins if k.startswith(dotted + ".")]:
                del raw.origins[old]
            table[parts[-1]] = value
            raw.origins[dotted] = origin
            raw.overrides.append(text)

    def to_environment(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> TrialContext | None:
        """The trial this process runs (``$RUNJOB_SWEEP_TRIAL``), None outside a sweep's trial."""
        text = (os.environ if environ is None else environ).get(TRIAL_ENVIRONMENT)
        if not text:
            return None
        try:
            return cls.model_validate_json(text)
        except pydantic.ValidationError as error:
            raise RunjobError(
                f"${TRIAL_ENVIRONMENT}: not a sweep trial's context ({error.errors()[0]['msg']})"
            ) from None


def resolve_request_job(
    job_file: Path, overrides: Sequence[str], trial: TrialContext | None, host: PluginHost
) -> ResolvedJob:
    """The job in ``job_file`` with ``overrides`` and, for a sweep trial, the trial's values; checked."""
    raw = load_job(job_file, list(overrides))
    if trial is not None:
        trial.apply(raw)
    return resolve(raw, host)


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
    trial: TrialContext | None = None
    """The sweep trial this run is, when it is one (its values are in ``job`` already)."""
    callbacks: Mapping[str, Callback] = field(default_factory=dict)
    """Callbacks the asker attaches, after the job's own (a sweep trial's pruner and outcome)."""


def output_folder(job_name: str, output_dir: Path | None, resume: Resume, launched: bool = False) -> Path:
    """The run's folder, chosen once for all of its processes: ``output_dir``; when resuming from a
    checkpoint path without one, the run folder that holds it; for a new run without one,
    ``runs/<job name>/<UTC time>``. A new run never goes into a folder that holds one (checked
    unless ``launched``: the launcher that started this worker checked it)."""
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
