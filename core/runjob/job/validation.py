"""Checking a whole job before anything runs: host tables, component names and their options.

Every problem is collected (not just the first), each naming the file, line and dotted key.
"""

from __future__ import annotations

import datetime
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import tomli_w
from pydantic import BaseModel, ValidationError

from runjob.errors import JobError, Problem
from runjob.host.components import Component, Options, reported
from runjob.host.json_types import JSONObject
from runjob.host.kinds import BY_NAME as KINDS
from runjob.host.kinds import MANY_TABLES
from runjob.host.kinds import NAMES as COMPONENT_TABLES
from runjob.host.plugin_host import ComponentLookupError, PluginHost
from runjob.host.task import EVALUATION_PREFIXES, declared_metrics
from runjob.job.jobfile import RawJob, Tables, load_job, override_origin
from runjob.job.keys import flat
from runjob.job.schema import (
    HOST_TABLES,
    SWEEP_TABLE,
    TABLE_ORDER,
    JobTable,
    LaunchTable,
    LoaderOptions,
    ModelSetup,
    OptimizerSetup,
    ParamGroup,
    SweepRange,
    SweepTable,
    TrackingTable,
    TrainTable,
)

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

_HOST_MODELS: dict[str, type[Options]] = {
    "job": JobTable,
    "train": TrainTable,
    "launch": LaunchTable,
    "tracking": TrackingTable,
}
# runjob's own keys in a component's table, beside the component's options (as LoaderOptions in [dataset])
_SETUP_MODELS: dict[str, type[Options]] = {"model": ModelSetup, "optimizer": OptimizerSetup}

_Table = TypeVar("_Table", bound=Options)


@dataclass(frozen=True)
class Chosen:
    """A component the job selected, with its validated options."""

    component: Component
    options: Options

    @property
    def name(self) -> str:
        return self.component.name


@dataclass
class ResolvedJob:
    """A job that passed every check, with all defaults filled in."""

    source: RawJob
    job: JobTable
    train: TrainTable
    launch: LaunchTable
    tracking: TrackingTable
    loader: LoaderOptions
    model: Chosen
    dataset: Chosen
    optimizer: Chosen
    scheduler: Chosen
    strategy: Chosen
    task: Chosen
    callbacks: dict[str, Chosen] = field(default_factory=dict)
    """The callbacks on by default, then the job's ``[callbacks.NAME]`` tables in the job file's
    order, by NAME as written; switched-off ones included (see :meth:`enabled_callbacks`)."""
    metrics: dict[str, str] = field(default_factory=dict)
    """Every metric the run can report (the task's for each split, the callbacks', ``train/loss``),
    with the direction that is better, ``"max"`` or ``"min"``."""
    sweep: SweepTable | None = None
    """The ``[sweep]`` table, for ``runjob sweep``; not part of the job itself (nor of ``to_dict``)."""
    model_setup: ModelSetup = field(default_factory=ModelSetup)
    """``[model]``'s runjob keys: ``init_from``, ``freeze``."""
    optimizer_setup: OptimizerSetup = field(default_factory=OptimizerSetup)
    """``[optimizer]``'s runjob keys: ``groups``, ``no_decay_norm_and_bias``."""
    adapters: dict[str, Chosen] = field(default_factory=dict)
    """``[model.adapters.NAME]``: the adapters applied to the model after ``init_from``, in order."""

    def enabled_callbacks(self) -> dict[str, Chosen]:
        """The callbacks that run (``enabled`` not switched off), in the order they are called."""
        return {name: chosen for name, chosen in self.callbacks.items() if chosen.options.enabled}  # type: ignore[attr-defined]

    def to_dict(self) -> JSONObject:
        """The resolved job as job-file tables; reading it back gives the same job."""
        tables: JSONObject = {}
        for table in TABLE_ORDER:
            if table in MANY_TABLES:
                if self.callbacks:
                    tables[table] = {key: _dump(chosen.options) for key, chosen in self.callbacks.items()}
                continue
            if table in COMPONENT_TABLES:
                chosen: Chosen = getattr(self, table)
                values = {"name": chosen.name, **_dump(chosen.options)}
                if table == "dataset":
                    values.update(_dump(self.loader))
                if table in _SETUP_MODELS:  # only the keys set: a job without them reads as it always did
                    setup: BaseModel = getattr(self, f"{table}_setup")
                    values.update(setup.model_dump(mode="json", exclude_defaults=True))
                if table == "model" and self.adapters:
                    values[ADAPTERS_KEY] = {name: _dump(chosen.options) for name, chosen in self.adapters.items()}
            else:
                values = _dump(getattr(self, table))
            tables[table] = values
        return tables

    def to_toml(self) -> str:
        """The resolved job as TOML text."""
        return tomli_w.dumps(self.to_dict())


