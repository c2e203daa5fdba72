"""A sweep worker: takes trials from the study until none is left, and runs each as ``runjob run``
in a process of its own (so ``[launch]`` works for trials too), in the trial's folder: forked from
the worker, which imported the heavy libraries once (:func:`preload`), or a fresh interpreter.

A trial's run gets the worker's devices or thread counts, its :class:`~runjob.train.request.TrialContext`
(its values, its study and number, the parent run: JSON in ``$RUNJOB_SWEEP_TRIAL``), and ``--resume
auto`` when it continues an interrupted trial; it sends its outcome (its run, its metrics, whether it
was pruned) back through a pipe (:mod:`runjob.sweep.trial`). It dies with its worker (Linux: the
parent-death signal is SIGTERM, so it checkpoints first) and holds the trial's lock while it lives.
SIGINT and SIGTERM are passed on to it; the trial then stays RUNNING in the study, interrupted, for
the next worker or ``runjob sweep --resume`` to continue.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from runjob.errors import RunjobError
from runjob.host.output import screen
from runjob.record.local import RunRecord, last_values
from runjob.record.sync import make_whole
from runjob.sweep.study import Claim, FileLock, SweepStudy, this_worker
from runjob.sweep.sweep_folder import CONSOLE_FILE, LOCK_FILE
from runjob.sweep.trial import TrialOutcome, receive
from runjob.tags import (
    INTERRUPTED_ATTR,
    MESSAGE_ATTR,
    RUN_ID_ATTR,
    STOPPED_ATTR,
    STOPPED_TAG,
    SWEEP_PRUNED_TAG,
    UNSYNCED_ATTR,
    WORKER_ATTR,
)
from runjob.train.entry import run_arguments
from runjob.train.request import TRIAL_ENVIRONMENT, Resume, TrialContext, toml_value

USER_MISTAKE_EXIT = 2  # a trial that exits with this stops the sweep: every other trial would repeat it
FORK_ENVIRONMENT = "RUNJOB_SWEEP_FORK"  # "0": each trial starts an interpreter of its own instead


__all__ = ["toml_value"]  # one line of TOML for a value (runjob.train.request's), as the summary shows it


def override(key: str, value: object) -> str:
    """The ``--set`` text that gives job key ``key`` the value ``value``."""
    return f"{key}={toml_value(value)}"


def shown(values: dict[str, object]) -> str:
    return " ".join(
        f"{key}={value:.4g}" if isinstance(value, float) else override(key, value) for key, value in values.items()
    )


def _die_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the process that started it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_child(
    command: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = (), output: IO[bytes] | None = None
) -> subprocess.Popen[bytes]:
    """``command`` in a session of its own (a terminal's Ctrl-C reaches it once, through its
    parent), dying with its parent."""
    return subprocess.Popen(
        command,
        start_new_session=True,
        env=env,
        pass_fds=pass_fds,
        preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509 - no threads yet here
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
    )


def preload(environment: dict[str, str]) -> bool:
    """Import what every trial's run imports (torch, Accelerate, MLflow, runjob's loop), once, so
    each trial is forked from this worker instead of starting an interpreter: a trial's start-up
    costs ~7 CPU seconds less (its imports, and a recording process importing MLflow again; with
    MLflow imported, the run records in a thread), and ~4 more with what a run imports only as it
    goes (the optimizer's ``torch._dynamo``, MLflow's SQL store). ``environment`` (the worker's thread counts,
    devices) is set first: OpenMP reads its thread count when torch is imported. Linux only, and
    not with ``RUNJOB_SWEEP_FORK=0``; True when trials will be forked."""
    if sys.platform != "linux" or os.environ.get(FORK_ENVIRONMENT) == "0":
        return False
    os.environ.update(environment)
    # lazy: importing these once, after the environment is set, is what this function is for
    import accelerate  # noqa: F401
    import mlflow  # noqa: F401
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 - the default store's (sqlite) 1.7 CPU s
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401 - what a run's first optimizer imports: 2.6 CPU s, 880 modules

    import runjob.train.runner  # noqa: F401  # lazy: the loop's modules too, before forking

    return threading.active_count() == 1  # forking a process with threads may deadlock its child


class ForkedTrial:
    """One trial's ``runjob ARGUMENTS``, forked from the worker: a process of its own (a session of
    its own, dying with the worker), its output to ``output`` when given; what ``Signals`` and the
    worker need of a ``Popen``."""

    def __init__(
        self,
        main: Callable[[list[str]], int],
        arguments: list[str],
        env: dict[str, str],
        output: IO[bytes] | None = None,
    ) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:  # the trial
            self._child(main, arguments, env, output)

    @staticmethod
    def _child(
        main: Callable[[list[str]], int], arguments: list[str], env: dict[str, str], output: IO[bytes] | None
    ) -> None:
        code = 1
        try:
            os.setsid()
            _die_with_parent()
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_DFL)
            if output is not None:
                os.dup2(output.fileno(), 1)
                os.dup2(output.fileno(), 2)
            os.environ.clear()
            os.environ.update(env)
            code = main(arguments)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        except BaseException:  # noqa: BLE001 - the trial's process ends here whatever happened
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
            except InterruptedError:  # a signal arrived: Python retries, but be safe
                continue
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


Child = subprocess.Popen[bytes] | ForkedTrial
"""A process a worker started and waits for: a trial, or (``runjob sweep --workers``) a worker."""


class Signals:
    """While active, SIGINT and SIGTERM are remembered and passed on to the children started,
    which stop after a checkpoint."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.children: list[Child] = []

    def _receive(self, signum: int, frame: FrameType | None) -> None:
        self.signum = self.signum or signum
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signum)

    @contextlib.contextmanager
    def active(self) -> Iterator[Signals]:
        previous = {s: signal.signal(s, self._receive) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def watch(self, child: Child) -> None:
        self.children.append(child)
        if self.signum:  # the signal came while the child was starting
            child.send_signal(self.signum)


@dataclass
class Outcome:
    """What came of one trial, as the worker saw it."""

    number: int
    values: dict[str, object]
    state: str  # complete, pruned, fail or interrupted
    value: float | None = None
    run_id: str | None = None
    message: str = ""
    code: int = 0
    unsynced: str | None = None
    """What its MLflow run still lacks after the worker tried to send it (``make_whole``)."""


@dataclass
class Worker:
    """One worker of the sweep in ``study.folder``: the job, the tags every trial gets, the
    environment its trials add (devices, threads), whether their output goes to files."""

    study: SweepStudy
    job_file: Path
    overrides: list[str]
    parent_run_id: str
    environment: dict[str, str] = field(default_factory=dict)
    quiet: bool = False
    after_trial: Callable[[Outcome], None] | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    command_line: Callable[[list[str]], int] | None = None
    """runjob's command line (``runjob.commands.cli.main``): given, trials are forked from this
    worker (see :func:`preload`); else each is ``python -m runjob`` of its own."""
    forking: bool = False

    def run(self, signals: Signals) -> list[Outcome]:
        """Take and run trials until none is left or a signal came; a trial's user mistake (exit 2)
        stops every worker (RunjobError here)."""
        study = self.study
        with FileLock(study.folder / LOCK_FILE):
            study.join()
        self.forking = self.command_line is not None and preload(self.environment)
        while not signals.signum:
            with FileLock(study.folder / LOCK_FILE):
                claim = study.claim()
            if claim is None:
                break
            try:
                outcome = self._run(claim, signals)
            finally:
                claim.lock.release()
            self.outcomes.append(outcome)
            if self.after_trial is not None:
                self.after_trial(outcome)
            if outcome.state == "fail" and outcome.code == USER_MISTAKE_EXIT:
                reason = f"trial {outcome.number} ({shown(outcome.values)}) stopped with a mistake in the job"
                study.study.set_user_attr(STOPPED_ATTR, reason)
                raise RunjobError(f"sweep {reason} or its setup (above) that every trial would repeat; the sweep stops")
        return self.outcomes

    def _context(self, claim: Claim, outcome_fd: int) -> TrialContext:
        """What the trial's run is given: its values, its study and number, the parent, its GPUs."""
        study = self.study
        sweep = study.sweep
        devices = self.environment.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
        return TrialContext(
            study=study.study.study_name,
            number=claim.number,
            storage=study.storage,
            parent_run_id=self.parent_run_id,
            keys=list(sweep.parameters),
            values=claim.values,
            pruner=sweep.pruner.name,
            devices=devices or None,
            outcome_fd=outcome_fd,
        )

    def _arguments(self, claim: Claim) -> list[str]:
        """``run JOB --output-dir TRIAL_DIR [--resume auto] --set ...``: the sweep's own overrides
        (the trial's values reach it in its context, as values)."""
        resume = Resume("auto") if claim.resumed else None
        return run_arguments(self.job_file, self.overrides, claim.output_dir, resume)

    def _run(self, claim: Claim, signals: Signals) -> Outcome:
        study = self.study
        label = f"runjob: sweep trial {claim.number}: {shown(claim.values)}"
        where = claim.output_dir / CONSOLE_FILE if self.quiet else None
        doing = "resuming" if claim.resumed else "starting"
        screen.each(f"{label}: {doing} in {claim.output_dir}" + (f" (output in {where.name})" if where else ""))
        assert claim.lock.fd is not None
        reading, writing = os.pipe()  # the trial's outcome comes back through it
        try:
            context = self._context(claim, writing)
            env = {**os.environ, **self.environment, TRIAL_ENVIRONMENT: context.to_environment()}
            with open(where, "ab") if where else contextlib.nullcontext() as output:
                arguments = self._arguments(claim)
                if self.forking and self.command_line is not None:
                    child: Child = ForkedTrial(self.command_line, arguments, env, output)
                else:
                    command = [sys.executable, "-m", "runjob", *arguments]
                    child = start_child(command, env, (claim.lock.fd, writing), output)
                os.close(writing)
                writing = -1
                signals.watch(child)
                try:
                    code = child.wait()
                finally:
                    signals.children.remove(child)
                    if child.poll() is None:  # this worker failed: leave no trial behind
                        child.kill()
                        child.wait()
        finally:
            if writing >= 0:
                os.close(writing)
        sent = receive(reading)
        outcome = read_outcome(claim, code, signals.signum, study.sweep.metric or "", sent)
        if outcome.state != "interrupted":  # (an interrupted trial's run goes on when it is resumed)
            outcome.unsynced = make_whole(claim.output_dir)
        self._record(outcome)
        said = f"{study.sweep.metric} {outcome.value:.4f}" if outcome.value is not None else ""
        screen.each(
            f"{label} -> {outcome.state}"
            + f" {said}".rstrip()
            + (f" ({outcome.message})" if outcome.message and outcome.state != "pruned" else "")
            + (f" (run {outcome.run_id})" if outcome.run_id else "")
        )
        if outcome.unsynced:
            screen.each(f"{label}: warning: {outcome.unsynced}")
        return outcome

    def _record(self, outcome: Outcome) -> None:
        study = self.study
        attrs: dict[str, object] = {MESSAGE_ATTR: outcome.message}
        if outcome.run_id:
            attrs[RUN_ID_ATTR] = outcome.run_id
        if outcome.unsynced:
            attrs[UNSYNCED_ATTR] = outcome.unsynced
        if outcome.state == "interrupted":
            attrs[INTERRUPTED_ATTR] = True  # stays RUNNING: the next worker resumes it
        study.mark(outcome.number, attrs)
        if outcome.state != "interrupted":
            study.tell(outcome.number, outcome.value, outcome.state)


def read_outcome(claim: Claim, code: int, signum: int | None, metric: str, sent: TrialOutcome | None = None) -> Outcome:
    """The trial's end from its exit code and what it sent (``sent``: its run id, its metrics,
    whether the pruner stopped it). A trial stopped by this worker's signal is interrupted; one
    that finished without the metric (or with a non-finite one) failed, saying what it logged.

    A trial that sent nothing (it failed before its run began, it was killed, or its processes were
    launched: its run trained elsewhere), or whose metric its run's events did not carry (a
    callback logged it), is read from its folder: its run's record and ``metrics.jsonl``."""
    record = RunRecord.read(claim.output_dir) if sent is None or sent.run_id is None else None
    run_id = sent.run_id if sent is not None and sent.run_id is not None else record.run_id if record else None
    outcome = Outcome(claim.number, claim.values, "fail", run_id=run_id, code=code)
    if signum:
        outcome.state, outcome.message = "interrupted", f"stopped by signal {signum}"
        return outcome
    if code != 0:
        outcome.message = f"exit code {code}" if code > 0 else f"killed by signal {-code}"
        return outcome
    logged = dict(sent.metrics) if sent is not None else {}
    if metric not in logged:
        logged = {**last_values(claim.output_dir), **logged}
    value = logged.get(metric)
    if value is None:
        outcome.message = f"logged no {metric!r}; it logged: {', '.join(sorted(logged)) or 'nothing'}"
    elif not math.isfinite(value):
        outcome.message = f"{metric} is {value}"
    else:
        if sent is not None:
            pruned = sent.pruned
        else:
            tags = record.tags if record is not None else {}
            pruned = tags.get(STOPPED_TAG, "pruned") if tags.get(SWEEP_PRUNED_TAG) == "true" else None
        outcome.state, outcome.value = ("pruned" if pruned else "complete"), float(value)
        outcome.message = pruned or ""
    return outcome


def wait_for_previous(study: SweepStudy, timeout: float = 300.0) -> None:
    """Before resuming: let the processes of a stopped sweep on this machine finish checkpointing
    (their trials' locks free again), so their trials can be taken over. Trials running on other
    machines are left to their workers."""
    here = this_worker().split()[0]
    deadline = time.monotonic() + timeout
    said = False
    while time.monotonic() < deadline:
        running = set(study.running_elsewhere())
        busy = [
            t.number
            for t in study.trials()
            if t.number in running and str(t.user_attrs.get(WORKER_ATTR, "")).split()[:1] == [here]
        ]
        if not busy:
            return
        if not said:
            screen.each(f"runjob: waiting for trial(s) {', '.join(map(str, busy))} of the stopped sweep to stop ...")
            said = True
        time.sleep(1.0)
