"""Reading recorded runs back from MLflow: ``runjob runs``, ``runjob diff`` and ``runjob rerun``.

A run's params are its resolved job flattened to dotted keys (``optimizer.lr``), so comparing
params is comparing jobs. ``rerun`` trains a run's recorded ``job.toml`` artifact again.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import shutil
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from runjob.errors import RunjobError, TrackingError
from runjob.job.redaction import HIDDEN
from runjob.record.tracking import RUN_TAGS_ENV, resolve_tracking_uri

KEY_METRICS = ("val/accuracy", "val/loss", "train/loss")  # the final metrics `runs` shows
TABLE_WIDTH = 120  # `runs` shows as many differing job keys as fit in this many characters
KEY_COLUMN_WIDTH = 18
NAME_WIDTH = 20  # experiment and run names in `runs`
VALUE_WIDTH = 50  # values in `diff`
ELLIPSIS = "..."
RERUN_TAG = "runjob.rerun_of"
RERUN_SOURCE = "rerun_source.toml"  # the downloaded job.toml, kept in the new run's output folder


# --- talking to MLflow ---------------------------------------------------------------------------


def open_store(uri: str):
    """An ``MlflowClient`` for ``uri``; a sqlite file that does not exist is an error (MLflow would
    silently create an empty one, and every query would then find nothing)."""
    from mlflow import MlflowClient

    from runjob.record.tracking import check_reachable

    check_reachable(uri, "--tracking-uri or $MLFLOW_TRACKING_URI")
    if uri.lower().startswith("sqlite:"):
        path = uri[len("sqlite:") :].removeprefix("//").partition("?")[0].removeprefix("/")
        if path not in ("", ":memory:") and not Path(path).exists():
            raise TrackingError(
                f"no MLflow database at {uri} ({Path(path).absolute()} does not exist); run where you trained, or give --tracking-uri"
            )
    return MlflowClient(tracking_uri=uri)


@contextlib.contextmanager
def _reading(uri: str) -> Iterator[None]:
    """Turn any failure to read from MLflow into a one-line error naming the store."""
    try:
        yield
    except RunjobError:
        raise
    except Exception as error:  # noqa: BLE001 - unreachable server, bad store: the same to the user
        lines = str(error).strip().splitlines()
        raise TrackingError(
            f"cannot read from MLflow at {uri}: {type(error).__name__}: {lines[0] if lines else ''}"
        ) from None


def get_run(client: Any, uri: str, run_id: str) -> Any:
    """The run ``run_id``; an unknown id is a one-line error."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as error:
        if error.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise RunjobError(f"no run {run_id} at {uri}") from None
        raise


def _all_experiments(client: Any) -> list[Any]:
    experiments, token = [], None
    while True:
        page = client.search_experiments(page_token=token)
        experiments.extend(page)
        token = page.token
        if not token:
            return experiments


def _choose_experiments(experiments: list[Any], name: str | None, uri: str) -> list[Any]:
    """All experiments, or the one called ``name`` (an unknown name lists those that exist)."""
    if name is None:
        return experiments
    chosen = [e for e in experiments if e.name == name]
    if chosen:
        return chosen
    names = sorted(e.name for e in experiments)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    known = ", ".join(names) if names else "none"
    raise RunjobError(f"--experiment {name}: no such experiment at {uri}; {hint}experiments there: {known}")


# --- formatting ------------------------------------------------------------------------------------


