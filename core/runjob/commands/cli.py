"""The ``runjob`` command line. Heavy libraries are imported only by the commands that need them:
``--help`` imports none, ``validate`` and ``plugins`` no torch, accelerate or mlflow."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import os
import shlex
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

import runjob
from runjob.commands.arguments import (
    add_disable_plugin,
    add_job_arguments,
    add_launch_arguments,
    add_overrides,
    add_plugin_argument,
    add_tracking_uri,
)
from runjob.commands.evaluate import add_run_reference
from runjob.commands.plugins import add_plugins_arguments
from runjob.errors import Interrupted, RunjobError, Terminated, user_message
from runjob.host.output import screen
from runjob.record.terminal import guarded
from runjob.tags import RERUN_OF_TAG

COMMANDS: tuple[str, ...] = ("run", "validate", "doctor", "plugins", "runs", "diff", "rerun", "sync", "sweep")
COMMANDS += ("evaluate", "predict", "export")  # using a trained model
COMMANDS += ("data",)  # shards for streamed datasets
LOADING_PLUGINS = ("run", "validate", "doctor", "plugins", "rerun", "sweep", "evaluate", "predict", "export")
"""The commands that load plugins: they take ``--disable-plugin`` after the command name too."""
SHOWING_WARNINGS = ("doctor", "plugins")
"""The commands that list plugin warnings in their report rather than as ``runjob: warning:`` lines."""
WARNED_ENVIRONMENT = "RUNJOB_PLUGIN_WARNINGS_SHOWN"
"""Set while a command runs, so the workers and sweep trials it starts do not repeat its warnings."""

DESCRIPTION = """\
Train from a declarative TOML job file.

  runjob JOB.toml [--set table.key=value]... [--output-dir DIR]   train (same as `runjob run`)
  runjob validate JOB.toml [--set table.key=value]...             check the job, print it resolved
  runjob doctor [JOB.toml] [--json]                               check this machine (GPUs, NCCL, MLflow, plugins)
  runjob plugins                                                  list plugins and their components
  runjob runs [--experiment NAME]                                 table of recorded runs
  runjob diff RUN_A RUN_B                                         job keys and metrics that differ
  runjob rerun RUN_ID [--set table.key=value]...                  run a recorded run's job again
  runjob sync OUTPUT_DIR                                          upload a run's local record to MLflow
  runjob sweep JOB.toml                                           run the job's [sweep] trials
  runjob evaluate RUN [--split val|test]                          evaluate a trained model, record it
  runjob predict RUN --input PATH [--output FILE]                 predictions as CSV or JSON lines
  runjob export RUN --format onnx|pt2|... [--output PATH]         the trained model as ONNX, torch.export, ...

  --disable-plugin NAME (before or after the command; repeatable) or RUNJOB_DISABLE_PLUGINS=NAME,...
  leaves a plugin unloaded. A job picks one plugin's component with name = "PLUGIN:NAME".
  -p PLUGIN (repeatable) or RUNJOB_PLUGINS=PLUGIN,... also loads a plugin that is not installed:
  a module importable from the working directory, or a path/to/file.py.
