"""The public types a plugin works with: component options, dataset splits, strategy plans.

Only pydantic is imported here (no torch), so plugins can declare their options at import time
and ``runjob validate`` can check a whole job without building anything.
"""

from __future__ import annotations

import importlib.util
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, TypeAlias

from pydantic import AfterValidator, BaseModel, ConfigDict, TypeAdapter, ValidationError

from runjob.errors import ComponentError, DataError, RunjobError, describe
from runjob.host.input_files import KINDS, InputKind, checked_files, reading, skipped_notes
from runjob.host.json_types import JSONObject
from runjob.host.plain_data import arguments_of, checked_arguments

if TYPE_CHECKING:  # for annotations only: nothing here imports torch
    import torch

    from runjob.host.task import Task
    from runjob.job.validation import ResolvedJob

# What a plugin defines stays Any: a dataset's samples and batches, and what its task and model make of
# them, are whatever the plugin's task understands. Named once here.

Sample: TypeAlias = Any
"""One item of a dataset split, or one encoded input (:meth:`Inputs.encode`): the plugin's."""

Batch: TypeAlias = Any
"""Samples collated (a tensor; dicts, tuples and lists of them; whatever the task understands), and
the model's inputs a task takes from one."""

ModelOutputs: TypeAlias = Any
"""What a model returns (a tensor, a dict, a Hugging Face ``ModelOutput``): the plugin's model's."""

Split: TypeAlias = Any
"""A dataset split: a ``torch.utils.data.Dataset`` of the plugin's samples, or an :class:`ImageTensors`."""

Record: TypeAlias = dict[str, Any]
"""A raw input (:class:`Inputs`): each column's plain value (a number, a string, bytes)."""

Collate: TypeAlias = Callable[[list[Sample]], Batch]
"""How a list of samples becomes a batch (``DatasetSplits.collate``)."""

Factory: TypeAlias = Callable[..., Any]
"""A registered component's factory: called with its options (and what its kind adds), it returns
what the kind makes (a model, a dataset's splits, a task, an adapter, an Inputs class)."""


class Options(BaseModel):
    """Base class for a component's options: every key of its job-file table except ``name``.

    Declare each option as a typed field with a default (or without one, to make it required) and
    ranges with ``pydantic.Field`` (``lr: float = Field(1e-3, gt=0)``). Unknown keys, wrong types
    and out-of-range values are reported against the job file before anything runs. Types are
    strict: ``"3"`` is not an int, ``1`` is a valid float.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class NoOptions(Options):
    """Options of a component that takes none."""


def _absolute(value: str) -> Path:
    # absolute, but symbolic links kept: they are often how users point at scratch storage
    return Path(os.path.abspath(os.path.expanduser(value)))


def _existing_dir(value: str) -> str:
    path = _absolute(value)
    if not path.is_dir():
        raise ValueError(f"folder not found: {path}" if not path.exists() else f"not a folder: {path}")
    return str(path)


def _existing_file(value: str) -> str:
    path = _absolute(value)
    if not path.is_file():
        raise ValueError(f"file not found: {path}" if not path.exists() else f"not a file: {path}")
    return str(path)


def _absolute_path(value: str) -> str:
    return str(_absolute(value))


ExistingDir = Annotated[str, AfterValidator(_existing_dir)]
"""A folder that must exist; relative paths are taken from the working directory, stored absolute."""

ExistingFile = Annotated[str, AfterValidator(_existing_file)]
"""A file that must exist; relative paths are taken from the working directory, stored absolute."""

AbsolutePath = Annotated[str, AfterValidator(_absolute_path)]
"""A path that may not exist yet (e.g. a download target), stored absolute."""


def require_module(module: str, extra: str, what: str) -> None:
    """Raise a ValueError (reported against the job file) when an optional dependency is missing."""
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"{what} needs the '{module}' package: pip install 'runjob-train[{extra}]'")


@dataclass(frozen=True)
class Component:
    """One registered component: what a job file's ``name = ...`` resolves to."""

    kind: str
    name: str
    factory: Factory
    options: type[Options]
    plugin: str
    description: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    """What the component stated at registration (see :class:`runjob.host.kinds.Kind`)."""


