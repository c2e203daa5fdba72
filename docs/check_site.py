"""The built site as a reader sees it: served on 127.0.0.1 and opened in headless Chromium.

    uv run mkdocs build --strict --site-dir /tmp/site
    uv run python docs/check_site.py /tmp/site                          # what .ci/run does
    uv run python docs/check_site.py /tmp/site --screenshots docs/screenshots   # remake the committed ones

Checks, each failing with one line that says what the reader would have seen instead:

- the home page: its title, its heading, and the navigation's sections;
- the job-file reference: the ``[train]`` table with ``gradient_accumulation_steps``, its type,
  default and meaning, reached from the navigation;
- the search box: typing "gradient accumulation" lists the job reference's ``[train]`` section,
  the key in its excerpt.

Chromium is Debian's (``apt-get install chromium``; ``CHROMIUM`` names another), driven by Playwright
(a dev dependency; its own browser download is not used). A screenshot of each page is written to
``--screenshots`` (by default a temporary folder, printed).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from playwright.sync_api import Page, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

# Chromium on a machine without internet: no background connections, no first-run dialogs (the
# machine refuses the connections, many at a time, otherwise)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SEARCH = "gradient accumulation"
KEY = "gradient_accumulation_steps"


class CheckFailed(Exception):
    """What the reader would have seen instead: one line."""


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass


@contextmanager
def served(site: Path) -> Iterator[str]:
    """The site on a free port of 127.0.0.1 until the block ends; its address."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def check(condition: bool, what: str) -> None:
    if not condition:
        raise CheckFailed(what)


def home_page(page: Page, address: str, shots: Path) -> None:
    page.goto(f"{address}/")
    check("runjob" in page.title(), f"home page: title {page.title()!r}, not runjob's")
    heading = page.locator("article h1").first.inner_text()
    check(heading.strip().startswith("runjob"), f"home page: first heading {heading!r}")
    sections = page.locator("nav.md-nav--primary").inner_text()
    for section in ("Getting started", "How-to guides", "Concepts", "Writing plugins", "Reference", "Benchmarks"):
        check(section in sections, f"home page: the navigation has no {section!r} (it has: {sections[:300]!r})")
    page.screenshot(path=shots / "home.png", full_page=False)


def job_reference(page: Page, address: str, shots: Path) -> None:
    page.goto(f"{address}/")
    page.locator("nav.md-nav--primary").get_by_role("link", name="Job file", exact=True).first.click()
    page.wait_for_url("**/reference/job-file/")
    row = page.locator(f"tr:has(td:first-child code:text-is('{KEY}'))").first
    check(row.count() == 1, f"job reference: no row for {KEY}")
    cells = row.inner_text()
    check("integer" in cells and "1" in cells, f"job reference: {KEY}'s row lacks its type or default: {cells!r}")
    check("Gradient accumulation" in cells, f"job reference: {KEY}'s row lacks its meaning: {cells!r}")
    page.evaluate("element => element.scrollIntoView({block: 'center'})", row.element_handle())
    page.wait_for_timeout(500)  # the header's title settles after a scroll
    page.screenshot(path=shots / "job-reference.png", full_page=False)


def search_box(page: Page, address: str, shots: Path) -> None:
    page.goto(f"{address}/")
    box = page.locator("input.md-search__input")
    box.click()
    box.press_sequentially(SEARCH, delay=20)  # typed, as a reader types: the results follow each key
    results = page.locator("li.md-search-result__item")
    try:
        results.first.wait_for(timeout=15_000)
    except PlaywrightTimeout:
        meta = page.locator(".md-search-result__meta").inner_text()
        raise CheckFailed(f"search {SEARCH!r}: no results within 15 s ({meta!r})") from None
    found = [
        (link.get_attribute("href") or "", link.inner_text())
        for link in page.locator("li.md-search-result__item a.md-search-result__link").all()
    ]
    hits = [href for href, text in found if "reference/job-file/" in href and KEY in text]
    check(bool(hits), f"search {SEARCH!r}: no result in the job reference naming {KEY}: {[h for h, _ in found]}")
    page.screenshot(path=shots / "search.png", full_page=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Open the built site in headless Chromium and check it.")
    parser.add_argument("site", type=Path, help="the built site (mkdocs build --site-dir)")
    parser.add_argument("--screenshots", type=Path, help="where the screenshots go (default: a temporary folder)")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(f"check_site: {args.site}: no index.html (build the site first: mkdocs build)", file=sys.stderr)
        return 2
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium")
    if chromium is None:
        print("check_site: no chromium on PATH (Debian: apt-get install chromium; or set CHROMIUM)", file=sys.stderr)
        return 2
    shots = args.screenshots or Path(tempfile.mkdtemp(prefix="runjob-site-"))
    shots.mkdir(parents=True, exist_ok=True)
    with served(args.site) as address, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(15_000)
            for name, step in (("home page", home_page), ("job reference", job_reference), ("search", search_box)):
                try:
                    step(page, address, shots)
                except CheckFailed as failed:
                    print(f"check_site: {failed}", file=sys.stderr)
                    return 1
                except PlaywrightTimeout as timeout:
                    print(f"check_site: {name}: {str(timeout).splitlines()[0]}", file=sys.stderr)
                    return 1
                print(f"check_site: {name}: ok")
        finally:
            browser.close()
    print(f"check_site: screenshots in {shots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
