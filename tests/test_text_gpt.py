"""The ``text_files`` dataset (byte tokens, split by file) and the ``gpt`` model, on files the tests
write and on the running Python's standard library."""

from __future__ import annotations

import math
import os
from collections import Counter

import pytest

from runjob.errors import DataError
from runjob_builtins.gpt import GPTOptions, build_gpt
from runjob_builtins.text import TextFilesOptions, build_text_files, stdlib_folder


def write_corpus(folder, contents: dict[str, bytes]):
    for name, data in contents.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


def distinct_files(count: int, size: int = 300) -> dict[str, bytes]:
    """``count`` files of ``size`` bytes, each different (its name's digit leads every line)."""
    return {f"f{i:02d}.txt": (f"{i:02d} the quick brown fox\n".encode() * size)[:size] for i in range(count)}


def test_pattern_that_matches_nothing_is_reported_with_file_and_line(runjob_tester):
    runjob_tester.write_job(
        "job.toml",
        """
        [model]
        name = "gpt"
        [dataset]
        name = "text_files"
        paths = ["{stdlib}/json/*.py", "corpus/**/*.txt"]
        [task]
        name = "language_modeling"
        """,
    )
    result = runjob_tester.cli("validate", "job.toml")
    assert result.returncode == 2
    missing = os.path.join(os.getcwd(), "corpus/**/*.txt")
    assert f"job.toml:5: dataset.paths: pattern '{missing}' matches no file" in result.stderr, result.stderr
    assert "json" not in result.stderr.split("matches no file")[0], "the matching pattern is not blamed"
    assert "Traceback" not in result.stderr


def test_width_not_divisible_by_heads_names_both():
    with pytest.raises(ValueError, match=r"width = 130 is not a multiple of heads = 4; set width to e.g. 128 or 132"):
        GPTOptions(width=130, heads=4)


def test_windows_hold_context_plus_one_tokens_and_targets_are_inputs_shifted(tmp_path):
    import torch

    write_corpus(tmp_path, distinct_files(10))
    splits = build_text_files(TextFilesOptions(paths=str(tmp_path / "*.txt"), context=16, val_fraction=0.2))
    window = splits.train[0]
    assert window.dtype == torch.int64 and window.shape == (17,)
    inputs, targets = window[:-1], window[1:]
    assert torch.equal(inputs[1:], targets[:-1])
    second = splits.train[1]
    assert second[0] == window[-1], "windows are non-overlapping with stride context: the last target starts the next"
    batch = splits.train.__getitems__([0, 1, 3])
    assert all(torch.equal(row, splits.train[i]) for row, i in zip(batch, [0, 1, 3], strict=True))
    assert splits.num_classes == 256 and splits.test is None
    assert len(splits.train) == (len(splits.train.tokens) - 1) // 16


def test_split_is_by_file_and_duplicates_are_dropped(tmp_path):
    contents = distinct_files(12)
    contents["sub/copy_of_f03.txt"] = contents["f03.txt"]
    write_corpus(tmp_path, contents)
    options = TextFilesOptions(paths=str(tmp_path / "**/*.txt"), context=8, val_fraction=0.25, test_fraction=0.2)
    splits = build_text_files(options)
    texts = {name: bytes(getattr(splits, name).tokens.tolist()) for name in ("train", "val", "test")}
    # every file is whole in exactly one split (the leading digits of its lines identify it)
    owners = {
        f"{i:02d}": [name for name, text in texts.items() if f"{i:02d} the quick".encode() in text] for i in range(12)
    }
    assert all(len(found) == 1 for found in owners.values()), owners
    assert sum(len(text) for text in texts.values()) == 12 * 300, "the duplicate was dropped"
    assert {found[0] for found in owners.values()} == {"train", "val", "test"}
    assert build_text_files(options).digest == splits.digest and len(splits.digest) == 16
    other_seed = build_text_files(options.model_copy(update={"split_seed": 1}))
    assert other_seed.digest != splits.digest