@dataclass(frozen=True)
class ReportedFactory:
    """A component's factory as a resolved job holds it (``chosen.component.factory``): it calls
    the plugin's factory and reports an exception from it as the job's mistake, a
    :class:`~runjob.errors.ComponentError` of one line naming ``where`` (``job.toml:7``, where the
    job names the component), ``table`` (``[model]``) and the error; a
    :class:`~runjob.errors.RunjobError` the factory raised keeps its type and message, with the
    same place put in front. ``KeyboardInterrupt`` and other ``BaseException`` pass untouched."""

    factory: Factory
    table: str
    name: str
    where: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.factory(*args, **kwargs)
        except RunjobError as error:
            prefix = f"{self.where}: [{self.table}] {self.name}: "
            if not str(error).startswith(prefix):
                error.args = (prefix + str(error),)
            raise
        except Exception as error:
            raise ComponentError(f"{self.where}: [{self.table}] {self.name}: {describe(error)}") from error


def reported(component: Component, table: str, where: str) -> Component:
    """``component`` with its factory wrapped in a :class:`ReportedFactory` (once)."""
    factory = component.factory
    if isinstance(factory, ReportedFactory):
        factory = factory.factory
    return replace(component, factory=ReportedFactory(factory, table, component.name, where))


@dataclass
class DatasetSplits:
    """What a dataset factory returns: training and validation datasets, each a
    ``torch.utils.data.Dataset`` (items are whatever the job's task understands: ``(input, label)``
    pairs, dicts, token windows) or an :class:`ImageTensors` (the in-memory fast path), and
    optionally a test split, evaluated once with the final weights as ``test/...`` metrics."""

    train: Split
    val: Split
    num_classes: int | None = None
    """How many classes the targets index (classification, segmentation), or how many token ids
    there are (language modelling); ``None`` when targets are values (regression)."""
    classes: list[str] | None = None
    source: str | None = None
    """Where the data came from (a folder, a URL); recorded as the run's dataset lineage."""
    digest: str | None = None
    """A short fingerprint of the data's content; runjob derives one from the options when unset."""
    test: Split = None
    """A held-out split evaluated once at the end of training (``test/...`` metrics), or None."""
    baselines: dict[str, float] = field(default_factory=dict)
    """Reference values the data itself gives (e.g. ``{"unigram_perplexity": 24.1}``), recorded as
    the run's tags ``runjob.baseline.<name>`` so runs can be read against them."""
    read_inputs: Callable[[Path], Split] | None = None
    """For ``runjob predict``: read unlabeled inputs from a file or folder the user gives (image
    files, a CSV of the feature columns, a text prompt) as a ``torch.utils.data.Dataset`` of
    ``(name, input)`` items: a name for the output row (a file name, a line number) and the model's
    input as one sample of this dataset holds it (the same transform and normalization as the
    validation split). Raise :class:`runjob.DataError` naming the path when nothing can be read.
    ``None``: the dataset cannot read inputs for prediction."""
    decode: Callable[[Sequence[int]], str] | None = None
    """For a language-model dataset: token ids back to text (``runjob predict --prompt``)."""
    inputs: Inputs | None = None
    """How a user's raw inputs become model inputs (an :class:`Inputs`): set it instead of
    ``read_inputs`` and ``decode``, and the run's MLflow model predicts from raw inputs (a CSV's
    columns, image files' bytes, prompt text) exactly as ``runjob predict`` does, with a signature.
    Without it, the MLflow model takes the model's input tensors as they are, and the end of the
    run says so."""
    collate: Collate | None = None
    """How a list of items becomes a batch, for every split (the DataLoaders' ``collate_fn``):
    padding a batch only to its longest sequence, for example. Mask the padding
    (``attention_mask`` 0, labels -100) so it is neither trained on nor counted as tokens. ``None``:
    runjob's stacking of tensors (and of dicts, tuples and lists of them)."""
    artifacts: dict[str, str | Path] = field(default_factory=dict)
    """Files the data was prepared with (a tokenizer's ``tokenizer.json``, a label map), by the
    name they get: copied into the run's folder (``OUTPUT_DIR/data/NAME``), logged with the MLflow
    run under ``data/`` and bundled into its MLflow model."""
    channels: int | None = None
    """Input channels of image samples; read from the first training sample when not given."""
    image_size: int | None = None
    """The side of square image samples; read from the first training sample when not given."""
    vocab_size: int | None = None
    """How many token ids the inputs use (a tokenizer's vocabulary)."""
    context: int | None = None
    """Tokens per sequence (the longest a batch holds)."""
    pad_id: int | None = None
    """The token id that pads sequences."""

    def __post_init__(self) -> None:
        if self.inputs is None:
            return
        if not isinstance(self.inputs, Inputs):
            raise TypeError(f"DatasetSplits.inputs must be a runjob.Inputs, got a {type(self.inputs).__name__}")
        if self.read_inputs is None:
            self.read_inputs = self.inputs.dataset
        if self.decode is None and self.inputs.decodes:
            self.decode = self.inputs.decode


