"""Converters and streamed datasets: ``hf_text``'s token windows and ``hf_classification``'s
tokenized rows written as shards (``runjob data convert 'corpus/*.txt' LOCATION --from hf_text -o
context=128 ...``) and streamed from ``s3://``, ``gs://`` or a local folder of shards
(``hf_text_streamed``, ``hf_classification_streamed``) with runjob's LitData loader, which resumes
mid-epoch exactly (a ``datasets`` stream with a shuffle buffer does not).

A converter builds the dataset itself (reading, splitting, the tokenizer loaded or trained,
tokenizing, the windows) and stores each sample as a record: ``{"id", "tokens": int32 bytes}`` a
window (``context + 1`` token ids when packed), ``{"id", "input_ids": int32 bytes, "label"}`` a row.
The conversion's facts hold what the streamed dataset needs to read them back and to predict: the
tokenizer's JSON and special token ids, the context or ``max_length``, the classes, the baselines.
A streamed run's samples, facts, inputs and artifacts are the dataset's for the same data and
options. Needs the stream extra (``pip install 'runjob-train[stream]'``)."""

from __future__ import annotations

import hashlib
import random
from bisect import bisect_right
from collections.abc import Sequence, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError, model_validator

import runjob
from runjob_hf.inputs import Prompts, Texts
from runjob_hf.options import HFClassificationOptions, HFDataOptions, HFTextOptions
from runjob_hf.tokenizing import Vocabulary

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch or numpy
    import torch

    from runjob_hf.data import EncodedRows, TokenWindows

TEXT_KIND = "hf_text"
CLASSIFICATION_KIND = "hf_classification"
"""The converters' names, which a manifest records as its ``kind``."""
_Options = TypeVar("_Options", bound=HFDataOptions)


class HFTextConvertOptions(HFTextOptions):
    """``runjob data convert PATTERN LOCATION --from hf_text -o KEY=VALUE``: ``hf_text``'s options
    (``context``, ``packing``, ``tokenizer`` or ``train_tokenizer``, ``val_files``, ...); its
    ``files`` are SOURCE."""

    @model_validator(mode="after")
    def _has_files(self) -> HFTextConvertOptions:  # overrides hf_text's: SOURCE names the files
        if self.files is not None:
            raise ValueError("the files are SOURCE (`runjob data convert 'corpus/*.txt' LOCATION`), not -o files")
        return self


class HFClassificationConvertOptions(HFClassificationOptions):
    """``runjob data convert PATTERN LOCATION --from hf_classification -o KEY=VALUE``:
    ``hf_classification``'s options; its ``files`` are SOURCE, or SOURCE is ``-`` with ``-o
    class_files={...}``."""

    @model_validator(mode="after")
    def _one_source(self) -> HFClassificationConvertOptions:  # overrides hf_classification's: SOURCE names the files
        if self.files is not None:
            raise ValueError("the files are SOURCE (`runjob data convert 'reviews/*.jsonl' LOCATION`), not -o files")
        return self


class _StreamedOptions(runjob.StreamOptions):
    @model_validator(mode="after")
    def _needs_litdata(self) -> _StreamedOptions:
        runjob.require_module("litdata", "stream", "a streamed dataset")
        return self


class HFTextStreamedOptions(_StreamedOptions):
    """``[dataset] name = "hf_text_streamed"``: where ``runjob data convert --from hf_text`` wrote the
    shards; the context, packing and tokenizer are the conversion's."""


class HFClassificationStreamedOptions(_StreamedOptions):
    """``[dataset] name = "hf_classification_streamed"``: where ``runjob data convert --from
    hf_classification`` wrote the shards; the classes, max_length and tokenizer are the conversion's."""


@dataclass(frozen=True)
class StreamedWindows(runjob.Streamed):
    """A streamed split of token windows, with its tokens a byte (for ``bits_per_byte``)."""

    tokens_per_byte: float | None = None


# --- shared --------------------------------------------------------------------------------------------


class _SplitRecords:
    """Records of samples of several splits (run in the conversion's worker processes). An item is a
    sample's number over the splits in order (the training split's first): numbers, not names, since
    LitData takes an item's strings naming existing files for input files to copy."""

    def __init__(self, splits: Sequence[Sized]) -> None:
        self.starts = [0]
        for split in splits[:-1]:
            self.starts.append(self.starts[-1] + len(split))

    def locate(self, item: int) -> tuple[int, int]:
        """The split (its place) and the sample's index in it."""
        which = bisect_right(self.starts, item) - 1
        return which, item - self.starts[which]


