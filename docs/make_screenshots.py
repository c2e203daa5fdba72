"""Remake the README's `mlflow ui` screenshots (docs/mlflow-*.png) from two real runjob runs.

Run by hand; nothing in the tests or the package uses it. It needs:

- Chromium at /usr/bin/chromium (Debian: `apt-get install -y chromium`);
- Playwright for Python, brought in for this one command by `uv run --with playwright`, so it is
  not one of the project's dependencies (its own browser download is not used);
- Pillow (already in the environment through torchvision);
- two runs of one experiment in an MLflow store, made for example like this (about a minute or
  two each on a CPU):

    mkdir -p /tmp/shots && cd /tmp/shots
    export MLFLOW_TRACKING_URI=sqlite:////tmp/shots/mlflow.db
    uv run --project /path/to/runjob runjob /path/to/runjob/jobs/digits.toml \\
        --set optimizer.lr=0.003 --set train.epochs=2
    uv run --project /path/to/runjob runjob /path/to/runjob/jobs/digits.toml \\
        --set optimizer.lr=0.001 --set train.epochs=2
    uv run --project /path/to/runjob runjob runs      # the two run ids

Then, from the repository root:

    uv run --with playwright python docs/make_screenshots.py \\
        --tracking-uri sqlite:////tmp/shots/mlflow.db RUN_A RUN_B

starts `mlflow server` on a free local port for that store (or use `--ui-url URL` for a UI that is
already running), drives headless Chromium through the experiment's runs table (both runs ticked),
the Compare view (parameters with "Show diff only" on, all metrics) and the metric charts searched
down to val/accuracy and val/loss, and the first run's own page (description, logged model, tags),
and writes docs/mlflow-runs-table.png, docs/mlflow-compare.png, docs/mlflow-charts.png and
docs/mlflow-run.png (`--out-dir` to write elsewhere). The server and browser it started are
stopped before it exits. Written against MLflow 3.17's UI; another version may need its selectors
adjusted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from runjob.testing import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MAX_BYTES = 400_000


def wait_for_health(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"make_screenshots: {url}/health did not answer within {timeout:.0f} s")


def experiment_of(url: str, run_id: str) -> str:
    query = urllib.parse.urlencode({"run_id": run_id})
    with urllib.request.urlopen(f"{url}/api/2.0/mlflow/runs/get?{query}", timeout=30) as response:
        return json.load(response)["run"]["info"]["experiment_id"]


def shrink(path: Path) -> None:
    """Keep a PNG under MAX_BYTES: quantize to a palette, then scale down if still too big."""
    from PIL import Image

    if path.stat().st_size <= MAX_BYTES:
        return
    image = Image.open(path).convert("RGB")
    scale = 1.0
    while True:
        size = (round(image.width * scale), round(image.height * scale))
        small = image.resize(size, Image.LANCZOS) if scale < 1 else image
        small.quantize(colors=256, dither=Image.Dither.NONE).save(path, optimize=True)
        if path.stat().st_size <= MAX_BYTES or scale < 0.5:
            return
        scale *= 0.9


def close_assistant(page) -> None:
    """The MLflow Assistant side panel opens by itself in a fresh browser profile; close it."""
    close = page.get_by_role("button", name="Close", exact=True)
    if close.count() and close.first.is_visible():
        close.first.click()


def take(ui_url: str, run_a: str, run_b: str, experiment_id: str, out_dir: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    written = []
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        browser = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            args=CHROMIUM_FLAGS,
            headless=True,
            viewport={"width": 1600, "height": 1000},
        )
        try:
            page = browser.new_page()

            # 1. The experiment's runs table, filtered to the two runs, both ticked: the Compare
            # button appears.
            runs_filter = urllib.parse.quote(f"attributes.run_id IN ('{run_a}', '{run_b}')")
            page.goto(
                f"{ui_url}/#/experiments/{experiment_id}/runs?workflowType=machine_learning&searchFilter={runs_filter}"
            )
            page.wait_for_function("document.body.innerText.includes('2 matching runs')", timeout=90_000)
            close_assistant(page)
            page.locator("input[type=checkbox]:visible").first.click()  # the header's "select all"
            compare = page.get_by_role("button", name="Compare", exact=True)
            compare.wait_for()
            page.wait_for_timeout(1000)
            path = out_dir / "mlflow-runs-table.png"
            page.screenshot(path=path, clip={"x": 0, "y": 0, "width": 1600, "height": 330})
            written.append(path)

            # 2. Compare, as a person would; the view for these two runs only.
            compare.click()
            page.get_by_text("Comparing 2 Runs").wait_for(timeout=90_000)
            page.get_by_role("switch", name="Parameters - Show diff only").wait_for(timeout=90_000)
            for run_id in (run_a, run_b):
                page.get_by_text(run_id, exact=True).first.wait_for()
            close_assistant(page)
            page.get_by_text("Model training", exact=True).click()  # the sidebar for training runs
            page.get_by_text("Visualizations", exact=True).click()  # fold the plots away
            page.get_by_role("switch", name="Parameters - Show diff only").click()
            page.set_viewport_size({"width": 1600, "height": 1200})
            # The metrics table scrolls in a box of its own (system/... metrics first); it is left
            # at its top: scrolling it by script moved the values without the names column, so
            # val/... and train/... are shown by the charts below instead.
            page.get_by_text("val/loss", exact=True).first.wait_for()
            page.wait_for_timeout(1500)
            artifacts = page.get_by_text("Artifacts", exact=True).first.bounding_box()
            height = min(1200, round(artifacts["y"] + artifacts["height"] + 90))
            path = out_dir / "mlflow-compare.png"
            page.screenshot(path=path, clip={"x": 0, "y": 0, "width": 1600, "height": height})
            written.append(path)

            # 3. The runs' metric charts, searched down to val/accuracy and val/loss.
            page.set_viewport_size({"width": 1600, "height": 1000})
            page.goto(
                f"{ui_url}/#/experiments/{experiment_id}/runs"
                f"?workflowType=machine_learning&compareRunsMode=CHART&searchFilter={runs_filter}"
            )
            search = page.get_by_placeholder("Search metric charts")
            search.wait_for(timeout=90_000)
            close_assistant(page)
            search.fill("val/")
            page.get_by_text("val/accuracy", exact=True).first.wait_for()
            page.get_by_text("val/loss", exact=True).first.wait_for()
            page.wait_for_timeout(3000)  # let the plots finish drawing
            path = out_dir / "mlflow-charts.png"
            page.screenshot(path=path, clip={"x": 0, "y": 0, "width": 1600, "height": 640})
            written.append(path)

            # 4. The first run's own page: its description (job.description), its logged model
            # and runjob's tags.
            page.goto(f"{ui_url}/#/experiments/{experiment_id}/runs/{run_a}")
            page.get_by_text("Logged models").first.wait_for(timeout=90_000)
            close_assistant(page)
            page.get_by_text("runjob.best.metric").first.wait_for(timeout=90_000)
            page.wait_for_timeout(1500)
            path = out_dir / "mlflow-run.png"
            page.screenshot(path=path, clip={"x": 0, "y": 0, "width": 1600, "height": 900})
            written.append(path)
        finally:
            browser.close()
    for path in written:
        shrink(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--tracking-uri", help="store to serve with a temporary `mlflow server`")
    where.add_argument("--ui-url", help="an MLflow UI already running, e.g. http://127.0.0.1:5000")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()

    server = None
    if args.ui_url:
        ui_url = args.ui_url.rstrip("/")
    else:
        port = free_port()
        ui_url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--backend-store-uri",
                args.tracking_uri,
                "--workers",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: the server starts helper processes
        )
    try:
        wait_for_health(ui_url)
        experiment_a = experiment_of(ui_url, args.run_a)
        if experiment_of(ui_url, args.run_b) != experiment_a:
            raise SystemExit("make_screenshots: the two runs must belong to one experiment")
        args.out_dir.mkdir(parents=True, exist_ok=True)
        for path in take(ui_url, args.run_a, args.run_b, experiment_a, args.out_dir):
            print(f"{path}  {path.stat().st_size / 1000:.0f} kB")
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


if __name__ == "__main__":
    main()
