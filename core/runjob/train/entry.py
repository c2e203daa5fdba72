"""One library entry for a run: ``runjob run``, ``runjob rerun``, each sweep trial and the test kit
call :func:`run`, with the job file, the overrides, the output folder and any extra tags.

It validates the job once, then either trains in this process or, when the job asks for several
processes or machines and this process was not itself started by a launcher, starts the workers
(each of which calls :func:`run` again, inside the launcher's environment). A user's mistake is
raised as :class:`runjob.RunjobError`; a stop signal as :class:`runjob.errors.Terminated` after a
checkpoint. Calling it several times in one process works: each run puts back the signal handlers
and Accelerate's process-wide state it found.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from runjob.errors import RunjobError
from runjob.host.output import screen
from runjob.host.plugin_host import disabled_plugins as default_disabled
from runjob.host.plugin_host import load_plugins, local_plugins, using_local_plugins
from runjob.job.schema import sweep_note
from runjob.record.local import run_id_in
from runjob.record.mirror import choose
from runjob.tags import LOCAL_PLUGINS_TAG, SWEEP_TRIAL_TAG
from runjob.train.checkpoints import complete_checkpoints, find_checkpoint
from runjob.train.launcher import adopt_slurm_environment, check_launched_as_asked, is_worker, launch_workers
from runjob.train.outcome import RunOutcome
from runjob.train.request import Resume, RunRequest, output_folder, resolve_request_job
from runjob.train.run_command import resume_command, run_arguments
from runjob.train.runner import run_job

__all__ = ["SWEEP_TRIAL_TAG", "RunOutcome", "parse_tags", "resume_command", "run", "run_arguments"]

if TYPE_CHECKING:
    from runjob.host.callback import Callback
    from runjob.host.plugin_host import LocalPlugin, PluginHost
    from runjob.job.validation import ResolvedJob
    from runjob.record.messages import Recording
    from runjob.train.request import TrialContext


def run(
    job_file: str | Path,
    overrides: Sequence[str] = (),
    *,
    output_dir: str | Path | None = None,
    resume: str | Path | bool | None = None,
    tags: Mapping[str, str] | None = None,
    tracking_uri: str | None = None,
    host: PluginHost | None = None,
    job: ResolvedJob | None = None,
    disabled_plugins: Mapping[str, str] | None = None,
    recording: Recording | None = None,
    plugins: Sequence[object] = (),
    trial: TrialContext | None = None,
    callbacks: Mapping[str, Callback] | None = None,
) -> RunOutcome:
    """Train the job in ``job_file`` with ``overrides`` (``"table.key=value"`` texts, applied in
    order); see the module docstring.

    ``output_dir``: the run's folder (default ``runs/<job name>/<UTC time>``); with ``resume``
    (``True`` for the newest complete checkpoint, ``"auto"`` for that or a fresh start, or a
    checkpoint folder) the folder to continue. ``tags``: extra MLflow tags for the run.
    ``tracking_uri``: where to record when the job names no ``tracking.uri`` (default
    ``$MLFLOW_TRACKING_URI``, else MLflow's default). ``host``: loaded plugins to reuse. ``job``:
    the job already resolved from ``job_file`` and ``overrides``. ``disabled_plugins``: entry-point
    names not to load (name -> what left it out; default ``$RUNJOB_DISABLE_PLUGINS``).
    ``recording``: where the MLflow recording runs, ``"process"`` or ``"thread"``; by default a
    process, or a thread where this process has imported MLflow already (a notebook, a test).
    ``plugins``: plugins for this run only, loaded after the installed ones (as ``-p`` loads them):
    a module, a module name importable from the working directory or a ``path/to/file.py``, which
    every process of the run loads too, or any object with ``@runjob.hookimpl`` methods (a
    notebook's class instance), which only this process has: the run records in a thread, and a job
    of several processes is refused. One that cannot be imported raises :class:`runjob.RunjobError`.
    ``trial``: the sweep trial this run is (its values set in the job, its tags added); ``callbacks``:
    callbacks for this run besides the job's own (a sweep trial's, :mod:`runjob.sweep.trial`).
    """
    local = local_plugins(plugins, label="plugins=")  # with $RUNJOB_PLUGINS' (-p): imported before anything runs
    with using_local_plugins(local):  # for every load of plugins of the run, in this process and the ones it starts
        return _run(
            job_file,
            overrides,
            output_dir=output_dir,
            resume=resume,
            tags=tags,
            tracking_uri=tracking_uri,
            host=host,
            job=job,
            disabled_plugins=disabled_plugins,
            recording=recording,
            local=local,
            trial=trial,
            callbacks=callbacks,
        )


def _run(
    job_file: str | Path,
    overrides: Sequence[str],
    *,
    output_dir: str | Path | None,
    resume: str | Path | bool | None,
    tags: Mapping[str, str] | None,
    tracking_uri: str | None,
    host: PluginHost | None,
    job: ResolvedJob | None,
    disabled_plugins: Mapping[str, str] | None,
    recording: Recording | None,
    local: Sequence[LocalPlugin],
    trial: TrialContext | None = None,
    callbacks: Mapping[str, Callback] | None = None,
) -> RunOutcome:
    """:func:`run`, its ``local`` plugins imported and in place."""
    job_file = Path(job_file)
    disabled = dict(default_disabled() if disabled_plugins is None else disabled_plugins)
    tags = {**(trial.tags() if trial is not None else {}), **(tags or {})}
    if local:  # as the main process was given them (a worker gets this tag from it)
        tags.setdefault(LOCAL_PLUGINS_TAG, json.dumps([plugin.record() for plugin in local]))
    host = host or load_plugins(disabled)
    adopt_slurm_environment()
    job = job or resolve_request_job(job_file, overrides, trial, host)  # a trial's values set as values
    recording = _in_process_only(job, local, recording)
    asked = Resume.parse(resume, job.train.resume)
    worker = is_worker()
    folder = output_folder(job.job.name, Path(output_dir) if output_dir is not None else None, asked, worker)

    request = RunRequest(job, folder, asked, tags, tracking_uri, disabled, choose(recording), trial, callbacks or {})
    launch = job.launch
    if worker:
        check_launched_as_asked(launch)
    else:
        if job.sweep is not None and SWEEP_TRIAL_TAG not in tags:
            screen.say(f"runjob: {sweep_note('this trains the base job as written')}", err=True)
        screen.say(first_line(job, folder, asked))
        if launch.num_processes > 1 or launch.num_machines > 1:
            arguments = run_arguments(job_file, overrides, folder, asked, tags, tracking_uri, disabled, local)
            going_on = (job_file, list(overrides), tracking_uri)  # said if the workers are stopped
            code = launch_workers(launch, arguments, folder, job.train.stop_signal, going_on)
            return RunOutcome(code, folder, run_id_in(folder))

    return run_job(request, host)


def _in_process_only(job: ResolvedJob, local: Sequence[LocalPlugin], recording: Recording | None) -> Recording | None:
    """Where the run records, given its local plugins: an object of this process (not a module with
    a file) reaches no other process, so the recording is a thread, and a job of several processes
    is refused, saying how to give the plugin instead."""
    objects = [plugin.given for plugin in local if plugin.kind == "object"]
    if not objects:
        return recording
    fix = "put it in a file and pass its path: plugins=['my_plugin.py'] (runjob run -p my_plugin.py)"
    launch = job.launch
    if launch.num_processes > 1 or launch.num_machines > 1:
        raise RunjobError(
            f"plugins=[{', '.join(objects)}]: an object of this process cannot reach the job's other processes "
            f"(launch.num_processes = {launch.num_processes}, launch.num_machines = {launch.num_machines}); {fix}"
        )
    if recording == "process":
        raise RunjobError(
            f"plugins=[{', '.join(objects)}]: recording='process' cannot load an object of this process; {fix}"
        )
    return "thread"


def first_line(job: ResolvedJob, output_dir: Path, resume: Resume) -> str:
    """What the run will do and where its output goes: said before torch is imported (the time
    to the first line is the time to validate the job, well under a second). A ``--resume`` that
    names no checkpoint to continue from is refused first, so nothing is said of resuming."""
    if resume.mode == "checkpoint" and resume.checkpoint is not None and not resume.checkpoint.is_dir():
        what = "a file, not a checkpoint folder" if resume.checkpoint.is_file() else "no such folder"
        raise RunjobError(
            f"--resume {resume.checkpoint}: {what}; give a checkpoint folder (OUTPUT_DIR/checkpoints/step-NNNNNNNN), "
            "or --resume alone to continue the run in --output-dir from its newest checkpoint"
        )
    if resume.mode in ("newest", "checkpoint"):
        find_checkpoint(output_dir, resume.checkpoint)  # not a complete checkpoint, or none in the folder
    train = job.train
    length = " or ".join(
        part
        for part in (
            f"{train.epochs} epoch(s)" if train.epochs else "",
            f"{train.max_steps} step(s)" if train.max_steps else "",
        )
        if part
    )  # whichever ends first
    if resume.mode == "auto" and not complete_checkpoints(output_dir):
        where = f"starting afresh in {output_dir}"  # --resume auto with nothing to resume yet
    else:
        where = f"resuming in {output_dir}" if resume else f"output in {output_dir}"
    return f"runjob: {job.job.name}: {job.model.name} on {job.dataset.name} ({job.task.name}), {length}; {where}"


def parse_tags(texts: Sequence[str]) -> dict[str, str]:
    """``["k=v", ...]`` from ``--tag`` into a dict; a text without ``=`` is a user's mistake."""
    tags = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise RunjobError(f"--tag {text}: a tag must look like KEY=VALUE, e.g. --tag team=vision")
        tags[key.strip()] = value
    return tags
