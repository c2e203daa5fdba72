"""Plain-text tables for the commands that print them (``runs``, ``diff``, ``sweep``)."""

from __future__ import annotations

import math
from collections.abc import Set

ELLIPSIS = "..."
FIGURES = 4
"""Significant digits of the numbers a table shows: as the epoch lines and the run names show them."""


def figure(value: float | None, digits: int = FIGURES) -> str:
    """``value`` to ``digits`` significant digits; ``""`` for ``None`` (nothing recorded)."""
    return "" if value is None else f"{value:.{digits}g}"


def recorded_value(text: str) -> str:
    """A recorded value (MLflow keeps params as text) as a table shows it: a number with more
    significant digits than :data:`FIGURES` rounded to them (``0.8212461922256864`` -> ``0.8212``),
    any other text, a whole number among them, as it was recorded (``0.0``, ``1e-05``, ``32``)."""
    try:
        int(text)
        return text
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    rounded = figure(number)
    return text if math.isnan(number) or float(rounded) == number else rounded


def shorten(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the middle replaced by an ellipsis (both ends of a
    path or a dotted key usually matter)."""
    if len(text) <= width:
        return text
    keep = width - len(ELLIPSIS)
    head = (keep + 1) // 2
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head) :]


def render(headers: list[str], rows: list[list[str]], right: Set[int] = frozenset(), indent: str = "") -> list[str]:
    """A plain-text table: columns two spaces apart, columns in ``right`` right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = []
    for row in [headers, *rows]:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines
