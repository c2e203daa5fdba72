"""hf_text's windows and hf_classification's rows converted to shards (`runjob data convert --from
hf_text`, `--from hf_classification`) and streamed back by hf_text_streamed and
hf_classification_streamed: the samples, facts and prompt inputs are the datasets', a bad option is
one line, and a run on a local folder of shards trains, logs bits per byte and predicts."""

import json
from collections import Counter

import pytest
from corpora import TINY_GPT2, reviews, write_corpus, write_jsonl

pytest.importorskip("litdata")

TOKENIZER = '{kind = "bpe", vocab_size = 300, min_frequency = 1}'


@pytest.fixture(autouse=True)
def cache_here(runjob_tester, monkeypatch):
    """Downloaded shards in the test's folder, never the user's ~/.cache."""
    monkeypatch.setenv("RUNJOB_CACHE_DIR", str(runjob_tester.path / "stream-cache"))


def convert(runjob_tester, location: str, *options: str, source: str = "corpus/*.txt", kind: str = "hf_text"):
    return runjob_tester.cli(
        "data", "convert", source, location, "--from", kind, "--chunk-bytes", "4KB", "--workers", "1",
        *(arg for option in options for arg in ("-o", option)),
    )  # fmt: skip


def streamed_epoch(split) -> list:
    """Every sample of one shuffled epoch of a streamed split as LitData reads it, through the
    split's transform, as lists."""
    import random

    from litdata import StreamingDataLoader, StreamingDataset

    dataset = StreamingDataset(split.url, shuffle=True, seed=0)
    loader = StreamingDataLoader(dataset, batch_size=1, num_workers=0, collate_fn=lambda records: records[0])
    return [as_lists(split.transform(record, random.Random(0))) for record in loader]


def as_lists(sample):
    """A sample's tensors as (nested) tuples: hashable, comparable."""
    if isinstance(sample, dict):
        return tuple(sorted((key, as_lists(value)) for key, value in sample.items()))
    if isinstance(sample, tuple):
        return tuple(as_lists(value) for value in sample)
    return tuple(sample.tolist()) if sample.dim() else sample.item()


def test_converted_and_streamed_windows_are_hf_texts(runjob_tester):
    """One epoch of each streamed split holds exactly hf_text's windows for the same files and
    options; the dataset's facts, baselines and prompt inputs are hf_text's too."""
    from runjob_hf.data import build_hf_text
    from runjob_hf.options import HFTextOptions
    from runjob_hf.streamed import HFTextStreamedOptions, build_hf_text_streamed

    write_corpus(runjob_tester.path / "corpus", files=5, lines=30)
    done = convert(runjob_tester, "shards", "context=16", "val_fraction=0.2", f"train_tokenizer={TOKENIZER}")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((runjob_tester.path / "shards" / "runjob.json").read_text())
    assert manifest["kind"] == "hf_text" and manifest["context"] == 16

    expected = build_hf_text(
        HFTextOptions.model_validate(
            {"files": "corpus/*.txt", "context": 16, "val_fraction": 0.2, "train_tokenizer": json_table(TOKENIZER)}
        )
    )
    streamed = build_hf_text_streamed(HFTextStreamedOptions(location="shards"))
    for name in ("train", "val"):
        want = [as_lists(getattr(expected, name)[i]) for i in range(len(getattr(expected, name)))]
        got = streamed_epoch(getattr(streamed, name))
        assert len(got) == len(want) > 4 and Counter(got) == Counter(want), name
        assert all(len(row) == 17 for row in got)
    assert (streamed.vocab_size, streamed.context, streamed.pad_id) == (expected.vocab_size, 16, expected.pad_id)
    assert streamed.baselines == pytest.approx(expected.baselines)
    assert streamed.val.tokens_per_byte == pytest.approx(expected.val.tokens_per_byte)
    assert streamed.inputs.vocabulary.json == expected.inputs.vocabulary.json
    assert [p.read_text() for p in streamed.artifacts.values()] == [p.read_text() for p in expected.artifacts.values()]
    prompt = {"text": "the quick fox"}  # what `runjob predict --prompt` tokenizes
    assert streamed.inputs.encode(prompt).tolist() == expected.inputs.encode(prompt).tolist()


