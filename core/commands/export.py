"""``runjob export RUN --format onnx|pt2``: a finished run's model as an ONNX file
(``torch.onnx.export``) or a ``torch.export`` program (``torch.export.save``), checked on a batch of
the validation split against the model itself before the file is put in place."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from runjob.errors import RunjobError, first_line

ONNX_MODULES = ("onnx", "onnxruntime", "onnxscript")
SAMPLES = 8  # validation samples the exported file is checked on


def _output_path(args: argparse.Namespace, run: Any) -> Path:
    if args.output is not None:
        return args.output
    name = f"model.{args.format}"
    return run.output_dir / name if run.output_dir is not None else Path(name)


def cmd_export(args: argparse.Namespace) -> int:
    """Export run RUN's model with its final weights, check the exported file on validation
    samples, print the largest difference and write it (whole, or nothing)."""
    import torch

    from runjob.host.plugin_host import load_plugins
    from runjob.train.trained import build_model, find_run, load_data, load_job, sample_batch

    if args.format == "onnx":
        missing = [name for name in ONNX_MODULES if importlib.util.find_spec(name) is None]
        if missing:
            raise RunjobError(
                f"export --format onnx needs {', '.join(missing)}: pip install 'runjob-train[onnx]' (or uv sync "
                "--extra onnx)"
            )
    host = load_plugins()
    with tempfile.TemporaryDirectory(prefix="runjob-export-") as scratch:
        run = find_run(args.run, args.tracking_uri, Path(scratch))
        job = load_job(run, [], host)
        splits, task = load_data(job)
        model = build_model(job, run.model_file)
        inputs = task.inputs(sample_batch(splits.val, SAMPLES))
    if not isinstance(inputs, torch.Tensor):
        raise RunjobError(
            f"model {job.model.name!r} takes {type(inputs).__name__} inputs; export supports models taking one tensor"
        )
    if inputs.shape[0] < 2:  # torch.export treats a batch of one as a constant size
        inputs = torch.cat([inputs, inputs])
    output = _output_path(args, run)
    partial = output.with_name(f".{output.stem}.partial-{os.getpid()}{output.suffix}")
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        with torch.no_grad():
            expected = model(inputs)
        exporter = export_onnx if args.format == "onnx" else export_pt2
        difference = exporter(model, inputs, expected, partial, job.model.name)
        scale = max(1.0, float(expected.detach().abs().max()))
        if not difference <= args.atol * scale:
            raise RunjobError(
                f"the exported {args.format} model differs from model {job.model.name!r} by up to {difference:.3g} on "
                f"{inputs.shape[0]} validation samples (more than --atol {args.atol:g} x {scale:.3g}); nothing written"
            )
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)
    checker = "onnxruntime" if args.format == "onnx" else "torch.export.load"
    print(f"max abs difference {difference:.3g} ({checker} against the model, {inputs.shape[0]} validation samples)")
    print(f"runjob: exported model {job.model.name!r} of run {run.label} to {output}", file=sys.stderr)
    return 0


def _batch_dimension() -> Any:
    import torch

    return ({0: torch.export.Dim("batch")},)


def _cannot_export(name: str, what: str, error: BaseException) -> RunjobError:
    reason = first_line(error)[:400] or type(error).__name__
    return RunjobError(f"model {name!r} cannot be exported {what}: {type(error).__name__}: {reason}; nothing written")


def export_onnx(model: Any, inputs: Any, expected: Any, path: Path, name: str) -> float:
    """Write the model as ONNX to ``path`` (a batch dimension of any size) and return the largest
    absolute difference between onnxruntime's outputs and ``expected`` for ``inputs``."""
    import numpy as np
    import onnxruntime
    import torch

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the exporter's progress lines
            torch.onnx.export(
                model,
                (inputs,),
                str(path),
                dynamo=True,
                external_data=False,  # one file: renamed into place whole
                input_names=["input"],
                output_names=["output"],
                dynamic_shapes=_batch_dimension(),
            )
    except Exception as error:  # noqa: BLE001 - an operator or a construct the exporter does not support
        raise _cannot_export(name, "to ONNX", error) from None
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: inputs.numpy()})[0]
    return float(np.abs(got - expected.detach().numpy()).max())


def export_pt2(model: Any, inputs: Any, expected: Any, path: Path, name: str) -> float:
    """Write the model as a ``torch.export`` program to ``path`` (a batch dimension of any size),
    load it back and return the largest absolute difference between its outputs and ``expected``."""
    import torch

    try:
        program = torch.export.export(model, (inputs,), dynamic_shapes=_batch_dimension())
    except Exception as error:  # noqa: BLE001 - data-dependent control flow, an unsupported operator
        raise _cannot_export(name, "with torch.export", error) from None
    torch.export.save(program, str(path))
    with torch.no_grad():
        got = torch.export.load(str(path)).module()(inputs)
    return float((got - expected).abs().max())
