"""How a session ends: the stop signals it listens for, the command that goes on after a stop, the
summary of a finished run, RUN_END with the record closed, and the process put back as it was."""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from runjob.errors import ComponentError, Interrupted, Terminated, TrainingError, describe
from runjob.host.events import Dispatcher
from runjob.host.output import screen
from runjob.host.run_context import named_models
from runjob.host.run_folder import RunFolder
from runjob.job.validation import ResolvedJob
from runjob.record import logfile
from runjob.record.invocation import pasteable
from runjob.record.recorder import Recorder
from runjob.tags import NOTE_TAG, RESUME_COMMAND_TAG
from runjob.train.accelerator import forget_accelerator
from runjob.train.checkpoints import complete_checkpoints
from runjob.train.loop import StopRequest, TrainingLoop
from runjob.train.request import RunRequest
from runjob.train.run_command import resume_command
from runjob.train.stopping import StopSignals, signal_name

if TYPE_CHECKING:
    from accelerate import Accelerator


def listen_for_stop(stop: StopRequest, extra_signal: str | None) -> StopSignals:
    """SIGTERM, SIGINT, SIGHUP and ``train.stop_signal`` ask the loop to stop after a checkpoint; a second
    Ctrl-C stops at once (one passed on again by a wrapper such as ``uv run`` is the same Ctrl-C:
    :mod:`runjob.train.stopping`). The main process says so when the first arrives."""

    def ask(signum: int) -> None:
        stop.signum = stop.signum or signum

    def announce(signum: int) -> None:
        if signum == signal.SIGINT:
            screen.say(
                "runjob: Ctrl-C: writing a checkpoint, then stopping; press Ctrl-C again to stop at once, without one",
                err=True,
            )
        else:
            screen.say(f"runjob: {signal_name(signum)}: writing a checkpoint, then stopping", err=True)

    listener = StopSignals(_stop_signals(extra_signal), ask, announce=announce, again_raises=True)
    return listener.open()


def how_to_go_on(
    request: RunRequest, recorder: Recorder, output_dir: Path, interrupt: BaseException, step: int | None
) -> BaseException:
    """The stop to raise, holding the checkpoint and the command that goes on from it (the command
    line prints them), which are also recorded: the tag ``runjob.resume_command`` and a paragraph of
    the run's description. A stop signal's checkpoint is the one it wrote; after a second Ctrl-C, the
    newest complete one (none: the command starts the run again there)."""
    try:
        checkpoint = interrupt.checkpoint if isinstance(interrupt, Terminated) else None
        if checkpoint is None:
            found = complete_checkpoints(output_dir)
            checkpoint = found[-1] if found else None
        job, disabled = request.job, list(request.disabled_plugins)
        arguments = (job.source.path, job.source.overrides, output_dir, request.tracking_uri)
        command = resume_command(*arguments, afresh=checkpoint is None, disabled=disabled)
        recorded = resume_command(*arguments, afresh=checkpoint is None, redacted=True, disabled=disabled)
        at = f" at step {step}" if step is not None else ""
        if isinstance(interrupt, Terminated):
            interrupt.resume_command = command
            stopped: BaseException = interrupt
            how = f"Stopped by {signal_name(interrupt.signum)}{at} after writing checkpoint {checkpoint}."
        else:
            stopped = Interrupted(checkpoint, command)
            newest = f"the newest complete checkpoint is {checkpoint}" if checkpoint else "there is no checkpoint"
            how = f"Stopped at once by a second Ctrl-C{at}, without a checkpoint; {newest}."
        note = recorder.record.tags.get(NOTE_TAG, "") if recorder.active else ""
        going_on = f"{how} To {'go on' if checkpoint else 'start again'}: `{recorded}`"
        recorder.set_tags({RESUME_COMMAND_TAG: recorded, NOTE_TAG: f"{note}\n\n{going_on}" if note else going_on})
        for line in stopped.said() if isinstance(stopped, (Terminated, Interrupted)) else []:
            logfile.note(line)  # in runjob.log too: the terminal's reader may be gone, and what it was shown with it
        return stopped
    except Exception as failure:  # noqa: BLE001 - saying how to go on must not hide the stop itself
        screen.each(f"runjob: cannot say how to go on: {describe(failure)}", err=True)
        return interrupt


