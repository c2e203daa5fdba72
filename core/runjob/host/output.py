"""What runjob says while it runs: its ``runjob: ...`` lines, one output object for every room.

:data:`screen` writes a line to stdout or stderr and flushes it. It knows:

- whether this process is the main one of the run, which speaks for the job: set when the
  ``Accelerator`` is built (:func:`runjob.train.accelerator.build_accelerator`) and forgotten with it;
  before that, Accelerate's own state when an Accelerator exists, else the launcher's ``RANK``
  (unset: a process of its own, the main one);
- whether it is quiet (:meth:`Output.quieted`): then the main process's lines are not said (a
  process's own, :meth:`Output.each`, such as its failure, still are);
- whether a progress bar may be on screen: once tqdm is imported, a line goes through ``tqdm.write``,
  which takes the bar out of the way and holds tqdm's lock, so a bar never draws into the middle of it.

A stream nobody reads any more (a pipe whose reader died, a closed terminal): during a command the
streams are :mod:`runjob.record.terminal`'s, which keep such lines in ``OUTPUT_DIR/runjob.log``;
elsewhere a line that cannot be written is dropped, never the run's failure. A stream that is not
there at all (``sys.stdout is None``) gets nothing, as with ``print``.

Light: no torch, accelerate or mlflow import; ``runjob validate`` and ``--help`` may use it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TextIO

RANK_ENVIRONMENT = "RANK"
"""Set by the launcher (torchrun, Accelerate, Slurm through runjob) for each process of a run; ``"0"``: the main one."""


BARS_OFF_ENVIRONMENT = "TQDM_DISABLE"
"""Set to ``1`` (``true``, ``yes``, ``on``): no progress bars, runjob's nor the libraries' that use tqdm."""


def bars_disabled() -> bool:
    """Whether :data:`BARS_OFF_ENVIRONMENT` asks for no progress bars."""
    return os.environ.get(BARS_OFF_ENVIRONMENT, "").strip().lower() in ("1", "true", "yes", "on")


class Output:
    """The lines a process of runjob says; :data:`screen` is the one each process uses."""

    def __init__(self) -> None:
        self._main: bool | None = None
        self.quiet = False

    @property
    def main(self) -> bool:
        """Whether this process speaks for the job (the run's main process, or a process of its own)."""
        if self._main is not None:
            return self._main
        state = sys.modules.get("accelerate.state")  # read only when already imported: never imported here
        if state is not None and state.is_initialized():
            return bool(state.PartialState().is_main_process)
        return os.environ.get(RANK_ENVIRONMENT, "0") == "0"

    def set_main(self, main: bool | None) -> None:
        """The Accelerator says whether this process is the main one (``None``: it was forgotten)."""
        self._main = main

    @property
    def speaks(self) -> bool:
        """Whether :meth:`say` writes here: the main process, not quiet (a progress bar shows then too)."""
        return self.main and not self.quiet

    @property
    def bars(self) -> bool:
        """Whether progress bars are drawn here: where this process speaks, unless ``TQDM_DISABLE``
        is set to a true value (tqdm's own switch, which a bar runjob draws follows too)."""
        return self.speaks and not bars_disabled()

    @contextlib.contextmanager
    def quieted(self) -> Iterator[None]:
        """Within: the main process's lines (:meth:`say`) are not said; a process's own (:meth:`each`) still are."""
        before, self.quiet = self.quiet, True
        try:
            yield
        finally:
            self.quiet = before

    def say(self, *lines: str, err: bool = False, main: bool | None = None) -> None:
        """``lines`` said once for the job: by the main process only, unless quiet; to stdout (``err``:
        stderr). ``main``: whether this process is the main one, where the caller knows (a ``Run``'s
        Accelerator)."""
        if (self.main if main is None else main) and not self.quiet:
            self._write(lines, err)

    def each(self, *lines: str, err: bool = False) -> None:
        """Lines of this process's own (its failure, a sweep worker's trial), whichever process it is;
        to stdout (``err``: stderr); said even when quiet."""
        self._write(lines, err)

    def _write(self, lines: tuple[str, ...], err: bool) -> None:
        stream: TextIO | None = sys.stderr if err else sys.stdout
        if stream is None or not lines:
            return
        text = "\n".join(lines)
        bars = sys.modules.get("tqdm.std")  # a bar may be on screen only once tqdm is imported
        try:
            if bars is None:
                stream.write(text + "\n")
            else:
                bars.tqdm.write(text, file=stream)
            stream.flush()
        except UnicodeError:
            raise
        except (OSError, ValueError):  # nobody reads it (EPIPE, EIO) or it was closed: the line is lost, not the run
            pass


screen = Output()
"""This process's output: ``from runjob.host.output import screen``; ``screen.say(line)``."""


def say(line: str) -> None:
    """``runjob.say``: a line for the job where a plugin has no ``run`` at hand (a model factory
    saying where its pretrained weights came from), said by the main process only (``run.say`` in a
    callback)."""
    screen.say(line)
