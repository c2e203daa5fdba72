"""Arguments several commands share: the job and its ``--set`` overrides, the launch flags, the
tracking URI."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", type=Path, help="the job file (TOML)")
    add_overrides(parser)


def add_overrides(parser: argparse.ArgumentParser) -> None:
    """``--set TABLE.KEY=VALUE``, repeatable, into ``args.overrides``."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="TABLE.KEY=VALUE",
        help="override one job key; the value is read as TOML, a bare word as a string (repeatable)",
    )


LAUNCH_FLAGS = {
    "num_processes": (int, "processes in all, across machines (launch.num_processes)"),
    "num_machines": (int, "machines in the job (launch.num_machines)"),
    "machine_rank": (int, "this machine's rank, 0 for the main one (launch.machine_rank)"),
    "main_process_ip": (str, "address of machine 0 (launch.main_process_ip)"),
    "main_process_port": (int, "port on machine 0 (launch.main_process_port)"),
}


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("launch (named as `accelerate launch` names them; they win over [launch])")
    for key, (kind, text) in LAUNCH_FLAGS.items():
        group.add_argument(
            f"--{key.replace('_', '-')}", dest=key, type=kind, metavar=key.split("_")[-1].upper(), help=text
        )


def overrides_from(args: argparse.Namespace) -> list[str]:
    """``--set`` values, then the launch flags as ``launch.*`` overrides (so they win)."""
    overrides = list(args.overrides)
    for key in LAUNCH_FLAGS:
        value = getattr(args, key, None)
        if value is not None:
            overrides.append(f"launch.{key}={value!r}" if isinstance(value, str) else f"launch.{key}={value}")
    return overrides


def add_disable_plugin(parser: argparse.ArgumentParser, dest: str = "disable_plugins") -> None:
    """``--disable-plugin NAME``, repeatable, into ``args.<dest>``."""
    parser.add_argument(
        "--disable-plugin",
        dest=dest,
        action="append",
        default=[],
        metavar="NAME",
        help=(
            "do not load (or import) the plugin of entry-point name NAME, as `runjob plugins` lists it; repeatable, "
            "added to $RUNJOB_DISABLE_PLUGINS (comma-separated)"
        ),
    )


def add_plugin_argument(parser: argparse.ArgumentParser, dest: str = "plugins") -> None:
    """``-p PLUGIN``, repeatable, into ``args.<dest>``: a plugin loaded without being installed."""
    parser.add_argument(
        "-p",
        "--plugin",
        dest=dest,
        action="append",
        default=[],
        metavar="PLUGIN",
        help=(
            "also load the plugin PLUGIN, not installed: a module importable from the working directory (my_plugin) "
            "or a path/to/file.py; for this command and every process it starts; repeatable, added to $RUNJOB_PLUGINS "
            "(comma-separated)"
        ),
    )


def add_tracking_uri(parser: argparse.ArgumentParser, default_text: str) -> None:
    parser.add_argument("--tracking-uri", metavar="URI", help=f"MLflow tracking URI (default: {default_text})")
