"""``runjob plugins``: every plugin, what it registers, conflicts, warnings, disabled plugins and failures."""

from __future__ import annotations

import argparse
import textwrap


def cmd_plugins(args: argparse.Namespace) -> int:
    from runjob.host.kinds import BY_NAME
    from runjob.host.plugin_host import DISABLE_FLAG, disabled_plugins, load_plugins

    # the flag's names are in $RUNJOB_DISABLE_PLUGINS too (the CLI put them there): name them as given
    host = load_plugins(disabled_plugins(getattr(args, "disable_plugins", [])))
    for info in host.plugins:
        print(f"{info.name}  ({info.distribution} {info.version}, {info.module})")
        for kind, names in sorted(info.registers.items()):
            text = f"{BY_NAME[kind].plural}: {', '.join(names)}"
            print(textwrap.fill(text, width=100, initial_indent="    ", subsequent_indent="        "))
        other_hooks = [h for h in info.hooks if not h.startswith("runjob_register_")]
        if other_hooks:
            print(f"    hooks: {', '.join(other_hooks)}")
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
