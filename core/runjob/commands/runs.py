"""``runjob runs`` and ``runjob diff``: recorded runs read back from MLflow.

A run's params are its resolved job flattened to dotted keys (``optimizer.lr``), so comparing
params is comparing jobs.
"""

from __future__ import annotations

import argparse
import difflib
import json
import time
from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING

from runjob.commands.table import ELLIPSIS, FIGURES, figure, recorded_value, render, shorten
from runjob.errors import RunjobError
from runjob.record.naming import SEPARATOR
from runjob.record.store import all_experiments, get_run, open_store, reading
from runjob.record.uri import resolve_tracking_uri
from runjob.tags import METRICS_TAG, SWEEP_KEYS_TAG, SWEEP_TAG

if TYPE_CHECKING:
    from mlflow.entities import Experiment, Run, RunInfo

TABLE_WIDTH = 120  # `runs` shows as many differing job keys as fit in this many characters
KEY_COLUMN_WIDTH = 18
NAME_WIDTH = 20  # experiment names in `runs`
RUN_NAME_WIDTH = 28  # run names in `runs`: cut at the end, their start is what tells them apart
VALUE_WIDTH = 50  # values in `diff`
JOB_NAME_KEY = "job.name"  # the param that says which job a run ran (a sweep's parent run has none)
CALLBACKS_TABLE = "callbacks."
ENABLED_FLAG = ".enabled"  # every callback's option; true (on) where a run's record leaves it out


def _choose_experiments(experiments: list[Experiment], name: str | None, uri: str) -> list[Experiment]:
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


def _number(value: float | None, digits: int = FIGURES) -> str:
    return figure(value, digits)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _run_duration(info: RunInfo) -> str:
    if not info.start_time:
        return ""
    end = info.end_time or (time.time() * 1000 if info.status == "RUNNING" else None)
    return _duration((end - info.start_time) / 1000) if end else ""


def _start(info: RunInfo) -> str:
    return datetime.fromtimestamp(info.start_time / 1000).strftime("%Y-%m-%d %H:%M") if info.start_time else ""


def differing_keys(params: list[dict[str, str]]) -> list[str]:
    """The keys whose values are not the same in every dict of ``params`` (absent counts as a value)."""
    keys = sorted(set().union(*params))
    return [key for key in keys if len({p.get(key) for p in params}) > 1]


def set_differently(params: list[dict[str, str]]) -> list[str]:
    """The keys of :func:`differing_keys` less those that differ only in whether a run's record
    has them at their default, which nobody set: a callback's ``enabled`` flag, true where a run
    has it (a run that lists ``[callbacks.early_stopping]`` records
    ``callbacks.early_stopping.enabled = true``, a run that doesn't has no such key; runs recorded
    before default callbacks were left out have ``callbacks.throughput.enabled = true``). The
    other options' defaults are the plugins' to know, so an option one run has and another not
    still differs, as does ``enabled = false`` anywhere."""
    return [key for key in differing_keys(params) if not _on_wherever_recorded(key, params)]


def _on_wherever_recorded(key: str, params: list[dict[str, str]]) -> bool:
    """Whether ``key`` is a callback's ``enabled`` flag that every run of ``params`` has true or not at all."""
    if not (key.startswith(CALLBACKS_TABLE) and key.endswith(ENABLED_FLAG) and key.count(".") >= 2):
        return False
    return all(p[key].strip().lower() == "true" for p in params if key in p)


def swept_keys(params: list[dict[str, str]], tags: list[dict[str, str]]) -> list[str]:
    """The job keys the sweeps of the trials among these runs vary (their ``runjob.sweep.keys``
    tag), each sweep's in its order, the sweeps in the order their trials are listed; only keys
    some run has. Empty when no run is such a trial (a tag that is not a JSON list is passed over)."""
    keys: dict[str, None] = {}
    for run_tags in tags:
        try:
            listed = json.loads(run_tags[SWEEP_KEYS_TAG])
        except (KeyError, ValueError, TypeError):
            continue
        if isinstance(listed, list):
            keys.update(dict.fromkeys(key for key in listed if isinstance(key, str)))
    return [key for key in keys if any(key in p for p in params)]


# --- runjob runs -------------------------------------------------------------------------------------


