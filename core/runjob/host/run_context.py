"""What callbacks, global event hooks and tasks receive about the run in progress.

A :class:`Run` is both halves a plugin sees: :class:`RunState`, what it may read (the job, the
prepared objects, the position: ``step`` and ``epoch``, the processes), read-only, the loop being the
only one that moves the position; and :class:`RunActions`, what it may do (log metrics, set tags,
log an artifact, save the model, ask the run to stop). Annotate a callback's ``run`` as
``runjob.Run`` (or as the half it uses). Nothing here imports torch.

``runjob.RunContext`` is the old name of :class:`Run`; it keeps working, with a
``DeprecationWarning``, until the next minor release.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from runjob.host.events import Dispatcher, Journal
from runjob.host.output import screen
from runjob.host.run_folder import WEIGHTS_FILE, RunFolder

if TYPE_CHECKING:  # annotations only: the host never imports torch
    import torch
    from accelerate import Accelerator
    from pluggy import HookRelay

    from runjob.host.callback import Callback
    from runjob.host.task import Task
    from runjob.job.validation import ResolvedJob


class RunState(Protocol):
    """What a callback, a hook or a task may read about the run in progress (read-only)."""

    @property
    def job(self) -> ResolvedJob:
        """The job as resolved (``runjob.Job``): ``run.job.train.best_metric``, ``run.job.job.name``."""
        ...

    @property
    def accelerator(self) -> Accelerator:
        """The ``accelerate.Accelerator`` (``device``, ``unwrap_model``, ``gather``...)."""
        ...

    @property
    def model(self) -> torch.nn.Module:
        """The prepared ``torch.nn.Module`` (wrapped for DDP/FSDP/DeepSpeed when the strategy does)."""
        ...

    @property
    def task(self) -> Task:
        """The job's :class:`runjob.Task`."""
        ...

    @property
    def output_dir(self) -> Path:
        """The run's output folder."""
        ...

    @property
    def step(self) -> int:
        """Optimizer steps done so far."""
        ...

    @property
    def epoch(self) -> int:
        """The 0-based epoch being trained."""
        ...

    @property
    def process_index(self) -> int:
        """This process's index among all of the run's processes (0: the main process)."""
        ...

    @property
    def num_processes(self) -> int:
        """How many processes train the run."""
        ...

    @property
    def is_main_process(self) -> bool:
        """Whether this is the process that records the run."""
        ...

    @property
    def logged(self) -> Mapping[str, float]:
        """What callbacks logged with ``run.log``: the latest value of each name."""
        ...

    @property
    def stopping(self) -> bool:
        """Whether the run was asked to stop (a signal, a callback): it stops at the next point where
        every process agrees."""
        ...


