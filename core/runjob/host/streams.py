"""Streamed datasets: where their shards are and what a dataset factory returns for them.

A streamed dataset reads shards written by ``runjob data convert`` (LitData's format: an
``index.json`` and chunk files per split, and runjob's ``runjob.json`` written last) from an object
store (``s3://BUCKET/PREFIX``, ``gs://BUCKET/PREFIX``, any S3-compatible store through
``endpoint_url``) or a local folder. Its options derive from :class:`StreamOptions`, so every
streamed dataset, built-in or a plugin's, names its data the same way; its factory returns a
:class:`Streamed` per split and runjob builds the loader: sharded across processes and loader
workers, its position saved in every checkpoint, its local cache kept under ``cache_limit``.

Credentials never come from the job file: S3 reads ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
``AWS_PROFILE``, the instance's role; Google Cloud Storage ``GOOGLE_APPLICATION_CREDENTIALS``.
Nothing here touches the network or imports LitData: ``runjob validate`` checks a location's form.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import urlsplit

from pydantic import ByteSize, Field, TypeAdapter, ValidationError, field_validator, model_validator

from runjob.host.components import Options, Sample

Record: TypeAlias = dict[str, Any]
"""A stored sample as ``runjob data convert`` wrote it: bytes, numbers and strings by name."""
StreamPosition: TypeAlias = dict[str, Any]
"""Where a streamed split's loader stands in an epoch: JSON, saved in every checkpoint."""
MANIFEST_FILE = "runjob.json"
"""Written last by ``runjob data convert``: a location without it holds no finished conversion."""
STORE_SCHEMES = ("s3", "gs")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_SIZE = TypeAdapter(ByteSize)
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
"""Where an S3-compatible store's URL is read from when ``endpoint_url`` is not set (boto3's names)."""


@dataclass(frozen=True)
class Location:
    """A parsed location: ``scheme`` ``"s3"`` or ``"gs"`` with ``bucket`` and ``prefix``, or ``""``
    for a local folder (``prefix`` then holds its absolute path)."""

    scheme: str
    bucket: str
    prefix: str

    @property
    def remote(self) -> bool:
        return bool(self.scheme)

    def url(self, *parts: str) -> str:
        """The location (joined with ``parts``) as LitData and the stores' clients take it."""
        tail = "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))
        if not self.remote:
            return str(Path(self.prefix, *parts))
        return f"{self.scheme}://{self.bucket}/{tail}" if tail else f"{self.scheme}://{self.bucket}"

    def key(self, *parts: str) -> str:
        """The object key of ``parts`` under the prefix (a remote location's)."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def __str__(self) -> str:
        return self.url()


def parse_location(text: str) -> Location:
    """``s3://BUCKET/PREFIX``, ``gs://BUCKET/PREFIX`` or a local folder (``file://`` allowed);
    ValueError naming what is wrong and what would be right. No network access."""
    if not text.strip():
        raise ValueError("is empty: give s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or a local folder")
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        path = parts.path if scheme == "file" else text
        return Location("", "", os.path.abspath(os.path.expanduser(path)))
    if scheme not in STORE_SCHEMES:
        raise ValueError(
            f"{text!r}: runjob streams from s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or a local folder, not {scheme}:// "
            "(an S3-compatible store such as MinIO, Ceph or R2 is s3:// with dataset.endpoint_url)"
        )
    bucket = parts.netloc
    if parts.query or parts.fragment:
        raise ValueError(f"{text!r}: a location has no ?query or #fragment")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ValueError(
            f"{text!r}: {bucket!r} is not a bucket name (3-63 characters of a-z, 0-9, '.', '-' and '_', starting "
            "and ending with a letter or digit)"
        )
    return Location(scheme, bucket, parts.path.strip("/"))


def parse_size(text: str) -> int:
    """``"8GB"``, ``"500MiB"``, ``"2e9"`` as bytes; ValueError otherwise."""
    try:
        return int(_SIZE.validate_python(text))
    except ValidationError:
        raise ValueError(
            f"{text!r} is not a size: write a number of bytes with a unit, such as '500MB' or '8GiB'"
        ) from None


def endpoint_from_environment() -> str | None:
    """The S3-compatible endpoint the environment names (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``)."""
    for name in ENDPOINT_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def check_endpoint(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an endpoint URL: give http(s)://HOST[:PORT], such as 'http://127.0.0.1:9000'")
    try:
        parts.port  # noqa: B018 - reading it checks it
    except ValueError:
        raise ValueError(f"{url!r}: the port is not a number from 0 to 65535") from None
    if parts.path.strip("/") or parts.query:
        raise ValueError(
            f"{url!r}: an endpoint URL is a scheme, host and port, without a path (the bucket goes in location)"
        )
    return url


class StreamOptions(Options):
    """The options every streamed dataset takes: derive a dataset's options from it. Credentials
    never go here: they come from the environment (see :mod:`runjob.host.streams`)."""

    location: str
    """Where the shards are: 's3://BUCKET/PREFIX', 'gs://BUCKET/PREFIX' or a local folder, as
    `runjob data convert` wrote them (each split in its own folder under it)."""
    endpoint_url: str | None = None
    """An S3-compatible store's URL (MinIO, Ceph, R2, a local test server): 'http(s)://HOST[:PORT]';
    by default AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL when set, else Amazon S3."""
    cache_limit: str = "8GB"
    """The most local disk the downloaded shards may take ('500MB', '8GiB'): chunks already read are
    deleted to stay under it; it must hold what the loader workers read ahead."""
    cache_dir: str | None = None
    """Where downloaded shards are kept; by default ~/.cache/runjob/streams/ (RUNJOB_CACHE_DIR when set)."""
    chunks_ahead: int = Field(2, ge=1, le=64)
    """Chunks each loader worker downloads ahead of the one it reads."""

    @field_validator("location")
    @classmethod
    def _location_form(cls, value: str) -> str:
        parse_location(value)
        return value

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint_form(cls, value: str | None) -> str | None:
        return None if value is None else check_endpoint(value)

    @field_validator("cache_limit")
    @classmethod
    def _cache_size(cls, value: str) -> str:
        if parse_size(value) < 1_000_000:
            raise ValueError(f"{value!r} is under 1 MB: the cache must hold at least a few chunks")
        return value

    @model_validator(mode="after")
    def _endpoint_is_for_s3(self) -> StreamOptions:
        scheme = parse_location(self.location).scheme
        if self.endpoint_url is not None and scheme != "s3":
            where = f"{scheme}://" if scheme else "a local folder"
            raise ValueError(f"endpoint_url {self.endpoint_url!r} is for s3:// locations, and location is {where}")
        return self

    @property
    def where(self) -> Location:
        return parse_location(self.location)

    @property
    def endpoint(self) -> str | None:
        """``endpoint_url``, else the environment's, for an s3:// location."""
        if self.where.scheme != "s3":
            return None
        return self.endpoint_url or endpoint_from_environment()

    @property
    def cache_bytes(self) -> int:
        return parse_size(self.cache_limit)


