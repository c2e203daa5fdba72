"""Loading plugins and the registries of components they provide.

Built-in and third-party plugins are found the same way: through the ``runjob`` entry-point group.
Each plugin is imported, registered and asked for its components on its own, so one that fails is
recorded by name and only matters to a job that needs what it would have provided.

A plugin can be switched off by its entry-point name (``--disable-plugin NAME`` or
``RUNJOB_DISABLE_PLUGINS``): it is then not imported at all. When plugins register one name twice, a
job may say whose it means with ``plugin:name``; a bare name goes to the built-in (a plugin of the
``runjob-train`` distribution) when one of them is, and is an error naming both otherwise.

A plugin need not be installed: ``-p PLUGIN`` (``$RUNJOB_PLUGINS``, ``runjob.run(plugins=[...])``)
names a module importable from the working directory, a ``path/to/file.py`` or, from Python, any
object with ``@runjob.hookimpl`` methods. Such local plugins load after the installed ones, under
the same rules; one that cannot be found or imported is a :class:`LocalPluginError` (the user asked
for it), raised before anything runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
import traceback
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Literal

import pluggy

from runjob.errors import RunjobError
from runjob.host import hookspecs
from runjob.host.components import Component, Factory, NoOptions, Options
from runjob.host.kinds import BY_NAME, KINDS, checked_facts

ENTRY_POINT_GROUP = "runjob"
BUILTIN_DISTRIBUTION = "runjob-train"
DISABLE_ENVIRONMENT = "RUNJOB_DISABLE_PLUGINS"
"""Entry-point names of plugins not to load, comma-separated (``--disable-plugin`` adds to it)."""
DISABLE_FLAG = "--disable-plugin"
PLUGINS_ENVIRONMENT = "RUNJOB_PLUGINS"
"""Local plugins to load after the installed ones, comma-separated: ``path/to/file.py``, ``MODULE``
(importable from the working directory) or ``MODULE@DIR`` (importable from DIR); ``-p`` adds to it."""
PLUGIN_FLAG = "-p"
LOCAL_DISTRIBUTION = "local"
"""What ``runjob plugins`` and the ``runjob.plugin.NAME`` tag say for a local plugin's distribution."""
LOCAL_FACT = "local_plugin"
"""Set on every component a local plugin registers: the plugin, for the run's ``job_sources.json``."""


@dataclass
class PluginInfo:
    """A loaded plugin: its entry-point name, distribution, version and what it registered."""

    name: str
    distribution: str
    version: str
    module: str
    hooks: list[str] = field(default_factory=list)
    registers: dict[str, list[str]] = field(default_factory=dict)
    local: LocalPlugin | None = None
    """Set for a plugin given with ``-p`` (or ``plugins=``) rather than installed."""

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


class LocalPluginError(RunjobError):
    """A local plugin (``-p``, ``$RUNJOB_PLUGINS``, ``plugins=``) that cannot be found or imported,
    or whose name another plugin has; one line naming it as the user gave it."""


