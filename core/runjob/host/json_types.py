"""The types of JSON values: what ``json.loads`` gives back and ``json.dumps`` takes (and TOML
tables, read as the same dicts, lists and scalars).

``JSONValue`` is pydantic's ``JsonValue``, so one name serves plain code and pydantic models (which
validate it). Imports only pydantic (``runjob.host``: plugins use it; no torch)."""

from __future__ import annotations

from typing import TypeAlias

from pydantic import JsonValue as JSONValue

JSONObject: TypeAlias = dict[str, JSONValue]
"""A JSON object (a dict of JSON values by name), as a JSON file or a TOML table holds it."""

__all__ = ["JSONObject", "JSONValue"]
