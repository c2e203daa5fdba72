"""What files a dataset's ``runjob.Inputs`` reads (``Inputs.reads``), checked by runjob in one
place: a text input refuses a binary file, an image input a file that is not an image, a CSV input
a binary file; in a folder the others are still predicted. Every built-in and runjob-hf Inputs is
given a file of the wrong kind and, where it reads folders, a mix; a finished text run shows what
``runjob predict`` prints."""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import TINY_GPT

import runjob
from runjob.errors import DataError
from runjob.host.input_files import HEAD_BYTES, refusal
from runjob.testing import RunjobTester

pytestmark = pytest.mark.timeout(300)

TEXT = "the quick brown fox jumps over the lazy dog\n"


def _png(path: Path) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (200, 10, 10)).save(path)
    return path


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@functools.cache
def _vocabulary(purpose: str, cache: str):
    from runjob_hf.options import TrainTokenizer
    from runjob_hf.tokenizing import train_tokenizer

    settings = TrainTokenizer(kind="bpe", vocab_size=300, min_frequency=1)
    return train_tokenizer(settings, [TEXT] * 20, purpose, Path(cache), f"input-kinds-{purpose}")


def _builtin(name: str) -> Callable[[Path], runjob.Inputs]:
    def make(cache: Path) -> runjob.Inputs:
        if name == "image":
            from runjob_builtins.image_datasets import ImageFileInputs

            return ImageFileInputs(8, [0.5] * 3, [0.5] * 3)
        if name == "digits":
            from runjob_builtins.image_datasets import ImageFileInputs

            return ImageFileInputs(8, [0.5], [0.5], gray=True)
        if name == "text":
            from runjob_builtins.text import TextPrompts

            return TextPrompts()
        from runjob_builtins.tabular import CSVInputs

        return CSVInputs(["a", "b"], [0.0, 0.0], [1.0, 1.0])

    return make


def _hf(name: str) -> Callable[[Path], runjob.Inputs]:
    def make(cache: Path) -> runjob.Inputs:
        pytest.importorskip("runjob_hf")
        pytest.importorskip("tokenizers")
        from runjob_hf import inputs

        purpose = "lm" if name == "Prompts" else "encoder"
        return getattr(inputs, name)(_vocabulary(purpose, str(cache)), 16)

    return make


# (id, a maker of the Inputs (given a cache folder for a tokenizer), the kind it reads)
CASES = [
    ("ImageFileInputs", _builtin("image"), "image"),
    ("ImageFileInputs-gray", _builtin("digits"), "image"),
    ("TextPrompts", _builtin("text"), "text"),
    ("CSVInputs", _builtin("csv"), "csv"),
    ("runjob_hf.Prompts", _hf("Prompts"), "text"),
    ("runjob_hf.Texts", _hf("Texts"), "text"),
    ("runjob_hf.Words", _hf("Words"), "text"),
]
COVERED = {"ImageFileInputs", "TextPrompts", "CSVInputs", "Prompts", "Texts", "Words"}

READS = {
    "text": "reads UTF-8 text files (.txt, ...)",
    "image": "reads image files (.png, .jpg, ...)",
    "csv": "reads CSV files (UTF-8 text, .csv)",
}


def _good(folder: Path, kind: str, name: str = "good") -> Path:
    if kind == "image":
        return _png(folder / f"{name}.png")
    if kind == "csv":
        return _write(folder / f"{name}.csv", b"a,b\n1,2\n3,4\n")
    return _write(folder / f"{name}.txt", TEXT.encode())


def _wrong(folder: Path, kind: str) -> list[tuple[Path, str]]:
    """Files not of ``kind``, each with what its refusal says; a suffix that lies among them, so
    the check is seen to go by content."""
    if kind == "image":
        return [
            (_write(folder / "notes.txt", TEXT.encode()), "not an image file"),
            (_write(folder / "fake.png", TEXT.encode()), "not an image file"),
        ]
    what = "CSV text" if kind == "csv" else "text"
    suffix = ".csv" if kind == "csv" else ".txt"
    return [
        (_png(folder / "scan.png"), f"a binary file, not {what} (a NUL byte at offset 8)"),
        (_write(folder / f"latin1{suffix}", "café,crème\n".encode("latin-1")), f"a binary file, not {what} (byte 0xe9"),
    ]


