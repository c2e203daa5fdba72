"""Several processes on a CPU (gloo): one job, split data, identical weights, one MLflow run,
and a dead worker takes the whole job down. Every run here has a timeout and leaves no process."""

from __future__ import annotations

import json
import os
import re
import sys

import psutil
import pytest
from helpers import TINY_GPT, uploaded_best
from test_quiet import OWN_LINE, PROGRESS_BAR

from runjob.record import logfile
from runjob.testing import free_port, run_process_group

# Each run here starts real processes (gloo on the CPU); on a busy machine a run may take minutes.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
RUN_TIMEOUT = 300  # a job that waits forever for a dead worker (gloo's own timeout is 30 minutes) fails here

CHECK_PLUGIN = """
    import json, os
    import runjob
    from pydantic import Field

    def note(name, value):
        with open(os.path.join(os.environ["CHECK_DIR"], f"{name}-{os.environ.get('RANK', '0')}.jsonl"), "a") as f:
            f.write(json.dumps(value) + "\\n")

    class Indexed:
        \"\"\"Fixed random features; label = index % 4; every read of a training item is noted.\"\"\"
        def __init__(self, count, offset, split):
            import torch
            g = torch.Generator().manual_seed(123 + offset)
            self.x = torch.randn(count, 8, generator=g)
            self.split = split
        def __len__(self):
            return len(self.x)
        def __getitem__(self, i):
            if self.split == "train":
                note("seen", i)
            return self.x[i], i % 4

    class IndexedOptions(runjob.Options):
        train_size: int = Field(64, ge=1)
        val_size: int = Field(37, ge=1)

    def build_indexed(options):
        train, val = Indexed(options.train_size, 0, "train"), Indexed(options.val_size, 1, "val")
        return runjob.DatasetSplits(train, val, num_classes=4)

    def build_linear(options):
        import torch
        return torch.nn.Linear(8, 4)

    def build_indexed_images(options):
        \"\"\"The same data held in memory (runjob.ImageTensors of shape (N, 8, 1, 1)), batched by the host.\"\"\"
        import torch
        def split(count, offset):
            x = torch.randn(count, 8, generator=torch.Generator().manual_seed(123 + offset))
            return runjob.ImageTensors(x.view(count, 8, 1, 1), torch.arange(count) % 4, [0.0] * 8, [1.0] * 8)
        return runjob.DatasetSplits(split(options.train_size, 0), split(options.val_size, 1), num_classes=4)

    def build_probe(options):
        \"\"\"linear4 on flattened inputs, noting which training samples it is given (found by their features).\"\"\"
        import torch
        class Probe(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(8, 4)
                table = torch.randn(64, 8, generator=torch.Generator().manual_seed(123))
                self.index = {round(v, 5): i for i, v in enumerate(table[:, 0].tolist())}
            def forward(self, x):
                x = x.flatten(1)
                if self.training:
                    for v in x[:, 0].tolist():
                        note("seen", self.index[round(v, 5)])
                return self.linear(x)
        return Probe()

    @runjob.hookimpl
    def runjob_register_datasets(register):
        register("indexed", build_indexed, options=IndexedOptions)
        register("indexed_images", build_indexed_images, options=IndexedOptions)

    @runjob.hookimpl
    def runjob_register_models(register):
        register("linear4", build_linear)
        register("probe4", build_probe)

    @runjob.hookimpl
    def runjob_after_step(run, step):
        if os.environ.get("DIE_AT_STEP") == str(step) and os.environ.get("RANK") == "1":
            os.kill(os.getpid(), 9)

    @runjob.hookimpl
    def runjob_run_end(run, status):
        import torch
        model = run.accelerator.unwrap_model(run.model)
        note("params", torch.cat([p.detach().flatten() for p in model.parameters()]).tolist())
"""

LINEAR_JOB = """
    [job]
    name = "{name}"
    [model]
    name = "{model}"
    [dataset]
    name = "{dataset}"
    [optimizer]
    name = "sgd"
    lr = 0.5
    momentum = 0.0
    [train]
    epochs = 2
    log_every = 1
"""