def _numbered(splits: dict[str, Sized]) -> dict[str, range]:
    """Each split's items: the numbers :class:`_SplitRecords` takes."""
    items, first = {}, 0
    for name, split in splits.items():
        items[name] = range(first, first + len(split))
        first += len(split)
    return items


def _with_source(kind: str, cls: type[_Options], options: HFDataOptions, given: dict[str, Any]) -> _Options:
    """The dataset's options of the converter's options with SOURCE's files; one-line DataError."""
    try:
        return cls.model_validate({**options.model_dump(exclude_unset=True), **given})
    except ValidationError as error:
        problem = error.errors()[0]
        files = given.get("files")
        what = f"SOURCE {files!r}" if files is not None and problem["loc"][:1] in ((), ("files",)) else kind
        raise runjob.DataError(
            f"{what}: {problem['msg'].removeprefix('Value error, ')} (give the files by a glob pattern, quoted: "
            "'corpus/*.txt', 'data/*.parquet')"
        ) from None


def _tokenizer_facts(vocabulary: Vocabulary, options: HFDataOptions) -> dict[str, Any]:
    """What rebuilds the tokenizer where the shards are read (its JSON, special token ids) and names it."""
    facts: dict[str, Any] = {
        "vocab_size": vocabulary.size,
        "pad_id": vocabulary.pad_id,
        "eos_id": vocabulary.eos_id,
        "bos_id": vocabulary.bos_id,
        "special": dict(vocabulary.special),
        "tokenizer": options.tokenizer or "trained",
        "tokenizer_digest": vocabulary.digest,
        "tokenizer_json": vocabulary.json,
    }
    if options.train_tokenizer is not None:
        facts["train_tokenizer"] = options.train_tokenizer.model_dump()
    return facts


