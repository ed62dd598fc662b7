"""The book's counter page (``counter.html``) driven in headless Chromium as a reader uses it: pick a file or a
preset, or paste a text, choose a scope, press Count, read what the page shows. ``tests/test_book.py`` checks its
numbers against ``attnid count --json``; ``tools/bench_count.py --browser`` times it.

    python tools/counter_page.py build/cpu/_build/html [--preset gpt2 | --config released/qwen3-8b.json] [--scope S]

prints the page's JSON (as ``attnid count --json`` would) or its refusal line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_pages import ARGS, CHROMIUM, _serve


@contextlib.contextmanager
def served(html: Path, chromium: str = CHROMIUM):
    """``(browser, base)``: the built site ``html`` served on 127.0.0.1 and a headless Chromium, both stopped on
    exit (what every reader of the counter page here needs: this tool, the benchmark, the tests)."""
    from playwright.sync_api import sync_playwright

    server, base = _serve(html)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=ARGS)
            try:
                yield browser, base
            finally:
                browser.close()
    finally:
        server.shutdown()


EMPTIED = "() => document.getElementById('counter-result').replaceChildren()"
ANSWERED = "() => document.getElementById('counter-result').children.length > 0"


class CounterPage:
    """One tab on the counter page of the site served at ``base``; console errors and any request that would leave
    127.0.0.1 (refused) are collected in ``errors`` and ``outside``."""

    def __init__(self, browser, base: str, timeout_s: float = 60.0):
        self.ctx = browser.new_context(viewport={"width": 1300, "height": 900})
        self.ctx.set_default_timeout(1000 * timeout_s)
        self.page = self.ctx.new_page()
        self.errors: list[str] = []
        self.outside: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.ctx.route("**/*", self._route)  # the context's: the worker's requests too
        self.page.goto(f"{base}/counter.html", wait_until="load")
        self.page.wait_for_function("() => document.getElementById('counter-pick').options.length > 1")

    def _route(self, r) -> None:
        if urlparse(r.request.url).hostname == "127.0.0.1":
            r.continue_()
        else:
            self.outside.append(r.request.url)
            r.abort()

    def pick(self, value: str) -> None:
        """Choose ``config:configs/NAME.json`` (its text fills the box) or ``preset:NAME``."""
        self.paste("")
        self.page.select_option("#counter-pick", value)
        if value.startswith("config:"):
            self.page.wait_for_function("() => document.getElementById('counter-text').value.length > 0")

    def open_file(self, path: Path) -> None:
        """Open ``path`` with the page's file button (its text fills the box; it is counted under its name)."""
        self.paste("")
        self.page.set_input_files("#counter-file", str(path))
        self.page.wait_for_function("() => document.getElementById('counter-text').value.length > 0")

    def paste(self, text: str) -> None:
        """Empty the box, then put ``text`` in it, each with the input event a reader's edit sends."""
        self.page.evaluate(
            "t => { const b = document.getElementById('counter-text');"
            " for (const v of ['', t]) { b.value = v; b.dispatchEvent(new Event('input')); } }",
            text,
        )

    def count(self, scope: str) -> dict:
        """Press Count at ``scope``: ``{"json": the page's --json output or None, "error": its refusal line or None,
        "total": the first table's last row, "seconds": from the press to the answer on the page}``."""
        self.page.check(f'input[name="counter-scope"][value="{scope}"]')
        self.page.evaluate(EMPTIED)
        t0 = time.perf_counter()
        self.page.click("#counter-run")
        self.page.wait_for_function(ANSWERED)
        seconds = time.perf_counter() - t0
        found = self.page.evaluate(
            """() => ({json: document.getElementById('counter-json')?.textContent ?? null,
                       error: document.getElementById('counter-error')?.textContent ?? null,
                       total: [...(document.querySelector('#counter-result table tbody tr:last-child')?.cells ?? [])]
                              .map(c => c.textContent)})"""
        )
        found["json"] = json.loads(found["json"]) if found["json"] is not None else None
        return {**found, "seconds": seconds}

    def close(self) -> None:
        self.ctx.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("html", type=Path, help="the built book (…/_build/html)")
    ap.add_argument("--preset", help="a preset's name")
    ap.add_argument("--config", help="a config the site ships, under data/configs (e.g. released/qwen3-8b.json)")
    ap.add_argument("--scope", default="attention", choices=("attention", "block", "model"))
    a = ap.parse_args()
    if (a.preset is None) == (a.config is None):
        ap.error("give --preset or --config")
    if not (a.html / "counter.html").is_file():
        ap.error(f"{a.html}: no counter.html (build the book first: make book)")
    with served(a.html) as (browser, base):
        page = CounterPage(browser, base)
        page.pick(f"preset:{a.preset}" if a.preset else f"config:configs/{a.config}")
        r = page.count(a.scope)
    print(json.dumps(r["json"], indent=2) if r["json"] is not None else r["error"])
    return 0 if r["json"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