@dataclass(frozen=True)
class LocalPlugin:
    """A plugin loaded without packaging: a module importable from ``directory``, a file at
    ``path`` (loaded under a module name of its own), or an object of this process."""

    given: str
    """As the user gave it (``-p my_plugin``, ``tools/extra.py``), or what the object is."""
    name: str
    """Its plugin name: the module's name, the file's stem, the object's class name."""
    kind: Literal["module", "file", "object"]
    module: str = ""
    directory: str = ""
    path: str = ""
    sha256: str = ""
    plugin: object = field(default=None, compare=False, repr=False)

    @property
    def spec(self) -> str:
        """How ``-p`` and ``$RUNJOB_PLUGINS`` give it from any folder ("" for an object)."""
        if self.kind == "file":
            return self.path
        return f"{self.module}@{self.directory}" if self.kind == "module" else ""

    @property
    def where(self) -> str:
        return self.path or ("in-process object" if self.kind == "object" else self.spec)

    @property
    def label(self) -> str:
        """``'name (local /path/to/file.py)'`` for messages, as :attr:`PluginInfo.label` says it."""
        return f"{self.name} ({LOCAL_DISTRIBUTION} {self.where})"

    def record(self) -> dict[str, str]:
        """What the run's :data:`~runjob.tags.LOCAL_PLUGINS_TAG` keeps of it."""
        fields: tuple[str, ...] = ("given", "name", "kind", "module", "directory", "path", "sha256")
        if self.kind == "file":  # its module name is this process's own, not a way to import it
            fields = ("given", "name", "kind", "path", "sha256")
        return {key: getattr(self, key) for key in fields if getattr(self, key)}


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
            self._check_hooks(plugin)
            self.manager.register(plugin, name=info.name)
            self.manager.check_pending()
            found = self._collect_components(info.name)
        except Exception as error:  # noqa: BLE001 - any plugin bug is reported, not raised
            if self.manager.get_plugin(info.name) is plugin:
                self.manager.unregister(name=info.name)
            self._fail(info, self._reason(error))
            return
        info.hooks = sorted(impl_hook for impl_hook in self._hook_names(info.name))
        if info.local is not None:  # the run's job_sources.json says which components came from it
            found = [dataclasses.replace(c, facts={**c.facts, LOCAL_FACT: info.local.label}) for c in found]
        self.plugins.append(info)  # before its components: whether it is built-in decides who wins
        for component in found:
            info.registers.setdefault(component.kind, []).append(component.name)
            self._add_component(component)

    def _check_hooks(self, plugin: object) -> None:
        """Raise :class:`HookMismatch` with one line for the first hook of ``plugin`` that no specification
        has (with the nearest real one), or that takes an argument its specification lacks: what
        pluggy would refuse at ``register``, said in runjob's words without reading pluggy's message.
        The hooks are found as pluggy finds them (``parse_hookimpl_opts``)."""
        known = [name for name in vars(hookspecs) if name.startswith("runjob_")]
        for attribute in sorted(dir(plugin)):
            options = self.manager.parse_hookimpl_opts(plugin, attribute)
            if options is None:
                continue
            name = options.get("specname") or attribute  # @hookimpl(specname=...) implements another name
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; runjob's hooks are {', '.join(known)}"
                raise HookMismatch(f"unknown hook {name!r}{hint}")
            taken = _required_arguments(getattr(plugin, attribute))
            specified = list(inspect.signature(getattr(hookspecs, name)).parameters)
            extra = [argument for argument in taken if argument not in specified]
            if extra:
                raise HookMismatch(
                    f"hook {name}({', '.join(taken)}) takes {', '.join(map(repr, extra))}, which the specification "
                    f"{name}({', '.join(specified)}) does not have"
                )

    def _reason(self, error: Exception) -> str:
        """One line saying what is wrong with a plugin."""
        if isinstance(error, HookMismatch):
            return str(error)
        if isinstance(error, pluggy.PluginValidationError):  # one :meth:`_check_hooks` does not foresee
            return " ".join(line.strip() for line in str(error).splitlines())
        return f"{type(error).__name__}: {error}".splitlines()[0]

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


class HookMismatch(Exception):
    """A plugin's hook that its specification does not allow (a misspelt name, an unknown argument)."""