@pytest.mark.slow  # 3 to 4 s: datasets reads the table twice
def test_converted_and_streamed_rows_are_hf_classifications(runjob_tester):
    """hf_classification_streamed's samples, classes, prompt inputs and artifacts are hf_classification's."""
    from runjob_hf.data import build_hf_classification
    from runjob_hf.options import HFClassificationOptions
    from runjob_hf.streamed import HFClassificationStreamedOptions, build_hf_classification_streamed

    write_jsonl(runjob_tester.path / "reviews.jsonl", reviews(120))
    tokenizer = '{kind = "wordpiece", vocab_size = 300, min_frequency = 1}'
    options = ("max_length=12", "val_fraction=0.25", f"train_tokenizer={tokenizer}")
    done = convert(runjob_tester, "rows", *options, source="reviews.jsonl", kind="hf_classification")
    assert done.returncode == 0, done.stderr

    expected = build_hf_classification(
        HFClassificationOptions.model_validate(
            {"files": "reviews.jsonl", "max_length": 12, "val_fraction": 0.25, "train_tokenizer": json_table(tokenizer)}
        )
    )
    streamed = build_hf_classification_streamed(HFClassificationStreamedOptions(location="rows"))
    for name in ("train", "val"):
        want = Counter(as_lists(getattr(expected, name)[i]) for i in range(len(getattr(expected, name))))
        assert Counter(streamed_epoch(getattr(streamed, name))) == want and len(want) > 4, name
    assert streamed.classes == expected.classes == ["neg", "pos"] and streamed.num_classes == 2
    assert (streamed.vocab_size, streamed.context, streamed.pad_id) == (expected.vocab_size, 12, expected.pad_id)
    assert {k: p.read_text() for k, p in streamed.artifacts.items()} == {
        k: p.read_text() for k, p in expected.artifacts.items()
    }
    record = {"text": "a really lovely film"}
    assert as_lists(streamed.inputs.encode(record)) == as_lists(expected.inputs.encode(record))


def json_table(text: str) -> dict:
    import tomllib

    return tomllib.loads(f"t = {text}")["t"]


def test_a_bad_converter_option_is_one_line(runjob_tester):
    write_corpus(runjob_tester.path / "corpus", files=2, lines=2)
    bad = convert(runjob_tester, "shards", "context=1", f"train_tokenizer={TOKENIZER}")
    assert bad.returncode == 2 and len(bad.stderr_lines) == 1, bad.stderr
    assert "-o context = 1" in bad.stderr and "greater than or equal to 2" in bad.stderr
    assert not (runjob_tester.path / "shards" / "runjob.json").exists()


@pytest.mark.slow
def test_a_run_on_a_folder_of_shards_trains_and_predicts(runjob_tester):
    """A short run of a tiny GPT-2 on hf_text_streamed, unpacked documents (padded by the dataset's
    collate); its predictor keeps the conversion's tokenizer and continues a prompt."""
    write_corpus(runjob_tester.path / "corpus", files=5, lines=30)
    done = convert(runjob_tester, "shards", "context=16", "packing=false", f"train_tokenizer={TOKENIZER}")
    assert done.returncode == 0, done.stderr
    runjob_tester.write_job(
        "job.toml",
        f"""
        [task]
        name = "language_modeling"
        [model]
        name = "hf"
        config_from = "gpt2"
        config = {TINY_GPT2}
        [dataset]
        name = "hf_text_streamed"
        location = "shards"
        num_workers = 1
        [train]
        batch_size = 8
        max_steps = 6
        log_every = 3
        eval_every = 6
        [callbacks.bits_per_byte]
        """,
    )
    run = runjob_tester.run("job.toml", output_dir="runs/streamed")
    assert run.exit_code == 0 and run.status == "FINISHED"
    assert run.local_history("train/loss") and run.local_history("val/perplexity")
    [(_, bits)] = run.local_history("val/bits_per_byte")
    assert 0 < bits < 16
    assert (run.output_dir / "data" / "tokenizer.json").is_file()
    prompt = runjob_tester.cli("predict", "runs/streamed", "--prompt", "the quick", "--max-new-tokens", "4")
    assert prompt.returncode == 0, prompt.stderr
    [row] = [json.loads(line) for line in prompt.stdout.splitlines()]
    assert isinstance(row["continuation"], str)
