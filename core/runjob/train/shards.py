"""``runjob data convert``: a source of samples written as shards (LitData's ``optimize``) to a location.

A converter (``runjob_register_converters``; built in: ``images``, ``table``, ``text``) reads the
source and returns a :class:`~runjob.host.streams.ShardSource`: each split's items and the function
that turns an item into a record. Each split becomes a folder of chunks and an ``index.json`` under
the location (``LOCATION/train/``, ``LOCATION/val/``), written by LitData's worker processes straight
to the store; ``runjob.json`` (:data:`runjob.host.streams.MANIFEST_FILE`) is written last and names
what the shards hold: the converter, its facts (classes, columns, context), each split's sample count
and digest, and the source's digest. A location without it holds no finished conversion and no run
reads it; a conversion run again after an interruption starts the split over. A location whose
conversion finished is left as it is when the source has not changed, and refused otherwise unless
``--overwrite``.

Each split's records are written in a seeded random order: a shuffled epoch mixes chunks and the
samples within each chunk, not samples across chunks, so records written in the source's order
(class by class, file by file) would give batches of one or two classes or files.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import tempfile
import time
from collections.abc import Iterator

from runjob.errors import DataError
from runjob.host.output import bars_disabled, screen
from runjob.host.streams import MANIFEST_FILE, Record, ShardSource, StreamOptions
from runjob.train import stores

Manifest = Record
"""A conversion's ``runjob.json``, read as JSON."""
MANIFEST_VERSION = 1
SPLITS = ("train", "val", "test")
WRITE_ORDER_SEED = 0
CHUNKS_AIMED = 16
MIN_CHUNK, MAX_CHUNK = 1_000_000, 64_000_000
STAGING_CHUNKS = "DATA_OPTIMIZER_CACHE_FOLDER"  # LitData's staging folders, read from the environment
STAGING_DATA = "DATA_OPTIMIZER_DATA_CACHE_FOLDER"
RESERVED = ("version", "format", "kind", "source", "source_digest", "write_order_seed", "splits")
"""The manifest's own keys: a converter's facts may not use them."""


def read_manifest(stream: StreamOptions) -> Manifest | None:
    """The location's ``runjob.json``, or None when no conversion finished there."""
    if not stores.object_exists(stream, MANIFEST_FILE):
        return None
    try:
        manifest: Manifest = json.loads(stores.read_object(stream, MANIFEST_FILE))
    except ValueError as error:
        raise DataError(f"{stream.where.url(MANIFEST_FILE)} is not JSON ({error}): convert the data again") from None
    return manifest


def stream_manifest(stream: StreamOptions) -> Manifest:
    """The location's ``runjob.json``: what its shards hold (kind, classes, each split's samples and
    digest). DataError when no conversion finished there or it is not runjob's."""
    manifest = read_manifest(stream)
    if manifest is None:
        raise DataError(
            f"{stream.where.url(MANIFEST_FILE)} not found: {stream.where.url()} holds no finished conversion; "
            f"run `runjob data convert SOURCE {stream.where.url()}` (again, if it was interrupted)"
        )
    splits = manifest.get("splits")
    if manifest.get("version") != MANIFEST_VERSION or not isinstance(splits, dict) or "train" not in splits:
        raise DataError(
            f"{stream.where.url(MANIFEST_FILE)} is not a conversion this runjob reads (version "
            f"{manifest.get('version')!r}, splits {sorted(splits) if isinstance(splits, dict) else splits!r}): "
            "convert the data again with `runjob data convert`"
        )
    return manifest