def _required_arguments(function: Factory) -> list[str]:
    """The arguments a hook implementation takes without a default, as pluggy passes them (by name)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in parameters
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def _register_into(found: list[Component], kind: str, plugin_name: str) -> hookspecs.Register:
    def register(
        name: str,
        factory: Factory,
        *,
        options: type[Options] | None = None,
        description: str = "",
        **facts: object,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a {kind} name must be a non-empty string, got {name!r}")
        if ":" in name:
            raise TypeError(f"{kind} {name!r}: a name cannot hold ':', which jobs write between plugin and name")
        if not callable(factory):
            raise TypeError(f"{kind} {name!r}: factory {factory!r} is not callable")
        factory_class = BY_NAME[kind].factory_class
        if factory_class is not None and not (isinstance(factory, type) and issubclass(factory, factory_class)):
            raise TypeError(f"{kind} {name!r}: {factory!r} is not a subclass of runjob.{factory_class.__name__}")
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


def load_plugins(disabled: Mapping[str, str] | None = None, local: Sequence[LocalPlugin] | None = None) -> PluginHost:
    """Load every plugin of the ``runjob`` entry-point group, built-in and third-party alike, except
    those in ``disabled`` (entry-point name -> what disabled it, see :func:`disabled_plugins`;
    by default ``$RUNJOB_DISABLE_PLUGINS``), which are not imported at all; then the ``local``
    plugins (default: :func:`local_plugins`, those of ``$RUNJOB_PLUGINS`` and of the running
    :func:`runjob.run` call).

    A third-party registration of a name a built-in has is in ``host.warnings`` and also issued
    as a :class:`PluginWarning`, as is a local plugin that failed to register."""
    disabled = disabled_plugins() if disabled is None else disabled
    local = local_plugins() if local is None else local
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
    for given in local:
        info = PluginInfo(given.name, LOCAL_DISTRIBUTION, given.where, given.given, local=given)
        host.add_plugin(given.plugin, info)
    for text in host.warnings:
        warnings.warn(text, PluginWarning, stacklevel=2)
    for failure in host.failures:  # asked for by the user, so said even when the job needs none of it
        if failure.distribution == LOCAL_DISTRIBUTION:
            warnings.warn(
                f"local plugin {failure.name} ({failure.version}): {failure.error}", PluginWarning, stacklevel=2
            )
    return host


# --- local plugins: -p, $RUNJOB_PLUGINS, runjob.run(plugins=[...]) ----------------------------------

_PluginKey = tuple[str | int, ...]
"""What a local plugin is: its kind and module and folder, its file, or its object's id."""

_LOADED: dict[_PluginKey, LocalPlugin] = {}
"""Every local plugin imported in this process, by what it is: each is imported once, and keeps the
``-p`` text it was first given with (what the run records)."""
_IN_PROCESS: list[LocalPlugin] = []
"""The objects of the :func:`runjob.run` call now running, which no environment variable can carry."""
_PRIVATE_PREFIX = "runjob_local_"
"""The module name a file plugin is loaded under starts so: its own, never one a library has."""


