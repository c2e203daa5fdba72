"""The run's predictor, saved at the end of training for its MLflow model: the task, the dataset's
:class:`runjob.Inputs` (the preprocessing fitted on the training data), the class names and a
language model's context, pickled into ``OUTPUT_DIR/prediction.pkl`` (``runjob.record.prediction``),
with the columns the MLflow model's signature declares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runjob.errors import describe
from runjob.host.task import generates
from runjob.record.prediction import Predictor, column_types

SHARDED = ("FSDP", "DEEPSPEED")


def save_predictor(
    job: Any, accelerator: Any, model: Any, splits: Any, task: Any, output_dir: Path
) -> tuple[dict[str, Any] | None, str | None]:
    """Pickle the run's predictor into ``output_dir``; returns what the MLflow model's signature
    needs (input and output columns, whether it generates), or ``None`` and the line that says
    why the MLflow model cannot predict from raw inputs. Call it on the main process only."""
    plain = "the MLflow model takes the model's input tensors as they are (not raw inputs as `runjob predict` does): "
    inputs = splits.inputs
    if inputs is None:
        return None, plain + (
            f"dataset {job.dataset.name!r} gives no runjob.Inputs (DatasetSplits.inputs), so its preprocessing "
            "cannot travel in the model"
        )
    from runjob.train.trained import sample_batch

    context, outputs = None, None
    generating = generates(task)
    if generating:
        # the length the model was trained on
        context = splits.context or int(task.inputs(sample_batch(splits.val, 1, splits.collate)).shape[-1])
        outputs = {"continuation": "string"} if inputs.decodes else None
    elif accelerator.distributed_type.name not in SHARDED:  # a sharded model's forward needs every process
        outputs = _output_columns(accelerator.unwrap_model(model, keep_torch_compile=False), task, splits)
    predictor = Predictor(task, inputs, splits.classes, context, outputs, splits.collate)
    try:
        predictor.save(output_dir)
    except Exception as error:  # noqa: BLE001 - pickle raises many kinds for an object it cannot store
        return None, plain + f"the task or the dataset's inputs cannot be pickled ({describe(error)})"
    return {"inputs": dict(inputs.columns), "outputs": outputs, "generates": generating}, None


def _output_columns(model: Any, task: Any, splits: Any) -> dict[str, str] | None:
    """The columns a prediction row has, from two validation samples through the trained model."""
    from runjob.record.prediction import prediction_rows, samples_of
    from runjob.train.trained import sample_batch

    samples = samples_of(task.inputs(sample_batch(splits.val, 2, splits.collate)))  # each as Inputs.encode gives one
    training = model.training
    model.eval()
    try:
        items = [(str(i), x) for i, x in enumerate(samples)]
        rows = prediction_rows(model, task, splits.classes, items, 2, "", collate_inputs=splits.collate)
    except Exception:  # noqa: BLE001 - only the signature's outputs depend on it: the model still predicts
        return None
    finally:
        model.train(training)
    return column_types(rows) or None
