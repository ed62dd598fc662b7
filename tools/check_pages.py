"""Open every page of a built book in headless Chromium, as a reader would, and report what is wrong.

    python tools/check_pages.py build/cpu/_build/html [--screenshots build/cpu/screenshots] [--jobs 2]

For every page, at 1300 px in light mode and, after a click on the theme's switch, in dark mode:

* no code block (``div.highlight pre``) is wider than its box;
* every image in the page body is loaded and at least 500 px wide as displayed, unless it sits in an
  element of class ``small-figure`` (a cell tagged ``small-figure``), and is shown large enough that
  the smallest text of a figure (``attnid.plotting.MIN_FONT_PT`` at ``DPI``) reads at 8 pt or more;
* no console errors and no request leaves the local server; no raw TeX, and every formula is MathML;
* every chapter (a page executed from a notebook) has a glued number before its first subsection;
* the page loads at most ``MAX_LOAD_MB`` as it opens (before a figure further down is scrolled to, or a script
  such as the counter page's Count fetches more), counted uncompressed.

At 390 px (a phone): the navigation opens, every image fits the screen, the page itself does not scroll
sideways (code blocks may), every other box that scrolls sideways shows that it does (``_static/attnid.js``'s
fading edge), and no box cuts its content off at the top or bottom (a superscript under ``overflow-y: hidden``).
Screenshots of every page go to ``--screenshots`` (light, dark, phone). Exit status 1 when anything is wrong.
``tests/test_book.py`` runs this on the smoke book.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse


def _figure_constants(names: tuple[str, ...] = ("DPI", "MIN_FONT_PT")) -> tuple:
    """How every figure of the book is drawn (``src/attnid/plotting.py``), read from its source: importing
    ``attnid`` loads torch, about 2.5 CPU-s in each of this tool's processes for two numbers."""
    import ast

    source = Path(__file__).resolve().parent.parent / "src" / "attnid" / "plotting.py"
    found = {
        t.id: ast.literal_eval(node.value)
        for node in ast.parse(source.read_text()).body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and t.id in names
    }
    return tuple(found[n] for n in names)


DPI, MIN_FONT_PT = _figure_constants()

