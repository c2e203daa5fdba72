"""``runjob export RUN --format onnx|pt2``: a finished run's model as an ONNX file
(``torch.onnx.export``) or a ``torch.export`` program (``torch.export.save``), checked on a batch of
the validation split against the model itself before the file is put in place.

What is exported is the model as the task calls it (``Task.call_model``) on the task's inputs of a
batch (``Task.inputs``): a tensor, or a dict (tuple, list) of tensors, every one with a batch
dimension of any size. A program then takes those inputs as one argument (``module({"x": ...})``);
an ONNX file takes each tensor as an input named by its key (``input`` for a lone tensor)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils import _pytree as pytree  # torch's walk over nested inputs, as torch.export takes them

from runjob.commands.run_plugins import require_run_plugins
from runjob.errors import ComponentError, RunjobError, describe, first_line
from runjob.host.components import ExportRequest
from runjob.host.model_build import merge_adapters
from runjob.host.output import screen
from runjob.host.plugin_host import load_plugins
from runjob.host.run_folder import RunFolder, exported_model_name
from runjob.train.trained import build_trained, find_run, load_data, load_job, sample_batch, saved

if TYPE_CHECKING:
    from runjob.host.components import Component
    from runjob.host.plugin_host import PluginHost
    from runjob.host.task import Task
    from runjob.job.validation import ResolvedJob
    from runjob.train.trained import TrainedRun

ONNX_MODULES = ("onnx", "onnxruntime", "onnxscript")
BUILT_IN = ("onnx", "pt2")
SAMPLES = 8  # validation samples the exported file is checked on


def _output_path(args: argparse.Namespace, run: TrainedRun) -> Path:
    if args.output is not None:
        output: Path = args.output
        return output
    if run.output_dir is not None:
        return RunFolder(run.output_dir).exported_model(args.format)
    return Path(exported_model_name(args.format))


def cmd_export(args: argparse.Namespace) -> int:
    """Export run RUN's model with its final weights, check the exported file on validation
    samples, print the largest difference and write it (whole, or nothing)."""
    host = load_plugins()
    exporters = host.components["exporter"]
    if args.format not in (*BUILT_IN, *exporters):
        known = ", ".join([*BUILT_IN, *sorted(exporters)])
        raise RunjobError(f"--format {args.format}: not an export format; the formats: {known}")
    if args.format == "onnx":
        missing = [name for name in ONNX_MODULES if importlib.util.find_spec(name) is None]
        if missing:
            raise RunjobError(
                f"export --format onnx needs {', '.join(missing)}: pip install 'runjob-train[onnx]' (or uv sync "
                "--extra onnx)"
            )
    with tempfile.TemporaryDirectory(prefix="runjob-export-") as scratch:
        run = find_run(args.run, args.tracking_uri, Path(scratch))
        require_run_plugins(run, host, "export")  # its job names what they registered
        if args.format in exporters:  # the model and what the run kept of its data: the data itself need not be here
            has_facts = RunFolder(run.folder).data_facts.is_file()
            job = load_job(run, [], host, data=not has_facts)
            return _plugin_export(args, run, job, exporters[args.format], host)
        job = load_job(run, [], host)
        splits, task = load_data(job)
        trained, adapters = build_trained(job, run.model_file, run.folder, splits)
        model = task_module(merge_adapters(trained, adapters), task)
        inputs = task.inputs(sample_batch(splits.val, SAMPLES, splits.collate))
    leaves = pytree.tree_leaves(inputs)
    if not leaves or not all(isinstance(leaf, torch.Tensor) for leaf in leaves):
        kinds = ", ".join(sorted({type(leaf).__name__ for leaf in leaves})) or type(inputs).__name__
        raise RunjobError(
            f"task {job.task.name!r} gives model {job.model.name!r} inputs holding {kinds}; export supports "
            "inputs made of tensors (one, or a dict, tuple or list of them)"
        )
    if leaves[0].shape[0] < 2:  # torch.export treats a batch of one as a constant size
        inputs = pytree.tree_map(lambda tensor: torch.cat([tensor, tensor]), inputs)
    samples = int(pytree.tree_leaves(inputs)[0].shape[0])
    output = _output_path(args, run)
    partial = output.with_name(f".{output.stem}.partial-{os.getpid()}{output.suffix}")
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        try:
            with torch.no_grad():
                expected = model(inputs)
        except (RuntimeError, TypeError) as error:  # torch's shape errors; a model called with the wrong arguments
            raise RunjobError(
                f"model {job.model.name!r} cannot take task {job.task.name!r}'s inputs of a validation batch "
                f"({pytree.tree_map(lambda tensor: tuple(tensor.shape), inputs)}): {first_line(error)}; nothing written"
            ) from None
        exporter = export_onnx if args.format == "onnx" else export_pt2
        difference = exporter(model, inputs, expected, partial, job.model.name)
        scale = max([1.0, *(float(tensor.detach().abs().max()) for tensor in _tensors(expected))])
        if not difference <= args.atol * scale:
            raise RunjobError(
                f"the exported {args.format} model differs from model {job.model.name!r} by up to {difference:.3g} on "
                f"{samples} validation samples (more than --atol {args.atol:g} x {scale:.3g}); nothing written"
            )
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)
    checker = "onnxruntime" if args.format == "onnx" else "torch.export.load"
    print(f"max abs difference {difference:.3g} ({checker} against the model, {samples} validation samples)")
    screen.each(f"runjob: exported model {job.model.name!r} of run {run.label} to {output}", err=True)
    return 0


def _plugin_export(
    args: argparse.Namespace, run: TrainedRun, job: ResolvedJob, exporter: Component, host: PluginHost
) -> int:
    """``--format NAME`` registered by a plugin (``runjob_register_exporters``): the trained model,
    adapters merged, and what the run kept of its data (its predictor's inputs, its ``data/``
    files) go to the plugin's export function, which writes ``--output`` (by default
    ``OUTPUT_DIR/model.NAME``); it is written whole or not at all."""
    predictor = saved(run, host)[1]
    trained, adapters = build_trained(job, run.model_file, run.folder)
    data = RunFolder(run.folder).data_dir
    artifacts = {file.name: file for file in sorted(data.iterdir())} if data.is_dir() else {}
    output = _output_path(args, run)
    if output.exists():
        raise RunjobError(f"--output {output}: already exists; remove it or name another path")
    partial = output.with_name(f".{output.name}.partial-{os.getpid()}")
    request = ExportRequest(
        model=merge_adapters(trained, adapters).eval(),
        output=partial,
        job=job,
        inputs=predictor.inputs if predictor is not None else None,
        artifacts=artifacts,
        task=predictor.task if predictor is not None else None,
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        try:
            said = exporter.factory(request)
        except (ValueError, RunjobError) as error:
            raise RunjobError(f"export --format {args.format} (plugin {exporter.plugin}): {describe(error)}") from None
        except Exception as error:  # noqa: BLE001 - a broken plugin is one line, not a traceback
            raise ComponentError(
                f"export --format {args.format} (plugin {exporter.plugin}) failed: {describe(error)}"
            ) from error
        if not partial.exists():
            raise ComponentError(f"export --format {args.format} (plugin {exporter.plugin}) wrote nothing")
        os.replace(partial, output)
    finally:
        if partial.is_dir():
            shutil.rmtree(partial, ignore_errors=True)
        else:
            partial.unlink(missing_ok=True)
    if said:
        print(said)
    screen.each(f"runjob: exported model {job.model.name!r} of run {run.label} to {output}", err=True)
    return 0


def task_module(model: torch.nn.Module, task: Task) -> torch.nn.Module:
    """``model`` as ``task`` calls it, as a module of its own taking the task's inputs as one argument
    (``forward(inputs) = task.call_model(model, inputs)``): what export traces."""

    class TaskModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.task = task

        def forward(self, inputs: Any) -> Any:  # the task's model inputs and the model's outputs: the plugin's
            return self.task.call_model(self.model, inputs)

    return TaskModel().eval()


def _tensors(tree: object) -> list[torch.Tensor]:
    """The tensors in nested dicts, tuples and lists (a model's outputs), in pytree order."""
    return [leaf for leaf in pytree.tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def _largest_difference(got: object, expected: object) -> float:
    """The largest absolute difference between the exporter's outputs and the model's."""
    pairs = zip(pytree.tree_leaves(got), _tensors(expected), strict=True)
    return max(float(np.abs(np.asarray(a) - b.detach().cpu().numpy()).max()) for a, b in pairs)


def _names(tree: object, root: str) -> list[str]:
    """A name per tensor of ``tree``, for ONNX: ``root`` for a lone tensor, a dict's keys (``x``,
    ``x_0`` deeper), ``root_0``, ``root_1`` for a tuple's items."""
    flat, _ = pytree.tree_flatten_with_path(tree)
    names = []
    for path, _leaf in flat:
        parts = [str(getattr(key, "key", getattr(key, "idx", key))) for key in path]
        keyed = bool(path) and isinstance(path[0], pytree.MappingKey)
        names.append("_".join(parts if keyed else [root, *parts]))
    return names


def _batch_dimension(inputs: object) -> object:
    """``dynamic_shapes`` for ``inputs``: the first dimension of every tensor is one batch size."""
    batch = torch.export.Dim("batch")
    return pytree.tree_map(lambda _tensor: {0: batch}, inputs)


def _cannot_export(name: str, what: str, error: BaseException) -> RunjobError:
    reason = first_line(error)[:400] or type(error).__name__
    return RunjobError(f"model {name!r} cannot be exported {what}: {type(error).__name__}: {reason}; nothing written")


def export_onnx(model: torch.nn.Module, inputs: object, expected: object, path: Path, name: str) -> float:
    """Write the model (a module whose forward takes ``inputs``, as :func:`task_module` gives) as ONNX to
    ``path`` (a batch dimension of any size) and return the largest absolute difference between
    onnxruntime's outputs and ``expected`` for ``inputs``."""
    import onnxruntime  # lazy: optional: only an ONNX export is checked with it

    names = _names(inputs, "input")
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():  # the exporter's progress lines
            # several inputs share the batch dimension: the exporter says it names it once
            warnings.filterwarnings("ignore", message="# The axis name", category=UserWarning)
            torch.onnx.export(
                model,
                (),
                str(path),
                kwargs={"inputs": inputs},  # as keywords: the exporter would take a dict in args for keywords
                dynamo=True,
                external_data=False,  # one file: renamed into place whole
                input_names=names,
                output_names=_names(expected, "output"),
                dynamic_shapes={"inputs": _batch_dimension(inputs)},
            )
    except Exception as error:  # noqa: BLE001 - an operator or a construct the exporter does not support
        raise _cannot_export(name, "to ONNX", error) from None
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    taken = {given.name for given in session.get_inputs()}  # an input the model ignores is left out
    feed = {
        key: np.asarray(tensor.detach().cpu().numpy())
        for key, tensor in zip(names, pytree.tree_leaves(inputs), strict=True)
        if key in taken
    }
    return _largest_difference(session.run(None, feed), expected)


def export_pt2(model: torch.nn.Module, inputs: object, expected: object, path: Path, name: str) -> float:
    """Write the model as a ``torch.export`` program to ``path`` (a batch dimension of any size),
    load it back and return the largest absolute difference between its outputs and ``expected``."""
    try:
        program = torch.export.export(model, (inputs,), dynamic_shapes=(_batch_dimension(inputs),))
    except Exception as error:  # noqa: BLE001 - data-dependent control flow, an unsupported operator
        raise _cannot_export(name, "with torch.export", error) from None
    torch.export.save(program, str(path))
    with torch.no_grad():
        got = torch.export.load(str(path)).module()(inputs)
    return _largest_difference(_tensors(got), expected)
