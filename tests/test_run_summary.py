"""A run you can read at a glance: its last lines say how it ended, where its models are and how to
look at it; in MLflow its name tells it from its siblings and its description is the job's."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import SMALL_DIGITS

pytestmark = pytest.mark.timeout(300)


def test_the_run_ends_with_a_summary_and_is_named_and_described_in_mlflow(tester):
    job = SMALL_DIGITS.format(name="glance").replace(
        '[job]\n    name = "glance"', '[job]\n    name = "glance"\n    description = "a tiny CNN on the digits"'
    )
    tester.write_job("job.toml", job + "epochs = 2\n")
    result = tester.cli("job.toml", "--output-dir", "out", "--set", "optimizer.lr=0.003")
    assert result.returncode == 0, result.stderr[-2000:]
    run = tester.only_run("glance")
    out = Path("out")  # as given on the command line
    best = run.tags["runjob.best.value"], run.tags["runjob.best.step"]
    finished, models, where = result.stdout.splitlines()[-3:]
    accuracy = run.metrics["val/accuracy"]
    assert finished.startswith("runjob: finished glance in ") and finished.endswith(
        f"(88 steps): val/accuracy {accuracy:.4g}"
    )
    assert models == (
        f"runjob: models: final {out / 'model.safetensors'}; best (val/accuracy {float(best[0]):.4g} at step "
        f"{best[1]}) {out / 'best' / 'model.safetensors'}"
    )
    assert where.startswith(
        f"runjob: MLflow run {run.run_id} (glance); its model: runs:/{run.run_id}/glance; look at it: runjob runs "
        "--experiment glance"
    )
    assert run.run_name == "lr=0.003 · glance", "the overrides tell it from the job's other runs"
    assert run.tags["mlflow.note.content"] == "a tiny CNN on the digits"

    offline = tester.cli(
        "job.toml", "--output-dir", "off", "--set", "tracking.offline=true", "--set", "train.max_steps=3"
    )
    assert offline.returncode == 0, offline.stderr[-2000:]
    assert offline.stdout.splitlines()[-1] == (
        "runjob: recorded offline in off: `runjob sync off` uploads it to MLflow"
    )
