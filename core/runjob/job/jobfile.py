"""Reading job files: TOML, ``extends`` bases and ``--set`` overrides, with where each value came from;
the value ``"!remove"`` removes a key a base or an earlier override set.

The result is a plain nested dict plus an *origin* for every key (file and line, or the override
that set it), so later checks can point at the exact place a wrong value was written. Nothing here
knows which tables or components exist; that is :mod:`runjob.job.validation`'s job.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from runjob.errors import JobError, Problem
from runjob.job.keys import flat
from runjob.job.redaction import redact_override

Tables: TypeAlias = dict[str, Any]
"""A job's tables as TOML reads them (strings, numbers, booleans, dates, lists, tables), before
the job's models check them key by key."""

OVERRIDE_SOURCE = "--set"


@dataclass(frozen=True)
class Origin:
    """Where a value was written: a file and line, or a ``--set`` override (``file`` is then the
    override as given, ``--set table.key=value`` with a secret's value hidden, so a problem with it
    names the override, not the job file)."""

    file: str
    line: int | None = None

    @property
    def from_override(self) -> bool:
        return self.file.startswith(OVERRIDE_SOURCE + " ")


def override_origin(override: str) -> Origin:
    """The origin of what ``override`` (``table.key=value``) sets."""
    return Origin(f"{OVERRIDE_SOURCE} {redact_override(override.strip())}")


@dataclass
class RawJob:
    """A job as read: merged data (``extends`` applied, overrides applied) and each key's origin."""

    path: Path
    data: Tables
    origins: dict[str, Origin] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)

    def origin(self, dotted_key: str) -> Origin:
        """The origin of ``dotted_key``, or of its closest enclosing table, or the main file."""
        key = dotted_key
        while key:
            if key in self.origins:
                return self.origins[key]
            key = key.rpartition(".")[0]
        return Origin(str(self.path))


_BARE_PART = r"[A-Za-z0-9_-]+"
_KEY_PART = rf"(?:{_BARE_PART}|\"[^\"]*\"|'[^']*')"
_DOTTED = rf"{_KEY_PART}(?:\s*\.\s*{_KEY_PART})*"
_TABLE_LINE = re.compile(rf"^\s*\[\s*({_DOTTED})\s*\]")
_ARRAY_TABLE_LINE = re.compile(rf"^\s*\[\[\s*({_DOTTED})\s*\]\]")
_KEY_LINE = re.compile(rf"^\s*({_DOTTED})\s*=")
_SYNTAX_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


def split_dotted(key: str) -> list[str]:
    """``'a."b.c".d'`` -> ``['a', 'b.c', 'd']``."""
    return [p.strip().strip("\"'") for p in re.findall(_KEY_PART, key)]


def key_lines(text: str) -> dict[str, int]:
    """Map each dotted key (and table) written in TOML ``text`` to its 1-based line number.

    tomllib keeps no positions, so this reads the lines the way TOML lays them out: ``[table]``
    headers and ``key = value`` lines. Keys inside multi-line values are not found, which only
    means an error message without a line number.
    """
    lines: dict[str, int] = {}
    table: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if _ARRAY_TABLE_LINE.match(line):
            table = []  # arrays of tables are not used by job files; stop attributing keys
            continue
        header = _TABLE_LINE.match(line)
        if header:
            table = split_dotted(header.group(1))
            lines.setdefault(".".join(table), number)
            continue
        key = _KEY_LINE.match(line)
        if key:
            lines.setdefault(".".join(table + split_dotted(key.group(1))), number)
    return lines


