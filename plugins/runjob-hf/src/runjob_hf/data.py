"""The datasets ``hf_text``, ``hf_classification`` and ``hf_token_classification``.

Tables (Parquet, JSON lines, CSV, Arrow) are read with ``datasets.load_dataset``, so they are
memory-mapped Arrow files (a table larger than memory trains), and tokenized with ``.map(batched=True)``
into datasets' own cache files (a second run reads them back). Plain text files are read whole, one
document a file. Language-modelling tokens are kept as one flat array per split in a ``.npy`` file,
memory-mapped, and cut into windows when an item is taken.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch.utils.data import default_collate

import runjob
from runjob_hf.inputs import Prompts, Texts, Words
from runjob_hf.options import (
    HFClassificationOptions,
    HFDataOptions,
    HFTextOptions,
    HFTokenClassificationOptions,
    matches,
    patterns,
)
from runjob_hf.tokenizing import LazyTokenizer, Vocabulary, vocabulary

if TYPE_CHECKING:  # annotations only: datasets is imported when a table is read
    from types import ModuleType
    from typing import TypeAlias

    import numpy.typing as npt
    from datasets import Dataset  # datasets has no type information: the name is for the reader

    TableBatch: TypeAlias = dict[str, list[Any]]
    """A batch of a table's rows, by column, as datasets' ``map`` passes it: cells of any kind."""

IGNORE = -100  # a target that is never scored (Hugging Face's convention)
ENCODING = "runjob-hf-3"  # part of every cache key: change it when what is cached changes


# --- shared -------------------------------------------------------------------------------------------


def cache_dir(options: HFDataOptions) -> Path:
    """``options.cache_dir``, else ``$HF_HOME`` (``~/.cache/huggingface``), read when the data is built."""
    if options.cache_dir is not None:
        return Path(options.cache_dir)
    return Path(os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"))


def cache_root(options: HFDataOptions) -> Path:
    """Where runjob-hf keeps its own files (trained tokenizers, token arrays)."""
    return cache_dir(options) / "runjob-hf"


def _quiet_datasets() -> ModuleType:
    try:
        import datasets  # lazy: datasets (seconds to import) only when a table is read
    except ImportError:
        raise ValueError(
            "reading tables (and class_files) needs Hugging Face's datasets: pip install 'runjob-hf[datasets]'"
        ) from None

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return cast("ModuleType", datasets)  # datasets has no type information


def load_tables(options: HFDataOptions, what: str) -> tuple[Dataset, Dataset, str]:
    """The training and validation splits of ``options.files`` (``val_files``, or ``val_fraction`` of
    the rows held out with ``split_seed``) as memory-mapped ``datasets.Dataset`` objects, and a
    description of the source."""
    datasets = _quiet_datasets()
    kind = options.file_format()
    if kind == "text":
        raise ValueError(f"dataset {what}: files must be tables (.parquet, .jsonl, .csv, .arrow) or set format")
    data_files = {"train": [f for p in patterns(options.files) for f in matches(p)]}
    if options.val_files is not None:
        data_files["validation"] = [f for p in patterns(options.val_files) for f in matches(p)]
    try:
        loaded = datasets.load_dataset(kind, data_files=data_files, cache_dir=str(cache_dir(options) / "datasets"))
    except Exception as error:  # datasets' own errors for a file it cannot parse
        raise runjob.DataError(f"dataset {what}: cannot read {kind} files {data_files['train'][:3]}: {error}") from None
    if options.val_files is not None:
        train, val = loaded["train"], loaded["validation"]
    else:
        if len(loaded["train"]) < 2:
            raise runjob.DataError(
                f"dataset {what}: {len(loaded['train'])} row(s), too few to hold out a validation split"
            )
        held = loaded["train"].train_test_split(test_size=options.val_fraction, seed=options.split_seed)
        train, val = held["train"], held["test"]
    source = ", ".join(patterns(options.files))
    return train, val, source


def _need_columns(dataset: Dataset, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise runjob.DataError(
            f"dataset {what}: no column {', '.join(map(repr, missing))} (the data has "
            f"{', '.join(dataset.column_names)}); set the dataset's *_column options"
        )


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, (ENCODING, *parts))).encode()).hexdigest()[:16]


def _batches(dataset: Dataset, columns: list[str], size: int = 1000) -> Iterator[TableBatch]:
    for start in range(0, len(dataset), size):
        yield dataset.select_columns(columns)[start : start + size]


class Pad:
    """The DataLoader's collate function (``DatasetSplits.collate``): sequences of different lengths
    padded on the right to the longest in the batch: ``input_ids`` with the pad id,
    ``attention_mask`` with 0, ``labels`` with -100. Items are dicts of 1-D tensors, token tensors
    (padded into ``{"input_ids", "attention_mask"}`` when their lengths differ), or ``(inputs,
    target)`` pairs whose inputs are those."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, items: list[Any]) -> Any:
        first = items[0]
        if isinstance(first, tuple):
            return (self([item[0] for item in items]), default_collate([item[1] for item in items]))
        if isinstance(first, torch.Tensor):
            if all(item.shape == first.shape for item in items):
                return torch.stack(items)
            items = [{"input_ids": item} for item in items]
        if not isinstance(first, dict):
            return default_collate(items)
        length = max(len(item["input_ids"]) for item in items)
        batch: dict[str, torch.Tensor] = {}
        keys = list(dict.fromkeys([*first, "attention_mask"]))
        for key in keys:
            fill = {"input_ids": self.pad_id, "labels": IGNORE}.get(key, 0)
            rows = torch.full((len(items), length), fill, dtype=torch.long)
            for row, item in enumerate(items):
                values = item.get(key)
                if values is None:  # no mask given: every token real
                    values = torch.ones(len(item["input_ids"]), dtype=torch.long)
                rows[row, : len(values)] = values
            batch[key] = rows
        return batch