def _dump(model: BaseModel) -> JSONObject:
    dumped: JSONObject = model.model_dump(mode="json", exclude_none=True)
    return dumped


def _problems_from(
    error: ValidationError, table: str, raw: RawJob, accepted: list[str], also: tuple[str, ...] = ()
) -> list[Problem]:
    problems = []
    for item in error.errors():
        key = ".".join([table, *(str(part) for part in item["loc"])])
        origin = raw.origin(key)
        problems.append(Problem(origin.file, key, _describe(item, accepted, also), origin.line))
    return problems


def _describe(item: ErrorDetails, accepted: list[str], also: tuple[str, ...] = ()) -> str:
    kind = item["type"]
    if kind == "extra_forbidden":
        field = str(item["loc"][-1])
        close = difflib.get_close_matches(field, [*accepted, *also], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        return f"unknown key{hint} Accepted keys: {', '.join(accepted) if accepted else 'none'}"
    if kind == "missing":
        return "required, but not given"
    message = item["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if not item["loc"]:  # a check across several keys of the table
        return message
    return f"{message} (got {item['input']!r})"


def _check(model: type[_Table], values: Tables, table: str, raw: RawJob, problems: list[Problem]) -> _Table | None:
    try:
        return model.model_validate(values)
    except ValidationError as error:
        accepted = sorted(model.model_fields)
        if table in COMPONENT_TABLES:
            accepted = ["name", *accepted]
        if table == "dataset":
            accepted = sorted({*accepted, *LoaderOptions.model_fields})
        also: tuple[str, ...] = ()
        if model is OptimizerSetup:  # its own keys are split off by name: an unknown key is inside a group
            accepted = sorted(ParamGroup.model_fields)
        elif table in _SETUP_MODELS:  # runjob's own keys of the table are accepted too
            own = {*model.model_fields, *_SETUP_MODELS[table].model_fields}
            accepted = ["name", *sorted(own | ({ADAPTERS_KEY} if table == "model" else set()))]
        problems.extend(_problems_from(error, table, raw, accepted, also))
        return None


def _component_table(raw: RawJob, table: str, problems: list[Problem]) -> Tables | None:
    value = raw.data.get(table, {})
    if not isinstance(value, dict):
        origin = raw.origin(table)
        problems.append(Problem(origin.file, table, f"must be a table ([{table}]), got {value!r}", origin.line))
        return None
    return dict(value)


def _choose(raw: RawJob, host: PluginHost, table: str, problems: list[Problem], checked: bool = True) -> Chosen | None:
    values = _component_table(raw, table, problems)
    if values is None:
        return None
    name = values.pop("name", KINDS[table].default)
    if name is None:
        origin = raw.origin(table)
        known = ", ".join(sorted(host.components[table]))
        problems.append(
            Problem(origin.file, f"{table}.name", f"required: which {table} to use, one of: {known}", origin.line)
        )
        return None
    if not isinstance(name, str):
        origin = raw.origin(f"{table}.name")
        problems.append(Problem(origin.file, f"{table}.name", f"must be a string, got {name!r}", origin.line))
        return None
    try:
        component = host.lookup(table, name)
    except ComponentLookupError as error:
        origin = raw.origin(f"{table}.name")
        problems.append(Problem(origin.file, f"{table}.name", str(error), origin.line))
        return None
    if table == "dataset":
        values = {k: v for k, v in values.items() if k not in LoaderOptions.model_fields}
    if table in _SETUP_MODELS:
        values = {k: v for k, v in values.items() if k not in _SETUP_MODELS[table].model_fields}
    if table == "model":
        values.pop(ADAPTERS_KEY, None)
    if not checked:  # taken as written: what they name (files, folders) need not be here
        return Chosen(_reported(component, table, raw), component.options.model_construct(**values))
    options = _check(component.options, values, table, raw, problems)
    return Chosen(_reported(component, table, raw), options) if options is not None else None


def _reported(component: Component, table: str, raw: RawJob) -> Component:
    """``component`` whose factory's failure names ``[table]`` and where the job names it (the
    line of its ``name``, else of its table; a callback on by default and not in the job: the job file).
    Where ``--set`` overrides changed the table's keys, those overrides instead, in the order given:
    a problem found only as the component is built (the data loads) is the job file's as checked
    without them, so most likely theirs, and a job-file line would send the user to the wrong place."""
    given = [override_origin(text).file for text in raw.overrides]
    overrides = {
        origin.file
        for key, origin in raw.origins.items()
        if origin.from_override and (key == table or key.startswith(f"{table}."))
    }
    if overrides:
        order = {text: index for index, text in enumerate(given)}
        return reported(component, table, ", ".join(sorted(overrides, key=lambda text: order.get(text, len(order)))))
    origin = raw.origin(f"{table}.name") if f"{table}.name" in raw.origins else raw.origin(table)
    where = f"{origin.file}:{origin.line}" if origin.line else origin.file
    return reported(component, table, where)


def resolve(raw: RawJob, host: PluginHost, unchecked: tuple[str, ...] = ()) -> ResolvedJob:
    """Check ``raw`` completely against the host's tables and the registered components; the
    options of the component tables named in ``unchecked`` are taken as written (a finished run's
    ``[dataset]`` when its data is not needed: its files may be gone).

    Raises :class:`JobError` with every problem found.
    """
    problems: list[Problem] = []
    known_tables = (*TABLE_ORDER, SWEEP_TABLE)
    for table, value in raw.data.items():
        if table not in known_tables:
            origin = raw.origin(table)
            close = difflib.get_close_matches(table, known_tables, n=1)
            hint = f"did you mean [{close[0]}]? " if close else ""
            what = "table" if isinstance(value, dict) else "top-level key"
            problems.append(
                Problem(
                    origin.file,
                    table,
                    f"unknown {what}; {hint}Job files have the tables {', '.join(known_tables)}",
                    origin.line,
                )
            )

    host_tables: dict[str, Options | None] = {}
    for table in HOST_TABLES:
        values = _component_table(raw, table, problems)
        host_tables[table] = _check(_HOST_MODELS[table], values, table, raw, problems) if values is not None else None

    chosen = {table: _choose(raw, host, table, problems, table not in unchecked) for table in COMPONENT_TABLES}
    dataset_values = _component_table(raw, "dataset", []) or {}
    loader_values = {k: v for k, v in dataset_values.items() if k in LoaderOptions.model_fields}
    loader = _check(LoaderOptions, loader_values, "dataset", raw, problems)
    setups = {}
    for table, setup_model in _SETUP_MODELS.items():
        table_values = _component_table(raw, table, []) or {}
        setup_values = {k: v for k, v in table_values.items() if k in setup_model.model_fields}
        setups[f"{table}_setup"] = _check(setup_model, setup_values, table, raw, problems)
    sweep = _check_sweep(raw, problems)
    adapters = choose_adapters(raw, host, problems)
    before = len(problems)
    callbacks = _choose_callbacks(raw, host, problems)
    task = chosen["task"]
    metrics = _declared_by(task, raw, problems) if task is not None else None
    if task is not None and metrics and len(problems) == before:  # a callback in error may be what declares a metric
        metrics.update(_callback_metrics(callbacks, metrics, raw, problems))
        train = host_tables["train"]
        if isinstance(train, TrainTable):  # None when [train] has problems
            host_tables["train"] = _best_metric(train, metrics, task.name, raw, problems)
        if sweep is not None:
            sweep = _sweep_metric(sweep, metrics, task.name, raw, problems)

    if problems:
        given = {override_origin(text).file: index for index, text in enumerate(raw.overrides)}
        # the job file's problems first, in line order; then its bases'; then the overrides', as given
        raise JobError(
            sorted(problems, key=lambda p: (p.file != str(raw.path), given.get(p.file, -1), p.file, p.line or 0))
        )
    # without problems every table was checked: none of these is None
    tables: Tables = {"loader": loader, **host_tables, **chosen, **setups}
    return ResolvedJob(source=raw, sweep=sweep, callbacks=callbacks, metrics=metrics or {}, adapters=adapters, **tables)


ADAPTERS_KEY = "adapters"


def choose_adapters(raw: RawJob, host: PluginHost, problems: list[Problem]) -> dict[str, Chosen]:
    """The job's ``[model.adapters.NAME]`` tables in order: each NAME a registered adapter, its
    keys that adapter's options."""
    model = raw.data.get("model", {})
    value = model.get(ADAPTERS_KEY, {}) if isinstance(model, dict) else {}
    where = f"model.{ADAPTERS_KEY}"
    if not isinstance(value, dict):
        origin = raw.origin(where)
        problems.append(Problem(origin.file, where, f"must be tables [{where}.NAME], got {value!r}", origin.line))
        return {}
    chosen: dict[str, Chosen] = {}
    for name, (component, checked) in _named_tables(raw, host, "adapter", where, value, problems).items():
        origin = raw.origin(f"{where}.{name}")
        where_named = f"{origin.file}:{origin.line}" if origin.line else origin.file
        chosen[name] = Chosen(reported(component, f"{where}.{name}", where_named), checked)
    return chosen


def _named_tables(
    raw: RawJob, host: PluginHost, kind: str, where: str, value: Tables, problems: list[Problem]
) -> dict[str, tuple[Component, Options]]:
    """``[WHERE.NAME]`` tables (callbacks, adapters): each NAME a registered component of ``kind``,
    its keys that component's options, checked; the problems found are added to ``problems``."""
    listed: dict[str, tuple[Component, Options]] = {}
    for name, options in value.items():
        key = f"{where}.{name}"
        origin = raw.origin(key)
        if not isinstance(options, dict):
            message = f"must be a table of the {kind}'s options ([{key}]), got {options!r}"
            problems.append(Problem(origin.file, key, message, origin.line))
            continue
        try:
            component = host.lookup(kind, name)
        except ComponentLookupError as error:
            problems.append(Problem(origin.file, key, str(error), origin.line))
            continue
        checked = _check(component.options, options, key, raw, problems)
        if checked is not None:
            listed[name] = (component, checked)
    return listed


def task_metrics(task: Chosen) -> dict[str, str]:
    """Every metric a run of ``task`` can report with its better direction ("max" or "min"): the
    task's declared metrics for the validation and the test split, and the training loss."""
    metrics: dict[str, str] = {}
    for prefix in EVALUATION_PREFIXES:
        metrics.update(declared_metrics(task.options, prefix))
    metrics["train/loss"] = "min"
    return metrics


def _declared_by(task: Chosen, raw: RawJob, problems: list[Problem]) -> dict[str, str] | None:
    """:func:`task_metrics`, or a problem at ``task.name`` when the task's plugin declares none
    (or fails to say), so a broken plugin is reported like any other job problem."""
    try:
        metrics = task_metrics(task)
        valid = all(isinstance(k, str) and v in ("max", "min") for k, v in metrics.items())
        if valid and len(metrics) > 1:
            return metrics
        message = f"task {task.name!r} declares no metrics, or not as name -> 'max' or 'min': {metrics}"
    except Exception as error:  # noqa: BLE001 - a plugin's bug is a problem with the job, not a traceback
        message = f"task {task.name!r}: its options' metrics() failed: {type(error).__name__}: {error}"
    origin = raw.origin("task.name")
    problems.append(Problem(origin.file, "task.name", f"{message} (plugin {task.component.plugin})", origin.line))
    return None


def _not_declared(value: str, whose: str, accepted: list[str]) -> str:
    close = difflib.get_close_matches(value, accepted, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{value!r} is not a metric of {whose}; {hint}it reports: {', '.join(accepted)}"


def _best_metric(
    train: TrainTable, metrics: dict[str, str], task: str, raw: RawJob, problems: list[Problem]
) -> TrainTable:
    """``train.best_metric`` checked against the task's validation metrics; by default its first."""
    validation = [name for name in metrics if name.startswith("val/")]
    if train.best_metric is None:
        return train.model_copy(update={"best_metric": validation[0]})
    if train.best_metric not in validation:
        origin = raw.origin("train.best_metric")
        message = _not_declared(train.best_metric, f"task {task!r}", validation)
        problems.append(Problem(origin.file, "train.best_metric", message, origin.line))
    return train


def _sweep_metric(
    sweep: SweepTable, metrics: dict[str, str], task: str, raw: RawJob, problems: list[Problem]
) -> SweepTable:
    """``[sweep] metric`` checked against what the task reports, with its direction filled in."""
    metric = sweep.metric or next(iter(metrics))
    if metric not in metrics:
        origin = raw.origin(f"{SWEEP_TABLE}.metric")
        message = _not_declared(metric, f"task {task!r} or the callbacks", list(metrics))
        problems.append(Problem(origin.file, f"{SWEEP_TABLE}.metric", message, origin.line))
        return sweep
    declared = "maximize" if metrics[metric] == "max" else "minimize"
    if sweep.direction is not None and sweep.direction != declared:
        origin = raw.origin(f"{SWEEP_TABLE}.direction")
        better = "higher" if declared == "maximize" else "lower"
        message = (
            f"{sweep.direction!r} is the wrong way for {metric}: task {task!r} says {better} is better "
            f"(direction = {declared!r}, or leave it out)"
        )
        problems.append(Problem(origin.file, f"{SWEEP_TABLE}.direction", message, origin.line))
    return sweep.model_copy(update={"metric": metric, "direction": declared})


def _choose_callbacks(raw: RawJob, host: PluginHost, problems: list[Problem]) -> dict[str, Chosen]:
    """The callbacks of the job: first those registered ``on_by_default`` (with the options of
    their table when the job has one), then the job's ``[callbacks.NAME]`` tables in order; each
    NAME a registered callback, its keys that callback's options. Switched-off ones (``enabled =
    false``) are kept, so the resolved job written out and read back stays off."""
    value = raw.data.get("callbacks", {})
    if not isinstance(value, dict):
        origin = raw.origin("callbacks")
        message = f"must be tables [callbacks.NAME], got {value!r}"
        problems.append(Problem(origin.file, "callbacks", message, origin.line))
        return {}
    listed = _named_tables(raw, host, "callback", "callbacks", value, problems)
    chosen: dict[str, Chosen] = {}
    for component in host.default_components("callback"):
        same = (component.plugin, component.name)
        written = next((name for name, (c, _) in listed.items() if (c.plugin, c.name.rpartition(":")[2]) == same), "")
        written = written or component.name
        picked = listed.pop(written, None)
        options = picked[1] if picked else component.options()
        chosen[written] = Chosen(_reported(component, f"callbacks.{written}", raw), options)
    chosen.update(
        {
            name: Chosen(_reported(component, f"callbacks.{name}", raw), options)
            for name, (component, options) in listed.items()
        }
    )
    owner: str | None = None
    for name, callback in chosen.items():
        if not (getattr(callback.options, "owns_model", False) and callback.options.enabled):  # type: ignore[attr-defined]
            continue
        if owner is not None:
            where = f"callbacks.{name}"
            origin = raw.origin(where)
            message = (
                f"callbacks {owner!r} and {name!r} both replace the weights that are evaluated and saved; "
                "switch on one of them"
            )
            problems.append(Problem(origin.file, where, message, origin.line))
        owner = owner or name
    return chosen


def _callback_metrics(
    callbacks: dict[str, Chosen], declared: dict[str, str], raw: RawJob, problems: list[Problem]
) -> dict[str, str]:
    """What the callbacks log, added to ``declared``; then every metric a callback reads checked."""
    callbacks = {name: chosen for name, chosen in callbacks.items() if chosen.options.enabled}  # type: ignore[attr-defined]
    logged: dict[str, str] = {}
    for chosen in callbacks.values():
        logged.update(chosen.options.metrics())  # type: ignore[attr-defined]
    known = {**declared, **logged}
    for name, chosen in callbacks.items():
        for key, metric in chosen.options.watches().items():  # type: ignore[attr-defined]
            if metric not in known:
                where = f"callbacks.{name}.{key}"
                origin = raw.origin(where)
                message = _not_declared(metric, "the task or the callbacks", list(known)).replace(
                    "it reports", "they report"
                )
                problems.append(Problem(origin.file, where, message, origin.line))
    return logged


def _check_sweep(raw: RawJob, problems: list[Problem]) -> SweepTable | None:
    """The ``[sweep]`` table checked on its own (keys, method, parameters' shapes, grid size), or
    None when there is none. Whether each value fits the job is checked by :mod:`runjob.sweep`."""
    if SWEEP_TABLE not in raw.data:
        return None
    values = _component_table(raw, SWEEP_TABLE, problems)
    if values is None:
        return None
    found = len(problems)
    parameters = _sweep_parameters(raw, values.pop("parameters", None), values.get("method", "grid"), problems)
    table = _check(SweepTable, {**values, "parameters": parameters}, SWEEP_TABLE, raw, problems)
    if table is not None and table.method == "grid" and table.trials is not None:
        combinations = math.prod([len(choices) for choices in parameters.values() if isinstance(choices, list)])
        if table.trials < combinations:
            origin = raw.origin(f"{SWEEP_TABLE}.trials")
            message = (
                f"the grid has {combinations} combinations, more than trials = {table.trials}: raise trials or leave "
                "it out to run them all"
            )
            problems.append(Problem(origin.file, f"{SWEEP_TABLE}.trials", message, origin.line))
    return table if len(problems) == found else None


def _sweep_parameters(
    raw: RawJob, value: Any, method: Any, problems: list[Problem]
) -> dict[str, list[Any] | SweepRange]:
    """``[sweep.parameters]`` as dotted job key -> list of values or range; problems appended."""
    where = f"{SWEEP_TABLE}.parameters"
    origin = raw.origin(where)
    if not isinstance(value, dict) or not value:
        what = "required" if value is None else f"must be a non-empty table (got {value!r})"
        problems.append(
            Problem(
                origin.file,
                where,
                f'{what}: the job keys to sweep and what to try, e.g. "optimizer.lr" = [0.1, 0.01]',
                origin.line,
            )
        )
        return {}
    parameters: dict[str, list[Any] | SweepRange] = {}
    for key, spec in _flatten_parameters(value).items():
        dotted = f"{where}.{key}"
        origin = raw.origin(dotted)
        if isinstance(spec, list) and spec and (dated := _dated(spec)) is not None:
            message = (
                f"{dated.isoformat()} is a TOML date or time: a trial gets its values as JSON (strings, numbers, "
                f"booleans, arrays, tables); quote it (got {spec!r})"
            )
            problems.append(Problem(origin.file, dotted, message, origin.line))
        elif isinstance(spec, list) and spec:
            parameters[key] = spec
        elif isinstance(spec, dict) and spec and method == "grid":
            message = (
                f'a range needs method = "random", "tpe", "cmaes" or "gp"; a grid takes a list of values to try '
                f"(got {spec!r})"
            )
            problems.append(Problem(origin.file, dotted, message, origin.line))
        elif isinstance(spec, dict) and spec:
            found: list[Problem] = []
            checked = _check(SweepRange, spec, dotted, raw, found)
            # keys inside an inline table have no line of their own: use the parameter's
            problems.extend(Problem(p.file, p.key, p.message, p.line or origin.line) for p in found)
            if checked is not None:
                parameters[key] = checked
        else:
            message = (
                "must be a non-empty list of values to try, or a range { low = ..., high = ..., log = false } (got "
                f"{spec!r})"
            )
            problems.append(Problem(origin.file, dotted, message, origin.line))
    return parameters


def _dated(value: object) -> datetime.date | datetime.time | None:
    """The first TOML date, date-time or time in ``value`` (a swept value, its arrays and tables)."""
    if isinstance(value, datetime.date | datetime.time):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((found for item in items if (found := _dated(item)) is not None), None)


def _flatten_parameters(table: Tables) -> dict[str, object]:
    """``{"optimizer": {"lr": [...]}}`` (unquoted dotted keys) -> ``{"optimizer.lr": [...]}``;
    a table with ``low`` or ``high`` is a range, not a level of keys."""
    return flat(table, leaf=lambda value: bool({"low", "high"} & value.keys()))


def load_resolved(path: str | Path, overrides: list[str] | tuple[str, ...], host: PluginHost) -> ResolvedJob:
    """Read ``path`` with ``overrides`` and check it completely; raises JobError."""
    return resolve(load_job(path, overrides), host)


def load_model_table(path: str | Path, host: PluginHost) -> Chosen:
    """Only the ``[model]`` table of the job in ``path``, checked: enough to build the model
    where the rest of the job (its data, above all) is not at hand, as when a logged MLflow model
    is loaded on another machine. Raises JobError."""
    return load_table(path, host, "model")


def load_table(path: str | Path, host: PluginHost, kind: str) -> Chosen:
    """Only the table of ``kind`` (``"model"``, ``"task"``) of the job in ``path``, checked, with
    the kind's default component when the job has no such table. Raises JobError."""
    raw = load_job(path, [])
    problems: list[Problem] = []
    chosen = _choose(raw, host, kind, problems)
    if chosen is None:
        raise JobError(problems)
    return chosen


def load_model_adapters(path: str | Path, host: PluginHost) -> dict[str, Chosen]:
    """The ``[model.adapters.NAME]`` tables of the job in ``path``, checked (with
    :func:`load_model_table`: what rebuilds a run's model). Raises JobError."""
    problems: list[Problem] = []
    adapters = choose_adapters(load_job(path, []), host, problems)
    if problems:
        raise JobError(problems)
    return adapters


Job = ResolvedJob
"""The public name of a resolved job, ``runjob.Job``: what ``run.job`` is to a callback, a hook or a task."""
