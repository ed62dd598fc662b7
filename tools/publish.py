"""The published site: the built book plus what its launch buttons need, and a check of its links.

    python tools/publish.py --profile cpu --repository https://github.com/OWNER/REPO --commit SHA

``prepare`` puts beside the HTML of ``build/<profile>/_build/html``: the executed notebooks (``_generated/*.ipynb``,
where the Binder and Colab buttons point, each opening with a cell that installs attnid at the built commit where it
is missing, as in Colab), the committed run records that chapters 6, 7 and 10 read (records only, no
weights), a Binder ``environment.yml`` (the CPU build of torch, attnid with the book's extra at this commit) and a
``start`` script that makes the site's folder the records' home (the runs of the profile the book was built at ride
along, so that a launched chapter reads them instead of training again), and ``.nojekyll``. Only a record that
verifies is published, and only the files its sealed list names (plain names, regular files, never through a link).
``check_links`` lists every launch-button, repository and source link of the pages that does not point at the
configured repository and branch, or names a notebook the site lacks, and every file of the counter page
(``_counter/``: Pyodide, attnid's sources) missing or changed. The book workflow runs ``prepare`` and pushes
the site to the ``gh-pages`` branch besides deploying it to GitHub Pages.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from attnid.lm import records

ROOT = Path(__file__).resolve().parent.parent
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
COMMITTED = ("mid", "paper")  # data/runs/<profile>: the records the chapters read beside their own runs


class PublishError(RuntimeError):
    """A record that may not be published: the message names it and why."""


def publish_record(d: Path, dest: Path) -> list[str]:
    """Copy a finished record that :func:`attnid.lm.records.load` accepts (its seal, its file list of plain names,
    every file's size and sha256) into ``dest``: exactly its listed files but weights, and its summary, each a regular
    file (a symbolic link is never followed). Returns the names copied; :class:`PublishError` otherwise."""
    if d.is_symlink():
        raise PublishError(f"{d}: a symbolic link, not a record's folder")
    try:
        rec = records.load(d)
    except records.RecordError as e:
        raise PublishError(f"{d}: not published: {e}") from None
    names = [n for n in rec.summary["files"] if not n.endswith(".pt")] + ["summary.json"]
    for name in names:  # plain names, checked by load; each a regular file here, not a link to one
        p = d / name
        if p.is_symlink() or not p.is_file():
            raise PublishError(f"{p}: not a regular file; not published")
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(d / name, dest / name, follow_symlinks=False)
    return names


INSTALL_TAG = "attnid-install"  # the tag of the cell with_install_cell puts first


def install_cell(spec: str) -> dict:
    """A code cell that installs ``spec`` where attnid is missing (a notebook opened in Colab, or any fresh Jupyter):
    with ``uv`` when the machine has it (Colab does: seconds instead of a minute), else pip. ``ATTNID_BOOK_SPEC``
    overrides the spec (a fork, or a test that installs from a checkout). Hidden in the book (``remove-cell``)."""
    source = f"""# Opened outside the book's environment (Colab, a fresh Jupyter)? This installs attnid at the version
# the book was built with, once (a minute; the torch already installed is kept).
import importlib.util, os, shutil, subprocess, sys  # noqa: E401

if importlib.util.find_spec("attnid") is None or importlib.util.find_spec("myst_nb") is None:
    spec = os.environ.get("ATTNID_BOOK_SPEC", {spec!r})
    uv = shutil.which("uv")
    pip = [uv, "pip", "install", "--python", sys.executable] if uv else [sys.executable, "-m", "pip", "install"]
    subprocess.run([*pip, "-q", spec], check=True)"""
    return {
        "cell_type": "code",
        "execution_count": None,
        "id": INSTALL_TAG,
        "metadata": {"tags": ["remove-cell", INSTALL_TAG]},
        "outputs": [],
        "source": source.splitlines(keepends=True),
    }


def with_install_cell(nb: dict, spec: str) -> dict:
    """The notebook ``nb`` (nbformat 4, as JSON) with :func:`install_cell` first (once: an earlier one is replaced)."""
    cells = [c for c in nb["cells"] if INSTALL_TAG not in c.get("metadata", {}).get("tags", [])]
    return {**nb, "cells": [install_cell(spec), *cells]}


def prepare(build: Path, repository: str, commit: str, profile: str | None = None) -> Path:
    """The site of the book built in ``build`` (``build/<profile>``, or a build made elsewhere, at ``profile``), made
    ready to publish; returns its folder."""
    site = build / "_build" / "html"
    (site / "_generated").mkdir(parents=True, exist_ok=True)
    spec = f"attnid[book] @ git+{repository}@{commit}"
    for nb in sorted((build / "_generated").glob("*.ipynb")):
        if not nb.name.startswith("."):
            (site / "_generated" / nb.name).write_text(json.dumps(with_install_cell(json.loads(nb.read_text()), spec)))
    built = profile or build.name  # the profile the book was built at, which its notebooks' parameters name: its runs
    for committed in COMMITTED:
        for d in sorted((ROOT / "data" / "runs" / committed).glob("*/")):
            if (d / "summary.json").is_file():
                publish_record(d, site / "data" / "runs" / committed / d.name)
    if built not in COMMITTED:  # ride along, so that a launched chapter reads them instead of training them again
        for d in sorted((records.runs_root() / built).glob("*/")):
            if (d / "summary.json").is_file():
                publish_record(d, site / "data" / "runs" / built / d.name)
    env = {
        "name": "attnid-binder",
        "channels": ["conda-forge"],
        "dependencies": [
            "python=3.11",
            "pip",
            {
                "pip": [
                    f"--extra-index-url {CPU_INDEX}",
                    "torch==2.13.0+cpu",
                    f"attnid[book] @ git+{repository}@{commit}",
                ]
            },
        ],
    }
    (site / "environment.yml").write_text(yaml.safe_dump(env, sort_keys=False))
    start = site / "start"
    script = ["#!/bin/bash", f"# Binder runs this: the records beside the notebooks (the committed mid and paper ones, "
              f"and the {built} runs the book was built with, the profile its notebooks' parameters name) are the "
              "chapters' own",
              'export ATTNID_HOME="$HOME"', 'exec "$@"']  # fmt: skip
    start.write_text("\n".join(script) + "\n")
    start.chmod(0o755)
    (site / ".nojekyll").touch()
    return site


LINK = re.compile(r'href="(https://(?:mybinder\.org|colab\.research\.google\.com|github\.com)[^"]*)"')


def check_links(site: Path, repository: str, branch: str) -> list[str]:
    """Every launch-button, repository and source link of the site's pages that does not point at ``repository``
    and ``branch``, or names a notebook the site does not hold; and chapters without launch buttons."""
    owner_repo = repository.removeprefix("https://github.com/").strip("/")
    problems = []
    for page in sorted(site.glob("_generated/*.html")):
        links = LINK.findall(page.read_text())
        launch = [x for x in links if "mybinder.org" in x or "colab.research" in x]
        if not launch and (site / "_generated" / f"{page.stem}.ipynb").is_file():  # a chapter, not a plain page
            problems.append(f"{page.name}: no launch buttons")
        for link in links:
            if "mybinder.org" in link:
                prefix, path = f"https://mybinder.org/v2/gh/{owner_repo}/{branch}?urlpath=tree/", None
                path = link.removeprefix(prefix) if link.startswith(prefix) else None
            elif "colab.research" in link:
                prefix = f"https://colab.research.google.com/github/{owner_repo}/blob/{branch}/"
                path = link.removeprefix(prefix) if link.startswith(prefix) else None
            else:
                if not link.startswith(f"https://github.com/{owner_repo}"):
                    problems.append(f"{page.name}: {link} is not of {repository}")
                continue
            if path is None:
                problems.append(f"{page.name}: {link} does not point at {owner_repo} on {branch}")
            elif not (site / path).is_file():
                problems.append(f"{page.name}: {link} names {path}, which the site does not hold")
    return problems + check_counter(site)


def check_counter(site: Path) -> list[str]:
    """The counter page's files (Pyodide, attnid's sources, the configs to pick from, its scripts): each file that
    ``_counter/manifest.json`` lists is in the site with its size and sha256 (book/_ext/counter.py writes both)."""
    manifest = site / "_counter" / "manifest.json"
    if not (site / "counter.html").is_file():
        return []
    if not manifest.is_file():
        return ["counter.html: _counter/manifest.json is missing (the page could load nothing)"]
    problems = []
    for rel, want in json.loads(manifest.read_text())["files"].items():
        f = site / "_counter" / rel
        if not f.is_file():
            problems.append(f"counter.html: _counter/{rel} is missing")
        elif f.stat().st_size != want["bytes"] or hashlib.sha256(f.read_bytes()).hexdigest() != want["sha256"]:
            problems.append(f"counter.html: _counter/{rel} is not the file the build wrote")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu", help="the profile the book was built at (build/<profile>)")
    ap.add_argument("--repository", required=True, help="the repository's URL, https://github.com/OWNER/REPO")
    ap.add_argument("--commit", required=True, help="the commit the Binder environment installs attnid at")
    ap.add_argument("--build", type=Path, help="the built book's folder (default build/<profile>; a build made "
                    "elsewhere, its runs found through ATTNID_RUNS)")  # fmt: skip
    a = ap.parse_args(argv)
    build = a.build if a.build is not None else ROOT / "build" / a.profile
    if not (build / "_build" / "html").is_dir():
        ap.error(f"{build}: no built book there (_build/html); build it with make book, or name it with --build")
    try:
        site = prepare(build, a.repository, a.commit, a.profile)
    except PublishError as e:
        print(f"site: {e}", file=sys.stderr)
        return 1
    branch = yaml.safe_load((ROOT / "book" / "_config.yml").read_text())["repository"]["branch"]
    problems = check_links(site, a.repository, branch)
    for p in problems:
        print(f"site: {p}", file=sys.stderr)
    print(f"site: {site} ({sum(1 for _ in site.rglob('*'))} files)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
