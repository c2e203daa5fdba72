"""``runjob sweep``: the trials of a job's ``[sweep]`` table, an Optuna study in durable storage,
run by workers on this machine and others, under one parent MLflow run.

``runjob sweep JOB`` creates the sweep (its folder, its study, its parent run), starts ``--workers``
worker processes (each ``runjob sweep JOB --join FOLDER``, each trial a ``runjob run`` of its own),
logs each trial to the parent as it finishes, and records the end. ``--join`` adds a worker on
any machine that reaches the storage (the first to reach an empty folder creates the sweep);
``--resume`` continues a stopped sweep. This module reads the arguments; the sweep itself is
:mod:`runjob.sweep` (:mod:`runjob.sweep.session` coordinates it).
"""

from __future__ import annotations

import argparse

from runjob.commands.cli import main
from runjob.commands.table import render
from runjob.sweep.checks import check_values
from runjob.sweep.session import CommandLine, SweepOrder, load, plan, sweep

__all__ = ["check_values", "cmd_sweep"]  # check_values: `runjob validate` checks a sweep's values too


def cmd_sweep(args: argparse.Namespace) -> int:
    """``runjob sweep JOB.toml [--workers N | --join SWEEP | --resume SWEEP]``.

    Exit 0 when at least one trial finished (a joining worker: when it ran its share), 1 when none
    did, 2 for a mistake in the job (found before any trial, or a trial exiting with 2), 128 +
    signal when stopped.
    """
    job = load(args.job, args.overrides)
    order = SweepOrder(
        job_file=args.job,
        overrides=list(args.overrides),
        command_line=CommandLine(main, render),  # trials are forked from a worker into runjob's command line
        output_dir=args.output_dir,
        workers=args.workers,
        join=args.join,
        resume=args.resume,
    )
    order.plans = plan(job, args.workers)
    return sweep(job, order)
