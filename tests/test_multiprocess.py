"""Several processes on a CPU: torchrun workers train one job with DDP over gloo, never silently alone."""

from __future__ import annotations

import sys

import pytest

from conftest import clean_env, run_process_group, write_job
from test_training import SMALL_DIGITS, only_run

pytestmark = pytest.mark.timeout(300)


def test_torchrun_two_processes_make_one_ddp_run(tmp_path):
    write_job(tmp_path / "job.toml", SMALL_DIGITS.format(name="two"))
    env = clean_env(tmp_path)
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "runjob", "job.toml", "--set", "train.max_steps=4", "--set", "train.log_every=2", "--set", "train.batch_size=16",
    ]
    result = run_process_group(command, tmp_path, env, timeout=180)
    # About 1 run in 4 of a 2-process gloo job aborts at interpreter exit after the work is done
    # (shared/TRAPS.md); the record below must be complete either way, and a real failure fails it.
    assert result.returncode == 0 or "SIGABRT" in result.stderr, result.stderr[-3000:]
    assert "2 process(es) on cpu" in result.stdout
    client, run = only_run(tmp_path, "two")  # exactly one MLflow run: only rank 0 records
    assert run.info.status == "FINISHED"
    assert run.data.tags["runjob.distributed_type"] == "MULTI_CPU"
    assert run.data.tags["runjob.world_size"] == "2"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [2, 4]
    (out,) = (tmp_path / "runs" / "two").iterdir()
    assert (out / "model.safetensors").exists()
