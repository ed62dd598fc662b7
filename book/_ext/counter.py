"""The counter page's files (``counter.md``): attnid's own core and Pyodide, written into the built site.

After an HTML build this writes ``_counter/`` beside the pages:

* ``counter.js`` and ``worker.js``, the page's scripts (from the book's ``_counter/`` folder: outside ``_static``,
  whose scripts Jupyter Book loads on every page);
* ``pyodide/``: the files of Pyodide's npm package (pinned below, checked against the registry's sha512) that a
  browser loads, so that nothing comes from a CDN when a reader presses Count;
* ``attnid-<version>.zip``: the sources of the ``attnid`` package this build imports (the code that executed the
  chapters), which the page unpacks into Pyodide and runs as ``attnid count``;
* ``configs/``: the ``config.json`` files that the repository ships, to pick from: released files as published
  (``data/configs/released``), the released files of the families chapter 9 adds, transcribed field by field
  (``data/configs/families``), and each preset's architecture fields (``data/configs``);
* ``manifest.json``: the versions, presets and configs the page lists before Python loads, and every file above
  with its size and sha256 (``tools/publish.py`` checks the published site against it).

The npm package is fetched once with ``npm pack`` into ``~/.cache/attnid`` (``$XDG_CACHE_HOME``); a build without
the npm registry sets ``ATTNID_PYODIDE`` to a copy of the tarball.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

PYODIDE_VERSION = "314.0.8"
PYODIDE_INTEGRITY = "sha512-74Wq1kXOC+CCEzAfxuRAO701nAcCMLjf8NrwvWpu8S41dVMXwXmLQ05dYB+F4e46AdnGo0oq7YHSVUpHsoarLQ=="
# what a browser loads of the package (its Node.js console pages, type declarations and source maps stay out)
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json")
OUT = "_counter"
ZIP_TIME = (2026, 1, 1, 0, 0, 0)  # every entry's date: the same sources give the same bytes


class CounterBuildError(RuntimeError):
    """The counter's files could not be made: the message says what to install or set."""


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def pyodide_tarball() -> bytes:
    """The pinned Pyodide npm tarball, checked against :data:`PYODIDE_INTEGRITY`: ``$ATTNID_PYODIDE``, else the
    cached copy, else ``npm pack`` (the npm registry) into the cache."""
    given = os.environ.get("ATTNID_PYODIDE")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnid"
    path = Path(given) if given else cache / f"pyodide-{PYODIDE_VERSION}.tgz"
    if not path.is_file():
        if given:
            raise CounterBuildError(f"ATTNID_PYODIDE={given}: no such file (give pyodide-{PYODIDE_VERSION}.tgz)")
        npm = shutil.which("npm")
        if npm is None:
            raise CounterBuildError(
                f"the counter page needs Pyodide {PYODIDE_VERSION} from the npm registry: install Node.js's npm, "
                "or set ATTNID_PYODIDE to the package's tarball (npm pack pyodide@" + PYODIDE_VERSION + ")"
            )
        cache.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            [npm, "pack", f"pyodide@{PYODIDE_VERSION}", "--pack-destination", str(cache), "--silent"],
            capture_output=True,
            text=True,
        )
        if r.returncode or not path.is_file():
            why = (r.stderr.strip().splitlines() or ["no message"])[-1]
            raise CounterBuildError(f"npm pack pyodide@{PYODIDE_VERSION} failed: {why}")
    data = path.read_bytes()
    if _integrity(data) != PYODIDE_INTEGRITY:
        raise CounterBuildError(f"{path}: not pyodide@{PYODIDE_VERSION} (its sha512 differs from the registry's)")
    return data


def pyodide_files(tarball: bytes) -> dict[str, bytes]:
    """The files of :data:`PYODIDE_FILES` from the package's tarball."""
    out = {}
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        held = set(tar.getnames())
        for name in PYODIDE_FILES:
            member = tar.extractfile(f"package/{name}") if f"package/{name}" in held else None
            if member is None:
                raise CounterBuildError(f"pyodide@{PYODIDE_VERSION} has no {name}")
            out[name] = member.read()
    return out


def package_zip(package: Path) -> bytes:
    """The sources of the package at ``package`` (``.py`` files and ``.json`` data, no caches) as a zip whose
    paths start with ``attnid/``, each entry dated :data:`ZIP_TIME`."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for f in sorted(package.rglob("*")):
            if f.suffix in (".py", ".json") and "__pycache__" not in f.parts:
                info = zipfile.ZipInfo(f"attnid/{f.relative_to(package).as_posix()}", ZIP_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, f.read_bytes())
    return buf.getvalue()


def write_counter(outdir: Path, scripts: Path) -> dict:
    """Write ``_counter/`` into the built site ``outdir``, with the page's scripts from ``scripts`` (the book's
    ``_counter/`` folder); returns its manifest."""
    import attnid
    from attnid.browser import manifest

    package = Path(attnid.__file__).resolve().parent
    configs = package.parents[1] / "data" / "configs"  # the repository's released files (an editable install)
    if not configs.is_dir():
        raise CounterBuildError(f"{configs}: no released configs; build the book from the repository (make book)")
    files = {f"pyodide/{k}": v for k, v in pyodide_files(pyodide_tarball()).items()}
    files[f"attnid-{attnid.__version__}.zip"] = package_zip(package)
    for f in sorted(scripts.glob("*.js")):
        files[f.name] = f.read_bytes()
    picks = []  # the released files as published, the families' files, then each preset's architecture fields
    for group, folder in (("released", configs / "released"), ("families", configs / "families"), ("book", configs)):
        for f in sorted(folder.glob("*.json")):
            if f.name != "SOURCES.json":  # where each released file came from, not a config
                rel = f"configs/{f.relative_to(configs).as_posix()}"
                files[rel] = f.read_bytes()
                picks.append({"name": f.name, "file": rel, "group": group})
    out = outdir / OUT
    if out.exists():
        shutil.rmtree(out)
    for rel, data in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    m = {
        **manifest(),
        "pyodide": PYODIDE_VERSION,
        "package": f"attnid-{attnid.__version__}.zip",
        "configs": picks,
        "files": {rel: {"bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()} for rel, d in files.items()},
    }
    (out / "manifest.json").write_text(json.dumps(m, separators=(",", ":")))
    return m


def _after_build(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    write_counter(Path(app.outdir), Path(app.srcdir) / OUT)


def setup(app):
    app.connect("build-finished", _after_build)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
