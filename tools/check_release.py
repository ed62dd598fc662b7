"""Build the release (wheel and sdist), check it, install the wheel into a fresh virtual environment with nothing
else (no torch), and run the installed ``attnid`` there: ``--version``, ``count --preset``, ``count --config`` on a
shipped released file, ``presets``. The release workflow and ``tests/test_release.py`` run it.

    python tools/check_release.py [--dist DIR] [--tag v0.6.0] [--json FILE]

Exit 0 when every check passes; 1 with the check that failed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASED = ROOT / "data" / "configs" / "released" / "llama-3.1-8b.json"
# what the installed counter must print: Llama-2-7B's and Llama-3.1-8B's totals and unidentified directions
EXPECTED = {"llama-2-7b": (6_738_415_616, 25_917_440), RELEASED.name: (8_030_261_248, 13_342_720)}
IN_WHEEL = ("attnid/library_configs.json", "attnid/cli/__init__.py", "attnid/counting/models.py")


class ReleaseError(RuntimeError):
    """A check of the release failed: the message says which."""


def version() -> str:
    """The package's version, from the one place it is written (``attnid.__version__``)."""
    text = (ROOT / "src" / "attnid" / "__init__.py").read_text()
    m = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if m is None:
        raise ReleaseError("no __version__ in src/attnid/__init__.py")
    return m.group(1)


def uv() -> str:
    return shutil.which("uv") or str(Path(sys.executable).parent / "uv")


def run(*cmd: str, what: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise ReleaseError(f"{what} failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-800:]}")
    return r.stdout


def source_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked, and untracked ones it does not ignore) copied into ``dest``: a
    build there writes its metadata (``src/attnid.egg-info``) into the copy, never into the checkout, where tests run
    beside it."""
    listed = run("git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z", what="git ls-files")
    for name in filter(None, listed.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def build(dist: Path) -> tuple[Path, Path]:
    """The wheel and the sdist of this checkout (built from a copy of it, :func:`source_copy`), into ``dist``."""
    dist.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        run(uv(), "build", "--out-dir", str(dist), str(source_copy(Path(tmp))), what="uv build")
    v = version()
    wheels, sdists = sorted(dist.glob(f"attnid-{v}-*.whl")), sorted(dist.glob(f"attnid-{v}.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise ReleaseError(f"expected one wheel and one sdist of version {v} in {dist}, found {wheels + sdists}")
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    missing = [n for n in IN_WHEEL if n not in names]
    if missing:
        raise ReleaseError(f"the wheel lacks {', '.join(missing)}")
    return wheels[0], sdists[0]


def twine_check(*files: Path) -> None:
    run(sys.executable, "-m", "twine", "check", "--strict", *map(str, files), what="twine check")


def folder_bytes(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def install_fresh(wheel: Path, venv: Path) -> dict:
    """The wheel installed into a new virtual environment: seconds, bytes added, and its ``attnid``."""
    run(uv(), "venv", "--python", sys.executable, str(venv), what="uv venv")
    empty = folder_bytes(venv)
    t = time.perf_counter()
    run(uv(), "pip", "install", "--python", str(venv / "bin" / "python"), str(wheel), what="installing the wheel")
    seconds = time.perf_counter() - t
    return {"install_s": seconds, "install_bytes": folder_bytes(venv) - empty, "attnid": str(venv / "bin" / "attnid")}


def try_installed(venv: Path) -> None:
    """The installed command in ``venv``, which must hold no torch: its version and two counts."""
    py, exe = str(venv / "bin" / "python"), str(venv / "bin" / "attnid")
    if subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0:
        raise ReleaseError("torch is importable in the fresh environment: the core must not need it")
    got = run(exe, "--version", what="attnid --version").strip()
    if got != f"attnid {version()}":
        raise ReleaseError(f"attnid --version printed {got!r}, expected 'attnid {version()}'")
    for name, args in (("llama-2-7b", ["--preset", "llama-2-7b"]), (RELEASED.name, ["--config", str(RELEASED)])):
        out = json.loads(run(exe, "count", *args, "--scope", "model", "--json", what=f"attnid count {args[0]}"))
        if (out["total_params"], out["unidentified"]) != EXPECTED[name]:
            raise ReleaseError(f"count of {name}: {out['total_params']:,} / {out['unidentified']:,}, expected "
                               f"{EXPECTED[name][0]:,} / {EXPECTED[name][1]:,}")  # fmt: skip
    presets = json.loads(run(exe, "presets", "--json", what="attnid presets"))
    if len(presets) < 20:
        raise ReleaseError(f"attnid presets listed {len(presets)} presets")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dist", type=Path, help="build into this folder and keep it (default: a temporary one)")
    ap.add_argument("--tag", help="a release tag (vX.Y.Z) that must name the package's version")
    ap.add_argument("--json", type=Path, help="write the measurements (install time and size) to this file")
    a = ap.parse_args(argv)
    try:
        if a.tag is not None and a.tag != f"v{version()}":
            raise ReleaseError(f"tag {a.tag} does not name the package's version {version()} (src/attnid/__init__.py)")
        with tempfile.TemporaryDirectory() as tmp:
            dist = a.dist or Path(tmp) / "dist"
            wheel, sdist = build(dist)
            twine_check(wheel, sdist)
            print(f"built and checked {wheel.name} and {sdist.name}")
            got = install_fresh(wheel, Path(tmp) / "venv")
            try_installed(Path(tmp) / "venv")
            print(
                f"installed into a fresh venv without torch in {got['install_s']:.1f} s, "
                f"{got['install_bytes'] / 1e6:.1f} MB; --version, count --preset, count --config, presets: ok"
            )
            if a.json:
                a.json.write_text(json.dumps({**got, "wheel": wheel.name, "sdist": sdist.name}, indent=2))
    except ReleaseError as e:
        print(f"check_release: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