# --- language modelling: hf_text -----------------------------------------------------------------------


class TokenWindows:
    """A split's tokens, one flat array in a ``.npy`` file (memory-mapped), as windows: each item is
    ``tokens[start : start + length]``, a 1-D int64 tensor (packed: all ``context + 1`` long), or
    ``{"input_ids": ...}`` when lengths differ (one document's pieces, padded by :class:`Pad`)."""

    def __init__(
        self,
        path: Path,
        starts: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        padded: bool,
        tokens_per_byte: float | None,
    ) -> None:
        self.path, self.starts, self.lengths, self.padded = Path(path), starts, lengths, padded
        self.tokens_per_byte = tokens_per_byte
        """Tokens of this split per byte of its text: bits per byte = loss x this / ln 2."""
        self._tokens: npt.NDArray[np.int32] | None = None

    @property
    def tokens(self) -> npt.NDArray[np.int32]:
        if self._tokens is None:
            import numpy as np  # lazy: plugin modules are imported by `runjob validate`, which must not load numpy

            tokens: npt.NDArray[np.int32] = np.load(self.path, mmap_mode="r")
            self._tokens = tokens
        return self._tokens

    def __getstate__(self) -> dict[str, object]:  # DataLoader workers reopen the file
        return {**self.__dict__, "_tokens": None}

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> torch.Tensor | dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"window {index} out of range ({len(self)} windows)")
        start, length = int(self.starts[index]), int(self.lengths[index])
        window = torch.from_numpy(np.asarray(self.tokens[start : start + length], dtype=np.int64))
        return {"input_ids": window} if self.padded else window

    def targets(self) -> npt.NDArray[np.int32]:
        """Every token this split's windows predict (numpy)."""
        return np.concatenate([self.tokens[s + 1 : s + n] for s, n in zip(self.starts, self.lengths, strict=True)])