"""


def _usage_error(message: str) -> NoReturn:
    """A mistake on the command line: one line ``runjob: ...`` and exit 2, as every runjob error."""
    screen.each(f"runjob: {message}", err=True)
    raise SystemExit(2)


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class _VersionAction(argparse.Action):
    """``--version``: runjob's version, read from its installed metadata only when asked for (as
    argparse's own version action would print it; reading it costs every other command ~70 ms)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        print(f"runjob {runjob.__version__}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse with runjob's errors: one line (no usage block) naming the command, exit 2, and the
    closest option for one it does not know (argparse suggests none before Python 3.14). Its
    commands' parsers are of this class too (``add_subparsers`` makes them of the parser's type)."""

    commands: dict[str, _Parser]

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("runjob").strip()
        _usage_error(f"{command + ': ' if command else ''}{message} (see `{self.prog} --help`)")

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.commands.get(getattr(parsed, "command", None) or "", self)
            flags = [extra for extra in extras if extra.startswith("-")]
            if not flags:
                command.error(f"unrecognized arguments: {' '.join(extras)}")
            flag = flags[0].split("=", 1)[0]
            options = [name for action in command._actions for name in action.option_strings if name.startswith("--")]
            elsewhere = [name for name, parser in self.commands.items() if flag in parser._option_string_actions]
            where = f"; it is an option of {', '.join(elsewhere)}" if elsewhere else _did_you_mean(flag, options)
            command.error(f"unknown option {flag}{where}")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="runjob", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_VersionAction, help="show runjob's version and exit")
    # its own dest: a subcommand's defaults would overwrite what was given before the command
    add_disable_plugin(parser, dest="disable_plugins_first")
    add_plugin_argument(parser, dest="plugins_first")
    commands = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")

    run = commands.add_parser(
        "run", help="train the job (the default command)", description="Train the job and record it to MLflow."
    )
    add_job_arguments(run)
    run.add_argument(
        "--output-dir",
        type=Path,
        help="where job.toml, metrics.jsonl and model.safetensors go (default: runs/<job name>/<time>)",
    )
    run.add_argument(
        "--resume",
        nargs="?",
        const=True,
        type=Path,
        metavar="CHECKPOINT",
        help=(
            "continue the run in --output-dir from its newest complete checkpoint (or from CHECKPOINT); "
            "`--resume auto`: the same, or start afresh in --output-dir when it holds no checkpoint yet, so the same "
            "command can be resubmitted after a preemption"
        ),
    )
    run.add_argument(
        "--tag",
        dest="tags",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra MLflow tag for the run (repeatable)",
    )
    run.add_argument(
        "--tracking-uri",
        metavar="URI",
        help=(
            "where to record when the job names no tracking.uri (default: $MLFLOW_TRACKING_URI, else "
            "sqlite:///mlflow.db here)"
        ),
    )
    add_launch_arguments(run)

    validate = commands.add_parser(
        "validate",
        help="check a job without running it and print it resolved",
        description=(
            "Check the job completely and print it, defaults filled in, as TOML. Exit 0 if it can run, 2 if not."
        ),
    )
    add_job_arguments(validate)
    add_launch_arguments(validate)

    doctor = commands.add_parser(
        "doctor",
        help="check this machine for a job: torch, CUDA, GPUs, NCCL, /dev/shm, MLflow, the data's store, plugins",
        description="Check the environment (and, given a job, what it needs). Exit 1 on a blocking problem.",
    )
    doctor.add_argument("job", type=Path, nargs="?", help="a job file to check the environment against (optional)")
    add_overrides(doctor)
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")

    plugins = commands.add_parser(
        "plugins",
        help="list plugins, their versions and what they register",
        description="List every plugin, its distribution and version, and the components it registers.",
    )
    add_plugins_arguments(plugins)

    uri_default = "$MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here"
    runs = commands.add_parser(
        "runs",
        help="list recorded runs: status, the job keys that differ, final metrics",
        description=(
            "List MLflow runs with their status, the job keys that differ between them and their final metrics."
        ),
    )
    runs.add_argument("--experiment", metavar="NAME", help="only this experiment's runs (default: all experiments)")
    runs.add_argument("--limit", type=int, default=20, metavar="N", help="the newest N runs (default: 20)")
    add_tracking_uri(runs, uri_default)

    diff = commands.add_parser(
        "diff",
        help="compare two runs: the job keys that differ and the metric deltas",
        description="Show the job keys whose values differ between two runs, and each final metric with B - A.",
    )
    diff.add_argument("run_a", metavar="RUN_A", help="MLflow run id")
    diff.add_argument("run_b", metavar="RUN_B", help="MLflow run id")
    add_tracking_uri(diff, uri_default)

    rerun = commands.add_parser(
        "rerun",
        help="run a recorded run's job.toml again, tagged as its rerun",
        description=(
            "Fetch RUN_ID's job.toml from MLflow and train it again (with any --set changes); the new run is tagged "
            f"{RERUN_OF_TAG}=RUN_ID."
        ),
    )
    rerun.add_argument("run_id", metavar="RUN_ID", help="MLflow run id")
    add_overrides(rerun)
    rerun.add_argument(
        "--output-dir", type=Path, help="where the new run's outputs go (default: runs/<job name>/<time>)"
    )
    add_tracking_uri(rerun, uri_default)
    add_launch_arguments(rerun)

    sync = commands.add_parser(
        "sync",
        help="upload a run's local record (OUTPUT_DIR) to MLflow",
        description=(
            "Upload everything a run recorded in OUTPUT_DIR (params, tags, every metric point, artifacts, status) to "
            "MLflow. Safe to repeat: nothing is logged twice."
        ),
    )
    sync.add_argument("output_dir", type=Path, metavar="OUTPUT_DIR", help="the run's output folder")
    add_tracking_uri(sync, "the one the run recorded")

    sweep = commands.add_parser(
        "sweep",
        help="run the trials of the job's [sweep] table under one parent MLflow run",
        description=(
            "Run the trials of the job's [sweep] table, an Optuna study in durable storage, each a child MLflow run of "
            "one parent run, with several workers on this machine (--workers), on other machines (--join), and "
            "continue a stopped sweep (--resume); report the best."
        ),
    )
    add_job_arguments(sweep)
    sweep.add_argument(
        "--output-dir", type=Path, help="where the sweep's trials go (default: runs/<job name>-sweep/<time>)"
    )
    sweep.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help="trials run at once on this machine, each on its own GPUs ([sweep] gpus_per_trial) or its share of "
        "the CPU cores (default: one per gpus_per_trial GPUs, else 1)",
    )
    joining = sweep.add_mutually_exclusive_group()
    joining.add_argument(
        "--join",
        metavar="SWEEP",
        help="work on an existing sweep: its folder (created by the first worker when it holds none yet), its parent "
        "MLflow run id, or its Optuna storage URL ([sweep] study names the study)",
    )
    joining.add_argument(
        "--resume",
        metavar="SWEEP",
        help="continue a stopped sweep in its folder (its study and parent run; interrupted trials resume from "
        "their checkpoints); 'auto' with --output-dir: that, or a new sweep there",
    )
    add_trained_model_commands(commands, uri_default)
    for name in LOADING_PLUGINS:
        add_disable_plugin(commands.choices[name])
        add_plugin_argument(commands.choices[name])
    parser.commands = commands.choices
    return parser


def positive_int(text: str) -> int:
    """``--workers N``: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of 1 or more (got {text!r})")
    return value


