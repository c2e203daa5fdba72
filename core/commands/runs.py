"""``runjob runs`` and ``runjob diff``: recorded runs read back from MLflow.

A run's params are its resolved job flattened to dotted keys (``optimizer.lr``), so comparing
params is comparing jobs.
"""

from __future__ import annotations

import argparse
import difflib
import json
import time
from datetime import datetime
from typing import Any

from runjob.commands.table import ELLIPSIS, render, shorten
from runjob.errors import RunjobError
from runjob.record.store import all_experiments, get_run, open_store, reading
from runjob.record.uri import resolve_tracking_uri

TABLE_WIDTH = 120  # `runs` shows as many differing job keys as fit in this many characters
KEY_COLUMN_WIDTH = 18
NAME_WIDTH = 20  # experiment names in `runs`
RUN_NAME_WIDTH = 28  # run names in `runs`: cut at the end, their start is what tells them apart
VALUE_WIDTH = 50  # values in `diff`
JOB_NAME_KEY = "job.name"  # the param that says which job a run ran (a sweep's parent run has none)


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
            _start_of(r.info.run_name or "", RUN_NAME_WIDTH),
            r.info.status,
            _start(r.info),
            _run_duration(r.info),
        ]
        for r in runs
    ]
    return render(["run id", "experiment", "run name", "status", "start", "duration"], rows, right={5})


def _start_of(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters at its end (a run's name leads with what tells it apart)."""
    return text if len(text) <= width else text[: width - len(ELLIPSIS)] + ELLIPSIS


def _value_cell(text: str) -> str:
    """A job key's value in a column: a long number to 6 significant digits (a sampled learning
    rate), anything else cut in the middle."""
    if len(text) > KEY_COLUMN_WIDTH:
        try:
            text = f"{float(text):.6g}"
        except ValueError:
            pass
    return shorten(text, KEY_COLUMN_WIDTH)


def chosen_keys(params: list[dict[str, str]]) -> list[str]:
    """The job keys `runs` shows for runs with these ``params``: those whose values differ between
    runs of the same job (``job.name``), not against a sweep's parent run (which has no job keys)
    or another job's runs; where no two runs share a job, those that differ between the jobs' runs.
    Keys every run has first."""
    jobs: dict[str | None, list[dict[str, str]]] = {}
    for p in params:
        jobs.setdefault(p.get(JOB_NAME_KEY), []).append(p)
    keys = [key for runs in jobs.values() if len(runs) > 1 for key in differing_keys(runs)]
    if not keys:
        keys = differing_keys([p for p in params if JOB_NAME_KEY in p] or params)
    # keys every run has first: runs of different jobs also "differ" in every key only one job has
    return sorted(dict.fromkeys(keys), key=lambda k: (sum(k not in p for p in params), k))


def _width(columns: list[tuple[str, list[str]]]) -> int:
    return sum(max(len(cell) for cell in [header, *cells]) + 2 for header, cells in columns) - 2


def key_metrics(runs: list[Any]) -> list[str]:
    """The metrics the runs' tasks declared, in order of first appearance, then ``train/loss``."""
    names: dict[str, None] = {}
    for run in runs:
        try:
            declared = list(json.loads(run.data.tags["runjob.metrics"]))
        except (KeyError, ValueError, TypeError):  # recorded before tasks declared metrics: what it evaluated
            declared = sorted(name for name in run.data.metrics if name.startswith("val/"))
        names.update(dict.fromkeys(declared))
    return [*names, "train/loss"]


def results_table(runs: list[Any]) -> list[str]:
    """The second `runs` table: per run, the job keys that differ between runs of the same job
    (:func:`chosen_keys`; as many as fit in TABLE_WIDTH) and the final key metrics; then a line
    naming the keys left out."""
    keys = chosen_keys([r.data.params for r in runs])
    key_columns = [(shorten(k, KEY_COLUMN_WIDTH), [_value_cell(r.data.params.get(k, "-")) for r in runs]) for k in keys]
    metrics = [
        (m, [_number(r.data.metrics.get(m)) for r in runs])
        for m in key_metrics(runs)
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
        lines = render(
            [h for h, _ in columns], [list(row) for row in zip(*(cells for _, cells in columns), strict=True)], right
        )
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
    with reading(uri):
        experiments = all_experiments(client)
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
    with reading(uri):
        a = get_run(client, uri, args.run_a)
        b = get_run(client, uri, args.run_b)
    for line in diff_lines(a, b):
        print(line)
    return 0
