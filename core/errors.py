"""Errors written for the person who will read them.

Every mistake a user can make (a job file, an override, a path, a dataset that does not fit the
model) is raised as a :class:`RunjobError`. The CLI prints its message, one line per problem, and
exits with its ``exit_code``; it never shows a traceback for one of these.
"""

from __future__ import annotations

from dataclasses import dataclass


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


class DataError(RunjobError):
    """Data that cannot be read or does not fit what the job says (found while training)."""


class TrainingError(RunjobError):
    """Training cannot go on: the model and data disagree, the device cannot do what was asked."""


class TrackingError(RunjobError):
    """MLflow could not be reached or refused what runjob asked of it."""


class Terminated(BaseException):
    """The process was asked to stop (SIGTERM): the run ends KILLED, the exit code is 128 + signal."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by signal {signum}")


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
