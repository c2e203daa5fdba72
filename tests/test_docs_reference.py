"""The documentation site's reference, generated from the code (docs/gen_reference.py), documents all of
it: the site builds with ``mkdocs build --strict``, and every job-file key, every command-line option,
every hook, every built-in component (and its options) and every public name of ``runjob`` has its
entry. The lists come from the code itself, so a key, option or hook added without documentation,
or one the generator misses, fails here."""

from __future__ import annotations

import argparse
import html
import re
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import pluggy
import pytest
from helpers import REPO
from pydantic import BaseModel

import runjob
from runjob.commands.cli import build_parser
from runjob.host import hookspecs, kinds
from runjob.host.kinds import KINDS
from runjob.host.plugin_host import load_plugins
from runjob.job import validation
from runjob.job.schema import SWEEP_TABLE, TABLE_ORDER, LoaderOptions, SweepTable

pytestmark = pytest.mark.slow  # one site build: about 15 s on a CI core


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return folder


def ids(site: Path, page: str) -> set[str]:
    """The ``id`` attributes of a generated page (``reference/cli`` -> reference/cli/index.html)."""
    text = (site / page / "index.html").read_text()
    return {html.unescape(found) for found in re.findall(r'\bid="([^"]+)"', text)}


def anchored(site: Path, page: str) -> dict[str, set[str]]:
    """Each key's or option's id on a reference page (a ``<span id>`` in its table row's first cell)
    -> the code texts of that cell (``--help``, ``batch_size``)."""
    text = (site / page / "index.html").read_text()
    found: dict[str, set[str]] = {}
    for first_cell in re.findall(r"<tr>\s*<td>(.*?)</td>", text, re.S):
        codes = {html.unescape(code) for code in re.findall(r"<code>([^<]*)</code>", first_cell)}
        for anchor in re.findall(r'<span id="([^"]+)"></span>', first_cell):
            found[html.unescape(anchor)] = codes
    return found


def models_in(annotation: object) -> Iterator[type[BaseModel]]:
    """The pydantic models a field's type holds (``list[ParamGroup]``, ``SweepPruner | None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from models_in(arg)


def keys(model: type[BaseModel], prefix: str) -> Iterator[str]:
    """``prefix.key`` for each field, and the keys of the tables nested in it."""
    for key, field in model.model_fields.items():
        yield f"{prefix}.{key}"
        for inner in models_in(field.annotation):
            yield from keys(inner, f"{prefix}.{key}")


def test_every_job_table_and_key_has_an_entry(site: Path) -> None:
    tables: dict[str, type[BaseModel]] = {
        **validation._HOST_MODELS,
        SWEEP_TABLE: SweepTable,
        **validation._SETUP_MODELS,
        "dataset": LoaderOptions,
    }
    tables.update({kind.plural + ".NAME": kind.options_base for kind in KINDS if kind.many})
    expected = {key for table, model in tables.items() for key in keys(model, table)}
    expected |= {f"{kind}.name" for kind in kinds.NAMES}  # [model] name = ..., the kinds a job picks one of
    assert len(expected) > 50
    documented = anchored(site, "reference/job-file")
    missing = sorted(key for key in expected if key.rsplit(".", 1)[1] not in documented.get(key, set()))
    assert not missing, f"job keys without an entry in reference/job-file: {missing}"
    page_ids = ids(site, "reference/job-file")
    assert set(TABLE_ORDER) | {SWEEP_TABLE} <= page_ids


def command_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from command_parsers(child)


def test_every_command_and_option_has_an_entry(site: Path) -> None:
    parsers = list(command_parsers(build_parser()))
    assert any(parser.prog == "runjob data convert" for parser in parsers)
    expected: dict[str, str] = {}
    for parser in parsers:
        where = parser.prog.replace(" ", "-")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            for flag in action.option_strings:
                expected[f"{where}-{flag}"] = flag
            if not action.option_strings:
                expected[f"{where}-{action.dest}"] = str(action.metavar or action.dest)
    documented = anchored(site, "reference/cli")
    missing = sorted(anchor for anchor, text in expected.items() if text not in documented.get(anchor, set()))
    assert not missing, f"options without an entry in reference/cli: {missing}"
    page_ids = ids(site, "reference/cli")
    assert {parser.prog.replace(" ", "-") for parser in parsers} <= page_ids


def test_every_hook_has_an_entry(site: Path) -> None:
    manager = pluggy.PluginManager("runjob")
    manager.add_hookspecs(hookspecs)
    hooks = [name for name in vars(manager.hook) if name.startswith("runjob_")]
    assert "runjob_register_models" in hooks and "runjob_run_end" in hooks
    page_ids = ids(site, "reference/hooks")
    missing = sorted(name for name in hooks if f"runjob.host.hookspecs.{name}" not in page_ids)
    assert not missing, f"hooks without an entry in reference/hooks: {missing}"


def test_every_builtin_component_and_its_options_have_an_entry(site: Path) -> None:
    host = load_plugins(disabled={}, local=[])
    builtin = {info.name for info in host.plugins if info.builtin}
    page_ids = ids(site, "reference/components")
    documented = anchored(site, "reference/components")
    missing: list[str] = []
    for kind in KINDS:
        assert kind.name in page_ids, f"no section for {kind.plural}"
        components = [c for found in host.registrations[kind.name].values() for c in found if c.plugin in builtin]
        for component in components:
            if f"{kind.name}.{component.name}" not in page_ids:
                missing.append(f"{kind.name} {component.name}")
            # the same options of several components (torchvision's models) are listed at one of them
            fields = set(component.options.model_fields)
            sharing = [f"{kind.name}.{c.name}" for c in components if set(c.options.model_fields) == fields]
            for key in component.options.model_fields:
                if not any(key in documented.get(f"{anchor}.{key}", set()) for anchor in sharing):
                    missing.append(f"{kind.name} {component.name}: {key}")
    assert sum(len(host.registrations[kind.name]) for kind in KINDS) > 30
    assert not missing, f"components or options without an entry in reference/components: {missing}"


def test_every_public_name_has_an_entry(site: Path) -> None:
    page_ids = ids(site, "reference/api")
    names = [name for name in runjob.__all__ if name != "__version__"]
    missing = sorted(name for name in names if f"runjob.{name}" not in page_ids)
    assert not missing, f"public names of runjob without an entry in reference/api: {missing}"
