"""``runjob plugins``: every plugin, what it registers, conflicts and failures."""

from __future__ import annotations

import argparse
import textwrap


def cmd_plugins(args: argparse.Namespace) -> int:
    from runjob.host.kinds import BY_NAME
    from runjob.host.plugin_host import load_plugins

    host = load_plugins()
    for info in host.plugins:
        print(f"{info.name}  ({info.distribution} {info.version}, {info.module})")
        for kind, names in sorted(info.registers.items()):
            text = f"{BY_NAME[kind].plural}: {', '.join(names)}"
            print(textwrap.fill(text, width=100, initial_indent="    ", subsequent_indent="        "))
        other_hooks = [h for h in info.hooks if not h.startswith("runjob_register_")]
        if other_hooks:
            print(f"    hooks: {', '.join(other_hooks)}")
    for (kind, name), owners in sorted(host.duplicates.items()):
        print(f"CONFLICT: {kind} {name!r} is registered by {' and '.join(host.plugin_label(c.plugin) for c in owners)}")
    for failure in host.failures:
        print(f"FAILED: {failure.name}  ({failure.distribution} {failure.version}): {failure.error}")
    return 0
