"""How a run's model is built, the same way wherever it is built: in training, for ``evaluate``,
``predict`` and ``export``, and when its MLflow model is loaded. The model's factory is called with
its options and, when it takes them, the dataset's :class:`~runjob.host.components.DataFacts`
(saved with the run as ``data_facts.json``); then the job's adapters (``[model.adapters.NAME]``)
are applied in order. Imports no torch: the factories and adapters do.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from runjob.errors import ComponentError, DataError, describe, first_line
from runjob.host.components import Adapter, Component, DataFacts, Factory, Options, ReportedFactory
from runjob.host.run_folder import RunFolder
from runjob.tags import library_tag

if TYPE_CHECKING:
    import torch

    from runjob.job.validation import Chosen

T = TypeVar("T")


def takes_data(factory: Factory) -> bool:
    """Whether a model factory takes the :class:`DataFacts` as a second positional parameter."""
    target = factory.factory if isinstance(factory, ReportedFactory) else factory
    try:
        parameters = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable: called the old way
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


def build_model(factory: Factory, options: Options, data: DataFacts | None) -> torch.nn.Module:
    """Call a model factory with its options, and the data's facts when it takes them."""
    model: torch.nn.Module = (
        factory(options, data if data is not None else DataFacts()) if takes_data(factory) else factory(options)
    )
    return model


def build_each(chosen: Mapping[str, Chosen], expected: type[T], what: str) -> dict[str, T]:
    """Each component of ``chosen`` (the job's callbacks, its adapters) built from its options, by
    name, in order; a factory that returns something else than ``expected`` is one line naming
    the component and its plugin."""
    made: dict[str, T] = {}
    for name, entry in chosen.items():
        built = entry.component.factory(entry.options)
        if not isinstance(built, expected):
            raise ComponentError(
                f"{what} {name!r} (plugin {entry.component.plugin}): its factory returned a "
                f"{type(built).__name__}, not a runjob.{expected.__name__}"
            )
        made[name] = built
    return made


def make_adapters(adapters: Mapping[str, Chosen]) -> dict[str, Adapter]:
    """The job's adapters built from their options, by name, in order."""
    return build_each(adapters, Adapter, "adapter")  # type: ignore[type-abstract]  # checked with isinstance only


def apply_adapters(
    model: torch.nn.Module, adapters: Mapping[str, Adapter], places: Mapping[str, str] | None = None
) -> torch.nn.Module:
    """``model`` with each adapter applied in order; an adapter that fails (a layer the model
    lacks) is one line naming its table and, from ``places``, where the job names it."""
    for name, adapter in adapters.items():
        try:
            model = adapter.apply(model)
        except Exception as error:  # noqa: BLE001 - a target the model lacks is the job's mistake
            where = f"{places[name]}: " if places and name in places else ""
            raise ComponentError(f"{where}[model.adapters.{name}]: {describe(error)}") from error
    return model


def adapter_places(adapters: Mapping[str, Chosen]) -> dict[str, str]:
    """Where the job names each adapter (``job.toml:12``), for messages."""
    places = {}
    for name, chosen in adapters.items():
        factory = chosen.component.factory
        if isinstance(factory, ReportedFactory):
            places[name] = factory.where
    return places


def merge_adapters(model: torch.nn.Module, adapters: Mapping[str, Adapter]) -> torch.nn.Module:
    """The plain model with the adapters folded in, last applied first."""
    for adapter in reversed(list(adapters.values())):
        model = adapter.merge(model)
    return model


def rebuild_model(
    model: Chosen, adapters: Mapping[str, Chosen], folder: Path | None
) -> tuple[torch.nn.Module, dict[str, Adapter]]:
    """A run's model as training built it, before its weights are loaded: its factory with the
    facts saved in ``folder`` (the run's output folder or a copy of its files), then its adapters."""
    facts = read_facts(folder) if folder is not None else None
    made = make_adapters(adapters)
    built = build_model(model.component.factory, model.options, facts)
    return apply_adapters(built, made, adapter_places(adapters)), made


def write_facts(output_dir: Path, facts: DataFacts) -> Path:
    """``OUTPUT_DIR/data_facts.json``."""
    path = RunFolder(output_dir).data_facts
    path.write_text(json.dumps(facts.to_dict(), indent=1) + "\n", encoding="utf-8")
    return path


def read_facts(folder: Path) -> DataFacts | None:
    """The facts a run saved, or ``None`` for a run from before they were saved."""
    path = RunFolder(folder).data_facts
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(values, dict):
            raise ValueError(f"a JSON {type(values).__name__}, not an object")
        return DataFacts.checked(values)
    except (UnicodeDecodeError, ValueError) as error:  # JSON's and pydantic's errors are ValueErrors
        raise DataError(f"{path}: not the data facts runjob saved ({first_line(error)})") from None


def library_versions(components: list[Component]) -> dict[str, str]:
    """``runjob.library.NAME``: the installed version of each library the components state they wrap."""
    tags = {}
    for component in components:
        for library in component.facts.get("libraries", ()):
            try:
                tags[library_tag(library)] = metadata.version(library)
            except metadata.PackageNotFoundError:
                tags[library_tag(library)] = "not installed"
    return tags
