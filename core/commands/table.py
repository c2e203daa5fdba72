"""Plain-text tables for the commands that print them (``runs``, ``diff``, ``sweep``)."""

from __future__ import annotations

ELLIPSIS = "..."


def shorten(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the middle replaced by an ellipsis (both ends of a
    path or a dotted key usually matter)."""
    if len(text) <= width:
        return text
    keep = width - len(ELLIPSIS)
    head = (keep + 1) // 2
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head) :]


def render(headers: list[str], rows: list[list[str]], right: set[int] = frozenset(), indent: str = "") -> list[str]:
    """A plain-text table: columns two spaces apart, columns in ``right`` right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = []
    for row in [headers, *rows]:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines
