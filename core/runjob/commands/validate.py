"""``runjob validate JOB``: check a job completely, print it resolved and its plan."""

from __future__ import annotations

import argparse
import sys

from runjob.commands.arguments import overrides_from
from runjob.host.output import screen
from runjob.host.plugin_host import load_plugins
from runjob.job.plan import plan_lines
from runjob.job.schema import sweep_note
from runjob.job.validation import load_resolved


def cmd_validate(args: argparse.Namespace) -> int:
    host = load_plugins()
    job = load_resolved(args.job, overrides_from(args), host)
    if job.sweep is not None:
        from runjob.commands.sweep import check_values  # lazy: only a sweep job needs it (+0.18 s to `runjob validate`)

        check_values(job, host)
        note = sweep_note("the resolved job printed is the base job, without it (its values were checked)")
        screen.each(f"runjob: {note}", err=True)
    sys.stdout.write(job.to_toml())
    for line in plan_lines(job):  # stderr, so stdout stays the resolved job alone
        screen.each(f"runjob: plan: {line}", err=True)
    return 0
