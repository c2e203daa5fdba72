"""``runjob plugins``: every plugin (installed, and local ones given with ``-p``), what it registers,
conflicts, warnings, disabled plugins and failures; with ``--long``, every component of each kind with
its plugin and description."""

from __future__ import annotations

import argparse
import shutil
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runjob.host.plugin_host import PluginHost

LISTING_WIDTH = 100
"""The short listing's width, whatever the terminal (its lines are names, easy to read at 100)."""


def add_plugins_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``plugins`` command's own options."""
    parser.add_argument(
        "-l",
        "--long",
        action="store_true",
        help="also list every component of each kind with its plugin and description",
    )


def cmd_plugins(args: argparse.Namespace) -> int:
    # lazy: `runjob --help` imports this module and stays quick: kinds and plugin_host pull pydantic (+1.4 s)
    from runjob.host.kinds import BY_NAME
    from runjob.host.plugin_host import DISABLE_FLAG, disabled_plugins, load_plugins

    # the flag's names are in $RUNJOB_DISABLE_PLUGINS too (the CLI put them there): name them as given
    host = load_plugins(disabled_plugins(getattr(args, "disable_plugins", [])))
    for info in host.plugins:
        if info.local is not None:  # -p: where it was loaded from, and how it was given
            how = f"-p {info.local.given}" if info.local.kind != "object" else "runjob.run(plugins=[...])"
            print(f"{info.name}  (local {info.local.where}, {how})")
        else:
            print(f"{info.name}  ({info.distribution} {info.version}, {info.module})")
        for kind, names in sorted(info.registers.items()):
            text = f"{BY_NAME[kind].plural}: {', '.join(names)}"
            print(textwrap.fill(text, width=LISTING_WIDTH, initial_indent="    ", subsequent_indent="        "))
        other_hooks = [h for h in info.hooks if not h.startswith("runjob_register_")]
        if other_hooks:
            print(f"    hooks: {', '.join(other_hooks)}")
    if getattr(args, "long", False):
        print_components(host, shutil.get_terminal_size((LISTING_WIDTH, 24)).columns)
    for (kind, name), _owners in sorted(host.duplicates.items()):
        print(f"CONFLICT: {host.conflict(kind, name)}")
    for warning in host.warnings:
        print(f"WARNING: {warning}")
    for off in host.disabled:
        how = f"by {DISABLE_FLAG}" if off.by == DISABLE_FLAG else f"by ${off.by}"
        print(f"DISABLED: {off.name}  ({off.distribution} {off.version}) {how}")
    for failure in host.failures:
        print(f"FAILED: {failure.name}  ({failure.distribution} {failure.version}): {failure.error}")
    return 0


def print_components(host: PluginHost, width: int) -> None:
    """Per kind, one entry per registration: ``name  (plugin)  description``, the descriptions
    lined up in one column and wrapped to ``width`` (under the entry when the column would leave
    them too little room)."""
    # lazy: `runjob --help` imports this module and stays quick: kinds and plugin_host pull pydantic (+1.4 s)
    from runjob.host.kinds import KINDS

    for kind in KINDS:
        components = [c for registered in host.registrations[kind.name].values() for c in registered]
        if not components:
            continue
        print(f"\n{kind.plural}:")
        heads = [f"    {c.name}  ({c.plugin})" for c in components]
        column = max(len(head) for head in heads) + 2
        if width - column < 40:  # a long name would squeeze every description: put them under it
            column = 8
        for head, component in zip(heads, components, strict=True):
            description = " ".join(component.description.split()) or "(no description)"
            prefix = head.ljust(column)
            if len(head) + 2 > column:
                print(head)
                prefix = " " * column
            for line in textwrap.wrap(description, width=max(width - column, 20)):
                print(f"{prefix}{line}")
                prefix = " " * column
    print()
