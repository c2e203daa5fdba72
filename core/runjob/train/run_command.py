"""The ``runjob`` command lines a run hands on: the arguments that make another process run the
same job (launched workers, sweep trials), and the command that goes on from a stopped run.

Shared by the entry (:mod:`runjob.train.entry`), the launcher and the session, which each import it
one way: nothing here imports them.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from runjob.host.plugin_host import DISABLE_ENVIRONMENT, local_plugin_arguments
from runjob.job.redaction import redact_override, redact_text
from runjob.record.invocation import command_prefix

if TYPE_CHECKING:
    from runjob.host.plugin_host import LocalPlugin
    from runjob.train.request import Resume


def run_arguments(
    job_file: Path,
    overrides: Sequence[str] = (),
    output_dir: Path | None = None,
    resume: Resume | None = None,
    tags: Mapping[str, str] | None = None,
    tracking_uri: str | None = None,
    disabled_plugins: Mapping[str, str] | None = None,
    plugins: Sequence[LocalPlugin] | None = None,
) -> list[str]:
    """``run JOB --output-dir ... --set ... --tag ...``: the arguments of ``runjob`` that make a
    process of its own call :func:`run` with these values (launched workers, sweep trials); the
    local ``plugins`` (default ``$RUNJOB_PLUGINS``) as ``-p`` that loads them from any folder."""
    arguments = ["run", str(job_file)]
    if output_dir is not None:
        arguments += ["--output-dir", str(output_dir)]
    if resume:
        arguments += resume.argument
    arguments += [part for name in disabled_plugins or {} for part in ("--disable-plugin", name)]
    arguments += local_plugin_arguments(plugins)
    arguments += [part for override in overrides for part in ("--set", override)]
    arguments += [part for key, value in (tags or {}).items() for part in ("--tag", f"{key}={value}")]
    if tracking_uri:
        arguments += ["--tracking-uri", tracking_uri]
    return arguments


def resume_command(
    job_file: str | Path,
    overrides: Sequence[str],
    output_dir: Path,
    tracking_uri: str | None = None,
    *,
    afresh: bool = False,
    redacted: bool = False,
    disabled: Iterable[str] | None = None,
    plugins: Sequence[LocalPlugin] | None = None,
) -> str:
    """The ``runjob`` command, started as this process was (``uv run runjob``, ``python -m
    runjob``...: :mod:`runjob.record.invocation`) and quoted to be pasted into a shell, that
    continues the run in ``output_dir`` from its newest complete checkpoint, with the run's ``--set`` overrides, its
    ``--tracking-uri`` and the plugins it left out. ``afresh``: there is no checkpoint, so
    ``--resume auto``, which starts the run again in that folder (the attempt kept aside).
    ``redacted``: secrets hidden, for the record (then it cannot be pasted as it is). ``disabled``:
    the plugins the run left out (default ``$RUNJOB_DISABLE_PLUGINS``); ``plugins``: its local
    plugins, as ``-p`` that loads them from any folder (default ``$RUNJOB_PLUGINS``)."""
    start = [redact_text(word) if redacted else word for word in command_prefix()]  # uv run runjob, python -m runjob
    words = [*start, str(job_file), "--output-dir", str(output_dir), "--resume", *(["auto"] if afresh else [])]
    words += [part for override in overrides for part in ("--set", redact_override(override) if redacted else override)]
    if tracking_uri:
        words += ["--tracking-uri", redact_text(tracking_uri) if redacted else tracking_uri]
    if disabled is None:
        disabled = [name for name in os.environ.get(DISABLE_ENVIRONMENT, "").split(",") if name.strip()]
    words += [part for name in disabled for part in ("--disable-plugin", name.strip())]
    words += local_plugin_arguments(plugins)
    return shlex.join(words)
