"""The run's MLflow model is the model: it predicts from raw inputs what ``runjob predict``
predicts, with the dataset's fitted preprocessing and the task's output step inside it, rejects
inputs that do not fit its signature, and is served by MLflow's own scoring server from an
environment MLflow builds from the model alone (runjob travels in it as a wheel)."""

from __future__ import annotations

import base64
import csv
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from runjob.testing import free_port

DIABETES = """
    [job]
    name = "serve-diabetes"
    [task]
    name = "regression"
    [model]
    name = "mlp"
    in_features = 10
    hidden = [16]
    outputs = 1
    [dataset]
    name = "csv"
    path = "diabetes.csv"
    target = "target"
    [optimizer]
    name = "adamw"
    lr = 0.03
    [train]
    max_steps = 30
    batch_size = 32
"""

DIGITS = """
    [job]
    name = "serve-digits"
    [model]
    name = "resnet18"
    num_classes = 10
    [dataset]
    name = "digits"
    image_size = 8
    [train]
    max_steps = 6
    batch_size = 64
"""

GPT = """
    [job]
    name = "serve-gpt"
    [task]
    name = "language_modeling"
    [model]
    name = "gpt"
    context = 32
    layers = 1
    width = 32
    heads = 2
    [dataset]
    name = "text_files"
    paths = "{stdlib}/a*.py"
    context = 32
    max_bytes = 200_000
    val_fraction = 0.1
    [train]
    max_steps = 20
    batch_size = 16
"""


def _write_diabetes(path: Path, rows: int | None = None) -> list[dict[str, float]]:
    """scikit-learn's diabetes table as the README writes it (raw, unscaled features); the rows."""
    from sklearn.datasets import load_diabetes

    data = load_diabetes(scaled=False)
    names = [*data.feature_names, "target"]
    table = [dict(zip(names, [*x, y], strict=True)) for x, y in zip(data.data.tolist(), data.target, strict=True)]
    table = table[:rows] if rows else table
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    return table


def _model_uri(tester, run_id: str) -> str:
    """``runs:/ID/NAME`` of the run's logged model (MLflow 3: listed under the run's models)."""
    experiment = tester.client.get_run(run_id).info.experiment_id
    (model,) = [m for m in tester.client.search_logged_models([experiment]) if m.source_run_id == run_id]
    return f"runs:/{run_id}/{model.name}"


