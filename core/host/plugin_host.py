"""Loading plugins and the registries of components they provide.

Built-in and third-party plugins are found the same way: through the ``runjob`` entry-point group.
Each plugin is imported, registered and asked for its components on its own, so one that fails is
recorded by name and only matters to a job that needs what it would have provided.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from runjob.host import hookspecs
from runjob.host.components import Component, NoOptions, Options
from runjob.host.kinds import BY_NAME, KINDS, checked_facts

ENTRY_POINT_GROUP = "runjob"


@dataclass
class PluginInfo:
    """A loaded plugin: its entry-point name, distribution, version and what it registered."""

    name: str
    distribution: str
    version: str
    module: str
    hooks: list[str] = field(default_factory=list)
    registers: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class PluginFailure:
    """A plugin that could not be loaded, and why (one line)."""

    name: str
    distribution: str
    version: str
    error: str


class ComponentLookupError(LookupError):
    """A job names a component that cannot be used; the message says why and what exists."""


class PluginHost:
    """The plugin manager plus every component registered, by kind and name."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self.manager.add_hookspecs(hookspecs)
        self.plugins: list[PluginInfo] = []
        self.failures: list[PluginFailure] = []
        self.components: dict[str, dict[str, Component]] = {kind.name: {} for kind in KINDS}
        self.duplicates: dict[tuple[str, str], list[Component]] = {}

    @property
    def hook(self) -> Any:
        """Call training event hooks: ``host.hook.runjob_after_step(run=..., ...)``."""
        return self.manager.hook

    def add_plugin(self, plugin: object, info: PluginInfo) -> None:
        """Register ``plugin`` and collect its components. A broken plugin (a hook with an argument
        its specification lacks, a misspelt hook, a registration that raises) becomes a failure,
        recorded with the reason; the other plugins and every job that does not need it go on."""
        try:
            self.manager.register(plugin, name=info.name)
            self.manager.check_pending()
            found = self._collect_components(info.name)
        except Exception as error:  # noqa: BLE001 - any plugin bug is reported, not raised
            if self.manager.get_plugin(info.name) is plugin:
                self.manager.unregister(name=info.name)
            self._fail(info, self._reason(error))
            return
        info.hooks = sorted(impl_hook for impl_hook in self._hook_names(info.name))
        for component in found:
            info.registers.setdefault(component.kind, []).append(component.name)
            self._add_component(component)
        self.plugins.append(info)

    def _reason(self, error: Exception) -> str:
        """One line saying what is wrong with a plugin, with the nearest real hook for a misspelt one."""
        if not isinstance(error, pluggy.PluginValidationError):
            return f"{type(error).__name__}: {error}".splitlines()[0]
        text = " ".join(line.strip() for line in str(error).splitlines())
        unknown = re.match(r"unknown hook '(\w+)'", text)
        if unknown:
            known = [name for name in vars(hookspecs) if name.startswith("runjob_")]
            close = difflib.get_close_matches(unknown[1], known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; runjob's hooks are {', '.join(known)}"
            return f"unknown hook {unknown[1]!r}{hint}"
        extra = re.search(r"definition: (\S.*?\)) Argument\(s\) \{(.*?)\} are declared in the hookimpl", text)
        spec = re.search(r"for hook '(\w+)'", text)
        if extra and spec and hasattr(hookspecs, spec[1]):
            expected = f"{spec[1]}{inspect.signature(getattr(hookspecs, spec[1]))}"
            return f"hook {extra[1]} takes {extra[2]}, which the specification {expected} does not have"
        return text

    def _fail(self, info: PluginInfo, error: str) -> None:
        self.failures.append(
            PluginFailure(info.name, info.distribution, info.version, error.splitlines()[0] if error else "")
        )

    def _hook_names(self, plugin_name: str) -> list[str]:
        plugin = self.manager.get_plugin(plugin_name)
        return [caller.name for caller in self.manager.get_hookcallers(plugin) or []]

    def _collect_components(self, plugin_name: str) -> list[Component]:
        """Call this plugin's registration hooks; nothing is kept if one of them raises."""
        found: list[Component] = []
        for kind in KINDS:
            caller = getattr(self.manager.hook, kind.hook)
            for impl in caller.get_hookimpls():
                if impl.plugin_name == plugin_name:
                    register = _register_into(found, kind.name, plugin_name)
                    impl.function(*[{"register": register}[arg] for arg in impl.argnames])
        return found

    def _add_component(self, component: Component) -> None:
        known = self.components[component.kind].get(component.name)
        if known is None:
            self.components[component.kind][component.name] = component
        else:
            self.duplicates.setdefault((component.kind, component.name), [known]).append(component)

    def plugin_label(self, plugin_name: str) -> str:
        """``'name (distribution version)'`` for messages."""
        for info in self.plugins:
            if info.name == plugin_name:
                return f"{info.name} ({info.distribution} {info.version})"
        return plugin_name

    def lookup(self, kind: str, name: str) -> Component:
        """The component ``name`` of ``kind``; raises ComponentLookupError with advice."""
        if (kind, name) in self.duplicates:
            owners = " and ".join(f"plugin {self.plugin_label(c.plugin)}" for c in self.duplicates[(kind, name)])
            raise ComponentLookupError(f"{kind} {name!r} is registered twice, by {owners}; uninstall one of them")
        component = self.components[kind].get(name)
        if component is not None:
            return component
        known = sorted(self.components[kind])
        message = f"unknown {kind} {name!r}"
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        if close:
            message += f"; did you mean {' or '.join(repr(c) for c in close)}?"
        else:
            message += "."
        if self.failures:  # before the list of names, which can be long
            broken = "; ".join(f"{f.name} ({f.error})" for f in self.failures)
            message += f" Plugins that failed to load, which may have provided it: {broken}."
        message += f" Known {BY_NAME[kind].plural}: {', '.join(known) if known else 'none'}"
        raise ComponentLookupError(message)


def _register_into(found: list[Component], kind: str, plugin_name: str) -> Callable[..., None]:
    def register(
        name: str,
        factory: Callable[..., Any],
        *,
        options: type[Options] | None = None,
        description: str = "",
        **facts: Any,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a {kind} name must be a non-empty string, got {name!r}")
        if not callable(factory):
            raise TypeError(f"{kind} {name!r}: factory {factory!r} is not callable")
        base = BY_NAME[kind].options_base
        if options is not None and not (isinstance(options, type) and issubclass(options, base)):
            raise TypeError(f"{kind} {name!r}: options must be a subclass of runjob.{base.__name__}")
        stated = checked_facts(BY_NAME[kind], name, facts)
        chosen = options or (NoOptions if base is Options else base)
        found.append(Component(kind, name, factory, chosen, plugin_name, description, stated))

    return register


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    unique: dict[tuple[str, str], importlib.metadata.EntryPoint] = {}
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        unique.setdefault((entry_point.name, entry_point.value), entry_point)
    return sorted(unique.values(), key=lambda ep: ep.name)


def load_plugins() -> PluginHost:
    """Load every plugin of the ``runjob`` entry-point group, built-in and third-party alike."""
    host = PluginHost()
    for entry_point in _entry_points():
        dist = entry_point.dist
        info = PluginInfo(
            name=entry_point.name,
            distribution=dist.metadata["Name"] if dist else "?",
            version=dist.version if dist else "?",
            module=entry_point.value,
        )
        try:
            plugin = entry_point.load()
        except Exception as error:  # noqa: BLE001 - one broken plugin must not stop the others
            host._fail(info, f"{type(error).__name__}: {error}")
            continue
        host.add_plugin(plugin, info)
    return host
