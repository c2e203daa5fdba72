"""Running a resolved job: Accelerator, data, model, optimizer, the loop, and the run's record."""

from __future__ import annotations

import signal
import socket
import threading
import sys
import traceback
from pathlib import Path
from typing import Any

from runjob.errors import Terminated
from runjob.accelerator_setup import actual_setup, build_accelerator, check_setup
from runjob.outputs import choose_output_dir
from runjob.plugin_host import PluginHost
from runjob.run_context import RunContext
from runjob.tracking import Recorder, default_experiment, flatten
from runjob.training import TrainingLoop, plan_schedule
from runjob.validation import ResolvedJob


def _tags(job: ResolvedJob, host: PluginHost, accelerator: Any, output_dir: Path) -> dict[str, str]:
    import accelerate
    import torch

    from runjob import __version__

    tags = {
        "runjob.version": __version__,
        "runjob.job_file": str(job.source.path.resolve()),
        "runjob.output_dir": str(output_dir.resolve()),
        "runjob.overrides": " ".join(job.source.overrides),
        "runjob.host": socket.gethostname(),
        "runjob.torch_version": torch.__version__,
        "runjob.accelerate_version": accelerate.__version__,
        **actual_setup(accelerator),
    }
    for plugin in host.plugins:
        tags[f"runjob.plugin.{plugin.name}"] = f"{plugin.distribution} {plugin.version}"
    tags.update(job.tracking.tags)
    return tags


def _build(job: ResolvedJob, accelerator: Any):
    """Dataset, model, optimizer and loaders, prepared; then the scheduler for the real step count."""
    from runjob.data_loading import make_loaders

    with accelerator.main_process_first():  # one process downloads, the others read its copy
        splits = job.dataset.component.factory(job.dataset.options)
    model = job.model.component.factory(job.model.options)
    optimizer = job.optimizer.component.factory(model.parameters(), job.optimizer.options)
    train_loader, val_loader = make_loaders(splits, job, accelerator)
    model, optimizer, train_loader, val_loader = accelerator.prepare(model, optimizer, train_loader, val_loader)
    schedule = plan_schedule(job.train, len(train_loader))
    # Not passed through prepare: Accelerate would step it once per process per optimizer step.
    scheduler = job.scheduler.component.factory(optimizer, job.scheduler.options, schedule.total_steps)
    return splits, model, optimizer, scheduler, train_loader, val_loader, schedule


def run_job(job: ResolvedJob, host: PluginHost, output_dir: Path | None = None) -> int:
    """Train ``job``; returns the exit code. User mistakes raise RunjobError (exit 2)."""
    from accelerate.utils import set_seed

    plan = job.strategy.component.factory(job.strategy.options)
    accelerator = build_accelerator(job, plan)
    check_setup(accelerator, job, plan)
    output_dir = _same_on_all_processes(accelerator, choose_output_dir(job.job.name, output_dir))
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "job.toml").write_text(job.to_toml(), encoding="utf-8")
    set_seed(job.job.seed)

    recorder = Recorder(output_dir, active=accelerator.is_main_process)
    run_id = recorder.start(
        tracking=job.tracking,
        experiment=default_experiment(job.tracking, job.job.name),
        run_name=job.tracking.run_name or job.job.name,
        params=flatten(job.to_dict()),
        tags=_tags(job, host, accelerator, output_dir),
    )
    recorder.log_artifact(output_dir / "job.toml")
    if accelerator.is_main_process:
        print(f"runjob: {job.job.name}: {accelerator.num_processes} process(es) on {accelerator.device.type}, output in {output_dir}" + (f", MLflow run {run_id}" if run_id else ""))

    run: RunContext | None = None
    status, error = "FINISHED", None
    _stop_cleanly_on_sigterm()
    try:
        splits, model, optimizer, scheduler, train_loader, val_loader, schedule = _build(job, accelerator)
        run = RunContext(job, accelerator, model, optimizer, scheduler, train_loader, val_loader, output_dir, run_id)
        host.hook.runjob_run_start(run=run)
        TrainingLoop(run, host.hook, recorder.log_metrics, schedule, splits.num_classes).fit()
        accelerator.wait_for_everyone()
        accelerator.save_model(model, output_dir, safe_serialization=True)
        if accelerator.is_main_process:
            recorder.log_artifact(output_dir / "model.safetensors")
    except (KeyboardInterrupt, Terminated) as interrupt:
        status, error = "KILLED", interrupt
        raise
    except BaseException as failure:
        status, error = "FAILED", failure
        raise
    finally:
        _finish(host, run, recorder, accelerator, status, error)
    return 0


def _stop_cleanly_on_sigterm() -> None:
    """SIGTERM (a launcher stopping its workers, a scheduler's preemption) ends the run KILLED
    through the normal clean-up instead of killing the process mid-record."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: Any) -> None:
        # once is enough: a second SIGTERM must not cut the clean-up that records the outcome
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, stop)


def _same_on_all_processes(accelerator: Any, output_dir: Path) -> Path:
    """The main process's choice (default folders are named by the time, which may differ)."""
    if accelerator.num_processes == 1:
        return output_dir
    from accelerate.utils import broadcast_object_list

    return Path(broadcast_object_list([str(output_dir)])[0])


def _finish(host: PluginHost, run: RunContext | None, recorder: Recorder, accelerator: Any, status: str, error: BaseException | None) -> None:
    if run is not None:
        try:
            host.hook.runjob_run_end(run=run, status=status, error=error)
        except Exception:  # noqa: BLE001 - a plugin's bug must not hide the run's own outcome
            print("runjob: a plugin's runjob_run_end hook failed:", file=sys.stderr)
            traceback.print_exc()
    recorder.end(status, error)
    accelerator.end_training()
    _destroy_process_group()


def _destroy_process_group() -> None:
    # gloo jobs sometimes abort at interpreter exit when the group is left for atexit to clean up
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
