"""The files a :class:`runjob.Inputs` reads (``runjob predict --input PATH``), checked here, in one
place, against the kind of file it declares (``Inputs.reads``): a text input refuses a binary file,
an image input a file that is not an image, a CSV input a binary file. Plugins take their files
from ``Inputs.files(path)`` and never check kinds themselves.

Only the standard library is imported at module level; Pillow only when an image is checked."""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from runjob.errors import DataError

InputKind = Literal["text", "image", "csv"]
"""What files an ``Inputs`` reads: UTF-8 text, images, or CSV text."""

KINDS: tuple[str, ...] = get_args(InputKind)

HEAD_BYTES = 8192
"""How much of a file's start is read to tell text from binary (as git and grep do, a NUL byte or
a byte sequence that is not UTF-8 there makes it binary)."""

_NOUNS = {"text": "text files", "image": "image files", "csv": "CSV files"}
_READS = {
    "text": "UTF-8 text files (.txt, ...)",
    "image": "image files (.png, .jpg, ...)",
    "csv": "CSV files (UTF-8 text, .csv)",
}
_SHOWN = 3
"""How many refused files the one-line error of a folder with no file left names."""
_LISTED = 10
"""How many skipped files of a folder get a line of their own (a folder of images beside their
annotation files would otherwise print one line per annotation)."""


@dataclass
class _Reading:
    """One ``Inputs.dataset`` call: whose files they are (for messages) and what was left out."""

    reader: str
    skipped: list[tuple[str, str]] = field(default_factory=list)
    walked: int = 0


_READING: ContextVar[_Reading | None] = ContextVar("runjob_input_reading", default=None)


@contextmanager
def reading(reader: str) -> Iterator[_Reading]:
    """Collect, for the ``read`` inside, the files its walk left out; ``reader`` names who reads
    them in messages ("this run's dataset 'text_files'", or the Inputs class)."""
    state = _Reading(reader)
    token = _READING.set(state)
    try:
        yield state
    finally:
        _READING.reset(token)


def reads_what(kind: str, reader: str) -> str:
    """``this run's dataset 'x' reads UTF-8 text files (.txt, ...)``."""
    return f"{reader} reads {_READS[kind]}"


def refusal(file: Path, kind: str) -> str | None:
    """Why ``file`` is not a file of ``kind``, or ``None`` when it is one."""
    if kind == "image":
        return _not_an_image(file)
    return _not_text(file, "CSV text" if kind == "csv" else "text")


def _not_text(file: Path, what: str) -> str | None:
    try:
        with file.open("rb") as opened:
            head = opened.read(HEAD_BYTES)
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    zero = head.find(b"\0")
    if zero >= 0:
        return f"a binary file, not {what} (a NUL byte at offset {zero})"
    try:
        # a character cut by the end of the head is not a fault; the end of a whole file is
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < HEAD_BYTES)
    except UnicodeDecodeError as error:
        return f"a binary file, not {what} (byte 0x{head[error.start]:02x} at offset {error.start} is not UTF-8)"
    return None


def _not_an_image(file: Path) -> str | None:
    from PIL import Image  # lazy: `runjob validate` imports the host: PIL only when an image is read

    try:
        with Image.open(file):  # reads the header only: which format, what size
            pass
    except OSError as error:
        if isinstance(error, FileNotFoundError | PermissionError | IsADirectoryError):
            return f"cannot be read ({error.strerror or error})"
        return "not an image file (Pillow does not recognize its format)"
    except Exception as error:  # noqa: BLE001 - Pillow's format plugins raise many kinds on a foreign file
        return f"not an image file ({type(error).__name__}: {error})"
    return None


def checked_files(path: Path, kind: str | None, default_reader: str) -> list[Path]:
    """The file ``path``, or every file in folder ``path`` and its subfolders in path order, less
    those that are not of ``kind`` (all kept when ``kind`` is ``None``).

    A refused file named alone, or a folder where no file is left, is a one-line DataError naming
    the file(s) and what would be right. A folder's refused files are recorded for the ``reading``
    this runs in (``runjob predict`` says each, and how many), else dropped."""
    if not path.exists():
        raise DataError(f"--input {path}: no such file or folder")
    state = _READING.get()
    reader = state.reader if state is not None else default_reader
    if kind is None:
        return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    if path.is_file():
        why = refusal(path, kind)
        if why is not None:
            raise DataError(f"{path}: {why}; {reads_what(kind, reader)}")
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file())
    kept, skipped = [], []
    for file in files:
        why = refusal(file, kind)
        if why is None:
            kept.append(file)
        else:
            skipped.append((file.relative_to(path).as_posix(), why))
    if not kept:
        if not files:
            left = "it holds no file"
        else:
            named = "; ".join(f"{name}: {why}" for name, why in skipped[:_SHOWN])
            more = f"; and {len(skipped) - _SHOWN} more" if len(skipped) > _SHOWN else ""
            left = f"{len(skipped)} file{'' if len(skipped) == 1 else 's'} skipped: {named}{more}"
        raise DataError(f"--input {path}: no {_NOUNS[kind]} in the folder ({left}); {reads_what(kind, reader)}")
    if state is not None:
        state.skipped.extend(skipped)
        state.walked += len(files)
    return kept


def skipped_notes(state: _Reading, where: str, kind: str | None) -> list[str]:
    """One line for each file a folder's walk left out, and one saying how many: what ``runjob
    predict`` prints (each after ``runjob: ``) before it predicts the rest."""
    if not state.skipped or kind is None:
        return []
    notes = [f"--input {where}: {name}: {why}; skipped" for name, why in state.skipped[:_LISTED]]
    count = len(state.skipped)
    named = f" (the first {_LISTED} named above)" if count > _LISTED else ""
    notes.append(
        f"--input {where}: {count} of {state.walked} file{'' if state.walked == 1 else 's'} skipped{named}, "
        f"the other {state.walked - count} predicted; {reads_what(kind, state.reader)}"
    )
    return notes
