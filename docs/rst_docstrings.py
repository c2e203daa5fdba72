"""A griffe extension (mkdocs.yml: mkdocstrings' ``extensions``) that reads runjob's docstrings as the
Markdown they nearly are: their reStructuredText bits become Markdown before mkdocstrings renders them.

- Sphinx roles, ``:class:`runjob.Inputs``` or ``:meth:`~Task.loss```: code, ``runjob.Inputs``;
- a paragraph ending in ``::`` (the indented block after it is code): ending in ``:``, the block a
  fenced Python block.

(``double backticks`` are already a Markdown code span.)"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):`~?([^`]+)`")
LITERAL_BLOCK = re.compile(r"::\n\n((?:[ \t]+\S.*\n|[ \t]*\n)+)")


def markdown_of(text: str) -> str:
    """``text`` with its Sphinx roles as code spans and its ``::`` blocks fenced."""
    text = ROLE.sub(r"`\1`", text)

    def fenced(found: re.Match[str]) -> str:
        block = textwrap.dedent(found.group(1)).strip("\n")
        return f":\n\n```python\n{block}\n```\n\n"

    return LITERAL_BLOCK.sub(fenced, text + "\n").rstrip("\n")


class RstMarkup(griffe.Extension):
    """Rewrites every loaded object's docstring with :func:`markdown_of`."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
