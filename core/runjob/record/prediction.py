"""What a trained model predicts, as rows of plain values: the one path that ``runjob predict`` and
the run's MLflow model (``runjob.record.trained_model``) both take, so they cannot disagree.

A :class:`Predictor` holds everything besides the model that turns a user's raw inputs into rows:
the task (its ``call_model`` and ``predict``, or a language model's ``generate``), the dataset's
:class:`runjob.Inputs` (the fitted preprocessing), the class names and a language model's context.

A run keeps it as data, never as a pickle (``OUTPUT_DIR/predictor/``): ``predictor.json`` names
the inputs' class by the name its plugin registered (``runjob_register_inputs``) with the state
:meth:`runjob.Inputs.to_data` gave (its files in ``predictor/inputs/``), the task's state
(:meth:`runjob.Task.to_data`), the class names, the context and the output columns. Reading it
back (:func:`load_predictor`) resolves those names through the installed plugins, as a job file's
are, and rebuilds the task with its factory from the job's ``[task]`` table and the run's
``data_facts.json``: a run folder or a logged model cannot make runjob run code. A pickled
``prediction.pkl`` (what runjob's development versions before this layout wrote) is never read:
it is refused in one line that offers ``--from-data``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runjob.errors import DataError, RunjobError, describe, first_line
from runjob.host.components import Batch, Collate, Component, DataFacts, Inputs, Sample
from runjob.host.json_types import JSONObject, JSONValue
from runjob.host.model_build import read_facts
from runjob.host.plain_data import as_json, check_plain, round_trip
from runjob.host.plugin_host import ComponentLookupError
from runjob.host.run_folder import PREDICTOR_FILE, PREDICTOR_INPUTS_DIR, RunFolder
from runjob.host.task import Task, generates

if TYPE_CHECKING:
    import torch

    from runjob.host.plugin_host import PluginHost
    from runjob.job.validation import Chosen

GENERATION_DEFAULTS = {"max_new_tokens": 100, "temperature": 0.0, "seed": 0}
"""A language model's continuation settings when none are given (``runjob predict``'s defaults)."""

FORMAT: Literal[1] = 1
"""The version of ``predictor.json``'s layout."""


ColumnType = Literal["boolean", "long", "double", "string"]
"""The type of a prediction row's column, as an MLflow signature names it."""


class _SavedInputs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1)
    """The name the plugin registered the class under (``runjob_register_inputs``)."""
    plugin: str = Field(min_length=1)
    """The plugin that registered it (its entry-point name)."""
    data: JSONObject
    """What :meth:`runjob.Inputs.to_data` gave."""


class _SavedPredictor(BaseModel):
    """``predictor.json``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    format: Literal[1]
    inputs: _SavedInputs
    task: JSONObject = {}
    """What :meth:`runjob.Task.to_data` gave."""
    classes: list[str] | None = None
    context: int | None = Field(None, ge=1)
    outputs: dict[str, ColumnType] | None = None


@dataclass
class Predictor:
    """The task, the dataset's inputs (``None``: the model's input tensors are taken as they are),
    the class names, and the number of tokens a generating model was trained on."""

    task: Task
    inputs: Any  # an Inputs, an older dataset's decoder (``decodes``, ``decode``), or None
    classes: list[str] | None
    context: int | None
    output_columns: dict[str, ColumnType] | None = None
    """The columns and types of a prediction row (without ``input``), for the MLflow signature."""
    collate: Collate | None = None
    """How encoded inputs are batched: the dataset's ``DatasetSplits.collate`` when the dataset was
    built for this prediction, else (``None``) the inputs' :meth:`runjob.Inputs.collate`."""

    def rows(
        self,
        model: torch.nn.Module,
        items: Any,
        batch_size: int = 64,
        source: str = "the inputs",
        what: str = "the model",
        **generation: Any,  # the continuation settings (GENERATION_DEFAULTS' keys), as the caller gives them
    ) -> list[JSONObject]:
        """One row per ``(name, input)`` item: a language model's continuation, or the task's
        prediction columns; ``what`` names the model in an error."""
        if generates(self.task):
            settings = {**GENERATION_DEFAULTS, **{k: v for k, v in generation.items() if v is not None}}
            decode = self.inputs.decode if self.inputs is not None and self.inputs.decodes else None
            return continuation_rows(model, self.task, decode, items, self.context or 0, **settings)
        # the dataset's collate, else the inputs' (a plain decoder has none: stacking)
        batches = getattr(self, "collate", None) or (
            _InputsBatches(self.inputs) if isinstance(self.inputs, Inputs) else None
        )
        return prediction_rows(model, self.task, self.classes, items, batch_size, source, what, batches)