def _windows(
    documents: list[int], total: int, context: int, packing: bool
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Window starts and lengths over a flat array of ``total`` tokens whose documents have the
    lengths ``documents`` (each beginning with its end-of-text token)."""
    if packing:
        count = max(0, (total - 1) // context)
        return np.arange(count, dtype=np.int64) * context, np.full(count, context + 1, dtype=np.int64)
    starts: list[int] = []
    lengths: list[int] = []
    offset = 0
    for size in documents:
        for piece in range(max(1, math.ceil((size - 1) / context))):
            begin = piece * context
            length = min(context + 1, size - begin)
            if length >= 2:
                starts.append(offset + begin)
                lengths.append(length)
        offset += size
    return np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)


def _save_tokens(path: Path, pieces: Callable[[], Iterator[npt.NDArray[np.generic]]], total: int) -> None:
    """Write the token pieces (numpy int arrays, in order) as one int32 ``.npy`` of ``total`` tokens."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    array = np.lib.format.open_memmap(partial, mode="w+", dtype=np.int32, shape=(total,))
    offset = 0
    for piece in pieces():
        array[offset : offset + len(piece)] = piece
        offset += len(piece)
    array.flush()
    del array
    os.replace(partial, path)


def read_text_files(options: HFTextOptions, paths: str | list[str] | None, limit: int | None) -> list[tuple[str, str]]:
    """The files' texts in sorted path order, byte-identical duplicates dropped (the first kept),
    stopping at ``limit`` bytes (the last file cut)."""
    files = sorted({f for p in patterns(paths) for f in matches(p)})
    found, seen, total = [], set(), 0
    for path in files:
        if limit is not None and total >= limit:
            break
        try:
            data = Path(path).read_bytes()
        except OSError as error:
            raise runjob.DataError(f"dataset hf_text: cannot read {path}: {error.strerror or error}") from None
        if limit is not None:
            data = data[: limit - total]
        digest = hashlib.sha256(data).digest()
        if not data or digest in seen:
            continue
        seen.add(digest)
        found.append((path, data.decode("utf-8", errors="replace")))
        total += len(data)
    return found


def split_files(
    files: list[tuple[str, str]], share: float, seed: int
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Whole files held out for validation: shuffled with ``seed``, each goes to validation while it
    fits in ``share`` of the bytes (the smallest file when none fits); each split keeps path order."""
    sizes = [len(text.encode("utf-8", errors="replace")) for _, text in files]
    budget, held = share * sum(sizes), 0
    order = list(range(len(files)))
    random.Random(seed).shuffle(order)
    validation = set()
    for index in order:
        if held + sizes[index] <= budget:
            validation.add(index)
            held += sizes[index]
    if not validation and len(files) > 1:
        validation.add(min(order, key=sizes.__getitem__))
    train = [f for i, f in enumerate(files) if i not in validation]
    return train, [f for i, f in enumerate(files) if i in validation]


class _EncodeDocuments:
    """``.map`` function: a batch of texts to token ids, each document led by the end-of-text token.
    Its state is the tokenizer's JSON, so datasets' cache fingerprints are stable."""

    def __init__(self, tokenizer_json: str, column: str, eos: int | None) -> None:
        self.tokenizer, self.column, self.eos = LazyTokenizer(tokenizer_json), column, eos

    def __call__(self, batch: TableBatch) -> TableBatch:
        texts = [text if isinstance(text, str) else "" for text in batch[self.column]]
        start = [self.eos] if self.eos is not None else []
        encoded = self.tokenizer.get().encode_batch(texts, add_special_tokens=False)
        return {
            "input_ids": [start + e.ids for e in encoded],
            "bytes": [len(text.encode("utf-8", errors="replace")) for text in texts],
        }


def build_hf_text(options: HFTextOptions) -> runjob.DatasetSplits:
    """Text as token windows for language modelling."""
    cache = cache_root(options)
    documents: dict[str, Any] = {}
    if options.file_format() == "text":
        train = read_text_files(options, options.files, options.max_bytes)
        if options.val_files is not None:
            val = read_text_files(options, options.val_files, None)
        else:
            train, val = split_files(train, options.val_fraction, options.split_seed)
        if not train or not val:
            raise runjob.DataError(
                f"dataset hf_text: {len(train)} training and {len(val)} validation file(s); it needs text files for "
                "both (match more files, or give val_files)"
            )
        content = {
            name: _fingerprint(*(hashlib.sha256(t.encode()).hexdigest() for _, t in part))
            for name, part in (("train", train), ("val", val))
        }
        vocab = vocabulary(options, lambda: (text for _, text in train), "lm", cache, content["train"])
        for name, part in (("train", train), ("val", val)):
            documents[name] = ("text", [text for _, text in part], content[name])
        source = ", ".join(patterns(options.files))
    else:
        train_table, val_table, source = load_tables(options, "hf_text")
        for table in (train_table, val_table):
            _need_columns(table, [options.text_column], "hf_text")
        vocab = vocabulary(
            options,
            lambda: (t for b in _batches(train_table, [options.text_column]) for t in b[options.text_column] if t),
            "lm",
            cache,
            train_table._fingerprint,
        )
        documents = {
            "train": ("table", train_table, train_table._fingerprint),
            "val": ("table", val_table, val_table._fingerprint),
        }
    windows = {}
    for name, (kind, data, content) in documents.items():
        key = _fingerprint(vocab.digest, content, "lm-v1")
        path = cache / "tokens" / f"{key}.npy"
        lengths_path = path.with_suffix(".lengths.npy")
        bytes_path = path.with_suffix(".bytes.json")
        if not (path.exists() and lengths_path.exists() and bytes_path.exists()):
            if kind == "text":
                done = _EncodeDocuments(vocab.json, "text", vocab.eos_id)({"text": data})
                encoded, text_bytes = done["input_ids"], sum(done["bytes"])
                sizes = np.asarray([len(ids) for ids in encoded], dtype=np.int64)

                def document_pieces(e: list[list[int]] = encoded) -> Iterator[npt.NDArray[np.int32]]:
                    return (np.asarray(ids, dtype=np.int32) for ids in e)

                _save_tokens(path, document_pieces, int(sizes.sum()))
            else:
                tokenized = data.map(
                    _EncodeDocuments(vocab.json, options.text_column, vocab.eos_id),
                    batched=True,
                    remove_columns=data.column_names,
                    new_fingerprint=_fingerprint(content, vocab.digest, options.text_column, "encode-v1"),
                    desc="tokenizing",
                )
                column = tokenized.data.column("input_ids")
                sizes = np.concatenate(
                    [np.diff(np.asarray(chunk.offsets)) for chunk in column.chunks] or [np.zeros(0, np.int64)]
                )

                def column_pieces(c: Any = column) -> Iterator[npt.NDArray[np.generic]]:  # a pyarrow ChunkedArray
                    return (np.asarray(ch.flatten()) for ch in c.chunks)

                _save_tokens(path, column_pieces, int(sizes.sum()))
                text_bytes = int(sum(np.asarray(ch).sum() for ch in tokenized.data.column("bytes").chunks))
            np.save(lengths_path, sizes)
            bytes_path.write_text(json.dumps({"bytes": int(text_bytes)}), encoding="utf-8")
        sizes = np.load(lengths_path)
        total = int(sizes.sum())
        starts, lengths = _windows(sizes.tolist(), total, options.context, options.packing)
        text_bytes = json.loads(bytes_path.read_text(encoding="utf-8"))["bytes"]
        windows[name] = TokenWindows(
            path, starts, lengths, not options.packing, (total - 1) / text_bytes if text_bytes else None
        )
        if len(windows[name]) == 0:
            raise runjob.DataError(
                f"dataset hf_text: the {name} split has {total:,} tokens, fewer than one window of context + 1 = "
                f"{options.context + 1}: add text, lower dataset.context, or change dataset.val_fraction"
            )
    baselines = {"unigram_perplexity": _unigram_perplexity(windows["train"], windows["val"], vocab.size)}
    if windows["val"].tokens_per_byte:
        baselines["val_tokens_per_byte"] = windows["val"].tokens_per_byte
    return runjob.DatasetSplits(
        train=windows["train"],
        val=windows["val"],
        num_classes=vocab.size,
        vocab_size=vocab.size,
        context=options.context,
        pad_id=vocab.pad_id,
        source=source,
        digest=_fingerprint(vocab.digest, *(d[2] for d in documents.values())),
        baselines=baselines,
        inputs=Prompts(vocab, options.context),
        collate=Pad(vocab.pad_id if vocab.pad_id is not None else 0) if not options.packing else None,
        artifacts={"tokenizer.json": vocab.save(cache / "tokenizers")},
    )


def _unigram_perplexity(train: TokenWindows, val: TokenWindows, size: int) -> float:
    """exp of the cross-entropy of the validation targets under the training tokens' frequencies
    (add-one smoothed): the perplexity of a model that ignores the context."""
    counts = np.bincount(np.asarray(train.tokens), minlength=size).astype(np.float64)
    log_probs = np.log((counts + 1) / (counts.sum() + size))
    return float(math.exp(-log_probs[val.targets()].mean()))


# --- sequence classification: hf_classification --------------------------------------------------------


class _EncodeRows:
    """``.map`` function: texts (and text pairs) to token ids cut at ``max_length``, labels to class indices."""

    def __init__(
        self, tokenizer_json: str, max_length: int, text: str, pair: str | None, label: str, index: dict[str, int]
    ) -> None:
        self.tokenizer = LazyTokenizer(tokenizer_json, max_length)
        self.text, self.pair, self.label, self.index = text, pair, label, index

    def __call__(self, batch: TableBatch) -> TableBatch:
        texts = [t if isinstance(t, str) else "" for t in batch[self.text]]
        if self.pair is not None:
            pairs = [p if isinstance(p, str) else "" for p in batch[self.pair]]
            encoded = self.tokenizer.get().encode_batch(list(zip(texts, pairs, strict=True)))
        else:
            encoded = self.tokenizer.get().encode_batch(texts)
        labels = []
        for value in batch[self.label]:
            if str(value) not in self.index:
                raise ValueError(f"label {value!r} is not one of the training split's classes {list(self.index)}")
            labels.append(self.index[str(value)])
        return {"input_ids": [e.ids for e in encoded], "target": labels}


class _TokenizedRows:
    """A tokenized split (a ``datasets.Dataset``, memory-mapped when read from files) whose items
    are each row's tokens at the row's own length (padded by :class:`Pad`)."""

    def __init__(self, table: Dataset) -> None:
        self.hf = table

    def __len__(self) -> int:
        return len(self.hf)

    def _row(self, index: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """The row at ``index`` and its ``{"input_ids", "attention_mask"}`` tensors."""
        row = self.hf[int(index)]
        ids = torch.tensor(row["input_ids"], dtype=torch.long)
        return row, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


class EncodedRows(_TokenizedRows):
    """Items ``({"input_ids", "attention_mask"}, label)``."""

    def __getitem__(self, index: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        row, inputs = self._row(index)
        return inputs, torch.tensor(row["target"], dtype=torch.long)


def _label_names(table: Dataset, column: str) -> tuple[list[str], list[str]]:
    """The classes of a label column: a ClassLabel's names, else the sorted distinct values
    (numbers in numeric order), as strings."""
    feature = table.features[column]
    names = getattr(feature, "names", None)
    if names:
        return [str(i) for i in range(len(names))], list(names)
    values = set(table.unique(column))
    if any(v is None for v in values):
        raise runjob.DataError(f"column {column!r} has rows without a label")
    ordered = sorted(values, key=lambda v: (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)))
    return [str(v) for v in ordered], [str(v) for v in ordered]


def _class_file_rows(options: HFClassificationOptions) -> tuple[Dataset, Dataset, str]:
    """Rows ``{"text", "label"}`` of ``class_files``: a snippet of each file (from a seeded random
    line), split per class so that every class is in both splits."""
    datasets = _quiet_datasets()
    assert options.class_files is not None
    generator = random.Random(options.split_seed)
    rows: dict[str, dict[str, list[str]]] = {"train": {"text": [], "label": []}, "val": {"text": [], "label": []}}
    for name, paths in options.class_files.items():
        files = sorted({f for p in patterns(paths) for f in matches(p)})
        generator.shuffle(files)
        snippets: list[str] = []
        for path in files:
            if options.max_files_per_class is not None and len(snippets) >= options.max_files_per_class:
                break
            try:
                text = Path(path).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if not text.strip():
                continue
            lines = text.splitlines(keepends=True)
            first = generator.randrange(max(1, len(lines) - 3))
            snippet = "".join(lines[first:])[: options.snippet_chars]
            if snippet.strip():
                snippets.append(snippet)
        if len(snippets) < 2:
            raise runjob.DataError(
                f"dataset hf_classification: class {name!r} has {len(snippets)} readable file(s), needs 2"
            )
        held = max(1, round(options.val_fraction * len(snippets)))
        for split, part in (("val", snippets[:held]), ("train", snippets[held:])):
            rows[split]["text"].extend(part)
            rows[split]["label"].extend([name] * len(part))
    train = datasets.Dataset.from_dict(rows["train"]).shuffle(seed=options.split_seed)
    val = datasets.Dataset.from_dict(rows["val"])
    source = "; ".join(f"{name}: {', '.join(patterns(p))}" for name, p in options.class_files.items())
    return train, val, source


def build_hf_classification(options: HFClassificationOptions) -> runjob.DatasetSplits:
    """Texts and labels as ``({"input_ids", "attention_mask"}, label)`` for the ``classification`` task."""
    cache = cache_root(options)
    if options.class_files is not None:
        train, val, source = _class_file_rows(options)
        text, pair, label = "text", None, "label"
        classes = list(options.class_files)
        keys = classes
    else:
        train, val, source = load_tables(options, "hf_classification")
        text, pair, label = options.text_column, options.text_pair_column, options.label_column
        for table in (train, val):
            _need_columns(table, [c for c in (text, pair, label) if c is not None], "hf_classification")
        keys, classes = _label_names(train, label)
    if len(classes) < 2:
        raise runjob.DataError(f"dataset hf_classification: the training split has {len(classes)} class(es), needs 2")
    columns = [c for c in (text, pair) if c is not None]
    vocab = vocabulary(
        options,
        lambda: (t for b in _batches(train, columns) for c in columns for t in b[c] if isinstance(t, str)),
        "encoder",
        cache,
        train._fingerprint,
    )
    index = {key: i for i, key in enumerate(keys)}
    encode = _EncodeRows(vocab.json, options.max_length, text, pair, label, index)
    inputs = Texts(vocab, options.max_length, classes)
    encoding = _Encoding("hf_classification", encode, (text, pair, label, keys), EncodedRows, inputs)
    return _labelled_splits(encoding, train, val, vocab, options.max_length, classes, source, cache)


def _save_classes(cache: Path, classes: list[str]) -> Path:
    text = json.dumps(classes, ensure_ascii=False)
    path = cache / "classes" / f"classes-{_fingerprint(text)}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path


# --- token classification: hf_token_classification -----------------------------------------------------


class _EncodeWords:
    """``.map`` function: words to token ids (pre-tokenized), each word's tag on its first token and
    -100 on its other tokens and on special tokens."""

    def __init__(self, tokenizer_json: str, max_length: int, words: str, tags: str, index: dict[str, int]) -> None:
        self.tokenizer = LazyTokenizer(tokenizer_json, max_length)
        self.words, self.tags, self.index = words, tags, index

    def __call__(self, batch: TableBatch) -> TableBatch:
        sentences = [[str(w) for w in words] for words in batch[self.words]]
        encoded = self.tokenizer.get().encode_batch(sentences, is_pretokenized=True)
        labels = []
        for encoding, tags, words in zip(encoded, batch[self.tags], sentences, strict=True):
            if len(tags) != len(words):
                raise ValueError(f"a row has {len(words)} words but {len(tags)} tags")
            row, previous = [], None
            for word in encoding.word_ids:
                if word is None or word == previous:
                    row.append(IGNORE)
                else:
                    tag = str(tags[word])
                    if tag not in self.index:
                        raise ValueError(
                            f"tag {tags[word]!r} is not one of the training split's tags {list(self.index)}"
                        )
                    row.append(self.index[tag])
                previous = word
            labels.append(row)
        return {"input_ids": [e.ids for e in encoded], "labels": labels}


class TaggedRows(_TokenizedRows):
    """Items ``{"input_ids", "attention_mask", "labels"}`` (labels -100 where nothing is scored)."""

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row, inputs = self._row(index)
        return {**inputs, "labels": torch.tensor(row["labels"], dtype=torch.long)}


def _tag_names(table: Dataset, column: str) -> tuple[list[str], list[str]]:
    feature = getattr(table.features[column], "feature", None)
    names = getattr(feature, "names", None)
    if names:
        return [str(i) for i in range(len(names))], list(names)
    values = {tag for b in _batches(table, [column]) for tags in b[column] for tag in tags}
    ordered = sorted(values, key=lambda v: (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)))
    return [str(v) for v in ordered], [str(v) for v in ordered]


def build_hf_token_classification(options: HFTokenClassificationOptions) -> runjob.DatasetSplits:
    """Words and tags as ``{"input_ids", "attention_mask", "labels"}`` for ``token_classification``."""
    cache = cache_root(options)
    train, val, source = load_tables(options, "hf_token_classification")
    words, tags = options.tokens_column, options.tags_column
    for table in (train, val):
        _need_columns(table, [words, tags], "hf_token_classification")
    keys, classes = _tag_names(train, tags)
    if len(classes) < 2:
        raise runjob.DataError(
            f"dataset hf_token_classification: the training split has {len(classes)} tag(s), needs 2"
        )
    vocab = vocabulary(
        options,
        lambda: (" ".join(map(str, w)) for b in _batches(train, [words]) for w in b[words]),
        "encoder",
        cache,
        train._fingerprint,
    )
    encode = _EncodeWords(vocab.json, options.max_length, words, tags, {k: i for i, k in enumerate(keys)})
    inputs = Words(vocab, options.max_length, classes)
    encoding = _Encoding("hf_token_classification", encode, (words, tags, keys), TaggedRows, inputs)
    return _labelled_splits(encoding, train, val, vocab, options.max_length, classes, source, cache)


@dataclass(frozen=True)
class _Encoding:
    """How a labelled dataset's tables become its splits: its name (for messages), the batched
    encoder, what else its tokenization depends on (for the cache's fingerprint), the row class
    wrapping an encoded table, and its predictor's inputs."""

    what: str
    encode: Callable[[TableBatch], TableBatch]
    depends_on: tuple[object, ...]
    rows: type[_TokenizedRows]
    inputs: runjob.Inputs


def _labelled_splits(
    encoding: _Encoding,
    train: Dataset,
    val: Dataset,
    vocab: Vocabulary,
    max_length: int,
    classes: list[str],
    source: str,
    cache: Path,
) -> runjob.DatasetSplits:
    """The training and validation tables tokenized (``datasets``' map, cached by fingerprint,
    memory-mapped) as a classification dataset's splits, with the tokenizer and the class names as
    artifacts and dynamic padding."""
    encoded: dict[str, Dataset] = {}
    for name, table in (("train", train), ("val", val)):
        try:
            encoded[name] = table.map(
                encoding.encode,
                batched=True,
                remove_columns=table.column_names,
                new_fingerprint=_fingerprint(table._fingerprint, vocab.digest, max_length, *encoding.depends_on),
                desc="tokenizing",
            )
        except ValueError as error:
            raise runjob.DataError(f"dataset {encoding.what}: {name} split: {error}") from None
    return runjob.DatasetSplits(
        train=encoding.rows(encoded["train"]),
        val=encoding.rows(encoded["val"]),
        num_classes=len(classes),
        classes=classes,
        vocab_size=vocab.size,
        context=max_length,
        pad_id=vocab.pad_id,
        source=source,
        digest=_fingerprint(vocab.digest, train._fingerprint, val._fingerprint),
        inputs=encoding.inputs,
        collate=Pad(vocab.pad_id or 0),
        artifacts={"tokenizer.json": vocab.save(cache / "tokenizers"), "classes.json": _save_classes(cache, classes)},
    )


__all__ = ["Vocabulary", "build_hf_classification", "build_hf_text", "build_hf_token_classification"]
