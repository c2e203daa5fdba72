"""Loaders of streamed splits (:class:`runjob.host.streams.Streamed`), on LitData.

LitData's ``StreamingDataset`` hands each process its share of the shards and each loader worker
its share of that, downloads chunks ahead into a local cache and deletes read ones to stay under a
size, and its ``StreamingDataLoader`` has a state that resumes mid-epoch exactly (benchmarks/RESULTS.md
section 15). Around it, :class:`StreamLoader` is the loader the training loop iterates:

- LitData yields records one at a time and the loader groups them into batches of
  ``train.batch_size``, so the batch count of a process is its sample count over the batch size,
  whatever the loader workers (LitData batches per worker: 2 workers make 2 short batches);
- every process gets as many batches as the process with the most: a process with fewer repeats
  the first samples of its epoch, as ``DistributedSampler`` pads, and says how many
  (``padded_samples``); with ``train.drop_last`` a process's short last batch is left out and
  counted (``dropped_samples``);
- evaluation batches all have the batch size (a short one is filled with copies): processes gather
  tensors of one shape, and the copies are masked out of the metrics (``valid``);
- ``position()`` is a JSON object saved in every checkpoint and ``restore`` takes it back: the rest
  of the epoch is the uninterrupted run's;
- a random draw for augmentation comes from the job's seed, the epoch and the sample, in whichever
  worker reads it.

This module imports LitData and torch: only a job with a streamed split imports it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import shutil
import tempfile
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from accelerate.data_loader import DataLoaderStateMixin
from accelerate.state import GradientState
from accelerate.utils import send_to_device
from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming.sampler import ChunkedIndex

from runjob.errors import DataError, describe
from runjob.host.components import Batch, Collate, Sample
from runjob.host.streams import Streamed, StreamOptions, StreamPosition
from runjob.record.prediction import collate as default_collate
from runjob.tags import STREAM_DROPPED_TAG, STREAM_LOCATION_TAG, STREAM_PADDED_TAG, STREAM_SHARES_TAG
from runjob.train import downloads, stores

if TYPE_CHECKING:
    from accelerate import Accelerator


POSITION_VERSION = 1
LITDATA_DATASET_LOG = "litdata.streaming.dataset"
CACHE_VARIABLE = "RUNJOB_CACHE_DIR"


def allow_http(endpoint: str | None) -> None:
    """Let LitData's obstore client reach an ``http://`` endpoint (a local MinIO or test server).

    LitData 0.2.76 passes its own client options to obstore's ``S3Store``, which then ignores the
    environment's ``AWS_ALLOW_HTTP``, and an ``http://`` endpoint fails with "builder error"
    (RESULTS 15). Its options are a module-level dict: runjob adds ``allow_http`` there before the
    loader workers fork. ``tests/test_streaming.py`` streams from an ``http://`` server, so a LitData
    that changes this fails there first."""
    if not endpoint or not endpoint.startswith("http://"):
        return
    # lazy: LitData's downloader module, only for an http endpoint
    from litdata.streaming import downloader

    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(options, dict):
        options["allow_http"] = True


def cache_folder(stream: StreamOptions, split: str, digest: str) -> Path:
    """Where a split's chunks are cached: ``cache_dir``, else ``$RUNJOB_CACHE_DIR`` or
    ``~/.cache/runjob/streams``, in a folder named after the location and the split's digest: two
    jobs reading one conversion share it, and a location converted again (``--overwrite``) never
    reads the chunks of the conversion before, which have the same names."""
    root = stream.cache_dir or os.environ.get(CACHE_VARIABLE) or str(Path.home() / ".cache" / "runjob" / "streams")
    where = stream.where
    tag = f"{zlib.crc32(where.url().encode()):08x}"
    name = f"{where.scheme or 'local'}-{where.bucket or Path(where.prefix).name}-{tag}"
    return Path(os.path.expanduser(root)) / name / f"{split}-{digest[:12] or 'unknown'}"


def chunk_limit(stream: StreamOptions, split: str) -> int:
    """The largest chunk of a split, in bytes, from its ``index.json``."""
    try:
        index = json.loads(stores.read_object(stream, split, "index.json"))
        return max(int(chunk["chunk_bytes"]) for chunk in index["chunks"])
    except (ValueError, KeyError, TypeError) as error:
        raise DataError(
            f"{stream.where.url(split, 'index.json')} is not a LitData index ({type(error).__name__}: {error}): "
            "convert the data again with `runjob data convert`"
        ) from None


def cache_budget(stream: StreamOptions, split: str, workers: int, splits: int = 1) -> int:
    """LitData's ``max_cache_size`` for a split, so that the cache stays under ``cache_limit``, of
    which each of the job's ``splits`` streamed splits gets an equal part: LitData
    deletes read chunks only once the cache is over its size, and each worker may then hold its
    chunk, the ones it downloads ahead and one being written. DataError when ``cache_limit`` cannot
    hold that much."""
    largest = chunk_limit(stream, split)
    held = largest * max(1, workers) * (stream.chunks_ahead + 2)
    budget = stream.cache_bytes // max(1, splits) - held
    if budget < largest:
        shared = f" (shared by {splits} streamed splits)" if splits > 1 else ""
        raise DataError(
            f"dataset.cache_limit = {stream.cache_limit!r}{shared} is too small for {stream.where.url(split)}: "
            f"{max(1, workers)} loader worker(s) hold up to {stream.chunks_ahead + 2} chunks of up to "
            f"{largest / 1e6:.1f} MB each ({held / 1e6:.1f} MB); raise cache_limit above "
            f"{(held + largest) / 1e6:.0f} MB, "
            "lower dataset.chunks_ahead or dataset.num_workers, or convert with smaller --chunk-bytes"
        )
    return budget


class _KnownNotices(logging.Filter):
    """LitData's warnings about what runjob chose on purpose, left out of the run's log and terminal:
    a ``max_cache_size`` under 25 GB (``cache_limit`` is the user's) and the override of its state's
    checks on resume (runjob checks the data, seed, batch size and processes itself, and lets the
    cache folder move)."""

    NOTICES = ("The provided `max_cache_size` is less than", "Using state dict override")

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(str(record.msg).startswith(notice) for notice in self.NOTICES)


logging.getLogger(LITDATA_DATASET_LOG).addFilter(_KnownNotices())  # before any loader worker forks


class RecordStream(StreamingDataset):  # type: ignore[misc]  # LitData has no type information
    """LitData's dataset whose records go through the split's transform, with a random draw
    seeded by the job's seed, the epoch (training only) and the sample's index."""

    def __init__(self, streamed: Streamed, seed: int, shuffle: bool, workers: int, splits: int = 1) -> None:
        stream = streamed.stream
        allow_http(stream.endpoint)
        if stream.where.scheme == "s3":
            downloads.use_counted_downloads()
        cache = cache_folder(stream, streamed.split, streamed.digest)
        cache.mkdir(parents=True, exist_ok=True)
        super().__init__(
            streamed.url,
            cache_dir=str(cache),
            shuffle=shuffle,
            drop_last=False,
            seed=seed,
            storage_options=stores.storage_options(stream),
            max_cache_size=cache_budget(stream, streamed.split, workers, splits),
            max_pre_download=stream.chunks_ahead,
            force_override_state_dict=True,  # the cache folder may move between attempts: runjob checks the rest
        )
        self.record_transform = streamed.transform
        self.draw_seed = seed
        self.augment = streamed.augment

    def __getitem__(self, index: object) -> Sample:
        record = super().__getitem__(index)
        sample = int(index.index) if isinstance(index, ChunkedIndex) else int(cast(int, index))
        epoch = int(self.current_epoch) if self.augment else 0
        draw = random.Random(zlib.crc32(array("q", [self.draw_seed, epoch, sample]).tobytes()))
        return self.record_transform(record, draw)


def rows(group: Batch) -> int:
    """How many samples a collated group holds (its tensors' first dimension)."""
    if isinstance(group, torch.Tensor):
        return int(group.shape[0])
    if isinstance(group, dict):
        return rows(next(iter(group.values())))
    if isinstance(group, (tuple, list)) and group:
        return rows(group[0])
    raise DataError(f"a streamed batch holds no tensor to count its samples by: {type(group).__name__}")


def take(group: Batch, start: int, stop: int) -> Batch:
    """Samples ``start`` to ``stop`` of a collated group (every tensor's rows; tuples, lists and dicts alike)."""
    if isinstance(group, torch.Tensor):
        return group[start:stop]
    if isinstance(group, dict):
        return {key: take(value, start, stop) for key, value in group.items()}
    if isinstance(group, (tuple, list)):
        return type(group)(take(value, start, stop) for value in group)
    return group


def join(pieces: list[Batch]) -> Batch:
    """Collated pieces of one structure as one batch (their tensors concatenated along the rows)."""
    first = pieces[0]
    if len(pieces) == 1:
        return first
    if isinstance(first, torch.Tensor):
        return torch.cat(pieces)
    if isinstance(first, dict):
        return {key: join([piece[key] for piece in pieces]) for key in first}
    if isinstance(first, (tuple, list)):
        return type(first)(join([piece[i] for piece in pieces]) for i in range(len(first)))
    return first


def _only(records: list[Sample]) -> Sample:
    """The collate function of a loader that reads one record at a time."""
    return records[0]


def _as_list(records: list[Sample]) -> list[Sample]:
    """The collate function of a LitData loader whose groups a dataset's own collate batches."""
    return records


@dataclass(frozen=True)
class Shares:
    """How a split divides among processes: each one's samples and batches, the batches every
    process goes through (the most any has), and this process's padding and drop, per epoch."""

    samples: list[int]
    batches: list[int]
    rank: int
    batch_size: int
    drop_last: bool

    @property
    def target(self) -> int:
        return max(self.batches)

    @property
    def padded_batches(self) -> int:
        return self.target - self.batches[self.rank]

    def padded_samples(self, rank: int | None = None) -> int:
        """Samples a process repeats per epoch so that every process has ``target`` batches."""
        r = self.rank if rank is None else rank
        return (self.target - self.batches[r]) * self.batch_size

    def dropped_samples(self, rank: int | None = None) -> int:
        r = self.rank if rank is None else rank
        return self.samples[r] - self.batches[r] * self.batch_size if self.drop_last else 0


class StreamLoader(DataLoaderStateMixin):  # type: ignore[misc]  # Accelerate has no type information
    """The loader of one streamed split on this process (see the module's docstring)."""

    def __init__(
        self,
        streamed: Streamed,
        accelerator: Accelerator,
        *,
        seed: int,
        batch_size: int,
        training: bool,
        drop_last: bool,
        num_workers: int,
        collate: Collate,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        worker_init: Callable[[int], None] | None = None,
        cache_share: int = 1,
    ) -> None:
        self.streamed = streamed
        self.gradient_state = GradientState()
        self._drop_last = True  # Accelerate's begin(): no remainder arithmetic, runjob masks copies itself
        self.accelerator = accelerator
        self.seed, self.batch_size, self.training, self.workers = seed, batch_size, training, num_workers
        self.collate = collate
        self.collated_groups = collate is default_collate  # runjob's stacking collate: groups cut by rows
        self.pin_memory = pin_memory
        self.prefetch_factor = prefetch_factor
        self.worker_init = worker_init
        self.cache_share = cache_share  # how many streamed splits share cache_limit
        self.dataset = RecordStream(streamed, seed, shuffle=training, workers=num_workers, splits=cache_share)
        self.records = self._records(self.dataset, num_workers)
        if num_workers:
            # the loader workers start anew each epoch, forked from this process: with the transform's
            # modules (torchvision, PIL) imported here once, not in every worker every epoch (seconds each)
            first_samples(streamed, 1)
        own = int(
            self.dataset.get_len(num_workers, batch_size)
        )  # the batch size the loader reads with: LitData keeps it
        samples = [own]
        if accelerator.num_processes > 1:
            counts = accelerator.gather(torch.tensor([own], device=accelerator.device))
            samples = [int(n) for n in counts.cpu().tolist()]
        drop = drop_last and training
        batches = [n // batch_size if drop else math.ceil(n / batch_size) for n in samples]
        self.shares = Shares(samples, batches, accelerator.process_index, batch_size, drop)
        if sum(samples) != streamed.samples:
            raise DataError(
                f"{streamed.url}: LitData gives the {accelerator.num_processes} process(es) {sum(samples)} samples, "
                "but "
                f"the conversion recorded {streamed.samples}: convert the data again with `runjob data convert`"
            )
        if self.shares.target == 0:
            raise DataError(
                f"{streamed.url}: {min(samples)} samples on a process, fewer than one batch of {batch_size}; lower "
                "train.batch_size or set train.drop_last = false"
            )
        self.epoch = 0
        self.yielded = 0  # batches of this epoch handed out
        self.valid: torch.Tensor | None = None  # which rows of the last batch are samples, not copies
        self._restored: StreamPosition | None = None
        self._group_state: StreamPosition | None = None
        self._taken = 0

    def _records(self, dataset: RecordStream, workers: int) -> StreamingDataLoader:
        extra: dict[str, object] = {}
        if workers:
            extra = {"worker_init_fn": self.worker_init, "prefetch_factor": self.prefetch_factor}
        # the workers hand over their samples in groups, collated there (one shared-memory tensor per
        # field and group: one at a time cost twice the CPU, RESULTS 17); runjob cuts the groups into
        # batches of exactly batch_size. A dataset's own collate (padding, say) gets lists of samples.
        collate_fn = self.collate if self.collated_groups else _as_list
        return StreamingDataLoader(
            dataset, batch_size=self.batch_size, num_workers=workers, collate_fn=collate_fn, **extra
        )

    def __len__(self) -> int:
        return self.shares.target

    def record_tags(self) -> dict[str, str]:
        """The run's tags of how the split divides among processes, padding and drop counted."""
        shares = self.shares
        ranks = range(len(shares.samples))
        return {
            STREAM_LOCATION_TAG: self.streamed.url,
            STREAM_SHARES_TAG: ",".join(str(n) for n in shares.samples),
            STREAM_PADDED_TAG: str(sum(shares.padded_samples(rank) for rank in ranks)),
            STREAM_DROPPED_TAG: str(sum(shares.dropped_samples(rank) for rank in ranks)),
        }

    def retries(self) -> int:
        """Transient store errors retried so far by this process and its loader workers (every split's)."""
        return downloads.retries()

    def summary(self) -> str:
        """One line for the start of a run: the split, its processes and workers, padding and drop."""
        shares, ranks = self.shares, range(len(self.shares.samples))
        padded = sum(shares.padded_samples(rank) for rank in ranks)
        dropped = sum(shares.dropped_samples(rank) for rank in ranks)
        line = (
            f"streaming {self.streamed.url}: {sum(shares.samples)} samples, {len(shares.samples)} process(es) x "
            f"{max(1, self.workers)} loader worker(s), {shares.target} batches each per epoch"
        )
        if padded:
            line += f"; {padded} samples repeated per epoch so that every process has as many batches"
        if dropped:
            line += f"; {dropped} left out per epoch (train.drop_last)"
        return line

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def device(self) -> torch.device:
        device: torch.device = self.accelerator.device
        return device

    def position(self) -> StreamPosition:
        """Where this process stands in the epoch, as JSON: saved in every checkpoint."""
        return {
            "version": POSITION_VERSION,
            "location": self.streamed.url,
            "digest": self.streamed.digest,
            "seed": self.seed,
            "processes": self.accelerator.num_processes,
            "batch_size": self.batch_size,
            "epoch": self.epoch,
            "batches": self.yielded,
            # LitData's state before the group being handed out (None: the epoch's first) and how
            # many of that group's records the yielded batches hold
            "litdata": self._group_state,
            "taken": self._taken,
        }

    def restore(self, position: StreamPosition, source: str) -> None:
        """Go on from ``position`` (a checkpoint's, ``source`` names it) at the next epoch's start."""
        expected = {
            "location": self.streamed.url,
            "digest": self.streamed.digest,
            "seed": self.seed,
            "processes": self.accelerator.num_processes,
            "batch_size": self.batch_size,
        }
        changed = [
            f"{key} {position.get(key)!r} -> {new!r}" for key, new in expected.items() if position.get(key) != new
        ]
        if position.get("version") != POSITION_VERSION or changed:
            differences = "; ".join(changed) or "another version"
            raise DataError(
                f"{source}: the checkpoint's data position does not fit this run ({differences}): "
                "a streamed run resumes mid-epoch with the same data, seed, batch size and number of processes "
                "(loader workers may change)"
            )
        self._restored = position

    def __iter__(self) -> Iterator[Batch]:
        restored, self._restored = self._restored, None
        self.begin()
        try:
            yield from self._epoch(restored)
        finally:
            self.end()

    def _epoch(self, restored: StreamPosition | None) -> Iterator[Batch]:
        shares, size = self.shares, self.batch_size
        own = shares.batches[shares.rank]
        start = int(restored["batches"]) if restored is not None and int(restored["epoch"]) == self.epoch else 0
        self.yielded = start
        if start < own:
            skip = 0
            if start and restored is not None:
                skip = int(restored["taken"])  # records of the group already in a batch
                if restored["litdata"] is not None:
                    self.records.load_state_dict(restored["litdata"])
                else:
                    self.records.current_epoch = self.epoch
            else:
                self.records.current_epoch = self.epoch  # LitData counts epochs from 1: its __iter__ adds one
            pending: list[Batch] = []  # pieces of groups for the next batch
            held = 0
            for state, group in self._groups():  # to the end: LitData's epoch then ends as it expects
                count = rows(group) if self.collated_groups else len(group)
                at = min(skip, count)
                skip -= at
                while at < count and self.yielded < own:
                    stop = min(count, at + size - held)
                    pending.append(take(group, at, stop) if self.collated_groups else group[at:stop])
                    held += stop - at
                    at = stop
                    if held == size:
                        self._group_state, self._taken = state, at
                        yield self._batch(pending)
                        pending, held = [], 0
            if pending and self.yielded < own:  # the short last batch (train.drop_last = false, or evaluation)
                self._group_state, self._taken = None, 0
                yield self._batch(pending)
        if self.yielded < shares.target:
            yield from self._padding(shares.target - self.yielded)

    def _groups(self) -> Iterator[tuple[StreamPosition | None, Batch]]:
        """LitData's record groups, each with LitData's state before it (None for the epoch's first)."""
        groups = self._read()
        state: StreamPosition | None = None
        for group in groups:
            yield state, group
            state = self.records.state_dict()

    def _read(self) -> Iterator[Batch]:
        """LitData's records, its failures as one line naming the split's location (a damaged or
        truncated chunk, a download that failed after its retries); a transform's DataError as it is."""
        try:
            yield from self.records
        except Exception as error:  # noqa: BLE001 - LitData and the store clients raise many kinds
            cause = getattr(error, "__cause__", None) or error
            if isinstance(cause, DataError):  # runjob's own line (a transform's, a download's after its retries)
                raise DataError(_original_line(cause)) from None
            raise DataError(
                f"{self.streamed.url}: reading the shards failed in epoch {self.epoch + 1} ({describe(cause)[:300]}): "
                "a chunk is damaged or truncated, or its download failed or hung; check the store, or convert the data "
                "again with `runjob data convert`"
            ) from None

    def _padding(self, count: int) -> Iterator[Batch]:
        """``count`` batches of the first samples of this process's epoch (read again, in one process)."""
        first = read_aside(self.streamed, self.batch_size, seed=self.seed, shuffle=self.training, epoch=self.epoch)
        piece = self.collate(first) if self.collated_groups else first
        for _ in range(count):
            # training learns from the copies, as from DistributedSampler's; evaluation masks them out
            yield self._batch([piece], valid=len(first) if self.training else 0)

    def _batch(self, pieces: list[Batch], valid: int | None = None) -> Batch:
        """The batch of ``pieces`` (collated groups' rows, or lists of samples) on the device
        (``valid``: how many of its samples count, all by default); evaluation fills a short one to
        the batch size with copies that do not count."""
        if self.collated_groups:
            batch = join(pieces)
            count = rows(batch)
            if not self.training and count < self.batch_size:
                batch = take(join([batch] * -(-self.batch_size // count)), 0, self.batch_size)
        else:
            records = [record for piece in pieces for record in piece]
            count = len(records)
            if not self.training and count < self.batch_size:
                records += [records[i % count] for i in range(self.batch_size - count)]
            batch = self.collate(records)
        size = self.batch_size if not self.training else count
        self.valid = torch.arange(max(size, count), device=self.device) < (count if valid is None else valid)
        self.yielded += 1
        if self.yielded >= self.shares.target:
            self.end_of_dataloader = True
        return send_to_device(batch, self.device, non_blocking=self.pin_memory)


def _original_line(error: DataError) -> str:
    """A DataError's one line, also when a loader worker raised it: PyTorch then raises it again in the
    training process with the worker's traceback in front, its last line the original."""
    text = str(error).strip()
    if "Original Traceback" not in text:
        return text
    last = text.splitlines()[-1]
    return last.split(": ", 1)[1] if last.startswith(f"{DataError.__module__}.{DataError.__name__}: ") else last


def first_samples(streamed: Streamed, count: int) -> list[Sample]:
    """The split's first ``count`` samples (fewer when it is smaller), as its loader gives them, without
    drawing: for the model's example batch, predictions' sample inputs and exports."""
    return read_aside(streamed, count, seed=0, shuffle=False, epoch=0)


def read_aside(streamed: Streamed, count: int, *, seed: int, shuffle: bool, epoch: int) -> list[Sample]:
    """The first ``count`` samples of ``epoch`` as one process without loader workers reads them, through
    a cache folder of their own (beside the split's, deleted after), the reader's downloads stopped.

    LitData's reader goes on downloading ahead after the samples taken, until it holds every slot of
    its cache folder, and keeps a reference on each chunk: in the split's own folder, the loader
    workers then found no room and gave up after 120 s (a 3 GB data set, cache_limit 200MB:
    benchmarks/RESULTS.md section 18)."""
    # read in order, whole chunks as training reads them (LitData's reads of single samples by index
    # fetch byte ranges, which came back empty from an S3-compatible server here)
    home = cache_folder(streamed.stream, streamed.split, streamed.digest)
    home.parent.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f".{home.name}-aside-", dir=home.parent)
    aside = dataclasses.replace(streamed, stream=streamed.stream.model_copy(update={"cache_dir": scratch}))
    dataset = RecordStream(aside, seed=seed, shuffle=shuffle, workers=0)
    try:
        loader = StreamingDataLoader(dataset, batch_size=1, num_workers=0, collate_fn=_only)
        loader.current_epoch = epoch
        return list(islice(loader, count))
    finally:
        _stop_downloads(dataset)
        shutil.rmtree(scratch, ignore_errors=True)


def _stop_downloads(dataset: RecordStream) -> None:
    """Stop the download thread of ``dataset``'s reader and wait for it (LitData stops it only when the
    reader is collected, which a reference cycle may put off)."""
    reader = getattr(getattr(dataset, "cache", None), "_reader", None)
    thread = getattr(reader, "_prepare_thread", None)
    if thread is not None and hasattr(thread, "force_stop"):
        thread.force_stop()
        thread.join(timeout=30)
