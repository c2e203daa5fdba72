"""Running a resolved job: Accelerator, data, model, optimizer, the loop, and the run's record."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomli_w

from runjob.errors import ComponentError, DataError, RunjobError, Terminated, TrainingError, describe
from runjob.host.callback import Callback
from runjob.host.components import Adapter, DataFacts, DatasetSplits
from runjob.host.events import Dispatcher, Event
from runjob.host.model_build import (
    adapter_places,
    apply_adapters,
    build_each,
    build_model,
    library_versions,
    make_adapters,
    takes_data,
    write_facts,
)
from runjob.host.plugin_host import PluginHost
from runjob.host.run_context import (
    Clock,
    NamedModel,
    Run,
    RunParts,
    dispatcher,
    named_models,
    save_weights,
    write_named_models,
)
from runjob.host.run_folder import ADAPTERS_DIR, DATA_DIR, PREDICTOR_DIR, WEIGHTS_FILE, RunFolder
from runjob.host.task import Task, declared_metrics
from runjob.job.redaction import redact_override, redact_tables
from runjob.job.validation import ResolvedJob
from runjob.record import logfile
from runjob.record.invocation import pasteable
from runjob.record.logfile import LibraryLog
from runjob.record.naming import recorded_params, run_name
from runjob.record.provenance import dataset_lineage, git_tags, job_sources
from runjob.record.recorder import MainRecorder, NodeRecorder, Recorder, recorder_for
from runjob.record.system_metrics import SystemMetricsSampler
from runjob.record.uri import HTTP_DEFAULTS, default_experiment, resolve_tracking_uri
from runjob.tags import (
    ACCELERATE_VERSION_TAG,
    CUDA_VERSION_TAG,
    GPU_TAG,
    HOST_TAG,
    JOB_FILE_TAG,
    METRICS_TAG,
    NOTE_TAG,
    OUTPUT_DIR_TAG,
    OVERRIDES_TAG,
    RESUME_COMMAND_TAG,
    STOPPED_STEP_TAG,
    STOPPED_TAG,
    SWEEP_TRIAL_TAG,
    TORCH_VERSION_TAG,
    VERSION_TAG,
    baseline_tag,
    plugin_tag,
    resumed_tag,
)
from runjob.train.accelerator import actual_setup, build_accelerator, check_setup, forget_accelerator
from runjob.train.checkpoints import (
    Position,
    compare_jobs,
    complete_checkpoints,
    find_checkpoint,
    load_checkpoint,
    read_state,
    same_bytes,
    set_aside_attempt,
    tidy_finished,
)
from runjob.train.entry import RunOutcome
from runjob.train.loop import Schedule, StopRequest, TrainingLoop, plan_schedule
from runjob.train.request import Recording, Resume, RunRequest
from runjob.train.stopping import StopSignals, say, signal_name
from runjob.train.sweep_trial import PRUNING_CALLBACK, sweep_pruning


def _tags(
    job: ResolvedJob, host: PluginHost, accelerator: Any, output_dir: Path, extra: dict[str, str]
) -> dict[str, str]:
    import accelerate
    import torch

    from runjob import __version__

    tags = {
        VERSION_TAG: __version__,
        JOB_FILE_TAG: str(job.source.path.resolve()),
        OUTPUT_DIR_TAG: str(output_dir.resolve()),
        OVERRIDES_TAG: " ".join(redact_override(o) for o in job.source.overrides),
        HOST_TAG: socket.gethostname(),
        TORCH_VERSION_TAG: torch.__version__,
        ACCELERATE_VERSION_TAG: accelerate.__version__,
        CUDA_VERSION_TAG: torch.version.cuda or "none",
        METRICS_TAG: json.dumps(declared_metrics(job.task.options)),
        **actual_setup(accelerator),
        **git_tags(job.source.path),
    }
    if accelerator.device.type == "cuda":
        tags[GPU_TAG] = torch.cuda.get_device_name(accelerator.device)
    for plugin in host.plugins:  # a built-in plugin's version is runjob.version
        if not plugin.builtin:
            tags[plugin_tag(plugin.name)] = f"{plugin.distribution} {plugin.version}"
    if job.job.description:
        tags[NOTE_TAG] = job.job.description  # MLflow's run description
    tags.update(redact_tables(dict(job.tracking.tags)))
    tags.update(extra)
    return tags


SYSTEM_METRICS_ON_GPU = 10.0  # seconds between samples, by default, on a GPU run


def default_run_name(job: ResolvedJob, output_dir: Path, tags: dict[str, str] | None = None) -> str:
    """``tracking.run_name``, else what tells this run from its siblings, abbreviated, then the
    job's name (:func:`runjob.record.naming.run_name`): the overrides it was given (a sweep trial's
    own values only), else its output folder's name (the time)."""
    if job.tracking.run_name:
        return job.tracking.run_name
    trial = job.sweep is not None and SWEEP_TRIAL_TAG in (tags or {})
    only = set(job.sweep.parameters) if trial else None  # not the --set every trial of the sweep shares
    return run_name(job.source.overrides, output_dir.name, job.job.name, only)


