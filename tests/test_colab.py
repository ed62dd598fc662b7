"""A chapter opened as Colab opens it: a fresh environment with Jupyter and torch and nothing else, the notebook as
the site publishes it (tools/publish.py puts a cell first that installs attnid where it is missing). The cell
installs the book's package (here from this checkout, through ``ATTNID_BOOK_SPEC``) and the chapter runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from booktool import ROOT, tool

pytestmark = [pytest.mark.slow, pytest.mark.book]  # a fresh environment is installed


def _fresh_jupyter(where):
    """A virtual environment with a Jupyter kernel and torch (Colab's), and no attnid."""
    venv.create(where, with_pip=True)
    py = where / "bin" / "python"
    # --no-compile: each module is compiled when first imported (as the Makefile installs), not the ~4,000 files of
    # torch up front
    pip = [str(py), "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check"]
    subprocess.run([*pip, "ipykernel", "nbclient", "nbformat"], check=True, capture_output=True)
    torch = os.environ.get("TORCH_SPEC", "torch==2.13.0")  # the CPU wheel this machine keeps (as the Makefile)
    subprocess.run([*pip, *torch.split()], check=True, capture_output=True)
    return py


def test_a_published_chapter_installs_what_it_needs_and_runs_where_only_jupyter_is(tmp_path):
    import jupytext

    publish = tool("publish")
    nb = json.loads(jupytext.writes(jupytext.read(ROOT / "notebooks" / "01_definitions.py"), fmt="ipynb"))
    nb = publish.with_install_cell(nb, "attnid[book] @ git+https://example.invalid/attnid@0000000")
    assert publish.with_install_cell(nb, "x")["cells"][1:] == nb["cells"][1:]  # once, however often it is added
    (tmp_path / "chapter.ipynb").write_text(json.dumps(nb))
    py = _fresh_jupyter(tmp_path / "env")
    missing = subprocess.run([str(py), "-c", "import attnid"], capture_output=True)
    assert missing.returncode != 0  # the control: nothing of the book there yet
    run = """
import nbformat
from nbclient import NotebookClient
nb = nbformat.read("chapter.ipynb", as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3").execute()
print("cells run:", sum(1 for c in nb.cells if c.cell_type == "code"))
"""
    env = {
        **os.environ,
        "ATTNID_BOOK_SPEC": f"attnid[book] @ file://{ROOT}",  # this checkout, not the repository the site names
        # uv on the PATH, as Colab has it (this project's venv holds one): seconds where pip takes minutes
        "PATH": f"{py.parent}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "VIRTUAL_ENV": str(py.parent.parent),
    }
    env.pop("PYTHONPATH", None)
    r = subprocess.run([str(py), "-c", run], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "cells run:" in r.stdout
    shown = subprocess.run([str(py), "-c", "import attnid, myst_nb; print(attnid.__version__)"], capture_output=True)
    assert shown.returncode == 0  # installed by the notebook's first cell
