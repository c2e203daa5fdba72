"""The run's MLflow model in runjob's default format (``tracking.log_model = "weights"``): an
MLflow ``python_function`` model holding the final ``model.safetensors`` and the run's
``job.toml``, which rebuilds the model through runjob's plugins when it is loaded.

Writing it needs neither torch nor the model's code, so runjob's recording process writes it at
the end of a run without importing torch or the model's libraries (seconds on a CPU machine);
the weights are stored as safetensors, not pickled. Load it with

    model = mlflow.pyfunc.load_model("runs:/RUN_ID/model")
    outputs = model.predict(batch)                      # a numpy array in, the model's outputs out
    module = model.unwrap_python_model().model          # the torch.nn.Module, in eval mode

where runjob-train and the model's plugin are installed (the model's requirements list them).
This module imports MLflow; the training process never imports it.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np

WEIGHTS = "weights"
JOB = "job"


class TrainedModel(mlflow.pyfunc.PythonModel):
    """A runjob model rebuilt from its job's ``[model]`` table and weights."""

    def load_context(self, context: Any) -> None:
        from safetensors.torch import load_model

        from runjob.host.plugin_host import load_plugins
        from runjob.job.validation import load_model_table

        chosen = load_model_table(Path(context.artifacts[JOB]), load_plugins())
        self.model = chosen.component.factory(chosen.options)
        load_model(self.model, context.artifacts[WEIGHTS], strict=True)
        self.model.eval()

    def predict(self, context: Any, model_input: np.ndarray, params: dict[str, Any] | None = None) -> np.ndarray:
        """The model's outputs for ``model_input`` (an array, or a DataFrame of numbers), as numpy."""
        import torch

        values = np.asarray(model_input)
        tensor = torch.from_numpy(values.astype(np.float32) if values.dtype.kind == "f" else values)
        with torch.no_grad():
            return self.model(tensor).numpy()


def save_trained_model(folder: Path, output_dir: Path, requirements: list[str]) -> Path:
    """Write the MLflow model of ``output_dir``'s final weights and job into ``folder``."""
    import logging

    from runjob.record.store import environment

    logger = logging.getLogger("mlflow.pyfunc")  # its advice against pickled objects: this one is a
    level = logger.level  # class of runjob's, pickled by reference, with no state of its own
    logger.setLevel(logging.ERROR)
    try:
        with environment({"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}):  # no bar while it copies its files in
            mlflow.pyfunc.save_model(
                str(folder),
                python_model=TrainedModel(),
                artifacts={WEIGHTS: str(output_dir / "model.safetensors"), JOB: str(output_dir / "job.toml")},
                pip_requirements=requirements,
            )
    finally:
        logger.setLevel(level)
    _link_weights(output_dir / "model.safetensors", folder / "artifacts" / "model.safetensors")
    return folder


def _link_weights(weights: Path, copy: Path) -> None:
    """The model folder's copy of the weights, made a hard link to them: stored once on disk."""
    import os

    if not copy.is_file():
        return
    partial = copy.with_suffix(".link")
    try:
        os.link(weights, partial)
        os.replace(partial, copy)
    except OSError:  # another file system: the copy stays
        partial.unlink(missing_ok=True)


def requirements_of(distributions: list[str]) -> list[str]:
    """``name==version`` for each installed distribution (without a local build tag)."""
    return [f"{name}=={importlib.metadata.version(name).split('+')[0]}" for name in sorted(set(distributions))]
