"""The book pipeline: execute every chapter (profile smoke) with papermill, build the book
strictly, check the execution cache, and open every page in headless Chromium."""

from __future__ import annotations

import gzip
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


def test_pages_load_no_font_awesome_kit_and_icon_fonts_hold_the_icons_shown(smoke_book):
    """The theme's CSS draws the icons from web fonts; its 1.5 MB JavaScript kit is dropped from every page.
    The fonts and the stylesheet keep the icons the pages name, and only those (book/_ext/icon_fonts.py)."""
    import re

    from fontTools.ttLib import TTFont

    html = smoke_book / "_build" / "html"
    pages = list(html.rglob("*.html"))
    assert pages and not [p for p in pages if "fontawesome.js" in p.read_text()]
    assert not list((html / "_static").rglob("fontawesome.js"))
    css = (html / "_static" / "styles" / "pydata-sphinx-theme.css").read_text()
    assert "fa-solid-900.woff2" in css and ".fa-bars:before" in css and ".fa-bicycle:before" not in css
    fonts = html / "_static" / "vendor" / "fontawesome" / "webfonts"
    glyphs = set().union(*(TTFont(f).getBestCmap() for f in fonts.glob("*.woff2")))
    assert all(f.stat().st_size < 20_000 for f in fonts.glob("*.woff2"))  # the whole set: 0.3 MB
    shown = {n for p in pages for n in re.findall(r"\bfa-[a-z0-9-]+", p.read_text())}
    for name in ("fa-bars", "fa-magnifying-glass", "fa-github", "fa-moon", "fa-list"):
        assert name in shown
        cp = re.search(r"\." + name + r':before[^{]*\{content:"\\([0-9a-f]+)"', css)
        assert cp and int(cp[1], 16) in glyphs, name
    tip = re.search(r'--pst-icon-lightbulb:"(.)"', css)  # an icon the theme's CSS draws (tip admonitions)
    assert tip and ord(tip[1]) in glyphs


def test_pages_write_math_as_mathml_defer_scripts_and_size_lazy_figures(smoke_book):
    """A chapter with math and figures: every formula written as MathML at build time and no MathJax, every
    external script deferred but the one inline scripts read at once, every figure sized and lazy."""
    import re

    page = (smoke_book / "_build" / "html" / "_generated" / "02_invariances.html").read_text()
    assert "mathjax" not in page.lower().replace("mathjax_ignore", "")
    maths = re.findall(r'<(span|div) class="math notranslate nohighlight"[^>]*>(.*?)</\1>', page, re.S)
    assert len(maths) > 20 and all("<math" in m and "merror" not in m for _, m in maths)
    assert any('display="block"' in m for tag, m in maths if tag == "div")
    scripts = re.findall(r"<script[^>]*\ssrc=\"([^\"]+)\"[^>]*>", page)
    sync = [s for s in scripts if not re.search(r'<script[^>]*\b(defer|async)\b[^>]*src="' + re.escape(s), page)]
    assert sync and all("documentation_options.js" in s for s in sync), sync
    assert len(scripts) == len(set(scripts))  # none twice
    figures = re.findall(r"<img [^>]*_images/[^>]*>", page)
    assert figures and all('loading="lazy"' in f and re.search(r'width="\d+" height="\d+"', f) for f in figures)


def _book_extension(name: str):
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def test_mathml_writes_formulas_and_refuses_what_it_cannot_read():
    """book/_ext/mathml.py: TeX to MathML (⊤ as a symbol); a broken formula or an unknown command fails the
    build naming the formula, where MathJax would have drawn it red in the reader's browser."""
    from sphinx.errors import ExtensionError

    mathml = _book_extension("mathml")
    out = mathml.to_mathml(r"K^\top Q = W_K^\top W_Q", display=True)
    assert out.startswith("<math") and 'display="block"' in out and "<mi>&#x022A4;</mi>" in out
    assert "<mo>&#x022A4;</mo>" not in out
    for bad, said in ((r"x^", "cannot convert 'x^'"), (r"\rnak(A)", r"unknown command \rnak")):
        with pytest.raises(ExtensionError, match=re.escape(said)):
            mathml.to_mathml(bad)


