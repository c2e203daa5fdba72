"""DataLoaders for a job's datasets, with clear errors for data that cannot be batched.

A ``Dataset`` split gets torch's DataLoader with the job's loader keys. An :class:`ImageTensors`
split (the in-memory fast path) is moved to the training device once; its DataLoader yields
indices in batches (so Accelerate shards, seeds and skips it as any other) and every batch is
gathered, cropped, flipped and normalized there as whole tensors.
"""

from __future__ import annotations

import os
import zlib
from array import array
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from runjob.errors import DataError
from runjob.host.components import Batch, Collate, DatasetSplits, ImageTensors, Sample, Split
from runjob.host.output import screen
from runjob.host.streams import Streamed, StreamPosition
from runjob.record.prediction import collate  # noqa: F401 - the loaders' collate, shared with prediction

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from runjob.job.validation import ResolvedJob


def already_batched(batch: Batch) -> Batch:
    """The collate function of :class:`BatchedImages`: its fetch returns whole batches."""
    return batch


def random_crop(images: torch.Tensor, padding: int, generator: torch.Generator) -> torch.Tensor:
    """Every image cropped at its own random offset from a zero-padded copy, in one gather: what
    ``RandomCrop(size, padding=padding)`` does image by image. Returns channels-last memory."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch
    import torch.nn.functional as F

    count, _, height, width = images.shape
    device = images.device
    padded = F.pad(images, (padding, padding, padding, padding)).permute(0, 2, 3, 1)  # N, H+2p, W+2p, C
    dy = torch.randint(0, 2 * padding + 1, (count, 1), generator=generator, device=device)
    dx = torch.randint(0, 2 * padding + 1, (count, 1), generator=generator, device=device)
    rows = (dy + torch.arange(height, device=device))[:, :, None]
    cols = (dx + torch.arange(width, device=device))[:, None, :]
    which = torch.arange(count, device=device)[:, None, None]
    return padded[which, rows, cols].permute(0, 3, 1, 2)


class BatchedImages:
    """An :class:`ImageTensors` split on a device, as a map-style dataset whose batched fetch
    (``__getitems__``, which torch's DataLoader calls with a batch's indices) builds the batch."""

    def __init__(
        self, split: ImageTensors, device: torch.device, seed: int, augment: bool, channels_last: bool = False
    ) -> None:
        # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
        import torch

        self.images = split.images.to(device)
        self.labels = split.labels.to(device=device, dtype=torch.long)
        scale = 255.0 if split.images.dtype == torch.uint8 else 1.0
        self.mean = torch.tensor(split.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1) * scale
        self.std = torch.tensor(split.std, dtype=torch.float32, device=device).view(1, -1, 1, 1) * scale
        self.padding = split.crop_padding if augment else 0
        self.flip = split.flip and augment
        self.seed = seed
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.__getitems__([index])
        return inputs[0], targets[0]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
        import torch

        which = torch.tensor(indices)
        if self.images.device.type == "cuda":
            # from pinned memory, without blocking: a plain copy would wait for the GPU to finish
            # every step queued so far, and the next step could not be queued ahead
            which = which.pin_memory().to(self.images.device, non_blocking=True)
        images = self.images[which]
        if self.padding or self.flip:
            generator = torch.Generator(device=self.images.device).manual_seed(self._batch_seed(indices))
            if self.padding:
                images = random_crop(images, self.padding, generator)
            if self.flip:
                flipped = torch.rand(len(indices), generator=generator, device=self.images.device) < 0.5
                images = torch.where(flipped[:, None, None, None], images.flip(3), images)
        inputs = ((images.float() - self.mean) / self.std).contiguous(memory_format=self.memory_format)
        return inputs, self.labels[which]

    def _batch_seed(self, indices: list[int]) -> int:
        # The job's seed and the batch's samples: the same batch gets the same draws in a rerun
        # and after a resume, whatever ran before it in this process.
        return zlib.crc32(array("q", [self.seed, len(indices), *indices[:64]]).tobytes())


@runtime_checkable
class PositionedLoader(Protocol):
    """A streamed split's loader (``runjob.train.streaming.StreamLoader``) as the rest of training
    sees it without importing LitData: it shards, batches and moves its data itself, says where it
    stands in the epoch for a checkpoint, and which rows of its last batch count."""

    valid: torch.Tensor | None

    def position(self) -> StreamPosition: ...

    def restore(self, position: StreamPosition, source: str) -> None: ...

    def set_epoch(self, epoch: int) -> None: ...

    def record_tags(self) -> dict[str, str]: ...

    def summary(self) -> str: ...

    def retries(self) -> int:
        """Transient store errors retried so far by this process and its loader workers."""
        ...


def is_stream(loader: object) -> bool:
    """Whether ``loader`` is a streamed split's."""
    return isinstance(loader, PositionedLoader)


def pins_memory(job: ResolvedJob, on_cuda: bool) -> bool:
    """Whether a Dataset split's DataLoader pins its batches: ``dataset.pin_memory``, by default
    when training on CUDA. Accelerate then copies them to the GPU without blocking."""
    return on_cuda if job.loader.pin_memory is None else job.loader.pin_memory


def example_batch(split: Split, collate_fn: Collate | None = None) -> Batch:
    """A batch of the split's first item, twice, on the CPU, as the loop sees it (for logging the
    model: ``torch.export`` would fix a batch of one as a constant); ``collate_fn``: the dataset's."""
    if isinstance(split, ImageTensors):
        # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
        import torch

        return BatchedImages(split, torch.device("cpu"), seed=0, augment=False).__getitems__([0, 0])
    if isinstance(split, Streamed):
        # lazy: LitData (and its S3 clients) only for a streamed split
        from runjob.train.streaming import first_samples

        first = first_samples(split, 1)[0]
        return (collate_fn or collate)([first, first])
    return (collate_fn or collate)([split[0], split[0]])