CHROMIUM = os.environ.get("ATTNID_CHROMIUM") or "/usr/bin/chromium"  # the browser: GitHub's images carry Chrome
WIDE, PHONE = 1300, 390
PAGE_TIMEOUT_S = 30  # a page that has not loaded by then is reported, and the other pages are still checked
MIN_IMAGE_PX = 500
MAX_LOAD_MB = 1.5  # what a page may load as it opens, uncompressed (the pages weigh 0.74-0.94 MB)
# the bytes of the page and of everything it loaded so far (with no compression, as this check serves them)
LOADED_BYTES = """() => [...performance.getEntriesByType('navigation'), ...performance.getEntriesByType('resource')]
    .reduce((sum, e) => sum + (e.encodedBodySize || 0), 0)"""
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOAD_IMAGES = """async () => { await Promise.all([...document.images].map(img => {
    img.loading = 'eager'; return img.complete ? 0 : new Promise(r => { img.onload = img.onerror = r; });
})); }"""
MEASURE = (
    """() => {
  const body = document.querySelector('main article') || document.body;
  const pre = [...body.querySelectorAll('div.highlight pre')]
      .filter(p => p.offsetParent !== null && p.scrollWidth > p.clientWidth + 1)
      .map(p => `${p.scrollWidth}>${p.clientWidth}px: `
                + p.innerText.split('\\n').find(l => l.length > 0)?.slice(0, 60));
  const imgs = [...body.querySelectorAll('img')].filter(i => i.offsetParent !== null);
  const broken = imgs.filter(i => !(i.naturalWidth > 0)).map(i => i.src.split('/').pop());
  const narrow = imgs.filter(i => i.naturalWidth > 0 && !i.closest('.small-figure')
      && i.getBoundingClientRect().width < MIN).map(i => `${Math.round(i.getBoundingClientRect().width)}px`);
  // figures are drawn at DPI px per inch with text of at least FONT pt: shown at this width, in CSS pt
  const tiny = imgs.filter(i => i.naturalWidth > 0 && !i.closest('.small-figure')
      && i.getBoundingClientRect().width / i.naturalWidth * DPI / 96 * FONT < 8)
      .map(i => `${(i.getBoundingClientRect().width / i.naturalWidth * DPI / 96 * FONT).toFixed(1)} pt`);
  // math is MathML written at build time (book/_ext/mathml.py): a .math element without it is raw TeX
  const untypeset = [...document.querySelectorAll('.math')]
      .filter(e => !e.querySelector('math') || e.querySelector('merror')).length;
  const text = document.body.innerText;
  const first = body.querySelector('section');  // the title's section, up to its first subsection
  const glued = [];
  for (const child of (first ? first.children : [])) {
    if (child.tagName === 'SECTION') break;
    glued.push(...[...child.querySelectorAll('.pasted-text, .pasted-inline')].map(e => e.innerText));
  }
  return {pre, broken, narrow, tiny, untypeset, rawMath: ['$$', '\\\\[', '\\\\('].some(t => text.includes(t)),
          glued: glued.filter(t => /[0-9]/.test(t)),
          mode: document.documentElement.dataset.theme || document.documentElement.dataset.mode || '',
          docWidth: document.documentElement.scrollWidth,
          // a box that scrolls sideways with no cue that it does (_static/attnid.js: a .scroll-cue showing more),
          // and a box that cuts its content off at the top or bottom (a superscript under overflow-y: hidden)
          uncued: [...body.querySelectorAll('*')].filter(e => e.offsetParent !== null
              && ['auto', 'scroll'].includes(getComputedStyle(e).overflowX) && e.scrollWidth > e.clientWidth + 1
              && !e.matches('div.highlight pre, div.highlight, .highlight pre')
              && !(e.parentElement.classList.contains('scroll-cue')
                   && /more-(left|right)/.test(e.parentElement.className)))
              .map(e => `${e.tagName.toLowerCase()}.${[...e.classList].join('.')}: `
                        + e.innerText.trim().split('\\n')[0].slice(0, 40)),
          clipped: [...body.querySelectorAll('*')].filter(e => e.offsetParent !== null
              && ['hidden', 'clip'].includes(getComputedStyle(e).overflowY) && e.scrollHeight > e.clientHeight + 1
              && e.clientHeight > 0)
              .map(e => `${e.tagName.toLowerCase()}.${[...e.classList].join('.')}: `
                        + `${e.scrollHeight}>${e.clientHeight}px`),
          imgTooWide: imgs.filter(i => i.getBoundingClientRect().right > window.innerWidth + 1).length};
}""".replace("MIN", str(MIN_IMAGE_PX))
    .replace("DPI", str(DPI))
    .replace("FONT", str(MIN_FONT_PT))
)


def _serve(html: Path):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(html)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def pages_of(html: Path) -> list[str]:
    return sorted(
        p.relative_to(html).as_posix()
        for p in html.rglob("*.html")
        if "_static" not in p.parts and p.name not in ("search.html", "genindex.html")
    )


def check_book(
    html: Path,
    screenshots: Path | None = None,
    chromium: str = CHROMIUM,
    jobs: int = 1,
    timeout_s: float = PAGE_TIMEOUT_S,
) -> list[str]:
    """Every problem found, one line each (empty: the book reads well). ``jobs`` browsers share the pages; a
    page that does not load within ``timeout_s`` is one problem, and the others are still checked."""
    html = Path(html)
    if screenshots:
        screenshots.mkdir(parents=True, exist_ok=True)
    server, base = _serve(html)
    # the chapters: pages executed from a notebook (myst-nb keeps its source as .ipynb)
    chapters = {
        p.relative_to(html / "_sources").as_posix().removesuffix(".ipynb") for p in html.glob("_sources/**/*.ipynb")
    }
    # every page but index.html, a redirect to the first chapter
    pages = [(rel, rel.removesuffix(".html") in chapters) for rel in pages_of(html) if rel != "index.html"]
    n = max(1, min(jobs, len(pages)))
    shares = [pages[i::n] for i in range(n)]
    try:
        if len(shares) == 1:
            found = _check_pages(base, shares[0], screenshots, chromium, timeout_s)
        else:
            import multiprocessing

            with multiprocessing.get_context("spawn").Pool(len(shares)) as pool:
                parts = pool.starmap(
                    _check_pages, [(base, share, screenshots, chromium, timeout_s) for share in shares]
                )
            found = {rel: p for part in parts for rel, p in part.items()}
    finally:
        server.shutdown()
    return [line for rel, _ in pages for line in found[rel]]


class BrowserUnavailable(RuntimeError):
    """Chromium could not be started (missing, or refused by a memory cap): nothing can be checked."""


