"""Types for plugin authors: runjob ships ``py.typed``, and what type checkers see of ``runjob`` (the
imports under ``TYPE_CHECKING`` in its ``__init__``) is exactly what it exports lazily at run time.
mypy itself runs in CI (.ci/run), not here: a cold run takes about a minute."""

from __future__ import annotations

import ast
import re
import tomllib

from helpers import REPO, documentation

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


CORE = REPO / "core" / "runjob"


def any_uses(source: str) -> int:
    """How many times ``Any`` is used in a module's code: annotations, casts, aliases (``Any`` or
    ``typing.Any`` as a name), not its imports, docstrings or comments."""
    return sum(
        (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any")
        for node in ast.walk(ast.parse(source))
    )


def any_count() -> tuple[dict[str, int], int]:
    """``Any`` uses per room of core/runjob (``host``, ``train``, ...; a top-level module is its own
    room), and the package's lines."""
    rooms: dict[str, int] = {}
    lines = 0
    for path in sorted(CORE.rglob("*.py")):
        source = path.read_text()
        parts = path.relative_to(CORE).parts
        rooms[parts[0]] = rooms.get(parts[0], 0) + any_uses(source)
        lines += len(source.splitlines())
    return rooms, lines


def test_any_counts_uses_not_imports_or_docstrings():
    source = (
        '"""Any docstring."""\n'
        "from typing import Any\n"
        "import typing\n"
        "# Any comment\n"
        "def f(x: Any, y: typing.Any) -> list[Any]:\n"
        '    """Any."""\n'
        "    return cast(Any, [x, y])\n"
    )
    assert any_uses(source) == 4


def test_readme_states_a_ceiling_on_any_that_holds():
    """The README's development section says how often ``Any`` appears in core/runjob; the code may
    use it less (then lower the sentence's number), never more."""
    readme = documentation()
    found = re.search(
        r"`Any` appears (\d[\d,]*) times in (\d[\d,]*) lines of core/runjob \(([\d.]+) per 1,000\)", readme
    )
    assert found, "README.md's Development section: `Any` appears N times in M lines of core/runjob (X per 1,000)"
    ceiling, stated_lines = (int(found.group(group).replace(",", "")) for group in (1, 2))
    assert f"{1000 * ceiling / stated_lines:.1f}" == found.group(3), "the sentence's rate is N * 1000 / M"
    rooms, lines = any_count()
    used = sum(rooms.values())
    by_room = ", ".join(f"{room} {count}" for room, count in sorted(rooms.items(), key=lambda item: -item[1]) if count)
    assert used <= ceiling, f"`Any` is used {used} times in core/runjob, the README says at most {ceiling}: {by_room}"