@dataclass(frozen=True)
class Prepared:
    """The session's first step: the Accelerator, the output folder (made, with ``job.toml``, for a
    new run) and, when resuming, the checkpoint, its saved state and what the job changed since."""

    accelerator: Any
    output_dir: Path
    checkpoint: Path | None = None
    saved: dict[str, Any] = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Built:
    """The session's build step: the data, the task, and the model, optimizer and loaders prepared
    by the Accelerator, the scheduler for the real step count and the schedule."""

    splits: DatasetSplits
    task: Task
    model: Any
    optimizer: Any
    scheduler: Any
    train_loader: Any
    val_loader: Any
    test_loader: Any
    schedule: Schedule
    facts: DataFacts = field(default_factory=DataFacts)
    """What the model factory was told of the data (saved as ``data_facts.json``)."""
    adapters: dict[str, Adapter] = field(default_factory=dict)
    """The job's adapters, applied to the model (``[model.adapters.NAME]``)."""


def _build(job: ResolvedJob, accelerator: Any, recorder: Recorder | None = None, resuming: bool = False) -> Built:
    """Dataset, task, model, optimizer and loaders, prepared; then the scheduler for the real step count.

    The model is built once, from its options and the data's facts; it starts from
    ``model.init_from`` when set (its lineage tagged on the run through ``recorder``; not when
    ``resuming``: the checkpoint holds the weights), then gets its adapters
    (``[model.adapters.NAME]``), has ``model.freeze``'s parameters frozen, and its trainable
    parameters are handed to the optimizer's factory as param groups (``[optimizer] groups``)."""
    from runjob.train import initialization
    from runjob.train.data_loading import make_loaders
    from runjob.train.trained import load_data

    with accelerator.main_process_first():  # one process downloads, the others read its copy
        splits, task = load_data(job)
    factory = job.model.component.factory
    facts = _facts_of(splits) if takes_data(factory) else DataFacts.of(splits, read_sample=False)
    model = build_model(factory, job.model.options, facts)
    said = [_start_from(job, accelerator, model, recorder) if not resuming else None]
    adapters = make_adapters(job.adapters)
    if adapters:
        model = apply_adapters(model, adapters, adapter_places(job.adapters))
        said.append(f"adapters {', '.join(adapters)}: {next(iter(adapters.values())).trainable(model)}")
    if job.train.channels_last:
        import torch

        model = model.to(memory_format=torch.channels_last)
    said.append(initialization.freeze(model, job))
    groups, line = initialization.param_groups(model, job)
    said.append(line)
    if accelerator.is_main_process:
        for line in filter(None, said):
            print(f"runjob: {line}", flush=True)
    optimizer = job.optimizer.component.factory(groups, job.optimizer.options)
    train_loader, val_loader, test_loader = make_loaders(splits, job, accelerator)
    model, optimizer, train_loader, val_loader = accelerator.prepare(model, optimizer, train_loader, val_loader)
    if test_loader is not None:
        test_loader = accelerator.prepare(test_loader)
    schedule = plan_schedule(job.train, len(train_loader))
    # Not passed through prepare: Accelerate would step it once per process per optimizer step.
    scheduler = job.scheduler.component.factory(optimizer, job.scheduler.options, schedule.total_steps)
    return Built(
        splits, task, model, optimizer, scheduler, train_loader, val_loader, test_loader, schedule, facts, adapters
    )