def _launch(pw, chromium: str):
    from playwright.sync_api import Error as PlaywrightError

    try:
        return pw.chromium.launch(executable_path=chromium, args=ARGS)
    except PlaywrightError as e:
        lines = [x.strip() for x in str(e).strip().splitlines() if x.strip() and not x.strip().startswith("=")]
        why = lines[0] if lines else "no message"
        raise BrowserUnavailable(f"Chromium ({chromium}) could not start: {why}") from None


def _start_quietly(manager):
    """``manager.start()`` with the driver's standard error (inherited when it is spawned) sent to a temporary file:
    a driver that dies under a memory cap prints a native backtrace of dozens of lines there, not on ours."""
    import os
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            return manager.start()
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _check_pages(
    base: str, pages: list[tuple[str, bool]], screenshots: Path | None, chromium: str, timeout_s: float
) -> dict:
    """``{page: problems}`` for ``pages`` (``(path, is_chapter)``), in one browser."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    found = {}
    try:
        pw = _start_quietly(sync_playwright())
    except Exception as e:  # the driver (a Node process) died at start: Playwright raises a bare Exception
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        raise BrowserUnavailable(
            f"the Playwright driver could not start ({lines[0] if lines else type(e).__name__}); a memory cap "
            "(ulimit -v) below about 2 GB stops it"
        ) from None
    try:
        browser = _launch(pw, chromium)
        for rel, chapter in pages:
            try:
                found[rel] = _check_page(browser, base, rel, screenshots, chapter, timeout_s)
                found[rel] += _check_phone(browser, base, rel, screenshots, timeout_s)
            except PlaywrightError as e:  # a page that never loads (a TimeoutError) or a crashed tab
                first = str(e).strip().splitlines()[0] if str(e).strip() else "no message"
                found[rel] = [f"{rel}: could not be checked ({type(e).__name__}: {first})"]
                browser.close()  # its stuck tab with it; the next pages get a fresh browser
                browser = _launch(pw, chromium)
        browser.close()
    finally:
        import contextlib

        with contextlib.suppress(Exception):  # a driver that died: nothing left to stop
            pw.stop()
    return found


def _open(browser, base: str, rel: str, width: int, mode: str, timeout_s: float = PAGE_TIMEOUT_S):
    ctx = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=mode)
    ctx.set_default_timeout(1000 * timeout_s)
    ctx.add_init_script(f"localStorage.setItem('mode', '{mode}'); localStorage.setItem('theme', '{mode}');")
    page = ctx.new_page()
    errors: list[str] = []
    outside: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def route(r):
        if urlparse(r.request.url).hostname == "127.0.0.1":
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(f"{base}/{rel}", wait_until="load")
    page.wait_for_load_state("networkidle")
    loaded = page.evaluate(LOADED_BYTES)
    page.evaluate(LOAD_IMAGES)
    return ctx, page, errors, outside, loaded


def _too_heavy(where: str, loaded: int) -> list[str]:
    if loaded <= MAX_LOAD_MB * 1e6:
        return []
    return [f"{where}: loads {loaded / 1e6:.2f} MB as it opens, over {MAX_LOAD_MB} MB"]


def _shot_name(rel: str, what: str) -> str:
    return rel.replace("/", "_").removesuffix(".html") + f"-{what}.png"


def _check_page(browser, base: str, rel: str, screenshots: Path | None, chapter: bool, timeout_s: float) -> list[str]:
    """The page at 1300 px as it opens (light mode, as set), then in dark mode after a click on the theme's
    switch: the same checks in both, the console errors and outside requests of each."""
    ctx, page, errors, outside, loaded = _open(browser, base, rel, WIDE, "light", timeout_s)
    out = _measured(page, rel, "light", errors, outside, chapter) + _too_heavy(f"{rel} ({WIDE} px)", loaded)
    if screenshots:
        page.screenshot(path=str(screenshots / _shot_name(rel, "light")), full_page=True)
    switch = page.locator(".theme-switch-button:visible").first
    if switch.count() == 0:
        out.append(f"{rel} ({WIDE} px): no theme switch")
    else:
        errors.clear()
        outside.clear()
        for _ in range(3):  # the switch cycles through light, dark and auto, in an order set by the system's
            switch.click(timeout=5000)
            if page.evaluate("document.documentElement.dataset.theme") == "dark":
                break  # (if it never turns dark, _measured says which mode it is in)
        out += _measured(page, rel, "dark", errors, outside, chapter)
        if screenshots:
            page.screenshot(path=str(screenshots / _shot_name(rel, "dark")), full_page=True)
    ctx.close()
    return out


def _measured(page, rel: str, mode: str, errors: list[str], outside: list[str], chapter: bool) -> list[str]:
    """What is wrong with the page as it is now, shown at 1300 px in ``mode``."""
    m = page.evaluate(MEASURE)
    out = []
    where = f"{rel} ({mode}, {WIDE} px)"
    if m["mode"] != mode:
        out.append(f"{where}: the page is in {m['mode']!r} mode, not {mode!r}")
    for what, bad in (
        ("code wider than its box", m["pre"]),
        ("broken images", m["broken"]),
        (f"images narrower than {MIN_IMAGE_PX} px", m["narrow"]),
        ("figures whose smallest text shows below 8 pt", m["tiny"]),
        ("console errors", errors),
        ("requests leaving 127.0.0.1", outside),
    ):
        if bad:
            out.append(f"{where}: {len(bad)} {what}: {bad[:3]}")
    if m["rawMath"] or m["untypeset"]:
        out.append(f"{where}: raw math left ({m['untypeset']} untypeset elements)")
    if chapter and not m["glued"] and mode == "light":
        out.append(f"{rel}: the first section has no glued number (an 'In this chapter' box)")
    return out


def _check_phone(browser, base: str, rel: str, screenshots: Path | None, timeout_s: float) -> list[str]:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    ctx, page, errors, _, loaded = _open(browser, base, rel, PHONE, "light", timeout_s)
    m = page.evaluate(MEASURE)
    where = f"{rel} ({PHONE} px)"
    out = _too_heavy(where, loaded)
    if m["docWidth"] > PHONE + 1:
        out.append(f"{where}: the page scrolls sideways ({m['docWidth']} px wide)")
    if m["imgTooWide"]:
        out.append(f"{where}: {m['imgTooWide']} images wider than the screen")
    if m["uncued"]:
        out.append(f"{where}: {len(m['uncued'])} boxes scroll sideways with no cue: {m['uncued'][:3]}")
    if m["clipped"]:
        out.append(f"{where}: {len(m['clipped'])} boxes cut off their content: {m['clipped'][:3]}")
    if screenshots:  # the page as a phone shows it, before the navigation is opened
        page.screenshot(path=str(screenshots / _shot_name(rel, "phone")))
    toggle = page.locator(".primary-toggle:visible").first
    if toggle.count() == 0:
        out.append(f"{where}: no navigation toggle")
    else:
        toggle.click(timeout=5000)
        try:  # the drawer slides in: wait until it is open, in view and holds the navigation
            page.wait_for_function(
                "() => { const n = document.querySelector('dialog[open] .bd-sidebar-primary, dialog[open]');"
                " if (!n) return false; const r = n.getBoundingClientRect();"
                " return r.left >= -1 && r.width > 150 && !!n.querySelector('nav a'); }",
                timeout=5000,
            )
        except PlaywrightTimeout:
            out.append(f"{where}: the navigation does not open")
        page.keyboard.press("Escape")
    if errors:
        out.append(f"{where}: console errors: {errors[:3]}")
    ctx.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("html", type=Path, help="the built book (…/_build/html)")
    ap.add_argument("--screenshots", type=Path, help="write a screenshot of every page here")
    ap.add_argument("--jobs", type=int, default=2, help="browsers that share the pages (default 2)")
    ap.add_argument("--chromium", default=CHROMIUM, help=f"the Chromium executable (default {CHROMIUM})")
    a = ap.parse_args()
    if a.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {a.jobs}")
    if not a.html.is_dir():
        ap.error(f"{a.html}: not a folder (give the built book, e.g. build/cpu/_build/html)")
    if not pages_of(a.html):
        ap.error(f"{a.html}: no pages to check (build the book first: make book)")
    if a.screenshots is not None and a.screenshots.exists() and not a.screenshots.is_dir():
        ap.error(f"--screenshots {a.screenshots}: exists and is not a folder")
    try:
        problems = check_book(a.html, a.screenshots, chromium=a.chromium, jobs=a.jobs)
    except BrowserUnavailable as e:
        import logging

        # the dead driver's pending futures are reported by asyncio when they are collected at exit: the one line
        # below says what happened
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        print(f"check_pages: error: {e}; no page was checked", file=sys.stderr)
        return 2
    print("\n".join(problems) if problems else f"{len(pages_of(a.html))} pages: no problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
