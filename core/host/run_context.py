"""What training event hooks and callbacks receive about the run in progress."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunContext:
    """The run in progress, as passed to ``runjob_run_start``, the other event hooks and callbacks.

    ``job`` is the :class:`runjob.job.validation.ResolvedJob`; ``accelerator`` the
    ``accelerate.Accelerator``; ``model``, ``optimizer`` and the loaders are the prepared objects;
    ``scheduler`` may be ``None``; ``mlflow_run_id`` is set on the main process only; ``task`` is
    the job's :class:`runjob.Task`; ``test_loader`` is ``None`` unless the dataset has a test split;
    ``callbacks`` maps the job's ``[callbacks.NAME]`` names to their :class:`runjob.Callback`;
    ``step`` and ``epoch`` say where training stands (optimizer steps done, the 0-based epoch).
    """

    job: Any
    accelerator: Any
    model: Any
    optimizer: Any
    scheduler: Any
    train_loader: Any
    val_loader: Any
    output_dir: Path
    mlflow_run_id: str | None = None
    task: Any = None
    test_loader: Any = None
    callbacks: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    epoch: int = 0
    logged: dict[str, float] = field(default_factory=dict)
    """What callbacks logged with :meth:`log`, the latest value of each name."""
    recorder: Any = field(default=None, repr=False)
    """The run's record (the host's): metrics, tags and artifacts go through it into the output
    folder and MLflow."""
    stop_request: Any = field(default=None, repr=False)
    joining: dict[str, float] | None = field(default=None, repr=False)
    """While the loop logs (``on_log``), the metrics being logged: what callbacks log then joins them."""

    def log(self, metrics: dict[str, float]) -> None:
        """Record ``metrics`` at the current step, by the path runjob's own metrics take: into the
        output folder's ``metrics.jsonl`` and MLflow, kept by an offline run and uploaded by
        ``runjob sync``. Only the main process's values are recorded; call it on every process or
        on the main one. Declare the names in the callback's options (``metrics()``)."""
        values = {str(name): float(value) for name, value in metrics.items()}
        self.logged.update(values)
        if self.joining is not None:  # inside on_log: one record line with runjob's own metrics
            self.joining.update(values)
        elif self.recorder is not None:
            self.recorder.log_training_metrics(values, self.step)

    def save_model(self, folder: str | Path) -> Path:
        """Write the model's weights to ``folder/model.safetensors`` (gathered from every process
        when the strategy shards them), as the run's final ``model.safetensors`` is written. Call it
        on every process; returns the file."""
        folder = Path(folder)
        self.accelerator.wait_for_everyone()
        save_weights(self.accelerator, self.model, folder)
        return folder / "model.safetensors"

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None:
        """Record the file or folder ``path``, which must be inside :attr:`output_dir`, as an artifact
        of the run (under ``folder`` when given): kept in the local record, uploaded with the run,
        and by ``runjob sync`` after an offline run. Only the main process's calls are recorded."""
        path, root = Path(path).resolve(), self.output_dir.resolve()
        if not path.is_relative_to(root):
            raise ValueError(f"run.log_artifact({path}): artifacts must be inside the output folder {self.output_dir}")
        if self.recorder is not None:
            self.recorder.log_artifact(self.output_dir / path.relative_to(root), folder)

    def set_tags(self, tags: dict[str, str]) -> None:
        """Set tags on the run (main process only), e.g. a callback's verdict."""
        if self.recorder is not None:
            self.recorder.set_tags({str(key): str(value) for key, value in tags.items()})

    def request_stop(self, reason: str) -> None:
        """Ask training to end early, cleanly: at the next point where all processes agree anyway
        (a log step, the end of an evaluation) the loop stops; the run then evaluates, saves and
        uploads its final and best model, and ends FINISHED with ``reason`` as the tag
        ``runjob.stopped``. A request from any process stops every process."""
        if self.stop_request is not None and not self.stop_request.reason:
            self.stop_request.reason = reason or "stopped by a callback"


def save_weights(accelerator: Any, model: Any, folder: Path) -> None:
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