def _facts_of(splits: DatasetSplits) -> DataFacts:
    """The data's facts for a model factory that takes them, its first training sample read
    without moving a random generator (reading a sample may draw a random crop): the model's
    initialisation and the run's batches stay what they were."""
    import random

    import torch

    state = random.getstate()
    try:
        with torch.random.fork_rng(devices=[]):
            return DataFacts.of(splits)
    finally:
        random.setstate(state)


def _start_from(job: ResolvedJob, accelerator: Any, model: Any, recorder: Recorder | None) -> str | None:
    """``model.init_from``: load the weights it names into ``model`` and tag their lineage; the line to say."""
    from runjob.train import initialization

    if job.model_setup.init_from is None:
        return None
    tracking_uri = recorder.tracking_uri if recorder is not None else None
    if accelerator.num_processes > 1:  # only the main process's recorder knows it
        from accelerate.utils import broadcast_object_list

        tracking_uri = broadcast_object_list([tracking_uri])[0]
    if tracking_uri is None and job.model_setup.init_from.startswith("runs:/"):
        tracking_uri = resolve_tracking_uri(job.tracking.uri)
    line, lineage = initialization.init_from(model, job, tracking_uri)
    if recorder is not None:
        recorder.set_tags(lineage)
    return line


def run_job(request: RunRequest, host: PluginHost) -> RunOutcome:
    """Train ``request.job`` in this process (continuing from a checkpoint when it resumes).

    User mistakes raise RunjobError (exit 2); a stop signal ends with Terminated after a checkpoint.
    The signal handlers and Accelerate's process-wide state are put back afterwards, so a process
    can run several jobs one after another (tests, notebooks, benchmarks).
    """
    stop = StopRequest()
    listener = _listen_for_stop(stop, request.job.train.stop_signal)
    # Accelerate's switches and MLflow's HTTP retry bounds (tracking.HTTP_DEFAULTS) are set in os.environ
    environment = {name: os.environ.get(name) for name in (*ACCELERATE_SWITCHES, *HTTP_DEFAULTS)}
    try:
        with LibraryLog("train"):  # the libraries' chatter goes to OUTPUT_DIR/runjob.log
            return _session(request, host, stop)
    finally:
        from runjob.record.mirror import discard_prestarted

        discard_prestarted()  # the run stopped before its record began
        listener.close()  # the signal handlers found are put back
        _reset_accelerate(environment)


def _session(request: RunRequest, host: PluginHost, stop: StopRequest) -> RunOutcome:
    """One run, step by step: prepare (Accelerator, folder, checkpoint) -> record (MLflow run,
    system metrics) -> build (data, model, optimizer, loaders) -> fit (the loop, its events) ->
    finish (final weights, the MLflow model, RUN_END, the record closed)."""
    job = request.job
    _prestart_recording(job, request.recording)
    prepared = _prepare(request)
    recorder = _start_record(request, host, prepared)
    sampler = _system_metrics(job, recorder, prepared.accelerator, "main")  # from the start: data loading shows
    accelerator, output_dir = prepared.accelerator, prepared.output_dir
    run: Run | None = None
    events: Dispatcher | None = None
    status, error = "FINISHED", None
    began = time.monotonic()
    try:
        built = _build(job, accelerator, recorder, resuming=prepared.checkpoint is not None)
        run_id = _open_record(recorder, accelerator, job, request.recording)
        _say_start(job, accelerator, recorder, run_id, prepared.checkpoint)
        sampler = sampler or _system_metrics(job, recorder, accelerator, "node")
        recorder.log_input(dataset_lineage(job, built.splits), "training")
        _keep_data(recorder, accelerator, job, output_dir, built)
        _record_baselines(recorder, accelerator, built.splits.baselines)
        run, events, loop = _assemble(request, host, prepared, built, recorder, run_id, stop)
        loop.fit()
        summary = _finish_training(job, host, prepared, built, recorder, loop, time.monotonic() - began)
    except (KeyboardInterrupt, Terminated) as interrupt:
        status, error = "KILLED", interrupt
        if accelerator.is_main_process:
            step = run.step if run is not None else None
            raise _how_to_go_on(request, recorder, output_dir, interrupt, step) from None
        raise
    except BaseException as failure:
        status, error = "FAILED", failure
        raise
    finally:
        if sampler is not None:
            sampler.stop()
        _finish(events, recorder, accelerator, status, error, output_dir)
    if accelerator.is_main_process:
        print("\n".join(summary), flush=True)
    return RunOutcome(0, output_dir, run_id)