@pytest.mark.parametrize(("make", "kind"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_file_of_the_wrong_kind_is_one_line_naming_it_and_what_the_dataset_reads(make, kind, tmp_path):
    inputs = make(tmp_path / "cache")
    assert inputs.reads == kind
    for file, why in _wrong(tmp_path, kind):
        with pytest.raises(DataError) as error:
            inputs.dataset(file, dataset_name="mine")
        message = str(error.value)
        assert message.startswith(f"{file}: {why}"), message
        assert message.endswith(f"; this run's dataset 'mine' {READS[kind]}"), message
        assert "\n" not in message
    good = _good(tmp_path, kind)
    taken = inputs.dataset(good, dataset_name="mine")
    assert len(taken) >= 1 and taken.notes == []
    taken[0]  # noqa: B018 - the record it read encodes


FOLDER_CASES = [case for case in CASES if case[2] != "csv"]  # the csv dataset reads one file, not folders


@pytest.mark.parametrize(("make", "kind"), [case[1:] for case in FOLDER_CASES], ids=[case[0] for case in FOLDER_CASES])
def test_a_folder_keeps_its_files_of_the_right_kind_and_says_each_one_it_skipped(make, kind, tmp_path):
    inputs = make(tmp_path / "cache")
    folder = tmp_path / "inputs"
    _good(folder, kind, "a")
    _good(folder / "deeper", kind, "b")
    wrong = _wrong(folder / "sub", kind)

    taken = inputs.dataset(folder, dataset_name="mine")
    files = {name.split(":")[0] for name, _ in taken.records}
    suffix = {"image": ".png", "text": ".txt"}[kind]
    assert files == {f"a{suffix}", f"deeper/b{suffix}"}, "only the files of its kind, none of sub/"
    [taken[index] for index in range(len(taken))]  # each encodes
    *each, summary = taken.notes
    assert len(each) == len(wrong)
    for note, (file, why) in zip(each, sorted(wrong), strict=True):
        assert note.startswith(f"--input {folder}: sub/{file.name}: {why}") and note.endswith("; skipped"), note
    assert summary == (
        f"--input {folder}: 2 of 4 files skipped, the other 2 predicted; this run's dataset 'mine' {READS[kind]}"
    )

    only_wrong = tmp_path / "only-wrong"
    _wrong(only_wrong, kind)
    with pytest.raises(DataError) as error:
        inputs.dataset(only_wrong, dataset_name="mine")
    message = str(error.value)
    noun = {"image": "image files", "text": "text files"}[kind]
    assert message.startswith(f"--input {only_wrong}: no {noun} in the folder (2 files skipped: "), message
    assert message.endswith(f"; this run's dataset 'mine' {READS[kind]}") and "\n" not in message


def test_every_builtin_and_runjob_hf_inputs_declares_its_kind_and_is_tested_here():
    modules = [
        "runjob_builtins.image_datasets",
        "runjob_builtins.text",
        "runjob_builtins.tabular",
        "runjob_builtins.digits",
    ]
    modules += ["runjob_builtins.segmentation", "runjob_hf.inputs", "runjob_timm"]
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:  # a package not installed has no Inputs to check
            continue

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    ours = {
        cls
        for cls in subclasses(runjob.Inputs)
        if cls.__module__.startswith(("runjob_builtins", "runjob_hf", "runjob_timm")) and not inspect.isabstract(cls)
    }
    assert {cls.__name__ for cls in ours} == COVERED
    assert all(cls.reads in ("text", "image", "csv") for cls in ours), {cls: cls.reads for cls in ours}


class _Raw(runjob.Inputs):
    """A third-party Inputs written before ``reads`` existed: every file is taken as it is."""

    columns = {"data": "binary"}

    def read(self, path):
        return [(file.name, {"data": file.read_bytes()}) for file in self.files(path)]

    def encode(self, record):
        return len(record["data"])


class _OwnWalk(runjob.Inputs):
    """One that walks its folder itself and never calls ``files``."""

    columns = {"data": "binary"}

    def read(self, path):
        path = Path(path)
        files = [path] if path.is_file() else sorted(path.iterdir())
        return [(file.name, {"data": file.read_bytes()}) for file in files]

    def encode(self, record):
        return len(record["data"])


@pytest.mark.parametrize("cls", [_Raw, _OwnWalk])
def test_an_inputs_without_reads_takes_every_file_as_before(cls, tmp_path):
    assert cls.reads is None
    scan = _png(tmp_path / "in" / "scan.png")
    _write(tmp_path / "in" / "notes.txt", b"some words")
    taken = cls().dataset(tmp_path / "in", dataset_name="theirs")
    assert [name for name, _ in taken.records] == ["notes.txt", "scan.png"]
    assert taken[1] == ("scan.png", scan.stat().st_size) and taken.notes == []
    assert cls().dataset(scan)[0] == ("scan.png", scan.stat().st_size)


def test_a_reads_value_runjob_does_not_know_is_refused_when_the_class_is_made():
    with pytest.raises(TypeError, match=r"Audio.reads = 'audio': must be one of 'text', 'image', 'csv' or None"):

        class Audio(runjob.Inputs):
            reads = "audio"

            def read(self, path):
                return []

            def encode(self, record):
                return record


def test_a_declared_kind_is_checked_for_a_read_that_walks_its_own_files(tmp_path):
    class TextWalk(_OwnWalk):
        reads = "text"

    with pytest.raises(DataError, match="a binary file, not text"):
        TextWalk().dataset(_png(tmp_path / "scan.png"))


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"", True),
        ("\ufeffwith a byte order mark\n".encode(), True),
        (("x" * (HEAD_BYTES - 1) + "é and more").encode(), True),  # a character cut by the end of the head
        (("x" * HEAD_BYTES + "\0").encode(), True),  # only the head is looked at
        ("café\n".encode("latin-1"), False),
        ("text\n".encode("utf-16"), False),  # NUL bytes between the letters
        (b"caf\xc3", False),  # the whole file ends mid-character
        (b"\x7fELF\x02\x01\x01\0", False),
    ],
    ids=["empty", "bom", "cut-at-head", "nul-after-head", "latin-1", "utf-16", "cut-at-end", "elf"],
)
def test_text_is_told_from_binary_by_content(data, text, tmp_path):
    file = _write(tmp_path / "input.txt", data)
    assert (refusal(file, "text") is None) is text, refusal(file, "text")