@pytest.fixture
def checked(runjob_tester, monkeypatch):
    """``runjob_tester`` with the checking plugin installed; it notes into the test's folder."""
    runjob_tester.install_plugin("fake-ddpcheck", {"fake_ddpcheck": CHECK_PLUGIN}, {"ddpcheck": "fake_ddpcheck"})
    monkeypatch.setenv("CHECK_DIR", str(runjob_tester.path))
    return runjob_tester


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def processes_in(folder) -> list[str]:
    """Processes still running with ``folder`` as their working directory (the job's workers; not
    this process, which works in the test's folder too)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        if proc.info["cwd"] == str(folder) and proc.pid != os.getpid():
            found.append(" ".join(proc.info["cmdline"] or []))
    return found


def ok(result):
    # About 1 run in 4 of a 2-process gloo job aborts at interpreter exit after its work is done
    # (shared/TRAPS.md); the records checked after this must be complete either way.
    return result.returncode == 0 or "SIGABRT" in result.stderr


def linear_job(name: str, model: str = "linear4", dataset: str = "indexed") -> str:
    return LINEAR_JOB.format(name=name, model=model, dataset=dataset)


def noted(tmp_path, name: str) -> dict[int, list]:
    """What each rank noted as ``name`` (``seen``: the training samples; ``params``: the weights at
    its end); the files are removed, for the next run."""
    found = {rank: lines(tmp_path / f"{name}-{rank}.jsonl") for rank in (0, 1)}
    for rank in (0, 1):
        (tmp_path / f"{name}-{rank}.jsonl").unlink()
    return found


def assert_one_process_with_twice_the_batch_trains_the_same(checked, two: str, model: str, dataset: str) -> None:
    """The two-process run ``two`` (batch 8 a process, noted by the checking plugin) split each
    epoch's samples across the ranks, none seen twice, ended with identical parameters on both,
    equal to one process's with batch 16 (run here), and logged the same metrics."""
    tmp_path = checked.path
    seen, params = noted(tmp_path, "seen"), noted(tmp_path, "params")
    checked.write_job("one.toml", linear_job("one", model, dataset) + "batch_size = 16\n")
    one = checked.cli("one.toml", "--output-dir", "out-one")  # one process: this one
    assert one.returncode == 0, one.stderr[-3000:]

    # each epoch's samples are split across the ranks, none seen twice
    for epoch in (0, 1):
        part = [seen[rank][epoch * 32 : (epoch + 1) * 32] for rank in (0, 1)]
        assert len(part[0]) == len(part[1]) == 32
        assert sorted(part[0] + part[1]) == list(range(64))
    # parameters are identical on all ranks, and equal to one process with batch 2B
    assert params[0] == params[1]
    single = lines(tmp_path / "params-0.jsonl")[0]
    assert single == pytest.approx(params[0][0], abs=1e-5)

    run_two = checked.only_run(two)
    run_one = checked.only_run("one")  # and exactly one MLflow run each
    assert run_two.tags["runjob.distributed_type"] == "MULTI_CPU" and run_two.tags["runjob.world_size"] == "2"
    assert run_one.tags["runjob.distributed_type"] == "NO"
    for key in ("train/loss", "val/loss", "val/accuracy"):
        a, b = run_two.history(key), run_one.history(key)
        assert [s for s, _ in a] == [s for s, _ in b] and len(a) >= 2
        # the validation set (37 samples, not a multiple of 2 x batch) is counted exactly once
        assert [v for _, v in a] == pytest.approx([v for _, v in b], abs=1e-5), key


def test_two_processes_equal_one_process_with_twice_the_batch(checked):
    """A map-style dataset read through DataLoaders; the same for data held in memory (batched by
    the host) is test_processes_started_by_srun_find_each_other's."""
    checked.write_job("two.toml", linear_job("two") + "batch_size = 8\n")
    two = checked.cli_subprocess("two.toml", "--num-processes", "2", "--output-dir", "out-two", timeout=RUN_TIMEOUT)
    assert ok(two), two.stderr[-3000:]
    assert "2 process(es) on cpu" in two.stdout
    assert_one_process_with_twice_the_batch_trains_the_same(checked, "two", "linear4", "indexed")


GPT_JOB = (
    TINY_GPT
    + """
    [optimizer]
    name = "sgd"
    lr = 0.5
    momentum = 0.0
    [train]
    epochs = 2
    log_every = 1
    batch_size = {batch_size}
"""
)


