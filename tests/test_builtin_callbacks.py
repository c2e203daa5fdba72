"""The built-in callbacks beyond early stopping: ``ema`` (an average of the weights that is evaluated,
saved and resumed exactly) and ``profile`` (a torch.profiler trace of chosen steps)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch
from helpers import SMALL_DIGITS
from safetensors.torch import load_file

from runjob_builtins.callbacks import EmaOptions, ExponentialMovingAverage

pytestmark = pytest.mark.timeout(300)


def fake_run(model, distributed_type="NO"):
    """What ema reads of a run: the prepared model and an Accelerator's few answers; its line goes to print."""
    accelerator = SimpleNamespace(
        distributed_type=distributed_type,
        unwrap_model=lambda wrapped: wrapped,
        is_main_process=True,
        device=torch.device("cpu"),
    )
    return SimpleNamespace(accelerator=accelerator, model=model, callbacks={}, say=print)


def set_weights(model, value):
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(value)


def test_ema_average_is_the_hand_computed_one_and_is_swapped_for_evaluation():
    model = torch.nn.Linear(3, 2)
    run = fake_run(model)
    ema = ExponentialMovingAverage(EmaOptions(decay=0.5, warmup_steps=1))
    run.callbacks["ema"] = ema
    set_weights(model, 8.0)
    ema.on_run_start(run)
    expected = 8.0
    for step, weight in enumerate([4.0, 2.0, 10.0], start=1):
        set_weights(model, weight)  # what an optimizer step would have done
        ema.on_step(run, step, 0, torch.tensor(0.0))
        expected = weight if step <= 1 else 0.5 * expected + 0.5 * weight  # step 1 is warm-up: a copy
    assert expected == 6.5
    assert all(torch.equal(tensor, torch.full_like(tensor, 6.5)) for tensor in ema.average)

    ema.on_evaluation_start(run, 3, 0)
    assert all(torch.equal(p, torch.full_like(p, 6.5)) for p in model.parameters()), "evaluated: the average"
    ema.on_evaluation(run, 3, 0, {"val/loss": 1.0})
    assert model.weight[0, 0].item() == 6.5, "still averaged while the host saves best/"
    ema.on_evaluation_end(run, 3, 0)
    assert all(torch.equal(p, torch.full_like(p, 10.0)) for p in model.parameters()), "training weights back"

    resumed = ExponentialMovingAverage(EmaOptions(decay=0.5))
    resumed.load_state_dict(ema.state_dict())
    resumed.on_run_start(run)
    assert resumed.steps == 3 and all(torch.equal(a, b) for a, b in zip(resumed.average, ema.average, strict=True))

    ema.on_train_end(run, 3, 0)
    assert all(torch.equal(p, torch.full_like(p, 6.5)) for p in model.parameters()), "the average for good"


@pytest.mark.parametrize("kind", ["FSDP", "DEEPSPEED"])
def test_ema_refuses_sharded_strategies(kind):
    from accelerate.utils import DistributedType

    run = fake_run(torch.nn.Linear(3, 2), DistributedType[kind])
    with pytest.raises(ValueError, match=f"with strategy '{kind.lower()}' each process holds only a shard"):
        ExponentialMovingAverage(EmaOptions()).on_run_start(run)


def weights(path):
    return load_file(str(path))


def test_ema_evaluates_saves_and_picks_best_with_the_average_and_leaves_training_alone(tester):
    job = SMALL_DIGITS.format(name="ema") + "epochs = 2\nkeep_checkpoints = 2\n[tracking]\noffline = true\n"
    tester.write_job("plain.toml", job)
    tester.write_job("ema.toml", job + "[callbacks.ema]\ndecay = 0.9\n")
    plain = tester.run("plain.toml", output_dir="plain")
    averaged = tester.run("ema.toml", output_dir="ema")
    accuracy = averaged.local_history("val/accuracy")
    assert accuracy != plain.local_history("val/accuracy"), "evaluations saw other weights"
    print(f"val/accuracy: plain {plain.local_history('val/accuracy')}, ema {accuracy}")

    out = averaged.output_dir
    last = torch.load(out / "checkpoints" / "step-00000088" / "callbacks.pt", weights_only=True)["ema"]
    assert last["steps"] == 88
    final = weights(out / "model.safetensors")
    names = ["0.weight", "0.bias", "4.weight", "4.bias"]  # tiny_cnn's parameters, in the model's order
    assert all(torch.equal(final[name], tensor) for name, tensor in zip(names, last["average"], strict=True))
    trained = weights(plain.output_dir / "model.safetensors")
    assert all(not torch.equal(final[name], trained[name]) for name in names)
    # the checkpoint keeps the training weights: the same, bit for bit, as a run without ema
    checkpointed = weights(out / "checkpoints" / "step-00000088" / "model.safetensors")
    assert all(torch.equal(checkpointed[name], trained[name]) for name in names)
    # best/ holds the average evaluated at its step
    best = json.loads((out / "best" / "best.json").read_text())
    at_best = torch.load(out / "checkpoints" / f"step-{best['step']:08d}" / "callbacks.pt", weights_only=True)
    saved = weights(out / "best" / "model.safetensors")
    assert all(torch.equal(saved[n], t) for n, t in zip(names, at_best["ema"]["average"], strict=True))


def test_ema_with_early_stopping_stopped_and_resumed_ends_bit_identical(tester):
    job = (
        SMALL_DIGITS.format(name="resumed")
        + "epochs = 2\n[tracking]\noffline = true\n"
        + "[callbacks.ema]\ndecay = 0.8\nwarmup_steps = 10\n[callbacks.early_stopping]\npatience = 5\n"
    )
    tester.write_job("job.toml", job)
    stopped = tester.run("job.toml", "train.max_steps=60", output_dir="out")  # inside the second epoch
    assert (stopped.output_dir / "checkpoints" / "step-00000060").is_dir()
    resumed = tester.run("job.toml", output_dir="out", resume=True)
    assert resumed.status == "FINISHED"
    whole = tester.run("job.toml", output_dir="whole")
    assert (resumed.output_dir / "model.safetensors").read_bytes() == (
        whole.output_dir / "model.safetensors"
    ).read_bytes()


def test_profile_writes_a_trace_a_table_and_a_summary_line(tester):
    tester.write_job(
        "job.toml",
        SMALL_DIGITS.format(name="profiled")
        + "max_steps = 6\n[tracking]\noffline = true\n[callbacks.profile]\nstart_step = 2\nsteps = 3\n",
    )
    result = tester.cli("job.toml", "--output-dir", "out")
    assert result.returncode == 0, result.stderr[-2000:]
    folder = tester.path / "out" / "profile"
    trace = json.loads((folder / "trace.json").read_text())
    assert trace["traceEvents"]
    assert "aten::" in (folder / "top_operators.txt").read_text()
    [line] = [line for line in result.stdout.splitlines() if line.startswith("runjob: profile of")]
    shares = r"([^,]+ \d+%, ){4}[^,]+ \d+% \(trace in .*\)"  # names may hold spaces (autograd::engine::...: X)
    assert re.fullmatch(rf"runjob: profile of steps 2-4: top operators by self CPU time: {shares}", line)
