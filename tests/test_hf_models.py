"""How a task calls a model (issue 23): a dict of inputs goes in as keyword arguments where the
model's forward names them, outputs are read for their logits (a tensor, a dict, a Hugging Face
``ModelOutput``), and the built-in ``language_modeling`` task trains raw Hugging Face causal LMs
(GPT-2, Llama; tiny, built from configs, nothing downloaded) without a wrapper: their
``attention_mask`` reaches them, left and right padding give the same loss, and padding is not
counted as tokens."""

from __future__ import annotations

import inspect
import textwrap

import pytest

from runjob.host.task import Task, logits_of, takes_keyword
from runjob.testing import evaluate_task
from runjob_builtins.tasks import (
    Classification,
    ClassificationOptions,
    LanguageModeling,
    LanguageModelingOptions,
    Regression,
    RegressionOptions,
)

pytestmark = pytest.mark.timeout(120)

VOCABULARY = 64
SEQUENCES = [[5, 6, 7, 8, 9, 10, 11, 12], [20, 21, 22], [30, 31, 32, 33, 34], [40, 41]]


def tiny_lm(arch, vocab_size, context):
    """A two-layer, width-32 Hugging Face causal LM from its config, seeded: ``gpt2`` (learned
    absolute positions, tied embeddings) or ``llama`` (rotary positions)."""
    import torch
    import transformers

    torch.manual_seed(0)
    ids = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    if arch == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=vocab_size, n_positions=context, **ids
        )
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        max_position_embeddings=context,
        **ids,
    )
    return transformers.LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def hf():
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model(request, hf):
    return tiny_lm(request.param, VOCABULARY, 32).eval()


def task(vocabulary=VOCABULARY):
    return LanguageModeling(LanguageModelingOptions(), vocabulary)


