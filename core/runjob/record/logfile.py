"""``OUTPUT_DIR/runjob.log``: what the libraries under a run say, kept out of the terminal.

A run's terminal holds runjob's own lines (``runjob: ...``, the epoch lines, the progress bar).
MLflow, its database migrations (alembic), SQLAlchemy, Accelerate, urllib3 and torchrun talk through
Python ``logging``; while a run lasts, their records go to the run's log file instead of their own
handlers, in the training processes, the recording process and the launcher of several alike. Of
those records, a warning or error is also printed unless it is on :data:`HARMLESS`, the short list
of messages known to be harmless here, each with the reason; their INFO chatter (MLflow creating
its database, Accelerate saving state) goes to the file only. ``warnings.warn`` is treated the same way: a warning on
:data:`HARMLESS_WARNINGS` goes to the file only, any other is kept in the file and printed as
Python prints it. So nothing that may be a real problem is hidden, and everything is in the file.

Records that come before the run's output folder is known (imports, the start of the recording
process) are held and written once :func:`open_in` names the folder.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from runjob.host.output import screen
from runjob.host.run_folder import LOG_FILE

LIBRARIES = {
    "mlflow": logging.INFO,
    "alembic": logging.INFO,
    "sqlalchemy": logging.WARNING,  # INFO on sqlalchemy.engine would log every SQL statement
    "sqlalchemy.engine": logging.WARNING,  # MLflow gives it a handler of its own
    "huey": logging.WARNING,  # likewise
    "accelerate": logging.INFO,
    "urllib3": logging.INFO,
    # torchrun (runjob.train.launcher runs its code in runjob's process): its banners and notes
    "torch.distributed.run": logging.WARNING,
    "torch.distributed.elastic": logging.WARNING,
}
"""The loggers taken over while a run lasts, and the level kept at least (a more verbose level set
by the user, e.g. ``MLFLOW_LOGGING_LEVEL=DEBUG``, stays)."""

HARMLESS = [
    # A model with tied weights (gpt's input and output embedding) is saved with the tied tensor
    # once, as safetensors requires; building the model ties them again when the weights are loaded
    # (checkpoints, model.safetensors, best/), which the tests of resume and init_from check.
    ("accelerate", re.compile(r"Removed shared tensor")),
    # In an environment without pip (a uv project's), MLflow cannot pin pip in the model's
    # conda.yaml and python_env.yaml and names it unpinned; pip's version does not change what the
    # model needs, which its requirements.txt pins (runjob.record.model_logging).
    ("mlflow.utils.environment", re.compile(r"Failed to resolve installed pip version")),
    # torchrun gives each of several workers on a machine one thread when OMP_NUM_THREADS is not
    # set; runjob's own line starting the workers says so (runjob.train.launcher.launch_workers).
    ("torch.distributed.run", re.compile(r"Setting OMP_NUM_THREADS environment variable")),
    # MLflow logs a sqlite store's "database is locked" (another run writing) as an error before it
    # raises it; runjob tries the write again (runjob.record.mlflow_writer.Retrying, each retry in
    # this file) and says so on the terminal only when every try failed.
    ("mlflow.store.db.utils", re.compile(r"SQLAlchemy database error")),
]
"""Library log records at WARNING or above that are not printed: (logger prefix, message pattern)."""

HARMLESS_WARNINGS: list[tuple[type[Warning], re.Pattern[str]]] = []
"""``warnings.warn`` messages that are not printed: (category, message pattern). None known yet:
a warning seen in a run goes here only with the reason it is harmless."""


def _harmless(record: logging.LogRecord) -> bool:
    name, message = record.name, record.getMessage()
    return any(
        (name == prefix or name.startswith(prefix + ".")) and pattern.search(message) for prefix, pattern in HARMLESS
    )


def _harmless_warning(message: Warning | str, category: type[Warning]) -> bool:
    text = str(message)
    return any(issubclass(category, kind) and pattern.search(text) for kind, pattern in HARMLESS_WARNINGS)


class _Handler(logging.Handler):
    """Every record to the log file (held until the folder is known); warnings and errors not
    known to be harmless also to the terminal (``sys.stderr`` as it is at that moment)."""

    def __init__(self, log: LibraryLog) -> None:
        super().__init__(logging.DEBUG)
        self.log = log
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.log.keep(record)
        if record.levelno >= logging.WARNING and not _harmless(record):
            try:
                screen.each(self.format(record), err=True)
            except Exception:  # noqa: BLE001 - logging's own policy: a failing handler never raises
                self.handleError(record)


class LibraryLog:
    """The libraries' logging and ``warnings`` routed as the module docstring says, from
    :meth:`start` to :meth:`stop` (which puts back every logger and ``warnings.showwarning`` as it
    found them). ``label`` names the process in each line of the file (``train``, ``recording``)."""

    def __init__(self, label: str) -> None:
        rank = os.environ.get("RANK")
        self.label = f"{label} rank {rank}" if rank not in (None, "0") and label == "train" else label
        self.path: Path | None = None
        self._held: list[logging.LogRecord] = []
        self._file: logging.FileHandler | None = None
        self._handler = _Handler(self)
        self._saved: dict[str, tuple[list[logging.Handler], int, bool]] = {}
        self._showwarning: Callable[..., None] | None = None  # warnings.showwarning's, while started
        self._outer: LibraryLog | None = None

    def start(self) -> LibraryLog:
        global _active
        for name, level in LIBRARIES.items():
            logger = logging.getLogger(name)
            self._saved[name] = (logger.handlers[:], logger.level, logger.propagate)
            logger.handlers = [self._handler]
            logger.setLevel(min(logger.getEffectiveLevel(), level))
            logger.propagate = False
        self._showwarning = previous = warnings.showwarning

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
            self.keep(logging.LogRecord("warnings", logging.WARNING, filename, lineno, text, None, None))
            if file is not None or not _harmless_warning(message, category):
                previous(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        self._outer, _active = _active, self
        return self

    def stop(self) -> None:
        global _active
        for name, (handlers, level, propagate) in self._saved.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = handlers, propagate
            logger.setLevel(level)
        self._saved.clear()
        if self._showwarning is not None:
            warnings.showwarning = self._showwarning
            self._showwarning = None
        if _active is self:
            _active = self._outer
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> LibraryLog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def open_in(self, folder: Path) -> None:
        """Write to ``folder/runjob.log`` from now on (appending: a resumed run, the other
        processes of the run), starting with what was held."""
        if self._file is not None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / LOG_FILE
        self._file = logging.FileHandler(self.path, encoding="utf-8")
        self._file.setFormatter(logging.Formatter(f"%(asctime)s {self.label} %(levelname)s %(name)s: %(message)s"))
        held, self._held = self._held, []
        for record in held:
            self._file.handle(record)

    def keep(self, record: logging.LogRecord) -> None:
        if self._file is not None:
            self._file.handle(record)
        else:
            self._held.append(record)


_active: LibraryLog | None = None


def note(what: str) -> None:
    """``what`` into the run's log file only (an MLflow write retried), not the terminal."""
    if _active is not None:
        _active.keep(logging.LogRecord("runjob", logging.INFO, __file__, 0, what, None, None))