def test_two_processes_equal_one_process_with_twice_the_batch_for_a_language_model(checked):
    """The same for next-token prediction: token windows from files, a GPT with tied weights, the
    per-token mean loss (each process averages over as many tokens, so the gradients' mean is one
    process's at twice the batch), and val/perplexity counted over every validation token once.
    The two-process run starts as from a user's shell, without OMP_NUM_THREADS: torchrun's banner
    about setting it goes to runjob.log, not the terminal (test_quiet.py's lines)."""
    tmp_path = checked.path
    for i in range(10):  # 10 x 130 bytes: 2 files (16 windows of 17 tokens) validate, 8 (64 windows) train
        (tmp_path / "corpus").mkdir(exist_ok=True)
        (tmp_path / "corpus" / f"{i}.txt").write_bytes((f"file {i}: the quick brown fox jumps. " * 5).encode()[:130])
    checked.write_job("two.toml", GPT_JOB.format(name="two", batch_size=8))
    checked.write_job("one.toml", GPT_JOB.format(name="one", batch_size=16))
    env = checked.env()
    env.pop("OMP_NUM_THREADS", None)  # as a user's shell has it: torchrun then chooses (1 a worker), and says so
    command = [sys.executable, "-m", "runjob", "two.toml", "--num-processes", "2", "--output-dir", "out-two"]
    two = run_process_group(command, tmp_path, env, timeout=RUN_TIMEOUT)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "2 process(es) on cpu" in two.stdout
    printed = [line for line in re.split(r"[\r\n]", two.stdout + two.stderr) if line.strip()]
    assert [line for line in printed if not (OWN_LINE.match(line) or PROGRESS_BAR.match(line))] == []
    assert "runjob: starting 2 worker(s) on machine 0 of 1 (torch.distributed.run, 1 thread each: set " in two.stderr
    kept = (tmp_path / "out-two" / logfile.LOG_FILE).read_text(encoding="utf-8")
    assert "launcher WARNING torch.distributed.run: " in kept and "Setting OMP_NUM_THREADS environment" in kept
    params = {rank: lines(tmp_path / f"params-{rank}.jsonl") for rank in (0, 1)}
    for rank in (0, 1):
        (tmp_path / f"params-{rank}.jsonl").unlink()

    one = checked.cli("one.toml", "--output-dir", "out-one")
    assert one.returncode == 0, one.stderr[-3000:]

    assert params[0] == params[1]
    single = lines(tmp_path / "params-0.jsonl")[0]
    assert single == pytest.approx(params[0][0], abs=1e-5)
    run_two, run_one = checked.only_run("two"), checked.only_run("one")
    assert run_two.tags["runjob.world_size"] == "2"
    for key in ("train/loss", "val/loss", "val/perplexity"):
        a, b = run_two.history(key), run_one.history(key)
        assert [s for s, _ in a] == [s for s, _ in b] and len(a) >= 2
        # perplexity is exp(loss): a loss equal to 1e-6 is a perplexity of 33 equal to 3e-5 (seen on
        # an AMD EPYC: 33.082560 vs 33.082545, 5e-7 apart relatively); the same relative bound
        assert [v for _, v in a] == pytest.approx([v for _, v in b], rel=1e-6, abs=1e-5), key


def test_two_simulated_machines_make_one_job(checked):
    tmp_path = checked.path
    checked.write_job("job.toml", linear_job("machines") + "batch_size = 8\n[tracking]\nsystem_metrics_interval = 10\n")
    port = str(free_port())
    common = [
        "--num-processes",
        "2",
        "--num-machines",
        "2",
        "--main-process-ip",
        "127.0.0.1",
        "--main-process-port",
        port,
    ]
    second = checked.popen("job.toml", *common, "--machine-rank", "1")  # killed after the test if still running
    first = checked.cli_subprocess("job.toml", *common, "--machine-rank", "0", timeout=RUN_TIMEOUT)
    _, err = second.communicate(timeout=RUN_TIMEOUT)
    assert ok(first), first.stderr[-3000:]
    assert second.returncode == 0 or "SIGABRT" in err, err[-3000:]
    run = checked.only_run("machines")
    assert run.status == "FINISHED"
    assert (run.tags["runjob.world_size"], run.tags["runjob.num_machines"]) == ("2", "2")
    assert lines(tmp_path / "params-0.jsonl") == lines(tmp_path / "params-1.jsonl")
    # each machine's system metrics reach the one run, named apart; training metrics come once
    assert {"system/node0/cpu_utilization_percentage", "system/node1/cpu_utilization_percentage"} <= set(run.metrics)
    steps = run.steps("train/loss")
    assert steps and len(steps) == len(set(steps)), steps


