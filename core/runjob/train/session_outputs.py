"""The run's outputs, once training is over (at TRAIN_END): the final weights, each adapter's files,
the MLflow model (or the predictor) and the models callbacks named, saved and recorded."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from runjob.host.output import screen
from runjob.host.plugin_host import PluginHost
from runjob.host.run_context import NamedModel, named_models, save_weights, write_named_models
from runjob.host.run_folder import ADAPTERS_DIR, PREDICTOR_DIR, WEIGHTS_FILE, RunFolder
from runjob.job.validation import ResolvedJob
from runjob.record.recorder import Recorder
from runjob.train.checkpoints import same_bytes, tidy_finished
from runjob.train.data_loading import example_batch
from runjob.train.predictor import save_predictor
from runjob.train.session_build import Built
from runjob.train.session_prepare import Prepared

if TYPE_CHECKING:
    from accelerate import Accelerator


def save_outputs(recorder: Recorder, job: ResolvedJob, host: PluginHost, prepared: Prepared, built: Built) -> None:
    """The final weights saved (every process), the finished run's checkpoints tidied, the outputs
    recorded and the MLflow model built and waited for (the main process)."""
    accelerator, output_dir = prepared.accelerator, prepared.output_dir
    accelerator.wait_for_everyone()
    save_weights(accelerator, built.model, output_dir)
    if not accelerator.is_main_process:
        return
    _save_adapters(recorder, accelerator, built, output_dir)
    tidied = tidy_finished(output_dir, job.train.keep_checkpoints_finished)
    if tidied:
        screen.say(f"runjob: {tidied}")
    _record_outputs(recorder, job, output_dir, built, accelerator, host)
    _record_named_models(recorder, output_dir)
    recorder.model_logged()


def _record_outputs(
    recorder: Recorder, job: ResolvedJob, output_dir: Path, built: Built, accelerator: Accelerator, host: PluginHost
) -> None:
    """Log the final weights, and have the recording process build the final model as an MLflow
    model (``best/`` is ``best_weights``'s; :meth:`Recorder.model_logged` waits for the model). A
    ``weights`` model predicts through the run's predictor (the task and the dataset's fitted
    preprocessing, ``runjob.train.predictor``), or the end of the run says why it cannot."""
    if job.tracking.log_model == "weights":
        prediction, why_not = save_predictor(
            job, accelerator, built.model, built.splits, built.task, output_dir, host, built.facts
        )
        if why_not:
            screen.say(f"runjob: {why_not}")
        else:  # runjob predict runs:/ID reads it where the run's folder is not
            recorder.log_artifact(RunFolder(output_dir).predictor_dir, PREDICTOR_DIR)
        recorder.log_model(prediction=prediction)  # it holds model.safetensors: stored once in MLflow
        return
    recorder.log_artifact(RunFolder(output_dir).weights)
    if job.tracking.log_model != "none":
        recorder.log_model(built.task.inputs(example_batch(built.splits.val, built.splits.collate)))


def _save_adapters(recorder: Recorder, accelerator: Accelerator, built: Built, output_dir: Path) -> None:
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