def keep_printed(stream: str, line: str) -> None:
    """``line``, printed to ``stream`` (``stdout``, ``stderr``) once nobody reads it (its pipe
    closed: :mod:`runjob.record.terminal`), into the run's log file instead. Where no run's log is
    open (a command that is no run: ``runjob predict | head``), a few are held, not all."""
    if _active is not None and (_active.path is not None or len(_active._held) < HELD_PRINTED):
        _active.keep(logging.LogRecord(stream, logging.INFO, __file__, 0, line, None, None))


HELD_PRINTED = 1000
"""Lines printed to a gone terminal held for a log file not open yet, at most."""


def keep_traceback(what: str, error: BaseException) -> None:
    """``what`` with ``error``'s traceback, into the run's log file only: a plugin's failure is one
    line on the terminal, and where it happened is in ``OUTPUT_DIR/runjob.log``."""
    if _active is not None:
        exc_info = (type(error), error, error.__traceback__)
        _active.keep(logging.LogRecord("runjob", logging.ERROR, __file__, 0, what, None, exc_info))


def open_in(folder: Path) -> None:
    """The active :class:`LibraryLog` (if any) writes to ``folder/runjob.log`` from now on; one
    that writes to a file already keeps it (the recording thread of a run that records in its
    own process)."""
    if _active is not None:
        _active.open_in(Path(folder))
