"""Dotted keys: a job's nested tables seen as ``table.key`` -> value, the way job files, ``--set``,
MLflow params and error messages name them. The one walker every reader of nested tables uses."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping


def flat(
    tables: Mapping[str, object],
    *,
    tables_too: bool = False,
    leaf: Callable[[dict[str, object]], bool] | None = None,
    prefix: str = "",
) -> dict[str, object]:
    """``{"optimizer": {"lr": 0.1}}`` -> ``{"optimizer.lr": 0.1}``, in the tables' order.

    A value that is not a table, or an empty table, is a leaf. ``tables_too``: the tables' own keys
    are listed too (``"optimizer"`` before ``"optimizer.lr"``). ``leaf(table)``: true for a table
    that is a value in its own right (a sweep's ``{low = ..., high = ...}`` range)."""
    found: dict[str, object] = {}
    for key, value in tables.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value and not (leaf and leaf(value)):
            if tables_too:
                found[dotted] = value
            found.update(flat(value, tables_too=tables_too, leaf=leaf, prefix=dotted + "."))
        else:
            found[dotted] = value
    return found


def value_text(value: object) -> str:
    """A value as one line of text: lists, tables and booleans as JSON (``[0.9, 0.99]``, ``true``),
    anything else as ``str``."""
    return json.dumps(value) if isinstance(value, (list, dict, bool)) else str(value)
