"""Checkpoints: written atomically, kept to a number, found and loaded again for ``--resume``.

A checkpoint is a folder ``OUTPUT_DIR/checkpoints/step-00000123/`` holding Accelerate's
``save_state`` (model weights as safetensors, optimizer, RNG states of every rank, the data
sampler), the scheduler's state, and ``runjob_state.json`` (step, epoch, position inside the
epoch, the MLflow run id, the job). It is written under ``.tmp-step-...`` and renamed only when
every rank has finished, so a process killed while writing leaves the previous one intact.
Everything is loaded with ``weights_only`` (no arbitrary pickle).

The scheduler's state (``scheduler.pt``) and the callbacks' (``callbacks.pt``, through the run's
dispatcher and its error policy) are runjob's own files rather than objects handed to
``Accelerator.register_for_checkpointing``: Accelerate loads those back with torch's loader and
``weights_only=False`` (``accelerate.checkpointing.load_custom_state``, 1.16), an arbitrary unpickling
of a file in the run's folder, which a run folder someone else wrote must never cause
(``tests/test_run_is_data.py``).
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runjob.errors import RunjobError, describe
from runjob.host.kinds import BY_NAME
from runjob.host.run_context import named_models
from runjob.host.run_folder import (
    ATTEMPTS_DIR,
    CALLBACKS_FILE,
    CHECKPOINT_STATE_FILE,
    SCHEDULER_FILE,
    WEIGHTS_FILE,
    RunFolder,
    checkpoint_step,
)
from runjob.job.keys import flat, value_text
from runjob.train.data_loading import PositionedLoader, is_stream

if TYPE_CHECKING:
    from runjob.host.events import Dispatcher
    from runjob.host.run_context import Run
    from runjob.job.jobfile import Tables


@dataclass(frozen=True)
class Position:
    """Where training stands: optimizer steps done, the epoch, micro-batches done in that epoch."""

    step: int = 0
    epoch: int = 0
    batches_done: int = 0


def checkpoints_folder(output_dir: Path) -> Path:
    return RunFolder(output_dir).checkpoints_dir


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints in ``output_dir``, oldest first (temporary folders are not complete)."""
    folder = checkpoints_folder(output_dir)
    if not folder.is_dir():
        return []
    steps = {p: checkpoint_step(p.name) for p in folder.iterdir()}
    found = [p for p, step in steps.items() if step is not None and (p / CHECKPOINT_STATE_FILE).is_file()]
    return sorted(found, key=lambda p: steps[p] or 0)


