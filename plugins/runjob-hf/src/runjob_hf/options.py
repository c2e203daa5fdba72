"""The options of runjob-hf's components: what each job-file table accepts, checked by ``runjob
validate`` before anything is built. Only pydantic and runjob are imported here (no torch,
transformers, tokenizers or datasets), so loading the plugin stays light."""

from __future__ import annotations

import glob
import os
import re
import sysconfig
from pathlib import Path
from typing import Any, Literal, overload

from pydantic import Field, field_validator, model_validator

import runjob

# --- models -------------------------------------------------------------------------------------------

TASK_CLASSES = {
    "causal_lm": "AutoModelForCausalLM",
    "masked_lm": "AutoModelForMaskedLM",
    "sequence_classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
}
"""Short names of the ``task_class`` option and the transformers auto class each stands for."""

_LOCAL = ("/", ".", "~")


def looks_local(name: str) -> bool:
    """Whether a model or tokenizer name is a path on this machine rather than a hub id."""
    return name.startswith(_LOCAL) or os.path.exists(os.path.expanduser(name))


def _local_or_hub(name: str, what: str) -> str:
    """A path (made absolute; it must exist) or a hub id as it is."""
    if not name.strip():
        raise ValueError(f"needs a hub id (e.g. 'gpt2') or a local {what}")
    if looks_local(name):
        path = os.path.abspath(os.path.expanduser(name))
        if not os.path.exists(path):
            raise ValueError(f"{what} not found: {path}")
        return path
    return name


class HFModelOptions(runjob.Options):
    """``[model] name = "hf"``: a transformers model, from a hub id / local folder, or built from a
    config with random weights."""

    task_class: str = "causal_lm"
    """What the model does: "causal_lm", "masked_lm", "sequence_classification",
    "token_classification", or any transformers ``AutoModelFor...`` class name."""
    model: str | None = None
    """A hub id (read from the Hugging Face cache only: nothing is downloaded) or a local folder
    written by ``save_pretrained``. Leave unset to build from ``config``."""
    revision: str | None = None
    """The hub revision (branch, tag or commit) to read from the cache; pin a commit for repeatable runs."""
    trust_remote_code: bool = False
    """Run a model repository's own Python code (only for repositories you trust)."""
    config: dict[str, Any] | None = None
    """With ``config_from``: the config's keys (``n_layer``, ``hidden_size``, ...), random weights.
    With ``model``: keys that override the stored config (dropout, ...)."""
    config_from: str | None = None
    """The model type a config is built for ("gpt2", "llama", "bert", "distilbert", ...)."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """The weights' dtype when loaded (mixed precision is the job's ``[train] precision``)."""
    attn_implementation: str | None = None
    """Attention kernel ("sdpa", "eager", "flash_attention_2"); unset: transformers' default."""

    @field_validator("task_class")
    @classmethod
    def _known_task_class(cls, value: str) -> str:
        if value in TASK_CLASSES or re.fullmatch(r"AutoModel(For\w+)?", value):
            return value
        raise ValueError(
            f"{value!r} is neither one of {', '.join(map(repr, TASK_CLASSES))} nor a transformers auto class "
            "name such as 'AutoModelForQuestionAnswering'"
        )

    @field_validator("model")
    @classmethod
    def _model_path(cls, value: str | None) -> str | None:
        return None if value is None else _local_or_hub(value, "model folder")

    @model_validator(mode="after")
    def _one_source(self) -> HFModelOptions:
        if self.model is None and self.config_from is None and not (self.config or {}).get("model_type"):
            raise ValueError(
                'needs model = "<hub id or folder>" (pretrained weights) or config_from = "<model type>" '
                '(e.g. "gpt2", "bert") with config = {...} (random weights)'
            )
        if self.model is not None and self.config_from is not None:
            raise ValueError("give model (pretrained) or config_from (random weights), not both")
        return self

    @property
    def auto_class(self) -> str:
        return TASK_CLASSES.get(self.task_class, self.task_class)


# --- tokenizers and datasets --------------------------------------------------------------------------