class RunActions(Protocol):
    """What a callback, a hook or a task may do to the run in progress."""

    def log(self, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` at the current step (module docstring of :mod:`runjob.host.events`)."""
        ...

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set tags on the run (main process only)."""
        ...

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None:
        """Record a file or folder inside the output folder as an artifact of the run."""
        ...

    def save_model(self, folder: str | Path) -> Path:
        """Write the model's weights to ``folder/model.safetensors``; call it on every process."""
        ...

    def request_stop(self, reason: str) -> None:
        """Ask training to end early, cleanly, with ``reason``."""
        ...

    def say(self, line: str) -> None:
        """Say ``line`` on the run's output, once for the job (the main process's call)."""
        ...


class RecordSink(Protocol):
    """Where a run's actions are recorded: the host's recorder, or a test kit's fake."""

    def log_training_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...


@dataclass
class StopFlag:
    """A request to stop: ``reason`` from a callback, ``signum`` from a signal (the loop's
    ``StopRequest`` is one)."""

    reason: str = ""
    signum: int = 0


@dataclass
class Clock:
    """Where training stands. The loop (or the test kit's ``drive``) moves it; nothing else does."""

    step: int = 0
    epoch: int = 0


@dataclass(frozen=True)
class RunParts:
    """What the session built for a run, handed to :class:`Run` once."""

    job: ResolvedJob
    accelerator: Accelerator
    model: torch.nn.Module
    task: Task
    output_dir: Path
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None
    train_loader: Any = None
    val_loader: Any = None
    test_loader: Any = None
    mlflow_run_id: str | None = None
    callbacks: Mapping[str, Callback] = field(default_factory=dict)


class Run:
    """The run in progress, as events and hooks receive it: :class:`RunState` to read,
    :class:`RunActions` to act. ``mlflow_run_id`` is set on the main process only; ``scheduler``
    and ``test_loader`` may be ``None``; ``callbacks`` maps the job's ``[callbacks.NAME]`` names
    to their :class:`runjob.Callback`, in the order they are called."""

    def __init__(
        self,
        parts: RunParts,
        *,
        clock: Clock | None = None,
        record: RecordSink | None = None,
        stop: StopFlag | None = None,
    ) -> None:
        self._parts = parts
        self._clock = clock or Clock()
        self._record = record
        self._stop = stop or StopFlag()
        self._journal = Journal(record.log_training_metrics if record is not None else None, lambda: self.step)

    # -- the state ---------------------------------------------------------------------------

    @property
    def job(self) -> ResolvedJob:
        return self._parts.job

    @property
    def accelerator(self) -> Accelerator:
        return self._parts.accelerator

    @property
    def model(self) -> torch.nn.Module:
        return self._parts.model

    @property
    def optimizer(self) -> Any:
        """The prepared optimizer (``None`` outside training: ``runjob evaluate``)."""
        return self._parts.optimizer

    @property
    def scheduler(self) -> Any:
        """The learning-rate scheduler, or ``None``."""
        return self._parts.scheduler

    @property
    def train_loader(self) -> Any:
        return self._parts.train_loader

    @property
    def val_loader(self) -> Any:
        return self._parts.val_loader

    @property
    def test_loader(self) -> Any:
        """The test split's loader, or ``None`` when the dataset has none."""
        return self._parts.test_loader

    @property
    def task(self) -> Task:
        return self._parts.task

    @property
    def output_dir(self) -> Path:
        return self._parts.output_dir

    @property
    def mlflow_run_id(self) -> str | None:
        return self._parts.mlflow_run_id

    @property
    def callbacks(self) -> Mapping[str, Callback]:
        return MappingProxyType(dict(self._parts.callbacks))

    @property
    def step(self) -> int:
        return self._clock.step

    @property
    def epoch(self) -> int:
        return self._clock.epoch

    @property
    def process_index(self) -> int:
        return int(self.accelerator.process_index)

    @property
    def num_processes(self) -> int:
        return int(self.accelerator.num_processes)

    @property
    def is_main_process(self) -> bool:
        return bool(self.accelerator.is_main_process)

    @property
    def logged(self) -> Mapping[str, float]:
        return MappingProxyType(self._journal.logged)

    @property
    def stopping(self) -> bool:
        return bool(self._stop.signum or self._stop.reason)

    # -- the actions -------------------------------------------------------------------------

    def log(self, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` at the current step, by the path runjob's own metrics take: into the
        output folder's ``metrics.jsonl`` and MLflow, kept by an offline run and uploaded by
        ``runjob sync``. Logged during an event, they are recorded when the event's listeners are
        done; during ``on_log``, in the same line as runjob's own. Only the main process's values
        are recorded; call it on every process or on the main one. Declare the names in the
        callback's options (``metrics()``)."""
        self._journal.log({str(name): float(value) for name, value in metrics.items()})

    def save_model(self, folder: str | Path) -> Path:
        """Write the model's weights to ``folder/model.safetensors`` (gathered from every process
        when the strategy shards them), as the run's final ``model.safetensors`` is written. Call it
        on every process; returns the file."""
        folder = Path(folder)
        self.accelerator.wait_for_everyone()
        save_weights(self.accelerator, self.model, folder)
        return folder / WEIGHTS_FILE

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None:
        """Record the file or folder ``path``, which must be inside :attr:`output_dir`, as an artifact
        of the run (under ``folder`` when given): kept in the local record, uploaded with the run,
        and by ``runjob sync`` after an offline run. Only the main process's calls are recorded."""
        path, root = Path(path).resolve(), self.output_dir.resolve()
        if not path.is_relative_to(root):
            raise ValueError(f"run.log_artifact({path}): artifacts must be inside the output folder {self.output_dir}")
        if self._record is not None:
            self._record.log_artifact(self.output_dir / path.relative_to(root), folder)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set tags on the run (main process only), e.g. a callback's verdict."""
        if self._record is not None:
            self._record.set_tags({str(key): str(value) for key, value in tags.items()})

    def request_stop(self, reason: str) -> None:
        """Ask training to end early, cleanly: at the next point where all processes agree anyway
        (a log step, the end of an evaluation) the loop stops; the run then evaluates, saves and
        uploads its final and best model, and ends FINISHED with ``reason`` as the tag
        ``runjob.stopped``. A request from any process stops every process."""
        if not self._stop.reason:
            self._stop.reason = reason or "stopped by a callback"

    def say(self, line: str) -> None:
        """Say ``line`` on the run's output (stdout), once for the job: the main process's call
        says it, other processes' calls say nothing; a progress bar on screen is moved out of its
        way, and a terminal nobody reads any more keeps it in ``runjob.log``. Call it on every
        process or on the main one."""
        screen.say(line, main=self.is_main_process)

    def add_model(self, name: str, weights: str | Path, summary: str = "") -> None:
        """Name a model of this run besides its final weights: ``weights``, a ``.safetensors`` file
        inside :attr:`output_dir` (e.g. one :meth:`save_model` wrote), with a one-line ``summary``
        of what makes it this model (``"val/accuracy 0.9972 at step 220"``). It goes into the run's
        record of models, ``OUTPUT_DIR/models.json`` (:func:`named_models`): the end of the run
        lists it (``runjob: models: final PATH; NAME (SUMMARY) PATH``), its weights are uploaded
        with the run (stored once when they are the final weights' bytes) and ``model.init_from =
        "runs:/RUN_ID/NAME"`` finds them. Naming it again replaces the entry. Main process only
        (other processes' calls are ignored); call it after the weights are written."""
        if not self.is_main_process:
            return
        path, root = Path(weights).resolve(), self.output_dir.resolve()
        if not path.is_relative_to(root) or path.suffix != ".safetensors":
            raise ValueError(
                f"run.add_model({name!r}, {weights}): the weights must be a .safetensors file inside {root}"
            )
        models = {model.name: model for model in named_models(self.output_dir).values()}
        models[name] = NamedModel(name, path.relative_to(root).as_posix(), summary)
        write_named_models(self.output_dir, models.values())


@dataclass(frozen=True)
class NamedModel:
    """One entry of a run's record of models (``OUTPUT_DIR/models.json``): ``{"NAME": {"weights":
    "best/model.safetensors", "summary": "...", "artifact": "best/model.safetensors"}}``. ``weights``
    is relative to the output folder; ``artifact`` is where MLflow holds them once uploaded
    (``model.safetensors`` when they are the final weights' bytes, stored once; empty before)."""

    name: str
    weights: str
    summary: str = ""
    artifact: str = ""


def named_models(output_dir: Path) -> dict[str, NamedModel]:
    """The run's named models (:meth:`Run.add_model`), by name; none when it has no record of them."""
    try:
        entries = json.loads(RunFolder(output_dir).models_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return {
        name: NamedModel(name, str(entry["weights"]), str(entry.get("summary", "")), str(entry.get("artifact", "")))
        for name, entry in entries.items()
    }


def write_named_models(output_dir: Path, models: Iterable[NamedModel]) -> Path:
    """Write the record of named models (written whole, then moved into place: never half a file)."""
    entries = {
        model.name: {
            "weights": model.weights,
            "summary": model.summary,
            **({"artifact": model.artifact} if model.artifact else {}),
        }
        for model in models
    }
    path = RunFolder(output_dir).models_file
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def dispatcher(run: Run, hooks: HookRelay | None = None, plugins: Mapping[str, str] | None = None) -> Dispatcher:
    """The one dispatcher of ``run``'s events: its callbacks, then the global ``hooks`` (pluggy's
    relay); what callbacks log goes through the run's journal (:class:`runjob.host.events.Journal`)."""
    return Dispatcher(
        run,
        run._parts.callbacks,
        hooks=hooks,
        plugins=plugins,
        main_process=run.is_main_process,
        journal=run._journal,
        step=lambda: run.step,
    )


class _RunContext(Run):
    """The old ``RunContext``, built as before: ``RunContext(job, accelerator, model, optimizer,
    scheduler, train_loader, val_loader, output_dir, mlflow_run_id=None, task=None,
    test_loader=None, callbacks=None)``."""

    def __init__(
        self,
        job: ResolvedJob,
        accelerator: Accelerator,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        train_loader: Any,
        val_loader: Any,
        output_dir: Path,
        mlflow_run_id: str | None = None,
        task: Any = None,
        test_loader: Any = None,
        callbacks: Mapping[str, Callback] | None = None,
    ) -> None:
        parts = RunParts(
            job,
            accelerator,
            model,
            task,
            Path(output_dir),
            optimizer,
            scheduler,
            train_loader,
            val_loader,
            test_loader,
            mlflow_run_id,
            dict(callbacks or {}),
        )
        super().__init__(parts)


def __getattr__(name: str) -> Any:
    if name == "RunContext":
        warnings.warn(
            "runjob.RunContext is now runjob.Run (the same object); the old name goes in the next minor release",
            DeprecationWarning,
            stacklevel=2,
        )
        return _RunContext
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def save_weights(accelerator: Accelerator, model: torch.nn.Module, folder: Path) -> None:
    """``model.safetensors`` of the plain model (gathered from every rank when sharded; without a
    ``torch.compile`` wrapper, whose weight names would start ``_orig_mod.``). Tied weights (a
    language model's input and output embedding) are stored once, as safetensors requires; the
    model's constructor ties them again on loading, so Accelerate's note about it is not shown."""

    def not_the_tie_note(record: logging.LogRecord) -> bool:
        return "Removed shared tensor" not in record.getMessage()

    logger = logging.getLogger("accelerate.utils.other")
    logger.addFilter(not_the_tie_note)
    try:
        accelerator.save_model(getattr(model, "_orig_mod", model), folder, safe_serialization=True)
    finally:
        logger.removeFilter(not_the_tie_note)