def local_plugins(
    given: Iterable[object] = (),
    *,
    label: str = PLUGIN_FLAG,
    environ: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> list[LocalPlugin]:
    """The local plugins to load, imported: those of ``$RUNJOB_PLUGINS``, the objects of the
    :func:`runjob.run` call now running, then ``given`` (``-p`` values, or from Python modules and
    objects), each once. ``label`` says how ``given`` was given, for messages (``-p``,
    ``plugins=``). A plugin that cannot be found or imported, or whose name an installed plugin or
    another local one has, raises :class:`LocalPluginError`."""
    environ = os.environ if environ is None else environ
    folder = Path.cwd() if cwd is None else Path(cwd)
    found: dict[_PluginKey, LocalPlugin] = {}
    for text in environ.get(PLUGINS_ENVIRONMENT, "").split(","):
        if text.strip():
            plugin = _resolve(text.strip(), f"{PLUGINS_ENVIRONMENT}={text.strip()}", folder)
            found.setdefault(_key(plugin), plugin)
    for plugin in _IN_PROCESS:
        found.setdefault(_key(plugin), plugin)
    for value in given:
        shown = f"{label} {value}" if label == PLUGIN_FLAG else f"{label}[{value!r}]"
        plugin = _resolve(value, shown, folder)
        found.setdefault(_key(plugin), plugin)
    plugins = list(found.values())
    if plugins:
        _check_names(plugins)
    return plugins


@contextlib.contextmanager
def using_local_plugins(plugins: Sequence[LocalPlugin]) -> Iterator[None]:
    """While it lasts, ``plugins`` are what every :func:`load_plugins` here loads, and the files
    and modules among them what every process started meanwhile loads (``$RUNJOB_PLUGINS``)."""
    global _IN_PROCESS
    saved, saved_objects = os.environ.get(PLUGINS_ENVIRONMENT), _IN_PROCESS
    specs = [plugin.spec for plugin in plugins if plugin.kind != "object"]
    try:
        if specs:
            os.environ[PLUGINS_ENVIRONMENT] = ",".join(specs)
        else:
            os.environ.pop(PLUGINS_ENVIRONMENT, None)
        _IN_PROCESS = [plugin for plugin in plugins if plugin.kind == "object"]
        yield
    finally:
        _IN_PROCESS = saved_objects
        if saved is None:
            os.environ.pop(PLUGINS_ENVIRONMENT, None)
        else:
            os.environ[PLUGINS_ENVIRONMENT] = saved


def local_plugin_arguments(plugins: Sequence[LocalPlugin] | None = None) -> list[str]:
    """``-p SPEC`` for each file and module plugin of ``plugins`` (default: ``$RUNJOB_PLUGINS``),
    as a command started in any folder (a worker, a resume command) loads them."""
    if plugins is None:
        specs = [text.strip() for text in os.environ.get(PLUGINS_ENVIRONMENT, "").split(",") if text.strip()]
    else:
        specs = [plugin.spec for plugin in plugins if plugin.kind != "object"]
    return [part for spec in specs for part in (PLUGIN_FLAG, spec)]


def file_sha256(path: str | Path) -> str:
    """The sha256 of a plugin's file, as the run's :data:`~runjob.tags.LOCAL_PLUGINS_TAG` records it."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _key(plugin: LocalPlugin) -> _PluginKey:
    if plugin.kind == "object":
        return ("object", id(plugin.plugin))
    return ("module", plugin.module, plugin.directory) if plugin.kind == "module" else ("file", "", plugin.path)


def _check_names(plugins: Sequence[LocalPlugin]) -> None:
    """A local plugin's name is its own: neither an installed plugin's (``PLUGIN:NAME`` would be
    ambiguous) nor another local one's."""
    installed = {ep.name: ep for ep in _entry_points()}
    seen: dict[str, LocalPlugin] = {}

    def shown(plugin: LocalPlugin) -> str:
        return plugin.given if plugin.kind == "object" else f"{PLUGIN_FLAG} {plugin.given}"

    for plugin in plugins:
        entry_point = installed.get(plugin.name)
        if entry_point is not None:
            dist = entry_point.dist
            owner = f"{dist.metadata['Name']} {dist.version}" if dist else entry_point.value
            thing = {"module": "module", "file": "file"}.get(plugin.kind, "class")
            raise LocalPluginError(
                f"{shown(plugin)}: its plugin name {plugin.name!r} is taken by the installed plugin {plugin.name} "
                f"({owner}); rename the {thing}"
            )
        other = seen.setdefault(plugin.name, plugin)
        if other is not plugin:
            raise LocalPluginError(
                f"{shown(other)} and {shown(plugin)}: two local plugins named {plugin.name!r}; rename one of them"
            )


def _resolve(value: object, where: str, cwd: Path) -> LocalPlugin:
    """The plugin ``value`` names (a ``-p`` text, a path, a module, an object), imported once per process."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        return _resolve_text(value.strip(), where, cwd)
    if isinstance(value, ModuleType):
        return _resolve_module_object(value)
    if isinstance(value, type):
        raise LocalPluginError(
            f"{where}: a class; give an instance of it ({value.__name__}()), whose methods are hooks"
        )
    key = ("object", id(value))
    if key not in _LOADED:
        name = getattr(value, "__name__", None) or type(value).__name__
        _LOADED[key] = LocalPlugin(f"<{type(value).__name__} object>", str(name), "object", plugin=value)
    return _LOADED[key]


def _resolve_text(text: str, where: str, cwd: Path) -> LocalPlugin:
    if text.endswith(".py"):
        path = (cwd / Path(text).expanduser()).resolve()
        key: _PluginKey = ("file", "", str(path))
        if key not in _LOADED:
            module = _load_file(path, where)
            _LOADED[key] = LocalPlugin(
                text, path.stem, "file", module.__name__, "", str(path), file_sha256(path), module
            )
        return _LOADED[key]
    name, at, folder = text.partition("@")
    if not name or not all(part.isidentifier() for part in name.split(".")):
        raise LocalPluginError(
            f"{where}: neither a module name nor a .py file; give a module importable from {cwd} (my_plugin) or a "
            "path/to/file.py"
        )
    directory = (cwd / folder).resolve() if at else cwd.resolve()
    key = ("module", name, str(directory))
    if key not in _LOADED:
        module = _load_module(name, directory, where)
        file = getattr(module, "__file__", None) or ""
        digest = file_sha256(file) if file and Path(file).is_file() else ""
        _LOADED[key] = LocalPlugin(text, name, "module", name, str(directory), file, digest, module)
    return _LOADED[key]


def _resolve_module_object(module: ModuleType) -> LocalPlugin:
    """A module given from Python: the same as its ``-p`` (its file, or its name and the folder it
    is importable from), so other processes can load it; an object of this process otherwise."""
    for plugin in _LOADED.values():  # a file plugin loaded here before, under its own module name, too
        if plugin.plugin is module:
            return plugin
    name, file = module.__name__, getattr(module, "__file__", None)
    path = Path(file).resolve() if file else None
    directory = _importable_from(name, path) if path is not None and name != "__main__" else None
    if path is None or directory is None:  # a script's own module, or one made in memory: not importable again
        key: _PluginKey = ("object", id(module))
        _LOADED[key] = LocalPlugin(f"<module {name}>", name.rpartition(".")[2], "object", plugin=module)
    else:
        key = ("module", name, str(directory))
        _LOADED[key] = LocalPlugin(name, name, "module", name, str(directory), str(path), file_sha256(path), module)
    return _LOADED[key]


def _importable_from(name: str, file: Path) -> Path | None:
    """The folder on ``sys.path`` from which module ``name`` (at ``file``) imports, or None."""
    parts = name.split(".")
    file = file.resolve()
    tail = Path(*parts[:-1], parts[-1] + ".py") if file.name != "__init__.py" else Path(*parts, "__init__.py")
    if file.parts[-len(tail.parts) :] != tail.parts:
        return None
    return file.parents[len(tail.parts) - 1]


def _load_file(path: Path, where: str) -> ModuleType:
    """Import the file at ``path`` under a module name of its own, its folder importable (as
    ``python path/to/file.py`` has it) for what it imports beside it."""
    if not path.is_file():
        raise LocalPluginError(f"{where}: no such file ({path})")
    stem = re.sub(r"\W", "_", path.stem)
    name = f"{_PRIVATE_PREFIX}{stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LocalPluginError(f"{where}: cannot be imported as Python ({path})")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: pydantic and dataclasses look their module up
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)  # after the installed packages: a file beside it never shadows one
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:
        del sys.modules[name]
        raise _import_error(where, error, str(path)) from None
    return module


def _load_module(name: str, directory: Path, where: str) -> ModuleType:
    """Import module ``name`` with ``directory`` first on ``sys.path`` (as ``python -c`` has the
    working directory), then kept last there, for what it imports later."""
    folder = str(directory)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    importlib.invalidate_caches()  # a file written since this process last looked
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and (name == error.name or name.startswith(error.name + ".")):
            nearby = [file.stem for file in directory.glob("*.py")]
            close = difflib.get_close_matches(name, nearby, n=1)
            hint = (
                f"; did you mean {close[0]!r}?" if close else "; give a module there (my_plugin) or a path/to/file.py"
            )
            raise LocalPluginError(f"{where}: no module named {name!r} importable from {directory}{hint}") from None
        raise _import_error(where, error, folder) from None
    except (Exception, SystemExit) as error:
        raise _import_error(where, error, folder) from None
    finally:
        if added:
            sys.path.remove(folder)
            sys.path.append(folder)


def _import_error(where: str, error: BaseException, own: str) -> LocalPluginError:
    """One line: the plugin as given, the error, and the file and line it came from (the plugin's
    own, where the traceback passes through it)."""
    if isinstance(error, SyntaxError) and error.filename:
        text, place = f"{type(error).__name__}: {error.msg}", f"{error.filename}:{error.lineno}"
    else:
        frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not frame.filename.startswith("<")]
        inside = [f for f in frames if f.filename.startswith(own) and "-packages" not in f.filename]
        chosen = inside or frames
        text = f"{type(error).__name__}: {error}".splitlines()[0]
        place = f"{chosen[-1].filename}:{chosen[-1].lineno}" if chosen else ""
    return LocalPluginError(f"{where}: {text} ({place})" if place else f"{where}: {text}")
