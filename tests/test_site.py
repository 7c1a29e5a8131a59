"""The documentation site fits a 1280 px window: built with mkdocs, opened in headless Chromium (the
system's, driven by Playwright), no page's content is wider than its column, nothing scrolls
sideways (code blocks, tables), and every image loads. Screenshots of every page checked are kept
in a temporary folder (printed; ``SHMVEC_SCREENSHOTS=DIR`` chooses it) for a person to look at.

Needs the ``docs`` extra, ``pip install playwright`` and a Chromium (Debian: ``apt-get install
chromium``; Playwright's own browser download is not used). In CI (``CI`` set) a missing piece is a
failure, elsewhere a skip.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT, require

WIDTH, HEIGHT = 1280, 900
PAGES = [
    "",
    "getting-started/",
    "guides/choosing/",
    "guides/policy-loop/",
    "guides/gymnasium/",
    "guides/codecs/",
    "guides/ray/",
    "guides/testing/",
    "benchmarks/",
    "learning-curve/",
    "api/",
    "development/",
]
# Chromium as root in a container, with nothing reaching out to the network (it has none).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Everything in the page's article that is wider than the article, or scrolls sideways inside
# itself (a code block or table cut at the column's edge), and every image that did not load.
FIND_PROBLEMS = """() => {
  const problems = [];
  const article = document.querySelector("article");
  // The column: tables' scroll wrappers reach into the article's padding by design.
  const right = document.querySelector(".md-content").getBoundingClientRect().right + 1;
  const name = (el) => {
    const text = (el.innerText || el.getAttribute("src") || "").trim().split("\\n")[0];
    return `${el.tagName.toLowerCase()} "${text.slice(0, 60)}"`;
  };
  for (const el of article.querySelectorAll("pre, pre > code, table, .md-typeset__scrollwrap, img, p, li")) {
    if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== "visible") {
      problems.push(`${name(el)} scrolls sideways: ${el.scrollWidth} px of content in ${el.clientWidth} px`);
    } else if (el.getBoundingClientRect().right > right) {
      problems.push(`${name(el)} reaches ${Math.round(el.getBoundingClientRect().right)} px, past the column's ${Math.round(right)} px`);
    }
  }
  for (const img of article.querySelectorAll("img")) {
    if (!img.complete || img.naturalWidth === 0) problems.push(`image ${img.getAttribute("src")} did not load`);
  }
  if (document.documentElement.scrollWidth > window.innerWidth) {
    problems.push(`the page is ${document.documentElement.scrollWidth} px wide in a ${window.innerWidth} px window`);
  }
  return problems;
}"""


def chromium() -> str:
    found = os.environ.get("SHMVEC_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "no Chromium (apt-get install chromium, or SHMVEC_CHROMIUM=/path/to/chrome)"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    return found


def build_site(source: Path, site: Path) -> None:
    """``mkdocs build --strict`` of the tree at ``source`` into ``site``."""
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=source,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # one line per request otherwise
        pass


@pytest.fixture(scope="module")
def site_url() -> Iterator[str]:
    require("mkdocs", "the docs extra")
    site = Path(tempfile.mkdtemp(prefix="shmvec-site-"))
    build_site(ROOT, site)
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(site, ignore_errors=True)


def page_problems(base_url: str, pages: list[str], shots: Path) -> dict[str, list[str]]:
    """Open each page at 1280 px; its problems (see :data:`FIND_PROBLEMS`), and a full-page
    screenshot of it in ``shots``."""
    sync_api = require("playwright.sync_api", "pip install playwright")
    found: dict[str, list[str]] = {}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            for path in pages:
                response = page.goto(base_url + path, wait_until="load")
                if response is None or response.status != 200:
                    found[path or "index"] = [f"HTTP {response.status if response else 'no response'}"]
                    continue
                found[path or "index"] = page.evaluate(FIND_PROBLEMS)
                shot = shots / f"{(path.strip('/') or 'index').replace('/', '_')}.png"
                page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    return found


@pytest.mark.slow
def test_every_key_page_fits_1280_px(site_url):
    shots = Path(os.environ.get("SHMVEC_SCREENSHOTS") or tempfile.mkdtemp(prefix="shmvec-screenshots-"))
    shots.mkdir(parents=True, exist_ok=True)
    print(f"screenshots: {shots}")
    found = page_problems(site_url, PAGES, shots)
    bad = {page: problems for page, problems in found.items() if problems}
    assert not bad, f"pages that do not fit {WIDTH} px (screenshots in {shots}):\n" + "\n".join(
        f"{page}:\n  " + "\n  ".join(problems) for page, problems in bad.items()
    )
    assert len(list(shots.glob("*.png"))) == len(PAGES)
