"""Nothing silently missing from MLflow: a run killed (SIGKILL, its whole process group, the
recording process too) with metric points its recording process had not sent, then resumed, ends
with every point of ``metrics.jsonl`` in MLflow, without ``runjob sync``."""

from __future__ import annotations

import json

import pytest
from helpers import SMALL_DIGITS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# At step 2 the recording process is stopped (SIGSTOP: it takes nothing more to MLflow, so the
# points of the steps after it are certainly unsent), then at KILL_GROUP_AT the whole process group
# is killed: the run as a preempted machine or an OOM killer leaves it.
GROUP_KILLER = """
import os, signal
import psutil
import runjob


@runjob.hookimpl
def runjob_after_step(step):
    if "KILL_GROUP_AT" not in os.environ:
        return
    if step == 2:
        for child in psutil.Process().children():
            if "runjob.record.mirror" in " ".join(child.cmdline()):
                child.send_signal(signal.SIGSTOP)
    if step == int(os.environ["KILL_GROUP_AT"]):
        os.killpg(os.getpgid(0), signal.SIGKILL)
"""


def points_in_mlflow(client, run_id: str, keys: set[str]) -> set[tuple]:
    return {(m.key, m.step, m.timestamp, m.value) for key in keys for m in client.get_metric_history(run_id, key)}


def test_a_run_killed_with_unsent_points_and_resumed_has_every_point_in_mlflow_without_sync(tester):
    tester.install_plugin("group-killer", {"group_killer": GROUP_KILLER}, {"group_killer": "group_killer"})
    job = SMALL_DIGITS.format(name="caught") + "max_steps = 12\nlog_every = 1\ncheckpoint_every = 4\n"
    tester.write_job("job.toml", job)
    out = tester.path / "out"

    killed = tester.cli_subprocess("job.toml", "--output-dir", "out", env={"KILL_GROUP_AT": "9"}, timeout=240)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (out / "checkpoints" / "step-00000008").is_dir()
    run_id = tester.record("out").run_id

    def local() -> set[tuple]:
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return {(p["key"], p["step"], p["timestamp"], p["value"]) for p in map(json.loads, lines)}

    before = local()
    keys = {key for key, *_ in before}
    lost = before - points_in_mlflow(tester.client, run_id, keys)
    assert {step for key, step, *_ in lost if key == "train/loss"} >= set(range(3, 9)), (
        "the kill left points only the local record holds"
    )

    # as an earlier attempt that ended while the server was away would have noted it
    record = json.loads((out / "mlflow_run.json").read_text())
    (out / "mlflow_run.json").write_text(json.dumps({**record, "unsynced": "upload: server gone"}))

    resumed = tester.cli_subprocess("job.toml", "--output-dir", "out", "--resume", timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming step-00000008" in resumed.stdout and "runjob sync" not in resumed.stdout

    after = local()
    assert after > before, "the resumed run recorded its own steps"
    assert points_in_mlflow(tester.client, run_id, keys | {key for key, *_ in after}) >= after, (
        "every local point is in MLflow"
    )
    record = tester.record("out").record
    assert record["run_id"] == run_id and record["status"] == "FINISHED"
    assert "unsynced" not in record, "what was missing is sent: the record no longer says so"
