"""runjob: a declarative training launcher. One TOML job file; pluggy plugins; Accelerate; MLflow.

The plugin API is importable from here: ``hookimpl``, ``Options``, ``ExistingDir``,
``ExistingFile``, ``AbsolutePath``, ``DatasetSplits``, ``Inputs``, ``ImageTensors``, ``StrategyPlan``, ``Task``,
``TaskOptions``, ``Generating``, ``Callback``, ``CallbackOptions``, ``RunContext``, ``Register``, the FLOP
counting helpers (``meta_model``, ``training_flops_per_unit``, ``peak_flops``) and the error
types; ``run`` trains a job file from Python, as ``runjob run`` does. Nothing here imports torch,
accelerate or mlflow.
"""

from importlib import import_module
from typing import Any

from runjob.host.hookspecs import hookimpl

__version__ = "0.1.0"

_LAZY = {
    "Options": "runjob.host.components",
    "ExistingDir": "runjob.host.components",
    "ExistingFile": "runjob.host.components",
    "AbsolutePath": "runjob.host.components",
    "DatasetSplits": "runjob.host.components",
    "ImageTensors": "runjob.host.components",
    "Inputs": "runjob.host.components",
    "StrategyPlan": "runjob.host.components",
    "require_module": "runjob.host.components",
    "Callback": "runjob.host.callback",
    "CallbackOptions": "runjob.host.callback",
    "Task": "runjob.host.task",
    "Generating": "runjob.host.task",
    "TaskOptions": "runjob.host.task",
    "Run": "runjob.host.run_context",
    "RunState": "runjob.host.run_context",
    "RunActions": "runjob.host.run_context",
    "RunContext": "runjob.host.run_context",
    "Event": "runjob.host.events",
    "Job": "runjob.job.validation",
    "Register": "runjob.host.hookspecs",
    "meta_model": "runjob.train.flops",
    "training_flops_per_unit": "runjob.train.flops",
    "peak_flops": "runjob.train.flops",
    "run": "runjob.train.entry",
    "RunOutcome": "runjob.train.entry",
    "RunjobError": "runjob.errors",
    "DataError": "runjob.errors",
    "TrainingError": "runjob.errors",
}

__all__ = ["hookimpl", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    # pydantic costs ~0.2 s to import; `runjob --help` should not pay for it
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'runjob' has no attribute {name!r}")