class TrainTokenizer(runjob.Options):
    """``train_tokenizer = {kind = "bpe", vocab_size = 4096}``: a tokenizer trained with
    ``tokenizers`` on the training split's text only."""

    kind: Literal["bpe", "wordpiece"] = "bpe"
    """"bpe": byte-level BPE (GPT-2's kind: every byte sequence encodes, no unknown token);
    "wordpiece": BERT's kind (lower-cased, split on whitespace and punctuation)."""
    vocab_size: int = Field(4096, ge=300, le=1_000_000)
    """Token ids in all, special tokens included."""
    min_frequency: int = Field(2, ge=1)
    """A merge (BPE) or piece (WordPiece) is learned only from pairs seen at least this often."""
    max_bytes: int | None = Field(None, ge=1)
    """Train on at most this many bytes of the training text (its first ones); unset: all of it."""


STDLIB = "{stdlib}"
_NOT_STDLIB = {"site-packages", "dist-packages"}
TABLE_FORMATS = ("parquet", "json", "csv", "arrow")
_EXTENSIONS = {
    ".parquet": "parquet",
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".arrow": "arrow",
    ".txt": "text",
}


def stdlib_folder() -> str:
    """The running Python's standard-library folder: what ``{stdlib}`` in a pattern stands for."""
    return sysconfig.get_paths()["stdlib"]


def expand(pattern: str) -> str:
    return os.path.abspath(os.path.expanduser(pattern.replace(STDLIB, stdlib_folder())))


def matches(pattern: str) -> list[str]:
    """The files ``pattern`` matches (``**`` recursive), sorted; under ``{stdlib}`` installed
    packages (site-packages, dist-packages) are left out."""
    found = []
    root = stdlib_folder()
    for path in glob.iglob(expand(pattern), recursive=True):
        if pattern.startswith(STDLIB) and _NOT_STDLIB & set(Path(os.path.relpath(path, root)).parts):
            continue
        if os.path.isfile(path):
            found.append(path)
    return sorted(found)


def patterns(paths: str | list[str] | None) -> list[str]:
    return [] if paths is None else [paths] if isinstance(paths, str) else list(paths)


@overload
def _checked_patterns(paths: str | list[str]) -> str | list[str]: ...
@overload
def _checked_patterns(paths: str | list[str] | None) -> str | list[str] | None: ...
def _checked_patterns(paths: str | list[str] | None) -> str | list[str] | None:
    if paths is None:
        return None
    given = patterns(paths)
    if not given:
        raise ValueError('needs at least one file or glob pattern, e.g. "data/*.parquet" or "{stdlib}/*.py"')
    stored = []
    for pattern in given:
        if not matches(pattern):
            hint = f" ({STDLIB} is {stdlib_folder()})" if STDLIB in pattern else ""
            raise ValueError(f"pattern {expand(pattern)!r} matches no file{hint}")
        stored.append(pattern if pattern.startswith(STDLIB) else expand(pattern))
    return stored[0] if isinstance(paths, str) else stored


class HFDataOptions(runjob.Options):
    """What every runjob-hf dataset shares: where the data is, how it is split, the tokenizer."""

    files: str | list[str] | None = None
    """Files or glob patterns (``**`` recursive, ``~`` expanded, ``{stdlib}`` = the running Python's
    standard library): Parquet, JSON lines, CSV or Arrow tables, or plain text files."""
    format: Literal["text", "parquet", "json", "csv", "arrow"] | None = None
    """How ``files`` are read; unset: from the first file's extension (.parquet, .jsonl/.json, .csv,
    .arrow; anything else is text: one document a file)."""
    val_files: str | list[str] | None = None
    """The validation split's files (same format); unset: ``val_fraction`` of ``files`` is held out."""
    val_fraction: float = Field(0.1, gt=0, lt=1)
    """Share held out for validation when there are no ``val_files``: rows of a table, whole files of text."""
    split_seed: int = Field(0, ge=0)
    """Seed of the shuffle that assigns rows (or files) to the splits."""
    tokenizer: str | None = None
    """A hub id (from the Hugging Face cache only), a local tokenizer folder, or a ``tokenizer.json`` file."""
    train_tokenizer: TrainTokenizer | None = None
    """Train a tokenizer on the training split instead: ``{kind = "bpe", vocab_size = 4096}``."""
    revision: str | None = None
    """The hub revision of ``tokenizer``."""
    cache_dir: str | None = None
    """Where datasets' Arrow files and tokenized caches go; unset: ``$HF_HOME`` (``~/.cache/huggingface``)."""

    @field_validator("files", "val_files")
    @classmethod
    def _patterns_match(cls, value: str | list[str] | None) -> str | list[str] | None:
        return _checked_patterns(value)

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_path(cls, value: str | None) -> str | None:
        return None if value is None else _local_or_hub(value, "tokenizer file or folder")

    @field_validator("cache_dir")
    @classmethod
    def _cache_absolute(cls, value: str | None) -> str | None:
        return None if value is None else os.path.abspath(os.path.expanduser(value))

    @model_validator(mode="after")
    def _one_tokenizer(self) -> HFDataOptions:
        if (self.tokenizer is None) == (self.train_tokenizer is None):
            raise ValueError(
                'needs tokenizer = "<hub id, folder or tokenizer.json>" or train_tokenizer = {kind = "bpe", '
                "vocab_size = N} (trained on the training split), one of them"
            )
        if self.val_files is not None and self.files is None:
            raise ValueError("val_files needs files (the training split's)")
        return self

    def file_format(self) -> str:
        """The format of ``files`` (stated, or from the first file's extension)."""
        if self.format is not None:
            return self.format
        first = matches(patterns(self.files)[0])[0]
        return _EXTENSIONS.get(Path(first).suffix.lower(), "text")


