"""Types for plugin authors: runjob ships ``py.typed``, and what type checkers see of ``runjob`` (the
imports under ``TYPE_CHECKING`` in its ``__init__``) is exactly what it exports lazily at run time.
mypy itself runs in CI (.ci/run), not here: a cold run takes about a minute."""

from __future__ import annotations

import ast
import tomllib

from helpers import REPO

import runjob

INIT = REPO / "core" / "runjob" / "__init__.py"


def _type_checking_imports() -> dict[str, str]:
    """Name -> module of the ``from MODULE import NAME as NAME`` lines under ``if TYPE_CHECKING:``."""
    tree = ast.parse(INIT.read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module, ast.unparse(statement)
                for alias in statement.names:
                    assert alias.asname == alias.name, f"{alias.name}: import it `as {alias.name}` (a re-export)"
                    found[alias.name] = statement.module
    return found


def test_type_checkers_see_every_lazy_name_from_its_module():
    assert _type_checking_imports() == runjob._LAZY


def test_lazy_names_resolve_at_run_time():
    for name in ("Options", "Task", "Callback", "Register", "RunjobError"):
        assert getattr(runjob, name) is not None


def test_py_typed_ships_in_the_package():
    assert (REPO / "core" / "runjob" / "py.typed").is_file()
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["runjob"]