def test_max_bytes_bounds_the_corpus_in_sorted_path_order(tmp_path):
    write_corpus(tmp_path, distinct_files(10))
    options = TextFilesOptions(paths=str(tmp_path / "*.txt"), context=8, max_bytes=1000, val_fraction=0.3)
    splits = build_text_files(options)
    text = b"".join(bytes(s.tokens.tolist()) for s in (splits.train, splits.val))
    assert len(text) == 1000
    assert b"00 the quick" in text and b"03 the quick" in text and b"04 the quick" not in text


def test_unigram_baseline_is_add_one_smoothed_training_frequencies_on_validation_targets(tmp_path):
    write_corpus(tmp_path, {"a.txt": b"aaab" * 10, "b.txt": b"abcd" * 3})
    # no file fits in 10% of 52 bytes, so validation gets the smallest file
    splits = build_text_files(TextFilesOptions(paths=str(tmp_path / "*.txt"), context=5, val_fraction=0.1))
    assert bytes(splits.val.tokens.tolist()) == b"abcd" * 3
    counts, total = Counter(b"aaab" * 10), 40
    targets = (b"abcd" * 3)[1 : 2 * 5 + 1]  # two windows of 5 targets each
    cross_entropy = -sum(math.log((counts[byte] + 1) / (total + 256)) for byte in targets) / len(targets)
    assert splits.baselines["unigram_perplexity"] == pytest.approx(math.exp(cross_entropy), rel=1e-12)


def test_too_little_data_for_a_split_says_what_to_change(tmp_path):
    write_corpus(tmp_path, {"only.txt": b"x" * 500})
    with pytest.raises(DataError) as caught:
        build_text_files(TextFilesOptions(paths=str(tmp_path / "*.txt"), context=8))
    message = str(caught.value)
    assert "the train split has 0 bytes in 0 file(s)" in message and "500 bytes in 1 distinct file(s)" in message
    assert "dataset.paths" in message and "dataset.context" in message


def test_stdlib_placeholder_expands_and_finds_the_json_package():
    options = TextFilesOptions(paths="{stdlib}/json/*.py", context=64, max_bytes=200_000)
    assert options.paths == "{stdlib}/json/*.py", "the recorded job keeps the placeholder"
    splits = build_text_files(options)
    assert splits.source == "{stdlib}/json/*.py"
    text = b"".join(bytes(s.tokens.tolist()) for s in (splits.train, splits.val))
    assert b"def dumps(" in text and b"class JSONDecoder" in text
    assert os.path.isfile(os.path.join(stdlib_folder(), "json", "__init__.py"))
    assert 1 < splits.baselines["unigram_perplexity"] < 256


def test_relative_patterns_are_stored_absolute(tmp_path, monkeypatch):
    write_corpus(tmp_path, {"a.txt": b"hello"})
    monkeypatch.chdir(tmp_path)
    assert TextFilesOptions(paths=["*.txt"]).paths == [str(tmp_path / "*.txt")]


@pytest.fixture(scope="module")
def small_gpt():
    import torch

    torch.manual_seed(0)
    return build_gpt(GPTOptions(context=16, layers=2, width=32, heads=4)).eval()


def test_gpt_gives_logits_per_position(small_gpt):
    import torch

    logits = small_gpt(torch.randint(0, 256, (3, 16)))
    assert logits.shape == (3, 16, 256)


def test_gpt_is_causal(small_gpt):
    import torch

    tokens = torch.randint(0, 256, (1, 12))
    changed = tokens.clone()
    changed[0, 7] = (tokens[0, 7] + 1) % 256
    before, after = small_gpt(tokens), small_gpt(changed)
    assert torch.equal(before[:, :7], after[:, :7])
    assert not torch.allclose(before[:, 7:], after[:, 7:])


