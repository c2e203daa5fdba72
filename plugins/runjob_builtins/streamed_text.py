"""Built-in converter ``text`` and dataset ``streamed_text``: the ``text_files`` corpus (text files
matched by a glob pattern, byte tokens, split by whole file) converted to shards (``runjob data
convert PATTERN LOCATION --from text``) and streamed from ``s3://``, ``gs://`` or a local folder of
shards. Needs the stream extra (``pip install 'runjob-train[stream]'``).

A record is one window, ``{"id": int, "tokens": bytes}``: the ``context + 1`` bytes ``text_files``
gives as its window ``id`` for the same files and options (stride ``context``, non-overlapping), so
a streamed epoch holds exactly ``text_files``' windows. The conversion records the context, the
vocabulary and the unigram perplexity baseline in the location's ``runjob.json``."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError, model_validator

from runjob import DataError, DatasetSplits, ShardSource, Streamed, StreamOptions, hookimpl, require_module
from runjob_builtins.text import (
    TextFilesOptions,
    TextPrompts,
    TextSplitOptions,
    TokenWindows,
    read_corpus,
    split_files,
    unigram_perplexity,
)

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    import torch

    from runjob import Register

VOCAB_SIZE = 256  # byte tokens
SPLITS = ("train", "val", "test")


class StreamedTextOptions(StreamOptions):
    context: int | None = Field(None, ge=1)
    """The conversion's context, to check it (the windows were cut at conversion); unset: whatever
    the location holds (`runjob data convert ... --from text -o context=N` chooses it)."""

    @model_validator(mode="after")
    def _needs_litdata(self) -> StreamedTextOptions:
        require_module("litdata", "stream", "dataset 'streamed_text'")
        return self


@dataclass(frozen=True, slots=True)
class Window:
    """One window of a split: its index (the record's id) and its ``context + 1`` bytes."""

    id: int
    tokens: bytes


def window_record(item: Window) -> dict[str, Any]:
    """The record of one window (run in the conversion's worker processes)."""
    return {"id": item.id, "tokens": item.tokens}


def windows_of(data: bytes, windows: TokenWindows) -> list[Window]:
    """``data``'s windows as ``windows`` (its ``TokenWindows``) cuts them: ``context + 1`` bytes every
    ``context``."""
    step = windows.context
    return [Window(index, data[index * step : index * step + step + 1]) for index in range(len(windows))]


def split_digest(data: bytes, context: int) -> str:
    """A digest of a split's windows: the context and the bytes they are cut from."""
    digest = hashlib.sha256(f"context {context}:{len(data)}:".encode())
    digest.update(data)
    return digest.hexdigest()


def convert_text(source: str, options: TextSplitOptions) -> ShardSource:
    """The files ``source`` (a glob pattern, as ``text_files``' ``paths``) matches as token windows
    (``runjob data convert PATTERN LOCATION --from text``)."""
    try:
        corpus = TextFilesOptions(paths=source, **options.model_dump())
    except ValidationError as error:
        raise DataError(f"SOURCE {source!r}: {error.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    files = read_corpus(corpus)
    total = sum(len(data) for _, data in files)
    members = split_files(files, corpus)
    data = {name: b"".join(content for _, content in members[name]) for name in SPLITS}
    windows = {name: TokenWindows(content, options.context) for name, content in data.items()}
    needed = SPLITS if options.test_fraction > 0 else SPLITS[:2]
    for name in needed:
        if len(windows[name]) == 0:
            raise DataError(
                f"the {name} split has {len(data[name]):,} bytes in {len(members[name])} file(s), fewer than one "
                f"window of context + 1 = {options.context + 1}; the corpus has {total:,} bytes in {len(files)} "
                "distinct file(s), split by whole file: match more files with SOURCE, raise -o max_bytes, lower "
                "-o context, or change -o val_fraction / test_fraction"
            )
    baseline = unigram_perplexity(data["train"], windows["val"].targets())
    return ShardSource(
        splits={name: windows_of(data[name], windows[name]) for name in needed},
        record=window_record,
        digests={name: split_digest(data[name], options.context) for name in needed},
        source=str(corpus.paths),
        facts={"context": options.context, "vocab_size": VOCAB_SIZE, "baselines": {"unigram_perplexity": baseline}},
        sizes={name: len(windows[name]) * (options.context + 1) for name in needed},
    )


class WindowRecords:
    """A stored window record (``{"id", "tokens": bytes}``) as the int64 tensor of its ``context + 1``
    tokens: ``text_files``' sample."""

    def __init__(self, context: int, location: str) -> None:
        self.context, self.location = context, location

    def __call__(self, record: dict[str, Any], draw: random.Random) -> torch.Tensor:
        tokens = record["tokens"]
        if not isinstance(tokens, bytes) or len(tokens) != self.context + 1:
            size = f"{len(tokens)} bytes" if isinstance(tokens, bytes) else type(tokens).__name__
            raise DataError(
                f"{self.location}: window {record.get('id')} holds {size}, not context + 1 = {self.context + 1} "
                "bytes: convert the data again"
            )
        return TokenWindows(tokens, self.context)[0]


def build_streamed_text(options: StreamedTextOptions) -> DatasetSplits:
    """The location's converted token windows, streamed."""
    # lazy: plugin modules are imported by `runjob validate`, which reads no store
    from runjob import stream_manifest

    manifest = stream_manifest(options)
    location = options.where.url()
    if manifest.get("kind") != "text":
        raise DataError(
            f"dataset.location = {options.location!r} holds {manifest.get('kind')!r} shards, not text: give the "
            "location of a `runjob data convert PATTERN LOCATION --from text` conversion"
        )
    splits = manifest["splits"]
    if "val" not in splits:
        raise DataError(f"dataset.location = {options.location!r}: the conversion has no val split")
    context = int(manifest["context"])
    if options.context is not None and options.context != context:
        raise DataError(
            f"dataset.context = {options.context}, but {location} holds windows of context {context}: leave "
            f"dataset.context out (or set it to {context}), or convert again with `runjob data convert ... "
            f"{location} --from text -o context={options.context}`"
        )
    transform = WindowRecords(context, location)

    def split(name: str, training: bool) -> Streamed:
        info = splits[name]
        return Streamed(options, name, transform, int(info["samples"]), str(info["digest"]), augment=training)

    baselines = manifest.get("baselines") or {}
    return DatasetSplits(
        train=split("train", training=True),
        val=split("val", training=False),
        test=split("test", training=False) if "test" in splits else None,
        num_classes=VOCAB_SIZE,
        vocab_size=int(manifest.get("vocab_size", VOCAB_SIZE)),
        context=context,
        source=location,
        digest=str(manifest["source_digest"])[:16],
        baselines={str(name): float(value) for name, value in baselines.items()},
        inputs=TextPrompts(),
    )


@hookimpl
def runjob_register_converters(register: Register) -> None:
    """Register text."""
    register(
        "text",
        convert_text,
        options=TextSplitOptions,
        description="text files matched by a glob pattern ({stdlib} allowed) as windows of context + 1 byte tokens",
    )


@hookimpl
def runjob_register_datasets(register: Register) -> None:
    """Register streamed_text."""
    register(
        "streamed_text",
        build_streamed_text,
        options=StreamedTextOptions,
        description="text files converted by `runjob data convert --from text`, streamed from s3://, gs:// or a folder",
    )