def test_icon_css_keeps_the_icons_named_and_those_the_theme_draws():
    """book/_ext/icon_fonts.py on a small stylesheet: the rule of an icon no page names goes, the rule of one
    named stays, and an icon the theme's own CSS draws (a private-use character) is kept."""
    icons = _book_extension("icon_fonts")
    css = '.fa-bars:before,.fa-navicon:before{content:"\\f0c9"}.fa-bicycle:before{content:"\\f206"}'
    css += '.admonition{--pst-icon-tip:"\uf0eb"}'
    out, kept = icons.trimmed_css(css, {"fa-navicon", "fa-solid"})
    assert ".fa-bars:before" in out and ".fa-bicycle" not in out and "--pst-icon-tip" in out
    assert kept == {0xF0C9, 0xF0EB}
    assert icons.trimmed_css(css, {"fa-bicycle"})[1] == {0xF206, 0xF0EB}


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
    from attnid.lm.records import records_digest

    root = tmp_path / "runs"
    shutil.copytree(ROOT / "data" / "runs" / "paper", root / "paper")
    before = records_digest(["paper"], ["sgd", "adamw"], roots=[root])
    assert before == records_digest(["paper"], ["sgd", "adamw"], roots=[root])
    assert before != records_digest(["paper"], ["sgd"], roots=[root])
    (root / "paper" / "adamw-s1").mkdir()
    shutil.copy(root / "paper" / "adamw" / "summary.json", root / "paper" / "adamw-s1")
    assert before != records_digest(["paper"], ["sgd", "adamw"], roots=[root])  # a seed added
    assert records_digest(["paper"], ["sgd_wd"], roots=[root]) != records_digest(["paper"], [], roots=[root])
    with gzip.open(root / "paper" / "sgd" / "metrics.jsonl.gz", "rb") as f:
        rows = f.read()
    added = records_digest(["paper"], ["sgd", "adamw"], roots=[root])
    with gzip.open(root / "paper" / "sgd" / "metrics.jsonl.gz", "wb") as f:
        f.write(rows[: len(rows) // 2])  # truncated rows: the summary is unchanged, the digest is not
    assert records_digest(["paper"], ["sgd", "adamw"], roots=[root]) != added


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


HEAD = '# %% tags=["parameters"]\nprofile = "smoke"\nseed = 0\ndevice = "auto"\n\n# %%\nx = 1\n'


def test_a_dead_kernel_is_named_and_the_other_chapters_go_on(tmp_path):
    dead, good = tmp_path / "zz_dead_kernel_for_test.py", tmp_path / "zz_after_it_for_test.py"
    dead.write_text(HEAD + "\n# %%\nimport os\n\nos._exit(1)\n")
    good.write_text(HEAD)
    r = book("execute", "--profile", "smoke", "--out", str(tmp_path / "b"), str(dead), str(good))
    assert r.returncode == 1
    assert statuses(r.stdout) == {str(dead): "failed", str(good): "executed"}
    failed = [line for line in r.stderr.splitlines() if "zz_dead_kernel_for_test.py failed" in line]
    assert len(failed) == 1 and "kernel" in failed[0].lower() and "Traceback" not in r.stderr


def _kernels_that_die_at_start(tmp_path: Path, times: int) -> str:
    """An IPython directory whose startup file ends the first ``times`` kernels started with it before they
    answer their first request (as a kernel that lost the race for a port does); returns its path."""
    ipython = tmp_path / "ipython"
    startup = ipython / "profile_default" / "startup"
    startup.mkdir(parents=True)
    count = tmp_path / "starts"
    (startup / "00-die.py").write_text(
        f"import os\np = {str(count)!r}\nn = len(open(p).read()) if os.path.exists(p) else 0\n"
        f"open(p, 'a').write('x')\nif n < {times}:\n    os.write(2, b'planted: died at start\\n')\n"
        "    os._exit(3)\n"
    )
    return str(ipython)


def test_a_kernel_that_dies_at_start_is_started_again(tmp_path):
    good = tmp_path / "zz_restarted_for_test.py"
    good.write_text(HEAD + "\n# %%\nprint('ran', x)\n")
    ipython = _kernels_that_die_at_start(tmp_path, times=1)
    r = book("execute", "--profile", "smoke", "--out", str(tmp_path / "b"), str(good), IPYTHONDIR=ipython)
    assert r.returncode == 0, r.stdout + r.stderr
    assert statuses(r.stdout) == {str(good): "executed"}
    assert "kernel died at start: planted: died at start; starting it again" in r.stdout
    assert (tmp_path / "starts").read_text() == "xx"  # died once, ran at the second start


def test_a_kernel_that_always_dies_at_start_fails_its_chapter_with_the_reason(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    import book as book_tool

    good = tmp_path / "zz_never_starts_for_test.py"
    good.write_text(HEAD)
    ipython = _kernels_that_die_at_start(tmp_path, times=99)
    r = book("execute", "--profile", "smoke", "--out", str(tmp_path / "b"), str(good), IPYTHONDIR=ipython)
    assert r.returncode == 1 and statuses(r.stdout) == {str(good): "failed"}
    tries = book_tool.KERNEL_START_TRIES
    assert f"at each of {tries} starts: planted: died at start" in r.stderr
    assert len((tmp_path / "starts").read_text()) == tries


def _wait_for(pred, timeout: float = 120.0) -> None:
    import time

    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError("the event did not happen")
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig, jobs, rc", [("SIGTERM", "2", 143), ("SIGINT", "1", 130)])
def test_a_stopped_build_stops_its_kernels_and_stamps_nothing(tmp_path, sig, jobs, rc):
    """SIGTERM to the book tool (what timeout and a CI cancel send), or Ctrl-C to its process group: every kernel
    stops, no chapter is stamped or left half-staged, and the tool says so in one line."""
    import signal

    pids = [tmp_path / f"kernel{i}.pid" for i in range(2)]
    chapters = []
    for i, pid in enumerate(pids):
        nb = tmp_path / f"zz_sleeper{i}_for_test.py"
        nb.write_text(
            HEAD + f"\n# %%\nimport os, signal\n\nopen({str(pid)!r}, 'w').write(str(os.getpid()))\nsignal.pause()\n"
        )
        chapters.append(str(nb))
    out = tmp_path / "b"
    env = {**os.environ, "ATTNID_RUNS": RUNS}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tools" / "book.py"), "execute", "--profile", "smoke", "--out", str(out),
         "--jobs", jobs, *chapters], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    started = pids if jobs == "2" else pids[:1]
    kernels: list[int] = []
    try:
        _wait_for(lambda: all(p.exists() and p.read_text() for p in started))
        kernels = [int(p.read_text()) for p in started]
        if sig == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _stdout, stderr = proc.communicate(timeout=120)
    finally:  # a build that did not stop must not outlive the test
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            for k in kernels:
                if _alive(k):
                    os.kill(k, signal.SIGKILL)
    assert proc.returncode == rc, stderr[-3000:]
    assert f"interrupted ({sig})" in stderr and "Traceback" not in stderr, stderr[-3000:]
    _wait_for(lambda: not any(_alive(k) for k in kernels), timeout=30)
    generated = out / "_generated"
    assert not list(generated.glob("*.hash")) and not list(generated.glob(".*.source.ipynb"))


def test_a_page_that_never_loads_is_a_finding_and_the_others_are_kept(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip("no /usr/bin/chromium (apt-get install chromium)")
    sys.path.insert(0, str(ROOT / "tools"))
    from check_pages import check_book

    html = tmp_path / "html"
    html.mkdir()
    (html / "a.html").write_text("<html><head><title>a</title></head><body><p>fine</p></body></html>")
    (html / "b.html").write_text("<html><body><p>stuck</p><script>while (true) {}</script></body></html>")
    problems = check_book(html, timeout_s=3)
    assert [p for p in problems if p.startswith("b.html")] == [
        "b.html: could not be checked (TimeoutError: Page.goto: Timeout 3000ms exceeded.)"
    ]
    assert any(p.startswith("a.html") for p in problems)  # the other page's findings are not lost


def test_the_cache_knows_which_suites_each_chapter_reads():
    """The thin chapters read records through their chapter module (``READS``); a fork that calls
    ``load_suite`` names its suites itself; a chapter that reads none has no records digest."""
    sys.path.insert(0, str(ROOT / "tools"))
    import book as book_tool

    def reads(name: str) -> set[str]:
        return book_tool.suites_read((ROOT / "notebooks" / f"{name}.py").read_text())

    assert reads("06_training_dynamics") == {"dynamics"}
    assert reads("07_heads") == {"dynamics", "heads"}
    assert reads("08_beyond_attention") == set() and reads("02_invariances") == set()
    fork = 'from attnid.lm.analysis import load_suite\nload_suite("paper", "heads")\n'
    assert book_tool.suites_read(fork) == {"heads"}
    assert book_tool.records_read(ROOT / "notebooks" / "06_training_dynamics.py", "smoke") != ""
