"""The terminal streams of a command, made safe to print to when nobody reads them any more.

``runjob JOB 2>&1 | tee log`` and Ctrl-C: the terminal's SIGINT ends ``tee`` as well, and each
later write to stdout or stderr fails with a broken pipe (EPIPE); a closed SSH session leaves a
terminal whose writes fail (EIO); a run may be started with its output closed (``>&-``, where
Python has no ``sys.stdout`` at all). None of that is the run's failure: the run stops as asked,
writes its record, and what it says goes where it is kept (``OUTPUT_DIR/runjob.log``).

:func:`guarded` wraps ``sys.stdout`` and ``sys.stderr`` for the whole command (:func:`runjob.
commands.cli.main`): the first write or flush that fails marks the stream gone, and points its file
descriptor at ``/dev/null``, so nothing written there later fails, whoever writes (a C library,
the interpreter's last flush at exit, a process started afterwards, which inherits the descriptor).
From then on each line printed to it is kept in the run's log instead (:func:`runjob.record.
logfile.keep_printed`). A descriptor that is closed when the command starts is given ``/dev/null``
first: otherwise the next file the command opens (a database, a pipe) would take its number, and
whatever writes to "stdout" would write into that file.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

STANDARD_FDS = (0, 1, 2)


class TerminalStream:
    """``sys.stdout`` or ``sys.stderr`` (``name``) while a command runs: writes through to
    ``stream`` (flushed) until a write fails; then, and for a stream that was closed from the start
    (``gone``), each line, the failed one first, is kept in the run's log. Everything else is the
    wrapped stream's."""

    def __init__(self, stream: TextIO, name: str, gone: bool = False) -> None:
        self.stream, self.name, self.gone = stream, name, gone
        self._partial = ""  # the start of a line not ended yet, once gone
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                written = self.stream.write(text)
                # at once: a failure then belongs to this text, which is kept; runjob prints a few
                # lines a second at most (tqdm redraws at most 10 times a second)
                self.stream.flush()
                return written
            except BlockingIOError:  # a non-blocking pipe, full for now: this text is kept, the stream stays
                pass
            except (OSError, ValueError) as error:
                if not self._lost(error):
                    raise
        self._keep(text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        self.write("".join(lines))  # one write and flush (runjob predict's JSON lines)

    def flush(self) -> None:
        if self.gone:
            return
        try:
            self.stream.flush()
        except BlockingIOError:
            pass
        except (OSError, ValueError) as error:
            if not self._lost(error):
                raise

    def isatty(self) -> bool:
        if self.gone:
            return False
        try:
            return self.stream.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def _lost(self, error: Exception) -> bool:
        """Whether ``error`` means nobody reads the stream (then it is marked gone): an OSError
        (EPIPE, EIO, ENOSPC...) other than a full non-blocking pipe, or a ValueError of a stream that
        was closed; not an encoding error."""
        if isinstance(error, ValueError) and (isinstance(error, UnicodeError) or not _closed(self.stream)):
            return False
        self.gone = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fd = self.stream.fileno()
            _point_at_devnull(fd)
            self.stream.flush()  # what was buffered goes to /dev/null: the stream flushes cleanly at exit
        return True

    def _keep(self, text: str) -> None:
        # lazy: `runjob --help` imports this module and stays quick: +40 ms
        from runjob.record.logfile import keep_printed

        if getattr(_keeping, "now", False):  # the log's own failure, printed here: dropped, not kept again
            return
        with self._lock:
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()[-10_000:]  # a progress bar redrawn without end is cut short
        _keeping.now = True
        try:
            for line in lines:
                shown = line.rsplit("\r", 1)[-1].rstrip()  # what a terminal would show of a redrawn line
                if shown:
                    keep_printed(self.name, shown)
        finally:
            _keeping.now = False


_keeping = threading.local()


def _closed(stream: TextIO) -> bool:
    try:
        return bool(stream.closed)
    except (AttributeError, ValueError):
        return True


def _point_at_devnull(fd: int) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        if devnull != fd:
            os.dup2(devnull, fd)
    finally:
        if devnull != fd:
            os.close(devnull)


def _is_devnull(fd: int) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(os.devnull))
    except OSError:
        return False


def _fill_closed_fds() -> set[int]:
    """Give each standard descriptor that is closed ``/dev/null``; returns their numbers."""
    filled = set()
    for fd in STANDARD_FDS:
        try:
            os.fstat(fd)
        except OSError:
            _point_at_devnull(fd)  # os.open returns the lowest free number: this one, or a lower one
            filled.add(fd)
    return filled


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """While the command runs, ``sys.stdout`` and ``sys.stderr`` are :class:`TerminalStream`
    (see the module docstring); afterwards the streams found are put back, flushed (a failure then
    also sends the descriptor to ``/dev/null``: the interpreter's own flush at exit must not fail,
    which would turn the exit code into 120)."""
    closed = _fill_closed_fds()
    saved = sys.stdout, sys.stderr
    streams = []
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        gone = stream is None or fd in closed
        if isinstance(stream, TerminalStream):  # a command inside a command (a forked sweep trial)
            gone = stream.gone and _is_devnull(fd)  # its output may have been sent elsewhere since
            stream = stream.stream
        if stream is None:
            stream = open(fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
        wrapped = TerminalStream(stream, name, gone)
        setattr(sys, name, wrapped)
        streams.append(wrapped)
    try:
        yield
    finally:
        for stream in streams:
            stream.flush()
        sys.stdout, sys.stderr = saved
