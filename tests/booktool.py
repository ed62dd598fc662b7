"""What the book tests share: the book tool run as a command, and the statuses it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
RUNS = tempfile.mkdtemp(prefix="attnid-runs-")  # smoke training records stay out of data/runs
HEAD = '# %% tags=["parameters"]\nprofile = "smoke"\nseed = 0\ndevice = "auto"\n\n# %%\nx = 1\n'  # a tiny chapter


def book(*args: str, timeout: int = 1200, **extra_env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATTNID_RUNS": RUNS, **extra_env}
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "book.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def statuses(stdout: str) -> dict[str, str]:
    return dict((m.group(2), m.group(1)) for m in re.finditer(r"^\s*(executed|cached|failed)\s+(\S+)", stdout, re.M))
