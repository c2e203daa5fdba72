"""One owner per name (issue 32): every tag name runjob writes or reads is spelled in
``runjob.tags`` only (users search their runs by these names: two spellings drift apart), and
no constant of ``core/`` is defined twice. Pure AST over the sources: no runjob module is run."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import runjob.tags as tags

ROOT = Path(__file__).resolve().parent.parent
OWNER = ROOT / "core" / "runjob" / "tags.py"
SOURCES = [
    ROOT / "core",
    ROOT / "plugins" / "runjob_builtins",
    *sorted(ROOT.glob("plugins/*/src")),
    *sorted(ROOT.glob("examples/*/src")),
]
DOTTED = re.compile(r"(?:runjob|mlflow)(?:\.\w+)+")  # a name as runjob spells tags: runjob.sweep.trial
TOP_LEVEL = re.compile(r"^([A-Z][A-Z0-9_]*)\s*(?::[^=\n]*)?=(?!=)", re.MULTILINE)  # NAME = ..., NAME: T = ...


def tag_names() -> tuple[dict[str, str], dict[str, str]]:
    """The tags module's names, value -> constant: whole names, and prefixes (``*_PREFIX``) of a family."""
    names, prefixes = {}, {}
    for constant, value in vars(tags).items():
        if constant.isupper() and isinstance(value, str):
            (prefixes if constant.endswith("_PREFIX") else names).setdefault(value, constant)
    return names, prefixes


def spelled_tags(source: str) -> list[tuple[int, str, str]]:
    """(line, string, constant) for each string in ``source`` (an f-string's literal parts too) that
    spells a tag name: one of the module's names as a whole dotted name at its start, or a string
    starting with one of its prefixes (``f"runjob.baseline.{name}"``)."""
    names, prefixes = tag_names()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        dotted = DOTTED.match(node.value)
        if dotted and dotted.group() in names:
            found.append((node.lineno, node.col_offset, node.value, names[dotted.group()]))
        found += [
            (node.lineno, node.col_offset, node.value, c) for p, c in prefixes.items() if node.value.startswith(p)
        ]
    return [(line, text, constant) for line, _, text, constant in sorted(found)]


def may_spell_tags(source: str) -> bool:
    """Whether a string in ``source`` may start with a tag's name or prefix: one right after a quote
    or an f-string's ``}``. Only those files are parsed (parsing every file takes most of a second)."""
    names, prefixes = tag_names()
    starts = "|".join(map(re.escape, sorted(prefixes)))
    candidates = re.finditer(rf"(?<=[\"'}}])(?:{starts}|{DOTTED.pattern})", source)
    return any(m.group() in names or m.group() in prefixes for m in candidates)


def sources(*folders: Path) -> list[tuple[Path, str]]:
    return [(path, path.read_text(encoding="utf-8")) for folder in folders for path in sorted(folder.rglob("*.py"))]


def test_every_tag_name_is_spelled_in_the_tags_module_only():
    spelled = [
        f"{path.relative_to(ROOT)}:{line}: {text!r} spells runjob.tags.{constant}: import it from there"
        for path, source in sources(*SOURCES)
        if path != OWNER and may_spell_tags(source)
        for line, text, constant in spelled_tags(source)
    ]
    assert not spelled, "\n".join(spelled)


def test_the_check_finds_a_tag_spelled_anywhere_and_passes_module_paths_over():
    source = """
STOPPED = "runjob.stopped"
tags = {f"runjob.baseline.{name}": 1.0, "mlflow.note.content": "x", "runjob.sweep.trial": "3"}
help = ("the new run is tagged ", "runjob.rerun_of=RUN_ID.", "a runjob.sweep.trial tag")
modules = ["runjob.host.components", "runjob_builtins.tabular", "runjob.testing", "runjob.log"]
flops = f"runjob.flops_per_{unit}"
"""
    assert [(line, constant) for line, _, constant in spelled_tags(source)] == [
        (2, "STOPPED_TAG"),
        (3, "BASELINE_TAG_PREFIX"),
        (3, "NOTE_TAG"),
        (3, "SWEEP_TRIAL_TAG"),
        (4, "RERUN_OF_TAG"),
        (6, "FLOPS_PER_TAG_PREFIX"),
    ]
    assert may_spell_tags(source) and may_spell_tags('x = f"{a}runjob.flops_per_{unit}"')
    assert not may_spell_tags('from runjob.tags import X\n"""Tagged ``runjob.metrics`` (runjob.sweep)."""')


def module_constants(source: str) -> list[tuple[str, object, int]]:
    """(name, value, line) of each UPPER_CASE name a module assigns a literal at its top level."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not (isinstance(target, ast.Name) and target.id.isupper()):
            continue
        try:
            literal = ast.literal_eval(value)
        except (ValueError, TypeError):  # computed (a call, another name): not a literal
            continue
        found.append((target.id, literal, node.lineno))
    return found


def test_no_constant_of_core_is_defined_twice():
    """Only modules that assign a top-level name another module also assigns are parsed (found by
    :data:`TOP_LEVEL`, which sees every top-level ``NAME =`` line, and more: an import is none)."""
    modules = defaultdict(list)
    for path, source in sources(ROOT / "core"):
        for name in set(TOP_LEVEL.findall(source)):
            modules[name].append((path, source))
    places = defaultdict(list)
    for name, assigned in modules.items():
        for path, source in assigned if len(assigned) > 1 else []:
            for constant, value, line in module_constants(source):
                if constant == name:
                    places[name, repr(value)].append(f"{path.relative_to(ROOT)}:{line}")
    twice = [f"{name} = {value} in {', '.join(where)}" for (name, value), where in places.items() if len(where) > 1]
    assert not twice, "defined twice (keep one; the other module imports it):\n" + "\n".join(twice)


def test_each_tag_name_has_one_constant():
    """Within the tags module too: a run's tag (``*_TAG``) has one name (the study's and trials'
    Optuna attributes, ``*_ATTR``, are another namespace, and may share a tag's text)."""
    source = OWNER.read_text(encoding="utf-8")
    constants = [(name, value, line) for name, value, line in module_constants(source) if name.endswith("_TAG")]
    by_value = defaultdict(list)
    for name, value, _ in constants:
        by_value[value].append(name)
    assert constants, "the tags module defines its tags as literals"
    assert {value: names for value, names in by_value.items() if len(names) > 1} == {}


OPTUNA_PRIVATE = {"_storage", "_study_id", "_trial_id", "_backend", "_cached_frozen_trial"}
"""Optuna's private attributes the sweep engine once reached (issue 32): its storage API is public."""


def test_the_sweep_engine_uses_only_optunas_public_api():
    reached = []
    for folder in SOURCES:
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr in OPTUNA_PRIVATE:
                    owner = node.value.id if isinstance(node.value, ast.Name) else ""
                    if owner not in ("self", "cls"):  # an object's own private state is its business
                        reached.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    assert not reached, "Optuna's private names reached:\n" + "\n".join(reached)
