"""Lighthouse (mobile) on every page of a built book: performance, accessibility, best practices, SEO,
largest contentful paint and the bytes each page loads.

    npm install lighthouse@12          # once, anywhere; or put `lighthouse` on PATH
    python tools/page_weight.py build/cpu/_build/html [--lighthouse node_modules/.bin/lighthouse] [--json]

The book is served from this machine as GitHub Pages serves it: text (HTML, CSS, JavaScript, SVG, JSON)
gzip-compressed, fonts and images as they are; ``--plain`` serves every file uncompressed (what a host
without compression sends). Chromium is ``$CHROME_PATH`` or ``/usr/bin/chromium``.

Each page is audited ``--runs`` times (default 3) and the median of each number is shown (Lighthouse's scores
move by ±10 on a busy machine). Prints a Markdown table, one row per page, heaviest first; exit status 1 if a
page weighs more than ``--max-mb`` or scores below ``--min-performance`` (when given).
"""

from __future__ import annotations

import argparse
import functools
import gzip
import http.server
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

CATEGORIES = ("performance", "accessibility", "best-practices", "seo")


def pages_of(html: Path) -> list[str]:
    """Every page of the book, relative to ``html`` (the search page and generated indices aside)."""
    skip = {"search.html", "genindex.html"}
    return sorted(
        str(p.relative_to(html)) for p in html.rglob("*.html") if p.name not in skip and "_static" not in p.parts
    )


COMPRESSED = (".html", ".css", ".js", ".svg", ".json", ".txt", ".map")  # what GitHub Pages gzips


class Server(http.server.SimpleHTTPRequestHandler):
    """A static server that gzips text when the browser accepts it (``compress``), and logs nothing. It keeps
    connections open (HTTP/1.1), as a web host does: a new connection per file would cost every file a round
    trip that no reader pays."""

    protocol_version = "HTTP/1.1"

    def __init__(self, *args, compress: bool = True, **kwargs) -> None:
        self.compress = compress
        super().__init__(*args, **kwargs)

    def log_message(self, *args) -> None:  # one line per request would bury the results
        pass

    def send_head(self):
        path = Path(self.translate_path(self.path))
        if not (
            self.compress
            and path.is_file()
            and path.suffix in COMPRESSED
            and "gzip" in self.headers.get("Accept-Encoding", "")
        ):
            return super().send_head()
        body = gzip.compress(path.read_bytes())
        self.send_response(200)
        self.send_header("Content-Type", self.guess_type(str(path)))
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)


def audit(lighthouse: str, url: str) -> dict:
    """One Lighthouse mobile run of ``url``: the four category scores (0–100), LCP (s) and bytes loaded."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        cmd = [
            lighthouse,
            url,
            "--quiet",
            f"--only-categories={','.join(CATEGORIES)}",
            "--output=json",
            f"--output-path={out}",
            "--chrome-flags=--headless=new --no-sandbox --disable-gpu",
        ]
        env = {**os.environ, "CHROME_PATH": os.environ.get("CHROME_PATH", "/usr/bin/chromium")}
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode or not out.exists():
            raise RuntimeError(f"lighthouse failed on {url}: {r.stderr.strip()[-300:]}")
        report = json.loads(out.read_text())
    audits = report["audits"]
    return {
        **{c: round(100 * (report["categories"][c]["score"] or 0)) for c in CATEGORIES},
        "lcp_s": audits["largest-contentful-paint"]["numericValue"] / 1000,
        "bytes": int(audits["total-byte-weight"]["numericValue"]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("html", type=Path, help="the built book (…/_build/html)")
    ap.add_argument("--lighthouse", default="lighthouse", help="the lighthouse command (default: on PATH)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--plain", action="store_true", help="serve every file uncompressed")
    ap.add_argument("--runs", type=int, default=3, help="Lighthouse runs per page; the median is shown (default 3)")
    ap.add_argument("--max-mb", type=float, help="fail when a page loads more than this (MB)")
    ap.add_argument("--min-performance", type=int, help="fail when a page's performance score is lower")
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error(f"--runs {a.runs}: at least 1")
    if not (a.html / "index.html").is_file():
        ap.error(f"{a.html}: no index.html there; build the book first (make book)")
    if shutil.which(a.lighthouse) is None:
        ap.error(f"--lighthouse {a.lighthouse}: not found; `npm install lighthouse@12` and pass its path")

    handler = functools.partial(Server, directory=str(a.html), compress=not a.plain)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    rows = []
    try:
        for rel in pages_of(a.html):
            runs = [audit(a.lighthouse, f"{base}/{rel}") for _ in range(a.runs)]
            rows.append({"page": rel, **{k: statistics.median(r[k] for r in runs) for k in runs[0]}})
            print(f"{rel}: {rows[-1]}", file=sys.stderr)
    finally:
        server.shutdown()
    rows.sort(key=lambda r: -r["bytes"])
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print("| page | MB loaded | performance | LCP (s) | accessibility | best practices | SEO |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['page']} | {r['bytes'] / 1e6:.2f} | {r['performance']} | {r['lcp_s']:.1f} | "
                f"{r['accessibility']} | {r['best-practices']} | {r['seo']} |"
            )
    heavy = [r["page"] for r in rows if a.max_mb is not None and r["bytes"] > a.max_mb * 1e6]
    slow = [r["page"] for r in rows if a.min_performance is not None and r["performance"] < a.min_performance]
    for what, bad in (("heavier than --max-mb", heavy), ("below --min-performance", slow)):
        if bad:
            print(f"page_weight: {len(bad)} pages {what}: {', '.join(bad)}", file=sys.stderr)
    return 1 if heavy or slow else 0


if __name__ == "__main__":
    sys.exit(main())