def summary(job: ResolvedJob, recorder: Recorder, output_dir: Path, loop: TrainingLoop, seconds: float) -> list[str]:
    """What the run came to, printed as its last lines: the result, where the models are, the run
    and how to look at it."""
    minutes, rest = divmod(round(seconds), 60)
    took = f"{minutes}m {rest:02d}s" if minutes else f"{rest}s"
    metric = job.train.best_metric
    shown = [f"{metric} {loop.last_metrics[metric]:.4g}"] if metric in loop.last_metrics else []
    shown += [f"{k} {v:.4g}" for k, v in loop.last_metrics.items() if k.startswith("test/")]
    stopped = f", stopped early: {loop.stopped}" if loop.stopped else ""
    lines = [f"runjob: finished {job.job.name} in {took} ({loop.step} steps{stopped}): {'  '.join(shown) or 'done'}"]
    models = [f"final {RunFolder(output_dir).weights}"]
    for model in named_models(output_dir).values():  # what callbacks named (best_weights: "best")
        about = f" ({model.summary})" if model.summary else ""
        models.append(f"{model.name}{about} {output_dir / model.weights}")
    lines.append("runjob: models: " + "; ".join(models))
    if job.tracking.offline or recorder.run_id is None:
        sync = pasteable("sync", output_dir)
        lines.append(f"runjob: recorded offline in {output_dir}: `{sync}` uploads it to MLflow")
        return lines
    uri = recorder.tracking_uri or ""
    experiment = recorder.record.experiment
    runs = pasteable("runs")
    look = f"{runs} --experiment {shlex.quote(experiment)}"
    if uri.startswith(("http://", "https://")):
        experiment_id = recorder.experiment_id
        page = f"/#/experiments/{experiment_id}/runs/{recorder.run_id}" if experiment_id else ""
        look += f"; {uri.rstrip('/')}{page}"
    else:
        look += f"; mlflow ui --backend-store-uri {uri}"
    if uri != recorder.default_tracking_uri:
        look = look.replace(f"{runs} ", f"{runs} --tracking-uri {shlex.quote(uri)} ", 1)
    logged = f"; its model: runs:/{recorder.run_id}/{job.job.name}" if job.tracking.log_model != "none" else ""
    lines.append(f"runjob: MLflow run {recorder.run_id} ({experiment}){logged}; look at it: {look}")
    return lines


def finish(
    events: Dispatcher | None, recorder: Recorder, accelerator: Accelerator, status: str, error: BaseException | None
) -> None:
    """RUN_END to every listener (a failure there is said in one line; the outcome stands), a
    plugin's failure's traceback kept in ``runjob.log``, the record closed (its listener hears
    RUN_END last; before there is a dispatcher, here), the processes parted."""
    if isinstance(error, (TrainingError, ComponentError)) and error.__cause__ is not None:
        logfile.keep_traceback(str(error), error.__cause__)  # the terminal has the one line
    if events is not None:
        screen.each(*(f"runjob: {line}" for line in events.end(status, error)), err=True)
        events.close(status, error)  # the record's listener closes it
    else:
        recorder.end(status, error)  # the record's listener was never on a dispatcher
    accelerator.end_training()
    _destroy_process_group()


def _destroy_process_group() -> None:
    # gloo jobs sometimes abort at interpreter exit when the group is left for atexit to clean up
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _stop_signals(extra_signal: str | None) -> list[int]:
    # SIGHUP: the terminal went away (a closed SSH session); the run stops as for SIGTERM
    names = ("SIGTERM", "SIGINT", "SIGHUP", *([extra_signal] if extra_signal else []))
    return [getattr(signal, name) for name in names]


ACCELERATE_SWITCHES = ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED")


def reset_accelerate(environment: dict[str, str | None]) -> None:
    """Forget this run's Accelerator (its process-wide state) and put back the variables the run set."""
    forget_accelerator()
    for name, value in environment.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
