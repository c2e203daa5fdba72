"""Stop signals: SIGTERM, SIGINT (Ctrl-C), SIGHUP (the terminal went away: a closed SSH session) and
``train.stop_signal`` ask for a checkpoint and a stop; a second Ctrl-C stops at once. What is said
meanwhile may meet a terminal nobody reads any more: :mod:`runjob.record.terminal` makes that harmless.

One Ctrl-C can reach a process twice. The terminal sends SIGINT to its whole foreground process
group, and a wrapper in that group may pass it on to its child as well: ``uv run`` does so 0.2 s
later when it has no terminal (measured with uv 0.13). Taken for a second press, that copy used to
abandon the very checkpoint the first one asked for. So a SIGINT counts as a new press only when it
arrives :data:`SAME_PRESS` seconds or more after the first stop signal; sooner, it is the same one.

The arrival times are taken by a thread that Python's C-level signal handler wakes through
:func:`signal.set_wakeup_fd`, not in the Python-level handler: that runs only between bytecodes of
the main thread, which may be inside one long call when the copy arrives (writing a 1 GiB
checkpoint holds it in one call for 3-4 s here), and a copy handled that late would look like a
new press. The thread gets to run meanwhile: torch and safetensors release the GIL while they
write (measured: the thread waited at most 16 ms during such a write).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

SAME_PRESS = 1.5
"""Seconds after the first stop signal within which a SIGINT is the same Ctrl-C passed on again
(``uv run``'s copy comes 0.2 s later; a person reads the message and presses again after longer)."""

RESEND_EVERY, RESENDS = 0.1, 30  # seconds, times: see _watch

_SENTINEL = b"\0"  # no signal has number 0: written by close() to end the thread
_active: list[StopSignals] = []  # the listeners of this process; forked children forget them


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15, ``signal 99`` for a number that names no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class StopSignals:
    """While open, ``signals`` (numbers) are handled here. The first stop signal calls
    ``on_first(signum)`` in the main thread (from the signal handler, so it may raise), and
    ``announce(signum)`` from the watching thread (printing there never meets the main thread's own
    writes half-way). Each later SIGINT that is a new press (:data:`SAME_PRESS` or more after the
    last press) calls ``on_again()`` from the watching thread and, with ``again_raises``, raises
    KeyboardInterrupt in the main thread, once a press. Other repeats are ignored.

    Only the main thread can install signal handlers: elsewhere :meth:`open` does nothing.
    """

    def __init__(
        self,
        signals: list[int],
        on_first: Callable[[int], None],
        *,
        on_again: Callable[[], None] | None = None,
        announce: Callable[[int], None] | None = None,
        again_raises: bool = False,
    ) -> None:
        self.signals = set(signals)
        self.on_first, self.on_again, self.announce = on_first, on_again, announce
        self.again_raises = again_raises
        self.first: int | None = None  # the first stop signal, as the handler saw it
        self.again = False  # a second Ctrl-C came
        self._last_press: float | None = None  # when the last signal that counted arrived
        self._raises = 0  # KeyboardInterrupts owed to the main thread, one per new press
        self._sent = 0  # SIGINTs the watching thread sent itself, still to be read back
        self._previous: dict[int, Any] = {}
        self._previous_fd = -1
        self._pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None

    def open(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        read, write = os.pipe()
        os.set_blocking(write, False)  # set_wakeup_fd's requirement: a signal never waits on it
        self._pipe = (read, write)
        self._thread = threading.Thread(target=self._watch, name="runjob-stop-signals", daemon=True)
        self._thread.start()
        self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._previous = {signum: signal.signal(signum, self._handle) for signum in self.signals}
        _active.append(self)
        return self

    def close(self) -> None:
        """Put back the handlers and wake-up fd found, and end the thread. Within
        :data:`SAME_PRESS` of a Ctrl-C, first wait for the rest of it: a copy passed on again must
        still find this handler, not Python's, which would end the process with KeyboardInterrupt
        (or, once it is exiting, by the signal) instead of the exit the stop chose."""
        if self._pipe is None:
            return
        if self._last_press is not None and (self.first == signal.SIGINT or self.again):
            time.sleep(max(0.0, SAME_PRESS - (time.monotonic() - self._last_press)))
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._previous_fd)
        read, write = self._pipe
        with contextlib.suppress(OSError):
            os.write(write, _SENTINEL)
        if self._thread is not None:
            self._thread.join(timeout=5)
        os.close(read)
        os.close(write)
        self._pipe = None
        if self in _active:
            _active.remove(self)

    def __enter__(self) -> StopSignals:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Called for a new press's signal and for the copy the watching thread sends after it, in
        # either order: whichever finds the press's KeyboardInterrupt owed raises it.
        if self._raises and signum == signal.SIGINT:
            self._raises -= 1
            raise KeyboardInterrupt
        if self.first is None:
            self.first = signum
            self.on_first(signum)

    def _watch(self) -> None:
        assert self._pipe is not None
        read = self._pipe[0]
        resent = 0
        while True:
            waiting = self._raises and resent < RESENDS
            if not select.select([read], [], [], RESEND_EVERY if waiting else None)[0]:
                # The press's KeyboardInterrupt is still owed: the signal may have come just as the
                # main thread went into a wait (time.sleep, a lock), which it then does not cut short.
                if self._raises:
                    resent += 1
                    self._interrupt_main()
                continue
            resent = 0 if not self._raises else resent
            try:
                data = os.read(read, 512)
            except OSError:
                return
            now = time.monotonic()  # several signals read at once share it: then they count as one press
            for signum in data:
                if signum == 0:
                    return
                if signum in self.signals:
                    self._arrived(signum, now)

    def _arrived(self, signum: int, now: float) -> None:
        if signum == signal.SIGINT and self._sent:
            self._sent -= 1  # a copy this thread sent (_interrupt_main), never a press of its own
            return
        if self._last_press is None:
            self._last_press = now
            if self.announce is not None:
                self.announce(signum)
        elif signum == signal.SIGINT and now - self._last_press >= SAME_PRESS:
            self._last_press = now
            self.again = True
            if self.on_again is not None:
                self.on_again()
            if self.again_raises:
                self._raises += 1
                self._interrupt_main()

    def _interrupt_main(self) -> None:
        # A signal of its own, not _thread.interrupt_main(): the main thread may have handled the
        # press's signal already and gone back to a wait that only a signal interrupts.
        self._sent += 1
        main = threading.main_thread().ident
        assert main is not None  # the main thread has started: this code runs after it
        signal.pthread_kill(main, signal.SIGINT)


def _forget_in_child() -> None:
    # A forked child (a DataLoader worker) must not write its own signals into this process's pipe.
    if _active:
        _active.clear()
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)


os.register_at_fork(after_in_child=_forget_in_child)
