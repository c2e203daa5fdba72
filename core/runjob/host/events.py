"""The events of a run, in the order the loop sends them, and the one dispatcher they all go through.

Every event reaches, in this order: the callbacks on by default (``best_weights``, ``throughput``,
``peak_memory``), the job's ``[callbacks.NAME]`` in the job file's order (a callback that declares
``after`` comes after the callbacks it names), then the plugins' global event hooks (pluggy's order:
the plugin registered last first). One error policy covers them all: an exception stops the run with
one line naming the callback or plugin, the event and the step (:class:`runjob.errors.TrainingError`,
exit code 2, the MLflow run FAILED; the traceback goes to ``OUTPUT_DIR/runjob.log``). Only at
``RUN_END``, when the run's outcome is already decided, is a failure said in one line and the
outcome kept.

What a callback logs with ``run.log`` during an event is recorded when the event's listeners are
done, at the event's step; at ``LOG`` it joins the line being logged instead (the ``metrics`` that
later listeners and ``runjob_after_log`` see, and ``metrics.jsonl``).

Nothing here imports torch.
"""

from __future__ import annotations

import enum
import graphlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

from runjob.errors import Terminated, TrainingError, describe

if TYPE_CHECKING:
    from pluggy import HookImpl, HookRelay

    from runjob.host.callback import Callback
    from runjob.host.run_context import Run

T = TypeVar("T")


class Event(enum.Enum):
    """A point in a run that callbacks and global hooks hear about; the value is the
    :class:`runjob.Callback` method called for it."""

    RUN_START = "on_run_start"
    EPOCH_START = "on_epoch_start"
    BATCH = "on_batch"
    STEP = "on_step"
    LOG = "on_log"
    EVALUATION_START = "on_evaluation_start"
    EVALUATION = "on_evaluation"
    EVALUATION_END = "on_evaluation_end"
    EPOCH_END = "on_epoch_end"
    TRAIN_END = "on_train_end"
    RUN_END = "on_run_end"

    @property
    def method(self) -> str:
        """The :class:`runjob.Callback` method for this event."""
        return str(self.value)

    @property
    def arguments(self) -> tuple[str, ...]:
        """What the event's listeners receive after ``run``, by name (callbacks positionally)."""
        return ARGUMENTS[self]

    @property
    def hook(self) -> str | None:
        """The global pluggy hook called for this event, if there is one."""
        found = HOOKS.get(self)
        return found[0] if found else None


ARGUMENTS: dict[Event, tuple[str, ...]] = {
    Event.RUN_START: (),
    Event.EPOCH_START: ("step", "epoch"),
    Event.BATCH: ("step", "epoch", "batch"),
    Event.STEP: ("step", "epoch", "loss"),
    Event.LOG: ("step", "epoch", "metrics"),
    Event.EVALUATION_START: ("step", "epoch"),
    Event.EVALUATION: ("step", "epoch", "metrics"),
    Event.EVALUATION_END: ("step", "epoch"),
    Event.EPOCH_END: ("step", "epoch"),
    Event.TRAIN_END: ("step", "epoch"),
    Event.RUN_END: ("status", "error"),
}

HOOKS: dict[Event, tuple[str, bool]] = {
    Event.RUN_START: ("runjob_run_start", False),
    Event.STEP: ("runjob_after_step", False),
    Event.LOG: ("runjob_after_log", True),
    Event.EVALUATION: ("runjob_after_evaluation", False),
    Event.RUN_END: ("runjob_run_end", False),
}
"""The global event hooks: (hook name, called on the main process only)."""

EVENT_MAP = """\
RUN_START                  built; after a resume, callbacks' state loaded    runjob_run_start
  each epoch:
  EPOCH_START
    each micro-batch:
    BATCH                  the batch on the device, before the model
    STEP                   after each optimizer step                          runjob_after_step
    LOG                    every train.log_every steps and at an epoch's end  runjob_after_log (main process)
    every train.eval_every steps, and at an epoch's end:
    EVALUATION_START       before the validation split is evaluated
    EVALUATION             its metrics                                        runjob_after_evaluation
    EVALUATION_END         best_weights saves best/ here
  EPOCH_END                then the epoch's checkpoint
TRAIN_END                  then the final model.safetensors and the outputs recorded, then the test split
RUN_END                    FINISHED, FAILED or KILLED                         runjob_run_end
"""
"""The loop's order, written once (the README shows it; a test checks both against :class:`Event`).
A stop (a callback's ``request_stop``, a signal) is honoured after a step's LOG or an evaluation;
a run that stops early still sends EVALUATION (unless it just evaluated), TRAIN_END and RUN_END."""


