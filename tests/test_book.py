"""The book pipeline: execute every chapter (profile smoke) with papermill, build the book
strictly, check the execution cache, and open every page in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"


pytestmark = pytest.mark.slow  # the whole file: it executes and builds the smoke book
RUNS = tempfile.mkdtemp(prefix="attnid-runs-")  # smoke training records stay out of data/runs


def book(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATTNID_RUNS": RUNS}
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


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("book") / "smoke"
    r = book("build", "--profile", "smoke", "--out", str(out), "--jobs", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return out


def test_toc_lists_every_chapter():
    toc = yaml.safe_load((ROOT / "book" / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    generated = {f.split("/", 1)[1] for f in files if f.startswith("_generated/")}
    sources = {p.stem for p in (ROOT / "notebooks").glob("*.py")}
    assert sources | {"reproducibility"} == generated


def test_chapters_have_a_parameters_cell():
    for nb in (ROOT / "notebooks").glob("*.py"):
        text = nb.read_text()
        assert '# %% tags=["parameters"]' in text, nb
        cell = text.split('# %% tags=["parameters"]', 1)[1].split("# %%", 1)[0]
        for name in ("profile", "seed", "device"):
            assert re.search(rf"^{name} = ", cell, re.M), f"{nb.name}: no {name} in parameters"


def test_build_executes_every_chapter(smoke_book):
    html = smoke_book / "_build" / "html"
    for nb in (ROOT / "notebooks").glob("*.py"):
        assert (html / "_generated" / f"{nb.stem}.html").exists()
        executed = (smoke_book / "_generated" / f"{nb.stem}.ipynb").read_text()
        assert '"profile": "smoke"' in executed and '"remove-cell"' in executed
    repro = (html / "_generated" / "reproducibility.html").read_text()
    assert "smoke" in repro and "torch" in repro


def test_cache_skips_unchanged_and_reruns_after_src_change(smoke_book, tmp_path):
    r = book("execute", "--profile", "smoke", "--out", str(smoke_book))
    assert r.returncode == 0, r.stderr
    st = statuses(r.stdout)
    assert st and set(st.values()) == {"cached"}
    # `make chapter NB=...`: the named chapter re-executes, the others stay cached, the book rebuilds
    r = book("build", "--profile", "smoke", "--out", str(smoke_book), "notebooks/01_definitions.py")
    assert r.returncode == 0, r.stderr[-3000:]
    st = statuses(r.stdout)
    assert st.pop("notebooks/01_definitions.py") == "executed" and set(st.values()) == {"cached"}
    # a change under src/ re-executes a chapter (one small notebook stands for them all)
    tiny = tmp_path / "tiny_chapter.py"
    tiny.write_text('# %% tags=["parameters"]\nprofile = "smoke"\nseed = 0\ndevice = "auto"\n\n# %%\nx = 1\n')
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))

    def tiny_status() -> str:
        r = book("execute", "--profile", "smoke", "--out", str(tmp_path / "b"), "--src-dir", str(src), str(tiny))
        assert r.returncode == 0, r.stderr
        return statuses(r.stdout)[str(tiny)]

    assert (tiny_status(), tiny_status()) == ("executed", "cached")
    with open(src / "attnid" / "counting.py", "a") as f:
        f.write("\n# an edit\n")
    assert tiny_status() == "executed"


def test_failing_chapter_is_named_with_its_cell(tmp_path):
    """Two chapters side by side (--jobs 2): the failing one is named with its cell, the other is executed."""
    head = '# %% tags=["parameters"]\nprofile = "smoke"\nseed = 0\ndevice = "auto"\n\n# %%\nx = 1\n'
    bad, good = tmp_path / "zz_failing_for_test.py", tmp_path / "zz_passing_for_test.py"
    bad.write_text(head + '\n# %%\nraise RuntimeError("deliberate failure")\n')
    good.write_text(head)
    r = book("execute", "--profile", "smoke", "--out", str(tmp_path / "b"), "--jobs", "2", str(bad), str(good))
    assert r.returncode == 1
    assert "zz_failing_for_test.py failed in cell" in r.stderr and "deliberate failure" in r.stderr
    assert statuses(r.stdout) == {str(bad): "failed", str(good): "executed"}


def test_bad_profile_is_refused():
    r = book("execute", "--profile", "huge")
    assert r.returncode == 2 and "profile" in r.stderr


SCREENSHOTS = Path(os.environ.get("ATTNID_SCREENSHOTS", ROOT / "build" / "screenshots"))


def test_every_page_reads_well_in_chromium(smoke_book):
    """tools/check_pages.py on the smoke book: at 1300 px in light and dark mode, code fits its box,
    images load and show at least 500 px wide, no console errors, no request leaves the machine, math
    is typeset, every chapter opens with a glued number; at 390 px the navigation opens, images fit
    and the page does not scroll sideways. Screenshots of every page go to build/screenshots/."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: .ci/run installs it with apt-get")
        pytest.skip("no /usr/bin/chromium (apt-get install chromium)")
    sys.path.insert(0, str(ROOT / "tools"))
    from check_pages import check_book, pages_of

    html = smoke_book / "_build" / "html"
    assert len(pages_of(html)) >= 10
    problems = check_book(html, SCREENSHOTS, jobs=2)
    assert not problems, "\n".join(problems)
    shots = list(SCREENSHOTS.glob("*.png"))
    assert len(shots) >= 3 * (len(pages_of(html)) - 1)  # light, dark and phone for every page


