"""The one table of component kinds. Everything that lists kinds (the registration hooks the host
calls, the job-file tables, defaults, ``runjob plugins``) reads it from here, so a new kind is one
row below plus its ``runjob_register_<plural>`` specification in :mod:`runjob.host.hookspecs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runjob.host.callback import CallbackOptions
from runjob.host.components import Inputs, Options
from runjob.host.task import TaskOptions


@dataclass(frozen=True)
class Fact:
    """Something a component states about itself when it is registered (``register(..., NAME=value)``),
    so the host knows it before building anything: ``runjob validate`` warns with it."""

    type: type | tuple[type, ...]
    default: object
    doc: str


@dataclass(frozen=True)
class Kind:
    """A kind of component: its job-file table (``[name]``), the plural that names its registration
    hook, the component used when a job's table names none, the facts its components may state, and
    the base class of their options."""

    name: str
    plural: str
    default: str | None = None
    facts: dict[str, Fact] = field(default_factory=dict)
    options_base: type[Options] = Options
    """What its components' options must subclass (task options declare their metrics)."""
    many: bool = False
    """A job names any number of them, each in its own ``[<plural>.NAME]`` table (callbacks),
    instead of one in ``[name]``."""
    inside: str | None = None
    """The table a job names them in (adapters: ``[model.adapters.NAME]``), instead of a table of
    their own; ``"command"``: no job names them, a command does (export formats); ``"run"``: a
    finished run's saved data names them (inputs classes, in its predictor)."""
    factory_class: type | None = None
    """What the registered "factory" must be a subclass of, when it is a class rather than a
    function (inputs: :class:`runjob.Inputs`)."""

    @property
    def hook(self) -> str:
        """The registration hook's name: ``runjob_register_<plural>``."""
        return f"runjob_register_{self.plural}"


KINDS: tuple[Kind, ...] = (
    Kind("model", "models"),
    Kind("dataset", "datasets"),
    Kind("optimizer", "optimizers", default="adamw"),
    Kind("scheduler", "schedulers", default="none"),
    Kind(
        "strategy",
        "strategies",
        default="ddp",
        facts={
            "needs_gpu": Fact(bool, False, "it runs only on CUDA GPUs (validate warns on a machine without one)"),
            "max_processes": Fact((int, type(None)), None, "the most processes it runs (None: any)"),
        },
    ),
    Kind("task", "tasks", default="classification", options_base=TaskOptions),
    Kind("adapter", "adapters", inside="model"),
    Kind("exporter", "exporters", inside="command"),
    Kind("converter", "converters", inside="command"),
    Kind("inputs", "inputs", inside="run", factory_class=Inputs),
    Kind(
        "callback",
        "callbacks",
        options_base=CallbackOptions,
        many=True,
        facts={
            "on_by_default": Fact(
                bool,
                False,
                "it runs in every job unless the job switches it off ([callbacks.NAME] enabled = false); "
                "its options then need defaults",
            ),
        },
    ),
)
BY_NAME: dict[str, Kind] = {kind.name: kind for kind in KINDS}
NAMES: tuple[str, ...] = tuple(kind.name for kind in KINDS if not kind.many and kind.inside is None)
"""The kinds a job chooses one of, each in its table (``[model] name = ...``)."""
MANY_TABLES: tuple[str, ...] = tuple(kind.plural for kind in KINDS if kind.many)

COMMON_FACTS: dict[str, Fact] = {
    "libraries": Fact(
        tuple,
        (),
        "the distributions it wraps, e.g. ('timm',): a run that uses it is tagged runjob.library.NAME = "
        "the installed version",
    ),
}
"""Facts every kind's components may state."""
"""The tables of kinds a job lists any number of (``[callbacks.NAME]``)."""


def checked_facts(kind: Kind, name: str, given: Mapping[str, object]) -> dict[str, Any]:
    """Every fact of ``kind`` for component ``name``: the ones given, checked, and the defaults.
    Raises TypeError (recorded as the plugin's failure) for a fact the kind does not have."""
    known = {**kind.facts, **COMMON_FACTS}
    unknown = sorted(set(given) - set(known))
    if unknown:
        accepted = ", ".join(known)
        raise TypeError(
            f"{kind.name} {name!r}: register() got unknown fact(s) {', '.join(unknown)}; {kind.plural} take: {accepted}"
        )
    facts: dict[str, object] = {}
    for key, fact in known.items():
        value = given.get(key, fact.default)
        if key == "libraries" and isinstance(value, list):
            value = tuple(value)
        if key == "libraries" and not (
            isinstance(value, tuple) and all(isinstance(item, str) and item for item in value)
        ):
            raise TypeError(f"{kind.name} {name!r}: libraries = {value!r} is not valid ({fact.doc})")
        types = _types(fact)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):  # True is an int
            raise TypeError(f"{kind.name} {name!r}: {key} = {value!r} is not valid ({fact.doc})")
        facts[key] = value
    return facts


def _types(fact: Fact) -> tuple[type, ...]:
    return fact.type if isinstance(fact.type, tuple) else (fact.type,)
