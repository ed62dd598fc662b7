"""The book on a busy machine: chapters executed (``tools/book.py execute --force``) on the quiet machine, then again
beside ``--busy`` CPU-bound processes that this script starts (and stops), chapter by chapter, with the ratio.

    python tools/bench_busy.py notebooks/08_beyond_attention.py notebooks/10_your_model.py [--profile smoke]
    python tools/bench_busy.py --make book     # the README's command, cold, from two fresh clones of HEAD
    python tools/bench_busy.py --make test

``--make TARGET`` runs the README's ``make TARGET`` from a fresh clone of the checkout's HEAD (its venv and, for the
book, its cpu runs made from nothing), once quiet and once, in a second fresh clone, beside the busy processes; it
prints the whole target's seconds and, for the book, each chapter's (its training included). The corpus is found
as ``make data`` finds it (``ATTNID_DATA`` where there is no internet); the clones are removed afterwards.

Goal: each chapter within 2.5x of its quiet time beside two busy processes on 2 cores (a machine shared by three
CPU-bound processes gives each about two thirds of a core, 1.5x; what is beyond that is lost to contention). The
quiet run comes first, so that the loaded one reads the runs the chapters train from the quiet one's records (both
then measure execution, not training). ``--book PATH`` times another copy of tools/book.py (an older commit's).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPIN = "while True: pass"


def run_chapters(book: Path, chapters: list[Path], profile: str, out: Path) -> dict[str, float]:
    """Seconds of each chapter, executed (forced) by ``book`` into ``out``."""
    cmd = [
        sys.executable,
        str(book),
        "execute",
        "--force",
        "--profile",
        profile,
        "--out",
        str(out),
        *map(str, chapters),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"bench_busy: the book tool failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return {m[1]: float(m[2]) for m in re.finditer(r"executed\s+(\S+)\s+\(([\d.]+) s\)", r.stdout)}


def run_make(target: str, clone: Path, log: Path) -> tuple[float, dict[str, float]]:
    """``make target`` in a fresh clone of HEAD at ``clone``: its seconds, and each chapter's for the book."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "OMP_NUM_THREADS", "ATTNID_RUNS")}
    t = time.perf_counter()
    with log.open("w") as f:
        r = subprocess.run(["make", target], cwd=clone, env=env, stdout=f, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - t
    text = log.read_text()
    if r.returncode:
        raise SystemExit(f"bench_busy: make {target} failed (rc {r.returncode}); its log: {log}\n{text[-2000:]}")
    for line in text.splitlines():  # the book's training in the background, when it waited for it
        if line.startswith("  trained    the runs of"):
            print(f"  ({log.stem}){line[len('  trained') :]}", flush=True)
    return seconds, {m[1]: float(m[2]) for m in re.finditer(r"executed\s+(\S+)\s+\(([\d.]+) s\)", text)}


def with_spinners(busy: int, work):
    """``work()`` beside ``busy`` CPU-bound processes (started first, killed afterwards)."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    try:
        return work()
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def print_table(quiet: dict[str, float], loaded: dict[str, float], busy: int) -> None:
    print(f"{'chapter':<40}{'quiet s':>10}{f'{busy} busy s':>12}{'ratio':>8}   (cores: {os.cpu_count()})")
    for name, q in quiet.items():
        b = loaded.get(name, float("nan"))
        print(f"{name:<40}{q:>10.1f}{b:>12.1f}{b / q:>8.2f}")


def bench_make(target: str, busy: int) -> int:
    """The README's ``make target`` cold, quiet and then beside ``busy`` processes (:func:`run_make`)."""
    with tempfile.TemporaryDirectory(prefix="attnid-busy-", dir=ROOT.parent) as tmp:
        quiet_s, quiet = run_make(target, Path(tmp) / "quiet", Path(tmp) / "quiet.log")
        print(f"make {target}, quiet: {quiet_s:.0f} s", flush=True)
        loaded_s, loaded = with_spinners(busy, lambda: run_make(target, Path(tmp) / "loaded", Path(tmp) / "loaded.log"))
        print(f"make {target}, beside {busy} busy processes: {loaded_s:.0f} s", flush=True)
        if quiet:
            print_table(quiet, loaded, busy)
        print(f"{'make ' + target:<40}{quiet_s:>10.1f}{loaded_s:>12.1f}{loaded_s / quiet_s:>8.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapters", nargs="*", type=Path)
    ap.add_argument("--make", choices=("book", "test"), help="time the README's make target from fresh clones")
    ap.add_argument("--profile", default="smoke")
    ap.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside the loaded run (default 2)")
    ap.add_argument("--book", type=Path, default=ROOT / "tools" / "book.py", help="the book tool to time")
    a = ap.parse_args()
    if a.busy < 1:
        ap.error(f"--busy must be at least 1, got {a.busy}")
    if a.make:
        if a.chapters:
            ap.error("--make times a whole target: give chapters or --make, not both")
        return bench_make(a.make, a.busy)
    if not a.chapters:
        ap.error("give chapters to time, or --make book|test")
    for c in a.chapters:
        if not c.is_file():
            ap.error(f"no such chapter: {c}")
    with tempfile.TemporaryDirectory(prefix="attnid-busy-") as tmp:
        quiet = run_chapters(a.book, a.chapters, a.profile, Path(tmp) / "quiet")
        loaded = with_spinners(a.busy, lambda: run_chapters(a.book, a.chapters, a.profile, Path(tmp) / "loaded"))
    print_table(quiet, loaded, a.busy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
