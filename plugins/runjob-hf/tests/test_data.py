"""The datasets' parts, without a run: tables read memory-mapped and tokenized once (datasets'
cache), the tokenizer trained on the training split only, padding, tags on first sub-tokens."""

import pytest
from corpora import reviews, tagged, write_jsonl


@pytest.fixture
def in_tmp(runjob_tester):
    """A working folder and HF_HOME of the test's own (the test kit's)."""
    return runjob_tester.path


def test_a_parquet_table_is_read_memory_mapped_and_tokenized_once(in_tmp):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from runjob_hf.data import build_hf_classification
    from runjob_hf.options import HFClassificationOptions

    pq.write_table(pa.Table.from_pylist(reviews(120)), in_tmp / "reviews.parquet")
    options = HFClassificationOptions.model_validate(
        {
            "files": "reviews.parquet",
            "max_length": 16,
            "train_tokenizer": {"kind": "wordpiece", "vocab_size": 300, "min_frequency": 1},
        }
    )
    first = build_hf_classification(options)
    table = first.train.hf
    assert type(table.data).__name__ == "MemoryMappedTable", "rows stay in the Arrow files, not in memory"
    assert table.cache_files and all(f["filename"].startswith(str(in_tmp / "hf_home")) for f in table.cache_files)
    assert len(first.train) + len(first.val) == 120 and first.num_classes == 2 and first.classes == ["neg", "pos"]
    inputs, label = first.train[0]
    assert set(inputs) == {"input_ids", "attention_mask"} and label.ndim == 0
    again = build_hf_classification(options)
    assert again.train.hf.cache_files == table.cache_files, "the tokenized rows are read back from the cache"
    assert first.artifacts["tokenizer.json"] == again.artifacts["tokenizer.json"]


def test_the_tokenizer_is_trained_on_the_training_split_only(in_tmp):
    from runjob_hf.data import build_hf_classification
    from runjob_hf.options import HFClassificationOptions

    train = reviews(100)
    write_jsonl(in_tmp / "train.jsonl", train)
    write_jsonl(in_tmp / "val.jsonl", [{"text": "zyzzyva quokka " * 5, "label": "pos"}] * 4 + train[:4])
    options = HFClassificationOptions.model_validate(
        {
            "files": "train.jsonl",
            "val_files": "val.jsonl",
            "train_tokenizer": {"kind": "wordpiece", "vocab_size": 300, "min_frequency": 1},
        }
    )
    splits = build_hf_classification(options)
    tokenizer = splits.inputs.tokenizer
    assert tokenizer.token_to_id("zyzzyva") is None and tokenizer.token_to_id("excellent") is not None
    assert len(splits.val) == 8


def test_padding_is_masked_and_labels_padded_with_minus_100():
    import torch
    from runjob_hf.data import Pad

    pad = Pad(7)
    items = [
        {
            "input_ids": torch.tensor([1, 2, 3]),
            "attention_mask": torch.ones(3, dtype=torch.long),
            "labels": torch.tensor([0, 1, -100]),
        },
        {
            "input_ids": torch.tensor([4]),
            "attention_mask": torch.ones(1, dtype=torch.long),
            "labels": torch.tensor([2]),
        },
    ]
    batch = pad(items)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 7, 7]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[0, 1, -100], [2, -100, -100]]
    inputs, labels = pad(
        [({"input_ids": torch.tensor([1, 2])}, torch.tensor(1)), ({"input_ids": torch.tensor([3])}, torch.tensor(0))]
    )
    assert inputs["attention_mask"].tolist() == [[1, 1], [1, 0]] and labels.tolist() == [1, 0]
    assert pad([torch.tensor([1, 2]), torch.tensor([3, 4])]).tolist() == [[1, 2], [3, 4]], "equal lengths: stacked"


def test_a_words_tag_is_on_its_first_token_and_minus_100_elsewhere(in_tmp):
    from runjob_hf.data import build_hf_token_classification
    from runjob_hf.options import HFTokenClassificationOptions

    rows = tagged(60) + [{"tokens": ["alice", "unbelievably", "went"], "tags": ["PER", "O", "O"]}]
    write_jsonl(in_tmp / "tagged.jsonl", rows)
    options = HFTokenClassificationOptions.model_validate(
        {
            "files": "tagged.jsonl",
            "val_fraction": 0.1,
            "train_tokenizer": {"kind": "wordpiece", "vocab_size": 300, "min_frequency": 2},
        }
    )
    splits = build_hf_token_classification(options)
    assert splits.classes == ["LOC", "O", "PER"]
    tokenizer = splits.inputs.tokenizer
    encoding = tokenizer.encode(["alice", "unbelievably", "went"], is_pretokenized=True)
    assert len(encoding.ids) > 5, "the rare word is cut into pieces (and [CLS], [SEP] added)"
    expected = []
    previous = None
    for word in encoding.word_ids:
        expected.append(-100 if word is None or word == previous else [2, 1, 1][word])
        previous = word
    found = [
        item["labels"].tolist()
        for split in (splits.train, splits.val)
        for item in (split[i] for i in range(len(split)))
        if item["input_ids"].tolist() == encoding.ids
    ]
    assert found == [expected]


def test_a_parquet_text_column_becomes_memory_mapped_token_windows(in_tmp):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from runjob_hf.data import build_hf_text
    from runjob_hf.options import HFTextOptions

    texts = [row["text"] for row in reviews(200)]
    pq.write_table(pa.Table.from_pylist([{"text": t, "id": i} for i, t in enumerate(texts)]), in_tmp / "lm.parquet")
    options = HFTextOptions.model_validate(
        {"files": "lm.parquet", "context": 8, "train_tokenizer": {"vocab_size": 300, "min_frequency": 1}}
    )
    splits = build_hf_text(options)
    window = splits.train[0]
    assert str(window.dtype) == "torch.int64" and tuple(window.shape) == (9,), "context + 1 tokens, packed"
    assert isinstance(splits.train.tokens, np.memmap), "the tokens stay in their .npy file"
    tokens = len(splits.train.tokens) + len(splits.val.tokens)
    documents = len(texts)  # each led by <|endoftext|>
    assert tokens > documents and splits.collate is None
    assert 0 < splits.baselines["val_tokens_per_byte"] < 1
    assert splits.inputs.decode(splits.inputs.encode({"text": "the plot"}).tolist()) == "the plot"