def write_shards(
    kind: str, source: ShardSource, stream: StreamOptions, *, chunk_bytes: str, workers: int, overwrite: bool
) -> Manifest:
    """Write ``source`` (converter ``kind``'s reading of a data set) as shards to ``stream``'s
    location; returns the manifest written last."""
    # lazy: LitData's writer (and its worker processes) only for a conversion
    from litdata import optimize

    # lazy: the streaming module imports LitData
    from runjob.train.streaming import allow_http

    _check_source(kind, source)
    source_digest = hashlib.sha256(
        json.dumps([kind, source.facts, source.digests], sort_keys=True).encode()
    ).hexdigest()
    where = stream.where
    done = read_manifest(stream)
    if done is not None and done.get("source_digest") == source_digest:
        screen.say(f"runjob: {where.url()} already holds this conversion ({_counts(done)}): nothing to do")
        return done
    if done is not None and not overwrite:
        raise DataError(
            f"{where.url()} already holds a finished conversion of other data ({_counts(done)}; source digest "
            f"{str(done.get('source_digest'))[:12]}): pass --overwrite to replace it (runs that trained on it keep "
            "its digest in their record), or convert to another location"
        )
    if done is not None:
        stores.delete_prefix(stream, MANIFEST_FILE)  # from here on, no run reads this location until it is whole
    allow_http(stream.endpoint)
    manifest: Manifest = {
        "version": MANIFEST_VERSION,
        "format": "litdata",
        "kind": kind,
        **source.facts,
        "source": source.source,
        "source_digest": source_digest,
        "write_order_seed": WRITE_ORDER_SEED,
        "splits": {},
    }
    for split in (name for name in SPLITS if name in source.splits):
        items = list(source.splits[split])
        started = time.perf_counter()
        screen.say(f"runjob: converting {source.source} ({split}, {len(items)} samples, {kind}) to {where.url(split)}")
        random.Random(WRITE_ORDER_SEED).shuffle(items)
        size = source.sizes.get(split)
        # LitData's own lines (an advertisement, its inferred format, each worker's end) left out;
        # its progress bar (stderr) stays, unless TQDM_DISABLE says no bars: LitData 0.2.76 redraws a
        # disabled bar and fails (AttributeError: 'tqdm_asyncio' object has no attribute 'nrows')
        with contextlib.redirect_stdout(io.StringIO()), _staging_folders():
            optimize(
                fn=source.record,
                inputs=items,
                output_dir=where.url(split),
                chunk_bytes=chunk_size(size) if chunk_bytes == "auto" else chunk_bytes,
                num_workers=max(1, min(workers, len(items))),
                mode="overwrite",
                storage_options=stores.storage_options(stream),
                keep_data_ordered=True,
                start_method="fork",
                verbose=not bars_disabled(),  # verbose: its progress bar
            )
        _check_index(stream, split, len(items))
        manifest["splits"][split] = {"samples": len(items), "digest": source.digests[split]}
        screen.say(f"runjob: {split}: {len(items)} samples in {time.perf_counter() - started:.1f} s")
    stores.write_object(stream, (json.dumps(manifest, indent=1) + "\n").encode(), MANIFEST_FILE)
    screen.say(f"runjob: wrote {where.url(MANIFEST_FILE)} ({_counts(manifest)}; digest {source_digest[:12]})")
    return manifest


def _check_source(kind: str, source: object) -> None:
    """A converter's return value, checked before anything is written (a plugin's mistake is one line)."""
    if not isinstance(source, ShardSource):
        raise DataError(f"converter {kind!r} returned {type(source).__name__}, not a runjob.ShardSource")
    problems = []
    if "train" not in source.splits or "val" not in source.splits:
        problems.append(f"its splits are {sorted(source.splits)}: a conversion needs train and val")
    problems += [f"split {name!r} is not one of {', '.join(SPLITS)}" for name in source.splits if name not in SPLITS]
    problems += [f"split {name!r} holds no items" for name, items in source.splits.items() if not len(items)]
    problems += [f"split {name!r} has no digest" for name in source.splits if name not in source.digests]
    problems += [f"its facts use the manifest's own key {key!r}" for key in RESERVED if key in source.facts]
    try:
        json.dumps(source.facts)
    except (TypeError, ValueError) as error:
        problems.append(f"its facts are not JSON ({error})")
    if problems:
        raise DataError(f"converter {kind!r}: {'; '.join(problems)}")


@contextlib.contextmanager
def _staging_folders() -> Iterator[None]:
    """Folders of this conversion's own for the chunks LitData writes before uploading them. Its
    default, one folder under the system's temporary folder, is shared by every conversion on the
    machine: two at once (two users, two tests) uploaded and deleted each other's chunks and left an
    index of no chunks."""
    names = {STAGING_CHUNKS: "chunks", STAGING_DATA: "data"}
    before = {name: os.environ.get(name) for name in names}
    with tempfile.TemporaryDirectory(prefix="runjob-convert-") as folder:
        for name, sub in names.items():
            os.environ[name] = os.path.join(folder, sub)
        try:
            yield
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _check_index(stream: StreamOptions, split: str, samples: int) -> None:
    """That LitData's index of a split, as the store holds it, lists all ``samples``: a failed upload
    LitData only logs must not get a ``runjob.json``."""
    url = stream.where.url(split, "index.json")
    try:
        chunks = json.loads(stores.read_object(stream, split, "index.json"))["chunks"]
        written = sum(int(chunk["chunk_size"]) for chunk in chunks)
    except (ValueError, KeyError, TypeError) as error:
        raise DataError(f"{url} is not a LitData index ({error}): run `runjob data convert` again") from None
    if written != samples:
        raise DataError(
            f"{url} lists {written} of the split's {samples} samples (an upload failed): the location has no "
            "finished conversion; run `runjob data convert` again"
        )


def chunk_size(size: int | None) -> int:
    """``--chunk-bytes auto``: a split's bytes over :data:`CHUNKS_AIMED`, from 1 MB to 64 MB (1 MB when
    the converter gave no size). Each loader worker reads whole chunks, downloaded while it reads the
    one before: a split of a couple of chunks leaves a worker waiting for its first download (17,970
    small images in two 4.5 MB chunks streamed at 0.76x the image folder's samples/s, in 1 MB chunks at
    1.04x: RESULTS 17)."""
    return max(MIN_CHUNK, min(MAX_CHUNK, (size or 0) // CHUNKS_AIMED))


def _counts(manifest: Manifest) -> str:
    splits = manifest.get("splits") or {}
    return ", ".join(f"{name} {info.get('samples')}" for name, info in splits.items()) or "no splits"