class HFTextOptions(HFDataOptions):
    """``[dataset] name = "hf_text"``: text for language modelling."""

    text_column: str = "text"
    """The column that holds the text, for tables."""
    context: int = Field(128, ge=2)
    """Tokens the model reads per sequence (items hold context + 1: inputs and next-token targets)."""
    packing: bool = True
    """true: every document's tokens, an end-of-text token after each, cut into windows of context +
    1 tokens (stride context; no padding). false: each document on its own, cut into pieces of at most
    context + 1 tokens, padded in each batch (attention_mask)."""
    max_bytes: int | None = Field(None, ge=1)
    """Text files only: read files in sorted path order up to this many bytes (the last one cut)."""

    @model_validator(mode="after")
    def _has_files(self) -> HFTextOptions:
        if self.files is None:
            raise ValueError('needs files = "<text files or tables>" (glob patterns)')
        return self


class HFClassificationOptions(HFDataOptions):
    """``[dataset] name = "hf_classification"``: a text and a label per row."""

    text_column: str = "text"
    label_column: str = "label"
    text_pair_column: str | None = None
    """A second text per row (sentence pairs: premise and hypothesis), encoded as the tokenizer's pair."""
    max_length: int = Field(128, ge=4)
    """Tokens per sequence at most (special tokens included); longer texts are cut."""
    class_files: dict[str, str | list[str]] | None = None
    """Instead of ``files``: each class's text files by glob pattern, ``{python = "/usr/lib/**/*.py",
    ...}``; each file gives one sample, ``snippet_chars`` characters from a seeded random line."""
    max_files_per_class: int | None = Field(None, ge=1)
    """With ``class_files``: at most this many files a class (a seeded random choice)."""
    snippet_chars: int = Field(400, ge=1)
    """With ``class_files``: characters a file contributes."""

    @field_validator("class_files")
    @classmethod
    def _class_patterns(cls, value: dict[str, str | list[str]] | None) -> dict[str, str | list[str]] | None:
        if value is None:
            return None
        if len(value) < 2:
            raise ValueError("needs at least two classes")
        checked: dict[str, str | list[str]] = {}
        for name, paths in value.items():
            try:
                checked[name] = _checked_patterns(paths)
            except ValueError as error:
                raise ValueError(f"class {name!r}: {error}") from None
        return checked

    @model_validator(mode="after")
    def _one_source(self) -> HFClassificationOptions:
        if (self.files is None) == (self.class_files is None):
            raise ValueError('needs files = "<table files>" or class_files = {name = "<glob>", ...}, one of them')
        return self


class HFTokenClassificationOptions(HFDataOptions):
    """``[dataset] name = "hf_token_classification"``: words and a tag per word (NER, POS)."""

    tokens_column: str = "tokens"
    """A list of words per row."""
    tags_column: str = "tags"
    """A list of tags per row, one a word: names, or class indices."""
    max_length: int = Field(128, ge=4)
    """Tokens per sequence at most (special tokens included); longer rows are cut."""

    @model_validator(mode="after")
    def _has_files(self) -> HFTokenClassificationOptions:
        if self.files is None:
            raise ValueError('needs files = "<table files>" (JSON lines, Parquet, Arrow)')
        return self