def shorten(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the middle replaced by an ellipsis (both ends of a
    path or a dotted key usually matter)."""
    if len(text) <= width:
        return text
    keep = width - len(ELLIPSIS)
    head = (keep + 1) // 2
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head) :]


def render(headers: list[str], rows: list[list[str]], right: set[int] = frozenset(), indent: str = "") -> list[str]:
    """A plain-text table: columns two spaces apart, columns in ``right`` right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows)]
    lines = []
    for row in [headers, *rows]:
        cells = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _number(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _run_duration(info: Any) -> str:
    if not info.start_time:
        return ""
    end = info.end_time or (time.time() * 1000 if info.status == "RUNNING" else None)
    return _duration((end - info.start_time) / 1000) if end else ""


def _start(info: Any) -> str:
    return datetime.fromtimestamp(info.start_time / 1000).strftime("%Y-%m-%d %H:%M") if info.start_time else ""


def differing_keys(params: list[dict[str, str]]) -> list[str]:
    """The keys whose values are not the same in every dict of ``params`` (absent counts as a value)."""
    keys = sorted(set().union(*params))
    return [key for key in keys if len({p.get(key) for p in params}) > 1]


# --- runjob runs -------------------------------------------------------------------------------------


def overview_table(runs: list[Any], experiment_names: dict[str, str]) -> list[str]:
    """The first `runs` table: which run is which (id, experiment, name, status, start, duration)."""
    rows = [
        [
            r.info.run_id,
            shorten(experiment_names.get(r.info.experiment_id, r.info.experiment_id), NAME_WIDTH),
            shorten(r.info.run_name or "", NAME_WIDTH),
            r.info.status,
            _start(r.info),
            _run_duration(r.info),
        ]
        for r in runs
    ]
    return render(["run id", "experiment", "run name", "status", "start", "duration"], rows, right={5})


def _width(columns: list[tuple[str, list[str]]]) -> int:
    return sum(max(len(cell) for cell in [header, *cells]) + 2 for header, cells in columns) - 2


def results_table(runs: list[Any]) -> list[str]:
    """The second `runs` table: per run, the job keys that differ between the runs (as many as fit
    in TABLE_WIDTH) and the final key metrics; then a line naming the keys left out."""
    params = [r.data.params for r in runs]
    # keys every run has first: runs of different jobs also "differ" in every key only one job has
    keys = sorted(differing_keys(params), key=lambda k: sum(k not in p for p in params))
    key_columns = [
        (shorten(k, KEY_COLUMN_WIDTH), [shorten(r.data.params.get(k, "-"), KEY_COLUMN_WIDTH) for r in runs])
        for k in keys
    ]
    metrics = [
        (m, [_number(r.data.metrics.get(m)) for r in runs])
        for m in KEY_METRICS
        if any(m in r.data.metrics for r in runs)
    ]
    ids = [("run id", [r.info.run_id for r in runs])]
    shown = 0
    while shown < len(key_columns) and _width(ids + key_columns[: shown + 1] + metrics) <= TABLE_WIDTH:
        shown += 1
    columns = ids + key_columns[:shown] + metrics
    lines = []
    if len(columns) > 1:
        right = set(range(1 + shown, len(columns)))
        lines = render([h for h, _ in columns], [list(row) for row in zip(*(cells for _, cells in columns))], right)
    left_out = keys[shown:]
    if left_out:
        prefix = f"{len(left_out)} {'more ' if shown else ''}job key(s) differ: "
        hint = " (`runjob diff RUN_A RUN_B` compares two runs in full)"
        names = ", ".join(left_out)
        room = TABLE_WIDTH - len(prefix) - len(hint)
        lines.append(prefix + (names if len(names) <= room else names[: room - len(ELLIPSIS)] + ELLIPSIS) + hint)
    return lines


def cmd_runs(args: argparse.Namespace) -> int:
    """``runjob runs``: the newest runs, the job keys that differ between them, final metrics."""
    if args.limit < 1:
        raise RunjobError(f"--limit {args.limit}: give how many runs to list, 1 or more")
    uri = resolve_tracking_uri(args.tracking_uri)
    client = open_store(uri)
    with _reading(uri):
        experiments = _all_experiments(client)
        chosen = _choose_experiments(experiments, args.experiment, uri)
        ids = [e.experiment_id for e in chosen]
        runs = (
            list(client.search_runs(ids, order_by=["attributes.start_time DESC"], max_results=args.limit))
            if ids
            else []
        )
    if not runs:
        where = f"in experiment {args.experiment} " if args.experiment else ""
        print(f"no runs {where}at {uri}")
        return 0
    results = results_table(runs)
    for line in [
        *overview_table(runs, {e.experiment_id: e.name for e in experiments}),
        *([""] if results else []),
        *results,
    ]:
        print(line)
    if len(runs) == args.limit:
        print(f"(the newest {args.limit}; --limit N lists more)")
    return 0


# --- runjob diff -------------------------------------------------------------------------------------


def param_lines(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The job keys that differ between params ``a`` and ``b``, or one line saying none do."""
    keys = differing_keys([a, b])
    if not keys:
        return [f"job keys: identical ({len(a)} keys)"]
    absent = "(absent)"
    rows = [[key, shorten(a.get(key, absent), VALUE_WIDTH), shorten(b.get(key, absent), VALUE_WIDTH)] for key in keys]
    return [
        f"job keys that differ ({len(keys)} of {len(set(a) | set(b))}):",
        *render(["key", "A", "B"], rows, indent="  "),
    ]


def metric_lines(a: dict[str, float], b: dict[str, float]) -> list[str]:
    """Every final metric of either run: A, B, B - A and the change relative to A."""
    names = sorted(set(a) | set(b), key=lambda name: (name.startswith("system/"), name))
    if not names:
        return ["metrics: none recorded"]
    rows = []
    for name in names:
        va, vb = a.get(name), b.get(name)
        delta = relative = ""
        if va is not None and vb is not None:
            delta = f"{vb - va:+.4g}"
            relative = f"{(vb - va) / abs(va) * 100:+.1f}%" if va != 0 else ""
        rows.append([name, _number(va, 6) or "(absent)", _number(vb, 6) or "(absent)", delta, relative])
    return ["final metrics:", *render(["metric", "A", "B", "B - A", "change"], rows, right={1, 2, 3, 4}, indent="  ")]


def diff_lines(a: Any, b: Any) -> list[str]:
    """The whole `diff` report for runs ``a`` and ``b``."""
    header = [
        f"{label}  {r.info.run_id}  {r.info.run_name or ''}  {r.info.status}" for label, r in (("A", a), ("B", b))
    ]
    return [*header, "", *param_lines(a.data.params, b.data.params), "", *metric_lines(a.data.metrics, b.data.metrics)]


def cmd_diff(args: argparse.Namespace) -> int:
    """``runjob diff RUN_A RUN_B``: the job keys that differ and each final metric's change."""
    uri = resolve_tracking_uri(args.tracking_uri)
    client = open_store(uri)
    with _reading(uri):
        a = get_run(client, uri, args.run_a)
        b = get_run(client, uri, args.run_b)
    for line in diff_lines(a, b):
        print(line)
    return 0


# --- runjob rerun ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block (worker processes inherit them), then restore."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def download_job(uri: str, run_id: str, folder: Path) -> Path:
    """Download run ``run_id``'s ``job.toml`` artifact into ``folder``; its absence is an error."""
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException

    try:
        with _environment({"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}):
            path = download_artifacts(run_id=run_id, artifact_path="job.toml", tracking_uri=uri, dst_path=str(folder))
    except MlflowException as error:
        if error.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise RunjobError(
            f"run {run_id} has no job.toml artifact: it was not made by runjob, or its job.toml is missing"
        ) from None
    return Path(path)


def _is_hidden(value: Any) -> bool:
    if isinstance(value, str):
        return value == HIDDEN or f":{HIDDEN}@" in value  # a hidden key, or a URL's hidden password
    if isinstance(value, list):
        return any(_is_hidden(item) for item in value)
    return False


def hidden_keys(tables: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys of ``tables`` whose values were hidden (``***``) when the job was recorded."""
    keys = []
    for key, value in tables.items():
        if isinstance(value, dict):
            keys.extend(hidden_keys(value, f"{prefix}{key}."))
        elif _is_hidden(value):
            keys.append(f"{prefix}{key}")
    return keys


def _check_secrets_given(job: dict[str, Any], overrides: list[str], run_id: str) -> None:
    """Refuse a job with hidden secrets unless ``--set`` gives each of them (or a table above it)."""
    from runjob.job.jobfile import split_dotted

    given = [".".join(split_dotted(o.partition("=")[0])) for o in overrides]
    missing = [k for k in hidden_keys(job) if not any(k == g or k.startswith(g + ".") for g in given)]
    if missing:
        raise RunjobError(
            f"run {run_id}'s job.toml has secrets hidden as {HIDDEN}: {', '.join(missing)}; give them with --set, e.g. --set {missing[0]}=VALUE"
        )


def _run_tags_env(run_id: str) -> str:
    """``$RUNJOB_RUN_TAGS`` with the rerun tag added to whatever tags it already asks for."""
    text = os.environ.get(RUN_TAGS_ENV) or "{}"
    try:
        tags = json.loads(text)
    except json.JSONDecodeError:
        tags = None
    if not isinstance(tags, dict):
        raise RunjobError(f"${RUN_TAGS_ENV} must be a JSON object of tags, not {text!r}")
    return json.dumps({**tags, RERUN_TAG: run_id})


def _rerun_environment(args: argparse.Namespace, job: dict[str, Any]) -> dict[str, str]:
    """The variables the new run needs: its rerun tag and, when the job names no tracking URI, the
    store the old run was read from (so both runs are in the same place)."""
    values = {RUN_TAGS_ENV: _run_tags_env(args.run_id)}
    recorded_uri = job.get("tracking", {}).get("uri")
    overridden = any(o.partition("=")[0].strip() == "tracking.uri" for o in args.overrides)
    if args.tracking_uri and not recorded_uri:
        values["MLFLOW_TRACKING_URI"] = args.tracking_uri
    elif args.tracking_uri and recorded_uri != args.tracking_uri and not overridden:
        print(
            f"runjob: the job records to tracking.uri = {recorded_uri}, so the new run goes there (--set tracking.uri=URI to change)",
            file=sys.stderr,
        )
    return values


def cmd_rerun(args: argparse.Namespace) -> int:
    """``runjob rerun RUN_ID``: train run RUN_ID's recorded job again, as ``runjob run`` would, with
    any ``--set`` changes; the new run is tagged ``runjob.rerun_of = RUN_ID``."""
    from runjob.commands.cli import LAUNCH_FLAGS, _overrides, cmd_run
    from runjob.host.plugin_host import load_plugins
    from runjob.job.validation import load_resolved
    from runjob.record.outputs import choose_output_dir

    uri = resolve_tracking_uri(args.tracking_uri)
    client = open_store(uri)
    with tempfile.TemporaryDirectory(prefix="runjob-rerun-") as folder:
        with _reading(uri):
            get_run(client, uri, args.run_id)
            downloaded = download_job(uri, args.run_id, Path(folder))
        job = tomllib.loads(downloaded.read_text(encoding="utf-8"))
        _check_secrets_given(job, args.overrides, args.run_id)
        environment = _rerun_environment(args, job)
        run_args = argparse.Namespace(
            job=downloaded, overrides=list(args.overrides), resume=None, **{k: getattr(args, k) for k in LAUNCH_FLAGS}
        )
        resolved = load_resolved(
            downloaded, _overrides(run_args), load_plugins()
        )  # a bad --set fails before any folder is made
        # The copy lives in the new run's folder: the run's runjob.job_file tag and its workers point at it.
        output_dir = choose_output_dir(resolved.job.name, args.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        run_args.job = output_dir / RERUN_SOURCE
        shutil.copyfile(downloaded, run_args.job)
    run_args.output_dir = output_dir
    print(f"runjob: rerunning {args.run_id} from {run_args.job}", file=sys.stderr)
    with _environment(environment):
        return cmd_run(run_args)
