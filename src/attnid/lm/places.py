"""Where the language-model side keeps its files (:mod:`attnid.lm.records` re-exports these): the checkout this
package runs from, the project root (``$ATTNID_HOME``, the checkout, or the user's data folder), the runs folder
(``$ATTNID_RUNS``), a run's folder by profile, case and seed, and the commit of the code a summary names."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def checkout() -> Path | None:
    """The source checkout this package runs from (``None`` for an installed package)."""
    root = Path(__file__).resolve().parents[3]  # src/attnid/lm/records.py -> the checkout
    return root if (root / "pyproject.toml").is_file() else None


def user_data_dir() -> Path:
    """Where records and the corpus go outside a checkout: ``$XDG_DATA_HOME/attnid`` (``~/.local/share/attnid``)."""
    return Path(os.environ.get("XDG_DATA_HOME") or "~/.local/share").expanduser() / "attnid"


_ANNOUNCED: set[Path] = set()


def project_root() -> Path:
    """``$ATTNID_HOME``; else the checkout this package runs from, when the working directory is inside it (``make``,
    the tests, a chapter run from the repository); else :func:`user_data_dir`, said once on stderr, so that a
    chapter or a fork run from any other folder never writes into a repository it was not run from."""
    if os.environ.get("ATTNID_HOME"):
        return Path(os.environ["ATTNID_HOME"]).expanduser()
    root, cwd = checkout(), Path.cwd().resolve()
    if root is not None and (cwd == root or root in cwd.parents):
        return root
    home = user_data_dir()
    if home not in _ANNOUNCED:
        _ANNOUNCED.add(home)
        print(
            f"attnid: run records and the corpus go to {home}/data (outside a checkout; set ATTNID_HOME to choose "
            "another folder)",
            file=sys.stderr,
            flush=True,
        )
    return home


def runs_root() -> Path:
    """Where run records go: ``$ATTNID_RUNS``, else ``<project root>/data/runs``."""
    if os.environ.get("ATTNID_RUNS"):
        return Path(os.environ["ATTNID_RUNS"]).expanduser()
    return project_root() / "data" / "runs"


def code_commit() -> str | None:
    """The commit of the source checkout this package runs from (``"<short sha>+changes"`` when ``src/`` differs
    from it), or ``None`` outside a git checkout: a summary's provenance. ``$ATTNID_CODE_COMMIT`` names it where the
    code runs from a copy without git history (a lent GPU machine)."""
    import subprocess

    if os.environ.get("ATTNID_CODE_COMMIT"):
        return os.environ["ATTNID_CODE_COMMIT"]
    root = checkout()
    if root is None:
        return None
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=30
        )
        if sha.returncode:
            return None
        status = ["git", "-C", str(root), "status", "--porcelain", "--", "src"]
        dirty = subprocess.run(status, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def run_name(case: str, seed: int = 0) -> str:
    return case if seed == 0 else f"{case}-s{seed}"


def run_dir(profile: str, case: str, seed: int = 0, base: Path | None = None) -> Path:
    return Path(base or runs_root()) / profile / run_name(case, seed)
