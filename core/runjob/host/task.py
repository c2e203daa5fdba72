"""The task contract: what a batch means to the training loop.

A task component decides how a batch becomes a loss, what evaluation accumulates and reports, and
how much a batch holds for throughput. The host keeps everything else: moving batches to the
device, backward, gradient accumulation, clipping, the non-finite guard, the optimizer and
scheduler steps, gathering evaluation values across processes, checkpoints and the record.

Nothing here imports torch: a task's options are read by ``runjob validate``, and a task's methods
import torch themselves where they need it.
"""

from __future__ import annotations

import inspect
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from runjob.host.components import Batch, ModelOutputs, Options
from runjob.host.json_types import JSONObject

if TYPE_CHECKING:  # for annotations only: loading plugins never imports torch
    import torch

Direction = Literal["max", "min"]
EVALUATION_PREFIXES = ("val", "test")  # metrics of the validation split, and of the test split when a dataset has one


class TaskOptions(Options):
    """Base class for a task's options (``[task]`` keys besides ``name``).

    Override :meth:`metrics` to declare what the task's evaluation reports, so ``runjob validate``
    checks ``train.best_metric`` and the ``[sweep]`` metric against it before anything runs.
    """

    def metrics(self) -> dict[str, Direction]:
        """The metrics :meth:`Task.summarize` returns, without the split prefix (``"accuracy"``, not
        ``"val/accuracy"``), each with the direction that is better: ``"max"`` or ``"min"``. The
        first is the default ``train.best_metric`` and ``[sweep]`` metric."""
        return {"loss": "min"}


class Task(ABC):
    """Base class of what a task factory returns: how the loop turns a batch into a loss and an
    evaluation into metrics. A batch is whatever the dataset's DataLoader yields (a tuple, a dict,
    a tensor), already on the training device.

    Three methods are required: :meth:`loss`, :meth:`evaluate` and :meth:`summarize`. The others
    have defaults for ``(inputs, targets)`` batches.

    The model is reached in two steps, in training and at inference alike: :meth:`inputs` picks the
    model's inputs out of a batch (a tensor, a dict of tensors, a tuple of them), and
    :meth:`call_model` calls the model with them. Training and evaluation call :meth:`forward`
    (both steps); ``runjob predict``, the run's MLflow model and ``runjob export`` have no targets:
    they collate what :meth:`runjob.Inputs.encode` gives (one sample of the model's inputs, as
    :meth:`inputs` gives them for a batch) and call :meth:`call_model` on it. A dict of inputs goes
    in as keyword arguments where the model's ``forward`` names them (a Hugging Face model's
    ``input_ids``, ``attention_mask``); a task with other needs overrides :meth:`inputs` and
    :meth:`call_model` (not :meth:`forward`), and every command then works with it.

    The outputs are whatever the model returns: a tensor, a dict, or an object with a ``logits``
    attribute (a Hugging Face ``ModelOutput``, which may also hold a ``loss``). The built-in tasks
    read their logits with :meth:`logits_of`, so they take all three. A model that continues its
    inputs (language modelling) also subclasses :class:`Generating`.
    """

    unit: str = "samples"
    """What :meth:`count` counts; throughput is logged as ``train/<unit>_per_s``."""

    def inputs(self, batch: Batch) -> Batch:
        """The model's inputs in a batch: the first item of a tuple or list batch, else the batch.
        Prediction and export give :meth:`call_model` a batch of these (without targets)."""
        return batch[0] if isinstance(batch, (tuple, list)) else batch

    def targets(self, batch: Batch) -> Batch:
        """What the outputs are compared with: the second item of a tuple or list batch."""
        if isinstance(batch, (tuple, list)) and len(batch) > 1:
            return batch[1]
        raise ValueError(
            f"{type(self).__name__} expects (inputs, targets) batches, got a {type(batch).__name__}; "
            "override Task.targets for other batches"
        )

    def call_model(self, model: torch.nn.Module, inputs: Batch) -> ModelOutputs:
        """The model's outputs for ``inputs`` (what :meth:`inputs` gives, in training, evaluation,
        prediction and export alike).

        A dict (any mapping) goes in as keyword arguments when the model's ``forward`` names at
        least one of its keys: ``model(**inputs)``, with only the keys ``forward`` names, or every
        key when it also takes ``**kwargs`` (so a batch's ``labels`` never reach a model that does
        not ask for them). A dict none of whose keys ``forward`` names goes in whole, positionally,
        as does anything else (a tensor, a tuple): ``model(inputs)``. The signature is read through
        the wrappers a run adds (Accelerate's mixed precision, DistributedDataParallel,
        ``torch.compile``). A required parameter of ``forward`` the dict lacks is a ``ValueError``
        naming it. Override it for a model called some other way."""
        if isinstance(inputs, Mapping):
            found = forward_signature(model)
            if found is not None:
                named, any_keyword = _keywords(found)
                if named & inputs.keys():
                    missing = [
                        name
                        for name, parameter in found.parameters.items()
                        if parameter.default is inspect.Parameter.empty
                        and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
                        and name not in inputs
                    ]
                    if missing:
                        raise ValueError(
                            f"the model's forward needs {', '.join(map(repr, missing))}, but the inputs hold only "
                            f"{', '.join(map(repr, inputs))}"
                        )
                    return model(**{key: value for key, value in inputs.items() if any_keyword or key in named})
        return model(inputs)

    def forward(self, model: torch.nn.Module, batch: Batch) -> ModelOutputs:
        """The model's outputs for a training or evaluation ``batch``:
        ``self.call_model(model, self.inputs(batch))``."""
        return self.call_model(model, self.inputs(batch))

    @abstractmethod
    def loss(self, outputs: ModelOutputs, batch: Batch) -> torch.Tensor:
        """The training loss of a batch: a 0-dim tensor the host calls ``backward`` on (via
        ``accelerator.backward``). Do not call ``.item()`` here: it would wait for the device."""

    def check(self, outputs: ModelOutputs, batch: Batch) -> None:  # noqa: B027 - optional, unlike the abstract three
        """Called once, on the first training batch: raise ``ValueError("...")`` when the model's
        outputs do not fit the task and the data (say the shapes and what to set); the host stops
        with that message, naming the model, the task and the dataset."""

    @abstractmethod
    def evaluate(self, outputs: ModelOutputs, batch: Batch) -> dict[str, torch.Tensor]:
        """Per-sample values of one evaluation batch: names mapped to tensors whose first dimension
        is the batch (``(batch,)`` or ``(batch, ...)``). The host gathers them across processes
        (each validation sample counted once), sums each over the samples on the device, and hands
        the totals to :meth:`summarize` once per evaluation."""

    @abstractmethod
    def summarize(self, totals: dict[str, Any], count: int) -> dict[str, float]:
        """The metrics of a whole evaluation from the totals of :meth:`evaluate`'s values (a float
        for a ``(batch,)`` value, a list of floats for ``(batch, k)``, and so on) and ``count``, the
        number of samples. Return every metric the options declare, without the split prefix."""

    def count(self, batch: Batch) -> int:
        """How many :attr:`unit` a batch holds: by default the first dimension of its first tensor.
        Use shapes only (no ``.item()``): it is called every step."""
        first = first_tensor(batch)
        if first is None:
            raise ValueError(f"{type(self).__name__} found no tensor in a {type(batch).__name__} batch to count")
        return int(first.shape[0])

    @staticmethod
    def logits_of(outputs: ModelOutputs) -> torch.Tensor:
        """The logits in a model's outputs (see :func:`logits_of`)."""
        return logits_of(outputs)

    @staticmethod
    def takes_keyword(model: torch.nn.Module, name: str) -> bool:
        """Whether the model's ``forward`` names a parameter ``name`` (see :func:`takes_keyword`)."""
        return takes_keyword(model, name)

    def predict(self, outputs: ModelOutputs) -> dict[str, torch.Tensor]:
        """What ``runjob predict`` writes for a batch of the model's outputs (of :meth:`call_model`):
        names mapped to per-sample tensors (first dimension the batch; a ``(batch, k)`` tensor becomes
        k columns ``name_0 ... name_<k-1>``). By default the outputs as they are, as ``output``; a
        classification task gives the class index and its probability instead. A tensor named
        ``class`` holds class indices, written as the dataset's class names when it has them."""
        return {"output": outputs}

    def to_data(self) -> JSONObject:
        """What prediction needs of this task beyond its ``[task]`` options and the run's
        :class:`runjob.DataFacts` (class weights fitted on the training labels, say), as plain data
        (JSON values). ``runjob predict``, ``export`` and the MLflow model rebuild a finished run's
        task with its factory, given the options and the facts (not the data, which may be gone),
        then hand this to :meth:`restore`. By default: nothing (``{}``)."""
        return {}

    def restore(self, data: JSONObject) -> None:
        """Take back what :meth:`to_data` gave, on a task its factory rebuilt from the options and
        the facts. Raise ``ValueError`` for data it cannot take. By default a task keeps nothing,
        and refuses data it is given."""
        if data:
            raise ValueError(
                f"{type(self).__qualname__} keeps no data but was given {sorted(data)}: "
                "define restore() beside to_data()"
            )

    @property
    def generates(self) -> bool:
        """Deprecated: use ``runjob.host.task.generates(task)`` (whether the task is :class:`Generating`)."""
        warnings.warn(
            "Task.generates is deprecated and will be removed in the next release: a task that continues its "
            "inputs subclasses runjob.Generating",
            DeprecationWarning,
            stacklevel=2,
        )
        return isinstance(self, Generating) or callable(getattr(self, "generate", None))  # one warning, not two


