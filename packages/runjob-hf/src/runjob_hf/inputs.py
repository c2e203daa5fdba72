"""Raw text in, model inputs out: the :class:`runjob.Inputs` of runjob-hf's datasets, for ``runjob
predict`` (``--input FILE``, ``--prompt TEXT``) and the run's MLflow model (a ``text`` column).
Each holds its tokenizer as plain values (a :class:`~runjob_hf.tokenizing.Vocabulary`), so the
run's predictor needs neither the corpus nor the dataset's options."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import runjob
from runjob_hf.tokenizing import LazyTokenizer, Vocabulary

_TABLES = {".jsonl", ".csv"}


def _read_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise runjob.DataError(f"--input: cannot read {path}: {error.strerror or error}") from None


class _TextInputs(runjob.Inputs):
    columns = {"text": "string"}
    reads = "text"  # .txt, .jsonl and .csv alike: runjob refuses a binary file before it is decoded

    truncates = True

    def __init__(self, vocabulary: Vocabulary, max_length: int, classes: list[str] | None = None) -> None:
        self.vocabulary = vocabulary
        self.max_length = max_length
        self.classes = classes
        self._lazy = LazyTokenizer(vocabulary.json, max_length if self.truncates else None)

    @property
    def tokenizer(self) -> Any:
        """A ``tokenizers.Tokenizer`` of its own (built once, not pickled), cutting at ``max_length``."""
        return self._lazy.get()

    @staticmethod
    def _text(record: dict[str, Any]) -> str:
        text = record.get("text")
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"'text' must be non-empty text, got {type(text).__name__} {text!r:.40}")
        return text

    def read(self, path: Path) -> list[tuple[str, dict[str, Any]]]:
        """A text file: one record a non-empty line (``line N``); a ``.jsonl`` or ``.csv`` file: one
        a row, its ``text`` column; a folder: each file as one of these."""
        root = Path(path)
        records = []
        for file in self.files(root):
            name = file.name if file == root else file.relative_to(root).as_posix()
            if file.suffix.lower() in _TABLES:
                records.extend(self._table(file, name))
                continue
            for number, line in enumerate(_read_file(file).splitlines(), 1):
                if line.strip():
                    records.append((f"{name}:{number}" if file != root else f"line {number}", {"text": line}))
        if not records:
            raise runjob.DataError(f"--input {root}: no text (no non-empty line)")
        return records

    @staticmethod
    def _table(file: Path, name: str) -> list[tuple[str, dict[str, Any]]]:
        text = _read_file(file)
        if file.suffix.lower() == ".csv":
            rows = list(csv.DictReader(text.splitlines()))
        else:
            try:
                rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            except json.JSONDecodeError as error:
                raise runjob.DataError(f"--input {file}: not JSON lines ({error})") from None
        if rows and "text" not in rows[0]:
            raise runjob.DataError(f"--input {file}: needs a 'text' column (it has {', '.join(rows[0])})")
        return [(f"{name}:{n}", {"text": row["text"]}) for n, row in enumerate(rows, 1)]

    def _padded(self, ids: list[int], **more: list[int]) -> dict[str, Any]:
        """``ids`` cut and padded to ``max_length``, with its attention mask (the same length for
        every input, so any batch of them stacks)."""
        import torch

        ids = ids[: self.max_length]
        pad = self.max_length - len(ids)
        pad_id = self.vocabulary.pad_id or 0
        sample = {
            "input_ids": torch.tensor(ids + [pad_id] * pad, dtype=torch.long),
            "attention_mask": torch.tensor([1] * len(ids) + [0] * pad, dtype=torch.long),
        }
        for key, values in more.items():
            sample[key] = torch.tensor(values[: self.max_length] + [0] * pad, dtype=torch.long)
        return sample


class Prompts(_TextInputs):
    """Prompts for a language model: a file is one prompt (a folder, one a file); a record is
    ``{"text": ...}``; its tokens start with the end-of-text token, as a document does in training."""

    truncates = False

    def read(self, path: Path) -> list[tuple[str, dict[str, Any]]]:
        root = Path(path)
        prompts = []
        for file in self.files(root):
            text = _read_file(file)
            if text:
                prompts.append((file.name if file == root else file.relative_to(root).as_posix(), {"text": text}))
        if not prompts:
            raise runjob.DataError(f"--input {root}: no text to continue (empty file, or a folder of empty files)")
        return prompts

    def encode(self, record: dict[str, Any]) -> Any:
        import torch

        ids = self.tokenizer.encode(self._text(record), add_special_tokens=False).ids
        start = [self.vocabulary.eos_id] if self.vocabulary.eos_id is not None else []
        return torch.tensor(start + ids, dtype=torch.long)

    def decode(self, ids: Any) -> str:
        text: str = self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)
        return text


class Texts(_TextInputs):
    """Texts to classify: one record a line of a text file (or a row of a .jsonl / .csv file with a
    ``text`` column); encoded as the dataset encodes its rows, padded to ``max_length``."""

    def encode(self, record: dict[str, Any]) -> Any:
        encoding = self.tokenizer.encode(self._text(record))
        return self._padded(encoding.ids)


class Words(_TextInputs):
    """Text to tag word by word: a record's text is split on whitespace into words, encoded as the
    dataset's rows are (pre-tokenized), padded to ``max_length``."""

    def encode(self, record: dict[str, Any]) -> Any:
        words = self._text(record).split()
        encoding = self.tokenizer.encode(words, is_pretokenized=True)
        return self._padded(encoding.ids)
