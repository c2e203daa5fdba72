"""What a trained model predicts, as rows of plain values: the one path that ``runjob predict`` and
the run's MLflow model (``runjob.record.trained_model``) both take, so they cannot disagree.

A :class:`Predictor` holds everything besides the model that turns a user's raw inputs into rows:
the task (its ``call_model`` and ``predict``, or a language model's ``generate``), the dataset's
:class:`runjob.Inputs` (the fitted preprocessing), the class names and a language model's context.
The training process pickles it into the output folder at the end of a run (``prediction.pkl``),
and the MLflow model carries it.
"""

from __future__ import annotations

import pickle
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runjob.errors import DataError, RunjobError, describe, first_line
from runjob.host.run_folder import PREDICTOR_FILE
from runjob.host.task import generates

GENERATION_DEFAULTS = {"max_new_tokens": 100, "temperature": 0.0, "seed": 0}
"""A language model's continuation settings when none are given (``runjob predict``'s defaults)."""


@dataclass
class Predictor:
    """The task, the dataset's inputs (``None``: the model's input tensors are taken as they are),
    the class names, and the number of tokens a generating model was trained on."""

    task: Any
    inputs: Any
    classes: list[str] | None
    context: int | None
    output_columns: dict[str, str] | None = None
    """The columns and types of a prediction row (without ``input``), for the MLflow signature."""
    collate: Any = None
    """The dataset's ``DatasetSplits.collate`` (padding a batch of inputs), or ``None``: stacking."""

    def save(self, folder: Path) -> Path:
        """Pickle this predictor into ``folder`` (written whole or not at all)."""
        path = folder / PREDICTOR_FILE
        partial = path.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL))
        partial.replace(path)
        return path

    @staticmethod
    def load(path: Path) -> Predictor:
        return pickle.loads(Path(path).read_bytes())

    def rows(
        self,
        model: Any,
        items: Any,
        batch_size: int = 64,
        source: str = "the inputs",
        what: str = "the model",
        **generation: Any,
    ) -> list[dict[str, Any]]:
        """One row per ``(name, input)`` item: a language model's continuation, or the task's
        prediction columns; ``what`` names the model in an error."""
        if generates(self.task):
            settings = {**GENERATION_DEFAULTS, **{k: v for k, v in generation.items() if v is not None}}
            decode = self.inputs.decode if self.inputs is not None and self.inputs.decodes else None
            return continuation_rows(model, self.task, decode, items, self.context or 0, **settings)
        collate_inputs = getattr(self, "collate", None)  # a predictor pickled before it had one: stacking
        return prediction_rows(model, self.task, self.classes, items, batch_size, source, what, collate_inputs)


def saved_predictor(folder: Path) -> Predictor | None:
    """The predictor the run saved (``prediction.pkl``: its task and the dataset's fitted
    :class:`runjob.Inputs`, such as a tokenizer), so prediction needs neither the data nor its
    preparation; ``None`` when the run saved none (its dataset gives no ``runjob.Inputs``)."""
    path = folder / PREDICTOR_FILE
    if not path.is_file():
        return None
    try:
        predictor = Predictor.load(path)
    except Exception as error:  # noqa: BLE001 - a plugin class renamed since the run: the data can still serve
        why = describe(error)
        print(f"runjob: {path} cannot be read ({why}); reading the inputs as the dataset does", file=sys.stderr)
        return None
    return predictor if predictor.inputs is not None else None


def collate(batch: list[Any]) -> Any:
    """torch's default collation, with a clear message when inputs differ in shape."""
    from torch.utils.data import default_collate

    try:
        return default_collate(batch)
    except RuntimeError as error:
        if "stack expects each tensor to be equal size" not in str(error):
            raise
        raise DataError(
            f"inputs in one batch have different shapes ({error}); the dataset must give inputs of one size "
            "(for image folders: set dataset.image_size)"
        ) from None