def save_checkpoint(
    run: Run, position: Position, keep: int, extra: Mapping[str, object], events: Dispatcher | None
) -> Path:
    """Write a checkpoint of ``run`` at ``position`` on every rank; returns its folder. The callbacks'
    states come through ``events``, the run's dispatcher, under its error policy."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch

    accelerator = run.accelerator
    folder = RunFolder(run.output_dir)
    final = folder.checkpoint(position.step)
    temporary = folder.checkpoint_temporary(position.step)
    try:
        if accelerator.is_main_process:
            shutil.rmtree(temporary, ignore_errors=True)
            temporary.mkdir(parents=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(temporary), safe_serialization=True)
        loader = getattr(run, "train_loader", None)
        if isinstance(loader, PositionedLoader):  # every process's place in its share of the streamed data
            position_file = temporary / DATA_POSITION_FILE.format(rank=accelerator.process_index)
            position_file.write_text(json.dumps(loader.position()) + "\n", encoding="utf-8")
        if accelerator.is_main_process:
            if run.scheduler is not None:
                torch.save(run.scheduler.state_dict(), temporary / SCHEDULER_FILE)
            states = events.states() if events is not None else {}
            if any(states.values()):
                torch.save(states, temporary / CALLBACKS_FILE)
            state = {**asdict(position), **extra}
            (temporary / CHECKPOINT_STATE_FILE).write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            if final.exists():  # a resumed run passing the same step again
                shutil.rmtree(final)
            os.replace(temporary, final)
            _prune(run.output_dir, keep)
    except OSError as error:
        previous = complete_checkpoints(run.output_dir)
        kept = f"; the last complete checkpoint, {previous[-1]}, is intact" if previous else ""
        raise RunjobError(f"cannot write checkpoint {final}: {error.strerror or error}{kept}") from None
    accelerator.wait_for_everyone()
    return final


def _prune(output_dir: Path, keep: int) -> None:
    found = complete_checkpoints(output_dir)
    for old in found[: len(found) - keep]:
        shutil.rmtree(old, ignore_errors=True)


def tidy_finished(output_dir: Path, keep: int) -> str | None:
    """Once a run has finished: keep its newest ``keep`` checkpoints (``train.keep_checkpoints_finished``)
    and store the final weights once (a hard link where the last checkpoint's or ``best/``'s weights
    are the same bytes as ``model.safetensors``). Returns what it did, for the log, or None."""
    before = _bytes(output_dir)
    _prune(output_dir, keep)
    final = RunFolder(output_dir).weights
    linked = [copy for copy in _same_weights(output_dir, final) if _link(final, copy)]
    freed = before - _bytes(output_dir)
    if not freed:
        return None
    kept = len(complete_checkpoints(output_dir))
    shared = (
        f"; {', '.join(str(p.relative_to(output_dir)) for p in linked)} = {WEIGHTS_FILE}, stored once" if linked else ""
    )
    kept_text = f"kept {kept} checkpoint(s) of the finished run (train.keep_checkpoints_finished)"
    return f"{kept_text}{shared}: {freed / 2**20:.0f} MiB freed"


def same_bytes(a: Path, b: Path) -> bool:
    """Whether two files hold the same bytes (a hard link of one to the other, or equal contents)."""
    return a.samefile(b) or filecmp.cmp(a, b, shallow=False)


def _same_weights(output_dir: Path, final: Path) -> list[Path]:
    candidates = [output_dir / model.weights for model in named_models(output_dir).values()]  # best/ ...
    found = complete_checkpoints(output_dir)
    if found:
        candidates.append(found[-1] / WEIGHTS_FILE)
    if not final.is_file():
        return []
    return [
        path for path in candidates if path.is_file() and not os.path.samefile(path, final) and same_bytes(path, final)
    ]


def _link(source: Path, target: Path) -> bool:
    """Replace ``target`` with a hard link to ``source`` (atomically); False where links can't be made."""
    temporary = target.with_name(f".link-{target.name}")
    try:
        os.link(source, temporary)
        os.replace(temporary, target)
    except OSError:
        temporary.unlink(missing_ok=True)
        return False
    return True


def _bytes(folder: Path) -> int:
    """Bytes the files under ``folder`` take, each hard-linked file counted once."""
    seen, total = set(), 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
    return total


def read_state(checkpoint: Path) -> dict[str, Any]:
    """The runjob state of a checkpoint; a clear error when it is missing or unreadable."""
    try:
        state: dict[str, Any] = json.loads((checkpoint / CHECKPOINT_STATE_FILE).read_text(encoding="utf-8"))
        return state
    except (OSError, ValueError) as error:
        raise RunjobError(f"--resume {checkpoint}: not a complete runjob checkpoint ({error})") from None


def find_checkpoint(output_dir: Path, explicit: Path | None) -> Path:
    """The checkpoint to resume: ``explicit``, else the newest complete one in ``output_dir``."""
    if explicit is not None:
        if not (explicit / CHECKPOINT_STATE_FILE).is_file():
            raise RunjobError(f"--resume {explicit}: not a complete runjob checkpoint (no {CHECKPOINT_STATE_FILE})")
        return explicit
    found = complete_checkpoints(output_dir)
    if not found:
        raise RunjobError(f"--resume: no complete checkpoint in {checkpoints_folder(output_dir)}")
    return found[-1]


AUTO = "auto"
"""``--resume auto`` / ``train.resume = "auto"``: continue when there is a checkpoint, else start."""
AUTO_NEEDS_FOLDER = (
    "--resume auto (train.resume = 'auto') needs --output-dir DIR: a folder that survives restarts, where the same "
    "command finds its checkpoints (e.g. runs/$SLURM_JOB_ID)"
)