def _check_in_memory_loader(job: ResolvedJob) -> None:
    """In-memory splits are batched on the device in this process: worker and pinning keys don't apply."""
    loader = job.loader
    set_keys = [
        f"dataset.{key} = {str(value).lower()}"
        for key, value in (
            ("num_workers", loader.num_workers),
            ("pin_memory", loader.pin_memory),
            ("persistent_workers", loader.persistent_workers),
        )
        if value
    ] + ([f"dataset.prefetch_factor = {loader.prefetch_factor}"] if loader.prefetch_factor is not None else [])
    if set_keys:
        raise DataError(
            f"dataset {job.dataset.name!r} keeps its data in memory and builds each batch on the training device, "
            f"without DataLoader workers or pinned memory: remove {', '.join(set_keys)} from the job (or turn the "
            f"dataset's in-memory option off: `runjob plugins --long` lists {job.dataset.name!r}'s options)"
        )


def leave_stops_to_training(worker_id: int) -> None:
    """Each DataLoader worker in a process group of its own: the signals sent to the training
    process's group (a terminal's Ctrl-C, a closed SSH session's SIGHUP, ``kill -TERM -PGID`` as
    Slurm signals a task) are the training process's to handle. A worker killed by one made the
    training process fail on its next batch ("DataLoader worker ... is killed by signal") instead of
    writing its checkpoint and stopping. Signals sent to the worker itself still end it (the
    DataLoader's own shutdown, multiprocessing's at exit), and a worker whose training process is gone
    exits (PyTorch's workers watch it). Ignoring the signals instead would leave a worker that
    multiprocessing's exit terminates, then waits for, forever."""
    os.setpgid(0, 0)


def make_loaders(
    splits: DatasetSplits, job: ResolvedJob, accelerator: Accelerator
) -> tuple[DataLoader[Sample], DataLoader[Sample], DataLoader[Sample] | None]:
    """Training (shuffled, seeded), validation and test (in order, every sample once) DataLoaders;
    the test loader is None when the dataset has no test split."""
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch
    from torch.utils.data import DataLoader

    dataset_name = job.dataset.name
    global_batch = job.train.batch_size * accelerator.num_processes
    named = [("train", splits.train), ("val", splits.val)]
    if splits.test is not None:
        named.append(("test", splits.test))
    for split, data in named:
        if len(data) == 0:
            raise DataError(f"dataset {dataset_name!r}: the {split} split is empty")
    if job.train.drop_last and len(splits.train) < global_batch:
        raise DataError(
            f"dataset {dataset_name!r} has {len(splits.train)} training samples, fewer than one batch "
            f"({job.train.batch_size} x {accelerator.num_processes} processes); lower train.batch_size or set "
            "train.drop_last = false"
        )
    in_memory = [isinstance(data, ImageTensors) for _, data in named]
    if any(in_memory):
        _check_in_memory_loader(job)
    loader = job.loader
    if loader.persistent_workers and any(isinstance(data, Streamed) for _, data in named):
        raise DataError(
            f"dataset {dataset_name!r} is streamed and its loader workers start anew each epoch (LitData hands each "
            "epoch's shards out again): remove dataset.persistent_workers = true from the job"
        )
    common = {
        "num_workers": loader.num_workers,
        "worker_init_fn": leave_stops_to_training if loader.num_workers else None,
        "pin_memory": pins_memory(job, accelerator.device.type == "cuda"),
        "persistent_workers": loader.persistent_workers,
        "prefetch_factor": loader.prefetch_factor,
        "collate_fn": splits.collate or collate,
    }
    on_device = {"num_workers": 0, "pin_memory": False, "collate_fn": already_batched}
    channels_last = job.train.channels_last

    def dataset(data: Split, augment: bool) -> Split:
        if isinstance(data, ImageTensors):
            return BatchedImages(data, accelerator.device, job.job.seed, augment, channels_last)
        return data

    def streamed(data: Streamed, training: bool) -> DataLoader[Sample]:
        # lazy: LitData (and its S3 clients) only for a streamed split
        from runjob.train.streaming import StreamLoader

        return StreamLoader(
            data,
            accelerator,
            seed=job.job.seed,
            batch_size=job.train.batch_size if training else (job.train.eval_batch_size or job.train.batch_size),
            training=training,
            drop_last=job.train.drop_last,
            num_workers=loader.num_workers,
            collate=splits.collate or collate,
            pin_memory=bool(common["pin_memory"]),
            prefetch_factor=loader.prefetch_factor,
            worker_init=leave_stops_to_training,
            cache_share=sum(isinstance(data, Streamed) for _, data in named),
        )

    if isinstance(splits.train, Streamed):
        train = streamed(splits.train, training=True)
        screen.say(f"runjob: {cast(PositionedLoader, train).summary()}")
    else:
        train = DataLoader(
            dataset(splits.train, augment=True),
            batch_size=job.train.batch_size,
            shuffle=True,
            drop_last=job.train.drop_last,
            generator=torch.Generator().manual_seed(job.job.seed),
            **(on_device if in_memory[0] else common),
        )
    evaluation = [
        streamed(data, training=False)
        if isinstance(data, Streamed)
        else DataLoader(
            dataset(data, augment=False),
            batch_size=job.train.eval_batch_size or job.train.batch_size,
            shuffle=False,
            **(on_device if fast else common),
        )
        for (_, data), fast in zip(named[1:], in_memory[1:], strict=True)
    ]
    return train, evaluation[0], evaluation[1] if len(evaluation) > 1 else None