def add_trained_model_commands(commands: argparse._SubParsersAction[_Parser], uri_default: str) -> None:
    """``evaluate``, ``predict`` and ``export``: using a finished run's model."""
    evaluate = commands.add_parser(
        "evaluate",
        help="evaluate a finished run's model on its validation or test split; record it as a new MLflow run",
        description=(
            "Rebuild RUN's job and model with its final weights, evaluate a split with the task's metrics, print "
            "them and record them as a new MLflow run tagged runjob.evaluated_from=RUN."
        ),
    )
    add_run_reference(evaluate)
    evaluate.add_argument("--split", choices=("val", "test"), default="val", help="the split (default: val)")
    add_overrides(evaluate)
    evaluate.add_argument("--no-record", action="store_true", help="print the metrics only, record no MLflow run")
    add_tracking_uri(evaluate, f"the run's own store; {uri_default}")

    predict = commands.add_parser(
        "predict",
        help="a finished run's predictions for new inputs, as CSV or JSON lines",
        description=(
            "Predict with RUN's model: image files, a CSV of the feature columns, or text to continue, read as its "
            "dataset reads them. Classification: class and probability; regression: values; a language model: a "
            "continuation of each prompt."
        ),
    )
    add_run_reference(predict)
    predict.add_argument("--input", type=Path, metavar="PATH", help="a file or folder of inputs")
    predict.add_argument("--prompt", metavar="TEXT", help="text for a language model to continue (instead of --input)")
    predict.add_argument(
        "--output", type=Path, metavar="FILE", help="FILE.csv or FILE.jsonl (default: JSON lines on stdout)"
    )
    predict.add_argument("--batch-size", type=int, default=64, metavar="N", help="inputs per batch (default: 64)")
    predict.add_argument(
        "--max-new-tokens", type=int, default=100, metavar="N", help="a language model's continuation length (100)"
    )
    predict.add_argument(
        "--temperature", type=float, default=0.0, help="0 (default): the most likely token each time; above 0: sampled"
    )
    predict.add_argument("--seed", type=int, default=0, help="seed of the sampling (default: 0)")
    predict.add_argument(
        "--from-data",
        action="store_true",
        help="read inputs as the run's dataset does, building it from the run's job (its files must be here), "
        "instead of the predictor the run saved",
    )
    add_overrides(predict)
    add_tracking_uri(predict, uri_default)

    export = commands.add_parser(
        "export",
        help="a finished run's model as an ONNX file or a torch.export program, checked against the original",
        description=(
            "Export RUN's model with its final weights and check the file on a batch of the validation split "
            "(onnxruntime for ONNX, loading it back for pt2), printing the largest difference."
        ),
    )
    add_run_reference(export)
    export.add_argument(
        "--format",
        required=True,
        metavar="FORMAT",
        help="onnx (needs the onnx extra), pt2, or a format a plugin registers (runjob-hf: hf); see `runjob plugins`",
    )
    export.add_argument(
        "--output",
        type=Path,
        metavar="FILE",
        help="where to write it (default: model.onnx / model.pt2 in the run's output folder, else here)",
    )
    export.add_argument(
        "--atol", type=float, default=1e-4, help="largest difference accepted, relative to the outputs' scale (1e-4)"
    )
    add_tracking_uri(export, uri_default)

    data = commands.add_parser(
        "data",
        help="convert a data set into shards streamed from an object store or a folder",
        description=(
            "Data for streamed datasets (streamed_images, streamed_table, streamed_text): "
            "`runjob data convert SOURCE LOCATION --from NAME`."
        ),
    )
    data_commands = data.add_subparsers(dest="data_command", metavar="{convert}", required=True)
    convert = data_commands.add_parser(
        "convert",
        help="write a data set as shards to s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or a local folder",
        description=(
            "Write SOURCE, read by the converter --from names (images: an image folder; table: a CSV or Parquet "
            "file; text: text files; `runjob plugins --long` lists them), as LitData shards to LOCATION, one folder "
            "per split, and runjob.json last (no run reads a location without it). "
            "Run again after an interruption: a finished conversion of the same source is left as it is. "
            "Credentials come from the environment (AWS_* variables, a profile, the instance's role; "
            "GOOGLE_APPLICATION_CREDENTIALS)."
        ),
    )
    convert.add_argument(
        "source", help="what to convert: an image folder (train/<class>/, val/<class>/), a table, text files"
    )
    convert.add_argument("location", help="s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or a local folder")
    convert.add_argument(
        "--from",
        dest="source_kind",
        default="images",
        metavar="NAME",
        help="the converter that reads SOURCE (default images; built in: images, table, text)",
    )
    convert.add_argument(
        "-o",
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help='an option of the converter (repeat; VALUE as in TOML: 0.2, true, ["a", "b"]), e.g. -o target=label',
    )
    convert.add_argument(
        "--endpoint-url", metavar="URL", help="an S3-compatible store (MinIO, Ceph, R2); default $AWS_ENDPOINT_URL"
    )
    convert.add_argument(
        "--chunk-bytes",
        default="auto",
        metavar="SIZE",
        help="the size of each shard; auto: a split's size over 16, from 1MB to 64MB (enough shards for the workers)",
    )
    convert.add_argument(
        "--workers",
        type=int,
        default=max(1, min(8, os.cpu_count() or 1)),
        metavar="N",
        help="processes reading and writing (the CPU count, at most 8)",
    )
    convert.add_argument(
        "--overwrite", action="store_true", help="replace a finished conversion of other data at LOCATION"
    )


