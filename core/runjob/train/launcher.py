"""Starting the worker processes of a job, through ``torch.distributed.run`` (torchrun's own code).

``runjob JOB --num-processes N`` becomes, on each machine, one torchrun agent that starts
``num_processes / num_machines`` workers running ``python -m runjob run JOB``. Workers find they
were launched from the environment torchrun sets (``WORLD_SIZE``), as they do under ``torchrun``,
``accelerate launch`` or ``srun`` started by someone else.
"""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from runjob.errors import RunjobError
from runjob.host.output import screen
from runjob.record.invocation import ENVIRONMENT as COMMAND_ENVIRONMENT
from runjob.record.invocation import command_prefix
from runjob.record.logfile import LibraryLog
from runjob.record.mlflow_writer import close_failed_run
from runjob.record.store import environment
from runjob.train.checkpoints import complete_checkpoints
from runjob.train.run_command import resume_command
from runjob.train.stopping import StopSignals

if TYPE_CHECKING:
    from runjob.job.schema import LaunchTable

GoingOn: TypeAlias = "tuple[str | Path, list[str], str | None]"
"""The job file, overrides and tracking URI of a run, for the command that goes on with it."""


def launched_processes() -> int:
    """How many processes a launcher (torchrun, accelerate launch, srun) started: ``WORLD_SIZE``."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def is_worker() -> bool:
    """True inside a process that a launcher started (so it must not launch again)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def adopt_slurm_environment() -> None:
    """Under ``srun`` with one task per process and no torchrun, set the variables torch reads.

    Slurm gives each task ``SLURM_PROCID``, ``SLURM_NTASKS`` and ``SLURM_LOCALID``; the sbatch
    script must export ``MASTER_ADDR`` and ``MASTER_PORT`` (see containers/slurm/).
    """
    if is_worker() or int(os.environ.get("SLURM_NTASKS", "1")) <= 1 or "SLURM_PROCID" not in os.environ:
        return
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise RunjobError(
            f"started by srun as {os.environ['SLURM_NTASKS']} tasks, but {' and '.join(missing)} not set: export them "
            "in the sbatch script"
        )
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    if "SLURM_NTASKS_PER_NODE" in os.environ:
        os.environ["LOCAL_WORLD_SIZE"] = os.environ["SLURM_NTASKS_PER_NODE"].split("(")[0]


def check_launched_as_asked(launch: LaunchTable) -> None:
    """A job that says how many processes it wants must get that many from an outside launcher."""
    started = launched_processes()
    if launch.num_processes != 1 and started != launch.num_processes:
        raise RunjobError(
            f"launch.num_processes = {launch.num_processes}, but the launcher started {started} processes (WORLD_SIZE)"
        )


def torchrun_arguments(launch: LaunchTable, run_arguments: list[str]) -> list[str]:
    """The ``torch.distributed.run`` command line that starts this machine's workers, each running
    ``python -m runjob`` with ``run_arguments`` (see :func:`runjob.train.run_command.run_arguments`)."""
    arguments = [
        "--nnodes",
        str(launch.num_machines),
        "--nproc-per-node",
        str(launch.processes_per_machine),
        "--max-restarts",
        "0",
    ]
    if launch.num_machines == 1 and launch.main_process_port is None:
        arguments.append("--standalone")  # a free port on this machine
    else:
        arguments += [
            "--node-rank",
            str(launch.machine_rank),
            "--master-addr",
            launch.main_process_ip or "127.0.0.1",
            "--master-port",
            str(launch.main_process_port or 29500),
        ]
    return [*arguments, "-m", "runjob", *run_arguments]


TORCHRUN_SIGNALS = "PET_SIGNALS_TO_HANDLE"
"""torchrun's ``--signals-to-handle``, given through the environment as torchrun reads any option:
the signals it turns into a shutdown of the workers (default SIGTERM, SIGINT, SIGHUP, SIGQUIT). It
copies the value to ``TORCHELASTIC_SIGNALS_TO_HANDLE``. A torch without the option (before 2.9)
installs its handler for SIGTERM and SIGINT over runjob's: then each repeated Ctrl-C ends torchrun's
wait, and its second wait (a SIGTERM shutdown) is all that keeps the workers' checkpoint."""
TORCHRUN_SIGNALS_SET = "TORCHELASTIC_SIGNALS_TO_HANDLE"


