"""What a run is called and what it records about itself, chosen so runs read apart in ``mlflow ui``.

MLflow's runs table shows only the start of a run's name (measured with MLflow 3.17: about 21
characters, 14 for a sweep's trials, indented under their parent), so a default name leads with
what tells the run from its siblings, abbreviated (``lr=0.003162 bs=64``). The run's params
leave out what nobody set (the options of the callbacks on by default, at their defaults), and
the metrics the job is judged by go to MLflow first (:func:`headline_metrics`): the compare view's
parallel-coordinates plot opens on the first metric a run logged.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from runjob.job.jobfile import parse_override_value, split_dotted
from runjob.job.redaction import redact_override, redact_tables
from runjob.record.local import flatten
from runjob.tags import METRICS_TAG

if TYPE_CHECKING:
    from runjob.job.jobfile import Tables
    from runjob.job.validation import ResolvedJob
    from runjob.record.local import MetricLine

NAME_LIMIT = 100  # characters; a longer default name is cut, its start kept
SEPARATOR = " · "
# the usual short forms of long key names; any other key is shown by its last part
ABBREVIATIONS = {
    "batch_size": "bs",
    "weight_decay": "wd",
    "learning_rate": "lr",
    "label_smoothing": "ls",
    "gradient_accumulation_steps": "accum",
    "warmup_steps": "warmup",
}
NOT_NAMING = ("tracking.", "launch.")  # where a run is recorded and how it is launched don't tell the training apart


def run_name(overrides: list[str], fallback: str, job_name: str, only: set[str] | None = None) -> str:
    """The default MLflow run name: the ``--set`` ``overrides`` abbreviated (``lr=0.003162
    bs=64``; not ``tracking.*`` or ``launch.*``; only the keys in ``only`` when given: a sweep
    trial's own), or ``fallback`` when there are none; then `` · `` and the job's name."""
    values = given_values(overrides)
    values = {k: v for k, v in values.items() if not k.startswith(NOT_NAMING) and (only is None or k in only)}
    name = f"{abbreviate(values) or fallback}{SEPARATOR}{job_name}"
    return name if len(name) <= NAME_LIMIT else name[: NAME_LIMIT - 1] + "…"


def given_values(overrides: list[str]) -> dict[str, str]:
    """``["optimizer.lr=0.1", ...]`` -> ``{"optimizer.lr": "0.1"}``, secrets hidden; a key given
    twice keeps its last value (as the job does)."""
    values: dict[str, str] = {}
    for override in overrides:
        key, sep, value = redact_override(override).partition("=")
        if sep:
            dotted = ".".join(split_dotted(key.strip()))
            values.pop(dotted, None)  # the place of its last setting
            values[dotted] = value.strip()
    return values


def abbreviate(values: dict[str, str]) -> str:
    """``{"optimizer.lr": "0.0031622776", "train.batch_size": "64"}`` -> ``lr=0.003162 bs=64``."""
    short = short_keys(list(values))
    return " ".join(f"{short[key]}={short_value(text)}" for key, text in values.items())


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each dotted key's short form: its last part (``optimizer.lr`` -> ``lr``, ``train.max_steps``
    -> ``max_steps``), a usual one in its short form (``train.batch_size`` -> ``bs``,
    ``optimizer.weight_decay`` -> ``wd``), a component's name by its table (``model.name`` ->
    ``model``); keys whose short forms would be the same stay whole (``model.dropout`` and
    ``dataset.dropout``)."""
    short = {key: _short(key) for key in keys}
    taken = Counter(short.values())
    return {key: key if taken[short[key]] > 1 else short[key] for key in keys}


def _short(key: str) -> str:
    parts = key.split(".")
    if parts[-1] == "name" and len(parts) > 1:  # a component's choice: TABLE.name=X -> TABLE=X
        return parts[-2]
    return ABBREVIATIONS.get(parts[-1], parts[-1])


def short_value(text: str) -> str:
    """A value as a name shows it: numbers to 4 significant digits, strings without quotes, lists
    and tables as compact TOML-like text."""
    return _shown(parse_override_value(text))


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if isinstance(value, list):
        return "[" + ",".join(_shown(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}={_shown(v)}" for k, v in value.items()) + "}"
    return str(value)


def recorded_params(job: ResolvedJob) -> dict[str, str]:
    """The run's MLflow params: the resolved job as dotted keys, secrets hidden, without what
    nobody set (:func:`job_params`)."""
    defaults = {
        name: chosen.component.options().model_dump(mode="json", exclude_none=True)
        for name, chosen in job.callbacks.items()
        if chosen.component.facts.get("on_by_default")
    }
    return flatten(job_params(redact_tables(job.to_dict()), defaults))


def job_params(tables: Tables, default_callbacks: dict[str, Tables]) -> Tables:
    """``tables`` (the resolved job, secrets hidden) without what nobody set: the options of the
    callbacks on by default that are at their defaults (``default_callbacks``: name -> default
    options), ``callbacks.throughput.enabled = true`` and the like. A default callback switched off, or
    an option changed, is kept."""
    tables = dict(tables)
    callbacks = dict(tables.get("callbacks") or {})
    for name, defaults in default_callbacks.items():
        options = callbacks.get(name)
        if options is None:
            continue
        changed = {key: value for key, value in options.items() if key not in defaults or defaults[key] != value}
        if changed:
            callbacks[name] = changed
        else:
            del callbacks[name]
    if callbacks:
        tables["callbacks"] = callbacks
    else:
        tables.pop("callbacks", None)
    return tables


def headline_metrics(params: dict[str, str], tags: dict[str, str]) -> list[str]:
    """The metrics a run is judged by, most important first: ``train.best_metric``, then the
    metrics the task declares (the ``runjob.metrics`` tag)."""
    names = [params["train.best_metric"]] if params.get("train.best_metric") else []
    try:
        names += list(json.loads(tags.get(METRICS_TAG) or "{}"))
    except ValueError:
        pass
    return list(dict.fromkeys(names))


def headline_first(points: list[MetricLine], headline: list[str]) -> list[MetricLine]:
    """Metric points with the headline metrics' points first (in ``headline``'s order), the others
    after them in the order they came: MLflow lists a run's metrics in the order their keys
    first reached it."""
    rank = {name: index for index, name in enumerate(headline)}
    return sorted(points, key=lambda point: rank.get(point["key"], len(rank)))


class HeadlineFirst:
    """Holds a new run's first metric points on their way to MLflow until the headline metrics
    come (the first evaluation) or ``WAIT_S`` have passed, then gives them back headline first, so
    they are the first metrics MLflow knows for the run (the compare view opens on those)."""

    WAIT_S = 60.0  # the longest MLflow's charts of a new run wait for its first points

    def __init__(self, headline: list[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.headline = headline
        self._clock = clock
        self._until = clock() + self.WAIT_S
        self._held: list[MetricLine] | None = [] if headline else None

    def take(self, points: list[MetricLine]) -> list[MetricLine]:
        """The points to send now: ``points`` themselves once nothing is held; else none until a
        headline point comes or the wait is over, then every point held."""
        if self._held is None:
            return points
        self._held += points
        if any(p["key"] in self.headline for p in points) or self._clock() >= self._until:
            return self.release()
        return []

    def release(self) -> list[MetricLine]:
        """Every point held, headline first; nothing is held after this."""
        held, self._held = self._held or [], None
        return headline_first(held, self.headline)