def _prepare(request: RunRequest) -> Prepared:
    """The Accelerator for the job's strategy; the checkpoint to continue from (``--resume auto``
    with none: the earlier attempt set aside, a new run); the folder with ``job.toml`` for a new
    run; the log file; the seed."""
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


def _say_start(
    job: ResolvedJob, accelerator: Any, recorder: Recorder, run_id: str | None, checkpoint: Path | None
) -> None:
    if not accelerator.is_main_process:
        return
    resumed = f", resuming {checkpoint.name}" if checkpoint is not None else ""
    where = (
        f", MLflow run {run_id}"
        if run_id and recorder.online
        else ", recording offline (upload later with `runjob sync`)"
        if job.tracking.offline
        else ""
    )
    print(f"runjob: {accelerator.num_processes} process(es) on {accelerator.device.type}{where}{resumed}")


def _system_metrics(job: ResolvedJob, recorder: Recorder, accelerator: Any, role: str) -> SystemMetricsSampler | None:
    """``tracking.system_metrics_interval``'s sampler, started, where ``role`` records: the main
    process from the start; another machine's first process once the run's start time is known."""
    interval = job.tracking.system_metrics_interval
    if interval is None:  # GPU runs: utilisation and memory earn their place; a CPU run's would crowd its own
        interval = SYSTEM_METRICS_ON_GPU if accelerator.device.type == "cuda" else 0.0
    if not interval or not isinstance(recorder, MainRecorder if role == "main" else NodeRecorder):
        return None
    start = recorder.record.start_time if role == "main" else recorder.start_ms
    sampler = SystemMetricsSampler(recorder.log_metrics, interval, job.launch.machine_rank, start)
    sampler.start()
    return sampler


def _assemble(
    request: RunRequest,
    host: PluginHost,
    prepared: Prepared,
    built: Built,
    recorder: Recorder,
    run_id: str | None,
    stop: StopRequest,
) -> tuple[Run, Dispatcher, TrainingLoop]:
    """The run its events see, the one dispatcher of those events, and the loop, positioned where
    the checkpoint left off (callbacks' state loaded); then RUN_START."""
    job = request.job
    callbacks = _make_callbacks(job)
    pruning = sweep_pruning(job, dict(request.tags))
    if pruning is not None:  # a sweep trial with a pruner: after the job's own callbacks
        callbacks[PRUNING_CALLBACK] = pruning
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
    clock = Clock()
    run = Run(parts, clock=clock, record=recorder, stop=stop)
    plugins = {name: chosen.component.plugin for name, chosen in job.enabled_callbacks().items()}
    plugins.setdefault(PRUNING_CALLBACK, "runjob")
    events = dispatcher(run, host.hook, plugins)
    start = load_checkpoint(run, prepared.checkpoint, events) if prepared.checkpoint is not None else Position()
    if prepared.checkpoint is not None:
        resumed = {resumed_tag(prepared.saved["step"]): "; ".join(prepared.changes) or "no changes"}
        if recorder.active and NOTE_TAG in recorder.record.tags:  # a stop's "to go on" is done now
            resumed[NOTE_TAG] = job.job.description or ""
        recorder.set_tags(resumed)
    loop = TrainingLoop(run, events, clock, built.schedule, record=recorder, start=start, stop=stop)
    events.send(Event.RUN_START)
    return run, events, loop


def _finish_training(
    job: ResolvedJob,
    host: PluginHost,
    prepared: Prepared,
    built: Built,
    recorder: Recorder,
    loop: TrainingLoop,
    seconds: float,
) -> list[str]:
    """The final weights saved, the finished run's checkpoints tidied, the outputs recorded (the
    MLflow model built and waited for); the summary lines to print."""
    accelerator, output_dir = prepared.accelerator, prepared.output_dir
    if loop.stopped:
        recorder.set_tags({STOPPED_TAG: loop.stopped, STOPPED_STEP_TAG: str(loop.step)})
    accelerator.wait_for_everyone()
    save_weights(accelerator, built.model, output_dir)
    if not accelerator.is_main_process:
        return []
    _save_adapters(recorder, accelerator, built, output_dir)
    tidied = tidy_finished(output_dir, job.train.keep_checkpoints_finished)
    if tidied:
        print(f"runjob: {tidied}")
    _record_outputs(recorder, job, output_dir, built, accelerator, host)
    _record_named_models(recorder, output_dir)
    summary = _summary(job, recorder, output_dir, loop, seconds)
    recorder.model_logged()
    return summary