def padded(side, sequences=SEQUENCES, length=10):
    """A tokenizer's batch of ``sequences`` padded with 0 on the ``side`` ("left" or "right")."""
    import torch

    ids = torch.zeros(len(sequences), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, sequence in enumerate(sequences):
        where = slice(length - len(sequence), length) if side == "left" else slice(0, len(sequence))
        ids[row, where], mask[row, where] = torch.tensor(sequence), 1
    return {"input_ids": ids, "attention_mask": mask}


# --- the built-in language_modeling task on raw Hugging Face models ---------------------------------


def test_language_modeling_takes_a_hf_models_outputs_as_they_are(model, hf):
    import torch

    lm = task()
    batch = torch.randint(0, VOCABULARY, (3, 17), generator=torch.Generator().manual_seed(1))  # text_files' windows
    with torch.no_grad():
        outputs = lm.forward(model, batch)
        assert isinstance(outputs, hf.utils.ModelOutput) and outputs.loss is None, "no labels reached the model"
        lm.check(outputs, batch)
        loss = lm.loss(outputs, batch)
        reference = model(input_ids=batch, labels=batch).loss  # the model's own shifted loss
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    metrics = evaluate_task(lm, [(outputs, batch)], LanguageModelingOptions())
    assert metrics["val/loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert lm.predict(outputs)["next_token"].shape == (3,)
    assert lm.count(batch) == 3 * 16
    continued = lm.generate(model, batch[:1, :4], max_new_tokens=3, context=16, temperature=0, generator=None)
    assert continued.shape == (1, 3)


def test_left_and_right_padding_give_the_loss_of_the_sequences_alone(model):
    import torch

    lm = task()
    with torch.no_grad():
        alone = [lm.loss(lm.forward(model, torch.tensor([s])), torch.tensor([s])) for s in SEQUENCES]
        expected = sum(loss.item() * (len(s) - 1) for loss, s in zip(alone, SEQUENCES, strict=True))
        expected /= sum(len(s) - 1 for s in SEQUENCES)
        for side in ("left", "right"):
            batch = padded(side)
            outputs = lm.forward(model, batch)
            lm.check(outputs, batch)
            assert lm.loss(outputs, batch).item() == pytest.approx(expected, rel=1e-5), side
            metrics = evaluate_task(lm, [(outputs, batch)], LanguageModelingOptions())
            assert metrics["val/loss"] == pytest.approx(expected, rel=1e-5), side


def test_the_mask_reaches_the_model_and_labels_ignore_index_are_left_out(model):
    import torch

    lm = task()
    batch = padded("left")
    seen = {}
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: seen.update(kwargs), with_kwargs=True)
    try:
        with torch.no_grad():
            outputs = lm.forward(model, batch)
    finally:
        hook.remove()
    assert torch.equal(seen["attention_mask"], batch["attention_mask"][:, :-1])
    positions = seen["position_ids"].tolist()
    assert positions[0] == [1, 1, 0, 1, 2, 3, 4, 5, 6], "counted from the first real token (padding: 1, as HF's)"
    assert positions[3][-1] == 0 and "labels" not in seen
    labels = batch["input_ids"].clone()
    labels[:, -1] = -100  # the last token of every sequence is not to be learned
    fewer = {**batch, "labels": labels}
    assert lm.evaluate(outputs, fewer)["tokens"].tolist() == [len(s) - 2 for s in SEQUENCES]


def test_padding_is_not_counted_as_tokens():
    import torch

    lm = task()
    real = sum(len(s) - 1 for s in SEQUENCES)
    assert lm.count(padded("left")) == lm.count(padded("right")) == real
    assert lm.count(padded("right")["input_ids"]) == 4 * 9, "a plain token batch counts its shape, as before"
    assert lm.count({"input_ids": padded("right")["input_ids"]}) == 4 * 9
    meta = {key: value.to("meta") for key, value in padded("left").items()}
    assert lm.count(meta) == 4 * 9, "FLOP counting on shapes only still counts"
    assert lm.evaluate(torch.zeros(4, 9, VOCABULARY), padded("left"))["tokens"].tolist() == [7, 2, 4, 1]


def test_a_model_that_takes_token_ids_positionally_still_gets_them_from_a_padded_batch():
    import torch

    from runjob_builtins.gpt import GPTOptions, build_gpt

    gpt = build_gpt(GPTOptions(context=16, layers=1, width=16, heads=2, vocab_size=VOCABULARY)).eval()
    lm, batch = task(), padded("right")
    with torch.no_grad(), pytest.warns(UserWarning, match="takes no attention_mask"):
        outputs = lm.forward(gpt, batch)
        plain = gpt(batch["input_ids"][:, :-1])
    assert torch.equal(outputs, plain)
    with torch.no_grad():
        alone = lm.loss(gpt(torch.tensor([SEQUENCES[1]])[:, :-1]), torch.tensor([SEQUENCES[1]]))
        only = padded("right", [SEQUENCES[1]])
        assert lm.loss(lm.forward(gpt, only), only).item() == pytest.approx(alone.item(), rel=1e-5)


# --- a real run: the models registered as they are, the built-in text dataset ---------------------

PLUGIN = (
    textwrap.dedent(inspect.getsource(tiny_lm))
    + """

from typing import Literal

import runjob


class TinyHFOptions(runjob.Options):
    arch: Literal["gpt2", "llama"] = "gpt2"
    vocab_size: int = 256
    context: int = 32


@runjob.hookimpl
def runjob_register_models(register):
    register("tiny_hf", lambda o: tiny_lm(o.arch, o.vocab_size, o.context), options=TinyHFOptions)


class LeftPadded:
    '''A tokenizer's dicts of 3 to 12 tokens counting 1, 2, .., 5, 1, .. from a varying start,
    left-padded with 0 to 12: only the mask keeps the padding out.'''

    def __init__(self, count, seed):
        self.count, self.seed = count, seed

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        import torch

        k = index * 7 + self.seed
        length, start = 3 + k % 10, k % 5
        ids, mask = torch.zeros(12, dtype=torch.long), torch.zeros(12, dtype=torch.long)
        ids[12 - length :] = (torch.arange(length) + start) % 5 + 1
        mask[12 - length :] = 1
        return {"input_ids": ids, "attention_mask": mask}


@runjob.hookimpl
def runjob_register_datasets(register):
    register("left_padded", lambda options: runjob.DatasetSplits(LeftPadded(320, 0), LeftPadded(64, 3), 6))
"""
)

JOB = """
    [job]
    name = "hf-{arch}"
    [task]
    name = "language_modeling"
    [model]
    name = "tiny_hf"
    arch = "{arch}"
    [dataset]
    name = "text_files"
    paths = "corpus/*.txt"
    context = 16
    val_fraction = 0.25
    [optimizer]
    lr = 0.01
    [train]
    batch_size = 8
    max_steps = 6
    log_every = 3
    eval_every = 6
    peak_tflops = 1.0
"""


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_raw_hf_model_trains_with_the_builtin_language_modeling_task(runjob_tester, hf, arch):
    corpus = runjob_tester.path / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"f{i}.txt").write_text(f"{i} the quick brown fox jumps over the lazy dog\n" * 8)
    runjob_tester.install_plugin("tiny-hf", {"tiny_hf": PLUGIN})
    runjob_tester.write_job("job.toml", JOB.format(arch=arch))
    run = runjob_tester.run("job.toml")
    assert run.exit_code == 0 and run.status == "FINISHED"
    [(_, first)], [(_, last)] = run.local_history("train/loss")[:1], run.local_history("train/loss")[-1:]
    assert last < first
    assert run.local_history("val/perplexity") and run.local_history("train/tokens_per_s")
    assert run.tags["runjob.flops_counted"] in ("meta", "forward x3") and float(run.tags["runjob.flops_per_token"]) > 0
    [(_, mfu), *_] = run.local_history("train/mfu")  # against train.peak_tflops, as on a known GPU
    assert 0 < mfu < 1
    result = runjob_tester.cli("predict", run.output_dir, "--prompt", "the quick", "--max-new-tokens", "4")
    assert result.returncode == 0, result.stderr