@pytest.fixture(scope="module")
def text_run(tmp_path_factory, empty_mlflow_db):
    """A finished two-step byte-level GPT run on a few text files (text_files), in a test world
    shared by the module; its MLflow model is logged as by default, so predict reads the inputs with
    the run's saved predictor, as it does for a user's run."""
    tester = RunjobTester(tmp_path_factory.mktemp("input-kinds"), empty_mlflow_db)
    tester._setup()
    try:
        corpus = tester.path / "corpus"
        corpus.mkdir()
        for i in range(10):
            (corpus / f"{i}.txt").write_bytes((f"file {i}: the quick brown fox jumps. " * 5).encode()[:130])
        tester.write_job("job.toml", TINY_GPT.format(name="input-kinds") + "\n[train]\nmax_steps = 2\nbatch_size = 8\n")
        run = tester.run("job.toml", output_dir="runs/text")
        assert run.status == "FINISHED" and "predictor" in run.files and "prediction.pkl" not in run.files
        yield tester, run
    finally:
        tester._teardown()


def test_predict_refuses_an_image_given_to_a_text_run_in_one_line(text_run):
    tester, run = text_run
    _png(tester.path / "scan.png")
    result = tester.cli("predict", run.output_dir, "--input", "scan.png", "--max-new-tokens", "2")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr_lines == [
        "runjob: scan.png: a binary file, not text (a NUL byte at offset 8); "
        "this run's dataset 'text_files' reads UTF-8 text files (.txt, ...)"
    ]


def test_predict_continues_a_folders_text_files_and_says_which_it_skipped(text_run):
    tester, run = text_run
    folder = tester.path / "prompts"
    _write(folder / "a.txt", b"file 3: the quick")
    _write(folder / "b.md", b"file 5: the")
    _png(folder / "scan.png")
    _write(folder / "raw" / "dump.bin", bytes(range(256)))
    result = tester.cli("predict", run.output_dir, "--input", "prompts", "--max-new-tokens", "2", "--output", "p.jsonl")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tester.path / "p.jsonl").read_text().splitlines()]
    assert [row["input"] for row in rows] == ["a.txt", "b.md"]
    assert result.stderr_lines == [
        "runjob: --input prompts: raw/dump.bin: a binary file, not text (a NUL byte at offset 0); skipped",
        "runjob: --input prompts: scan.png: a binary file, not text (a NUL byte at offset 8); skipped",
        "runjob: --input prompts: 2 of 4 files skipped, the other 2 predicted; "
        "this run's dataset 'text_files' reads UTF-8 text files (.txt, ...)",
        "runjob: 2 prediction(s) written to p.jsonl",
    ]

    (folder / "a.txt").unlink()
    (folder / "b.md").unlink()
    nothing = tester.cli("predict", run.output_dir, "--input", "prompts", "--output", "none.jsonl")
    assert nothing.returncode == 2 and len(nothing.stderr_lines) == 1, nothing.stderr
    assert nothing.stderr.startswith("runjob: --input prompts: no text files in the folder (2 files skipped: ")
    assert not (tester.path / "none.jsonl").exists()