def test_a_fork_under_any_name_is_executed_by_make_chapter(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    import book as book_tool

    fork = (ROOT / "notebooks" / "my_fork.py").resolve()
    todo, forced = book_tool.plan("build", [fork], force=False)
    assert fork in todo and fork in forced and set(book_tool.chapters()) <= set(todo)
    todo, forced = book_tool.plan("execute", None, force=False)
    assert todo == book_tool.chapters() and not forced


def test_cache_sees_the_records_a_chapter_reads(tmp_path):
    """A chapter that reads run records re-executes when one is removed (or added, or remade), and only then."""
    home = tmp_path / "home"
    shutil.copytree(ROOT / "data" / "runs" / "paper", home / "data" / "runs" / "paper")
    (home / "pyproject.toml").write_text("")
    reader = tmp_path / "reads_records.py"
    reader.write_text(
        '# %% tags=["parameters"]\nprofile = "smoke"\nseed = 0\ndevice = "auto"\n\n'
        '# %%\nfrom attnid.lm.analysis import load_suite\n\nprint(sorted(load_suite("paper", "dynamics").runs))\n'
    )
    out = tmp_path / "b"

    def run() -> str:
        env = {**os.environ, "ATTNID_RUNS": RUNS, "ATTNID_HOME": str(home)}
        r = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "book.py"), "execute", "--profile", "smoke", "--out", str(out),
             str(reader)], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        return statuses(r.stdout)[str(reader)]

    assert run() == "executed"
    assert run() == "cached"
    shutil.rmtree(home / "data" / "runs" / "paper" / "sgd")
    assert run() == "executed"
    assert run() == "cached"


def test_records_digest_changes_with_the_records(tmp_path):
    from attnid.lm.records import summaries_digest

    root = tmp_path / "runs"
    shutil.copytree(ROOT / "data" / "runs" / "paper", root / "paper")
    before = summaries_digest(["paper"], ["sgd", "adamw"], roots=[root])
    assert before == summaries_digest(["paper"], ["sgd", "adamw"], roots=[root])
    assert before != summaries_digest(["paper"], ["sgd"], roots=[root])
    (root / "paper" / "adamw-s1").mkdir()
    shutil.copy(root / "paper" / "adamw" / "summary.json", root / "paper" / "adamw-s1")
    assert before != summaries_digest(["paper"], ["sgd", "adamw"], roots=[root])  # a seed added
    assert summaries_digest(["paper"], ["sgd_wd"], roots=[root]) != summaries_digest(["paper"], [], roots=[root])


@pytest.mark.parametrize("what", ["missing", "empty", "file"])
def test_a_page_check_that_would_check_nothing_fails(tmp_path, what):
    target = tmp_path / "html"
    if what == "empty":
        target.mkdir()
    elif what == "file":
        target.write_text("not a book")
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_pages.py"), str(target)], capture_output=True, text=True
    )
    assert r.returncode == 2 and str(target) in r.stderr and "no problems" not in r.stdout


def test_book_tool_refuses_a_folder_as_chapter_and_a_file_as_out(tmp_path):
    r = book("execute", "--profile", "smoke", "--out", str(tmp_path / "b"), str(tmp_path))
    assert r.returncode == 2 and "not a chapter source" in r.stderr
    f = tmp_path / "file"
    f.write_text("")
    r = book("execute", "--profile", "smoke", "--out", str(f))
    assert r.returncode == 2 and "not a folder" in r.stderr
