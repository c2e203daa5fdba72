"""``runjob predict RUN --input PATH``: a finished run's predictions for new inputs, read as the
run's dataset reads them (``DatasetSplits.inputs`` / ``read_inputs``), given to the model by its task
(``Task.call_model``) and turned into columns by it (``Task.predict``), or, for a language model (a
``runjob.Generating`` task), continuations of prompts (``generate``).
The rows come from ``runjob.record.prediction``, the same code the run's MLflow model predicts with."""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from runjob.commands.run_plugins import require_run_plugins
from runjob.errors import DataError, RunjobError
from runjob.host.components import Inputs
from runjob.host.json_types import JSONObject
from runjob.host.output import screen
from runjob.host.plugin_host import load_plugins
from runjob.host.task import generates
from runjob.record.prediction import Predictor
from runjob.train.trained import best_device, build_model, find_run, load_data, load_job, sample_batch, saved

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
    _check_arguments(args)
    if args.input is not None and not args.input.exists():  # said before torch and the model are loaded
        raise DataError(f"--input {args.input}: no such file or folder")

    host = load_plugins()
    with tempfile.TemporaryDirectory(prefix="runjob-predict-") as scratch:
        run = find_run(args.run, args.tracking_uri, Path(scratch))
        require_run_plugins(run, host, "predict")  # its job names what they registered
        # the saved predictor and facts stand in for the data: its files need not be here any more
        job, predictor = (None, None) if args.overrides or args.from_data else saved(run, host)
        splits = None
        if predictor is None:  # a run without a saved predictor, --from-data, --set dataset.KEY: the data, built
            job = load_job(run, args.overrides, host)
            splits, task = load_data(job)
            context = None
            if generates(task):
                context = splits.context or int(task.inputs(sample_batch(splits.val, 1, splits.collate)).shape[-1])
            predictor = Predictor(task, splits.inputs, splits.classes, context, collate=splits.collate)
            if predictor.inputs is None and splits.decode is not None:  # a dataset of the older kind
                predictor.inputs = _Decoder(splits.decode)
        assert job is not None  # saved with the predictor, or loaded above
        task = predictor.task
        if args.prompt is not None and not generates(task):
            raise RunjobError(
                f"--prompt is for a language model; task {job.task.name!r} predicts from --input PATH instead"
            )
        read_inputs = splits.read_inputs if splits is not None else predictor.inputs.dataset
        reader = splits.inputs if splits is not None else predictor.inputs
        if isinstance(reader, Inputs) and read_inputs == reader.dataset:  # messages name the run's dataset
            read_inputs = functools.partial(reader.dataset, dataset_name=job.dataset.name)
        if read_inputs is None:
            raise RunjobError(
                f"dataset {job.dataset.name!r} cannot read inputs for prediction (its plugin gives no "
                "DatasetSplits.inputs or read_inputs)"
            )
        source = args.input
        if args.prompt is not None:
            source = Path(scratch) / "prompt"
            source.write_text(args.prompt, encoding="utf-8")
        inputs = read_inputs(source)
        for note in getattr(inputs, "notes", ()):  # files of the folder that are not of the dataset's kind
            screen.each(f"runjob: {note}", err=True)
        if len(inputs) == 0:
            raise DataError(f"--input {source}: nothing to predict")
        model = build_model(job, run.model_file, run.folder, splits).to(best_device())
        rows = predictor.rows(
            model,
            inputs,
            args.batch_size,
            str(source),
            f"model {job.model.name!r}",
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            seed=args.seed,
        )
    if args.prompt is not None:
        for row in rows:
            row["input"] = "prompt"
    write_rows(rows, args.output)
    if args.output is not None:
        screen.each(f"runjob: {len(rows)} prediction(s) written to {args.output}", err=True)
    return 0


class _Decoder:
    """A dataset's plain ``DatasetSplits.decode`` where it gives no :class:`runjob.Inputs`."""

    decodes = True

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode


def write_rows(rows: list[JSONObject], output: Path | None) -> None:
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