def launch_workers(
    launch: LaunchTable,
    run_arguments: list[str],
    output_dir: Path | None,
    stop_signal: str | None = None,
    going_on: GoingOn | None = None,
) -> int:
    """Start the workers and wait; returns 0, or the exit code of the first worker that failed.

    A stop signal sent to this process (SIGTERM from a scheduler, Ctrl-C, SIGHUP, ``stop_signal``) reaches
    the workers through torchrun, which gives them time to write a checkpoint; the exit code is then
    128 + signal, and the last lines say the newest checkpoint and how to go on (``going_on``: the
    job file, overrides and tracking URI for :func:`runjob.train.run_command.resume_command`).
    Only a new Ctrl-C (:mod:`runjob.train.stopping`) is passed on again, to stop the workers at once,
    and this process waits for them. torchrun's own handler ends its wait at each repeated signal:
    the copy ``uv run`` passes on turned a Ctrl-C into a second shutdown with SIGTERM, and a second
    Ctrl-C then left the workers running, in sessions of their own, after this process exited.
    """
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    arguments = torchrun_arguments(launch, run_arguments)
    # torchrun gives each of several workers one thread when OMP_NUM_THREADS is not set, and says so
    # in a banner that goes to runjob.log with its other log records: said here in runjob's words
    threads = ""
    if "OMP_NUM_THREADS" not in os.environ and launch.processes_per_machine > 1:
        threads = ", 1 thread each: set OMP_NUM_THREADS for more"
    screen.each(
        f"runjob: starting {launch.processes_per_machine} worker(s) on machine {launch.machine_rank} of "
        f"{launch.num_machines} (torch.distributed.run{threads})",
        err=True,
    )
    ours = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, *([getattr(signal, stop_signal)] if stop_signal else [])]

    def shut_down(signum: int) -> None:  # torchrun's own way: it sends the signal to every worker and waits
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))

    theirs = (os.environ.get(TORCHRUN_SIGNALS) or "SIGTERM,SIGINT,SIGHUP,SIGQUIT").split(",")
    left = ",".join(s for s in theirs if s.strip() not in {x.name for x in ours}) or "SIGQUIT"
    # the workers' printed commands start as this one was started (uv run, python -m, a full path)
    settings = {TORCHRUN_SIGNALS: left, TORCHRUN_SIGNALS_SET: left, COMMAND_ENVIRONMENT: shlex.join(command_prefix())}
    listener = StopSignals(ours, shut_down, on_again=_interrupt_workers)
    try:  # torchrun copies the option into TORCHRUN_SIGNALS_SET: both are put back after
        with environment(settings), listener, LibraryLog("launcher") as log:
            if output_dir is not None:  # torchrun's log records (its OMP_NUM_THREADS banner) go to runjob.log
                log.open_in(output_dir)
            run(parse_args(arguments))  # type: ignore[no-untyped-call]  # torchrun's own code has no annotations
    except SignalException as stopped:
        _say_stopped(stopped.sigval, listener.again, output_dir, going_on)
        return 128 + int(stopped.sigval)
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        code = failure.exitcode if failure.exitcode >= 0 else 128 - failure.exitcode
        reason = f"worker rank {rank} exited with code {code}"
        if failure.exitcode < 0:
            reason += f" ({signal.Signals(-failure.exitcode).name})"
        screen.each(f"runjob: {reason}; the job was stopped", err=True)
        if output_dir is not None:
            close_failed_run(output_dir, reason)
        return code or 1
    return 0


def _interrupt_workers() -> None:
    """A new Ctrl-C while the workers stop: pass it on (each worker leads a session of its own,
    with its DataLoader workers), so they stop at once."""
    import psutil  # lazy: only where a launch's processes are watched

    for child in psutil.Process().children():
        try:
            if os.getpgid(child.pid) == child.pid:
                os.killpg(child.pid, signal.SIGINT)
        except (ProcessLookupError, PermissionError):
            pass  # it has just exited


def _say_stopped(sigval: signal.Signals, at_once: bool, output_dir: Path | None, going_on: GoingOn | None) -> None:
    how = (
        "at once by a second Ctrl-C" if at_once else f"by {sigval.name}; the workers were asked to checkpoint and stop"
    )
    found = complete_checkpoints(output_dir) if output_dir is not None else []
    newest = f"newest complete checkpoint {found[-1]}" if found else "no complete checkpoint was written"
    screen.each(f"runjob: stopped {how}; {newest}", err=True)
    if going_on is not None and output_dir is not None:
        job_file, overrides, tracking_uri = going_on
        command = resume_command(job_file, overrides, output_dir, tracking_uri, afresh=not found)
        screen.each(f"runjob: to {'go on' if found else 'start again there'}: {command}", err=True)