@dataclass(frozen=True)
class DataFacts:
    """What a model factory that takes a second parameter (``factory(options, data)``) learns of
    the job's data, so a job writes it once: the dataset's :class:`DatasetSplits` fields of the
    same names. Saved with the run (``OUTPUT_DIR/data_facts.json``): the model is rebuilt from them
    without the data (``evaluate``, ``predict``, ``export``, the MLflow model)."""

    num_classes: int | None = None
    """Classes the targets index, or the number of token ids for language modelling."""
    classes: list[str] | None = None
    input_shape: tuple[int, ...] | None = None
    """The shape of one input sample, read from the first training sample when it is an
    ``(input, target)`` pair of tensors (``(64,)`` for 64 features, ``(3, 32, 32)`` for images)
    and the dataset has no collate function (whose samples may differ in shape)."""
    channels: int | None = None
    image_size: int | None = None
    vocab_size: int | None = None
    context: int | None = None
    pad_id: int | None = None

    @classmethod
    def of(cls, splits: DatasetSplits, read_sample: bool = True) -> DataFacts:
        """The facts of ``splits``; with ``read_sample``, the input shape (and image channels and
        size, when the dataset does not say them) read from its first training sample (an
        ``(input, target)`` pair or an :class:`ImageTensors`)."""
        channels, size = splits.channels, splits.image_size
        # collated samples vary in shape; a model that takes no facts needs no sample read
        shape = _input_shape(splits.train) if read_sample and splits.collate is None else None
        if shape is not None and len(shape) == 3:
            channels = shape[0] if channels is None else channels
            size = shape[1] if size is None and shape[1] == shape[2] else size
        return cls(
            num_classes=splits.num_classes,
            classes=list(splits.classes) if splits.classes is not None else None,
            input_shape=shape,
            channels=channels,
            image_size=size,
            vocab_size=splits.vocab_size,
            context=splits.context,
            pad_id=splits.pad_id,
        )

    def to_dict(self) -> dict[str, object]:
        return {key: value for key, value in self.__dict__.items() if value is not None}

    @classmethod
    def checked(cls, values: JSONObject) -> DataFacts:
        """The facts in ``values`` (a saved ``data_facts.json``), every field's type checked:
        ``ValueError`` naming the first that is wrong. Keys it does not know are left out."""
        known = {key: value for key, value in values.items() if key in cls.__dataclass_fields__}
        try:
            return TypeAdapter(cls).validate_python(known, strict=False)
        except ValidationError as error:
            problem = error.errors()[0]
            key = ".".join(str(part) for part in problem["loc"])
            raise ValueError(f"{key} = {problem.get('input')!r}: {problem['msg']}") from None

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DataFacts:
        known = {key: value for key, value in values.items() if key in cls.__dataclass_fields__}
        if known.get("input_shape") is not None:
            known["input_shape"] = tuple(known["input_shape"])
        return cls(**known)


def _input_shape(split: Split) -> tuple[int, ...] | None:
    """The shape of a split's first input sample, or ``None`` when its items are not
    ``(tensor, target)`` pairs (or an :class:`ImageTensors`)."""
    try:
        if isinstance(split, ImageTensors):
            shape = tuple(split.images.shape[1:])
        else:
            if len(split) == 0:
                return None
            item = split[0]
            sample = item[0] if isinstance(item, (tuple, list)) else None
            shape = tuple(getattr(sample, "shape", ()))
    except Exception:  # noqa: BLE001 - a dataset that cannot be read here has no such facts
        return None
    return tuple(int(side) for side in shape) if shape else None


