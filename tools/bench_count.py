"""The counter's speed and size: wall time of ``attnid count`` (a preset, and a released ``config.json`` at scope
model), median of ``--runs`` after one warm-up run, for each ``attnid`` executable given; with ``--install``, the core
wheel is built, installed into a fresh virtual environment (its time and size on disk measured) and timed beside the
others; with ``--browser HTML``, the book's counter page (``counter.html`` of a built book) is timed in headless
Chromium, from the press of Count to the first table, cold (a fresh browser context: Pyodide and attnid's sources
loaded from the site, served from this machine) and warm (a second Count on the same page), median of ``--runs``.
``make bench-count`` runs it. Goals (2 cores): each count <= 0.3 s, the core install <= 10 s and <= 20 MB, the page's
first count <= 10 s cold and <= 1 s warm."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import check_release  # tools/, beside this script

ROOT = Path(__file__).resolve().parents[1]
RELEASED = ROOT / "data" / "configs" / "released" / "llama-3.1-8b.json"
COMMANDS = {
    "count --preset llama-2-7b --scope model": ["count", "--preset", "llama-2-7b", "--scope", "model"],
    f"count --config {RELEASED.name} --scope model": ["count", "--config", str(RELEASED), "--scope", "model"],
}


def wall_times(attnid: str, args: list[str], runs: int) -> list[float]:
    """Seconds of ``attnid args`` run ``runs`` times after one warm-up run (its caches warm); a failure raises."""
    subprocess.run([attnid, *args], check=True, capture_output=True)
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([attnid, *args], check=True, capture_output=True)
        out.append(time.perf_counter() - t)
    return out


def core_install(workdir: Path) -> dict:
    """The wheel built and installed into a fresh virtual environment (no torch): seconds and bytes of that install
    (:mod:`check_release`), and the path of its ``attnid``."""
    wheel, _ = check_release.build(workdir / "dist")
    got = check_release.install_fresh(wheel, workdir / "venv")
    torch_there = subprocess.run([str(workdir / "venv" / "bin" / "python"), "-c", "import torch"], capture_output=True)
    return {**got, "wheel": wheel.name, "torch_installed": torch_there.returncode == 0}


def page_times(html: Path, runs: int) -> dict:
    """Seconds from Count to the page's first table (:mod:`counter_page`): ``runs`` cold counts, each in a fresh
    browser context (no cache, a new worker that loads Pyodide), each followed by a warm one on the same page."""
    from counter_page import CounterPage, served

    cold: list[float] = []
    warm: list[float] = []
    with served(html) as (browser, base):
        for _ in range(runs):
            page = CounterPage(browser, base)
            page.pick(f"config:configs/released/{RELEASED.name}")
            for times, scope in ((cold, "model"), (warm, "block")):
                r = page.count(scope)
                if r["json"] is None:
                    raise RuntimeError(f"the page did not count: {r['error']}")
                times.append(r["seconds"])
            page.close()
    return {"cold_s": statistics.median(cold), "warm_s": statistics.median(warm), "cold": cold, "warm": warm}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attnid", action="append", default=None,
                    help="an attnid executable to time (repeatable; default: .venv/bin/attnid)")  # fmt: skip
    ap.add_argument("--install", action="store_true", help="also build the wheel, install it fresh, and time it")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per command (the median is reported)")
    ap.add_argument("--json", help="also write the measurements to this file")
    ap.add_argument("--browser", type=Path, metavar="HTML", help="also time the counter page of this built book")
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error(f"--runs must be at least 1, got {a.runs}")
    if a.browser is not None and not (a.browser / "counter.html").is_file():
        ap.error(f"--browser {a.browser}: no counter.html there (build the book first: make book)")
    targets = {p: p for p in (a.attnid if a.attnid is not None else [str(ROOT / ".venv" / "bin" / "attnid")])}
    result: dict = {"runs": a.runs, "cores": os.cpu_count(), "timings": {}}
    with tempfile.TemporaryDirectory() as tmp:
        if a.install:
            result["install"] = core_install(Path(tmp))
            inst = result["install"]
            print(f"core wheel {inst['wheel']}: installed into a fresh venv in {inst['install_s']:.1f} s, "
                  f"{inst['install_bytes'] / 1e6:.1f} MB on disk (torch installed: "
                  f"{'yes' if inst['torch_installed'] else 'no'})")  # fmt: skip
            targets["fresh core venv"] = inst["attnid"]
        print(f"\nwall time, median of {a.runs} after a warm-up (s)")
        print(f"{'command':<58}" + "".join(f"{name[-28:]:>30}" for name in targets))
        for label, args in COMMANDS.items():
            row = {name: statistics.median(wall_times(exe, args, a.runs)) for name, exe in targets.items()}
            result["timings"][label] = row
            print(f"{label:<58}" + "".join(f"{v:>30.3f}" for v in row.values()))
    if a.browser is not None:
        page = result["page"] = page_times(a.browser, a.runs)
        print(
            f"\ncounter page, Count to the first table (Chromium, site served from this machine), median of "
            f"{a.runs}: cold {page['cold_s']:.2f} s (Pyodide loaded), warm {page['warm_s']:.2f} s"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