def order_callbacks(callbacks: Mapping[str, Callback]) -> list[str]:
    """The callbacks' names in the order they are called: as given, except that one whose class
    declares ``after`` comes after each callback named there that is switched on (a stable
    topological order). A cycle is the plugins' mistake, said in one line."""
    names = list(callbacks)
    position = {name: index for index, name in enumerate(names)}
    sorter = graphlib.TopologicalSorter(
        {name: [other for other in getattr(callbacks[name], "after", ()) if other in callbacks] for name in names}
    )
    with suppress(graphlib.CycleError):  # what no cycle blocks still comes out; the rest is said below
        sorter.prepare()
    ordered: list[str] = []
    ready: set[str] = set()
    while sorter.is_active():
        ready.update(sorter.get_ready())
        first = min(ready, key=position.__getitem__)  # the given order among the ready ones
        ready.remove(first)
        ordered.append(first)
        sorter.done(first)
    if len(ordered) < len(names):
        stuck = [name for name in names if name not in ordered]
        raise TrainingError(f"callbacks {', '.join(stuck)} each declare `after` another of them: no order fits")
    return ordered


class Destination:
    """What records the run, as a listener of the dispatcher (as Composer's logger destinations are
    callbacks): it hears the events in ``BEFORE`` before the callbacks and hooks do, those in
    ``AFTER`` after them (inside the event: at ``LOG``, what they added to the line is in it), and
    :meth:`record` the metrics measured outside any event. Its errors are its own (the record's),
    not a callback's: no error policy wraps them. At ``RUN_END`` it hears the status after every
    listener (:meth:`Dispatcher.close`, after :meth:`Dispatcher.end`)."""

    BEFORE: frozenset[Event] = frozenset()
    AFTER: frozenset[Event] = frozenset()

    def before(self, event: Event, values: tuple[object, ...]) -> None:
        """``event`` with its ``values`` (``event.arguments``), before its listeners."""

    def after(self, event: Event, values: tuple[object, ...]) -> None:
        """``event`` with its ``values``, after its listeners."""

    def record(self, metrics: dict[str, float], step: int) -> None:
        """Metrics measured outside any event, at ``step``."""


class MetricsDestination(Destination):
    """The loop's metrics into ``sink`` (the run's record, or a test kit's fake run): an
    evaluation's before its listeners (kept even when one fails), a log line after them (with what
    they added to it), and the metrics outside any event."""

    BEFORE = frozenset({Event.EVALUATION})
    AFTER = frozenset({Event.LOG})

    def __init__(self, sink: Callable[[dict[str, float], int], None]) -> None:
        self.sink = sink

    def before(self, event: Event, values: tuple[object, ...]) -> None:
        if event is Event.EVALUATION:
            step, _, metrics = cast("tuple[int, int, dict[str, float]]", values)
            self.sink(metrics, step)

    def after(self, event: Event, values: tuple[object, ...]) -> None:
        if event is Event.LOG:
            step, _, metrics = cast("tuple[int, int, dict[str, float]]", values)
            self.sink(metrics, step)

    def record(self, metrics: dict[str, float], step: int) -> None:
        self.sink(metrics, step)


@dataclass(frozen=True)
class Listener:
    """One callable that hears an event: ``who`` names it in error messages."""

    who: str
    call: Callable[..., object]
    where: str = ""
    """The method or hook it is (the event's callback method when empty)."""
    by_name: bool = False
    """A global hook: called with ``run`` and the event's values by name (a callback: positionally)."""