def _predict_rows(tester, run_id: str, *args: str) -> list[dict]:
    result = tester.cli("predict", run_id, *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_the_mlflow_model_predicts_raw_inputs_as_runjob_predict_does(runjob_tester, tmp_path):
    """In this process: raw diabetes rows (the model standardizes them as training did), and a
    DataFrame that does not fit the signature is refused with a message naming the columns."""
    import mlflow.pyfunc
    import pandas as pd

    rows = _write_diabetes(tmp_path / "diabetes.csv")
    runjob_tester.write_job("job.toml", DIABETES)
    run = runjob_tester.run("job.toml")
    assert run.status == "FINISHED"
    _write_diabetes(tmp_path / "new.csv", rows=5)

    expected = _predict_rows(runjob_tester, run.run_id, "--input", "new.csv")
    model = mlflow.pyfunc.load_model(_model_uri(runjob_tester, run.run_id))
    frame = pd.DataFrame(rows[:5]).drop(columns="target")
    got = model.predict(frame)
    assert list(got.columns) == ["value"]
    assert got["value"].tolist() == [row["value"] for row in expected]
    assert abs(got["value"][0] - rows[0]["target"]) < 200  # raw features: no 6444 from unscaled inputs

    schema = model.metadata.get_input_schema()
    assert schema.input_names() == list(frame.columns)
    with pytest.raises(Exception, match="bmi"):
        model.predict(frame.drop(columns="bmi"))


def _serve(tester, model_uri: str, env_root: Path, log: Path):
    """``mlflow models serve`` in its own process group, with the environment MLflow builds from the model."""
    port = free_port()
    env = {**tester.env(), "MLFLOW_ENV_ROOT": str(env_root)}
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "uv"]
        + ["-h", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    return process, f"http://127.0.0.1:{port}"


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _invoke(url: str, payload: dict, process: subprocess.Popen, log: Path, deadline: float) -> dict:
    """POST ``payload`` to the scoring server once it answers /ping (or fail with its log)."""
    while True:
        if process.poll() is not None:
            pytest.fail(f"mlflow models serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=2):
                break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow models serve did not answer in time:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)  # polling only: the deadline is the guard
    request = urllib.request.Request(
        f"{url}/invocations", json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        return {"status": error.code, **json.loads(error.read() or b"{}")}


def _assert_same_rows(expected: list[dict], served: list[dict], name: str) -> None:
    """The served rows are ``runjob predict``'s without its ``input`` column: strings equal, numbers
    equal up to float32 rounding (the server reads JSON; both ran the same batch)."""
    assert len(served) == len(expected), name
    for want, got in zip(expected, served, strict=True):
        want = {k: v for k, v in want.items() if k != "input"}
        assert set(got) == set(want), (name, got, want)
        for key, value in want.items():
            assert got[key] == (pytest.approx(value, rel=1e-6) if isinstance(value, float) else value), (name, key)


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_mlflow_scoring_server_answers_as_runjob_predict(runjob_tester, tmp_path):
    """digits (image files' bytes), diabetes (raw rows) and gpt (prompt text): MLflow's scoring
    server, in an environment built by MLflow from each logged model, returns what ``runjob
    predict`` writes. The model's requirements name runjob by a wheel inside the model."""
    import torch
    from PIL import Image

    from runjob_builtins.digits import digits_tensors

    _write_diabetes(tmp_path / "diabetes.csv")
    _write_diabetes(tmp_path / "new.csv", rows=4)
    images, _ = digits_tensors(8)  # four scans as PNG files, as `digits export` writes them
    (tmp_path / "some").mkdir()
    scans = [tmp_path / "some" / f"scan-{index}.png" for index in range(4)]
    for index, scan in enumerate(scans):
        Image.fromarray((images[index * 100, 0] * 255).round().to(torch.uint8).numpy(), mode="L").save(scan)
    cases = {}
    for name, job in (("diabetes", DIABETES), ("digits", DIGITS), ("gpt", GPT)):
        runjob_tester.write_job(f"{name}.toml", job)
        run = runjob_tester.run(f"{name}.toml")
        assert run.status == "FINISHED"
        cases[name] = run.run_id
    requirements = list((tmp_path / "runs").rglob("requirements.txt"))
    assert len(requirements) == 3
    assert all(
        any(line.startswith("wheels/runjob_train-") for line in path.read_text().splitlines()) for path in requirements
    )

    rows = {}
    with (tmp_path / "new.csv").open() as file:
        table = [{k: float(v) for k, v in row.items() if k != "target"} for row in csv.DictReader(file)]
    rows["diabetes"] = (
        _predict_rows(runjob_tester, cases["diabetes"], "--input", "new.csv"),
        {"dataframe_split": {"columns": list(table[0]), "data": [list(row.values()) for row in table]}},
    )
    rows["digits"] = (
        _predict_rows(runjob_tester, cases["digits"], "--input", "some"),
        {"dataframe_records": [{"image": base64.b64encode(scan.read_bytes()).decode()} for scan in scans]},
    )
    prompt = "def main():\n    "
    rows["gpt"] = (
        _predict_rows(runjob_tester, cases["gpt"], "--prompt", prompt, "--max-new-tokens", "24"),
        {"dataframe_records": [{"prompt": prompt}], "params": {"max_new_tokens": 24}},
    )

    # the first server builds the environment; the other two, started once it answers, reuse it
    servers, log = {}, tmp_path / "serve.log"
    try:
        for name in rows:
            process, url = servers[name] = _serve(
                runjob_tester, _model_uri(runjob_tester, cases[name]), tmp_path / "envs", log
            )
            if len(servers) == 1:
                _invoke(url, rows[name][1], process, log, time.monotonic() + 600)
        deadline = time.monotonic() + 300
        for name, (expected, payload) in rows.items():
            process, url = servers[name]
            answer = _invoke(url, payload, process, log, deadline)
            assert "predictions" in answer, answer
            _assert_same_rows(expected, answer["predictions"], name)
            wrong = _invoke(url, {"dataframe_records": [{"nothing": 1}]}, process, log, deadline)
            assert wrong.get("error_code") == "INVALID_PARAMETER_VALUE", wrong
    finally:
        for process, _ in servers.values():
            _stop(process)
    # one environment, built once from the model's files, served all three
    assert len([p for p in (tmp_path / "envs").iterdir() if p.is_dir()]) == 1
