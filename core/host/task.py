"""The task contract: what a batch means to the training loop.

A task component decides how a batch becomes a loss, what evaluation accumulates and reports, and
how much a batch holds for throughput. The host keeps everything else: moving batches to the
device, backward, gradient accumulation, clipping, the non-finite guard, the optimizer and
scheduler steps, gathering evaluation values across processes, checkpoints and the record.

Nothing here imports torch: a task's options are read by ``runjob validate``, and a task's methods
import torch themselves where they need it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal

from runjob.host.components import Options

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
    """

    unit: str = "samples"
    """What :meth:`count` counts; throughput is logged as ``train/<unit>_per_s``."""

    def inputs(self, batch: Any) -> Any:
        """What the model is called with: the first item of a tuple or list batch, else the batch."""
        return batch[0] if isinstance(batch, (tuple, list)) else batch

    def targets(self, batch: Any) -> Any:
        """What the outputs are compared with: the second item of a tuple or list batch."""
        if isinstance(batch, (tuple, list)) and len(batch) > 1:
            return batch[1]
        raise ValueError(
            f"{type(self).__name__} expects (inputs, targets) batches, got a {type(batch).__name__}; "
            "override Task.targets for other batches"
        )

    def forward(self, model: Any, batch: Any) -> Any:
        """The model's outputs for ``batch``: ``model(self.inputs(batch))``."""
        return model(self.inputs(batch))

    @abstractmethod
    def loss(self, outputs: Any, batch: Any) -> Any:
        """The training loss of a batch: a 0-dim tensor the host calls ``backward`` on (via
        ``accelerator.backward``). Do not call ``.item()`` here: it would wait for the device."""

    def check(self, outputs: Any, batch: Any) -> None:  # noqa: B027 - optional, unlike the abstract three
        """Called once, on the first training batch: raise ``ValueError("...")`` when the model's
        outputs do not fit the task and the data (say the shapes and what to set); the host stops
        with that message, naming the model, the task and the dataset."""

    @abstractmethod
    def evaluate(self, outputs: Any, batch: Any) -> dict[str, Any]:
        """Per-sample values of one evaluation batch: names mapped to tensors whose first dimension
        is the batch (``(batch,)`` or ``(batch, ...)``). The host gathers them across processes
        (each validation sample counted once), sums each over the samples on the device, and hands
        the totals to :meth:`summarize` once per evaluation."""

    @abstractmethod
    def summarize(self, totals: dict[str, Any], count: int) -> dict[str, float]:
        """The metrics of a whole evaluation from the totals of :meth:`evaluate`'s values (a float
        for a ``(batch,)`` value, a list of floats for ``(batch, k)``, and so on) and ``count``, the
        number of samples. Return every metric the options declare, without the split prefix."""

    def count(self, batch: Any) -> int:
        """How many :attr:`unit` a batch holds: by default the first dimension of its first tensor.
        Use shapes only (no ``.item()``): it is called every step."""
        first = first_tensor(batch)
        if first is None:
            raise ValueError(f"{type(self).__name__} found no tensor in a {type(batch).__name__} batch to count")
        return int(first.shape[0])

    def predict(self, outputs: Any) -> dict[str, Any]:
        """What ``runjob predict`` writes for a batch of the model's outputs: names mapped to
        per-sample tensors (first dimension the batch; a ``(batch, k)`` tensor becomes k columns
        ``name_0 ... name_<k-1>``). By default the outputs as they are, as ``output``; a
        classification task gives the class index and its probability instead. A tensor named
        ``class`` holds class indices, written as the dataset's class names when it has them."""
        return {"output": outputs}

    def generate(self, model: Any, tokens: Any, max_new_tokens: int, context: int, temperature: float, generator: Any):
        """For a task whose model continues its input (language modelling): the ``max_new_tokens``
        token ids that follow ``tokens`` (a ``(1, T)`` prompt), greedily when ``temperature`` is 0,
        else sampled with ``generator``; the model sees at most the last ``context`` tokens (the
        length it was trained on). Tasks that do not generate leave this as it is."""
        raise ValueError(f"task {type(self).__name__} does not continue its inputs (it has no generate())")

    @property
    def generates(self) -> bool:
        """Whether this task overrides :meth:`generate` (``runjob predict`` then continues prompts)."""
        return type(self).generate is not Task.generate


def first_tensor(batch: Any) -> Any:
    """The first object with a ``shape`` in a batch of nested tuples, lists and dicts (or None)."""
    if hasattr(batch, "shape"):
        return batch
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else ()
    for item in items:
        found = first_tensor(item)
        if found is not None:
            return found
    return None


def declared_metrics(options: Options, prefix: str = "val") -> dict[str, Direction]:
    """A task's metrics with a split prefix: ``{"val/accuracy": "max", "val/loss": "min"}``."""
    return {f"{prefix}/{name}": direction for name, direction in options.metrics().items()}  # type: ignore[attr-defined]
