"""Errors written for the person who will read them.

Every mistake a user can make (a job file, an override, a path, a dataset that does not fit the
model) is raised as a :class:`RunjobError`. The CLI prints its message, one line per problem, and
exits with its ``exit_code``; it never shows a traceback for one of these.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path


class RunjobError(Exception):
    """A problem the user can fix. ``str(error)`` is the whole message."""

    exit_code = 2


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a job: where it is and what is wrong."""

    file: str
    key: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class JobError(RunjobError):
    """A job file (with its bases and overrides) that cannot run; holds every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ComponentError(RunjobError):
    """A component's factory (``[model]``, ``[dataset]``, a ``[callbacks.NAME]``...) failed: the
    message is one line, ``FILE:LINE: [TABLE] NAME: TypeName: what it said``, where FILE:LINE is
    where the job names the component; the factory's own exception is its ``__cause__``."""


class DataError(RunjobError):
    """Data that cannot be read or does not fit what the job says (found while training)."""


class TrainingError(RunjobError):
    """Training cannot go on: the model and data disagree, the device cannot do what was asked."""


class TrackingError(RunjobError):
    """MLflow could not be reached or refused what runjob asked of it."""


class Terminated(BaseException):
    """The process was asked to stop (SIGTERM, Ctrl-C, SIGHUP, ``train.stop_signal``): the run ends KILLED
    after writing ``checkpoint`` at ``step``, the exit code is 128 + signal. ``resume_command``: how
    to go on, set on the main process."""

    def __init__(self, signum: int, checkpoint: Path | None = None, step: int | None = None) -> None:
        self.signum, self.checkpoint, self.step = signum, checkpoint, step
        self.resume_command: str | None = None
        super().__init__(f"stopped by signal {signum}")

    def said(self) -> list[str]:
        """The lines the command line ends with."""
        try:
            name = f" ({signal.Signals(self.signum).name})"
        except ValueError:
            name = ""
        where = f" at step {self.step}" if self.step is not None else ""
        written = f" after writing checkpoint {self.checkpoint}" if self.checkpoint is not None else ""
        lines = [f"stopped by signal {self.signum}{name}{where}{written}"]
        if self.resume_command:
            lines.append(f"to go on: {self.resume_command}")
        return lines


class Interrupted(KeyboardInterrupt):
    """A second Ctrl-C stopped the run at once, without a checkpoint: the run ends KILLED, the exit
    code is 130. ``checkpoint``: the newest complete one (None: there is none); ``resume_command``:
    how to go on from it, or to start again in the same folder."""

    def __init__(self, checkpoint: Path | None, resume_command: str | None) -> None:
        self.checkpoint, self.resume_command = checkpoint, resume_command
        super().__init__("stopped at once by a second Ctrl-C")

    def said(self) -> list[str]:
        """The lines the command line ends with."""
        newest = (
            f"the newest complete checkpoint is {self.checkpoint}"
            if self.checkpoint is not None
            else "there is no complete checkpoint"
        )
        lines = [f"interrupted: stopped at once by a second Ctrl-C, without a checkpoint; {newest}"]
        if self.resume_command:
            lines.append(f"to {'go on' if self.checkpoint is not None else 'start again there'}: {self.resume_command}")
        return lines


def user_message(error: BaseException) -> str:
    """The message to show for ``error``, without the worker traceback DataLoader wraps around it.

    A DataLoader worker re-raises an exception in the main process as ``Caught X in DataLoader
    worker process N. Original Traceback ...`` with the original message on the last line.
    """
    text = str(error)
    if "Original Traceback" in text:
        last = text.strip().splitlines()[-1]
        prefix, sep, rest = last.partition(": ")
        text = rest if sep and "Error" in prefix else last
    return text


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message as the user should read it (see :func:`user_message`);
    empty when it has none."""
    lines = user_message(error).strip().splitlines()
    return lines[0] if lines else ""


def describe(error: BaseException) -> str:
    """``error`` in one line: ``'TypeName: first line of the message'``, or the type name alone."""
    line = first_line(error)
    return f"{type(error).__name__}: {line}" if line else type(error).__name__