class Journal:
    """Where ``run.log`` goes: straight to ``record`` outside an event; during one, held until its
    listeners are done (then recorded at ``step()``); during ``LOG``, into the line being logged."""

    def __init__(self, record: Callable[[dict[str, float], int], None] | None, step: Callable[[], int]) -> None:
        self.record = record
        self.step = step
        self.logged: dict[str, float] = {}
        self.pending: dict[str, float] = {}
        self.depth = 0
        self.joining: dict[str, float] | None = None

    def log(self, values: dict[str, float]) -> None:
        self.logged.update(values)
        if self.joining is not None:
            self.joining.update(values)
        elif self.depth:
            self.pending.update(values)
        elif self.record is not None:
            self.record(values, self.step())

    @contextmanager
    def within(self, joining: dict[str, float] | None = None) -> Iterator[None]:
        outer = self.joining
        self.depth += 1
        self.joining = joining if joining is not None else outer
        try:
            yield
        finally:  # also when a listener failed: what the others logged before it is kept
            self.depth -= 1
            self.joining = outer
            if not self.depth and self.pending:
                pending, self.pending = self.pending, {}
                if self.record is not None:
                    self.record(pending, self.step())


class Dispatcher:
    """Sends each :class:`Event` to the callbacks (ordered by :func:`order_callbacks`) and then to
    the global hooks in ``hooks`` (pluggy's hook relay), under one error policy (module docstring).
    ``plugins`` names the plugin of each callback; ``main_process``: whether hooks marked main-only
    are called here. An event no listener overrides costs a dict lookup."""

    def __init__(
        self,
        run: Run,
        callbacks: Mapping[str, Callback],
        *,
        hooks: HookRelay | None = None,
        plugins: Mapping[str, str] | None = None,
        main_process: bool = True,
        journal: Journal | None = None,
        step: Callable[[], int] | None = None,
    ) -> None:
        self.run = run
        self.callbacks = {name: callbacks[name] for name in order_callbacks(callbacks)}
        self.hooks = hooks
        self.plugins = dict(plugins or {})
        self.main_process = main_process
        self.journal = journal
        self.step = step or (lambda: int(getattr(run, "step", 0)))
        self._listeners: dict[Event, list[Listener]] = {}
        self.destinations: list[Destination] = []
        self._by_event: dict[Event, tuple[list[Destination], list[Destination]]] = {}
        """What records the run, hearing the events besides the listeners (:class:`Destination`)."""

    def add_destination(self, destination: Destination) -> None:
        """Have ``destination`` hear the events it names, after the destinations added before it."""
        self.destinations.append(destination)
        self._by_event.clear()

    def _destinations_of(self, event: Event) -> tuple[list[Destination], list[Destination]]:
        found = self._by_event.get(event)
        if found is None:
            found = (
                [d for d in self.destinations if event in d.BEFORE],
                [d for d in self.destinations if event in d.AFTER],
            )
            self._by_event[event] = found
        return found

    def listeners(self, event: Event) -> list[Listener]:
        """Who hears ``event``, in order: the callbacks that override its method, then the hooks."""
        found = self._listeners.get(event)
        if found is None:
            # lazy: runjob.testing (every pytest session) imports events; callback pulls pydantic (+1.2 s)
            from runjob.host.callback import Callback

            base = getattr(Callback, event.method)
            found = [
                Listener(self._callback_name(name), getattr(item, event.method))
                for name, item in self.callbacks.items()
                if getattr(type(item), event.method) is not base
            ]
            found += self._hook_listeners(event)
            self._listeners[event] = found
        return found

    def _callback_name(self, name: str) -> str:
        plugin = self.plugins.get(name)
        return f"callback {name!r}" + (f" (plugin {plugin!r})" if plugin and plugin != name else "")

    def _hook_listeners(self, event: Event) -> list[Listener]:
        if event not in HOOKS or self.hooks is None:
            return []
        hook_name, main_only = HOOKS[event]
        if main_only and not self.main_process:
            return []
        caller = getattr(self.hooks, hook_name)
        implementations = caller.get_hookimpls()
        if any(getattr(impl, "hookwrapper", False) or getattr(impl, "wrapper", False) for impl in implementations):
            # a wrapper needs pluggy's own call; the plugins are then named together
            return [Listener("a plugin", caller, hook_name, by_name=True)]
        return [  # pluggy calls the implementation registered last first, with the arguments it names
            Listener(f"plugin {impl.plugin_name!r}", _by_name(impl), hook_name, by_name=True)
            for impl in reversed(implementations)
        ]

    def send(self, event: Event, *values: object) -> None:
        """Call every listener of ``event`` with ``run`` and ``values`` (``event.arguments``), between
        the destinations that hear it before them and those that hear it after them."""
        listeners = self.listeners(event)
        before, after = self._destinations_of(event)
        if not listeners:
            for destination in before:
                destination.before(event, values)
            for destination in after:
                destination.after(event, values)
            return
        joining = cast("dict[str, float]", values[2]) if event is Event.LOG else None  # LOG: step, epoch, metrics
        journal = self.journal
        if journal is None:
            self._heard(event, listeners, values, before, after)
            return
        with journal.within(joining):
            self._heard(event, listeners, values, before, after)

    def _heard(
        self,
        event: Event,
        listeners: Sequence[Listener],
        values: tuple[object, ...],
        before: Sequence[Destination],
        after: Sequence[Destination],
    ) -> None:
        for destination in before:  # not under the error policy: the record's own errors are its own
            destination.before(event, values)
        self._call_all(event, listeners, values)
        for destination in after:
            destination.after(event, values)

    def record(self, metrics: dict[str, float], step: int) -> None:
        """Metrics the loop measured outside any event (the test split's), to every destination."""
        for destination in self.destinations:
            destination.record(metrics, step)

    def _call_all(self, event: Event, listeners: Sequence[Listener], values: tuple[object, ...]) -> None:
        for listener in listeners:
            try:
                self._call(event, listener, values)
            except (Terminated, KeyboardInterrupt, TrainingError):
                raise
            except Exception as error:  # noqa: BLE001 - one line naming who failed; the traceback to the log
                where = listener.where or event.method
                raise TrainingError(
                    f"{listener.who} failed in {where} at step {self.step()}: {describe(error)}"
                ) from error

    def _call(self, event: Event, listener: Listener, values: tuple[object, ...]) -> None:
        if listener.by_name:
            listener.call(run=self.run, **dict(zip(event.arguments, values, strict=True)))
        else:
            listener.call(self.run, *values)

    def states(self) -> dict[str, dict[str, object]]:
        """Every callback's ``state_dict()`` by name, for a checkpoint, under the error policy: a
        callback that fails is one line naming it, the method and the step."""
        return {name: self._guarded(name, "state_dict", item.state_dict) for name, item in self.callbacks.items()}

    def load_states(self, states: Mapping[str, object], source: str) -> None:
        """Give each callback its state from a checkpoint (``load_state_dict``; ``source`` names the
        checkpoint), under the error policy: a callback's own failure is said as its failure, not as
        a damaged checkpoint."""
        for name, callback in self.callbacks.items():
            if states.get(name):
                self._guarded(name, "load_state_dict", callback.load_state_dict, states[name], at=f"loading {source}")

    def _guarded(self, name: str, where: str, method: Callable[..., T], *arguments: object, at: str = "") -> T:
        try:
            return method(*arguments)
        except (Terminated, KeyboardInterrupt, TrainingError):
            raise
        except Exception as error:  # noqa: BLE001 - one line naming who failed; the traceback to the log
            raise TrainingError(
                f"{self._callback_name(name)} failed in {where} {at or f'at step {self.step()}'}: {describe(error)}"
            ) from error

    def end(self, status: str, error: BaseException | None) -> list[str]:
        """``RUN_END`` to every listener, each whatever the others do; returns one line for each
        that failed (the run's outcome is already decided and stands)."""
        failures = []
        for listener in self.listeners(Event.RUN_END):
            try:
                self._call(Event.RUN_END, listener, (status, error))
            except Exception as failure:  # noqa: BLE001 - said in one line; the outcome stands
                failures.append(f"{listener.who} failed in {listener.where or 'on_run_end'}: {describe(failure)}")
        return failures

    def close(self, status: str, error: BaseException | None) -> None:
        """``RUN_END`` to the destinations, once every listener has heard it (:meth:`end`) and its
        failures are said: the record closes last, with the run's status."""
        for destination in self._destinations_of(Event.RUN_END)[1]:
            destination.after(Event.RUN_END, (status, error))


def _by_name(implementation: HookImpl) -> Callable[..., None]:
    """A hook implementation called with only the arguments it names, as pluggy calls it."""
    function, names = implementation.function, tuple(implementation.argnames)

    def call(**given: object) -> None:
        function(*(given[name] for name in names))

    return call
