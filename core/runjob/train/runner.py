"""Running a resolved job, as a pipeline: prepare (the Accelerator, the folder, the checkpoint) ->
build (data, model, optimizer, loaders) -> fit (the loop, its events, the record listening to them)
-> finish (RUN_END, the record closed, the summary). Each step is a module of its own
(``runjob.train.session_*``); this one passes their results on."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from runjob.errors import Terminated
from runjob.host.callback import Callback
from runjob.host.events import Dispatcher, Event
from runjob.host.model_build import build_each
from runjob.host.output import screen
from runjob.host.plugin_host import PluginHost
from runjob.host.run_context import Clock, Run, RunParts, dispatcher
from runjob.job.validation import ResolvedJob
from runjob.record.logfile import LibraryLog
from runjob.record.mirror import discard_prestarted
from runjob.record.recorder import Recorder
from runjob.record.uri import HTTP_DEFAULTS
from runjob.train.checkpoints import Position, load_checkpoint
from runjob.train.loop import AccelerateWork, LoopSettings, StopRequest, TrainingLoop
from runjob.train.outcome import RunOutcome
from runjob.train.request import RunRequest
from runjob.train.session_build import Built, build, facts_of
from runjob.train.session_end import (
    ACCELERATE_SWITCHES,
    finish,
    how_to_go_on,
    listen_for_stop,
    reset_accelerate,
    summary,
)
from runjob.train.session_prepare import Prepared, prepare
from runjob.train.session_record import (
    RecordListener,
    default_run_name,
    open_record,
    prestart_recording,
    say_start,
    start_record,
    system_metrics,
)

if TYPE_CHECKING:
    from runjob.record.system_metrics import SystemMetricsSampler

__all__ = ["Built", "Fitting", "Prepared", "default_run_name", "facts_of", "run_job"]

_facts_of = facts_of  # the name tests of the data's facts use


def run_job(request: RunRequest, host: PluginHost) -> RunOutcome:
    """Train ``request.job`` in this process (continuing from a checkpoint when it resumes).

    User mistakes raise RunjobError (exit 2); a stop signal ends with Terminated after a checkpoint.
    The signal handlers and Accelerate's process-wide state are put back afterwards, so a process
    can run several jobs one after another (tests, notebooks, benchmarks).
    """
    stop = StopRequest()
    listener = listen_for_stop(stop, request.job.train.stop_signal)
    # Accelerate's switches and MLflow's HTTP retry bounds (tracking.HTTP_DEFAULTS) are set in os.environ
    environment = {name: os.environ.get(name) for name in (*ACCELERATE_SWITCHES, *HTTP_DEFAULTS)}
    try:
        with LibraryLog("train"):  # the libraries' chatter goes to OUTPUT_DIR/runjob.log
            return _session(request, host, stop)
    finally:
        discard_prestarted()  # the run stopped before its record began
        listener.close()  # the signal handlers found are put back
        reset_accelerate(environment)


@dataclass(frozen=True)
class Fitting:
    """The session's fit step, assembled: the run its events see, the one dispatcher of those events
    (the record listening to it) and the loop, positioned where the checkpoint left off."""

    run: Run
    events: Dispatcher
    loop: TrainingLoop


def _session(request: RunRequest, host: PluginHost, stop: StopRequest) -> RunOutcome:
    """One run, step by step: prepare -> record (MLflow run, system metrics) -> build -> fit ->
    finish. The record is started before the build, so the MLflow run is created meanwhile and a
    failure while building is recorded too."""
    job = request.job
    prestart_recording(job, request.recording)
    prepared = prepare(request)
    recorder = start_record(request, host, prepared)
    accelerator, output_dir = prepared.accelerator, prepared.output_dir
    sampler = system_metrics(job, recorder, accelerator, "main")  # from the start: data loading shows
    fitting: Fitting | None = None
    status, error = "FINISHED", cast("BaseException | None", None)
    began = time.monotonic()
    try:
        built = build(job, accelerator, recorder.tracking_uri, resuming=prepared.checkpoint is not None)
        run_id = open_record(recorder, accelerator, job, request.recording)
        say_start(job, accelerator, recorder, run_id, prepared.checkpoint)
        sampler = sampler or system_metrics(job, recorder, accelerator, "node")
        fitting = _assemble(request, host, prepared, built, recorder, run_id, stop)
        fitting.loop.fit()
    except (KeyboardInterrupt, Terminated) as interrupt:
        status, error = "KILLED", interrupt
        if accelerator.is_main_process:
            step = fitting.run.step if fitting is not None else None
            raise how_to_go_on(request, recorder, output_dir, interrupt, step) from None
        raise
    except BaseException as failure:
        status, error = "FAILED", failure
        raise
    finally:
        _stop_sampler(sampler)
        finish(fitting.events if fitting is not None else None, recorder, accelerator, status, error)
    assert fitting is not None  # fitted: nothing was raised
    if screen.speaks:  # the summary is read from the main process's record
        screen.say(*summary(job, recorder, output_dir, fitting.loop, time.monotonic() - began))
    return RunOutcome(0, output_dir, run_id)


def _stop_sampler(sampler: SystemMetricsSampler | None) -> None:
    if sampler is not None:
        sampler.stop()


def _assemble(
    request: RunRequest,
    host: PluginHost,
    prepared: Prepared,
    built: Built,
    recorder: Recorder,
    run_id: str | None,
    stop: StopRequest,
) -> Fitting:
    """The run its events see, the one dispatcher of those events with the record listening, and the
    loop, positioned where the checkpoint left off (callbacks' state loaded); then RUN_START."""
    job = request.job
    callbacks = {**_make_callbacks(job), **request.callbacks}  # the asker's (a sweep trial's) after the job's
    parts = RunParts(
        job,
        prepared.accelerator,
        built.model,
        built.task,
        prepared.output_dir,
        built.optimizer,
        built.scheduler,
        built.train_loader,
        built.val_loader,
        built.test_loader,
        run_id,
        callbacks,
    )
    clock = Clock()  # the one step counter: the loop moves it, the run shows it
    run = Run(parts, clock=clock, record=recorder, stop=stop)
    plugins = {name: chosen.component.plugin for name, chosen in job.enabled_callbacks().items()}
    for name in request.callbacks:
        plugins.setdefault(name, "runjob")
    events = dispatcher(run, host.hook, plugins)
    listener = RecordListener(recorder, job, host, prepared, built)
    events.add_destination(listener)
    start = load_checkpoint(run, prepared.checkpoint, events) if prepared.checkpoint is not None else Position()
    work = AccelerateWork(run, stop)
    work.events = events
    settings = LoopSettings.of(job.train)
    loop = TrainingLoop(run, events, clock, built.schedule, work, settings, stop=stop, start=start)
    listener.loop = loop
    events.send(Event.RUN_START)
    return Fitting(run, events, loop)


def _make_callbacks(job: ResolvedJob) -> dict[str, Callback]:
    """The job's callbacks that are switched on, built from their options, in the order they are called."""
    return build_each(job.enabled_callbacks(), Callback, "callback")