def _print_problems(message: str) -> None:
    for line in message.splitlines():
        screen.each(f"runjob: {line}", err=True)


# the module that carries out each command, imported only when that command runs
MODULES = {"runs": "runs", "diff": "runs"}


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function that carries out command ``name``: ``cmd_<name>`` in ``runjob.commands.<module>``."""
    module = importlib.import_module(f"runjob.commands.{MODULES.get(name, name)}")
    command: Callable[[argparse.Namespace], int] = getattr(module, f"cmd_{name}")
    return command


BEFORE_COMMAND = ("--disable-plugin", "--plugin", "--help", "--version")
"""The options ``runjob`` takes before the command (and ``-h``)."""


def _with_default_command(argv: list[str]) -> list[str]:
    """``argv`` with ``run`` put before a job file given without a command (after any
    ``--disable-plugin NAME`` or ``-p PLUGIN`` in front). A first word close to a command's name that names no job
    file (none is there, and it does not end in .toml) is a misspelt command, and an unknown option
    before the command a misspelt one: each a one-line error saying the closest name."""
    start = 0
    while start < len(argv) and argv[start].startswith("-") and argv[start] != "-h":
        flag = argv[start].split("=", 1)[0]
        if flag.startswith("-p") and not flag.startswith("--"):  # -p PLUGIN, or -pPLUGIN in one word
            start += 1 if len(flag) > 2 or "=" in argv[start] else 2
            continue
        known = [name for name in BEFORE_COMMAND if name.startswith(flag)]  # argparse takes a unique prefix
        if known not in (["--disable-plugin"], ["--plugin"]):
            if known or flag == "--":
                return argv  # --help, --version: argparse answers them
            _usage_error(
                f"unknown option {flag} before the command{_did_you_mean(flag, BEFORE_COMMAND)} (a command's "
                "options go after it: see `runjob COMMAND --help`)"
            )
        start += 1 if "=" in argv[start] else 2
    if start < len(argv) and argv[start] not in COMMANDS and not argv[start].startswith("-"):
        word = argv[start]
        close = difflib.get_close_matches(word, COMMANDS, n=1)
        if close and not word.endswith(".toml") and not Path(word).exists():
            _usage_error(f"{word}: no such command; did you mean {close[0]!r}? Commands: {', '.join(COMMANDS)}")
        return [*argv[:start], "run", *argv[start:]]
    return argv


@contextlib.contextmanager
def _plugin_settings(args: argparse.Namespace) -> Iterator[None]:
    """While the command runs: the ``--disable-plugin`` names in ``$RUNJOB_DISABLE_PLUGINS``, so
    every load of plugins, here and in the processes the command starts (launched workers, sweep
    trials), leaves them out; the ``-p`` plugins, imported here (one that cannot be is refused
    before anything runs), in ``$RUNJOB_PLUGINS`` as every process loads them from any folder; and
    each plugin warning printed once as ``runjob: warning: ...``."""
    args.disable_plugins = [*args.disable_plugins_first, *getattr(args, "disable_plugins", [])]
    args.plugins = [*args.plugins_first, *getattr(args, "plugins", [])]
    if args.command not in LOADING_PLUGINS:
        yield
        return
    # lazy: `runjob --help` imports this module and stays quick: plugin_host pulls pydantic (+1.5 s)
    from runjob.host.plugin_host import DISABLE_ENVIRONMENT, PLUGINS_ENVIRONMENT, PluginWarning, disabled_plugins

    names = (DISABLE_ENVIRONMENT, PLUGINS_ENVIRONMENT, WARNED_ENVIRONMENT)
    saved = {name: os.environ.get(name) for name in names}
    quiet = args.command in SHOWING_WARNINGS or WARNED_ENVIRONMENT in os.environ
    shown: set[str] = set()
    print_warning = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if not issubclass(category, PluginWarning):
            print_warning(message, category, filename, lineno, file, line)
        elif not quiet and str(message) not in shown:
            shown.add(str(message))
            screen.each(f"runjob: warning: {message}", err=True)

    try:
        if args.disable_plugins:  # an unknown name is refused here, before anything runs
            os.environ[DISABLE_ENVIRONMENT] = ",".join(disabled_plugins(args.disable_plugins))
        if args.plugins or os.environ.get(PLUGINS_ENVIRONMENT):
            # lazy: `runjob --help` imports this module and stays quick: plugin_host pulls pydantic (+1.5 s)
            from runjob.host.plugin_host import local_plugins

            local = local_plugins(args.plugins)
            os.environ[PLUGINS_ENVIRONMENT] = ",".join(plugin.spec for plugin in local)
        os.environ[WARNED_ENVIRONMENT] = "1"
        with warnings.catch_warnings():
            warnings.simplefilter("always", PluginWarning)
            warnings.showwarning = show
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


STARTING_PROCESSES = ("run", "rerun", "sweep")
"""The commands whose processes (launched workers, sweep workers and trials) print commands to paste."""


@contextlib.contextmanager
def _started_as(command: str) -> Iterator[None]:
    """While a command that starts processes runs: how the user started runjob, in
    ``$RUNJOB_COMMAND`` for those processes, so the commands they print (a trial's resume, `runjob
    sync`) start as the user's did (``uv run runjob``), not as runjob started them."""
    # lazy: `runjob --help` imports this module and stays quick: +11 ms
    from runjob.record.invocation import ENVIRONMENT, command_prefix

    if command not in STARTING_PROCESSES or os.environ.get(ENVIRONMENT):
        yield
        return
    os.environ[ENVIRONMENT] = shlex.join(command_prefix())
    try:
        yield
    finally:
        os.environ.pop(ENVIRONMENT, None)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``runjob`` command; returns the exit code. Its output may meet a reader
    that has gone (``| tee`` ended by the same Ctrl-C, a closed SSH session): that never changes
    how the command ends (:mod:`runjob.record.terminal`)."""
    with guarded():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    argv = _with_default_command(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from runjob.record.logfile import LibraryLog  # lazy: `runjob --help` imports this module and stays quick: +40 ms

    try:
        # the libraries' INFO chatter (MLflow creating a new store's tables) is not the user's: a run
        # keeps it in its runjob.log; other commands drop it (their warnings are still printed)
        with _plugin_settings(args), _started_as(args.command), LibraryLog("command"):
            return _command(args.command)(args)
    except RunjobError as error:
        _print_problems(user_message(error))
        return error.exit_code
    except KeyboardInterrupt as interrupted:  # a run's second Ctrl-C (Interrupted) says how to go on
        _print_problems("\n".join(interrupted.said() if isinstance(interrupted, Interrupted) else ["interrupted"]))
        return 130
    except Terminated as stopped:
        _print_problems("\n".join(stopped.said()))
        return 128 + stopped.signum
    except Exception:  # not a user's mistake: show where it happened
        traceback.print_exc()
        screen.each(
            "runjob: failed with an unexpected error (a bug in runjob or in a plugin; the traceback above shows where)",
            err=True,
        )
        return 1