def set_aside_attempt(output_dir: Path) -> Path:
    """Move what an attempt that left no complete checkpoint wrote in ``output_dir`` (its job.toml,
    metrics, record, a half-written checkpoint) into ``OUTPUT_DIR/attempts/N``, so nothing is lost
    and the folder can hold the fresh start; returns that folder."""
    folder = RunFolder(output_dir)
    number = 1
    while folder.attempt(number).exists():
        number += 1
    kept = folder.attempt(number)
    kept.mkdir(parents=True)
    for entry in output_dir.iterdir():
        if entry.name != ATTEMPTS_DIR:
            os.replace(entry, kept / entry.name)
    return kept


def load_checkpoint(run: Run, checkpoint: Path, events: Dispatcher) -> Position:
    """Restore model, optimizer, scheduler, RNG and sampler states; returns where to continue. The
    callbacks get theirs through ``events``, the run's dispatcher: a callback that fails to take its
    state is said as that callback's failure, not as a damaged checkpoint."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch

    state = read_state(checkpoint)
    states: dict[str, object] = {}
    try:
        run.accelerator.load_state(str(checkpoint))
        if run.scheduler is not None and (checkpoint / SCHEDULER_FILE).exists():
            run.scheduler.load_state_dict(torch.load(checkpoint / SCHEDULER_FILE, weights_only=True))
        if (checkpoint / CALLBACKS_FILE).exists():
            states = torch.load(checkpoint / CALLBACKS_FILE, weights_only=True, map_location="cpu")
            if not isinstance(states, dict):
                raise TypeError(f"{CALLBACKS_FILE} holds a {type(states).__name__}, not the callbacks' states by name")
    except Exception as error:  # noqa: BLE001 - a corrupt or incompatible checkpoint
        raise RunjobError(f"cannot load checkpoint {checkpoint}: {describe(error)}") from None
    events.load_states(states, str(checkpoint))
    position = Position(state["step"], state["epoch"], state["batches_done"])
    if is_stream(getattr(run, "train_loader", None)) and position.batches_done:
        _restore_data_position(run, checkpoint)
    return position


def _restore_data_position(run: Run, checkpoint: Path) -> None:
    """A streamed split's place in the epoch, this process's, from ``checkpoint``."""
    path = checkpoint / DATA_POSITION_FILE.format(rank=run.accelerator.process_index)
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise RunjobError(
            f"cannot resume from {checkpoint}: the streamed data's position ({path.name}) is missing or damaged "
            f"({describe(error)}); resume from an earlier checkpoint with --resume PATH"
        ) from None
    run.train_loader.restore(saved, str(path))


# What a resumed job may not change: it would no longer be the same training.
# train.compile: a compiled model's checkpoint names its weights "_orig_mod.*", which a plain one can't load.
MUST_MATCH = (
    "job.seed",
    "model",
    "dataset",
    "optimizer.name",
    "optimizer.groups",  # the optimizer's state is kept per param group: other groups cannot load it
    "optimizer.no_decay_norm_and_bias",
    "scheduler.name",
    "task.name",
    "train.batch_size",
    "train.gradient_accumulation_steps",
    "launch.num_processes",
    "train.compile",
)
LOADER_KEYS = (
    "dataset.num_workers",
    "dataset.pin_memory",
    "dataset.persistent_workers",
    "dataset.prefetch_factor",
    # a streamed dataset's cache and endpoint may change between attempts (another node's scratch disk)
    "dataset.cache_dir",
    "dataset.cache_limit",
    "dataset.chunks_ahead",
    "dataset.endpoint_url",
)
DATA_POSITION_FILE = "data_position-{rank}.json"


def _shown(values: dict[str, object], key: str) -> str:
    return value_text(values[key]) if key in values else "(unset)"


def compare_jobs(saved: Tables, current: Tables) -> tuple[list[str], list[str]]:
    """Differences between the checkpoint's job and this one: (refused, allowed), as
    ``key: old -> new`` lines."""
    # a job saved before tasks were components trained the default task
    saved, current = ({"task": {"name": BY_NAME["task"].default}, **job} for job in (saved, current))
    old, new = flat(saved), flat(current)  # the whole values, not MLflow's params (cut at 6,000 characters)
    refused: list[str] = []
    allowed: list[str] = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) == new.get(key):
            continue
        line = f"{key}: {_shown(old, key)} -> {_shown(new, key)}"
        blocking = any(key == m or key.startswith(m + ".") for m in MUST_MATCH) and key not in LOADER_KEYS
        (refused if blocking else allowed).append(line)
    return refused, allowed