class Adapter(ABC):
    """What an adapter's factory returns (``[model.adapters.NAME]``, registered through
    ``runjob_register_adapters``): a change to a built model such as LoRA, made after
    ``init_from`` and before ``freeze``."""

    @abstractmethod
    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """The adapted model (a ``torch.nn.Module``); it may freeze what it does not train."""

    def merge(self, model: torch.nn.Module) -> torch.nn.Module:
        """The plain model with the adapter folded in, for ``runjob export``; by default the
        adapted model as it is."""
        return model

    def save(self, model: torch.nn.Module, folder: Path) -> None:  # noqa: B027 - optional: not every adapter has files
        """Write the adapter's own files into ``folder`` at the end of a run (optional)."""

    def trainable(self, model: torch.nn.Module) -> str:
        """One line on what trains: ``trainable 1,024 of 120,000 parameters (0.85%)``."""
        total = sum(p.numel() for p in model.parameters())
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return f"trainable {trained:,} of {total:,} parameters ({100 * trained / max(total, 1):.2f}%)"


@dataclass(frozen=True)
class ExportRequest:
    """What an export format registered through ``runjob_register_exporters`` receives."""

    model: torch.nn.Module
    """The trained model in eval mode on the CPU, adapters merged."""
    output: Path
    """Where to write (a file or a folder; it does not exist yet)."""
    job: ResolvedJob
    """The run's resolved job (``runjob.Job``)."""
    inputs: Inputs | None = None
    """The run's :class:`Inputs` (what the dataset fitted, e.g. a tokenizer), when it has one."""
    artifacts: dict[str, Path] = field(default_factory=dict)
    """The dataset's files the run kept (``DatasetSplits.artifacts``), by name."""
    task: Task | None = None
    """The run's task."""


COLUMN_TYPES = ("double", "long", "string", "binary")


