"""LoRA on a Hugging Face causal LM, started from a full run of it (issue 23): the LoRA run reads
the first run's tokenizer and weights, trains only its adapters, and its own output folder is all
that predict and export need once the first run and the corpus are gone; the export is the plain
model with the adapters merged, which transformers reads back."""

import json
import shutil

from corpora import write_corpus
from test_language_model import JOB


def test_lora_from_a_full_run_of_a_gpt2_and_its_folder_alone_serves_it(runjob_tester):
    from safetensors.torch import load_file

    write_corpus(runjob_tester.path / "corpus")
    runjob_tester.write_job("job.toml", JOB)
    base = runjob_tester.run("job.toml", output_dir="runs/lm")
    assert base.status == "FINISHED"
    lora_job = JOB.replace('name = "hf-lm"', 'name = "hf-lm-lora"').replace(
        "    [dataset]",
        f'    init_from = "{base.output_dir}"\n'
        "    [model.adapters.lora]\n"
        "    r = 4\n"
        '    target_modules = ["c_attn"]\n'
        "    [dataset]",
    )
    lora_job = lora_job.replace(
        '    train_tokenizer = {kind = "bpe", vocab_size = 400, min_frequency = 1}',
        f'    tokenizer = "{base.output_dir / "data" / "tokenizer.json"}"',
    )
    runjob_tester.write_job("lora.toml", lora_job)
    result = runjob_tester.cli("run", "lora.toml", "--output-dir", "runs/lora")
    assert result.returncode == 0, result.stderr
    assert "runjob: adapters lora: trainable 1,024 of " in result.stdout, "r 4 on c_attn (32 -> 96) of 2 layers"
    lora = runjob_tester.path / "runs" / "lora"
    weights, started = load_file(lora / "model.safetensors"), load_file(base.output_dir / "model.safetensors")
    name = "transformer.h.0.attn.c_attn"
    assert weights[f"{name}.base_layer.weight"].equal(started[f"{name}.weight"]), "the base weights stay"
    assert (lora / "adapters" / "lora" / "adapter_model.safetensors").is_file()

    shutil.rmtree(base.output_dir)
    shutil.rmtree(runjob_tester.path / "corpus")
    prompt = runjob_tester.cli("predict", lora, "--prompt", "the quick", "--max-new-tokens", "4")
    assert prompt.returncode == 0, prompt.stderr
    [row] = [json.loads(line) for line in prompt.stdout.splitlines()]
    exported = runjob_tester.cli("export", lora, "--format", "hf", "--output", "merged")
    assert exported.returncode == 0, exported.stderr
    from test_language_model import greedy
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(runjob_tester.path / "merged").eval()
    assert not any("lora" in key for key in model.state_dict())
    tokenizer = AutoTokenizer.from_pretrained(runjob_tester.path / "merged")
    ids = [tokenizer.eos_token_id, *tokenizer("the quick")["input_ids"]]
    assert tokenizer.decode(greedy(model, ids, 4), skip_special_tokens=True) == row["continuation"]
