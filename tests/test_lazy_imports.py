"""An import inside a function says why it is there: the standard library is imported at the top of
its module, and every other import inside a function carries ``# lazy: <reason>`` (on its own line,
or on a comment line directly above the block of consecutive imports it belongs to): why that
module must not be imported when its importer is (e.g. `runjob validate` imports every plugin
module and must not load torch; `runjob --help` must stay quick). Pure ast: nothing here imports
the code it reads."""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

from helpers import REPO

SOURCES = ["core/runjob", "plugins/runjob_builtins", "plugins/runjob-hf/src", "plugins/runjob-timm/src"]
REASON = "# lazy:"


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return ["." * node.level + (node.module or "")]


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def _in_function_imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, list[ast.stmt]]]:
    """Every import statement that runs inside a function, with the statement list that holds it
    (imports under ``if TYPE_CHECKING:`` never run and are left out)."""
    found: list[tuple[ast.Import | ast.ImportFrom, list[ast.stmt]]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if _is_type_checking(node):
            return
        inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            statements = getattr(node, field, None)
            if not isinstance(statements, list):
                continue
            for statement in statements:
                if inside and isinstance(statement, ast.Import | ast.ImportFrom):
                    found.append((statement, statements))
                visit(statement, inside)

    visit(tree, False)
    return found


def _has_reason(node: ast.stmt, statements: list[ast.stmt], lines: list[str]) -> bool:
    """``# lazy:`` on one of the import's own lines, or in the comment lines directly above the
    block of consecutive import statements (no blank line between them) that it belongs to."""
    assert node.end_lineno is not None
    if any(REASON in line for line in lines[node.lineno - 1 : node.end_lineno]):
        return True
    first = node
    index = statements.index(node)
    while index > 0:
        previous = statements[index - 1]
        if not isinstance(previous, ast.Import | ast.ImportFrom) or previous.end_lineno != first.lineno - 1:
            break
        first, index = previous, index - 1
    above = first.lineno - 2  # 0-based index of the line directly above the block
    while above >= 0 and lines[above].lstrip().startswith("#"):
        if REASON in lines[above]:
            return True
        above -= 1
    return False


def lazy_import_problems(root: Path) -> list[str]:
    """``path:line: ...`` for every import inside a function under ``root`` that imports the standard
    library or lacks its ``# lazy:`` reason."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node, statements in _in_function_imports(ast.parse(text, filename=str(path))):
            where = f"{path.relative_to(root)}:{node.lineno}"
            stdlib = [name for name in _imported(node) if name.split(".")[0] in sys.stdlib_module_names]
            if stdlib:
                problems.append(f"{where}: the standard library ({', '.join(stdlib)}) belongs at the top of the module")
            elif not _has_reason(node, statements, lines):
                problems.append(f"{where}: import of {', '.join(_imported(node))} inside a function without '{REASON}'")
    return problems


def test_every_import_inside_a_function_says_why_it_is_not_at_the_top():
    problems = [f"{source}/{problem}" for source in SOURCES for problem in lazy_import_problems(REPO / source)]
    assert not problems, "\n".join(problems)


def test_the_check_names_a_stdlib_import_and_an_import_without_a_reason(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        textwrap.dedent(
            """\
            from typing import TYPE_CHECKING

            import json

            if TYPE_CHECKING:
                import torch


            def stdlib():
                import os  # lazy: a reason does not excuse the standard library
                return os


            def bare():
                x = 1
                from runjob.host import plugin_host
                return plugin_host, x


            def reasoned():
                import torch  # lazy: validate must not load torch
                # lazy: the block below: plugin modules stay light
                # (a second comment line)
                import accelerate
                from mlflow import (
                    entities,
                )
                return torch, accelerate, entities


            def blank_line_breaks_the_block():
                # lazy: covers only the first import
                import numpy

                import pandas
                return numpy, pandas


            class Holder:
                def method(self):
                    if True:
                        try:
                            import optuna
                        except ImportError:
                            import torch  # lazy: said here
                    return optuna, torch

                    def nested():
                        if TYPE_CHECKING:
                            import transformers  # never runs

                        def deeper():
                            import timm
                            return timm

                        return deeper
            """
        )
    )
    assert lazy_import_problems(tmp_path) == [
        "pkg/mod.py:10: the standard library (os) belongs at the top of the module",
        "pkg/mod.py:16: import of runjob.host inside a function without '# lazy:'",
        "pkg/mod.py:35: import of pandas inside a function without '# lazy:'",
        "pkg/mod.py:43: import of optuna inside a function without '# lazy:'",
        "pkg/mod.py:53: import of timm inside a function without '# lazy:'",
    ]
