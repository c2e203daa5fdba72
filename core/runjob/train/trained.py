"""A finished run, loaded back to be used: ``runjob evaluate``, ``predict`` and ``export`` find it
here (an output folder, an MLflow run id or ``runs:/ID``), rebuild its job, its model with the
trained weights (``model.safetensors``), its data and its task.

The job is the run's resolved ``job.toml``: the output folder's own copy when the folder is on
this machine (found through the MLflow run's tag ``runjob.output_dir``), else the copy recorded
in MLflow, downloaded with ``model.safetensors``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runjob.errors import RunjobError, TrainingError, first_line
from runjob.host.components import Batch, Collate, DataFacts, DatasetSplits, ImageTensors, Split
from runjob.host.model_build import adapter_places, apply_adapters, make_adapters, read_facts, takes_data
from runjob.host.model_build import build_model as make_model
from runjob.host.run_context import Run, RunParts
from runjob.host.run_folder import DATA_FACTS_FILE, JOB_FILE, PREDICTOR_DIR, WEIGHTS_FILE, RunFolder
from runjob.host.streams import Streamed
from runjob.host.task import Task
from runjob.job.jobfile import load_job as load_job_file
from runjob.job.validation import ResolvedJob, resolve
from runjob.record.local import RunRecord
from runjob.record.prediction import collate, load_predictor, saved_any
from runjob.record.store import download_artifact, get_run, open_store, reading
from runjob.record.uri import resolve_tracking_uri
from runjob.tags import OUTPUT_DIR_TAG
from runjob.train.accelerator import forget_accelerator
from runjob.train.data_loading import BatchedImages, is_stream, make_loaders
from runjob.train.loop import evaluate

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from runjob.host.components import Adapter
    from runjob.host.plugin_host import PluginHost
    from runjob.record.prediction import Predictor

RUN_ID = re.compile(r"^[0-9a-fA-F]{8,64}$")


@dataclass
class TrainedRun:
    """Where a finished run's files are: ``folder`` holds its ``job.toml`` and
    ``model.safetensors`` (the run's output folder, or a download of its MLflow artifacts);
    ``output_dir`` is the run's output folder when it is on this machine. ``run_id``,
    ``tracking_uri``, ``experiment`` and ``run_name``: its MLflow run, when it has one."""

    reference: str
    folder: Path
    output_dir: Path | None = None
    run_id: str | None = None
    tracking_uri: str | None = None
    experiment: str | None = None
    run_name: str | None = None

    @property
    def job_file(self) -> Path:
        return RunFolder(self.folder).job_file

    @property
    def model_file(self) -> Path:
        return RunFolder(self.folder).weights

    @property
    def label(self) -> str:
        """How messages name the run: its MLflow run id, else its output folder."""
        return self.run_id or str(self.output_dir or self.reference)


def find_run(reference: str, tracking_uri: str | None, scratch: Path) -> TrainedRun:
    """The run ``reference`` names: an output folder, an MLflow run id or ``runs:/ID`` (looked up
    at ``tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else MLflow's default). When its output
    folder is not here, its ``job.toml`` and ``model.safetensors`` are downloaded into
    ``scratch``. A run without a model is a one-line error."""
    path = Path(reference).expanduser()
    if path.is_dir():
        found = _from_folder(reference, path)
    elif reference.startswith("runs:/") or RUN_ID.match(reference):
        found = _from_mlflow(reference, tracking_uri, scratch)
    else:
        raise RunjobError(
            f"{reference}: no such folder, and not an MLflow run id; give a run's output folder, its run id or runs:/ID"
        )
    if not found.model_file.is_file():
        raise RunjobError(
            f"run {found.label} has no model: no {WEIGHTS_FILE} in {found.folder} (it did not finish training); use a "
            "finished run"
        )
    return found


def _from_folder(reference: str, path: Path) -> TrainedRun:
    if not RunFolder(path).job_file.is_file():
        raise RunjobError(f"{path}: no {JOB_FILE} here: not the output folder of a runjob run")
    record = RunRecord.read(path) or RunRecord()
    return TrainedRun(
        reference,
        path,
        output_dir=path,
        run_id=record.run_id,
        tracking_uri=record.tracking_uri,
        experiment=record.experiment or None,
        run_name=record.run_name or None,
    )


def _from_mlflow(reference: str, tracking_uri: str | None, scratch: Path) -> TrainedRun:
    run_id = reference.removeprefix("runs:/").strip("/").partition("/")[0]
    uri = resolve_tracking_uri(tracking_uri)
    client = open_store(uri)
    with reading(uri):
        run = get_run(client, uri, run_id)
        experiment = client.get_experiment(run.info.experiment_id).name
    tagged = run.data.tags.get(OUTPUT_DIR_TAG)
    output_dir = Path(tagged) if tagged and RunFolder(Path(tagged)).job_file.is_file() else None
    found = TrainedRun(reference, output_dir or scratch, output_dir, run_id, uri, experiment, run.info.run_name)
    if output_dir is None:  # the folder is on another machine, or gone: the recorded copies
        _download(uri, run_id, JOB_FILE, scratch, required=True)
        _download(uri, run_id, WEIGHTS_FILE, scratch, required=False)
        _download(uri, run_id, DATA_FACTS_FILE, scratch, required=False)
        _download(uri, run_id, PREDICTOR_DIR, scratch, required=False)
    return found


def _download(uri: str, run_id: str, name: str, folder: Path, required: bool) -> None:
    """Download artifact ``name`` of run ``run_id`` into ``folder``; a missing one is an error when ``required``."""
    if download_artifact(uri, run_id, name, folder) is None and required:
        raise RunjobError(f"run {run_id} has no {name} artifact: it was not made by runjob")


def load_job(run: TrainedRun, overrides: list[str], host: PluginHost, data: bool = True) -> ResolvedJob:
    """The run's resolved job, with ``--set`` changes to its ``[dataset]`` table (nothing else may
    change: the model must stay the one the weights were trained for). Without ``data`` (the run's
    saved predictor and facts stand in for its data), the ``[dataset]`` options are taken as
    written: the files they name may be gone."""
    for override in overrides:
        key = override.partition("=")[0].strip()
        if not key.startswith("dataset."):
            raise RunjobError(
                f"--set {override}: only the dataset can be changed for a trained model; give dataset.KEY=VALUE"
            )
    raw = load_job_file(run.job_file, overrides)
    model = raw.data.get("model")
    if isinstance(model, dict):  # the trained weights replace where training started: it need not be here
        model.pop("init_from", None)
    return resolve(raw, host, () if data else ("dataset",))


def saved(run: TrainedRun, host: PluginHost) -> tuple[ResolvedJob | None, Predictor | None]:
    """The run's job and the predictor it saved (``runjob.record.prediction.load_predictor``:
    rebuilt from data by the installed plugins), or ``(None, None)`` when it saved none. The
    job's dataset is not checked where the run kept its facts: its files need not be here."""
    if not saved_any(run.folder):
        return None, None
    job = load_job(run, [], host, data=not RunFolder(run.folder).data_facts.is_file())
    predictor = load_predictor(run.folder, host, job.task)
    if predictor is None or predictor.inputs is None:  # a predictor without inputs: the data, built
        return None, None
    return job, predictor


def build_model(
    job: ResolvedJob, model_file: Path, folder: Path | None = None, splits: DatasetSplits | None = None
) -> torch.nn.Module:
    """The job's model with the run's trained weights (every weight must fit: strict), in eval mode, on the CPU."""
    return build_trained(job, model_file, folder, splits)[0]


def build_trained(
    job: ResolvedJob, model_file: Path, folder: Path | None = None, splits: DatasetSplits | None = None
) -> tuple[torch.nn.Module, dict[str, Adapter]]:
    """:func:`build_model`, and the job's adapters (to merge them for export). The model factory
    gets the facts the run saved in ``folder`` (``data_facts.json``); for a run from before they
    were saved, those of ``splits`` (or of the job's dataset, built for it)."""
    # lazy: `runjob JOB` says its first line and starts its recording process before safetensors loads (train.entry)
    from safetensors.torch import load_model

    facts = read_facts(folder) if folder is not None else None
    if facts is None and takes_data(job.model.component.factory):
        facts = DataFacts.of(splits if splits is not None else load_data(job)[0])
    adapters = make_adapters(job.adapters)
    built = make_model(job.model.component.factory, job.model.options, facts)
    model = apply_adapters(built, adapters, adapter_places(job.adapters))
    try:
        load_model(model, str(model_file), strict=True)
    except Exception as error:  # noqa: BLE001 - names that differ, shapes that differ, a damaged file
        raise RunjobError(
            f"{model_file} does not fit model {job.model.name!r} as the job builds it: {first_line(error)[:300]}"
        ) from None
    return model.eval(), adapters