def test_a_raw_hf_model_learns_from_left_padded_tokenizer_batches(runjob_tester, hf):
    runjob_tester.install_plugin("tiny-hf", {"tiny_hf": PLUGIN})
    runjob_tester.write_job(
        "job.toml",
        """
        [job]
        name = "hf-padded"
        [task]
        name = "language_modeling"
        [model]
        name = "tiny_hf"
        arch = "gpt2"
        vocab_size = 8
        [dataset]
        name = "left_padded"
        [optimizer]
        lr = 0.02
        [train]
        batch_size = 16
        max_steps = 20
        log_every = 10
        peak_tflops = 1.0
        """,
    )
    run = runjob_tester.run("job.toml")
    assert run.status == "FINISHED"
    [(_, first), (_, last)] = run.local_history("train/loss")
    [(_, perplexity)] = run.local_history("val/perplexity")  # one epoch, evaluated once
    assert last < first and perplexity < 3, "5 choices (6 token ids): learning the counts"
    assert run.local_history("train/tokens_per_s")
    # transformers' mask code reads the mask's values, which the meta device cannot: one real forward is counted
    assert run.tags["runjob.flops_counted"] == "forward x3"
    mfu = run.local_history("train/mfu")
    assert mfu and all(0 < value < 1 for _, value in mfu)


# --- the contract: how a task calls a model, how it reads the outputs ------------------------------


class Plain(Task):
    def loss(self, outputs, batch): ...

    def evaluate(self, outputs, batch): ...

    def summarize(self, totals, count): ...


def test_a_dict_goes_in_as_the_keyword_arguments_the_forward_names():
    import torch

    class Keywords(torch.nn.Module):
        def forward(self, x, z=None):
            return ("keywords", z is not None)

    class Anything(torch.nn.Module):
        def forward(self, x, **kwargs):
            return ("keywords", sorted(kwargs))

    class Whole(torch.nn.Module):
        def forward(self, batch):
            return ("whole", sorted(batch))

    inputs = {"x": torch.ones(2), "z": torch.ones(2), "labels": torch.ones(2)}
    call = Plain().call_model
    assert call(Keywords(), inputs) == ("keywords", True), "labels, which forward does not name, left out"
    assert call(Keywords(), {"x": inputs["x"]}) == ("keywords", False)
    assert call(Anything(), inputs) == ("keywords", ["labels", "z"]), "**kwargs: every key"
    assert call(Whole(), inputs) == ("whole", ["labels", "x", "z"]), "no key named: the dict as one argument, as before"
    assert call(lambda x, z: ("keywords", True), inputs) == ("keywords", True), "a plain callable too"
    with pytest.raises(ValueError, match=r"the model's forward needs 'x', but the inputs hold only 'z'"):
        call(Keywords(), {"z": inputs["z"]})
    tensor = torch.ones(2, 3)
    assert call(lambda x: x, tensor) is tensor, "a tensor goes in positionally"


def test_the_forward_is_read_through_the_wrappers_a_run_adds():
    import torch

    class Inner(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None):
            return attention_mask

    class PassesOn(torch.nn.Module):  # what DistributedDataParallel and torch.compile look like
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    wrapped = PassesOn(Inner())
    mask = torch.ones(1, 2)
    assert takes_keyword(wrapped, "attention_mask") and not takes_keyword(wrapped, "labels")
    assert Plain().call_model(wrapped, {"input_ids": mask, "attention_mask": mask, "labels": mask}) is mask


def test_logits_are_read_from_a_tensor_a_dict_or_an_outputs_object():
    import torch

    logits = torch.zeros(2, 3)

    class Outputs:
        loss = torch.tensor(1.0)

        def __init__(self):
            self.logits = logits

    assert logits_of(logits) is logits_of({"logits": logits}) is logits_of(Outputs()) is logits
    assert Task.logits_of(Outputs()) is logits
    with pytest.raises(ValueError, match=r"outputs are a dict \(keys 'hidden'\): the task needs a tensor of logits"):
        logits_of({"hidden": logits})
    with pytest.raises(ValueError, match="outputs are a tuple"):
        logits_of((logits,))


def test_classification_and_regression_read_logits_from_outputs_objects_too():
    import torch

    class Outputs(dict):  # as a Hugging Face ModelOutput: a dict with attributes
        def __init__(self, logits):
            super().__init__(logits=logits)
            self.logits = logits

    logits, classes = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0])
    classification = Classification(ClassificationOptions(), 2)
    classification.check(Outputs(logits), (None, classes))
    assert classification.loss(Outputs(logits), (None, classes)) == classification.loss(logits, (None, classes))
    assert evaluate_task(classification, [(Outputs(logits), (None, classes))], ClassificationOptions())[
        "val/accuracy"
    ] == pytest.approx(0.5)
    assert classification.predict(Outputs(logits))["class"].tolist() == [0, 1]
    regression, values = Regression(RegressionOptions()), torch.tensor([[1.0], [2.0]])
    assert regression.loss(Outputs(values), (None, torch.tensor([1.0, 4.0]))).item() == pytest.approx(2.0)
    assert regression.predict({"logits": values})["value"].tolist() == [1.0, 2.0]
