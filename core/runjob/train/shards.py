"""``runjob data convert``: a source of samples written as shards (LitData's ``optimize``) to a location.

A source is an image folder (``train/<class>/``, ``val/<class>/``, as the ``imagefolder`` dataset
reads it). Each split becomes a folder of chunks and an ``index.json`` under the location
(``LOCATION/train/``, ``LOCATION/val/``), written by LitData's worker processes straight to the store;
``runjob.json`` (:data:`runjob.host.streams.MANIFEST_FILE`) is written last and names what the shards
hold: the kind, the classes, each split's sample count and digest, and the source's digest. A
location without it holds no finished conversion and no run reads it; a conversion run again after
an interruption starts the split over. A location whose conversion finished is left as it is when
the source has not changed, and refused otherwise unless ``--overwrite``.

Each split's records are written in a seeded random order (a shuffled epoch mixes chunks and the
samples within each chunk, not samples across chunks). Records are what the streamed datasets read
back: ``{"id": int, "label": int, "image": bytes}``
(the file's own bytes: decoding, resizing and augmenting happen in the training run's loader
workers, with the same transforms as the image-folder dataset).
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
from dataclasses import dataclass
from pathlib import Path

from runjob.errors import DataError
from runjob.host.output import screen
from runjob.host.streams import MANIFEST_FILE, Record, StreamOptions
from runjob.train import stores

Manifest = Record
"""A conversion's ``runjob.json``, read as JSON."""
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
MANIFEST_VERSION = 1
SPLITS = ("train", "val", "test")
WRITE_ORDER_SEED = 0
CHUNKS_AIMED = 16
MIN_CHUNK, MAX_CHUNK = 1_000_000, 64_000_000
STAGING_CHUNKS = "DATA_OPTIMIZER_CACHE_FOLDER"  # LitData's staging folders, read from the environment
STAGING_DATA = "DATA_OPTIMIZER_DATA_CACHE_FOLDER"


@dataclass(frozen=True)
class ImageFile:
    """One image of an image folder: its place in its split (the record's id), class and path."""

    id: int
    label: int
    path: str


def image_folder(root: Path) -> tuple[list[str], dict[str, list[ImageFile]]]:
    """The classes and each split's images of an image folder (sorted: ids are stable), with a
    one-line DataError for a folder that is not one."""
    splits = [name for name in SPLITS if (root / name).is_dir()]
    if "train" not in splits or "val" not in splits:
        raise DataError(f"{root}: an image folder holds train/<class>/ and val/<class>/ folders of images")
    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"{root / 'train'}: no class folders")
    found: dict[str, list[ImageFile]] = {}
    for split in splits:
        others = sorted(p.name for p in (root / split).iterdir() if p.is_dir() and p.name not in classes)
        if others:
            raise DataError(f"{root / split}: class folders {others} are not in train/ ({len(classes)} classes)")
        files = [
            (label, path)
            for label, name in enumerate(classes)
            if (root / split / name).is_dir()
            for path in sorted((root / split / name).rglob("*"))
            if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not files:
            raise DataError(f"{root / split}: no image files ({', '.join(IMAGE_SUFFIXES)})")
        found[split] = [ImageFile(i, label, str(path)) for i, (label, path) in enumerate(files)]
    return classes, found


def split_digest(root: Path, files: list[ImageFile]) -> str:
    """A digest of a split's images: each one's place, class, name and bytes."""
    digest = hashlib.sha256()
    for item in files:
        digest.update(f"{item.id}\0{item.label}\0{Path(item.path).relative_to(root).as_posix()}\0".encode())
        digest.update(Path(item.path).read_bytes())
    return digest.hexdigest()


def image_record(item: ImageFile) -> Record:
    """The record of one image (run in LitData's worker processes)."""
    return {"id": item.id, "label": item.label, "image": Path(item.path).read_bytes()}


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


def convert_image_folder(
    root: Path, stream: StreamOptions, *, chunk_bytes: str, workers: int, overwrite: bool
) -> Manifest:
    """Write the image folder ``root`` as shards to ``stream``'s location; returns the manifest."""
    # lazy: LitData's writer (and its worker processes) only for a conversion
    from litdata import optimize

    # lazy: the streaming module imports LitData
    from runjob.train.streaming import allow_http

    classes, splits = image_folder(root)
    digests = {split: split_digest(root, files) for split, files in splits.items()}
    source = hashlib.sha256(json.dumps([classes, digests], sort_keys=True).encode()).hexdigest()
    where = stream.where
    done = read_manifest(stream)
    if done is not None and done.get("source_digest") == source:
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
        "kind": "images",
        "classes": classes,
        "source": str(root),
        "source_digest": source,
        "write_order_seed": WRITE_ORDER_SEED,
        "splits": {},
    }
    for split, files in splits.items():
        started = time.perf_counter()
        screen.say(f"runjob: converting {len(files)} images of {root / split} to {where.url(split)}")
        # written in a seeded random order: a shuffled epoch reorders chunks and the samples within
        # each, so chunks written class by class would give batches of one or two classes
        order = list(files)
        random.Random(WRITE_ORDER_SEED).shuffle(order)
        # LitData's own lines (an advertisement, its inferred format, each worker's end) left out;
        # its progress bar (stderr) stays
        with contextlib.redirect_stdout(io.StringIO()), _staging_folders():
            optimize(
                fn=image_record,
                inputs=order,
                output_dir=where.url(split),
                chunk_bytes=chunk_size(files) if chunk_bytes == "auto" else chunk_bytes,
                num_workers=workers,
                mode="overwrite",
                storage_options=stores.storage_options(stream),
                keep_data_ordered=True,
                start_method="fork",
            )
        _check_index(stream, split, len(files))
        manifest["splits"][split] = {"samples": len(files), "digest": digests[split]}
        screen.say(f"runjob: {split}: {len(files)} samples in {time.perf_counter() - started:.1f} s")
    stores.write_object(stream, (json.dumps(manifest, indent=1) + "\n").encode(), MANIFEST_FILE)
    screen.say(f"runjob: wrote {where.url(MANIFEST_FILE)} ({_counts(manifest)}; digest {source[:12]})")
    return manifest


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


def chunk_size(files: list[ImageFile]) -> int:
    """``--chunk-bytes auto``: a split's bytes over :data:`CHUNKS_AIMED`, from 1 MB to 64 MB. Each
    loader worker reads whole chunks, downloaded while it reads the one before: a split of a couple
    of chunks leaves a worker waiting for its first download (17,970 small images in two 4.5 MB
    chunks streamed at 0.76x the image folder's samples/s, in 1 MB chunks at 1.04x: RESULTS 17)."""
    total = sum(os.path.getsize(item.path) for item in files)
    return max(MIN_CHUNK, min(MAX_CHUNK, total // CHUNKS_AIMED))


def _counts(manifest: Manifest) -> str:
    splits = manifest.get("splits") or {}
    return ", ".join(f"{name} {info.get('samples')}" for name, info in splits.items()) or "no splits"
