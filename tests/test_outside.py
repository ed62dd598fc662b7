"""A chapter and a fork executed with papermill from a folder outside the checkout write nothing inside it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from booktool import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.book]  # it executes chapter 7, which trains its smoke runs


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` (git-ignored ones included; git's own folder and bytecode caches aside):
    ``relative path -> (size, mtime_ns)``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".pytest_cache", "__pycache__")]
        for name in filenames:
            p = Path(dirpath) / name
            with contextlib.suppress(FileNotFoundError):
                st = p.stat()
                out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def test_a_fork_and_a_chapter_run_outside_the_checkout_write_nothing_inside_it(corpus, tmp_path):
    """The template (copied as a fork) and chapter 7, executed with papermill from a folder outside the checkout:
    their records go to the user data folder (chapter 7 trains its smoke runs there), which the chapter names in
    its first line, and no file of the checkout changes. Its own file: it trains beside the smoke book."""
    xdg = tmp_path / "xdg"
    home = xdg / "attnid"
    fork = tmp_path / "my_experiment.py"
    shutil.copy(ROOT / "notebooks" / "template_experiment.py", fork)
    env = {k: v for k, v in os.environ.items() if k not in ("ATTNID_RUNS", "ATTNID_HOME")}
    env["XDG_DATA_HOME"] = str(xdg)
    bin_dir = Path(sys.executable).parent
    before = _files(ROOT)
    for src in (fork, ROOT / "notebooks" / "07_heads.py"):
        ipynb, executed = tmp_path / f"{src.stem}.ipynb", tmp_path / f"{src.stem}.out.ipynb"
        for cmd in (
            [str(bin_dir / "jupytext"), "--to", "ipynb", "--set-kernel", "python3", "-o", str(ipynb), str(src)],
            [str(bin_dir / "papermill"), str(ipynb), str(executed), "-p", "profile", "smoke", "--no-progress-bar"],
        ):
            r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, r.stderr[-3000:]
    assert _files(ROOT) == before
    outputs = [o for c in json.loads(executed.read_text())["cells"] for o in c.get("outputs", [])]
    streams = ["".join(o["text"]) for o in outputs if o.get("output_type") == "stream"]  # text: a str or lines
    assert streams and streams[0].startswith(f"attnid: run records and the corpus go to {home}/data")
    assert (home / "data" / "runs" / "smoke").is_dir() and not list((home / "data" / "runs").glob("cpu"))
