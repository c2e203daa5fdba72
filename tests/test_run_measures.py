"""runjob's own loop features are callbacks on by default (best_weights, throughput, peak_memory):
each can be switched off per job, a third-party plugin can register one too, and throughput counts
training time only."""

from __future__ import annotations

import pytest
from helpers import SMALL_DIGITS

from runjob_builtins import run_measures

pytestmark = pytest.mark.timeout(300)

SIZER = '''
"""A third-party callback on in every job: it notes whether runjob's throughput was in the
metrics it was handed, and logs its own."""
import runjob
from pydantic import Field


class SizerOptions(runjob.CallbackOptions):
    scale: float = Field(1.0, gt=0)

    def metrics(self):
        return {"train/saw_rate": "max"}


class Sizer(runjob.Callback):
    def __init__(self, options):
        self.scale = options.scale

    def on_log(self, run, step, epoch, metrics):
        run.log({"train/saw_rate": self.scale * ("train/samples_per_s" in metrics)})


class NeedyOptions(runjob.CallbackOptions):
    level: int


@runjob.hookimpl
def runjob_register_callbacks(register):
    register("sizer", Sizer, options=SizerOptions, on_by_default=True)
'''


def test_on_by_default_callbacks_run_in_every_job_and_each_switches_off(tester):
    tester.install_plugin("sizer", {"sizer": SIZER}, {"sizer": "sizer"})
    job = SMALL_DIGITS.format(name="measured") + "epochs = 1\n"
    tester.write_job("job.toml", job)
    measured = tester.run("job.toml", output_dir="on")
    logs = measured.local_history("train/loss")
    assert logs and measured.local_history("train/saw_rate") == [(step, 1.0) for step, _ in logs], (
        "a plugin's default callback runs unlisted, after runjob's own: it saw the throughput at every log"
    )
    for key in ("train/samples_per_s", "train/tflops", "train/peak_rss_gib"):
        assert [step for step, _ in measured.local_history(key)] == [step for step, _ in logs], key
    assert all(value > 0 for _, value in measured.local_history("train/tflops"))
    assert float(measured.tags["runjob.flops_per_sample"]) > 0
    assert (measured.output_dir / "best" / "model.safetensors").is_file()
    assert measured.tags["runjob.best.metric"] == "val/accuracy"

    off = "".join(f"[callbacks.{name}]\nenabled = false\n" for name in ("best_weights", "throughput", "peak_memory"))
    tester.write_job("off.toml", job + off + "[callbacks.sizer]\nenabled = false\n")
    bare = tester.run("off.toml", output_dir="off")
    keys = {point["key"] for point in bare.points()}
    assert "train/loss" in keys and "val/accuracy" in keys
    assert not keys & {"train/samples_per_s", "train/tflops", "train/peak_rss_gib", "train/saw_rate"}
    assert not (bare.output_dir / "best").exists() and "runjob.best.metric" not in bare.tags
    check = tester.cli("validate", bare.output_dir / "job.toml")
    assert check.returncode == 0 and check.stdout.count("enabled = false") == 4, (
        "the run's job.toml keeps them off, so a rerun of it is the same run"
    )


def test_a_default_callback_whose_options_need_values_is_the_plugins_failure(tester):
    needy = SIZER.replace('"sizer", Sizer, options=SizerOptions', '"needy", Sizer, options=NeedyOptions')
    tester.install_plugin("needy", {"needy": needy}, {"needy": "needy"})
    listed = tester.cli("plugins")
    assert listed.returncode == 0
    assert (
        "FAILED: needy  (needy 1.0): TypeError: callback 'needy' is on by default, so every option needs a default; "
        "level has none"
    ) in listed.stdout.splitlines()
    tester.write_job("job.toml", SMALL_DIGITS.format(name="unharmed"))
    assert tester.cli("validate", "job.toml").returncode == 0, "jobs that don't need the plugin are not touched"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Counted:
    unit = "samples"

    def count(self, batch: list[int]) -> int:
        return len(batch)


class Logged:
    def __init__(self) -> None:
        self.values: list[dict[str, float]] = []

    def log(self, metrics: dict[str, float]) -> None:
        self.values.append(metrics)


def test_throughput_counts_training_time_only(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(run_measures.time, "perf_counter", clock)
    run = Logged()
    run.task = Counted()
    run.accelerator = type("Accelerator", (), {"num_processes": 2})()
    meter = run_measures.Throughput(run_measures.ThroughputOptions(flops=False))
    meter.on_epoch_start(run, 0, 0)
    for _ in range(3):
        clock.now += 1.0
        meter.on_batch(run, 0, 0, [0] * 8)
    meter.on_evaluation_start(run, 3, 0)
    clock.now += 100.0  # an evaluation: not training time
    meter.on_evaluation_end(run, 3, 0)
    clock.now += 1.0
    meter.on_log(run, 3, 0, {})
    assert run.values[-1] == {"train/samples_per_s": pytest.approx(3 * 8 * 2 / 4.0)}, "24 samples x 2 processes in 4 s"
    clock.now += 50.0  # the end of an epoch: saving a checkpoint, starting the loader again
    meter.on_epoch_start(run, 3, 1)
    clock.now += 2.0
    meter.on_batch(run, 3, 1, [0] * 8)
    meter.on_log(run, 4, 1, {})
    assert run.values[-1] == {"train/samples_per_s": pytest.approx(8 * 2 / 2.0)}, "each log starts a new window"
