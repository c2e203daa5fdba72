"""``runjob run JOB`` (or ``runjob JOB``): train the job through the one run entry."""

from __future__ import annotations

import argparse

from runjob.commands.arguments import overrides_from
from runjob.host.plugin_host import disabled_plugins
from runjob.sweep.trial import trial_callbacks
from runjob.train.entry import parse_tags, run
from runjob.train.request import TrialContext


def cmd_run(args: argparse.Namespace) -> int:
    trial = TrialContext.from_environment()  # a sweep trial, started by its worker: None otherwise
    outcome = run(
        args.job,
        overrides_from(args),
        output_dir=args.output_dir,
        resume=args.resume,
        tags=parse_tags(args.tags),
        tracking_uri=args.tracking_uri,
        disabled_plugins=disabled_plugins(args.disable_plugins),
        trial=trial,
        callbacks=trial_callbacks(trial),
    )
    return outcome.exit_code
