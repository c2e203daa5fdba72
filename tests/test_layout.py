"""The README's layout section draws the rooms as pyproject's import-linter contract orders them, and
folders are import paths (no links, no package-dir mapping)."""

from __future__ import annotations

import re
import tomllib

from helpers import REPO, documentation

import runjob
import runjob_builtins


def contract_layers() -> list[list[str]]:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return [[name.strip().removeprefix("runjob.") for name in re.split(r"[|:]", layer)] for layer in layers]


def test_the_readme_draws_the_rooms_in_the_order_the_contract_enforces():
    (chain,) = set(re.findall(r"^testing ──> .*$", documentation(), re.M))
    drawn = [[name.strip() for name in step.split(",")] for step in chain.split("──>")]
    assert drawn == contract_layers(), chain


def test_folders_are_import_paths():
    assert runjob.__file__ == str(REPO / "core" / "runjob" / "__init__.py")
    assert runjob_builtins.__file__ == str(REPO / "plugins" / "runjob_builtins" / "__init__.py")
    assert not (REPO / "typecheck").exists()
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in setuptools, "a package mapped to a folder of another name"
    for room in ("commands", "sweep", "train", "record", "job", "host"):
        assert (REPO / "core" / "runjob" / room / "__init__.py").is_file(), room
