"""The run's MLflow model in runjob's default format (``tracking.log_model = "weights"``): an
MLflow ``python_function`` model holding the final ``model.safetensors``, the run's ``job.toml``
and its predictor (``prediction.pkl``: the task and the dataset's fitted preprocessing), which
rebuilds the model through runjob's plugins when it is loaded and predicts from raw inputs exactly
as ``runjob predict`` does (``runjob.record.prediction``), with a signature.

Writing it needs neither torch nor the model's code, so runjob's recording process writes it at
the end of a run without importing torch or the model's libraries; the weights are stored as
safetensors, not pickled. Distributions that no package index has (runjob from a checkout, a plugin
installed from a folder) travel inside it as wheels (``runjob.record.wheels``), so ``mlflow models
serve`` can build its environment. Load it with

    model = mlflow.pyfunc.load_model("runs:/RUN_ID/NAME")
    rows = model.predict(frame)                         # raw inputs in, runjob predict's columns out
    module = model.unwrap_python_model().model          # the torch.nn.Module, in eval mode

This module imports MLflow; the training process never imports it.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import warnings
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

from runjob.host.run_folder import WEIGHTS_FILE, RunFolder

WEIGHTS = "weights"
JOB = "job"
PREDICTOR = "predictor"
DATA_FACTS = "data_facts"
DATA_ARTIFACT = "data_"
"""The prefix of the dataset's files (``DatasetSplits.artifacts``) among the model's artifacts."""
WHEELS_FOLDER = "wheels"


class TrainedModel(mlflow.pyfunc.PythonModel):
    """A runjob model rebuilt from its job's ``[model]`` table and weights, predicting through the
    run's :class:`runjob.record.prediction.Predictor` when the dataset gave :class:`runjob.Inputs`."""

    def load_context(self, context: Any) -> None:
        from safetensors.torch import load_model

        from runjob.host.model_build import rebuild_model
        from runjob.host.plugin_host import load_plugins
        from runjob.job.validation import load_model_adapters, load_model_table
        from runjob.record.prediction import Predictor

        host = load_plugins()
        job_file = Path(context.artifacts[JOB])
        facts = context.artifacts.get(DATA_FACTS)
        folder = Path(facts).parent if facts else None  # data_facts.json beside it, as in the run's folder
        self.model, _ = rebuild_model(load_model_table(job_file, host), load_model_adapters(job_file, host), folder)
        load_model(self.model, context.artifacts[WEIGHTS], strict=True)
        self.model.eval()
        predictor = context.artifacts.get(PREDICTOR)
        self.predictor = Predictor.load(Path(predictor)) if predictor else None

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> Any:
        """Raw inputs (a DataFrame with the signature's columns) in, a DataFrame of what ``runjob
        predict`` writes out (without its ``input`` column); a model whose dataset gave no
        :class:`runjob.Inputs` takes the model's input tensors (an array) and returns its outputs."""
        import torch

        if self.predictor is None or self.predictor.inputs is None:
            values = np.asarray(model_input)
            tensor = torch.from_numpy(values.astype(np.float32) if values.dtype.kind == "f" else values)
            with torch.no_grad():
                return self.model(tensor).numpy()
        inputs = self.predictor.inputs
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        absent = [name for name in inputs.columns if name not in frame.columns]
        if absent:
            raise _invalid(f"the input lacks the column(s) {absent}; this model takes {list(inputs.columns)}")
        items = []
        for index, record in enumerate(frame[list(inputs.columns)].to_dict("records")):
            try:
                items.append((str(index), inputs.encode(record)))
            except ValueError as error:
                raise _invalid(f"row {index}: {error}") from None
        settings = {k: v for k, v in (params or {}).items() if k in GENERATION_SETTINGS}
        rows = self.predictor.rows(self.model, items, source="the model input", **settings)
        return pd.DataFrame([{k: v for k, v in row.items() if k != "input"} for row in rows])


GENERATION_SETTINGS = ("max_new_tokens", "temperature", "seed")


def _invalid(message: str) -> Exception:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


def signature_of(prediction: dict[str, Any] | None) -> Any:
    """The MLflow signature of a model that predicts through a Predictor: the dataset's input
    columns, the task's output columns (when known), and a language model's generation settings
    as parameters with ``runjob predict``'s defaults."""
    if not prediction:
        return None
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    from runjob.record.prediction import GENERATION_DEFAULTS

    inputs = Schema([ColSpec(kind, name) for name, kind in prediction["inputs"].items()])
    outputs = prediction.get("outputs")
    params = None
    if prediction.get("generates"):
        kinds = {"max_new_tokens": "long", "temperature": "double", "seed": "long"}
        params = ParamSchema([ParamSpec(name, kinds[name], GENERATION_DEFAULTS[name]) for name in kinds])
    return ModelSignature(
        inputs=inputs,
        outputs=Schema([ColSpec(kind, name) for name, kind in outputs.items()]) if outputs else None,
        params=params,
    )


def save_trained_model(
    folder: Path,
    output_dir: Path,
    requirements: list[str],
    prediction: dict[str, Any] | None = None,
    wheels: list[Path] = (),
) -> Path:
    """Write the MLflow model of ``output_dir``'s final weights and job into ``folder``: with the
    run's predictor and signature when ``prediction`` describes them (``runjob.train.predictor``),
    and ``wheels`` (of distributions no index has) in ``folder/wheels``, named in the requirements."""
    import logging

    from runjob.record.prediction import PREDICTOR_FILE
    from runjob.record.store import environment

    paths = RunFolder(output_dir)
    artifacts = {WEIGHTS: str(paths.weights), JOB: str(paths.job_file)}
    if prediction and (output_dir / PREDICTOR_FILE).is_file():
        artifacts[PREDICTOR] = str(output_dir / PREDICTOR_FILE)
    if paths.data_facts.is_file():
        artifacts[DATA_FACTS] = str(paths.data_facts)
    if paths.data_dir.is_dir():  # the tokenizer, label map...: what the data was prepared with
        artifacts.update({DATA_ARTIFACT + file.name: str(file) for file in sorted(paths.data_dir.iterdir())})
    requirements = [f"{WHEELS_FOLDER}/{wheel.name}" for wheel in wheels] + requirements
    logger = logging.getLogger("mlflow.pyfunc")  # its advice against pickled objects: this one is a
    level = logger.level  # class of runjob's, pickled by reference, with no state of its own
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():  # the signature says what the model takes: no example is needed
            warnings.filterwarnings("ignore", message=".*An input example was not provided", category=UserWarning)
            # no bar while it copies its files in; none of the checkout's uv files (uv.lock, pyproject.toml):
            # the requirements say what the model needs, and MLflow's uv environment would sync the checkout's lock
            with environment({"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "MLFLOW_LOG_UV_FILES": "false"}):
                mlflow.pyfunc.save_model(
                    str(folder),
                    python_model=TrainedModel(),
                    artifacts=artifacts,
                    pip_requirements=requirements,
                    signature=signature_of(prediction),
                )
    finally:
        logger.setLevel(level)
    if wheels:
        (folder / WHEELS_FOLDER).mkdir()
        for wheel in wheels:
            shutil.copy2(wheel, folder / WHEELS_FOLDER / wheel.name)
    _link_weights(RunFolder(output_dir).weights, folder / "artifacts" / WEIGHTS_FILE)  # MLflow's artifacts/ folder
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
