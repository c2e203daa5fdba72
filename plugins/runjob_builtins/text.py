"""Built-in dataset ``text_files``: any text files as a byte-level language-modelling corpus.

Tokens are bytes (0-255), so there is no vocabulary to download. ``"{stdlib}/**/*.py"`` is the
standard library of the Python running the job: text every Python install carries, for a job that
trains offline anywhere.
"""

from __future__ import annotations

import glob
import hashlib
import math
import os
import random
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, field_validator, model_validator

from runjob import DataError, DatasetSplits, Inputs, Options, hookimpl

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    import torch

    from runjob import Register

STDLIB = "{stdlib}"
_NOT_STDLIB = {"site-packages", "dist-packages"}  # installed packages that may live inside the stdlib folder


def stdlib_folder() -> str:
    """The running Python's standard-library folder, what ``{stdlib}`` in a pattern stands for."""
    return sysconfig.get_paths()["stdlib"]


def _patterns(paths: str | list[str]) -> list[str]:
    return [paths] if isinstance(paths, str) else list(paths)


def _stored(pattern: str) -> str:
    # relative patterns are made absolute (like every path in a resolved job); {stdlib} is kept, so
    # the recorded job names the standard library of whichever Python runs it again
    return pattern if pattern.startswith(STDLIB) else os.path.abspath(os.path.expanduser(pattern))


def expand(pattern: str) -> str:
    """``pattern`` with ``{stdlib}`` and ``~`` expanded, made absolute."""
    return os.path.abspath(os.path.expanduser(pattern.replace(STDLIB, stdlib_folder())))


def matches(pattern: str) -> Iterator[str]:
    """The files ``pattern`` matches (recursive ``**`` allowed), lazily, in the file system's order.
    Under ``{stdlib}``, files in ``site-packages`` / ``dist-packages`` are not the standard library
    and are skipped, so the corpus is the same whatever packages an install holds."""
    skip_installed = pattern.startswith(STDLIB)
    root = stdlib_folder()
    for path in glob.iglob(expand(pattern), recursive=True):
        if skip_installed and _NOT_STDLIB & set(Path(os.path.relpath(path, root)).parts):
            continue
        if os.path.isfile(path):
            yield path


class TextSplitOptions(Options):
    """How text is cut into windows and split: the ``text_files`` dataset's options but its files,
    and the ``text`` converter's (``runjob data convert PATTERN LOCATION --from text -o KEY=VALUE``)."""

    context: int = Field(128, ge=1)
    """Tokens (bytes) the model sees per window; each item holds context + 1 (inputs and targets)."""
    max_bytes: int | None = Field(None, ge=1)
    """Read files in sorted path order until this many bytes (the last one cut); unset: every file."""
    val_fraction: float = Field(0.1, gt=0, lt=1)
    """Share of the bytes held out for validation, in whole files (at most this share, at least one file)."""
    test_fraction: float = Field(0.0, ge=0, lt=1)
    """Share of the bytes held out as a test split, in whole files, as val_fraction (0: no test split)."""
    split_seed: int = Field(0, ge=0)
    """Seed of the shuffle that assigns files to the splits."""

    @model_validator(mode="after")
    def _shares_leave_training_data(self) -> TextSplitOptions:
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError(
                f"val_fraction + test_fraction = {self.val_fraction} + {self.test_fraction} leaves nothing to train "
                "on; their sum must be below 1"
            )
        return self


class TextFilesOptions(TextSplitOptions):
    paths: str | list[str]
    """Glob patterns of the files to read (``**`` recursive; ``~`` expanded; relative to the working
    directory); ``{stdlib}`` stands for the running Python's standard-library folder (its
    site-packages and dist-packages left out)."""

    @field_validator("paths")
    @classmethod
    def _each_pattern_matches(cls, paths: str | list[str]) -> str | list[str]:
        patterns = _patterns(paths)
        if not patterns:
            raise ValueError('needs at least one glob pattern, e.g. "data/**/*.txt" or "{stdlib}/**/*.py"')
        for pattern in patterns:
            if next(matches(pattern), None) is None:
                hint = f" ({STDLIB} is {stdlib_folder()})" if STDLIB in pattern else ""
                raise ValueError(f"pattern {expand(pattern)!r} matches no file{hint}")
        stored = [_stored(pattern) for pattern in patterns]
        return stored[0] if isinstance(paths, str) else stored


