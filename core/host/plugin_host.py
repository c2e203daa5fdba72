"""Loading plugins and the registries of components they provide.

Built-in and third-party plugins are found the same way: through the ``runjob`` entry-point group.
Each plugin is imported, registered and asked for its components on its own, so one that fails is
recorded by name and only matters to a job that needs what it would have provided.

A plugin can be switched off by its entry-point name (``--disable-plugin NAME`` or
``RUNJOB_DISABLE_PLUGINS``): it is then not imported at all. When plugins register one name twice, a
job may say whose it means with ``plugin:name``; a bare name goes to the built-in (a plugin of the
``runjob-train`` distribution) when one of them is, and is an error naming both otherwise.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import inspect
import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pluggy

from runjob.errors import RunjobError
from runjob.host import hookspecs
from runjob.host.components import Component, NoOptions, Options
from runjob.host.kinds import BY_NAME, KINDS, checked_facts

ENTRY_POINT_GROUP = "runjob"
BUILTIN_DISTRIBUTION = "runjob-train"
DISABLE_ENVIRONMENT = "RUNJOB_DISABLE_PLUGINS"
"""Entry-point names of plugins not to load, comma-separated (``--disable-plugin`` adds to it)."""
DISABLE_FLAG = "--disable-plugin"


@dataclass
class PluginInfo:
    """A loaded plugin: its entry-point name, distribution, version and what it registered."""

    name: str
    distribution: str
    version: str
    module: str
    hooks: list[str] = field(default_factory=list)
    registers: dict[str, list[str]] = field(default_factory=dict)

    @property
    def builtin(self) -> bool:
        """Shipped with runjob itself: its registrations win for a bare name."""
        return _normalized(self.distribution) == BUILTIN_DISTRIBUTION

    @property
    def label(self) -> str:
        """``'name (distribution version)'`` for messages."""
        return f"{self.name} ({self.distribution} {self.version})"


@dataclass
class PluginFailure:
    """A plugin that could not be loaded, and why (one line)."""

    name: str
    distribution: str
    version: str
    error: str


@dataclass
class DisabledPlugin:
    """A plugin that was switched off, and by what (``--disable-plugin`` or ``RUNJOB_DISABLE_PLUGINS``)."""

    name: str
    distribution: str
    version: str
    by: str


class ComponentLookupError(LookupError):
    """A job names a component that cannot be used; the message says why and what exists."""


class PluginWarning(UserWarning):
    """A warning about a plugin or what a job asks of it, printed as ``runjob: warning: ...``: a
    plugin registers a name a built-in has (jobs using the bare name get the built-in), or a plugin's
    options say something is doubtful (``warnings.warn(text, runjob.PluginWarning)``)."""


class UnknownPluginError(RunjobError):
    """A plugin to disable that no installed distribution provides."""


class PluginHost:
    """The plugin manager plus every component registered, by kind and name."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self.manager.add_hookspecs(hookspecs)
        self.plugins: list[PluginInfo] = []
        self.failures: list[PluginFailure] = []
        self.disabled: list[DisabledPlugin] = []
        self.registrations: dict[str, dict[str, list[Component]]] = {kind.name: {} for kind in KINDS}
        """Every registration, by kind and name, in the order the plugins loaded."""
        self.components: dict[str, dict[str, Component]] = {kind.name: {} for kind in KINDS}
        """What a bare name gives, by kind and name (for a name in ``duplicates``, the first one)."""
        self.duplicates: dict[tuple[str, str], list[Component]] = {}
        """Names that several plugins, none or several of them built-in, register: a bare name is an error."""

    @property
    def hook(self) -> pluggy.HookRelay:
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
        self.plugins.append(info)  # before its components: whether it is built-in decides who wins
        for component in found:
            info.registers.setdefault(component.kind, []).append(component.name)
            self._add_component(component)

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
            expected = f"{spec[1]}({', '.join(inspect.signature(getattr(hookspecs, spec[1])).parameters)})"
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
        kind, name = component.kind, component.name
        owners = self.registrations[kind].setdefault(name, [])
        owners.append(component)
        builtins = [c for c in owners if self._builtin(c.plugin)]
        if len(owners) == 1 or len(builtins) == 1:
            self.components[kind][name] = owners[0] if len(owners) == 1 else builtins[0]
            self.duplicates.pop((kind, name), None)
        else:
            self.components[kind].setdefault(name, owners[0])
            self.duplicates[(kind, name)] = list(owners)

    def _builtin(self, plugin_name: str) -> bool:
        return any(info.builtin for info in self.plugins if info.name == plugin_name)

    def plugin_label(self, plugin_name: str) -> str:
        """``'name (distribution version)'`` for messages."""
        for info in self.plugins:
            if info.name == plugin_name:
                return info.label
        return plugin_name

    @property
    def warnings(self) -> list[str]:
        """One line per third-party registration of a name a built-in has (the built-in wins)."""
        lines = []
        for kind, by_name in self.registrations.items():
            for name, owners in sorted(by_name.items()):
                if (kind, name) in self.duplicates or len(owners) == 1:
                    continue
                for component in owners:
                    if not self._builtin(component.plugin):
                        lines.append(
                            f"plugin {self.plugin_label(component.plugin)} also registers {kind} {name!r}; jobs get "
                            f'the built-in; write "{component.plugin}:{name}" for the plugin\'s'
                        )
        return lines

    def conflict(self, kind: str, name: str) -> str:
        """Why the bare ``name`` cannot be used: the plugins that register it, and what to write instead."""
        owners = self.duplicates[(kind, name)]
        labels = " and ".join(f"plugin {self.plugin_label(c.plugin)}" for c in owners)
        choices = " or ".join(f'"{c.plugin}:{name}"' for c in owners)
        return f"{kind} {name!r} is registered by more than one plugin: {labels}; write {choices} to choose"

    def default_components(self, kind: str) -> list[Component]:
        """The components of ``kind`` registered ``on_by_default`` that a bare name gives (a
        third-party plugin shadowing a built-in default is not on by default), in loading order."""
        return [
            component
            for name, component in self.components[kind].items()
            if component.facts.get("on_by_default") and (kind, name) not in self.duplicates
        ]

    def lookup(self, kind: str, name: str) -> Component:
        """The component ``name`` of ``kind``; raises ComponentLookupError with advice.

        ``name`` may be ``plugin:name``: that plugin's registration (``plugin`` is its entry-point
        name). It is returned under the name as written, so a resolved job written out and read
        back gets the same component."""
        plugin, sep, bare = name.partition(":")
        if sep:
            return dataclasses.replace(self._lookup_in(plugin, kind, bare), name=name)
        if (kind, name) in self.duplicates:
            raise ComponentLookupError(self.conflict(kind, name))
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
        if self.disabled:
            off = ", ".join(f"{d.name} ({d.by})" for d in self.disabled)
            message += f" Disabled plugins, which may provide it: {off}."
        message += f" Known {BY_NAME[kind].plural}: {', '.join(known) if known else 'none'}"
        raise ComponentLookupError(message)

    def _lookup_in(self, plugin: str, kind: str, name: str) -> Component:
        """``plugin``'s registration of ``name``, or why there is none."""
        written = f"{plugin}:{name}"
        for component in self.registrations[kind].get(name, []):
            if component.plugin == plugin:
                return component
        for off in self.disabled:
            if off.name == plugin:
                raise ComponentLookupError(f"{written}: plugin {plugin!r} is disabled ({off.by})")
        for failure in self.failures:
            if failure.name == plugin:
                raise ComponentLookupError(f"{written}: plugin {plugin!r} failed to load: {failure.error}")
        info = next((info for info in self.plugins if info.name == plugin), None)
        if info is None:
            loaded = sorted(info.name for info in self.plugins)
            close = difflib.get_close_matches(plugin, loaded, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ComponentLookupError(
                f"{written}: no plugin is named {plugin!r}; {hint}Plugins (entry-point names): {', '.join(loaded)}"
            )
        own = info.registers.get(kind, [])
        close = difflib.get_close_matches(name, own, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ComponentLookupError(
            f"{written}: plugin {info.label} registers no {kind} {name!r}; {hint}"
            f"its {BY_NAME[kind].plural}: {', '.join(own) if own else 'none'}"
        )


def _register_into(found: list[Component], kind: str, plugin_name: str) -> hookspecs.Register:
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
        if ":" in name:
            raise TypeError(f"{kind} {name!r}: a name cannot hold ':', which jobs write between plugin and name")
        if not callable(factory):
            raise TypeError(f"{kind} {name!r}: factory {factory!r} is not callable")
        base = BY_NAME[kind].options_base
        if options is not None and not (isinstance(options, type) and issubclass(options, base)):
            raise TypeError(f"{kind} {name!r}: options must be a subclass of runjob.{base.__name__}")
        stated = checked_facts(BY_NAME[kind], name, facts)
        chosen = options or (NoOptions if base is Options else base)
        if stated.get("on_by_default"):
            required = [key for key, field in chosen.model_fields.items() if field.is_required()]
            if required:
                raise TypeError(
                    f"{kind} {name!r} is on by default, so every option needs a default; {', '.join(required)} has none"
                )
        found.append(Component(kind, name, factory, chosen, plugin_name, description, stated))

    return register


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    unique: dict[tuple[str, str], importlib.metadata.EntryPoint] = {}
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        unique.setdefault((entry_point.name, entry_point.value), entry_point)
    return sorted(unique.values(), key=lambda ep: ep.name)


def _normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def disabled_plugins(flagged: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The plugins to leave unloaded, each with what disabled it: the names in
    ``$RUNJOB_DISABLE_PLUGINS`` (comma-separated), then ``flagged`` (``--disable-plugin``).
    A name no installed plugin has raises :class:`UnknownPluginError`."""
    environ = os.environ if environ is None else environ
    disabled = {name.strip(): DISABLE_ENVIRONMENT for name in environ.get(DISABLE_ENVIRONMENT, "").split(",")}
    disabled.update((name.strip(), DISABLE_FLAG) for names in flagged for name in names.split(","))
    disabled.pop("", None)
    if disabled:
        known = sorted({entry_point.name for entry_point in _entry_points()})
        for name, by in disabled.items():
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                where = f"{DISABLE_FLAG} {name}" if by == DISABLE_FLAG else f"{DISABLE_ENVIRONMENT}={name}"
                raise UnknownPluginError(
                    f"{where}: no plugin is named {name!r}; {hint}Plugins (entry-point names): {', '.join(known)}"
                )
    return disabled


def load_plugins(disabled: Mapping[str, str] | None = None) -> PluginHost:
    """Load every plugin of the ``runjob`` entry-point group, built-in and third-party alike, except
    those in ``disabled`` (entry-point name -> what disabled it, see :func:`disabled_plugins`;
    by default ``$RUNJOB_DISABLE_PLUGINS``), which are not imported at all.

    A third-party registration of a name a built-in has is in ``host.warnings`` and also issued
    as a :class:`PluginWarning`."""
    disabled = disabled_plugins() if disabled is None else disabled
    host = PluginHost()
    for entry_point in _entry_points():
        dist = entry_point.dist
        info = PluginInfo(
            name=entry_point.name,
            distribution=dist.metadata["Name"] if dist else "?",
            version=dist.version if dist else "?",
            module=entry_point.value,
        )
        if info.name in disabled:
            host.disabled.append(DisabledPlugin(info.name, info.distribution, info.version, disabled[info.name]))
            continue
        try:
            plugin = entry_point.load()
        except Exception as error:  # noqa: BLE001 - one broken plugin must not stop the others
            host._fail(info, f"{type(error).__name__}: {error}")
            continue
        host.add_plugin(plugin, info)
    for text in host.warnings:
        warnings.warn(text, PluginWarning, stacklevel=2)
    return host