def test_a_dead_worker_stops_the_whole_job_which_then_resumes(checked):
    tmp_path = checked.path
    checked.write_job("job.toml", linear_job("dies") + "batch_size = 8\ncheckpoint_every = 1\n")
    # it must end, not wait for the dead worker (the call fails the test after RUN_TIMEOUT)
    result = checked.cli_subprocess(
        "job.toml", "--num-processes", "2", "--output-dir", "out", env={"DIE_AT_STEP": "3"}, timeout=RUN_TIMEOUT
    )
    assert result.returncode != 0
    assert "worker rank 1 exited with code 137 (SIGKILL)" in result.stderr
    assert processes_in(tmp_path) == [], "a worker outlived the job"
    run = checked.only_run("dies")
    assert run.status == "FAILED"
    assert run.tags["runjob.worker_failure"] == "worker rank 1 exited with code 137 (SIGKILL)"

    # resumed with two processes, it ends where an uninterrupted run does: one process with twice the
    # batch, which the first test shows is the same training (here, in this process)
    (tmp_path / "params-0.jsonl").unlink(missing_ok=True)
    resumed = checked.cli_subprocess(
        "job.toml", "--num-processes", "2", "--output-dir", "out", "--resume", timeout=RUN_TIMEOUT
    )
    assert ok(resumed), resumed.stderr[-3000:]
    assert "resuming step-00000002" in resumed.stdout
    after_resume = lines(tmp_path / "params-0.jsonl")[-1]
    (tmp_path / "params-0.jsonl").unlink()
    straight = checked.cli("job.toml", "--set", "train.batch_size=16", "--output-dir", "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert after_resume == pytest.approx(lines(tmp_path / "params-0.jsonl")[-1], abs=1e-6)


def test_processes_started_by_srun_find_each_other(checked):
    """srun starts one task per process and sets SLURM_* (not WORLD_SIZE); runjob adopts them. Its
    data is held in memory (runjob.ImageTensors, batched by the host, no DataLoader worker): the
    two tasks split it and train as one process with twice the batch does."""
    checked.write_job("job.toml", linear_job("srun", "probe4", "indexed_images") + "batch_size = 8\n")
    port = str(free_port())
    tasks = []
    for rank in (0, 1):
        slurm = {
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        tasks.append(checked.popen("job.toml", "--output-dir", "out", env=slurm))  # killed after the test if running
    results = [task.communicate(timeout=RUN_TIMEOUT) for task in tasks]
    for task, (_, err) in zip(tasks, results, strict=True):
        assert task.returncode == 0 or "SIGABRT" in err, err[-3000:]
    assert "2 process(es) on cpu" in results[0][0]
    assert_one_process_with_twice_the_batch_trains_the_same(checked, "srun", "probe4", "indexed_images")


STOPPER_PLUGIN = """
    import os
    import runjob


    class Stopper(runjob.Callback):
        \"\"\"Only the second process asks to stop (at step 5); every process logs a count.\"\"\"

        def __init__(self, options):
            self.steps = 0

        def on_step(self, run, step, epoch, loss):
            self.steps += 1
            run.log({"train/steps_seen": self.steps})
            if step == 5 and os.environ.get("RANK") == "1":
                run.request_stop("the second process saw step 5")

        def on_run_end(self, run, status, error):
            # each process notes the ema average it kept and the weights its model ends with
            import torch

            model = run.accelerator.unwrap_model(run.model)
            kept = {
                "average": run.callbacks["ema"].state_dict()["average"],
                "weights": {name: p.detach().cpu() for name, p in model.named_parameters()},
            }
            torch.save(kept, os.path.join(os.environ["CHECK_DIR"], f"ema-{os.environ['RANK']}.pt"))

        def state_dict(self):
            return {"steps": self.steps}

        def load_state_dict(self, state):
            self.steps = state["steps"]


    class StopperOptions(runjob.CallbackOptions):
        def metrics(self):
            return {"train/steps_seen": "max"}


    @runjob.hookimpl
    def runjob_register_callbacks(register):
        register("stopper", Stopper, options=StopperOptions)
"""


def test_one_process_asking_to_stop_stops_both_cleanly_with_the_ema_average(checked):
    checked.install_plugin("fake-stopper", {"fake_stopper": STOPPER_PLUGIN}, {"stopper": "fake_stopper"})
    job = linear_job("stopped").replace("log_every = 1", "log_every = 2").replace("epochs = 2", "epochs = 9")
    callbacks = "    [callbacks.stopper]\n    [callbacks.ema]\n    decay = 0.5\n"
    checked.write_job("job.toml", job + "    batch_size = 8\n" + callbacks)
    result = checked.cli_subprocess("job.toml", "--num-processes", "2", "--output-dir", "out", timeout=RUN_TIMEOUT)
    assert ok(result), result.stderr[-3000:]
    run = checked.only_run("stopped")
    assert run.status == "FINISHED"
    assert run.tags["runjob.stopped"] == "the second process saw step 5"
    assert run.tags["runjob.stopped.step"] == "6", "the processes agree at the next log step (every 2 steps)"
    assert run.history("train/steps_seen") == [(step, float(step)) for step in range(1, 7)], "the main process's"
    assert run.models() == {"stopped"} and run.artifacts("best") == uploaded_best(checked.path / "out")
    assert not processes_in(checked.path)
    # ema under DDP: both processes kept the same average, and the saved model is that average
    import torch
    from safetensors.torch import load_file

    first, second = (torch.load(checked.path / f"ema-{rank}.pt", weights_only=True) for rank in (0, 1))
    assert all(torch.equal(a, b) for a, b in zip(first["average"], second["average"], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(first["average"], first["weights"].values(), strict=True))
    saved = load_file(checked.path / "out" / "model.safetensors")
    assert saved.keys() == first["weights"].keys()
    assert all(torch.equal(saved[name], tensor) for name, tensor in first["weights"].items())