def overview_table(runs: list[Run], experiment_names: dict[str, str]) -> list[str]:
    """The first `runs` table: which run is which (id, experiment, name, status, start, duration)."""
    rows = [
        [
            r.info.run_id,
            shorten(experiment_names.get(r.info.experiment_id, r.info.experiment_id), NAME_WIDTH),
            _run_name_cell(r.info.run_name or "", r.data.params.get(JOB_NAME_KEY)),
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


def _run_name_cell(name: str, job_name: str | None) -> str:
    """A run's name in RUN_NAME_WIDTH characters, cut at its end; a name runjob gave
    (``lr=0.003162 bs=64 wd=0.0001 · digits``: what the run varies, then its job's name) without
    `` · JOB`` where keeping it would cut into what the run varies (the experiment column
    usually names the job)."""
    suffix = f"{SEPARATOR}{job_name}" if job_name else None
    if len(name) > RUN_NAME_WIDTH and suffix and name.endswith(suffix) and len(name) > len(suffix):
        varies = name[: -len(suffix)]
        if len(varies) + len(SEPARATOR) > RUN_NAME_WIDTH - len(ELLIPSIS):
            return _start_of(varies, RUN_NAME_WIDTH)
    return _start_of(name, RUN_NAME_WIDTH)


def _value_cell(text: str) -> str:
    """A job key's value in a column: a number to the significant digits of the metrics beside it
    (a sampled learning rate as the run's name says it), anything else cut in the middle."""
    return shorten(recorded_value(text), KEY_COLUMN_WIDTH)


def key_headers(keys: list[str]) -> list[str]:
    """Each key's column header in KEY_COLUMN_WIDTH characters: the key; too long, without its
    first parts while two are left (``callbacks.throughput.enabled`` -> ``throughput.enabled``: a
    cut in the middle would leave ``callback...enabled``, the same for every callback); still too
    long, the last part whole after what fits of the one before (``opt...weight_decay``,
    ``early_s...patience``). A header two keys would share is each whole key cut in the middle."""
    headers = [_key_header(key) for key in keys]
    taken = Counter(headers)
    return [h if taken[h] == 1 else shorten(key, KEY_COLUMN_WIDTH) for h, key in zip(headers, keys, strict=True)]


def _key_header(key: str) -> str:
    parts = key.split(".")
    for first in range(len(parts) - 1):
        tail = ".".join(parts[first:])
        if len(tail) <= KEY_COLUMN_WIDTH:
            return tail
    last = parts[-1]
    room = KEY_COLUMN_WIDTH - len(ELLIPSIS) - len(last)  # what is left of the part before the last
    if len(parts) > 1 and room > 0:
        return parts[-2][:room] + ELLIPSIS + last
    return shorten(key, KEY_COLUMN_WIDTH)


def chosen_keys(params: list[dict[str, str]], tags: list[dict[str, str]]) -> tuple[list[str], list[str]]:
    """The job keys `runs` shows for runs with these ``params`` and ``tags``: the keys the sweeps
    of the trials among them vary (:func:`swept_keys`, in the sweeps' order), and the others set
    differently (:func:`set_differently`) in runs of the same job (``job.name``), not against a
    sweep's parent run (``runjob.sweep = "true"``: it never counts) or another job's runs; where
    no two runs share a job, those set differently between the jobs' runs. Keys every run has
    first."""
    kept = [p for p, t in zip(params, tags, strict=True) if t.get(SWEEP_TAG) != "true"]
    jobs: dict[str | None, list[dict[str, str]]] = {}
    for p in kept:
        jobs.setdefault(p.get(JOB_NAME_KEY), []).append(p)
    keys = [key for runs in jobs.values() if len(runs) > 1 for key in set_differently(runs)]
    if not keys and kept:
        keys = set_differently([p for p in kept if JOB_NAME_KEY in p] or kept)
    swept = swept_keys(kept, tags)
    # keys every run has first: runs of different jobs also "differ" in every key only one job has
    return swept, sorted(set(keys) - set(swept), key=lambda k: (sum(k not in p for p in kept), k))


def _width(columns: list[tuple[str, list[str]]]) -> int:
    return sum(max(len(cell) for cell in [header, *cells]) + 2 for header, cells in columns) - 2


def key_metrics(runs: list[Run]) -> list[str]:
    """The metrics the runs' tasks declared, in order of first appearance, then ``train/loss``."""
    names: dict[str, None] = {}
    for run in runs:
        try:
            declared = list(json.loads(run.data.tags[METRICS_TAG]))
        except (KeyError, ValueError, TypeError):  # recorded before tasks declared metrics: what it evaluated
            declared = sorted(name for name in run.data.metrics if name.startswith("val/"))
        names.update(dict.fromkeys(declared))
    return [*names, "train/loss"]


def results_table(runs: list[Run]) -> list[str]:
    """The second `runs` table: per run, the job keys that differ between runs of the same job
    (:func:`chosen_keys`; the keys a sweep varies always, the others as many as fit in
    TABLE_WIDTH) and the final key metrics; then a line naming the keys left out."""
    swept, others = chosen_keys([r.data.params for r in runs], [r.data.tags for r in runs])
    keys = [*swept, *others]
    key_columns = [
        (header, [_value_cell(r.data.params.get(k, "-")) for r in runs])
        for header, k in zip(key_headers(keys), keys, strict=True)
    ]
    metrics = [
        (m, [_number(r.data.metrics.get(m)) for r in runs])
        for m in key_metrics(runs)
        if any(m in r.data.metrics for r in runs)
    ]
    ids = [("run id", [r.info.run_id for r in runs])]
    shown = len(swept)  # the keys a sweep varies tell its trials apart: shown whatever the width
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


def diff_lines(a: Run, b: Run) -> list[str]:
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