def _summary(job: ResolvedJob, recorder: Recorder, output_dir: Path, loop: TrainingLoop, seconds: float) -> list[str]:
    """What the run came to, printed as its last lines: the result, where the models are, the run
    and how to look at it."""
    minutes, rest = divmod(round(seconds), 60)
    took = f"{minutes}m {rest:02d}s" if minutes else f"{rest}s"
    metric = job.train.best_metric
    shown = [f"{metric} {loop.last_metrics[metric]:.4g}"] if metric in loop.last_metrics else []
    shown += [f"{k} {v:.4g}" for k, v in loop.last_metrics.items() if k.startswith("test/")]
    stopped = f", stopped early: {loop.stopped}" if loop.stopped else ""
    lines = [f"runjob: finished {job.job.name} in {took} ({loop.step} steps{stopped}): {'  '.join(shown) or 'done'}"]
    models = [f"final {RunFolder(output_dir).weights}"]
    for model in named_models(output_dir).values():  # what callbacks named (best_weights: "best")
        about = f" ({model.summary})" if model.summary else ""
        models.append(f"{model.name}{about} {output_dir / model.weights}")
    lines.append("runjob: models: " + "; ".join(models))
    if job.tracking.offline or recorder.run_id is None:
        sync = pasteable("sync", output_dir)
        lines.append(f"runjob: recorded offline in {output_dir}: `{sync}` uploads it to MLflow")
        return lines
    uri = recorder.tracking_uri or ""
    experiment = recorder.record.experiment
    runs = pasteable("runs")
    look = f"{runs} --experiment {shlex.quote(experiment)}"
    if uri.startswith(("http://", "https://")):
        experiment_id = recorder.experiment_id
        page = f"/#/experiments/{experiment_id}/runs/{recorder.run_id}" if experiment_id else ""
        look += f"; {uri.rstrip('/')}{page}"
    else:
        look += f"; mlflow ui --backend-store-uri {uri}"
    if uri != recorder.default_tracking_uri:
        look = look.replace(f"{runs} ", f"{runs} --tracking-uri {shlex.quote(uri)} ", 1)
    model = f"; its model: runs:/{recorder.run_id}/{job.job.name}" if job.tracking.log_model != "none" else ""
    lines.append(f"runjob: MLflow run {recorder.run_id} ({experiment}){model}; look at it: {look}")
    return lines


def _prestart_recording(job: ResolvedJob, recording: Recording) -> None:
    """Start the recording process before torch is imported, where this process will record
    (the main process; another machine's first, for its system metrics) in a process of its own:
    its MLflow import then overlaps this process's."""
    from runjob.record import mirror

    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    records = rank == 0 and (not job.tracking.offline or job.tracking.log_model != "none")
    if records or (local_rank == 0 and not job.tracking.offline):
        mirror.prestart(recording)


def _recording_role(accelerator: Any) -> Literal["main", "node", "none"]:
    """The main process records the run; the first process of each other machine, its system metrics."""
    if accelerator.is_main_process:
        return "main"
    return "node" if accelerator.is_local_main_process else "none"


def _start_record(request: RunRequest, host: PluginHost, prepared: Prepared) -> Recorder:
    """Start the run's record on the main process; the recording process opens its MLflow run
    meanwhile (:func:`_open_record` waits for it)."""
    job, accelerator, output_dir = request.job, prepared.accelerator, prepared.output_dir
    resuming, tags = prepared.checkpoint is not None, dict(request.tags)
    recorder = recorder_for(_recording_role(accelerator), output_dir, job.launch.machine_rank)
    recorder.start(
        tracking=job.tracking,
        experiment=default_experiment(job.tracking, job.job.name),
        run_name=default_run_name(job, output_dir, tags),
        params=recorded_params(job),
        tags=_tags(job, host, accelerator, output_dir, tags),
        tracking_uri=job.tracking.uri or request.tracking_uri,
        resuming=resuming,
        disabled={d.name: d.by for d in host.disabled},
        model_name=job.job.name,  # MLflow's Models tab lists the models of every run by name
        recording=request.recording,
    )
    if accelerator.is_main_process and not resuming:
        paths = RunFolder(output_dir)
        paths.record_dir.mkdir(exist_ok=True)
        paths.recorded_job_file.write_text(tomli_w.dumps(redact_tables(job.to_dict())), encoding="utf-8")
        paths.job_sources_file.write_text(json.dumps(job_sources(job), indent=1) + "\n", encoding="utf-8")
        recorder.log_artifact(paths.recorded_job_file)
        recorder.log_artifact(paths.job_sources_file)
    return recorder


