"""``runjob predict RUN --input PATH``: a finished run's predictions for new inputs, read as the
run's dataset reads them (``DatasetSplits.read_inputs``) and turned into columns by its task
(``Task.predict``), or, for a language model, continuations of prompts (``Task.generate``)."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from runjob.errors import DataError, RunjobError, first_line

FORMATS = (".csv", ".jsonl")


def _check_arguments(args: argparse.Namespace) -> None:
    if (args.input is None) == (args.prompt is None):
        raise RunjobError("predict needs --input PATH (a file or folder of inputs) or --prompt TEXT, one of them")
    if args.output is not None and args.output.suffix.lower() not in FORMATS:
        raise RunjobError(
            f"--output {args.output}: name a .csv or .jsonl file (or leave it out for JSON lines on stdout)"
        )
    if args.batch_size < 1 or args.max_new_tokens < 0 or args.temperature < 0:
        raise RunjobError("--batch-size must be at least 1, --max-new-tokens and --temperature at least 0")


def cmd_predict(args: argparse.Namespace) -> int:
    """Predict with run RUN's model and write one row per input, as CSV or JSON lines."""
    from runjob.host.plugin_host import load_plugins
    from runjob.train.trained import best_device, build_model, find_run, load_data, load_job

    _check_arguments(args)
    host = load_plugins()
    with tempfile.TemporaryDirectory(prefix="runjob-predict-") as scratch:
        run = find_run(args.run, args.tracking_uri, Path(scratch))
        job = load_job(run, args.overrides, host)
        splits, task = load_data(job)
        if args.prompt is not None and not task.generates:
            raise RunjobError(
                f"--prompt is for a language model; task {job.task.name!r} predicts from --input PATH instead"
            )
        if splits.read_inputs is None:
            raise RunjobError(
                f"dataset {job.dataset.name!r} cannot read inputs for prediction (its plugin gives no "
                "DatasetSplits.read_inputs)"
            )
        source = args.input
        if args.prompt is not None:
            source = Path(scratch) / "prompt"
            source.write_text(args.prompt, encoding="utf-8")
        inputs = splits.read_inputs(source)
        if len(inputs) == 0:
            raise DataError(f"--input {source}: nothing to predict")
        model = build_model(job, run.model_file).to(best_device())
        if task.generates:
            rows = continuations(model, task, splits, inputs, args)
        else:
            rows = predictions(model, task, splits, inputs, args.batch_size, job, source)
    if args.prompt is not None:
        for row in rows:
            row["input"] = "prompt"
    write_rows(rows, args.output)
    if args.output is not None:
        print(f"runjob: {len(rows)} prediction(s) written to {args.output}", file=sys.stderr)
    return 0


def predictions(model: Any, task: Any, splits: Any, inputs: Any, batch_size: int, job: Any, source: Path) -> list:
    """One row per input: its name and the task's prediction columns, batch by batch."""
    import torch
    from torch.utils.data import DataLoader

    from runjob.train.data_loading import collate

    device = next(model.parameters()).device
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        for names, batch in DataLoader(inputs, batch_size=batch_size, collate_fn=collate):
            try:
                outputs = model(batch.to(device))
            except RuntimeError as error:  # torch's shape errors
                raise RunjobError(
                    f"model {job.model.name!r} cannot take the inputs read from {source} (a batch of shape "
                    f"{tuple(batch.shape)}): {first_line(error)}"
                ) from None
            columns = columns_of(task.predict(outputs), splits.classes)
            rows.extend(
                {"input": name, **{key: values[i] for key, values in columns.items()}} for i, name in enumerate(names)
            )
    return rows


def columns_of(predicted: dict[str, Any], classes: list[str] | None) -> dict[str, list[Any]]:
    """Per-sample tensors as lists of plain values: a ``(batch, k)`` tensor as k columns
    ``name_0 ...``; ``class`` indices as the dataset's class names when it has them."""
    columns: dict[str, list[Any]] = {}
    for name, tensor in predicted.items():
        values = tensor.detach().float().cpu() if tensor.is_floating_point() else tensor.detach().cpu()
        if values.ndim == 1:
            columns[name] = values.tolist()
        else:
            flat = values.reshape(values.shape[0], -1)
            for k in range(flat.shape[1]):
                columns[f"{name}_{k}"] = flat[:, k].tolist()
    if classes is not None and "class" in columns:
        columns["class"] = [classes[int(index)] for index in columns["class"]]
    return columns


def continuations(model: Any, task: Any, splits: Any, inputs: Any, args: argparse.Namespace) -> list:
    """One row per prompt: its name and the model's continuation (text when the dataset can decode
    its tokens, else the token ids)."""
    import torch

    from runjob.train.trained import sample_batch

    device = next(model.parameters()).device
    context = int(task.inputs(sample_batch(splits.val, 1)).shape[-1])  # the length the model was trained on
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    for index in range(len(inputs)):
        name, tokens = inputs[index]
        new = task.generate(model, tokens[None].to(device), args.max_new_tokens, context, args.temperature, generator)
        ids = new[0].tolist()
        rows.append({"input": name, "continuation": splits.decode(ids) if splits.decode else ids})
    return rows


def write_rows(rows: list[dict[str, Any]], output: Path | None) -> None:
    """JSON lines on stdout, or ``output`` as CSV or JSON lines, written whole or not at all (a
    temporary file renamed into place)."""
    if output is None:
        try:
            sys.stdout.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
            sys.stdout.flush()
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.{os.getpid()}.partial")
    try:
        with partial.open("w", encoding="utf-8", newline="") as file:
            if output.suffix.lower() == ".csv":
                names = list(dict.fromkeys(key for row in rows for key in row))
                writer = csv.DictWriter(file, fieldnames=names)
                writer.writeheader()
                writer.writerows(
                    {k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()} for row in rows
                )
            else:
                file.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)
