"""The ``text`` converter and the ``streamed_text`` dataset: text files converted to shards of token
windows and streamed back are exactly ``text_files``' windows; bad input is one line; the built-in
``gpt`` trains on them with the shipped job."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("litdata")

from test_streaming import loader  # noqa: E402 - after the skip: it imports LitData's loader

CORPUS = {"context": 16, "val_fraction": 0.2, "split_seed": 3}


@pytest.fixture(autouse=True)
def cache_here(tmp_path, monkeypatch):
    """Downloaded shards in the test's folder, never the user's ~/.cache."""
    monkeypatch.setenv("RUNJOB_CACHE_DIR", str(tmp_path / "stream-cache"))


def convert_text(pattern: str, location: str | Path, **options: object) -> int:
    from runjob.commands.cli import main

    pairs = [f"-o{key}={value}" for key, value in options.items()]
    return main(
        ["data", "convert", pattern, str(location), "--from", "text", "--chunk-bytes", "4KB", "--workers", "1", *pairs]
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """14 distinct text files of 200-460 bytes (each line led by its file's number) and a copy of one."""
    folder = tmp_path_factory.mktemp("corpus")
    for i in range(14):
        (folder / f"f{i:02d}.txt").write_bytes((f"{i:02d} the quick brown fox {i * 7}\n".encode() * 20)[: 200 + 20 * i])
    (folder / "sub").mkdir()
    (folder / "sub" / "copy.txt").write_bytes((folder / "f05.txt").read_bytes())
    return folder


@pytest.fixture(scope="module")
def shards(tmp_path_factory, corpus) -> Path:
    folder = tmp_path_factory.mktemp("shards") / "text"
    assert convert_text(str(corpus / "**" / "*.txt"), folder, **CORPUS) == 0
    return folder


def rows(windows) -> Counter:
    return Counter(hashlib.sha1(window.numpy().tobytes()).hexdigest() for window in windows)


def streamed_rows(split, training: bool) -> Counter:
    """One epoch of ``split`` through runjob's loader (2 workers), the padding copies left out."""
    import torch

    stream = loader(split, batch_size=8, training=training)
    stream.set_epoch(0)
    found: list = []
    for batch in stream:
        found += [row for row, valid in zip(batch, stream.valid.tolist(), strict=True) if valid]
    assert all(row.dtype == torch.int64 and row.shape == (17,) for row in found)
    return rows(found)


def test_a_streamed_epoch_holds_exactly_the_windows_text_files_gives(corpus, shards):
    from runjob_builtins.streamed_text import StreamedTextOptions, build_streamed_text
    from runjob_builtins.text import TextFilesOptions, build_text_files

    expected = build_text_files(TextFilesOptions(paths=str(corpus / "**" / "*.txt"), **CORPUS))
    streamed = build_streamed_text(StreamedTextOptions(location=str(shards), context=16))
    assert streamed.test is None
    for name, training in (("train", True), ("val", False)):
        windows = getattr(expected, name)
        assert len(windows) > 3 and len(getattr(streamed, name)) == len(windows), name
        assert streamed_rows(getattr(streamed, name), training) == rows(windows[i] for i in range(len(windows))), name
    assert streamed.baselines == pytest.approx(expected.baselines, rel=1e-12)
    assert (streamed.num_classes, streamed.vocab_size, streamed.context) == (256, 256, 16)
    assert streamed.inputs is not None and streamed.inputs.decode([104, 105]) == "hi"


def one_line_error(capsys) -> str:
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "Traceback" not in error, error
    return error


def test_bad_input_is_one_line_naming_what_to_change(corpus, shards, tmp_path, capsys):
    from runjob.errors import DataError
    from runjob_builtins.streamed_text import StreamedTextOptions, build_streamed_text

    assert convert_text(str(corpus / "*.md"), tmp_path / "none") == 2
    assert f"pattern '{corpus}/*.md' matches no file" in one_line_error(capsys)

    assert convert_text(str(corpus / "*.txt"), tmp_path / "long", context=2000) == 2
    error = one_line_error(capsys)
    assert "split has" in error and "fewer than one window of context + 1 = 2001" in error, error
    assert "-o context" in error and "-o max_bytes" in error

    assert convert_text(str(corpus / "*.txt"), tmp_path / "zero", context=0) == 2
    error = one_line_error(capsys)
    assert "-o context = 0: Input should be greater than or equal to 1" in error, error
    assert convert_text(str(corpus / "*.txt"), tmp_path / "shares", val_fraction=0.6, test_fraction=0.5) == 2
    assert "--from text: val_fraction + test_fraction = 0.6 + 0.5 leaves nothing to train" in one_line_error(capsys)
    assert not (tmp_path / "none").exists() and not (tmp_path / "long").exists() and not (tmp_path / "zero").exists()

    with pytest.raises(DataError) as raised:
        build_streamed_text(StreamedTextOptions(location=str(shards), context=32))
    message = str(raised.value)
    assert "\n" not in message and "dataset.context = 32" in message and "context 16" in message, message
    assert "runjob data convert ... " in message and "-o context=32" in message


@pytest.mark.slow
def test_the_shipped_job_trains_gpt_on_shards_its_comment_converts(runjob_tester):
    """jobs/gpt_text_streamed.toml with its comment's conversion (the first 300 KB of the stdlib's
    modules) and a small GPT for 4 steps: what is checked is that it runs and records the baseline."""
    from helpers import REPO

    from runjob.commands.cli import main
    from runjob.tags import baseline_tag

    job = REPO / "jobs" / "gpt_text_streamed.toml"
    (command,) = [line for line in job.read_text().splitlines() if "runjob data convert" in line]
    args = shlex.split(command.lstrip("# "))
    args = args[args.index("data") :]
    assert main([*args, "-o", "max_bytes=300_000", "--chunk-bytes", "64KB"]) == 0  # in runjob_tester.path
    manifest = json.loads((runjob_tester.path / "data" / "stdlib-shards" / "runjob.json").read_text())
    small = ("model.layers=1", "model.width=32", "model.heads=2", "train.max_steps=4", "train.eval_every=4")
    result = runjob_tester.cli(job, *(f"--set={pair}" for pair in small), "--output-dir", "out")
    assert result.returncode == 0, result.stderr[-3000:]
    train = runjob_tester.path / "data" / "stdlib-shards" / "train"
    assert f"streaming {train}: {manifest['splits']['train']['samples']} samples" in result.stdout
    run = runjob_tester.record("out")
    assert run.status == "FINISHED" and "val/perplexity" in run.metrics
    baseline = manifest["baselines"]["unigram_perplexity"]
    assert float(run.tags[baseline_tag("unigram_perplexity")]) == pytest.approx(baseline)