def _open_record(recorder: Recorder, accelerator: Any, job: ResolvedJob, recording: Recording) -> str | None:
    """Wait for the MLflow run (created beside the data and model) and tell the other machines
    which run it is; returns its id."""
    recorder.opened()
    shared = [recorder.run_id, recorder.tracking_uri, recorder.record.start_time]
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        shared = broadcast_object_list(shared)
    recorder.run_id, recorder.start_ms = shared[0], shared[2]
    recorder.join(shared[0], shared[1], job.tracking.offline, recording=recording)
    return recorder.run_id


def _make_callbacks(job: ResolvedJob) -> dict[str, Callback]:
    """The job's callbacks that are switched on, built from their options, in the order they are called."""
    return build_each(job.enabled_callbacks(), Callback, "callback")


def _record_baselines(recorder: Recorder, accelerator: Any, baselines: dict[str, float]) -> None:
    """The data's own reference values (``DatasetSplits.baselines``), tagged ``runjob.baseline.<name>``
    and said: as metrics they were the first a run logged, which mlflow ui's compare view opens on."""
    if not baselines:
        return
    recorder.set_tags({baseline_tag(name): f"{float(value):.6g}" for name, value in baselines.items()})
    if accelerator.is_main_process:
        print("runjob: the data's baselines: " + "  ".join(f"{k} {v:.4g}" for k, v in baselines.items()))


def _record_outputs(
    recorder: Recorder, job: ResolvedJob, output_dir: Path, built: Built, accelerator: Any, host: PluginHost
) -> None:
    """Log the final weights, and have the recording process build the final model as an MLflow
    model (``best/`` is ``best_weights``'s; :meth:`Recorder.model_logged` waits for the model). A
    ``weights`` model predicts through the run's predictor (the task and the dataset's fitted
    preprocessing, ``runjob.train.predictor``), or the end of the run says why it cannot."""
    if job.tracking.log_model == "weights":
        from runjob.train.predictor import save_predictor

        prediction, why_not = save_predictor(
            job, accelerator, built.model, built.splits, built.task, output_dir, host, built.facts
        )
        if why_not:
            print(f"runjob: {why_not}", flush=True)
        else:  # runjob predict runs:/ID reads it where the run's folder is not
            recorder.log_artifact(RunFolder(output_dir).predictor_dir, PREDICTOR_DIR)
        recorder.log_model(prediction=prediction)  # it holds model.safetensors: stored once in MLflow
        return
    recorder.log_artifact(RunFolder(output_dir).weights)
    if job.tracking.log_model != "none":
        from runjob.train.data_loading import example_batch

        recorder.log_model(built.task.inputs(example_batch(built.splits.val, built.splits.collate)))


def _keep_data(recorder: Recorder, accelerator: Any, job: ResolvedJob, output_dir: Path, built: Built) -> None:
    """On the main process: the data's facts (``data_facts.json``) and files
    (``DatasetSplits.artifacts``, copied into ``data/``) kept with the run and logged; the versions
    of the libraries the job's components wrap tagged (``runjob.library.NAME``)."""
    if not accelerator.is_main_process:
        return
    folder = RunFolder(output_dir)
    recorder.log_artifact(write_facts(output_dir, built.facts))
    for name, source in built.splits.artifacts.items():
        source = Path(source)
        if not source.is_file():
            raise DataError(f"dataset {job.dataset.name!r}: its artifact {name!r} is not a file: {source}")
        folder.data_dir.mkdir(exist_ok=True)
        kept = folder.data_dir / name
        if source.resolve() != kept.resolve():
            shutil.copy2(source, kept)
        recorder.log_artifact(kept, DATA_DIR)
    components = [job.model.component, job.dataset.component, job.task.component]
    components += [chosen.component for chosen in job.adapters.values()]
    tags = library_versions(components)
    if tags:
        recorder.set_tags(tags)


