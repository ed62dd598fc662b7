"""What the book tests share: the book tool run as a command, and the statuses it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("ATTNID_CHROMIUM") or "/usr/bin/chromium"  # as tools/check_pages.py
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


def tool(name: str):
    """A script of tools/ (``book``, ``check_pages``) as a module, for the tests that call it in this process."""
    import importlib

    if str(ROOT / "tools") not in sys.path:
        sys.path.insert(0, str(ROOT / "tools"))
    return importlib.import_module(name)


def book_tool():
    """tools/book.py as a module."""
    return tool("book")


def refusal(capsys, monkeypatch, *args: str) -> tuple[int, str]:
    """``(exit status, stderr)`` of the book tool's command line run in this process: a refusal comes before
    any chapter, kernel or signal handler, so it needs no process of its own (and no second torch import)."""
    import pytest

    def no_work(out: Path) -> None:  # the first thing main does once its checks pass
        raise AssertionError(f"not refused: {args}")

    monkeypatch.setattr(book_tool(), "stage_sources", no_work)
    with pytest.raises(SystemExit) as e:
        book_tool().main(list(args))
    return e.value.code, capsys.readouterr().err


def execute_here(monkeypatch, nb: Path, out: Path, src_dir: Path = ROOT / "src", **extra_env: str) -> str:
    """One chapter through the book tool's cache and papermill in this process (its kernel a process of its own,
    as always): ``executed`` or ``cached``. For the cache's tests, which need no fresh interpreter of their own."""
    monkeypatch.setenv("ATTNID_RUNS", RUNS)
    for k, v in extra_env.items():
        monkeypatch.setenv(k, v)
    params = {"profile": "smoke", "seed": 0, "device": "auto"}
    return book_tool().execute_all(out, params, [nb], src_dir, set())[nb.stem]


def statuses(stdout: str) -> dict[str, str]:
    return dict((m.group(2), m.group(1)) for m in re.finditer(r"^\s*(executed|cached|failed)\s+(\S+)", stdout, re.M))


def need_chromium() -> None:
    """Skip a test that drives the browser where none is installed; in CI (``CI`` set), fail: .ci/run installs it."""
    import pytest

    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: .ci/run installs it with apt-get")
        pytest.skip(f"no {CHROMIUM} (apt-get install chromium, or set ATTNID_CHROMIUM)")
