"""A GPT-2-shaped transformers model, built from a config, with a byte-level BPE tokenizer trained
on text the test writes, trains with runjob's built-in language_modeling task; the run keeps its
tokenizer in its predictor, as data, so predict works after the corpus is gone; export --format hf
writes a folder transformers reads back, which continues a prompt as runjob predict does."""

import json
import shutil

from corpora import TINY_GPT2, write_corpus

JOB = f"""
    [job]
    name = "hf-lm"
    [task]
    name = "language_modeling"
    [model]
    name = "hf"
    config_from = "gpt2"
    config = {TINY_GPT2}
    [dataset]
    name = "hf_text"
    files = "corpus/*.txt"
    context = 32
    val_fraction = 0.2
    train_tokenizer = {{kind = "bpe", vocab_size = 400, min_frequency = 1}}
    [optimizer]
    lr = 0.01
    [train]
    batch_size = 8
    max_steps = 12
    log_every = 6
    eval_every = 12
    [callbacks.bits_per_byte]
"""


def greedy(model, ids, steps):
    """``steps`` greedy tokens after ``ids``, each from a whole forward pass (no cache)."""
    import torch

    tokens = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(steps):
            following = model(input_ids=tokens).logits[:, -1].argmax(dim=-1, keepdim=True)
            tokens = torch.cat([tokens, following], dim=1)
    return tokens[0, len(ids) :].tolist()


def test_gpt2_with_a_trained_bpe_trains_predicts_without_its_corpus_and_exports(runjob_tester):
    write_corpus(runjob_tester.path / "corpus")
    runjob_tester.write_job("job.toml", JOB)
    run = runjob_tester.run("job.toml", output_dir="runs/lm")
    assert run.exit_code == 0 and run.status == "FINISHED"
    [(_, first), *_, (_, last)] = run.local_history("train/loss")
    assert last < first
    assert run.local_history("val/perplexity") and run.local_history("train/tokens_per_s")
    [(_, bits)] = run.local_history("val/bits_per_byte")
    assert 0 < bits < 8
    assert {"data", "data_facts.json", "predictor"} <= run.files and "prediction.pkl" not in run.files
    tokenizer_json = (run.output_dir / "data" / "tokenizer.json").read_text(encoding="utf-8")
    kept = json.loads((run.output_dir / "predictor" / "predictor.json").read_text())
    assert (kept["inputs"]["name"], kept["inputs"]["plugin"]) == ("hf_prompts", "hf"), "kept as data, by name"
    assert (run.output_dir / "predictor" / "inputs" / "tokenizer.json").read_text(encoding="utf-8") == tokenizer_json
    facts = json.loads((run.output_dir / "data_facts.json").read_text())
    assert facts["vocab_size"] == facts["num_classes"] <= 400 and facts["context"] == 32
    assert run.tags["runjob.library.transformers"]
    assert float(run.tags["runjob.baseline.unigram_perplexity"]) > 1

    prompt = runjob_tester.cli("predict", "runs/lm", "--prompt", "the quick", "--max-new-tokens", "6")
    assert prompt.returncode == 0, prompt.stderr
    [row] = [json.loads(line) for line in prompt.stdout.splitlines()]
    assert row["input"] == "prompt" and isinstance(row["continuation"], str)
    exported = runjob_tester.cli("export", "runs/lm", "--format", "hf", "--output", "exported")
    assert exported.returncode == 0, exported.stderr
    assert "GPT2LMHeadModel" in exported.stdout and "tokenizer" in exported.stdout
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(runjob_tester.path / "exported").eval()
    tokenizer = AutoTokenizer.from_pretrained(runjob_tester.path / "exported")
    assert model.config.vocab_size == facts["vocab_size"] and model.config.n_positions == 32
    ids = [tokenizer.eos_token_id, *tokenizer("the quick")["input_ids"]]
    continued = tokenizer.decode(greedy(model, ids, 6), skip_special_tokens=True)
    assert continued == row["continuation"], "the exported model and tokenizer continue as runjob predict does"

    shutil.rmtree(runjob_tester.path / "corpus")  # prediction reads the tokenizer from the run
    prompt = runjob_tester.cli("predict", "runs/lm", "--prompt", "the quick", "--max-new-tokens", "6")
    assert prompt.returncode == 0, prompt.stderr
    assert [json.loads(line) for line in prompt.stdout.splitlines()] == [row], "as with the corpus there"
    again = runjob_tester.cli("export", "runs/lm", "--format", "hf", "--output", "exported-again")
    assert again.returncode == 0, again.stderr
    assert (runjob_tester.path / "exported-again" / "tokenizer.json").is_file()
    (runjob_tester.path / "prompts").mkdir()
    (runjob_tester.path / "prompts" / "a.txt").write_text("the lazy dog", encoding="utf-8")
    (runjob_tester.path / "prompts" / "b.txt").write_text("birds sing", encoding="utf-8")
    given = runjob_tester.cli("predict", "runs/lm", "--input", "prompts", "--max-new-tokens", "3")
    assert given.returncode == 0, given.stderr
    assert [json.loads(line)["input"] for line in given.stdout.splitlines()] == ["a.txt", "b.txt"]


def test_unpacked_documents_are_padded_and_masked(runjob_tester):
    """packing = false: each document on its own, padded per batch by the dataset's collate; the
    padding is masked and not counted."""
    from runjob_hf.data import build_hf_text
    from runjob_hf.options import HFTextOptions

    folder = write_corpus(runjob_tester.path / "corpus", files=4, lines=3)
    (folder / "short.txt").write_text("a short one", encoding="utf-8")
    options = HFTextOptions.model_validate(
        {
            "files": "corpus/*.txt",
            "context": 16,
            "packing": False,
            "val_fraction": 0.2,
            "train_tokenizer": {"kind": "bpe", "vocab_size": 300, "min_frequency": 1},
        }
    )
    splits = build_hf_text(options)
    items = [splits.train[i] for i in range(len(splits.train))]
    assert all(isinstance(item, dict) and 2 <= len(item["input_ids"]) <= 17 for item in items)
    assert len({len(item["input_ids"]) for item in items}) > 1, "pieces of different lengths"
    batch = splits.collate(items)
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    assert lengths == [len(item["input_ids"]) for item in items]
    assert (batch["input_ids"][batch["attention_mask"] == 0] == splits.pad_id).all()
    assert splits.vocab_size == splits.num_classes and splits.context == 16