class PredictorError(RunjobError):
    """A run's saved predictor that cannot be read back: one line naming the file, what is wrong and
    what would be right (exit code 2)."""


def registered_inputs(host: PluginHost, inputs: Inputs) -> Component | None:
    """The component a plugin registered ``inputs``'s class as (``runjob_register_inputs``), or ``None``."""
    for owners in host.registrations.get("inputs", {}).values():
        for component in owners:
            if component.factory is type(inputs):
                return component
    return None


def save_predictor(
    predictor: Predictor, output_dir: Path, host: PluginHost, task_table: Chosen, facts: DataFacts | None
) -> Path:
    """Write ``predictor`` into ``output_dir/predictor/`` as data, written whole or not at all.
    Raises ``ValueError`` saying, in one line, why it cannot be kept as data: its inputs' class is
    not registered, or does not survive :func:`runjob.host.plain_data.round_trip`; the task's state
    is not plain data, or the task cannot be rebuilt from its options and ``facts``."""
    inputs, task = predictor.inputs, predictor.task
    component = registered_inputs(host, inputs)
    cls = type(inputs)
    if component is None:
        raise ValueError(
            f"its runjob.Inputs class {cls.__module__}.{cls.__qualname__} is registered by no plugin "
            "(runjob_register_inputs), so it cannot be rebuilt from data"
        )
    folder = RunFolder(output_dir).predictor_dir
    partial = folder.with_name(f".{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        try:
            round_trip(inputs, partial / PREDICTOR_INPUTS_DIR)
            inputs_data = as_json(inputs.to_data(partial / PREDICTOR_INPUTS_DIR))
        except (TypeError, ValueError) as error:
            raise ValueError(f"its inputs ({cls.__qualname__}) cannot be kept as data: {first_line(error)}") from None
        task_data = task.to_data()
        try:
            check_plain(task_data, f"{type(task).__qualname__}.to_data()")
            task_data = as_json(task_data)
            rebuild_task(task_table, facts, task_data)
        except Exception as error:  # noqa: BLE001 - a plugin's factory or restore may raise anything
            raise ValueError(
                f"its task ({type(task).__qualname__}) cannot be rebuilt from data: {describe(error)}"
            ) from None
        saved = _SavedPredictor(
            format=FORMAT,
            inputs=_SavedInputs(name=component.name, plugin=component.plugin, data=inputs_data),
            task=task_data,
            classes=list(predictor.classes) if predictor.classes is not None else None,
            context=predictor.context,
            outputs=predictor.output_columns,
        )
        (partial / PREDICTOR_FILE).write_text(
            json.dumps(saved.model_dump(), indent=2, allow_nan=False) + "\n", encoding="utf-8"
        )
        if not any((partial / PREDICTOR_INPUTS_DIR).iterdir()):  # inputs that keep no files
            (partial / PREDICTOR_INPUTS_DIR).rmdir()
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder / PREDICTOR_FILE


def rebuild_task(task_table: Chosen, facts: DataFacts | None, data: JSONObject) -> Task:
    """The job's task built by its factory from its ``[task]`` options and the run's facts, with
    what :meth:`runjob.Task.to_data` kept handed back (:meth:`runjob.Task.restore`)."""
    task = task_table.component.factory(task_table.options, facts if facts is not None else DataFacts())
    if not isinstance(task, Task):
        raise TypeError(
            f"task {task_table.name!r}'s factory returned a {type(task).__name__}, not a runjob.Task, from the "
            "run's data facts"
        )
    task.restore(data)
    return task


def saved_any(folder: Path) -> bool:
    """Whether run folder ``folder`` holds a predictor: as data, or an older runjob's pickle."""
    paths = RunFolder(folder)
    return (paths.predictor_dir / PREDICTOR_FILE).is_file() or paths.pickled_predictor_file.is_file()


def load_predictor(folder: Path, host: PluginHost, task_table: Chosen) -> Predictor | None:
    """The predictor run folder ``folder`` saved (``predictor/``), rebuilt by the installed plugins:
    the inputs' class found by its registered name, the task by ``task_table`` (the job's
    ``[task]``) and the run's ``data_facts.json``. ``None`` when the run saved none. A damaged or
    tampered one is a :class:`PredictorError` in one line. A run with only a pickled
    ``prediction.pkl`` is refused with one line: runjob never unpickles what a run holds."""
    paths = RunFolder(folder)
    path = paths.predictor_dir / PREDICTOR_FILE
    if not path.is_file():
        if paths.pickled_predictor_file.is_file():
            raise _pickled(paths.pickled_predictor_file)
        return None
    saved = _read_saved(path)
    facts = _facts(folder)
    inputs = _rebuild_inputs(host, saved.inputs, path)
    try:
        task = rebuild_task(task_table, facts, saved.task)
    except Exception as error:  # noqa: BLE001 - the plugin's factory given the run's facts: one line, exit 2
        raise PredictorError(
            f"{path}: task: task {task_table.name!r} cannot be rebuilt from the run's data: {describe(error)}"
        ) from None
    return Predictor(task, inputs, saved.classes, saved.context, saved.outputs)


def _read_saved(path: Path) -> _SavedPredictor:
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PredictorError(f"{path}: not a runjob predictor ({describe(error)})") from None
    try:
        return _SavedPredictor.model_validate(values)
    except ValidationError as error:
        problem = error.errors()[0]
        key = ".".join(str(part) for part in problem["loc"]) or "(the file)"
        value = problem.get("input")
        shown = "" if problem["type"] == "missing" else f" = {json.dumps(value)[:80]}"
        raise PredictorError(f"{path}: {key}{shown}: {problem['msg']}; the file is damaged or not runjob's") from None


def _facts(folder: Path) -> DataFacts | None:
    try:
        return read_facts(folder)
    except (ValueError, TypeError) as error:
        raise PredictorError(f"{RunFolder(folder).data_facts}: {first_line(error)}") from None


def _rebuild_inputs(host: PluginHost, saved: _SavedInputs, path: Path) -> Inputs:
    loaded = any(info.name == saved.plugin for info in host.plugins)
    try:
        component = host.lookup("inputs", f"{saved.plugin}:{saved.name}" if loaded else saved.name)
    except ComponentLookupError as error:
        raise PredictorError(
            f"{path}: inputs.name = {json.dumps(saved.name)} (plugin {saved.plugin}): {first_line(error)}; install "
            "the plugin that made the run"
        ) from None
    cls = component.factory
    if not (isinstance(cls, type) and issubclass(cls, Inputs)):  # runjob_register_inputs takes Inputs classes
        raise PredictorError(f"{path}: inputs.name = {json.dumps(saved.name)} (plugin {saved.plugin}) is not an Inputs")
    try:
        inputs = cls.from_data(saved.data, path.parent / PREDICTOR_INPUTS_DIR)
    except Exception as error:  # noqa: BLE001 - a plugin's from_data given data it refuses: one line, exit 2
        raise PredictorError(
            f"{path}: inputs.data: {cls.__qualname__} (plugin {component.plugin}) cannot be rebuilt from it: "
            f"{describe(error)}"
        ) from None
    if not isinstance(inputs, cls):
        raise PredictorError(
            f"{path}: {cls.__qualname__}.from_data (plugin {component.plugin}) returned a {type(inputs).__name__}"
        )
    return inputs


def _pickled(path: Path) -> PredictorError:
    """A run whose predictor is a pickle (``prediction.pkl``): never unpickled, whoever made it."""
    return PredictorError(
        f"{path}: this run's predictor is a pickle, and unpickling a file runs whatever code it holds, so runjob "
        "never reads it; read inputs as the run's dataset does with --from-data (the dataset's files must be here), "
        "or train the job again with this runjob, which keeps the predictor as data (predictor/)"
    )


def collate(batch: list[Sample], padder: str = "a DatasetSplits.collate") -> Batch:
    """torch's default collation (tensors stacked; dicts, tuples and lists of them alike), with a
    one-line :class:`runjob.DataError` when inputs differ in shape (``padder``: what would pad them)."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    from torch.utils.data import default_collate

    try:
        return default_collate(batch)
    except RuntimeError as error:
        if "stack expects each tensor to be equal size" not in str(error):
            raise
        raise DataError(
            f"inputs in one batch have different shapes ({error}); the dataset must give inputs of one size "
            f"(for image folders: set dataset.image_size), or {padder} that pads them"
        ) from None


class _InputsBatches:
    """Encoded inputs batched by their :meth:`runjob.Inputs.collate`, or stacked where it gives ``None``."""

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs

    def __call__(self, samples: list[Sample]) -> Batch:
        batch = self.inputs.collate(samples)
        return collate(samples, f"{type(self.inputs).__qualname__} a collate method") if batch is None else batch


def prediction_rows(
    model: torch.nn.Module,
    task: Task,
    classes: list[str] | None,
    items: Any,  # (name, input) items: a plugin's dataset
    batch_size: int,
    source: str,
    what: str = "the model",
    collate_inputs: Collate | None = None,
) -> list[JSONObject]:
    """One row per item: its name (``input``) and the task's prediction columns, batch by batch.
    An item's input is one sample of the model's inputs (a tensor, a dict of tensors): batches of
    them (``collate_inputs``, the dataset's collate, or stacking) go to the model through the task
    (``Task.call_model``), as in training."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch
    from torch.utils.data import DataLoader

    device = next(model.parameters()).device
    rows: list[JSONObject] = []
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

    def __init__(self, collate_inputs: Collate) -> None:
        self.collate_inputs = collate_inputs

    def __call__(self, items: list[tuple[str, Sample]]) -> tuple[list[str], Batch]:
        return [name for name, _ in items], self.collate_inputs([value for _, value in items])


def to_device(inputs: Batch, device: torch.device) -> Batch:
    """Every tensor of ``inputs`` (a tensor, or dicts, tuples and lists of them) on ``device``."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch
    from torch.utils import _pytree as pytree  # torch's own nested-container walk, as torch.export uses

    return pytree.tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, inputs)


def shapes(inputs: object) -> str:
    """The shapes in ``inputs``, for messages: ``(8, 3)`` or ``{'x': (8, 2), 'z': (8, 1)}``."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    from torch.utils import _pytree as pytree

    return str(pytree.tree_map(lambda x: tuple(x.shape) if hasattr(x, "shape") else type(x).__name__, inputs))


def samples_of(inputs: Batch) -> list[Sample]:
    """A batch of model inputs (a tensor, a dict of tensors...) as one input per sample, each shaped
    as :meth:`runjob.Inputs.encode` gives it: collating them gives the batch back."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    from torch.utils import _pytree as pytree

    leaves, spec = pytree.tree_flatten(inputs)
    count = int(leaves[0].shape[0]) if leaves else 0
    return [pytree.tree_unflatten([leaf[i] for leaf in leaves], spec) for i in range(count)]


def columns_of(predicted: dict[str, torch.Tensor], classes: list[str] | None) -> dict[str, list[JSONValue]]:
    """Per-sample tensors as lists of plain values: a ``(batch, k)`` tensor as k columns
    ``name_0 ...``; ``class`` indices (one a sample, or one a position: ``class_0 ...``) as the
    dataset's class names when it has them."""
    columns: dict[str, list[JSONValue]] = {}
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
    model: torch.nn.Module,
    task: Any,  # a runjob.Generating task, or (deprecated) one that only defines generate
    decode: Callable[[list[int]], str] | None,
    items: Any,  # (name, prompt tokens) items: a plugin's dataset
    context: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> list[JSONObject]:
    """One row per prompt: its name and the model's continuation (text when the dataset can decode
    its tokens, else the token ids). One generator for all prompts, seeded once, as ``runjob
    predict --seed`` draws."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch

    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(int(seed))
    rows: list[JSONObject] = []
    for index in range(len(items)):
        name, tokens = items[index]
        new = task.generate(model, tokens[None].to(device), int(max_new_tokens), context, float(temperature), generator)
        ids = new[0].tolist()
        rows.append({"input": name, "continuation": decode(ids) if decode else ids})
    return rows


def column_types(rows: list[JSONObject]) -> dict[str, ColumnType]:
    """The MLflow type of each column of prediction rows (``input`` left out): ``long``, ``double``,
    ``string``, or ``string`` for a list of token ids written as JSON by the caller."""
    types: dict[str, ColumnType] = {}
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