def _checked_manifest(options: runjob.StreamOptions, kind: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """The location's manifest; DataError unless it is a conversion of ``kind`` with facts ``keys``
    and a val split."""
    manifest = runjob.stream_manifest(options)
    where = f"dataset.location = {options.location!r}"
    if manifest.get("kind") != kind:
        raise runjob.DataError(
            f"{where} holds {manifest.get('kind')!r} shards, not {kind}: give the location of a "
            f"`runjob data convert --from {kind}` conversion"
        )
    missing = [key for key in ("tokenizer_json", "vocab_size", *keys) if key not in manifest]
    if missing:
        raise runjob.DataError(f"{where}: its runjob.json lacks {', '.join(missing)}: convert the data again")
    if "val" not in manifest["splits"]:
        raise runjob.DataError(f"{where}: the conversion has no val split")
    return manifest


def stored_vocabulary(manifest: dict[str, Any]) -> Vocabulary:
    """The conversion's tokenizer, as its facts hold it."""
    return Vocabulary(
        str(manifest["tokenizer_json"]),
        manifest.get("pad_id"),
        manifest.get("eos_id"),
        manifest.get("bos_id"),
        {str(k): str(v) for k, v in (manifest.get("special") or {}).items()},
    )


def _hf_cache() -> Path:
    """Where runjob-hf keeps its own files by default (``$HF_HOME/runjob-hf``), as the datasets do."""
    # lazy: runjob_hf.data imports torch and numpy; plugin modules are imported by `runjob validate`
    from runjob_hf.data import cache_root

    return cache_root(HFDataOptions.model_construct())


# --- hf_text -------------------------------------------------------------------------------------------


class WindowRecords(_SplitRecords):
    """The record of a window: ``{"id", "tokens": int32 bytes}``."""

    def __init__(self, windows: list[TokenWindows]) -> None:
        super().__init__(windows)
        self.windows = windows

    def __call__(self, item: int) -> dict[str, Any]:
        # lazy: plugin modules are imported by `runjob validate`, which must not load numpy
        import numpy as np

        which, index = self.locate(item)
        windows = self.windows[which]
        start, length = int(windows.starts[index]), int(windows.lengths[index])
        tokens = np.asarray(windows.tokens[start : start + length], dtype=np.int32)
        return {"id": index, "tokens": tokens.tobytes()}


def _windows_digest(windows: TokenWindows, options: HFTextOptions) -> str:
    """A split's digest: its token file's name (a digest of the tokenizer and the text) and how it is cut."""
    return hashlib.sha256(f"{windows.path.stem}|{options.context}|{options.packing}".encode()).hexdigest()


def convert_hf_text(source: str, options: HFTextConvertOptions) -> runjob.ShardSource:
    """``hf_text``'s windows of the files SOURCE names, as records."""
    # lazy: runjob_hf.data imports torch and numpy; plugin modules are imported by `runjob validate`
    from runjob_hf.data import TokenWindows, build_hf_text

    text_options = _with_source(TEXT_KIND, HFTextOptions, options, {"files": str(source)})
    built = build_hf_text(text_options)
    train, val = built.train, built.val
    if not (isinstance(train, TokenWindows) and isinstance(val, TokenWindows) and isinstance(built.inputs, Prompts)):
        raise runjob.DataError("hf_text gave no token windows")  # not reached: hf_text's splits are TokenWindows
    windows = {"train": train, "val": val}
    facts: dict[str, Any] = {
        "context": text_options.context,
        "packing": text_options.packing,
        **_tokenizer_facts(built.inputs.vocabulary, text_options),
        "baselines": dict(built.baselines),
        "tokens_per_byte": {name: split.tokens_per_byte for name, split in windows.items()},
    }
    return runjob.ShardSource(
        splits=_numbered(dict(windows)),
        record=WindowRecords(list(windows.values())),
        digests={name: _windows_digest(split, text_options) for name, split in windows.items()},
        source=built.source or str(source),
        facts=facts,
        sizes={name: int(split.lengths.sum()) * 4 for name, split in windows.items()},
    )


class WindowTokens:
    """A stored window (``{"id", "tokens": int32 bytes}``) as ``hf_text``'s sample: a 1-D int64
    tensor, or ``{"input_ids": ...}`` when documents are not packed (padded by the collate)."""

    def __init__(self, padded: bool) -> None:
        self.padded = padded

    def __call__(self, record: dict[str, Any], draw: random.Random) -> torch.Tensor | dict[str, torch.Tensor]:
        # lazy: plugin modules are imported by `runjob validate`, which must not load numpy and torch
        import numpy as np
        import torch

        window = torch.from_numpy(np.frombuffer(record["tokens"], dtype=np.int32).astype(np.int64))
        return {"input_ids": window} if self.padded else window


def build_hf_text_streamed(options: HFTextStreamedOptions) -> runjob.DatasetSplits:
    """The location's converted windows, streamed: ``hf_text``'s samples, inputs and artifacts."""
    # lazy: runjob_hf.data imports torch and numpy; plugin modules are imported by `runjob validate`, which reads no
    # store
    from runjob_hf.data import Pad

    manifest = _checked_manifest(options, TEXT_KIND, ("context", "packing"))
    vocabulary = stored_vocabulary(manifest)
    context, packing = int(manifest["context"]), bool(manifest["packing"])
    per_byte = manifest.get("tokens_per_byte") or {}
    splits = manifest["splits"]

    def split(name: str, training: bool) -> StreamedWindows:
        info = splits[name]
        return StreamedWindows(
            options,
            name,
            WindowTokens(padded=not packing),
            int(info["samples"]),
            str(info["digest"]),
            augment=training,
            tokens_per_byte=per_byte.get(name),
        )

    saved = vocabulary.save(_hf_cache() / "tokenizers")  # where hf_text keeps its own
    return runjob.DatasetSplits(
        train=split("train", training=True),
        val=split("val", training=False),
        num_classes=vocabulary.size,
        vocab_size=vocabulary.size,
        context=context,
        pad_id=vocabulary.pad_id,
        source=options.where.url(),
        digest=str(manifest["source_digest"])[:16],
        baselines={str(k): float(v) for k, v in (manifest.get("baselines") or {}).items()},
        inputs=Prompts(vocabulary, context),
        collate=Pad(vocabulary.pad_id if vocabulary.pad_id is not None else 0) if not packing else None,
        artifacts={"tokenizer.json": saved},
    )


# --- hf_classification ---------------------------------------------------------------------------------


class RowRecords(_SplitRecords):
    """The record of a tokenized row: ``{"id", "input_ids": int32 bytes, "label"}``."""

    def __init__(self, rows: list[EncodedRows]) -> None:
        super().__init__(rows)
        self.rows = rows

    def __call__(self, item: int) -> dict[str, Any]:
        # lazy: plugin modules are imported by `runjob validate`, which must not load numpy
        import numpy as np

        which, index = self.locate(item)
        row = self.rows[which].hf[index]
        return {
            "id": index,
            "input_ids": np.asarray(row["input_ids"], dtype=np.int32).tobytes(),
            "label": row["target"],
        }


def convert_hf_classification(source: str, options: HFClassificationConvertOptions) -> runjob.ShardSource:
    """``hf_classification``'s tokenized rows of the tables SOURCE names (or of ``class_files``), as records."""
    # lazy: runjob_hf.data imports torch and numpy; plugin modules are imported by `runjob validate`
    from runjob_hf.data import EncodedRows, build_hf_classification

    if options.class_files is not None and str(source) != "-":
        raise runjob.DataError(
            f"SOURCE {str(source)!r}: with -o class_files the files are the option's; give SOURCE as '-'"
        )
    given = {"files": str(source)} if options.class_files is None else {}
    row_options = _with_source(CLASSIFICATION_KIND, HFClassificationOptions, options, given)
    built = build_hf_classification(row_options)
    train, val = built.train, built.val
    if not (isinstance(train, EncodedRows) and isinstance(val, EncodedRows) and isinstance(built.inputs, Texts)):
        raise runjob.DataError("hf_classification gave no rows")  # not reached: its splits are EncodedRows
    rows = {"train": train, "val": val}
    return runjob.ShardSource(
        splits=_numbered(dict(rows)),
        record=RowRecords(list(rows.values())),
        digests={name: str(split.hf._fingerprint) for name, split in rows.items()},
        source=built.source or str(source),
        facts={
            "classes": list(built.classes or []),
            "max_length": row_options.max_length,
            **_tokenizer_facts(built.inputs.vocabulary, row_options),
        },
        sizes={name: int(split.hf.data.nbytes) for name, split in rows.items()},
    )


class RowTokens:
    """A stored row as ``hf_classification``'s sample: ``({"input_ids", "attention_mask"}, label)``."""

    def __call__(self, record: dict[str, Any], draw: random.Random) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        # lazy: plugin modules are imported by `runjob validate`, which must not load numpy and torch
        import numpy as np
        import torch

        ids = torch.from_numpy(np.frombuffer(record["input_ids"], dtype=np.int32).astype(np.int64))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, torch.tensor(record["label"])


def build_hf_classification_streamed(options: HFClassificationStreamedOptions) -> runjob.DatasetSplits:
    """The location's converted rows, streamed: ``hf_classification``'s samples, inputs and artifacts."""
    # lazy: runjob_hf.data imports torch and numpy; plugin modules are imported by `runjob validate`, which reads no
    # store
    from runjob_hf.data import Pad, _save_classes

    manifest = _checked_manifest(options, CLASSIFICATION_KIND, ("classes", "max_length"))
    vocabulary = stored_vocabulary(manifest)
    classes, max_length = [str(c) for c in manifest["classes"]], int(manifest["max_length"])
    splits = manifest["splits"]

    def split(name: str, training: bool) -> runjob.Streamed:
        info = splits[name]
        return runjob.Streamed(options, name, RowTokens(), int(info["samples"]), str(info["digest"]), augment=training)

    cache = _hf_cache()
    return runjob.DatasetSplits(
        train=split("train", training=True),
        val=split("val", training=False),
        num_classes=len(classes),
        classes=classes,
        vocab_size=vocabulary.size,
        context=max_length,
        pad_id=vocabulary.pad_id,
        source=options.where.url(),
        digest=str(manifest["source_digest"])[:16],
        inputs=Texts(vocabulary, max_length, classes),
        collate=Pad(vocabulary.pad_id or 0),
        artifacts={
            "tokenizer.json": vocabulary.save(cache / "tokenizers"),
            "classes.json": _save_classes(cache, classes),
        },
    )


# --- registration (called by the plugin's hooks in runjob_hf) --------------------------------------------


def register_converters(register: runjob.Register) -> None:
    register(
        TEXT_KIND,
        convert_hf_text,
        options=HFTextConvertOptions,
        description="text files or a table's text column (a glob pattern) as hf_text's token windows, tokenized",
        libraries=("transformers", "tokenizers", "datasets"),
    )
    register(
        CLASSIFICATION_KIND,
        convert_hf_classification,
        options=HFClassificationConvertOptions,
        description="a table's text and label columns (a glob pattern; or '-' with class_files) tokenized as "
        "hf_classification's rows",
        libraries=("transformers", "tokenizers", "datasets"),
    )


def register_datasets(register: runjob.Register) -> None:
    register(
        "hf_text_streamed",
        build_hf_text_streamed,
        options=HFTextStreamedOptions,
        description="hf_text's token windows converted by `runjob data convert --from hf_text`, streamed",
        libraries=("tokenizers",),
    )
    register(
        "hf_classification_streamed",
        build_hf_classification_streamed,
        options=HFClassificationStreamedOptions,
        description="hf_classification's rows converted by `runjob data convert --from hf_classification`, streamed",
        libraries=("tokenizers",),
    )