class Generating(ABC):
    """A task whose model continues its inputs (language modelling): ``runjob predict`` then
    continues prompts (``--prompt``, ``--max-new-tokens``, ``--temperature``) instead of writing
    :meth:`Task.predict`'s columns. Subclass it beside :class:`Task`:
    ``class MyLM(runjob.Task, runjob.Generating)``."""

    @abstractmethod
    def generate(
        self,
        model: torch.nn.Module,
        tokens: torch.Tensor,
        max_new_tokens: int,
        context: int,
        temperature: float,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        """The ``max_new_tokens`` token ids that follow ``tokens`` (a ``(1, T)`` prompt), a ``(1,
        max_new_tokens)`` tensor, greedily when ``temperature`` is 0, else sampled with ``generator``;
        the model sees at most the last ``context`` tokens (the length it was trained on)."""


def generates(task: object) -> bool:
    """Whether ``task`` continues its inputs: a :class:`Generating` task, or (deprecated, for one
    release) a task that defines ``generate`` without subclassing it."""
    if isinstance(task, Generating):
        return True
    if callable(getattr(task, "generate", None)):
        warnings.warn(
            f"task {type(task).__name__} defines generate() without subclassing runjob.Generating; "
            "runjob predict continues its prompts for now, but the next release will need the subclass",
            DeprecationWarning,
            stacklevel=2,
        )
        return True
    return False


def logits_of(outputs: ModelOutputs) -> torch.Tensor:
    """The logits in a model's outputs: a tensor (anything with a ``shape``) as it is; else its
    ``logits`` attribute (a Hugging Face ``ModelOutput``, any object with one) or ``"logits"`` key
    (a dict). Anything else is a ``ValueError`` naming what the outputs are."""
    if hasattr(outputs, "shape"):
        tensor: torch.Tensor = outputs
        return tensor
    logits: torch.Tensor | None = getattr(outputs, "logits", None)
    if logits is None and isinstance(outputs, Mapping):
        logits = outputs.get("logits")
    if logits is None:
        held = f" (keys {', '.join(map(repr, outputs))})" if isinstance(outputs, Mapping) else ""
        raise ValueError(
            f"the model's outputs are a {type(outputs).__name__}{held}: the task needs a tensor of logits, or outputs "
            "with logits (an object's .logits, a dict's 'logits', as a Hugging Face model gives)"
        )
    return logits


_WRAPPED = ("_orig_mod", "module")  # torch.compile's OptimizedModule; DistributedDataParallel, FSDP, DeepSpeed


def forward_signature(model: torch.nn.Module) -> inspect.Signature | None:
    """The signature of the function that takes ``model``'s inputs: its ``forward`` (or the model
    itself, for a plain callable), read through ``functools.wraps`` decorators (Accelerate's mixed
    precision, Hugging Face's) and through wrappers whose ``forward`` only passes ``*args,
    **kwargs`` on to the model inside (``torch.compile``, DistributedDataParallel). ``None`` when it
    cannot be read."""
    for _ in range(8):  # wrappers of wrappers, never a loop
        try:
            signature = inspect.signature(getattr(model, "forward", model))
        except (TypeError, ValueError):
            return None
        passes_on = all(
            parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
            for parameter in signature.parameters.values()
        )
        inner = next((found for name in _WRAPPED if (found := getattr(model, name, None)) is not None), None)
        if not (passes_on and callable(inner)):
            return signature
        model = inner
    return signature


def _keywords(signature: inspect.Signature) -> tuple[frozenset[str], bool]:
    """The parameter names a call may give by keyword, and whether it takes ``**kwargs``."""
    parameters = signature.parameters.values()
    named = frozenset(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return named, any(p.kind is p.VAR_KEYWORD for p in parameters)


def takes_keyword(model: torch.nn.Module, name: str) -> bool:
    """Whether ``model``'s ``forward`` names a parameter ``name`` (``**kwargs`` alone does not
    count), read as :meth:`Task.call_model` reads it: e.g. whether a language model takes an
    ``attention_mask``."""
    found = forward_signature(model)
    return found is not None and name in _keywords(found)[0]


def first_tensor(batch: Batch) -> torch.Tensor | None:
    """The first object with a ``shape`` in a batch of nested tuples, lists and dicts (or None)."""
    if hasattr(batch, "shape"):
        tensor: torch.Tensor = batch
        return tensor
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else ()
    for item in items:
        found = first_tensor(item)
        if found is not None:
            return found
    return None


def declared_metrics(options: Options, prefix: str = "val") -> dict[str, Direction]:
    """A task's metrics with a split prefix: ``{"val/accuracy": "max", "val/loss": "min"}``."""
    return {f"{prefix}/{name}": direction for name, direction in options.metrics().items()}  # type: ignore[attr-defined]
