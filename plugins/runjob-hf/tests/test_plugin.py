"""The plugin seen from runjob: listed, light to load, its options checked against the job file,
a model missing from the cache reported in one line."""

import subprocess
import sys

import pytest
from corpora import TINY_GPT2, write_corpus


def test_runjob_lists_the_plugin_and_its_components(runjob_tester):
    result = runjob_tester.cli("plugins")
    assert result.returncode == 0, result.stderr
    assert "hf  (runjob-hf 0.1.0, runjob_hf)" in result.stdout
    for line in (
        "models: hf",
        "datasets: hf_text, hf_classification, hf_token_classification, hf_text_streamed, hf_classification_streamed",
        "converters: hf_text, hf_classification",
        "tasks: token_classification",
        "callbacks: bits_per_byte",
        "exporters: hf",
        "inputs: hf_prompts, hf_texts, hf_words",
    ):
        assert line in " ".join(result.stdout.split())  # long lines wrap
    assert "FAILED" not in result.stdout


def test_loading_the_plugin_imports_no_heavy_library():
    code = (
        "import sys, runjob_hf; "
        "heavy = {'torch', 'transformers', 'tokenizers', 'datasets', 'numpy'} & set(sys.modules); "
        "print(sorted(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


JOB = f"""
    [job]
    name = "hf-check"
    [task]
    name = "language_modeling"
    [model]
    name = "hf"
    config_from = "gpt2"
    config = {TINY_GPT2}
    [dataset]
    name = "hf_text"
    files = "corpus/*.txt"
    context = 16
    train_tokenizer = {{vocab_size = 300, min_frequency = 1}}
    [train]
    max_steps = 1
"""


def test_options_are_checked_against_the_job_file(runjob_tester):
    write_corpus(runjob_tester.path / "corpus", files=3, lines=4)
    runjob_tester.write_job("job.toml", JOB)
    assert runjob_tester.cli("validate", "job.toml").returncode == 0
    both = runjob_tester.cli("validate", "job.toml", "--set", "dataset.tokenizer=gpt2")
    assert both.returncode == 2 and "needs tokenizer = " in both.stderr and "one of them" in both.stderr
    unknown = runjob_tester.cli("validate", "job.toml", "--set", "model.task_class=summarize")
    assert unknown.returncode == 2 and "model.task_class: 'summarize' is neither one of 'causal_lm'" in unknown.stderr
    nothing = runjob_tester.cli("validate", "job.toml", "--set", "dataset.files=nowhere/*.txt")
    assert nothing.returncode == 2 and "matches no file" in nothing.stderr
    assert "Traceback" not in both.stderr + nothing.stderr


@pytest.mark.slow
def test_a_model_missing_from_the_cache_is_one_line_naming_it_and_the_cache(runjob_tester, monkeypatch):
    # as a user runs it, without HF_HUB_OFFLINE: runjob-hf must not ask the Hub (here an address
    # that refuses at once, so a request would be retried and said)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    write_corpus(runjob_tester.path / "corpus", files=3, lines=4)
    runjob_tester.write_job("job.toml", JOB)
    result = runjob_tester.cli(
        "job.toml",
        "--set",
        "model.config_from=!remove",
        "--set",
        "model.config=!remove",
        "--set",
        "model.model=nobody/no-such-model",
    )
    assert result.returncode == 2, result.stderr
    [line] = [line for line in result.stderr_lines if "no-such-model" in line]
    assert "[model]" in line and "not in the Hugging Face cache" in line
    assert "/hub" in line, "the cache it looked in"
    assert "Traceback" not in result.stderr
    logs = "".join(log.read_text() for log in runjob_tester.path.rglob("runjob.log"))
    assert "127.0.0.1:9" not in result.stderr + logs, "the Hub asked, though nothing is ever downloaded"
