"""The run's MLflow model in runjob's default format (``tracking.log_model = "weights"``): an
MLflow ``python_function`` model that holds data only (the final ``model.safetensors``, the run's
``job.toml``, its ``data_facts.json``, its predictor as data, ``predictor/``, and the dataset's
files, ``data/``) and names runjob's installed loader, ``loader_module:
runjob.record.trained_model``. Loading it imports no code from the model and unpickles nothing: the
loader rebuilds the model and the predictor through the installed plugins (as ``runjob predict``
does: ``runjob.record.prediction``) and predicts from raw inputs exactly as ``runjob predict``
does, with a signature.

Writing it needs neither torch nor the model's code, so runjob's recording process writes it at
the end of a run without importing torch or the model's libraries; the weights are stored as
safetensors. Distributions that no package index has (runjob from a checkout, a plugin installed
from a folder) travel inside it as wheels (``runjob.record.wheels``), so ``mlflow models serve``
can build its environment. Load it with

    model = mlflow.pyfunc.load_model("runs:/RUN_ID/NAME")
    rows = model.predict(frame)                         # raw inputs in, runjob predict's columns out
    module = model.get_raw_model()                      # the torch.nn.Module, in eval mode

This module imports MLflow; the training process never imports it.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow.pyfunc
import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

from runjob.host.model_build import rebuild_model
from runjob.host.plugin_host import load_plugins
from runjob.host.run_folder import DATA_DIR, DATA_FACTS_FILE, JOB_FILE, PREDICTOR_DIR, WEIGHTS_FILE, RunFolder
from runjob.job.validation import load_model_adapters, load_model_table, load_table
from runjob.record.prediction import GENERATION_DEFAULTS, load_predictor
from runjob.record.store import LOGGED_MODEL_WEIGHTS, environment

if TYPE_CHECKING:
    import torch

RUN_DATA = Path(LOGGED_MODEL_WEIGHTS).name
"""The folder of the model's data (under MLflow's ``data/``), laid out as a run's output folder."""
WHEELS_FOLDER = "wheels"


def _load_pyfunc(data_path: str) -> TrainedModel:
    """MLflow's entry point for a model whose ``loader_module`` is this module."""
    return TrainedModel(Path(data_path))


class TrainedModel:
    """A runjob model rebuilt from its job's ``[model]`` table and weights, predicting through the
    run's :class:`runjob.record.prediction.Predictor` when the run saved one (its dataset gave
    :class:`runjob.Inputs`). ``folder`` is laid out as the run's output folder."""

    def __init__(self, folder: Path) -> None:
        from safetensors.torch import load_model  # lazy: a run's end writes this model without importing safetensors

        host = load_plugins()
        job_file = folder / JOB_FILE
        facts = folder if (folder / DATA_FACTS_FILE).is_file() else None
        self.model, _ = rebuild_model(load_model_table(job_file, host), load_model_adapters(job_file, host), facts)
        load_model(self.model, str(folder / WEIGHTS_FILE), strict=True)
        self.model.eval()
        self.predictor = load_predictor(folder, host, load_table(job_file, host, "task"))

    def get_raw_model(self) -> torch.nn.Module:
        """The ``torch.nn.Module``, in eval mode (``mlflow.pyfunc.load_model(...).get_raw_model()``)."""
        model: torch.nn.Module = self.model
        return model

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> Any:
        """Raw inputs (a DataFrame with the signature's columns) in, a DataFrame of what ``runjob
        predict`` writes out (without its ``input`` column); a model whose dataset gave no
        :class:`runjob.Inputs` takes the model's input tensors (an array) and returns its outputs."""
        import torch  # lazy: a run's end writes this model without importing torch

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
    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


def signature_of(prediction: dict[str, Any] | None) -> ModelSignature | None:
    """The MLflow signature of a model that predicts through a Predictor: the dataset's input
    columns, the task's output columns (when known), and a language model's generation settings
    as parameters with ``runjob predict``'s defaults."""
    if not prediction:
        return None

    inputs = Schema([ColSpec(kind, name) for name, kind in prediction["inputs"].items()])
    outputs = prediction.get("outputs")
    params = None
    if prediction.get("generates"):
        kinds = {"max_new_tokens": "long", "temperature": "double", "seed": "long"}
        params = ParamSchema([ParamSpec(name, kinds[name], GENERATION_DEFAULTS[name]) for name in kinds])
    return ModelSignature(
        inputs=inputs,
        outputs=Schema([ColSpec(kind, name) for name, kind in outputs.items()]) if outputs else None,
        params=params,  # type: ignore[arg-type]  # None (no parameters) is ModelSignature's own default
    )


def save_trained_model(
    folder: Path,
    output_dir: Path,
    requirements: list[str],
    prediction: dict[str, Any] | None = None,
    wheels: Sequence[Path] = (),
) -> Path:
    """Write the MLflow model of ``output_dir``'s final weights and job into ``folder``: with the
    run's predictor and signature when ``prediction`` describes them (``runjob.train.predictor``),
    and ``wheels`` (of distributions no index has) in ``folder/wheels``, named in the requirements."""
    paths = RunFolder(output_dir)
    requirements = [f"{WHEELS_FOLDER}/{wheel.name}" for wheel in wheels] + requirements
    logger = logging.getLogger("mlflow.pyfunc")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with tempfile.TemporaryDirectory(prefix="runjob-model-") as scratch:
            data = Path(scratch) / RUN_DATA
            _gather(paths, data, with_predictor=bool(prediction))
            with warnings.catch_warnings():  # the signature says what the model takes: no example is needed
                warnings.filterwarnings("ignore", message=".*An input example was not provided", category=UserWarning)
                # no bar while it copies its files in; none of the checkout's uv files (uv.lock, pyproject.toml):
                # the requirements say what the model needs, and MLflow's uv environment would sync the checkout's lock
                with environment({"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "MLFLOW_LOG_UV_FILES": "false"}):
                    mlflow.pyfunc.save_model(
                        str(folder),
                        loader_module=__name__,
                        data_path=str(data),
                        pip_requirements=requirements,
                        signature=signature_of(prediction),
                    )
    finally:
        logger.setLevel(level)
    if wheels:
        (folder / WHEELS_FOLDER).mkdir()
        for wheel in wheels:
            shutil.copy2(wheel, folder / WHEELS_FOLDER / wheel.name)
    _link_weights(paths.weights, folder / LOGGED_MODEL_WEIGHTS / WEIGHTS_FILE)  # MLflow's data/ folder
    return folder


def _gather(paths: RunFolder, data: Path, with_predictor: bool) -> None:
    """The files the model loads from, laid out as the run's folder: the weights (a hard link where
    it can be), the job, the data's facts and files, and the predictor when it is saved."""
    data.mkdir()
    try:
        os.link(paths.weights, data / WEIGHTS_FILE)
    except OSError:  # another file system
        shutil.copy2(paths.weights, data / WEIGHTS_FILE)
    shutil.copy2(paths.job_file, data / JOB_FILE)
    if paths.data_facts.is_file():
        shutil.copy2(paths.data_facts, data / DATA_FACTS_FILE)
    if paths.data_dir.is_dir():  # the tokenizer, label map...: what the data was prepared with
        shutil.copytree(paths.data_dir, data / DATA_DIR)
    if with_predictor and paths.predictor_dir.is_dir():
        shutil.copytree(paths.predictor_dir, data / PREDICTOR_DIR)


def _link_weights(weights: Path, copy: Path) -> None:
    """The model folder's copy of the weights, made a hard link to them: stored once on disk."""
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
