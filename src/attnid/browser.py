"""``attnid count`` as the book's counter page runs it in the reader's browser (Pyodide): the command line itself,
called on a pasted or dropped ``config.json`` written to a file first, so that the page shows exactly what
``attnid count`` prints, its JSON and its one-line refusals. Standard library only, as the rest of the core.

The page (``book/counter.md``, its worker ``book/_counter/worker.js``) calls :func:`count_page`; the book's build
writes :func:`manifest` beside it (``book/_ext/counter.py``)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import tempfile
from pathlib import Path

from .counting import SCOPES

PASTED = "config.json"  # the name a pasted file is counted under (a dropped one keeps its own)


def file_name(name: str) -> str:
    """A safe file name for a dropped file's ``name``: its last part, letters, digits and ``._-`` only (others as
    ``_``), at most 80 characters; ``config.json`` when nothing is left."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", name.replace("\\", "/").rsplit("/", 1)[-1])[:80].strip(".")
    return base or PASTED


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``(exit status, stdout, stderr)`` of ``attnid ARGV`` run in this process."""
    from .cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as e:  # argparse's refusals
            status = e.code if isinstance(e.code, int) else 2
    return status, out.getvalue(), err.getvalue()


def count_page(scope: str, text: str | None = None, name: str = PASTED, preset: str | None = None) -> str:
    """The counter page's Count: ``attnid count --config FILE --scope SCOPE`` on ``text`` written to a file called
    ``name`` (or ``--preset PRESET``), run twice, as text and with ``--json``. Returns JSON: ``{"status", "command",
    "json", "text", "error"}``, where ``json`` is the parsed ``--json`` output (``null`` when refused) and ``error``
    the command's one line on standard error (empty when it counted). It changes the working folder while it runs:
    one count at a time (the page's worker runs one)."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if (text is None) == (preset is None):
        raise ValueError("give a config's text or a preset's name: one, not both")
    # in a folder of its own, the file by its plain name: the command's lines name it as the reader does
    with tempfile.TemporaryDirectory(prefix="attnid-page-") as tmp, contextlib.chdir(tmp):
        if text is not None:
            args = ["--config", file_name(name)]
            Path(args[1]).write_text(text, encoding="utf-8")
        else:
            args = ["--preset", str(preset)]
        argv = ["count", *args, "--scope", scope]
        status, printed, err = run_cli(argv)
        found = None
        if status == 0:
            status, out, err = run_cli([*argv, "--json"])
            found = json.loads(out) if status == 0 else None
    command = " ".join(["attnid", *argv])
    error = err.strip().splitlines()[-1] if err.strip() else ""
    return json.dumps({"status": status, "command": command, "json": found, "text": printed, "error": error})


def manifest() -> dict:
    """What the page lists before Python is loaded: attnid's version, the transformers release whose rules the
    counts follow, and every preset, latent attention's included (name and description)."""
    from . import __version__
    from .library_configs import supported_version
    from .presets import MLA_PRESETS, PRESETS

    return {
        "attnid": __version__,
        "transformers": supported_version(),
        "presets": [{"name": k, "description": p.description} for k, p in {**PRESETS, **MLA_PRESETS}.items()],
    }