def _save_adapters(recorder: Recorder, accelerator: Any, built: Built, output_dir: Path) -> None:
    """Each adapter's own files (LoRA weights and config) in ``adapters/NAME/``, logged."""
    if not built.adapters:
        return
    model = accelerator.unwrap_model(built.model, keep_torch_compile=False)
    for name, adapter in built.adapters.items():
        folder = RunFolder(output_dir).adapter_dir(name)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        adapter.save(model, folder)
        if any(folder.iterdir()):
            recorder.log_artifact(folder, f"{ADAPTERS_DIR}/{name}")


def _record_named_models(recorder: Recorder, output_dir: Path) -> None:
    """Upload the models callbacks named (``run.add_model``) and the record of them,
    ``models.json``, once training is over: weights that are the final weights' bytes are not sent
    again; their record says they are the run's ``model.safetensors``."""
    models = named_models(output_dir)
    if not models:
        return
    final = RunFolder(output_dir).weights
    uploaded = []
    for model in models.values():
        weights = output_dir / model.weights
        if not weights.is_file():
            continue
        if final.is_file() and same_bytes(weights, final):
            artifact = WEIGHTS_FILE
        else:
            folder = Path(model.weights).parent.as_posix()
            recorder.log_artifact(weights, None if folder == "." else folder)
            artifact = model.weights
        uploaded.append(NamedModel(model.name, model.weights, model.summary, artifact))
    recorder.log_artifact(write_named_models(output_dir, uploaded))


def _resume_point(job: ResolvedJob, output_dir: Path, resume: Resume) -> tuple[Path, dict[str, Any], list[str]]:
    """The checkpoint and saved state to continue from, and what the job changed (recorded); refuses
    another job's."""
    checkpoint = find_checkpoint(output_dir, resume.checkpoint)
    saved = read_state(checkpoint)
    refused, _ = compare_jobs(saved.get("job", {}), job.to_dict())
    _, allowed = compare_jobs(redact_tables(saved.get("job", {})), redact_tables(job.to_dict()))  # recorded as a tag
    if refused:
        raise RunjobError(f"--resume {checkpoint}: made by a different job; these values differ: {'; '.join(refused)}")
    return checkpoint, saved, allowed


def _auto_resume(accelerator: Any, output_dir: Path) -> bool:
    """``--resume auto``: whether ``output_dir`` holds a complete checkpoint to continue from. When
    it holds none but an earlier attempt's files (killed before its first checkpoint), the main
    process moves them to ``attempts/N`` and marks that attempt's run KILLED; then all start afresh."""
    if complete_checkpoints(output_dir):
        return True
    if accelerator.is_main_process and RunFolder(output_dir).job_file.exists():
        from runjob.record.mlflow_writer import close_abandoned_run

        kept = set_aside_attempt(output_dir)
        run_id = close_abandoned_run(kept, "killed before its first checkpoint; the same command started afresh")
        named = f" (MLflow run {run_id}, now marked KILLED)" if run_id else ""
        print(
            f"runjob: --resume auto: no complete checkpoint in {output_dir}; the earlier attempt{named} is kept in "
            f"{kept}; starting afresh"
        )
    accelerator.wait_for_everyone()
    return False


def _listen_for_stop(stop: StopRequest, extra_signal: str | None) -> StopSignals:
    """SIGTERM, SIGINT, SIGHUP and ``train.stop_signal`` ask the loop to stop after a checkpoint; a second
    Ctrl-C stops at once (one passed on again by a wrapper such as ``uv run`` is the same Ctrl-C:
    :mod:`runjob.train.stopping`). The main process says so when the first arrives."""

    def ask(signum: int) -> None:
        stop.signum = stop.signum or signum

    def announce(signum: int) -> None:
        if signum == signal.SIGINT:
            say("runjob: Ctrl-C: writing a checkpoint, then stopping; press Ctrl-C again to stop at once, without one")
        else:
            say(f"runjob: {signal_name(signum)}: writing a checkpoint, then stopping")

    main = int(os.environ.get("RANK", "0")) == 0  # said before the Accelerator exists
    listener = StopSignals(_stop_signals(extra_signal), ask, announce=announce if main else None, again_raises=True)
    return listener.open()