class TokenWindows:
    """A split's bytes as non-overlapping windows of ``context + 1`` tokens (int64): inputs are the
    first ``context``, next-token targets the last ``context``. The stride is ``context``, so every
    byte after the first is a target exactly once."""

    def __init__(self, data: bytes, context: int) -> None:
        import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

        self.tokens = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        )
        self.context = context

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.context)

    def __getitem__(self, index: int) -> torch.Tensor:
        if not -len(self) <= index < len(self):
            raise IndexError(f"window {index} out of range ({len(self)} windows)")
        start = (index % len(self)) * self.context
        return self.tokens[start : start + self.context + 1].long()

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        # one gather and one conversion for the whole batch; the collate function stacks the rows
        import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

        starts = torch.tensor(indices, dtype=torch.long) * self.context
        return list(self.tokens[starts[:, None] + torch.arange(self.context + 1)].long())

    def targets(self) -> torch.Tensor:
        """Every byte this split's windows predict, as one uint8 tensor."""
        return self.tokens[1 : len(self) * self.context + 1]


def read_corpus(options: TextFilesOptions) -> list[tuple[str, bytes]]:
    """The matched files' contents in sorted path order, byte-identical duplicates dropped (the first
    kept), stopping at ``max_bytes`` (the last file cut to fit)."""
    paths = sorted({path for pattern in _patterns(options.paths) for path in matches(pattern)})
    files: list[tuple[str, bytes]] = []
    seen: set[bytes] = set()
    total = 0
    for path in paths:
        if options.max_bytes is not None and total >= options.max_bytes:
            break
        try:
            data = Path(path).read_bytes()
        except OSError as error:
            raise DataError(f"dataset text_files: cannot read {path}: {error.strerror or error}") from None
        if options.max_bytes is not None:
            data = data[: options.max_bytes - total]
        digest = hashlib.sha256(data).digest()
        if not data or digest in seen:
            continue
        seen.add(digest)
        files.append((path, data))
        total += len(data)
    return files


def split_files(files: list[tuple[str, bytes]], options: TextFilesOptions) -> dict[str, list[tuple[str, bytes]]]:
    """Files shuffled with ``split_seed``; each goes to validation, else test, when it fits in that
    split's share of the bytes, else to training. A held-out split that no file fits gets the
    smallest training file. Each split keeps sorted path order."""
    sizes = [len(data) for _, data in files]
    shares = {"val": options.val_fraction * sum(sizes), "test": options.test_fraction * sum(sizes)}
    order = list(range(len(files)))
    random.Random(options.split_seed).shuffle(order)
    split_of: dict[int, str] = {}
    held = {"val": 0, "test": 0}
    for index in order:
        split = next((s for s in held if held[s] + sizes[index] <= shares[s]), "train")
        split_of[index] = split
        if split in held:
            held[split] += sizes[index]
    for split in ("val", "test"):
        training = [i for i in order if split_of[i] == "train"]
        if shares[split] > 0 and not held[split] and training:
            smallest = min(training, key=sizes.__getitem__)
            split_of[smallest], held[split] = split, sizes[smallest]
    return {s: [files[i] for i in range(len(files)) if split_of[i] == s] for s in ("train", "val", "test")}


def unigram_perplexity(train: bytes, targets: torch.Tensor) -> float:
    """exp of the cross-entropy of ``targets`` (uint8 tensor) under the byte frequencies of ``train``,
    add-one smoothed: the perplexity of a model that ignores the context."""
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    counts = torch.bincount(torch.frombuffer(bytearray(train), dtype=torch.uint8).long(), minlength=256).double()
    log_probs = torch.log((counts + 1) / (counts.sum() + 256))
    return math.exp(-log_probs[targets.long()].mean().item())


