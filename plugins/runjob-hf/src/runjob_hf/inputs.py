"""Raw text in, model inputs out: the :class:`runjob.Inputs` of runjob-hf's datasets, for ``runjob
predict`` (``--input FILE``, ``--prompt TEXT``) and the run's MLflow model (a ``text`` column).
Each holds its tokenizer as plain values (a :class:`~runjob_hf.tokenizing.Vocabulary`) and is kept
by a run as data (:meth:`_TextInputs.to_data`: ``tokenizer.json`` in the predictor's folder, the
special token ids, ``max_length`` and the class names as JSON), so the run's predictor needs neither
the corpus nor the dataset's options. Imports no torch or tokenizers at module level."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

import runjob
from runjob_hf.tokenizing import LazyTokenizer, Vocabulary

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch or tokenizers
    import torch
    from tokenizers import Tokenizer

# A record (``{"text": ...}``) holds what a user or a DataFrame gives: its values are ``object``,
# checked by _text.

_TABLES = {".jsonl", ".csv"}
TOKENIZER_FILE = "tokenizer.json"
"""The file the tokenizer's JSON is kept in, in the folder :meth:`_TextInputs.to_data` is given."""


class _Saved(BaseModel):
    """What :meth:`_TextInputs.to_data` gives, checked by :meth:`_TextInputs.from_data`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tokenizer: str = Field(min_length=1)
    pad_id: int | None = Field(ge=0)
    eos_id: int | None = Field(ge=0)
    bos_id: int | None = Field(ge=0)
    special: dict[str, str]
    max_length: int = Field(ge=1)
    classes: list[str] | None


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
    def tokenizer(self) -> Tokenizer:
        """A ``tokenizers.Tokenizer`` of its own (built where it is first used), cutting at ``max_length``."""
        return self._lazy.get()

    def to_data(self, folder: Path) -> dict[str, JsonValue]:
        """The tokenizer's JSON written as ``folder/tokenizer.json``; its special token ids and
        roles, ``max_length`` and the class names as JSON values, with the file's name."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / TOKENIZER_FILE).write_text(self.vocabulary.json, encoding="utf-8")
        vocabulary = self.vocabulary
        return {
            "tokenizer": TOKENIZER_FILE,
            "pad_id": vocabulary.pad_id,
            "eos_id": vocabulary.eos_id,
            "bos_id": vocabulary.bos_id,
            "special": dict(vocabulary.special),
            "max_length": self.max_length,
            "classes": list(self.classes) if self.classes is not None else None,
        }

    @classmethod
    def from_data(cls, data: dict[str, JsonValue], folder: Path) -> _TextInputs:
        """The inputs :meth:`to_data` described, their tokenizer read from ``folder``. ``ValueError``
        naming the key of a missing or mistyped value, a file name that is not a plain name in
        ``folder``, a tokenizer.json that ``tokenizers`` cannot read, or a special token id
        outside its vocabulary."""
        try:
            saved = _Saved.model_validate(data)
        except ValidationError as error:
            problem = error.errors()[0]
            key = ".".join(str(part) for part in problem["loc"]) or "(the data)"
            shown = "" if problem["type"] == "missing" else f" = {json.dumps(problem.get('input'), default=repr)[:80]}"
            raise ValueError(f"{key}{shown}: {problem['msg']}") from None
        name = saved.tokenizer
        if Path(name).name != name or name in (".", ".."):
            raise ValueError(f"tokenizer = {json.dumps(name)}: must name a file in {folder}, not a path")
        path = folder / name
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"tokenizer: cannot read {path} ({getattr(error, 'strerror', None) or error})") from None
        # lazy: plugin modules are imported by `runjob validate`, which must not load tokenizers
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_str(text)
        except Exception as error:  # noqa: BLE001 - tokenizers raises plain Exceptions for a file it refuses
            detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ValueError(f"tokenizer: {path} is not a tokenizers tokenizer.json ({detail})") from None
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        for key in ("pad_id", "eos_id", "bos_id"):
            value = getattr(saved, key)
            if value is not None and value >= size:
                raise ValueError(f"{key} = {value}: not a token id of {path} (it has {size:,})")
        vocabulary = Vocabulary(text, saved.pad_id, saved.eos_id, saved.bos_id, saved.special)
        vocabulary._tokenizer = tokenizer
        return cls(vocabulary, saved.max_length, saved.classes)

    @staticmethod
    def _text(record: dict[str, object]) -> str:
        text = record.get("text")
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"'text' must be non-empty text, got {type(text).__name__} {text!r:.40}")
        return text

    def read(self, path: Path) -> list[tuple[str, dict[str, object]]]:
        """A text file: one record a non-empty line (``line N``); a ``.jsonl`` or ``.csv`` file: one
        a row, its ``text`` column; a folder: each file as one of these."""
        root = Path(path)
        records: list[tuple[str, dict[str, object]]] = []
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
    def _table(file: Path, name: str) -> list[tuple[str, dict[str, object]]]:
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

    def _padded(self, ids: list[int], **more: list[int]) -> dict[str, torch.Tensor]:
        """``ids`` cut and padded to ``max_length``, with its attention mask (the same length for
        every input, so any batch of them stacks)."""
        import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

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

    def read(self, path: Path) -> list[tuple[str, dict[str, object]]]:
        root = Path(path)
        prompts: list[tuple[str, dict[str, object]]] = []
        for file in self.files(root):
            text = _read_file(file)
            if text:
                prompts.append((file.name if file == root else file.relative_to(root).as_posix(), {"text": text}))
        if not prompts:
            raise runjob.DataError(f"--input {root}: no text to continue (empty file, or a folder of empty files)")
        return prompts

    def encode(self, record: dict[str, object]) -> torch.Tensor:
        import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

        ids = self.tokenizer.encode(self._text(record), add_special_tokens=False).ids
        start = [self.vocabulary.eos_id] if self.vocabulary.eos_id is not None else []
        return torch.tensor(start + ids, dtype=torch.long)

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)
        return text


class Texts(_TextInputs):
    """Texts to classify: one record a line of a text file (or a row of a .jsonl / .csv file with a
    ``text`` column); encoded as the dataset encodes its rows, padded to ``max_length``."""

    def encode(self, record: dict[str, object]) -> dict[str, torch.Tensor]:
        encoding = self.tokenizer.encode(self._text(record))
        return self._padded(encoding.ids)


class Words(_TextInputs):
    """Text to tag word by word: a record's text is split on whitespace into words, encoded as the
    dataset's rows are (pre-tokenized), padded to ``max_length``."""

    def encode(self, record: dict[str, object]) -> dict[str, torch.Tensor]:
        words = self._text(record).split()
        encoding = self.tokenizer.encode(words, is_pretokenized=True)
        return self._padded(encoding.ids)
