"""The session's build step: the data, the task, the model (started from ``model.init_from``, with
its adapters, frozen parameters and param groups), the optimizer and loaders prepared by the
Accelerator, the scheduler and the schedule (:class:`Built`)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from runjob.host.components import Adapter, DataFacts, DatasetSplits
from runjob.host.model_build import adapter_places, apply_adapters, build_model, make_adapters, takes_data
from runjob.host.output import screen
from runjob.host.streams import Streamed
from runjob.host.task import Task
from runjob.job.validation import ResolvedJob
from runjob.record.uri import resolve_tracking_uri
from runjob.train import initialization
from runjob.train.data_loading import is_stream, make_loaders
from runjob.train.loop import Schedule, plan_schedule
from runjob.train.trained import load_data

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from runjob.host.components import Sample


@dataclass(frozen=True)
class Built:
    """The session's build step: the data, the task, and the model, optimizer and loaders prepared
    by the Accelerator, the scheduler for the real step count and the schedule."""

    splits: DatasetSplits
    task: Task
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    """The factory's scheduler (``None`` for none; typed by its plugin)."""
    train_loader: torch.utils.data.DataLoader[Sample]
    val_loader: torch.utils.data.DataLoader[Sample]
    test_loader: torch.utils.data.DataLoader[Sample] | None
    schedule: Schedule
    facts: DataFacts = field(default_factory=DataFacts)
    """What the model factory was told of the data (saved as ``data_facts.json``)."""
    adapters: dict[str, Adapter] = field(default_factory=dict)
    """The job's adapters, applied to the model (``[model.adapters.NAME]``)."""
    lineage: dict[str, str] = field(default_factory=dict)
    """The tags of where ``model.init_from``'s weights came from (recorded at RUN_START)."""


def build(job: ResolvedJob, accelerator: Accelerator, tracking_uri: str | None, resuming: bool = False) -> Built:
    """Dataset, task, model, optimizer and loaders, prepared; then the scheduler for the real step count.

    The model is built once, from its options and the data's facts; it starts from
    ``model.init_from`` when set (its lineage kept for the record; ``tracking_uri``: the run's; not when
    ``resuming``: the checkpoint holds the weights), then gets its adapters
    (``[model.adapters.NAME]``), has ``model.freeze``'s parameters frozen, and its trainable
    parameters are handed to the optimizer's factory as param groups (``[optimizer] groups``)."""
    with accelerator.main_process_first():  # one process downloads, the others read its copy
        splits, task = load_data(job)
    factory = job.model.component.factory
    facts = facts_of(splits) if takes_data(factory) else DataFacts.of(splits, read_sample=False)
    model = build_model(factory, job.model.options, facts)
    line, lineage = _start_from(job, accelerator, model, tracking_uri) if not resuming else (None, {})
    said = [line]
    adapters = make_adapters(job.adapters)
    if adapters:
        model = apply_adapters(model, adapters, adapter_places(job.adapters))
        said.append(f"adapters {', '.join(adapters)}: {next(iter(adapters.values())).trainable(model)}")
    if job.train.channels_last:
        # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
        import torch

        model = model.to(memory_format=torch.channels_last)
    said.append(initialization.freeze(model, job))
    groups, line = initialization.param_groups(model, job)
    said.append(line)
    screen.say(*(f"runjob: {line}" for line in said if line))
    optimizer = job.optimizer.component.factory(groups, job.optimizer.options)
    train_loader, val_loader, test_loader = make_loaders(splits, job, accelerator)
    if not any(isinstance(split, Streamed) for split in (splits.train, splits.val, splits.test)):
        model, optimizer, train_loader, val_loader = accelerator.prepare(model, optimizer, train_loader, val_loader)
        if test_loader is not None:
            test_loader = accelerator.prepare(test_loader)
    else:  # a streamed split's loader shards, batches and moves its data itself (runjob.train.streaming)
        model, optimizer = accelerator.prepare(model, optimizer)
        train_loader, val_loader = (
            loader if is_stream(loader) else accelerator.prepare(loader) for loader in (train_loader, val_loader)
        )
        if test_loader is not None and not is_stream(test_loader):
            test_loader = accelerator.prepare(test_loader)
    schedule = plan_schedule(job.train, len(train_loader))
    # Not passed through prepare: Accelerate would step it once per process per optimizer step.
    scheduler = job.scheduler.component.factory(optimizer, job.scheduler.options, schedule.total_steps)
    return Built(
        splits,
        task,
        model,
        optimizer,
        scheduler,
        train_loader,
        val_loader,
        test_loader,
        schedule,
        facts,
        adapters,
        lineage,
    )


def facts_of(splits: DatasetSplits) -> DataFacts:
    """The data's facts for a model factory that takes them, its first training sample read
    without moving a random generator (reading a sample may draw a random crop): the model's
    initialisation and the run's batches stay what they were."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch

    if isinstance(splits.train, Streamed):
        # lazy: LitData (and its S3 clients) only for a streamed split
        from runjob.train.streaming import first_samples

        splits = replace(splits, train=first_samples(splits.train, 1))  # its first sample, as a list
    state = random.getstate()
    try:
        with torch.random.fork_rng(devices=[]):
            return DataFacts.of(splits)
    finally:
        random.setstate(state)


def _start_from(
    job: ResolvedJob, accelerator: Accelerator, model: torch.nn.Module, tracking_uri: str | None
) -> tuple[str | None, dict[str, str]]:
    """``model.init_from``: load the weights it names into ``model``; the line to say and their lineage's tags."""
    if job.model_setup.init_from is None:
        return None, {}
    if accelerator.num_processes > 1:  # only the main process's recorder knows it
        # lazy: `runjob JOB` says its first line and starts its recording process before accelerate loads (train.entry)
        from accelerate.utils import broadcast_object_list

        tracking_uri = broadcast_object_list([tracking_uri])[0]
    if tracking_uri is None and job.model_setup.init_from.startswith("runs:/"):
        tracking_uri = resolve_tracking_uri(job.tracking.uri)
    return initialization.init_from(model, job, tracking_uri)
