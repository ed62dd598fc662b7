"""The book on a busy machine: chapters executed (``tools/book.py execute --force``) on the quiet machine, then again
beside ``--busy`` CPU-bound processes that this script starts (and stops), chapter by chapter, with the ratio.

    python tools/bench_busy.py notebooks/08_beyond_attention.py notebooks/10_your_model.py [--profile smoke]

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapters", nargs="+", type=Path)
    ap.add_argument("--profile", default="smoke")
    ap.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside the loaded run (default 2)")
    ap.add_argument("--book", type=Path, default=ROOT / "tools" / "book.py", help="the book tool to time")
    a = ap.parse_args()
    if a.busy < 1:
        ap.error(f"--busy must be at least 1, got {a.busy}")
    for c in a.chapters:
        if not c.is_file():
            ap.error(f"no such chapter: {c}")
    with tempfile.TemporaryDirectory(prefix="attnid-busy-") as tmp:
        quiet = run_chapters(a.book, a.chapters, a.profile, Path(tmp) / "quiet")
        spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(a.busy)]
        try:
            loaded = run_chapters(a.book, a.chapters, a.profile, Path(tmp) / "loaded")
        finally:
            for p in spinners:
                p.kill()
    print(f"{'chapter':<40}{'quiet s':>10}{f'{a.busy} busy s':>12}{'ratio':>8}   (cores: {os.cpu_count()})")
    for name, q in quiet.items():
        busy = loaded.get(name, float("nan"))
        print(f"{name:<40}{q:>10.1f}{busy:>12.1f}{busy / q:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
