"""The README's "Writing a callback" plugin, copied as a user would: it stops a run early with exit
0, the run ends FINISHED with its final and best model uploaded, and the metric it logs reaches
``metrics.jsonl`` and, after an offline run and ``runjob sync``, MLflow."""

from __future__ import annotations

import json

import pytest
from helpers import SMALL_DIGITS, documented_python, uploaded_best

pytestmark = pytest.mark.timeout(300)


def source_python(first_line: str) -> str:
    """The documentation's Python block that begins with ``first_line``: what users copy."""
    return documented_python(first_line)[1]


def test_the_readmes_callback_stops_the_run_and_logs_its_metric(tester):
    code = source_python("# my_callbacks/__init__.py\n")
    tester.install_plugin("my-callbacks", {"my_callbacks": code}, {"my_callbacks": "my_callbacks"})
    tester.write_job(
        "job.toml",
        SMALL_DIGITS.format(name="target")
        + """
    epochs = 6
    [tracking]
    offline = true
    [callbacks.target]
    target = 0.7
    times = 2
    """,
    )
    result = tester.cli("job.toml", "--output-dir", "out")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "runjob: stopping at step 132: target: val/accuracy reached 0.7" in result.stdout
    points = [json.loads(line) for line in (tester.path / "out" / "metrics.jsonl").read_text().splitlines()]
    gaps = [(p["step"], p["value"]) for p in points if p["key"] == "val/target_gap"]
    accuracy = [(p["step"], p["value"]) for p in points if p["key"] == "val/accuracy"]
    assert [step for step, _ in gaps] == [44, 88, 132], "0.7 reached at steps 88 and 132, not at 44"
    assert [value for _, value in gaps] == pytest.approx([max(0.7 - value, 0.0) for _, value in accuracy])
    assert gaps[0][1] > 0 and gaps[1][1] == gaps[2][1] == 0.0
    synced = tester.cli("sync", "out")
    assert synced.returncode == 0, synced.stderr[-2000:]
    run = tester.only_run("target")
    assert run.status == "FINISHED"
    assert run.tags["runjob.stopped"] == "target: val/accuracy reached 0.7 at 2 evaluations in a row"
    assert run.tags["runjob.stopped.step"] == "132", "three of six epochs"
    assert run.models() == {"target"} and run.artifacts("best") == uploaded_best(tester.path / "out")
    assert run.history("val/target_gap") == gaps
