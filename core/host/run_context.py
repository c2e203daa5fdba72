"""What training event hooks receive about the run in progress."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class RunContext:
    """The run in progress, as passed to ``runjob_run_start`` and the other event hooks.

    ``job`` is the :class:`runjob.job.validation.ResolvedJob`; ``accelerator`` the
    ``accelerate.Accelerator``; ``model``, ``optimizer`` and the loaders are the prepared objects;
    ``scheduler`` may be ``None``; ``mlflow_run_id`` is set on the main process only; ``task`` is
    the job's :class:`runjob.Task`; ``test_loader`` is ``None`` unless the dataset has a test split.
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