@dataclass(frozen=True)
class Streamed:
    """One split of a streamed dataset, as its factory returns it in :class:`DatasetSplits`:
    runjob builds its loader (sharded over processes and loader workers, shuffled by the job's
    seed for training, its position in every checkpoint).

    ``transform(record, draw)`` turns a stored record (the dict ``runjob data convert`` wrote:
    bytes, numbers, strings) into a sample the task takes; it runs in the loader workers. ``draw``
    is a ``random.Random`` seeded by the job's seed, the epoch and the sample: use it for random
    augmentation, so a rerun and a resumed run draw the same."""

    stream: StreamOptions
    split: str
    transform: Callable[[Record, random.Random], Sample]
    samples: int
    """How many samples the split holds (from the conversion's record)."""
    digest: str = ""
    """The split's content digest as the conversion recorded it."""
    augment: bool = field(default=False)
    """Whether ``transform`` draws (training); evaluation's draws are the same every epoch."""

    @property
    def url(self) -> str:
        return self.stream.where.url(self.split)

    def __len__(self) -> int:
        return self.samples


@dataclass(frozen=True)
class ShardSource:
    """What a converter (``runjob_register_converters``) returns for ``runjob data convert``: a
    source's items, split, and how each becomes a stored record. runjob writes them as LitData
    shards to the location (in a seeded random order, so a shuffled epoch's batches mix the whole
    split), checks the upload, and writes ``runjob.json`` last with ``facts`` in it; the streamed
    dataset reads them back with :func:`runjob.stream_manifest`.

    ``record(item)`` runs in the conversion's worker processes: a module-level function (or a
    picklable object) returning a dict of bytes, numbers, strings or lists of numbers; put an
    ``"id"`` in it, the item's place in its split, so a run's samples can be told apart."""

    splits: Mapping[str, Sequence[object]]
    """Each split's items (``"train"`` and ``"val"``, optionally ``"test"``): one record each."""
    record: Callable[[Any], Record]
    digests: dict[str, str]
    """Each split's content digest (what a run's record names as the data it trained on)."""
    source: str
    """What was converted, as a user names it (a path, a pattern)."""
    facts: Record = field(default_factory=dict)
    """What the streamed dataset needs to read the records back (JSON): classes, columns, scales."""
    sizes: dict[str, int] = field(default_factory=dict)
    """Each split's size in bytes, about (``--chunk-bytes auto`` aims at 16 chunks a split)."""