class Inputs(ABC):
    """How a dataset turns a user's raw inputs into model inputs, for ``runjob predict`` and for the
    run's MLflow model (``mlflow.pyfunc.load_model(...).predict(frame)``, ``mlflow models serve``).

    A raw input is a *record*: a dict of plain values with the keys and types of :attr:`columns`
    (the feature columns of a CSV row as numbers, an image file's bytes, a prompt's text). The MLflow
    model's input schema is :attr:`columns`; a DataFrame sent to it is taken row by row as records.

    The run keeps it as data, never as a pickle: at the end of a run :meth:`to_data` gives its state
    as JSON values (and may write files, such as a tokenizer's ``tokenizer.json``), and ``runjob
    predict``, ``export`` and the run's MLflow model rebuild it with :meth:`from_data`, finding the
    class by the name its plugin registered it under (``runjob_register_inputs``): a run names a
    class, it cannot make runjob import code. By default the state is the arguments of ``__init__``,
    read back from the attributes of the same names, so a class that keeps plain values (numbers,
    strings, lists of them) needs nothing more; one that holds other objects (a tokenizer) overrides
    both. State fitted on the training data (a standardization's means, a vocabulary) belongs here:
    prediction then needs nothing else of the dataset. ``runjob.testing.round_trip_inputs`` checks
    a class against this contract; a run whose inputs do not survive it saves no predictor and says
    why in one line.

    :attr:`reads` says what kind of file :meth:`read` takes; runjob checks every file against it
    (:meth:`files`), so a text input is never fed an image's bytes.
    """

    columns: dict[str, str] = {}
    """Each record key and its type: ``"double"``, ``"long"``, ``"string"`` or ``"binary"`` (bytes)."""

    reads: ClassVar[InputKind | None] = None
    """The kind of file :meth:`read` takes, checked by runjob before ``read`` sees a file:
    ``"text"`` (UTF-8 text: a NUL byte, or bytes that are not UTF-8, in a file's first 8 KiB make
    it binary, whatever its suffix), ``"csv"`` (the same, for CSV text) or ``"image"`` (a file
    Pillow recognizes as an image). ``runjob predict --input FILE`` with a file of another kind
    stops with one line naming it and what the dataset reads (exit 2); in a folder, such files are
    skipped, each said in one line, and the others predicted (exit 2 when none is left).
    ``None`` (the default, for Inputs written before it existed): nothing is checked."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.reads is not None and cls.reads not in KINDS:  # said when the plugin loads, not at predict
            raise TypeError(
                f"{cls.__qualname__}.reads = {cls.reads!r}: must be one of {', '.join(map(repr, KINDS))} or None"
            )

    @abstractmethod
    def read(self, path: Path) -> Sequence[tuple[str, Record]]:
        """The records in a file or folder the user names (``runjob predict --input PATH``), each
        with a name for its output row (a file name, ``line N``). Take the files from
        :meth:`files` (``for file in self.files(path)``), which leaves out those not of the kind
        :attr:`reads` names. Raise :class:`runjob.DataError` naming the path when nothing can be read."""

    @abstractmethod
    def encode(self, record: Record) -> Sample:
        """One record as one sample of what the task's ``inputs`` gives (a tensor, or a dict of
        tensors, without the batch dimension), with
        the same transform and normalization as the validation split. Raise ``ValueError`` saying
        what is wrong with a record (a missing column, an unreadable image)."""

    def decode(self, ids: Sequence[int]) -> str:
        """For language models: token ids back to text. Others leave this as it is."""
        raise ValueError(f"{type(self).__name__} does not decode token ids")

    @property
    def decodes(self) -> bool:
        """Whether this class overrides :meth:`decode`."""
        return type(self).decode is not Inputs.decode

    def to_data(self, folder: Path) -> JSONObject:
        """This object's state as plain data (JSON values: numbers, strings, booleans, ``None``,
        lists and string-keyed dicts of them), for the run's predictor. Files too big or too
        structured for JSON (a tokenizer's ``tokenizer.json``) go into ``folder``, named in the
        returned dict by their name there; :meth:`from_data` gets the same folder back.

        The default: the arguments ``__init__`` takes, each read back from the attribute of the
        same name (``TypeError`` when one is missing or not plain data)."""
        return arguments_of(self)

    @classmethod
    def from_data(cls, data: JSONObject, folder: Path) -> Inputs:
        """The object :meth:`to_data` described: ``data`` as JSON gives it back (lists for tuples)
        and the folder holding its files. Raise ``ValueError`` or ``KeyError`` for data it cannot
        rebuild from (runjob reports it in one line naming the run's file).

        The default: ``cls(**data)``, each value checked first against the annotation of its
        ``__init__`` argument (``ValueError`` naming the first that does not fit)."""
        return cls(**checked_arguments(cls, data))

    def collate(self, samples: list[Sample]) -> Batch | None:
        """A batch of what :meth:`encode` gives, for ``runjob predict`` and the MLflow model, or
        ``None`` (the default) to have runjob stack them (tensors, and dicts, tuples and lists of
        them). Override it when encoded inputs differ in length (padding a batch to its longest
        input): a run keeps data, not ``DatasetSplits.collate``, so prediction from a finished run
        batches with this."""
        return None

    def files(self, path: Path) -> list[Path]:
        """The files :meth:`read` takes from ``path``: the file itself, or every file in the folder
        and its subfolders, in path order, less those not of the kind :attr:`reads` names. A
        refused file named alone, or a folder with no file of that kind, is a one-line
        :class:`runjob.DataError`; a folder's other refused files are left out (``runjob predict``
        says each and how many)."""
        return checked_files(Path(path), self.reads, type(self).__name__)

    def dataset(self, path: Path, dataset_name: str | None = None) -> EncodedInputs:
        """``DatasetSplits.read_inputs`` made of :meth:`read` and :meth:`encode`: ``(name, input)``
        items, each encoded when it is taken; its ``notes`` say which files of a folder were left
        out. ``dataset_name`` names the run's dataset in messages."""
        path = Path(path)
        reader = f"this run's dataset {dataset_name!r}" if dataset_name else type(self).__name__
        with reading(reader) as state:
            if self.reads is not None and path.is_file():
                self.files(path)  # checked here too, for a ``read`` that does not take its files from files()
            records = list(self.read(path))
        return EncodedInputs(self, records, str(path), skipped_notes(state, str(path), self.reads))


class EncodedInputs:
    """The records :meth:`Inputs.read` found, encoded one by one as a DataLoader takes them; a
    record :meth:`Inputs.encode` refuses is a DataError naming the input and the record.
    ``notes``: one line for each file of a folder that was left out, and one saying how many."""

    def __init__(
        self, inputs: Inputs, records: list[tuple[str, Record]], where: str, notes: Sequence[str] = ()
    ) -> None:
        self.inputs, self.records, self.where, self.notes = inputs, records, where, list(notes)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[str, Sample]:
        name, record = self.records[index]
        try:
            return name, self.inputs.encode(record)
        except ValueError as error:
            raise DataError(f"--input {self.where}: {name}: {error}") from None
        except Exception as error:  # noqa: BLE001 - a plugin's bug, or a run's damaged predictor: one line
            raise ComponentError(
                f"--input {self.where}: {name}: {type(self.inputs).__qualname__}.encode failed ({describe(error)}): "
                "the plugin has a bug, or the run's predictor/ was changed since the run"
            ) from None


@dataclass
class ImageTensors:
    """A dataset split held whole in memory, as one image tensor and one label tensor.

    Return it as ``DatasetSplits.train`` / ``.val`` instead of a ``Dataset`` when the data fits in
    memory (50,000 32x32 RGB images are 150 MB as uint8). The host then keeps it on the training device (the GPU
    when there is one) and builds every batch there as whole tensors: it gathers the batch's
    images, applies the random crop and flip to all of them at once, and normalizes. No per-image
    Python, no DataLoader workers, no host-to-device copy per step. Shuffling, sharding across
    processes and resuming work as for any dataset.

    ``images``: ``(N, C, H, W)``, uint8 (0-255) or floating point (0-1). ``labels``: ``(N,)``
    integer class indices. ``mean`` / ``std``: per-channel normalization applied after scaling to
    0-1. ``crop_padding``: a random crop of the original size after zero-padding every side by this
    many pixels (0: none).
    ``flip``: a random horizontal flip with probability 0.5. The random draws are seeded by the
    job's seed and the batch, so runs repeat and a resumed run sees the same batches.
    """

    images: torch.Tensor
    labels: torch.Tensor
    mean: Sequence[float]
    std: Sequence[float]
    crop_padding: int = 0
    flip: bool = False

    def __post_init__(self) -> None:
        if self.images.ndim != 4:
            raise ValueError(f"ImageTensors.images must be (N, C, H, W), got shape {tuple(self.images.shape)}")
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(
                f"ImageTensors.labels must be ({self.images.shape[0]},), got shape {tuple(self.labels.shape)}"
            )
        channels = self.images.shape[1]
        if len(self.mean) != channels or len(self.std) != channels:
            raise ValueError(f"ImageTensors.mean and std need {channels} values (one per channel)")
        if self.crop_padding < 0:
            raise ValueError("ImageTensors.crop_padding must be >= 0")

    def __len__(self) -> int:
        return int(self.images.shape[0])


@dataclass
class StrategyPlan:
    """What a strategy factory returns: the Accelerate objects to build the Accelerator with.

    ``accelerator_kwargs`` go straight to ``accelerate.Accelerator`` (``kwargs_handlers``,
    ``fsdp_plugin``, ``deepspeed_plugin``). ``expected_distributed_types`` lists the names of
    ``accelerate.DistributedType`` values the strategy accepts; the host stops with an error when
    Accelerate set up something else (``requirement`` says what is needed, for that message).
    ``max_processes`` limits how many processes the strategy supports (``None``: any); state it at
    registration instead (``register(..., max_processes=N)``), where ``runjob validate`` sees it too.
    """

    accelerator_kwargs: dict[str, object] = field(default_factory=dict)
    expected_distributed_types: tuple[str, ...] = ()
    max_processes: int | None = None
    requirement: str = ""
