"""One event core: every event goes through one dispatcher, in the order the README's map shows,
callbacks before global hooks, under one error policy; callbacks declare the order they need."""

from __future__ import annotations

import pytest
from helpers import SMALL_DIGITS, documentation

import runjob
from runjob.errors import TrainingError
from runjob.host.events import EVENT_MAP, HOOKS, Dispatcher, Event, order_callbacks
from runjob.host.run_context import dispatcher
from runjob.testing import FakeRun

pytestmark = pytest.mark.timeout(300)

BROKEN_HOOK = '''
"""A plugin whose global hook breaks at step 3."""
import runjob


@runjob.hookimpl
def runjob_after_step(run, step):
    if step == 3:
        raise KeyError("no such thing")
'''


def test_a_global_hook_that_raises_stops_the_run_in_one_line_naming_the_plugin(tester):
    tester.install_plugin("broken-hook", {"broken_hook": BROKEN_HOOK})
    tester.write_job("job.toml", SMALL_DIGITS.format(name="hooked"))
    result = tester.cli("job.toml", "--output-dir", "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr_lines[-1] == (
        "runjob: plugin 'broken_hook' failed in runjob_after_step at step 3: KeyError: 'no such thing'"
    )
    assert tester.only_run("hooked").status == "FAILED"
    log = (tester.path / "out" / "runjob.log").read_text(encoding="utf-8")
    assert "Traceback" in log and 'raise KeyError("no such thing")' in log, "where it failed is in the run's log"


def test_the_readme_shows_the_event_map_and_the_map_names_every_event():
    named = [line.split()[0] for line in EVENT_MAP.splitlines() if line.split()[0].isupper()]
    assert named == [event.name for event in Event], "the map names every event once, in the enumeration's order"
    for event, (hook, _) in HOOKS.items():
        line = next(line for line in EVENT_MAP.splitlines() if line.split()[0] == event.name)
        assert hook in line, f"the map shows {hook} beside {event.name}"
    assert EVENT_MAP in documentation(), "the documentation's map is runjob.host.events.EVENT_MAP"
    for event in Event:  # every event is a Callback method with the arguments the map promises
        assert callable(getattr(runjob.Callback, event.method))


class Recorder(runjob.Callback):
    def __init__(self, name, heard):
        self.name, self.heard = name, heard

    def on_evaluation_end(self, run, step, epoch):
        self.heard.append(self.name)


class AfterA(Recorder):
    after = ("a",)


def test_callbacks_are_called_in_order_unless_one_declares_it_comes_after_another():
    heard: list[str] = []
    callbacks = {"b": AfterA("b", heard), "a": Recorder("a", heard), "c": Recorder("c", heard)}
    assert order_callbacks(callbacks) == ["a", "b", "c"]
    Dispatcher(FakeRun(), callbacks).send(Event.EVALUATION_END, 1, 0)
    assert heard == ["a", "b", "c"]
    assert order_callbacks({"b": AfterA("b", heard)}) == ["b"], "a callback that is off is not waited for"

    class AfterB(Recorder):
        after = ("b",)

    cyclic = {"a": AfterB("a", heard), "b": AfterA("b", heard)}
    with pytest.raises(TrainingError, match="callbacks a, b each declare `after` another of them"):
        order_callbacks(cyclic)


def test_ema_restores_the_training_weights_only_after_best_weights_saved_the_averaged_ones():
    from runjob_builtins.callbacks import ExponentialMovingAverage
    from runjob_builtins.run_measures import BestWeights

    assert "best_weights" in ExponentialMovingAverage.after
    ema, best = object.__new__(ExponentialMovingAverage), object.__new__(BestWeights)
    assert order_callbacks({"ema": ema, "best_weights": best}) == ["best_weights", "ema"]


def test_what_a_callback_logs_in_an_event_is_recorded_at_its_step_and_joins_the_log_line():
    class Logger(runjob.Callback):
        def on_step(self, run, step, epoch, loss):
            run.log({"train/a": step})
            run.log({"train/b": step * 2})

        def on_log(self, run, step, epoch, metrics):
            run.log({"train/c": 1})

    run = FakeRun(callbacks={"logger": Logger()})
    events = dispatcher(run)  # the loop's own: the run's journal, its step
    run.step = 4
    events.send(Event.STEP, 4, 0, None)
    assert run.logs == [(4, {"train/a": 4.0, "train/b": 8.0})], "one record line when the event's listeners are done"
    line = {"train/loss": 0.5}
    events.send(Event.LOG, 4, 0, line)
    assert line == {"train/loss": 0.5, "train/c": 1.0} and len(run.logs) == 1, "at LOG, it joins the line logged"
    run.log({"outside": 1})
    assert run.logs[-1] == (4, {"outside": 1.0}), "outside an event, recorded at once"

    class Broken(runjob.Callback):
        def on_step(self, run, step, epoch, loss):
            raise RuntimeError("after the logger")

    run = FakeRun(callbacks={"logger": Logger(), "broken": Broken()}, step=5)
    with pytest.raises(TrainingError, match="callback 'broken' failed in on_step at step 5"):
        dispatcher(run).send(Event.STEP, 5, 0, None)
    assert run.logs == [(5, {"train/a": 5.0, "train/b": 10.0})], "what was logged before a failure is kept"


def test_a_failure_at_run_end_is_one_line_and_the_others_still_hear_it():
    heard = []

    class Broken(runjob.Callback):
        def on_run_end(self, run, status, error):
            raise RuntimeError("disk full")

    class Listening(runjob.Callback):
        def on_run_end(self, run, status, error):
            heard.append(status)

    failures = Dispatcher(FakeRun(), {"broken": Broken(), "listening": Listening()}).end("FINISHED", None)
    assert failures == ["callback 'broken' failed in on_run_end: RuntimeError: disk full"] and heard == ["FINISHED"]


def test_the_run_a_callback_gets_is_read_only_and_typed():
    import typing

    run = FakeRun(model="m")
    real = runjob.Run.__new__(runjob.Run)
    with pytest.raises(AttributeError):
        real.step = 1
    hints = typing.get_type_hints(runjob.RunActions.log)
    assert hints["return"] is type(None)
    assert typing.get_type_hints(runjob.RunState.step.fget)["return"] is int
    assert run.model == "m"


def test_an_unknown_recording_choice_is_a_users_mistake_said_before_anything_runs(tester):
    from runjob.errors import RunjobError

    tester.write_job("job.toml", SMALL_DIGITS.format(name="asked"))
    with pytest.raises(RunjobError, match="recording = 'proc': expected 'process' .* or 'thread'"):
        runjob.run(tester.path / "job.toml", output_dir=tester.path / "out", recording="proc")
    assert not (tester.path / "out").exists()