def test_gpt_ties_head_to_token_embedding():
    tied = build_gpt(GPTOptions(context=8, layers=1, width=16, heads=2))
    assert tied.head.weight.data_ptr() == tied.tokens.weight.data_ptr()
    untied = build_gpt(GPTOptions(context=8, layers=1, width=16, heads=2, tie_weights=False))
    assert untied.head.weight.data_ptr() != untied.tokens.weight.data_ptr()
    count = sum(p.numel() for p in tied.parameters())  # shared parameters counted once
    assert sum(p.numel() for p in untied.parameters()) == count + 256 * 16


def test_gpt_refuses_sequences_longer_than_its_context(small_gpt):
    import torch

    with pytest.raises(ValueError, match=r"gpt got sequences of 17 tokens, longer than model.context = 16"):
        small_gpt(torch.zeros(1, 17, dtype=torch.long))


def test_gpt_builds_on_the_meta_device_at_350m_parameters():
    import torch

    # GPT-2 medium's shape with byte tokens: 28 layers of width 1024 (24 give 303.6M: with a 256-token
    # vocabulary the embeddings are 0.3% of the model, not GPT-2's 51M)
    with torch.device("meta"):
        model = build_gpt(GPTOptions(layers=28, width=1024, heads=16, context=1024))
        logits = model(torch.zeros(2, 1024, dtype=torch.long))
    assert model.tokens.weight.device.type == "meta" and logits.shape == (2, 1024, 256)
    per_layer = 12 * 1024**2 + 13 * 1024  # qkv, proj, two MLP matrices, their biases, two LayerNorms
    expected = 28 * per_layer + 256 * 1024 + 1024 * 1024 + 2 * 1024
    assert sum(p.numel() for p in model.parameters()) == expected == 354_007_040


def test_gpt_pickles_by_reference():
    import pickle

    import torch

    model = build_gpt(GPTOptions(context=8, layers=1, width=16, heads=2))
    copy = pickle.loads(pickle.dumps(model))
    assert type(copy).__module__ == "runjob_builtins.gpt_layers" and type(copy) is type(model)
    tokens = torch.randint(0, 256, (2, 8))
    assert torch.equal(copy(tokens), model(tokens))
    assert copy.head.weight is copy.tokens.weight


def test_gpt_weights_load_back_from_a_file_that_names_the_tied_tensor_once(tmp_path):
    # accelerate's save_model keeps tokens.weight only; safetensors' load_model (what accelerate's
    # load_state uses) knows head.weight is the same tensor
    import torch
    from safetensors.torch import load_model, save_file

    model = build_gpt(GPTOptions(context=8, layers=1, width=16, heads=2))
    save_file({k: v for k, v in model.state_dict().items() if k != "head.weight"}, tmp_path / "model.safetensors")
    fresh = build_gpt(GPTOptions(context=8, layers=1, width=16, heads=2))
    load_model(fresh, tmp_path / "model.safetensors")  # strict
    assert torch.equal(fresh.tokens.weight, model.tokens.weight) and fresh.head.weight is fresh.tokens.weight


def test_windows_longer_than_the_models_context_stop_at_the_first_batch(runjob_tester):
    write_corpus(runjob_tester.path / "corpus", distinct_files(6, 400))
    runjob_tester.write_job(
        "job.toml",
        """
        [job]
        name = "short"
        [task]
        name = "language_modeling"
        [model]
        name = "gpt"
        context = 8
        layers = 1
        width = 16
        heads = 2
        [dataset]
        name = "text_files"
        paths = "corpus/*.txt"
        context = 16
        val_fraction = 0.3
        [train]
        batch_size = 4
        """,
    )
    result = runjob_tester.cli("job.toml")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr_lines[-1] == (
        "runjob: model 'gpt' cannot take the inputs of dataset 'text_files' (a batch of shape (4, 16)): gpt got "
        "sequences of 16 tokens, longer than model.context = 8; set model.context >= 16 (or dataset.context <= 8)"
    )