def load_data(job: ResolvedJob) -> tuple[DatasetSplits, Task]:
    """The job's dataset splits and its task."""
    splits = job.dataset.component.factory(job.dataset.options)
    task = job.task.component.factory(job.task.options, splits)
    if not isinstance(task, Task):
        raise TrainingError(
            f"task {job.task.name!r} (plugin {job.task.component.plugin}): its factory returned a "
            f"{type(task).__name__}, not a runjob.Task"
        )
    return splits, task


def best_device() -> torch.device:
    """CUDA when there is a GPU, else the CPU."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@contextlib.contextmanager
def one_process_accelerator(job: ResolvedJob) -> Iterator[Accelerator]:
    """An Accelerator for this process alone, in the job's precision (fp16 only on a GPU), on the
    GPU when there is one (unless ``train.cpu``); Accelerate's process-wide state is forgotten after."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch and accelerate load
    # (train.entry)
    import torch
    from accelerate import Accelerator

    cpu = job.train.cpu or not torch.cuda.is_available()
    precision = "no" if cpu and job.train.mixed_precision == "fp16" else job.train.mixed_precision
    try:
        yield Accelerator(cpu=cpu, mixed_precision=precision)
    finally:
        forget_accelerator()


def evaluate_split(run: TrainedRun, job: ResolvedJob, split: str) -> dict[str, float]:
    """The task's metrics over the ``split`` ("val" or "test") with the run's final weights, as
    training evaluated it (``split/name``)."""
    splits, task = load_data(job)
    if split == "test" and splits.test is None:
        raise RunjobError(
            f"dataset {job.dataset.name!r} has no test split (as the run's job sets it up): use --split val"
        )
    model = build_model(job, run.model_file, run.folder, splits)
    if job.train.channels_last:
        # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
        import torch

        model = model.to(memory_format=torch.channels_last)
    with one_process_accelerator(job) as accelerator:
        _, val_loader, test_loader = make_loaders(splits, job, accelerator)
        loader = val_loader if split == "val" else test_loader
        assert loader is not None  # a missing test split was refused above
        if is_stream(loader):  # a streamed split's loader moves its batches itself
            model = accelerator.prepare(model)
        else:
            model, loader = accelerator.prepare(model, loader)
        context = Run(RunParts(job, accelerator, model, task, run.output_dir or run.folder, val_loader=loader))
        return evaluate(context, loader, split)


def sample_batch(split: Split, count: int = 8, collate_fn: Collate | None = None) -> Batch:
    """The first ``count`` samples of a split (fewer when it is smaller) as one batch on the CPU,
    as evaluation sees them (``collate_fn``: the dataset's ``DatasetSplits.collate``)."""
    indices = list(range(min(count, len(split))))
    if isinstance(split, ImageTensors):
        # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
        import torch

        return BatchedImages(split, torch.device("cpu"), seed=0, augment=False).__getitems__(indices)
    if isinstance(split, Streamed):
        # lazy: LitData (and its S3 clients) only for a streamed split
        from runjob.train.streaming import first_samples

        return (collate_fn or collate)(first_samples(split, count))
    return (collate_fn or collate)([split[index] for index in indices])
