"""Text classification with the built-in classification task (batches ``({"input_ids",
"attention_mask"}, label)``, padded per batch), and token classification with this package's
token_classification task, on tiny BERT-shaped models: one built from a config, one read from a
local folder (save_pretrained), its head sized by the data. The token classifier's run keeps its
inputs as data (predictor/), which predict reads once the data is gone, and refuses in one line
when they are tampered with."""

import csv
import json

from corpora import TINY_BERT, reviews, tagged, write_jsonl
from runjob_hf.inputs import Words

from runjob.testing import round_trip_inputs

CLASSIFY = f"""
    [job]
    name = "hf-reviews"
    [model]
    name = "hf"
    task_class = "sequence_classification"
    config_from = "bert"
    config = {TINY_BERT}
    [dataset]
    name = "hf_classification"
    files = "reviews.csv"
    max_length = 16
    train_tokenizer = {{kind = "wordpiece", vocab_size = 300, min_frequency = 1}}
    [optimizer]
    lr = 0.003
    [train]
    batch_size = 16
    epochs = 4
"""


def test_a_bert_shaped_classifier_learns_labelled_csv_rows_and_predicts_class_names(runjob_tester):
    with open(runjob_tester.path / "reviews.csv", "w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows(reviews(200))
    runjob_tester.write_job("job.toml", CLASSIFY)
    run = runjob_tester.run("job.toml", output_dir="runs/reviews")
    assert run.exit_code == 0 and run.status == "FINISHED"
    assert run.metrics["val/accuracy"] >= 0.9, "one word in seven says the class"
    facts = json.loads((run.output_dir / "data_facts.json").read_text())
    assert facts["classes"] == ["neg", "pos"] and facts["context"] == 16
    assert {"tokenizer.json", "classes.json"} <= {path.name for path in (run.output_dir / "data").iterdir()}
    (runjob_tester.path / "new.txt").write_text("a really excellent film\n\nthe plot was awful\n", encoding="utf-8")
    result = runjob_tester.cli("predict", "runs/reviews", "--input", "new.txt")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(row["input"], row["class"]) for row in rows] == [("line 1", "pos"), ("line 3", "neg")]


TAG = """
    [job]
    name = "hf-tags"
    [task]
    name = "token_classification"
    [model]
    name = "hf"
    task_class = "token_classification"
    model = "encoder"
    [dataset]
    name = "hf_token_classification"
    files = "tagged.jsonl"
    max_length = 16
    train_tokenizer = {kind = "bpe", vocab_size = 300, min_frequency = 1}
    [optimizer]
    lr = 0.005
    [train]
    batch_size = 16
    epochs = 2
"""


def test_a_token_classifier_from_a_local_folder_learns_tags(runjob_tester):
    import transformers

    config = transformers.BertConfig(
        vocab_size=300, num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64
    )
    transformers.BertModel(config).save_pretrained(runjob_tester.path / "encoder")  # no head: the data sizes it
    write_jsonl(runjob_tester.path / "tagged.jsonl", tagged(200))
    runjob_tester.write_job("job.toml", TAG)
    run = runjob_tester.run("job.toml", output_dir="runs/tags")
    assert run.exit_code == 0 and run.status == "FINISHED"
    assert run.metrics["val/accuracy"] >= 0.9, "a word's tag is the word's"
    assert json.loads((run.output_dir / "data_facts.json").read_text())["classes"] == ["LOC", "O", "PER"]
    (runjob_tester.path / "new.txt").write_text("alice went to oslo\n", encoding="utf-8")
    result = runjob_tester.cli("predict", "runs/tags", "--input", "new.txt")
    assert result.returncode == 0, result.stderr
    [row] = [json.loads(line) for line in result.stdout.splitlines()]
    assert row["input"] == "line 1" and "class_0" in row
    positions = [row[key] for key in row if key.startswith("class_")]
    assert set(positions) <= {"LOC", "O", "PER"}, "each position's class by the dataset's names"

    # the predictor is data: the words' tokenizer, ids, length and tag names, read back by the plugin
    predictor = run.output_dir / "predictor"
    kept = json.loads((predictor / "predictor.json").read_text())
    assert (kept["inputs"]["name"], kept["inputs"]["plugin"]) == ("hf_words", "hf")
    words = Words.from_data(kept["inputs"]["data"], predictor / "inputs")
    assert (words.max_length, words.classes) == (16, ["LOC", "O", "PER"])
    rebuilt = round_trip_inputs(words, runjob_tester.path / "kept-again")
    assert rebuilt.encode({"text": "alice went to oslo"})["input_ids"].tolist() == (
        words.encode({"text": "alice went to oslo"})["input_ids"].tolist()
    )
    (runjob_tester.path / "tagged.jsonl").unlink()  # prediction reads the tokenizer from the run
    again = runjob_tester.cli("predict", "runs/tags", "--input", "new.txt")
    assert again.returncode == 0, again.stderr
    assert [json.loads(line) for line in again.stdout.splitlines()] == [row], "as with the data there"

    tokenizer = predictor / "inputs" / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text(encoding="utf-8")[:-40], encoding="utf-8")  # cut short
    tampered = runjob_tester.cli("predict", "runs/tags", "--input", "new.txt")
    assert tampered.returncode == 2 and tampered.stdout == ""
    [line] = tampered.stderr_lines
    assert str(predictor / "predictor.json") in line and "tokenizer.json is not a tokenizers tokenizer.json" in line
