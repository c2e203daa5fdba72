"""runjob: a declarative training launcher. One TOML job file; pluggy plugins; Accelerate; MLflow.

The plugin API is importable from here: ``hookimpl``, ``Options``, ``ExistingDir``,
``ExistingFile``, ``AbsolutePath``, ``DatasetSplits``, ``DataFacts``, ``Adapter``,
``ExportRequest``, ``Inputs``, ``ImageTensors``, ``StrategyPlan``, ``Task``,
``TaskOptions``, ``Generating``, ``Callback``, ``CallbackOptions``, ``Run`` (with its halves
``RunState`` and ``RunActions``; ``RunContext`` is its deprecated old name), ``Event``, ``Job``,
``RunFolder``, ``Register``, ``say`` (a line for the job, from the main process), the FLOP
counting helpers (``model_flops_per_unit``, ``meta_model``,
``training_flops_per_unit``, ``peak_flops``) and the error types; ``run`` trains a job file from
Python, as ``runjob run`` does. Nothing here imports torch, accelerate or mlflow.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from runjob.host.hookspecs import hookimpl

if TYPE_CHECKING:
    # What type checkers see: every name of _LAZY below, imported for real (`X as X`: re-exported).
    # At run time the names load lazily through __getattr__; tests/test_typing.py keeps the two lists
    # the same.
    from runjob.errors import DataError as DataError
    from runjob.errors import RunjobError as RunjobError
    from runjob.errors import TrainingError as TrainingError
    from runjob.host.callback import Callback as Callback
    from runjob.host.callback import CallbackOptions as CallbackOptions
    from runjob.host.components import AbsolutePath as AbsolutePath
    from runjob.host.components import Adapter as Adapter
    from runjob.host.components import DataFacts as DataFacts
    from runjob.host.components import DatasetSplits as DatasetSplits
    from runjob.host.components import ExistingDir as ExistingDir
    from runjob.host.components import ExistingFile as ExistingFile
    from runjob.host.components import ExportRequest as ExportRequest
    from runjob.host.components import ImageTensors as ImageTensors
    from runjob.host.components import Inputs as Inputs
    from runjob.host.components import Options as Options
    from runjob.host.components import StrategyPlan as StrategyPlan
    from runjob.host.components import require_module as require_module
    from runjob.host.events import Event as Event
    from runjob.host.hookspecs import Register as Register
    from runjob.host.output import say as say
    from runjob.host.plugin_host import PluginWarning as PluginWarning
    from runjob.host.run_context import Run as Run
    from runjob.host.run_context import RunActions as RunActions
    from runjob.host.run_context import RunContext as RunContext
    from runjob.host.run_context import RunState as RunState
    from runjob.host.run_folder import RunFolder as RunFolder
    from runjob.host.streams import ShardSource as ShardSource
    from runjob.host.streams import Streamed as Streamed
    from runjob.host.streams import StreamOptions as StreamOptions
    from runjob.host.task import Generating as Generating
    from runjob.host.task import Task as Task
    from runjob.host.task import TaskOptions as TaskOptions
    from runjob.host.task import logits_of as logits_of
    from runjob.job.validation import Job as Job
    from runjob.train.entry import RunOutcome as RunOutcome
    from runjob.train.entry import run as run
    from runjob.train.flops import meta_model as meta_model
    from runjob.train.flops import model_flops_per_unit as model_flops_per_unit
    from runjob.train.flops import peak_flops as peak_flops
    from runjob.train.flops import training_flops_per_unit as training_flops_per_unit
    from runjob.train.shards import stream_manifest as stream_manifest

__version__: str  # declared, not set: __getattr__ reads it (_installed_version) when first asked for


def _installed_version() -> str:
    """``runjob.__version__``: written once, in pyproject.toml ([project] version), and read from the
    installed distribution's metadata when first asked for: importlib.metadata takes ~60 ms to import
    (email, zipfile, csv...), which `runjob --help` should not pay, as for _LAZY's names below. A source
    tree imported without being installed (PYTHONPATH=core) has no metadata: "0+unknown"."""
    metadata = import_module("importlib.metadata")
    try:
        version: str = metadata.version("runjob-train")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    globals()["__version__"] = version  # asked once
    return version


_LAZY = {
    "Options": "runjob.host.components",
    "ExistingDir": "runjob.host.components",
    "ExistingFile": "runjob.host.components",
    "AbsolutePath": "runjob.host.components",
    "DatasetSplits": "runjob.host.components",
    "DataFacts": "runjob.host.components",
    "Adapter": "runjob.host.components",
    "ExportRequest": "runjob.host.components",
    "ImageTensors": "runjob.host.components",
    "Inputs": "runjob.host.components",
    "StrategyPlan": "runjob.host.components",
    "require_module": "runjob.host.components",
    "StreamOptions": "runjob.host.streams",
    "Streamed": "runjob.host.streams",
    "ShardSource": "runjob.host.streams",
    "stream_manifest": "runjob.train.shards",
    "Callback": "runjob.host.callback",
    "CallbackOptions": "runjob.host.callback",
    "Task": "runjob.host.task",
    "Generating": "runjob.host.task",
    "TaskOptions": "runjob.host.task",
    "logits_of": "runjob.host.task",
    "Run": "runjob.host.run_context",
    "RunState": "runjob.host.run_context",
    "RunActions": "runjob.host.run_context",
    "RunContext": "runjob.host.run_context",
    "Event": "runjob.host.events",
    "RunFolder": "runjob.host.run_folder",
    "Job": "runjob.job.validation",
    "Register": "runjob.host.hookspecs",
    "say": "runjob.host.output",
    "PluginWarning": "runjob.host.plugin_host",
    "meta_model": "runjob.train.flops",
    "model_flops_per_unit": "runjob.train.flops",
    "training_flops_per_unit": "runjob.train.flops",
    "peak_flops": "runjob.train.flops",
    "run": "runjob.train.entry",
    "RunOutcome": "runjob.train.entry",
    "RunjobError": "runjob.errors",
    "DataError": "runjob.errors",
    "TrainingError": "runjob.errors",
}

__all__ = ["hookimpl", "__version__", *_LAZY]


if not TYPE_CHECKING:  # type checkers see the imports above, and no name outside them

    def __getattr__(name: str) -> Any:
        # pydantic costs ~0.2 s to import; `runjob --help` should not pay for it
        if name in _LAZY:
            return getattr(import_module(_LAZY[name]), name)
        if name == "__version__":
            return _installed_version()
        raise AttributeError(f"module 'runjob' has no attribute {name!r}")