def parse_toml(path: Path) -> tuple[Tables, dict[str, int]]:
    """Read one TOML file; a syntax error becomes a ``file:line:column`` problem."""
    if not path.exists():
        raise JobError([Problem(str(path), "", "job file not found")])
    if path.is_dir():
        raise JobError([Problem(str(path), "", "is a folder, not a job file")])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise JobError([Problem(str(path), "", f"cannot read job file: {error}")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        position = _SYNTAX_POSITION.search(message)
        where = str(path)
        if position:
            where = f"{path}:{position.group(1)}:{position.group(2)}"
            message = message[: position.start()]
        raise JobError([Problem(where, "", f"TOML syntax error: {message}")]) from None
    return data, key_lines(text)


def _leaf_keys(data: Tables) -> list[str]:
    return list(flat(data, tables_too=True))


REMOVE = "!remove"
"""The value that removes a key (or a whole table) a base job file or an earlier ``--set`` set:
``key = "!remove"`` in a job file that ``extends`` another, ``--set table.key=!remove``."""


def _merge(base: Tables, top: Tables, removed: list[str], prefix: str = "") -> Tables:
    """Deep-merge ``top`` over ``base``: tables merge key by key, any other value replaces, and
    :data:`REMOVE` removes the key; the dotted keys it names that ``base`` lacks go to ``removed``."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, str) and value == REMOVE:
            if merged.pop(key, None) is None:
                removed.append(prefix + key)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value, removed, f"{prefix}{key}.")
        elif isinstance(value, dict):
            merged[key] = _merge({}, value, removed, f"{prefix}{key}.")
        else:
            merged[key] = value
    return merged


_NOTHING = '"{remove}" removes a key set by a base job file (extends) or before it; nothing sets {key} there'


def _nothing_to_remove(keys: list[str], origins: dict[str, Origin]) -> JobError:
    problems = [
        Problem(
            origins[key].file if key in origins else "",
            key,
            _NOTHING.format(remove=REMOVE, key=key),
            origins[key].line if key in origins else None,
        )
        for key in keys
    ]
    return JobError(problems)


def _read_with_bases(path: Path, chain: tuple[Path, ...]) -> tuple[Tables, dict[str, Origin]]:
    data, lines = parse_toml(path)
    origins = {key: Origin(str(path), lines.get(key)) for key in _leaf_keys(data)}
    base_name = data.pop("extends", None)
    if base_name is None:
        removed: list[str] = []
        data = _merge({}, data, removed)
        if removed:
            raise _nothing_to_remove(removed, origins)
        kept = set(_leaf_keys(data))
        return data, {key: origin for key, origin in origins.items() if key in kept}
    where = origins.pop("extends")
    if not isinstance(base_name, str) or not base_name:
        raise JobError(
            [Problem(where.file, "extends", f"must be a path to a base job file, got {base_name!r}", where.line)]
        )
    base_path = (path.parent / base_name).resolve()
    if base_path in chain or base_path == path.resolve():
        cycle = " -> ".join(str(p) for p in (*chain, path.resolve(), base_path))
        raise JobError([Problem(where.file, "extends", f"job files extend each other in a loop: {cycle}", where.line)])
    if not base_path.is_file():
        raise JobError([Problem(where.file, "extends", f"base job file not found: {base_path}", where.line)])
    base_data, base_origins = _read_with_bases(base_path, (*chain, path.resolve()))
    removed = []
    merged = _merge(base_data, data, removed)
    if removed:
        raise _nothing_to_remove(removed, origins)
    # a base key survives only where this file did not replace its table with a plain value
    still_there = set(_leaf_keys(merged))
    combined = {**base_origins, **origins}
    return merged, {key: origin for key, origin in combined.items() if key in still_there}


def parse_override_value(text: str) -> Any:
    """Read an override's value as TOML (``0.05``, ``true``, ``[1, 2]``); anything else is a string."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(job: RawJob, override: str) -> Problem | None:
    """Apply one ``table.key=value`` override to ``job``; return a problem instead of raising.
    What it sets, and each table it creates, has the override as its origin."""
    origin = override_origin(override)
    key, sep, value_text = override.partition("=")
    key = key.strip()
    if not sep or not key or not re.fullmatch(_DOTTED, key):
        return Problem(origin.file, "", "an override must look like table.key=value, e.g. --set optimizer.lr=0.05")
    parts = split_dotted(key)
    table = job.data
    for depth, part in enumerate(parts[:-1]):
        inner = ".".join(parts[: depth + 1])
        if part not in table:  # a table only this override names: a problem with it is the override's
            job.origins[inner] = origin
        existing = table.setdefault(part, {})
        if not isinstance(existing, dict):
            return Problem(origin.file, key, f"cannot set a key inside {inner}, which is a value, not a table")
        table = existing
    value = parse_override_value(value_text.strip())
    dotted = ".".join(parts)
    for old in [k for k in job.origins if k.startswith(dotted + ".")]:
        del job.origins[old]
    if isinstance(value, str) and value == REMOVE:
        if table.pop(parts[-1], None) is None:
            return Problem(origin.file, key, _NOTHING.format(remove=REMOVE, key=key))
        job.origins.pop(dotted, None)
        return None
    table[parts[-1]] = value
    job.origins[dotted] = origin
    return None


def load_job(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RawJob:
    """Read the job file at ``path`` with its ``extends`` bases, then apply ``overrides`` in order.

    Raises :class:`JobError` listing every problem found.
    """
    path = Path(path)
    data, origins = _read_with_bases(path, ())
    job = RawJob(path=path, data=data, origins=origins, overrides=list(overrides))
    problems = [p for p in (apply_override(job, o) for o in overrides) if p]
    if problems:
        raise JobError(problems)
    return job