class TextPrompts(Inputs):
    """Prompts for a byte-level language model: a record is ``{"prompt": text}`` (UTF-8 text, or
    the bytes of a file), its tokens the bytes; the run's MLflow model takes a column ``prompt``
    and continues each."""

    columns = {"prompt": "string"}
    reads = "text"

    def read(self, path: Path) -> list[tuple[str, dict[str, bytes]]]:
        """The file ``path`` is one prompt, a folder holds one prompt a file (its subfolders too,
        in path order; empty files left out, binary ones too, by :meth:`runjob.Inputs.files`)."""
        path = Path(path)
        prompts = []
        for file in self.files(path):
            try:
                data = file.read_bytes()
            except OSError as error:
                raise DataError(f"--input: cannot read {file}: {error.strerror or error}") from None
            if data:
                prompts.append((file.name if file == path else file.relative_to(path).as_posix(), {"prompt": data}))
        if not prompts:
            raise DataError(
                f"--input {path}: no text to continue (the file is empty, or the folder holds no non-empty file)"
            )
        return prompts

    def encode(self, record: dict[str, str | bytes]) -> torch.Tensor:
        import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

        prompt = record.get("prompt")
        if isinstance(prompt, str):
            prompt = prompt.encode("utf-8", errors="surrogateescape")
        if not isinstance(prompt, (bytes, bytearray)) or not prompt:
            raise ValueError(f"'prompt' must be non-empty text, got {type(prompt).__name__} {prompt!r:.40}")
        return torch.frombuffer(bytearray(prompt), dtype=torch.uint8).long()

    def decode(self, ids: Sequence[int]) -> str:
        """Byte tokens back to text (UTF-8; a byte sequence cut mid-character shows as U+FFFD)."""
        return bytes(int(token) for token in ids).decode("utf-8", errors="replace")


def build_text_files(options: TextFilesOptions) -> DatasetSplits:
    """The files' bytes, split by file, as windows of ``context + 1`` tokens."""
    files = read_corpus(options)
    total = sum(len(data) for _, data in files)
    splits = split_files(files, options)
    data = {name: b"".join(content for _, content in members) for name, members in splits.items()}
    windows = {name: TokenWindows(content, options.context) for name, content in data.items()}
    needed = ("train", "val", "test") if options.test_fraction > 0 else ("train", "val")
    for name in needed:
        if len(windows[name]) == 0:
            raise DataError(
                f"dataset text_files: the {name} split has {len(data[name]):,} bytes in {len(splits[name])} file(s), "
                f"fewer than one window of context + 1 = {options.context + 1}; the corpus has {total:,} bytes in "
                f"{len(files)} distinct file(s), split by whole file: match more files with dataset.paths, raise "
                "dataset.max_bytes, lower dataset.context, or change dataset.val_fraction / test_fraction"
            )
    hasher = hashlib.sha256()
    for name in ("train", "val", "test"):
        hasher.update(f"{name}:{len(data[name])}:".encode())
        hasher.update(data[name])
    return DatasetSplits(
        train=windows["train"],
        val=windows["val"],
        test=windows["test"] if options.test_fraction > 0 else None,
        num_classes=256,
        vocab_size=256,
        context=options.context,
        source=", ".join(_patterns(options.paths)),
        digest=hasher.hexdigest()[:16],
        baselines={"unigram_perplexity": unigram_perplexity(data["train"], windows["val"].targets())},
        inputs=TextPrompts(),
    )


@hookimpl
def runjob_register_inputs(register: Register) -> None:
    """Register text_prompts (text_files' inputs: bytes are tokens, so they keep nothing)."""
    register("text_prompts", TextPrompts, description="prompts for a byte-level language model")


@hookimpl
def runjob_register_datasets(register: Register) -> None:
    """Register text_files."""
    register(
        "text_files",
        build_text_files,
        options=TextFilesOptions,
        description="text files matched by glob patterns as byte tokens (0-255), split by file; {stdlib} offline",
    )