def prediction_rows(
    model: Any,
    task: Any,
    classes: list[str] | None,
    items: Any,
    batch_size: int,
    source: str,
    what: str = "the model",
    collate_inputs: Any = None,
) -> list[dict[str, Any]]:
    """One row per item: its name (``input``) and the task's prediction columns, batch by batch.
    An item's input is one sample of the model's inputs (a tensor, a dict of tensors): batches of
    them (``collate_inputs``, the dataset's collate, or stacking) go to the model through the task
    (``Task.call_model``), as in training."""
    import torch
    from torch.utils.data import DataLoader

    device = next(model.parameters()).device
    rows: list[dict[str, Any]] = []
    batches = _NamedBatches(collate_inputs) if collate_inputs is not None else collate
    with torch.no_grad():
        for names, batch in DataLoader(items, batch_size=batch_size, collate_fn=batches):
            try:
                outputs = task.call_model(model, to_device(batch, device))
            except (RuntimeError, TypeError) as error:  # torch's shape errors; a model called with the wrong arguments
                raise RunjobError(
                    f"{what} cannot take the inputs read from {source} (a batch of shape {shapes(batch)}): "
                    f"{first_line(error)}"
                ) from None
            columns = columns_of(task.predict(outputs), classes)
            rows.extend(
                {"input": name, **{key: values[i] for key, values in columns.items()}} for i, name in enumerate(names)
            )
    return rows


class _NamedBatches:
    """``(name, input)`` items as a list of names and the inputs collated by the dataset's collate."""

    def __init__(self, collate_inputs: Any) -> None:
        self.collate_inputs = collate_inputs

    def __call__(self, items: list[tuple[str, Any]]) -> tuple[list[str], Any]:
        return [name for name, _ in items], self.collate_inputs([value for _, value in items])


def to_device(inputs: Any, device: Any) -> Any:
    """Every tensor of ``inputs`` (a tensor, or dicts, tuples and lists of them) on ``device``."""
    import torch
    from torch.utils import _pytree as pytree  # torch's own nested-container walk, as torch.export uses

    return pytree.tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, inputs)


def shapes(inputs: Any) -> str:
    """The shapes in ``inputs``, for messages: ``(8, 3)`` or ``{'x': (8, 2), 'z': (8, 1)}``."""
    from torch.utils import _pytree as pytree

    return str(pytree.tree_map(lambda x: tuple(x.shape) if hasattr(x, "shape") else type(x).__name__, inputs))


def samples_of(inputs: Any) -> list[Any]:
    """A batch of model inputs (a tensor, a dict of tensors...) as one input per sample, each shaped
    as :meth:`runjob.Inputs.encode` gives it: collating them gives the batch back."""
    from torch.utils import _pytree as pytree

    leaves, spec = pytree.tree_flatten(inputs)
    count = int(leaves[0].shape[0]) if leaves else 0
    return [pytree.tree_unflatten([leaf[i] for leaf in leaves], spec) for i in range(count)]


def columns_of(predicted: dict[str, Any], classes: list[str] | None) -> dict[str, list[Any]]:
    """Per-sample tensors as lists of plain values: a ``(batch, k)`` tensor as k columns
    ``name_0 ...``; ``class`` indices (one a sample, or one a position: ``class_0 ...``) as the
    dataset's class names when it has them."""
    columns: dict[str, list[Any]] = {}
    for name, tensor in predicted.items():
        values = tensor.detach().float().cpu() if tensor.is_floating_point() else tensor.detach().cpu()
        named = classes is not None and name == "class" and not values.is_floating_point()
        if values.ndim == 1:
            columns[name] = [classes[int(i)] for i in values.tolist()] if named and classes else values.tolist()
        else:
            flat = values.reshape(values.shape[0], -1)
            for k in range(flat.shape[1]):  # a class per position (token classification): class_0, class_1, ...
                column = flat[:, k].tolist()
                columns[f"{name}_{k}"] = [classes[int(i)] for i in column] if named and classes else column
    return columns


def continuation_rows(
    model: Any, task: Any, decode: Any, items: Any, context: int, max_new_tokens: int, temperature: float, seed: int
) -> list[dict[str, Any]]:
    """One row per prompt: its name and the model's continuation (text when the dataset can decode
    its tokens, else the token ids). One generator for all prompts, seeded once, as ``runjob
    predict --seed`` draws."""
    import torch

    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(int(seed))
    rows = []
    for index in range(len(items)):
        name, tokens = items[index]
        new = task.generate(model, tokens[None].to(device), int(max_new_tokens), context, float(temperature), generator)
        ids = new[0].tolist()
        rows.append({"input": name, "continuation": decode(ids) if decode else ids})
    return rows


def column_types(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The MLflow type of each column of prediction rows (``input`` left out): ``long``, ``double``,
    ``string``, or ``string`` for a list of token ids written as JSON by the caller."""
    types: dict[str, str] = {}
    for row in rows[:1]:
        for name, value in row.items():
            if name == "input":
                continue
            types[name] = (
                "boolean"
                if isinstance(value, bool)
                else "long"
                if isinstance(value, int)
                else "double"
                if isinstance(value, float)
                else "string"
            )
    return types
