"""Remake the documentation's `mlflow ui` screenshots (docs/mlflow-*.png) from a real runjob sweep and runs.

Run by hand; nothing in the tests or the package uses it. It needs:

- Chromium at /usr/bin/chromium (Debian: `apt-get install -y chromium`);
- Playwright for Python, one of the project's dev dependencies (its own browser download is not
  used);
- Pillow (already in the environment through torchvision);
- runs of one experiment in an MLflow store: a sweep of three trials and two plain runs, made for
  example like this from the repository root (a few seconds each on a CPU; data/diabetes.csv
  written by the script in docs/getting-started.md):

    export MLFLOW_TRACKING_URI=sqlite:////tmp/shots/mlflow.db
    cat > /tmp/shots/sweep.toml <<'TOML'
    extends = "/path/to/runjob/jobs/diabetes.toml"
    [dataset]
    path = "/path/to/runjob/data/diabetes.csv"
    [sweep]
    method = "random"
    trials = 3
    seed = 3
    [sweep.parameters]
    "optimizer.lr" = { low = 0.003, high = 0.1, log = true }
    "train.batch_size" = [32, 64]
    TOML
    uv run runjob sweep /tmp/shots/sweep.toml --output-dir /tmp/shots/sweep
    uv run runjob jobs/diabetes.toml --set optimizer.lr=0.003 --output-dir /tmp/shots/run-a
    uv run runjob jobs/diabetes.toml --set optimizer.lr=0.01 --output-dir /tmp/shots/run-b
    uv run runjob runs      # the run ids

Then, from the repository root:

    uv run python docs/make_screenshots.py \\
        --tracking-uri sqlite:////tmp/shots/mlflow.db --page RUN_B TRIAL_1 TRIAL_2 TRIAL_3

starts `mlflow server` on a free local port for that store (or use `--ui-url URL` for a UI that is
already running), drives headless Chromium through the experiment's runs table (the sweep's
parent unfolded, the runs given ticked), the Compare view of those runs as it opens (the
parallel-coordinates plot with the metric MLflow chose for it, the run names), the charts of every
run of the experiment searched down to `val/`, and the `--page` run's own page (description,
logged model, params, tags), and writes docs/mlflow-runs-table.png, docs/mlflow-compare.png,
docs/mlflow-charts.png and docs/mlflow-run.png (`--out-dir` to write elsewhere). The server and
browser it started are stopped before it exits. Written against MLflow 3.17's UI; another version
may need its selectors adjusted.
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

from check_site import CHROMIUM_ARGS  # docs/check_site.py, beside this script: Chromium's flags offline

from runjob.testing import free_port

CHROMIUM = "/usr/bin/chromium"
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


def unfold(page, run_ids: list[str]) -> None:
    """Unfold the parent runs in the runs table (a sweep's) when the runs ``run_ids`` are folded
    away in them: the table remembers what was unfolded from one view to the next."""
    expanders = page.locator("button[data-component-id*='runnamecellrenderer']")
    # wait for the table's rows (slow on a busy machine) before deciding what to unfold
    page.locator(f"[role=row] a[href*='{run_ids[0]}']").or_(expanders).first.wait_for(timeout=90_000)
    page.wait_for_timeout(1000)
    if page.locator(f"[role=row] a[href*='{run_ids[0]}']").count():
        return
    for expander in expanders.all():
        expander.click()
    page.locator(f"[role=row] a[href*='{run_ids[0]}']").first.wait_for()


def take(ui_url: str, compared: list[str], page_run: str, experiment_id: str, out_dir: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    written = []
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        browser = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1600, "height": 1000},
        )
        try:
            page = browser.new_page()
            runs_page = f"{ui_url}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"

            # 1. The experiment's runs table as it opens, the sweep's parent unfolded, the compared
            # runs ticked: the Compare button appears.
            page.goto(runs_page)
            page.get_by_text("matching runs").wait_for(timeout=90_000)
            close_assistant(page)
            unfold(page, compared)
            rows = page.locator("[role=row]")
            for run_id in compared:  # a row's name links to the run's page, whose URL holds its id
                row = rows.filter(has=page.locator(f"a[href*='{run_id}']")).first
                row.locator("input.ag-checkbox-input").click()
            compare = page.get_by_role("button", name="Compare", exact=True)
            compare.wait_for()
            page.wait_for_timeout(1000)
            path = out_dir / "mlflow-runs-table.png"
            page.screenshot(path=path, clip={"x": 0, "y": 0, "width": 1600, "height": 460})
            written.append(path)

            # 2. Compare, as a person would: the view as it opens, nothing chosen by hand.
            compare.click()
            page.get_by_text(f"Comparing {len(compared)} Runs").wait_for(timeout=90_000)
            page.get_by_text("Parallel Coordinates Plot").first.wait_for(timeout=90_000)
            for run_id in compared:
                page.get_by_text(run_id, exact=True).first.wait_for()
            close_assistant(page)
            page.get_by_text("Model training", exact=True).click()  # the sidebar for training runs
            page.wait_for_timeout(3000)  # let the plot finish drawing
            path = out_dir / "mlflow-compare.png"
            page.screenshot(path=path, clip={"x": 0, "y": 0, "width": 1600, "height": 880})
            written.append(path)

            # 3. Every run's charts (the trials too), searched down to the val/ metrics; the sweep's
            # own sections (best/val/, sweep/val/, which sort first) folded away.
            page.goto(runs_page.replace("?", "?compareRunsMode=CHART&", 1))
            search = page.get_by_placeholder("Search metric charts")
            search.wait_for(timeout=90_000)
            close_assistant(page)
            unfold(page, compared)
            search.fill("val/")
            headers = page.get_by_test_id("experiment-view-compare-runs-section-header")
            headers.filter(has=page.get_by_text("val", exact=True)).wait_for()
            for name in ("best/val", "sweep/val"):
                folded = headers.filter(has=page.get_by_text(name, exact=True))
                if folded.count():
                    folded.click()
            page.wait_for_timeout(3000)  # let the plots finish drawing
            path = out_dir / "mlflow-charts.png"
            page.screenshot(path=path, clip={"x": 0, "y": 0, "width": 1600, "height": 700})
            written.append(path)

            # 4. One run's own page: its description (job.description), logged model, params and tags.
            page.goto(f"{ui_url}/#/experiments/{experiment_id}/runs/{page_run}")
            page.get_by_text("Logged models").first.wait_for(timeout=90_000)
            close_assistant(page)
            page.get_by_text("runjob.best.metric").first.wait_for(timeout=90_000)
            page.wait_for_timeout(1500)
            path = out_dir / "mlflow-run.png"
            page.screenshot(path=path, clip={"x": 0, "y": 0, "width": 1600, "height": 1000})
            written.append(path)
        finally:
            browser.close()
    for path in written:
        shrink(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN", help="the runs to tick and compare (a sweep's trials)")
    parser.add_argument("--page", required=True, metavar="RUN", help="the run whose own page is shown")
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
        experiments = {experiment_of(ui_url, run_id) for run_id in [*args.runs, args.page]}
        if len(experiments) != 1 or len(args.runs) < 2:
            raise SystemExit("make_screenshots: give two or more runs to compare, and --page, all of one experiment")
        args.out_dir.mkdir(parents=True, exist_ok=True)
        for path in take(ui_url, args.runs, args.page, experiments.pop(), args.out_dir):
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
