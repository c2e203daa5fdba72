"""The run's record in the session: started with the run's params and tags as the session
prepares (the MLflow run is created while the data and model are built), then a listener on the
dispatcher (:class:`RecordListener`, a :class:`runjob.host.events.Destination`): the data, lineage
and resume tags at RUN_START, metrics at LOG and EVALUATION, the outputs at TRAIN_END, the status
at RUN_END."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import tomli_w

from runjob import __version__
from runjob.errors import DataError
from runjob.host.events import Event, MetricsDestination
from runjob.host.model_build import library_versions, write_facts
from runjob.host.output import screen
from runjob.host.plugin_host import PluginHost
from runjob.host.run_folder import DATA_DIR, RunFolder
from runjob.host.task import declared_metrics
from runjob.job.redaction import redact_override, redact_tables
from runjob.job.validation import ResolvedJob
from runjob.record import mirror
from runjob.record.messages import Recording
from runjob.record.naming import recorded_params, run_name
from runjob.record.provenance import dataset_lineage, git_tags, job_sources
from runjob.record.recorder import MainRecorder, NodeRecorder, Recorder, recorder_for
from runjob.record.system_metrics import SystemMetricsSampler
from runjob.record.uri import default_experiment
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
    STOPPED_STEP_TAG,
    STOPPED_TAG,
    SWEEP_TRIAL_TAG,
    TORCH_VERSION_TAG,
    VERSION_TAG,
    baseline_tag,
    plugin_tag,
    resumed_tag,
)
from runjob.train.accelerator import actual_setup
from runjob.train.data_loading import PositionedLoader
from runjob.train.request import RunRequest
from runjob.train.session_build import Built
from runjob.train.session_outputs import save_outputs
from runjob.train.session_prepare import Prepared

if TYPE_CHECKING:
    from accelerate import Accelerator

    from runjob.train.loop import TrainingLoop


def run_tags(
    job: ResolvedJob, host: PluginHost, accelerator: Accelerator, output_dir: Path, extra: dict[str, str]
) -> dict[str, str]:
    # lazy: `runjob JOB` says its first line and starts its recording process before accelerate and torch load
    # (train.entry)
    import accelerate
    import torch

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
    only = set(job.sweep.parameters) if trial and job.sweep is not None else None  # not the --set all trials share
    return run_name(job.source.overrides, output_dir.name, job.job.name, only)


def prestart_recording(job: ResolvedJob, recording: Recording) -> None:
    """Start the recording process before torch is imported, where this process will record
    (the main process; another machine's first, for its system metrics) in a process of its own:
    its MLflow import then overlaps this process's."""
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    records = rank == 0 and (not job.tracking.offline or job.tracking.log_model != "none")
    if records or (local_rank == 0 and not job.tracking.offline):
        mirror.prestart(recording)


def _recording_role(accelerator: Accelerator) -> Literal["main", "node", "none"]:
    """The main process records the run; the first process of each other machine, its system metrics."""
    if accelerator.is_main_process:
        return "main"
    return "node" if accelerator.is_local_main_process else "none"


def start_record(request: RunRequest, host: PluginHost, prepared: Prepared) -> Recorder:
    """Start the run's record on the main process; the recording process opens its MLflow run
    meanwhile (:func:`open_record` waits for it)."""
    job, accelerator, output_dir = request.job, prepared.accelerator, prepared.output_dir
    resuming, tags = prepared.checkpoint is not None, dict(request.tags)
    recorder = recorder_for(_recording_role(accelerator), output_dir, job.launch.machine_rank)
    recorder.start(
        tracking=job.tracking,
        experiment=default_experiment(job.tracking, job.job.name),
        run_name=default_run_name(job, output_dir, tags),
        params=recorded_params(job),
        tags=run_tags(job, host, accelerator, output_dir, tags),
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


def open_record(recorder: Recorder, accelerator: Accelerator, job: ResolvedJob, recording: Recording) -> str | None:
    """Wait for the MLflow run (created beside the data and model) and tell the other machines
    which run it is; returns its id."""
    recorder.opened()
    shared = [recorder.run_id, recorder.tracking_uri, recorder.record.start_time]
    if accelerator.num_processes > 1:
        # lazy: `runjob JOB` says its first line and starts its recording process before accelerate loads (train.entry)
        from accelerate.utils import broadcast_object_list

        shared = broadcast_object_list(shared)
    run_id, tracking_uri = cast("str | None", shared[0]), cast("str | None", shared[1])  # as given to the broadcast
    recorder.run_id, recorder.start_ms = run_id, cast("int | None", shared[2])
    recorder.join(run_id, tracking_uri, job.tracking.offline, recording=recording)
    return recorder.run_id


def system_metrics(
    job: ResolvedJob, recorder: Recorder, accelerator: Accelerator, role: str
) -> SystemMetricsSampler | None:
    """``tracking.system_metrics_interval``'s sampler, started, where ``role`` records: the main
    process from the start; another machine's first process once the run's start time is known."""
    interval = job.tracking.system_metrics_interval
    if interval is None:  # GPU runs: utilisation and memory earn their place; a CPU run's would crowd its own
        interval = SYSTEM_METRICS_ON_GPU if accelerator.device.type == "cuda" else 0.0
    if not interval or not isinstance(recorder, MainRecorder if role == "main" else NodeRecorder):
        return None
    start = recorder.record.start_time if role == "main" else recorder.start_ms
    if start is None:  # no start time to count from (the record always has one by now)
        return None
    sampler = SystemMetricsSampler(recorder.log_metrics, interval, job.launch.machine_rank, start)
    sampler.start()
    return sampler


def say_start(
    job: ResolvedJob, accelerator: Accelerator, recorder: Recorder, run_id: str | None, checkpoint: Path | None
) -> None:
    resumed = f", resuming {checkpoint.name}" if checkpoint is not None else ""
    where = (
        f", MLflow run {run_id}"
        if run_id and recorder.online
        else ", recording offline (upload later with `runjob sync`)"
        if job.tracking.offline
        else ""
    )
    screen.say(f"runjob: {accelerator.num_processes} process(es) on {accelerator.device.type}{where}{resumed}")


class RecordListener(MetricsDestination):
    """The run's record as a listener on the run's dispatcher: at RUN_START (before the callbacks)
    the dataset's lineage, the data's facts and files, the libraries' versions, the baselines,
    ``model.init_from``'s lineage and a resume's tags; the loop's metrics at LOG and EVALUATION
    (:class:`runjob.host.events.MetricsDestination`); at TRAIN_END (after the callbacks) a stop's
    tags and the outputs (final weights, adapters, the MLflow model, the named models); at RUN_END
    (after every listener) the status, closing the record."""

    BEFORE = frozenset({Event.RUN_START, Event.EVALUATION})
    AFTER = frozenset({Event.LOG, Event.TRAIN_END, Event.RUN_END})

    def __init__(
        self, recorder: Recorder, job: ResolvedJob, host: PluginHost, prepared: Prepared, built: Built
    ) -> None:
        super().__init__(recorder.log_training_metrics)
        self.recorder, self.job, self.host, self.prepared, self.built = recorder, job, host, prepared, built
        self.loop: TrainingLoop | None = None  # its stop, at TRAIN_END

    def before(self, event: Event, values: tuple[object, ...]) -> None:
        if event is Event.RUN_START:
            self._run_start()
        else:
            super().before(event, values)

    def after(self, event: Event, values: tuple[object, ...]) -> None:
        if event is Event.TRAIN_END:
            loop = self.loop
            if loop is not None and loop.stopped:
                self.recorder.set_tags({STOPPED_TAG: loop.stopped, STOPPED_STEP_TAG: str(loop.step)})
            save_outputs(self.recorder, self.job, self.host, self.prepared, self.built)
        elif event is Event.RUN_END:
            status, error = cast("tuple[str, BaseException | None]", values)
            self.recorder.end(status, error)
        else:
            super().after(event, values)

    def _run_start(self) -> None:
        recorder, job, prepared, built = self.recorder, self.job, self.prepared, self.built
        accelerator = prepared.accelerator
        recorder.log_input(dataset_lineage(job, built.splits), "training")
        _keep_data(recorder, accelerator, job, prepared.output_dir, built)
        _record_baselines(recorder, built.splits.baselines)
        if built.lineage:
            recorder.set_tags(built.lineage)
        if isinstance(built.train_loader, PositionedLoader):  # a streamed split: its division, padding counted
            recorder.set_tags(built.train_loader.record_tags())
        if prepared.checkpoint is not None:
            resumed = {resumed_tag(cast(int, prepared.saved["step"])): "; ".join(prepared.changes) or "no changes"}
            if recorder.active and NOTE_TAG in recorder.record.tags:  # a stop's "to go on" is done now
                resumed[NOTE_TAG] = job.job.description or ""
            recorder.set_tags(resumed)


def _keep_data(recorder: Recorder, accelerator: Accelerator, job: ResolvedJob, output_dir: Path, built: Built) -> None:
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


def _record_baselines(recorder: Recorder, baselines: dict[str, float]) -> None:
    """The data's own reference values (``DatasetSplits.baselines``), tagged ``runjob.baseline.<name>``
    and said: as metrics they were the first a run logged, which mlflow ui's compare view opens on."""
    if not baselines:
        return
    recorder.set_tags({baseline_tag(name): f"{float(value):.6g}" for name, value in baselines.items()})
    screen.say("runjob: the data's baselines: " + "  ".join(f"{k} {v:.4g}" for k, v in baselines.items()))
