"""The run's predictor, saved at the end of training for ``runjob predict`` and the MLflow model:
the dataset's :class:`runjob.Inputs` (the preprocessing fitted on the training data) and the
task's state as data, with the class names, a language model's context and the columns the MLflow
model's signature declares, in ``OUTPUT_DIR/predictor/`` (``runjob.record.prediction``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from runjob.host.components import Inputs
from runjob.host.output import screen
from runjob.host.task import generates
from runjob.record.prediction import Predictor, column_types, prediction_rows, samples_of
from runjob.record.prediction import save_predictor as write_predictor
from runjob.train.trained import sample_batch

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from runjob.host.components import DatasetSplits
    from runjob.host.plugin_host import PluginHost
    from runjob.host.task import Task
    from runjob.job.validation import ResolvedJob
    from runjob.record.prediction import ColumnType

SHARDED = ("FSDP", "DEEPSPEED")


def save_predictor(
    job: ResolvedJob,
    accelerator: Accelerator,
    model: torch.nn.Module,
    splits: DatasetSplits,
    task: Task,
    output_dir: Path,
    host: PluginHost,
    facts: Any,
) -> tuple[dict[str, Any] | None, str | None]:
    """Save the run's predictor into ``output_dir`` as data; returns what the MLflow model's
    signature needs (input and output columns, whether it generates), or ``None`` and the line that
    says why the MLflow model cannot predict from raw inputs. Call it on the main process only."""
    plain = "the MLflow model takes the model's input tensors as they are (not raw inputs as `runjob predict` does): "
    inputs = splits.inputs
    if inputs is None:
        return None, plain + (
            f"dataset {job.dataset.name!r} gives no runjob.Inputs (DatasetSplits.inputs), so its preprocessing "
            "cannot travel in the model"
        )

    context: int | None = None
    outputs: dict[str, ColumnType] | None = None
    generating = generates(task)
    if generating:
        # the length the model was trained on
        context = splits.context or int(task.inputs(sample_batch(splits.val, 1, splits.collate)).shape[-1])
        outputs = {"continuation": "string"} if inputs.decodes else None
    elif accelerator.distributed_type.name not in SHARDED:  # a sharded model's forward needs every process
        outputs = _output_columns(accelerator.unwrap_model(model, keep_torch_compile=False), task, splits)
    predictor = Predictor(task, inputs, splits.classes, context, outputs)
    try:
        write_predictor(predictor, output_dir, host, job.task, facts)
    except ValueError as error:
        return None, plain + (
            f"dataset {job.dataset.name!r}'s predictor is not saved: {error}; `runjob predict` reads inputs by "
            "building the dataset again"
        )
    if splits.collate is not None and type(inputs).collate is Inputs.collate:
        screen.say(
            f"runjob: dataset {job.dataset.name!r} batches with DatasetSplits.collate, but its inputs "
            f"({type(inputs).__qualname__}) define no collate: prediction from this run stacks encoded inputs "
            "(a run keeps data, not the dataset's functions)"
        )
    return {"inputs": dict(inputs.columns), "outputs": outputs, "generates": generating}, None


def _output_columns(model: torch.nn.Module, task: Task, splits: DatasetSplits) -> dict[str, ColumnType] | None:
    """The columns a prediction row has, from two validation samples through the trained model."""
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
