"""The final model as an MLflow model, written by the recording process (``runjob.record.mirror``).

``tracking.log_model = "weights"`` (the default): the saved weights and the job, loaded with
``mlflow.pyfunc.load_model`` (runjob.record.trained_model), written without torch. ``"pickle"``
and ``"pt2"``: the model is built afresh from the job and given the saved final weights, so it is
a plain ``nn.Module`` on the CPU whatever wrapped it during training (DDP, FSDP, DeepSpeed,
compile), loaded with ``mlflow.pytorch.load_model("runs:/ID/JOB_NAME")`` (the logged model is
named after the job).
"""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runjob.errors import TrainingError, first_line
from runjob.host.model_build import rebuild_model
from runjob.host.plugin_host import LOCAL_DISTRIBUTION  # a -p plugin: no distribution to require
from runjob.host.run_folder import MLFLOW_MODEL_DIR
from runjob.record.wheels import WheelError, wheel_for

if TYPE_CHECKING:
    import torch

    from runjob.host.plugin_host import PluginHost
    from runjob.job.validation import ResolvedJob

MODEL_FOLDER = MLFLOW_MODEL_DIR


def save_mlflow_model(
    job: ResolvedJob,
    output_dir: Path,
    example: Any,
    host: PluginHost | None = None,
    prediction: dict[str, Any] | None = None,
    notes: list[str] | None = None,
) -> Path:
    """Write the MLflow model of the run's final weights to ``OUTPUT_DIR/mlflow_model``; ``example`` is a batch
    of two inputs as the model sees them (a CPU tensor), for the input example of a ``pt2`` model. ``host``: the
    plugins, to name the model's distribution for a ``weights`` model (built without torch). ``prediction``: the
    training process's description of the run's predictor (``runjob.train.predictor``) for a ``weights`` model.
    What the user should know about the model (a requirement that could not travel) is appended to ``notes``."""
    if job.tracking.log_model == "weights":
        # lazy: trained_model imports mlflow, numpy, pandas; the training process imports this module and never imports
        # mlflow (record.mirror)
        from runjob.record.trained_model import requirements_of, save_trained_model

        folder = output_dir / MODEL_FOLDER
        shutil.rmtree(folder, ignore_errors=True)
        # the plugins that rebuild it: the model's, and the dataset's and task's (its predictor's inputs and task)
        used = {job.model.component.plugin, job.dataset.component.plugin, job.task.component.plugin}
        plugins = [
            p.distribution
            for p in (host.plugins if host else [])
            if p.name in used and p.distribution and p.distribution != LOCAL_DISTRIBUTION
        ]
        names = ["torch", "runjob-train", "safetensors", *plugins]
        # what the model's and adapters' components wrap (transformers, peft), by their `libraries` fact
        for component in [job.model.component, *(chosen.component for chosen in getattr(job, "adapters", {}).values())]:
            names += [name for name in component.facts.get("libraries", ()) if _installed(name)]
        wheels, pinned = [], []
        for name in dict.fromkeys(names):
            try:
                wheel = wheel_for(name)
            except WheelError as error:
                wheel = None
                if notes is not None:
                    notes.append(
                        f"the MLflow model requires {name} by version, which no package index may have ({error}); "
                        "`mlflow models serve` needs it installed"
                    )
            if wheel:
                wheels.append(wheel)
            else:
                pinned.append(name)
        return save_trained_model(folder, output_dir, requirements_of(pinned), prediction, wheels)
    # lazy: the training process imports this module and never imports mlflow (record.mirror); the recording process
    # imports this module: torch only where a model is logged; the recording process imports this module: accelerate
    # only where a model is logged
    import mlflow.pytorch
    import torch
    from accelerate.utils import load_checkpoint_in_model

    model, _ = rebuild_model(job.model, getattr(job, "adapters", {}), output_dir)
    load_checkpoint_in_model(model, str(output_dir))
    model.eval()
    folder = output_dir / MODEL_FOLDER
    shutil.rmtree(folder, ignore_errors=True)
    requirements = model_requirements(model)
    if job.tracking.log_model == "pickle":
        # MLflow warns on every pickle save; runjob's docs say what pickle means (README, tracking.log_model)
        logger = logging.getLogger("mlflow.pytorch")
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            mlflow.pytorch.save_model(model, str(folder), serialization_format="pickle", pip_requirements=requirements)
        finally:
            logger.setLevel(level)
        return folder
    if not isinstance(example, torch.Tensor):
        raise TrainingError(
            f"tracking.log_model = 'pt2' needs a model that takes one tensor; model {job.model.name!r} takes "
            f"{type(example).__name__} inputs. The weights are saved in model.safetensors. Use tracking.log_model = "
            "'pickle' (or 'none')"
        )
    try:
        mlflow.pytorch.save_model(model, str(folder), input_example=example.numpy(), pip_requirements=requirements)
    except Exception as error:  # noqa: BLE001 - torch.export refuses some models: say so, don't fall back
        raise TrainingError(
            f"tracking.log_model = 'pt2': torch.export could not export model {job.model.name!r} "
            f"({first_line(error)[:300] or type(error).__name__}); "
            "the weights are saved in model.safetensors. Use tracking.log_model = 'pickle' (or 'none')"
        ) from None
    return folder


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def model_requirements(model: torch.nn.Module) -> list[str]:
    """The pip requirements of ``model``: torch, and the distribution whose package defines the
    model's class (the package that provides the model, whichever plugin registered it), each
    pinned to the installed version without a local build tag (``2.6.0``, not ``2.6.0+cu124``)."""
    packages = {"torch", type(model).__module__.partition(".")[0]}
    distributions = importlib.metadata.packages_distributions()
    names = sorted({dist for package in packages for dist in distributions.get(package, [])})
    return [f"{name}=={importlib.metadata.version(name).split('+')[0]}" for name in names]