def _how_to_go_on(
    request: RunRequest, recorder: Recorder, output_dir: Path, interrupt: BaseException, step: int | None
) -> BaseException:
    """The stop to raise, holding the checkpoint and the command that goes on from it (the command
    line prints them), which are also recorded: the tag ``runjob.resume_command`` and a paragraph of
    the run's description. A stop signal's checkpoint is the one it wrote; after a second Ctrl-C, the
    newest complete one (none: the command starts the run again there)."""
    from runjob.errors import Interrupted
    from runjob.train.entry import resume_command

    try:
        checkpoint = interrupt.checkpoint if isinstance(interrupt, Terminated) else None
        if checkpoint is None:
            found = complete_checkpoints(output_dir)
            checkpoint = found[-1] if found else None
        job, disabled = request.job, list(request.disabled_plugins)
        arguments = (job.source.path, job.source.overrides, output_dir, request.tracking_uri)
        command = resume_command(*arguments, afresh=checkpoint is None, disabled=disabled)
        recorded = resume_command(*arguments, afresh=checkpoint is None, redacted=True, disabled=disabled)
        at = f" at step {step}" if step is not None else ""
        if isinstance(interrupt, Terminated):
            interrupt.resume_command = command
            stopped: BaseException = interrupt
            how = f"Stopped by {signal_name(interrupt.signum)}{at} after writing checkpoint {checkpoint}."
        else:
            stopped = Interrupted(checkpoint, command)
            newest = f"the newest complete checkpoint is {checkpoint}" if checkpoint else "there is no checkpoint"
            how = f"Stopped at once by a second Ctrl-C{at}, without a checkpoint; {newest}."
        note = recorder.record.tags.get(NOTE_TAG, "") if recorder.active else ""
        going_on = f"{how} To {'go on' if checkpoint else 'start again'}: `{recorded}`"
        recorder.set_tags({RESUME_COMMAND_TAG: recorded, NOTE_TAG: f"{note}\n\n{going_on}" if note else going_on})
        for line in stopped.said() if isinstance(stopped, (Terminated, Interrupted)) else []:
            logfile.note(line)  # in runjob.log too: the terminal's reader may be gone, and what it was shown with it
        return stopped
    except Exception as failure:  # noqa: BLE001 - saying how to go on must not hide the stop itself
        print(f"runjob: cannot say how to go on: {describe(failure)}", file=sys.stderr)
        return interrupt


def _stop_signals(extra_signal: str | None) -> list[int]:
    # SIGHUP: the terminal went away (a closed SSH session); the run stops as for SIGTERM
    names = ("SIGTERM", "SIGINT", "SIGHUP", *([extra_signal] if extra_signal else []))
    return [getattr(signal, name) for name in names]


# Passing an FSDP or DeepSpeed plugin to the Accelerator writes these into os.environ.
ACCELERATE_SWITCHES = ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED")


def _reset_accelerate(environment: dict[str, str | None]) -> None:
    """Forget this run's Accelerator (its process-wide state) and put back the variables the run set."""
    forget_accelerator()
    for name, value in environment.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _same_on_all_processes(accelerator: Any, output_dir: Path) -> Path:
    """The main process's choice (default folders are named by the time, which may differ)."""
    if accelerator.num_processes == 1:
        return output_dir
    from accelerate.utils import broadcast_object_list

    return Path(broadcast_object_list([str(output_dir)])[0])


def _finish(
    events: Dispatcher | None,
    recorder: Recorder,
    accelerator: Any,
    status: str,
    error: BaseException | None,
    output_dir: Path,
) -> None:
    """RUN_END to every listener (a failure there is said in one line; the outcome stands), a
    plugin's failure's traceback kept in ``runjob.log``, the record closed, the processes parted."""
    if isinstance(error, (TrainingError, ComponentError)) and error.__cause__ is not None:
        logfile.keep_traceback(str(error), error.__cause__)  # the terminal has the one line
    if events is not None:
        for line in events.end(status, error):
            print(f"runjob: {line}", file=sys.stderr)
    recorder.end(status, error)
    accelerator.end_training()
    _destroy_process_group()


def _destroy_process_group() -> None:
    # gloo jobs sometimes abort at interpreter exit when the group is left for atexit to clean up
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
