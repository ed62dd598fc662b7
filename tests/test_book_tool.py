"""The book tool (tools/book.py, tools/check_pages.py) on tiny chapters and pages: a failing cell or a dead
kernel is named and the other chapters go on, a stop stamps nothing, the cache reads the records a chapter
reads, and the page check reports what it cannot check. The smoke book itself is tests/test_book.py's."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from booktool import HEAD, ROOT, RUNS, book, book_tool, execute_here, need_chromium, refusal, statuses, tool

pytestmark = [pytest.mark.slow, pytest.mark.book]  # kernels and browsers: seconds each


def test_failing_chapter_is_named_with_its_cell(tmp_path):
    """Two chapters side by side (--jobs 2): the failing one is named with its cell, the other is executed."""
    bad, good = tmp_path / "zz_failing_for_test.py", tmp_path / "zz_passing_for_test.py"
    bad.write_text(HEAD + '\n# %%\nraise RuntimeError("deliberate failure")\n')
    good.write_text(HEAD)
    r = book("execute", "--profile", "smoke", "--out", str(tmp_path / "b"), "--jobs", "2", str(bad), str(good))
    assert r.returncode == 1
    assert "zz_failing_for_test.py failed in cell" in r.stderr and "deliberate failure" in r.stderr
    assert statuses(r.stdout) == {str(bad): "failed", str(good): "executed"}


def test_bad_profile_is_refused(capsys, monkeypatch):
    code, err = refusal(capsys, monkeypatch, "execute", "--profile", "huge")
    assert code == 2 and "profile must be one of smoke, cpu, mid, paper, got 'huge'" in err


@pytest.mark.parametrize("seed", ["-1", "99999999999999999999"])
def test_a_seed_out_of_range_is_refused_before_any_chapter(tmp_path, seed, capsys, monkeypatch):
    code, err = refusal(
        capsys, monkeypatch, "execute", "--profile", "smoke", "--out", str(tmp_path / "b"), "--seed", seed
    )
    assert code == 2 and "seed must be an integer from 0 to 2**63 - 1" in err and "Overflow" not in err
    assert not (tmp_path / "b").exists()  # refused before the staging folder is made


def test_a_fork_under_any_name_is_executed_by_make_chapter(tmp_path):
    fork = (ROOT / "notebooks" / "my_fork.py").resolve()
    todo, forced = book_tool().plan("build", [fork], force=False)
    assert todo == [fork] and forced == {fork}  # that chapter alone: the others are left as they are
    todo, forced = book_tool().plan("execute", None, force=False)
    assert todo == book_tool().chapters() and not forced


def test_make_chapter_on_a_fresh_checkout_executes_one_chapter_and_builds(tmp_path):
    """`make chapter NB=notebooks/01_definitions.py` with nothing executed before: that chapter alone (nothing
    trained), a page saying so for each of the others, and the strict HTML build passes."""
    out = tmp_path / "b"
    r = book("build", "--profile", "smoke", "--out", str(out), "notebooks/01_definitions.py")
    assert r.returncode == 0, r.stderr[-3000:]
    assert statuses(r.stdout) == {"notebooks/01_definitions.py": "executed"} and "trained" not in r.stdout
    assert "not executed in this build (a page says so): notebooks/00_introduction.py" in r.stdout
    page = out / "_build" / "html" / "_generated" / "06_training_dynamics.html"
    assert "has not been executed in this build" in page.read_text()
    assert (out / "_build" / "html" / "_generated" / "01_definitions.html").exists()


def test_cache_sees_the_records_a_chapter_reads(tmp_path, monkeypatch):
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
        return execute_here(monkeypatch, reader, out, ATTNID_HOME=str(home))

    assert run() == "executed"
    assert run() == "cached"
    shutil.rmtree(home / "data" / "runs" / "paper" / "sgd")
    assert run() == "executed"
    assert run() == "cached"


def test_records_digest_changes_with_the_records(tmp_path):
    records_digest = book_tool().records_digest

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


def test_the_page_check_reads_the_figure_constants_of_the_library():
    """tools/check_pages.py reads DPI and MIN_FONT_PT from plotting.py's source (no torch in its processes)."""
    from attnid import plotting

    pages = tool("check_pages")
    assert (pages.DPI, pages.MIN_FONT_PT) == (plotting.DPI, plotting.MIN_FONT_PT)


def test_book_tool_refuses_a_folder_as_chapter_and_a_file_as_out(tmp_path, capsys, monkeypatch):
    code, err = refusal(
        capsys, monkeypatch, "execute", "--profile", "smoke", "--out", str(tmp_path / "b"), str(tmp_path)
    )
    assert code == 2 and "not a chapter source" in err
    f = tmp_path / "file"
    f.write_text("")
    code, err = refusal(capsys, monkeypatch, "execute", "--profile", "smoke", "--out", str(f))
    assert code == 2 and "not a folder" in err


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
    good = tmp_path / "zz_never_starts_for_test.py"
    good.write_text(HEAD)
    ipython = _kernels_that_die_at_start(tmp_path, times=99)
    r = book("execute", "--profile", "smoke", "--out", str(tmp_path / "b"), str(good), IPYTHONDIR=ipython)
    assert r.returncode == 1 and statuses(r.stdout) == {str(good): "failed"}
    tries = book_tool().KERNEL_START_TRIES
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


@pytest.mark.parametrize(
    "sig, jobs, rc, twice", [("SIGTERM", "2", 143, False), ("SIGINT", "1", 130, False), ("SIGTERM", "2", 143, True)]
)
def test_a_stopped_build_stops_its_kernels_and_stamps_nothing(tmp_path, sig, jobs, rc, twice):
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
        if twice:  # a second SIGTERM while the first one's stop is under way (a kernel already gone)
            _wait_for(lambda: proc.poll() is not None or not all(_alive(k) for k in kernels))
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
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
    need_chromium()
    check_book = tool("check_pages").check_book

    html = tmp_path / "html"
    html.mkdir()
    (html / "a.html").write_text("<html><head><title>a</title></head><body><p>fine</p></body></html>")
    (html / "b.html").write_text("<html><body><p>stuck</p><script>while (true) {}</script></body></html>")
    switch = '<button class="theme-switch-button" onclick="document.documentElement.dataset.theme = \'{}\'">'
    for name, turns in (("c", "dark"), ("d", "light")):  # a theme switch that works, and one that does not
        (html / f"{name}.html").write_text(
            f'<html data-theme="light"><body>{switch.format(turns)}mode</button><p>fine</p></body></html>'
        )
    # a page that loads 1.6 MB as it opens (over the budget), and one that fetches as much only when asked
    (html / "heavy.js").write_text("//" + "x" * 1_600_000)
    (html / "e.html").write_text('<html><body><p>heavy</p><script src="heavy.js"></script></body></html>')
    (html / "f.html").write_text("<html><body><button onclick=\"fetch('heavy.js')\">load</button></body></html>")
    # at 390 px: a wide table box without a cue that it scrolls, the same with the book's script (which adds one),
    # and a formula cut off at the top by its box
    wide = '<div class="pst-scrollable-table-container" style="overflow-x:auto"><table><tr>' + "<td>cell</td>" * 60
    (html / "g.html").write_text(f"<html><body><article>{wide}</tr></table></div></article></body></html>")
    shutil.copy(ROOT / "book" / "_static" / "attnid.js", html / "attnid.js")
    (html / "h.html").write_text(
        f'<html><body><article>{wide}</tr></table></div></article><script src="attnid.js"></script></body></html>'
    )
    (html / "i.html").write_text(
        '<html><body><article><p><span style="display:inline-flex;overflow:hidden;height:10px">'
        '<span style="font-size:30px">R<sup>D×E</sup></span></span></p></article></body></html>'
    )
    problems = check_book(html, tmp_path / "shots", timeout_s=3)
    assert any(p.startswith("g.html (390 px): 1 boxes scroll sideways with no cue") for p in problems), problems
    assert not [p for p in problems if p.startswith("h.html") and "cue" in p]
    assert any(p.startswith("i.html (390 px): 1 boxes cut off their content") for p in problems), problems
    assert "e.html (1300 px): loads 1.60 MB as it opens, over 1.5 MB" in problems
    assert "e.html (390 px): loads 1.60 MB as it opens, over 1.5 MB" in problems
    assert not [p for p in problems if p.startswith("f.html") and "MB" in p]
    assert [p for p in problems if p.startswith("b.html")] == [
        "b.html: could not be checked (TimeoutError: Page.goto: Timeout 3000ms exceeded.)"
    ]
    assert "a.html (1300 px): no theme switch" in problems  # the other pages' findings are not lost
    assert not [p for p in problems if p.startswith("c.html") and "mode" in p]
    assert "d.html (dark, 1300 px): the page is in 'light' mode, not 'dark'" in problems
    shots = {p.name for p in (tmp_path / "shots").iterdir()}
    assert {"c-light.png", "c-dark.png", "c-phone.png", "a-light.png"} <= shots and "b-light.png" not in shots


def test_the_cache_knows_which_suites_each_chapter_reads():
    """The thin chapters read records through their chapter module (``READS``); a fork that calls
    ``load_suite`` names its suites itself; a chapter that reads none has no records digest."""

    def reads(name: str) -> set[str]:
        return book_tool().suites_read((ROOT / "notebooks" / f"{name}.py").read_text())

    assert reads("06_training_dynamics") == {"dynamics"}
    assert reads("07_heads") == {"dynamics", "heads"}
    assert reads("08_beyond_attention") == set() and reads("02_invariances") == set()
    fork = 'from attnid.lm.analysis import load_suite\nload_suite("paper", "heads")\n'
    assert book_tool().suites_read(fork) == {"heads"}
    assert book_tool().records_read(ROOT / "notebooks" / "06_training_dynamics.py", "smoke") != ""


def test_the_runs_a_chapter_trains_are_trained_before_its_kernel_starts(monkeypatch, tmp_path):
    """Chapters 6 and 7 read runs that they train first where they can (``train_suites``). The tool trains them
    first, so the records do not change while the chapter runs (it would be executed a second time); at the paper
    profile without a GPU, or for a fork that only reads records (``load_suite``), it trains nothing."""
    import attnid.lm.launch as chapters
    from attnid.lm.profiles import SUITES

    calls: list[tuple[str, set[str], str]] = []

    def train_configs(cfgs, device: str = "auto", report=None, parallel=None) -> int:
        calls.append((cfgs[0].profile, {c.case for c in cfgs}, device))
        return 0

    monkeypatch.setattr(chapters, "train_configs", train_configs)
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path / "runs"))  # none trained: every run is one to train
    heads = ROOT / "notebooks" / "07_heads.py"
    book_tool().train_before(heads, {"profile": "smoke", "seed": 0, "device": "cpu"})
    both = set(SUITES["dynamics"].cases_at("smoke")) | set(SUITES["heads"].cases_at("smoke"))
    assert calls == [("smoke", both, "cpu")]  # one launch: the longest runs of both suites first
    calls.clear()
    book_tool().train_before(heads, {"profile": "paper", "seed": 0, "device": "cpu"})
    fork = tmp_path / "fork.py"
    fork.write_text('from attnid.lm.analysis import load_suite\nload_suite("smoke", "heads")\n')
    book_tool().train_before(fork, {"profile": "smoke", "seed": 0, "device": "cpu"})
    book_tool().train_before(ROOT / "notebooks" / "02_invariances.py", {"profile": "smoke"})
    assert calls == []


def test_a_cold_cpu_book_trains_its_runs_beside_the_chapters_that_read_none(monkeypatch, tmp_path):
    """On the CPU beyond the smoke profile the runs that chapters train are trained in the background, and the chapters
    that read none of them execute first; then those that read them, the cheapest runs first. Not at smoke (inline
    runs), not where every run is trained, and not for a build whose every chapter reads them (nothing to execute
    beside them)."""
    book = book_tool()
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path / "runs"))
    nbs = {p.stem: p for p in book.chapters()}
    suites, order = book.plan_ahead(book.chapters(), {"profile": "cpu", "device": "cpu"})
    assert suites == ["dynamics", "points", "heads"]  # chapter 6 needs dynamics, 10 adds points (cheaper than heads)
    readers = ["06_training_dynamics", "10_your_model", "07_heads"]
    assert [p.stem for p in order[-3:]] == readers and sorted(order) == sorted(book.chapters())
    assert book.plan_ahead(book.chapters(), {"profile": "smoke", "device": "cpu"}) == ([], book.chapters())
    assert book.plan_ahead(book.chapters(), {"profile": "paper", "device": "cpu"})[0] == []  # trains nothing
    only_readers = [nbs[n] for n in readers]
    assert book.plan_ahead(only_readers, {"profile": "cpu", "device": "cpu"}) == ([], only_readers)
    import attnid.lm.launch as launch

    monkeypatch.setattr(launch, "suite_configs", lambda *a, **k: [])  # every run already trained
    assert book.plan_ahead(book.chapters(), {"profile": "cpu", "device": "cpu"})[0] == []


def test_the_chapters_that_read_runs_trained_ahead_wait_for_them_and_a_stop_stops_them(monkeypatch, tmp_path):
    """execute_all waits for the runs a chapter reads before it executes (not before the others, and only for the
    suites it reads) and stops the training when the build stops."""
    book = book_tool()
    events: list[str] = []
    free, reader = ROOT / "notebooks" / "02_invariances.py", ROOT / "notebooks" / "06_training_dynamics.py"

    class Ahead:
        def __init__(self, profile, suites, device):
            events.append(f"start {profile} {','.join(suites)}")

        def wait_for(self, names):
            events.append(f"wait {','.join(names)}")

        def stop(self):
            events.append("stop")

    monkeypatch.setattr(book, "TrainingAhead", Ahead)
    heads = ROOT / "notebooks" / "07_heads.py"
    monkeypatch.setattr(book, "plan_ahead", lambda todo, params: (["dynamics", "heads"], [free, reader, heads]))
    monkeypatch.setattr(book, "share_the_cores", lambda: 1)

    def execute(nb, *args):
        events.append(nb.stem)
        return "executed", "", 0.1

    monkeypatch.setattr(book, "_execute_job", execute)
    book.execute_all(tmp_path, {"profile": "cpu"}, [reader, heads, free], ROOT / "src", set())
    assert events == ["start cpu dynamics,heads", "02_invariances", "wait dynamics", "06_training_dynamics",
                      "wait dynamics,heads", "07_heads", "stop"]  # fmt: skip
    events.clear()

    def stopped(nb, *args):
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(book, "_execute_job", stopped)
    with pytest.raises(book.Interrupted, match=r"interrupted \(SIGTERM\): 3 chapter"):
        book.execute_all(tmp_path, {"profile": "cpu"}, [reader, heads, free], ROOT / "src", set())
    assert events == ["start cpu dynamics,heads", "stop"]


def test_training_in_the_background_trains_the_runs_and_stops_on_sigterm(corpus, tmp_path, monkeypatch, capfd):
    """The child process itself: it trains the runs (each printed, each a finished record) and ends with 0; on
    SIGTERM (a cpu suite, its runs in processes of their own) it stops its runs and ends with 143 without a
    traceback, and leaves no finished record behind."""
    import attnid.lm.records as records

    book = book_tool()
    runs = tmp_path / "runs"
    monkeypatch.setenv("ATTNID_RUNS", str(runs))
    ahead = book.TrainingAhead("smoke", ["points"], "cpu")
    child = ahead.proc
    ahead.wait_for(["points"])
    assert child is not None
    child.join(120)  # the last run's line is printed a moment after its record is finished
    out, err = capfd.readouterr()
    assert "trained    the runs of points in the background" in out and out.count("(in the background)") == 4, err
    trained = [d for d in (runs / "smoke").iterdir() if d.is_dir()]
    assert len(trained) == 4 and all(records.is_finished(d) for d in trained)
    ahead = book.TrainingAhead("cpu", ["dynamics"], "cpu")
    _wait_for(lambda: (runs / "cpu").is_dir() and any(d.is_dir() for d in (runs / "cpu").iterdir()), timeout=300)
    proc = ahead.proc
    ahead.stop()
    out, err = capfd.readouterr()
    assert proc is not None and proc.exitcode == 143 and "Traceback" not in err, err[-2000:]
    assert ahead.proc is None and not any(records.is_finished(d) for d in (runs / "cpu").iterdir() if d.is_dir())


def test_a_stop_while_the_tool_trains_a_chapters_runs_is_the_builds_stop(monkeypatch, tmp_path):
    """A training loop turns Ctrl-C (or the worker's SIGTERM) into its own ``Interrupted`` (where to resume);
    inside the book tool that is the build's stop, named by its signal, with nothing stamped."""
    from attnid.lm.lifecycle import Interrupted, interrupted

    tool = book_tool()

    def training(*args, **kwargs):
        try:
            raise KeyboardInterrupt("SIGTERM")
        except KeyboardInterrupt:
            raise interrupted(3, 2) from None

    monkeypatch.setattr(tool, "execute_one", training)
    with pytest.raises(Interrupted):
        training()
    chapter = ROOT / "notebooks" / "07_heads.py"
    with pytest.raises(tool.Interrupted, match=r"interrupted \(SIGTERM\): 1 chapter") as e:
        tool.execute_all(tmp_path, {"profile": "smoke"}, [chapter], ROOT / "src", set())
    assert e.value.unfinished == [chapter] and not list(tmp_path.rglob("*.hash"))


@pytest.mark.parametrize("cap_gb", [0.4, 1.5])
def test_the_page_check_under_a_memory_cap_is_one_line(tmp_path, cap_gb):
    """Under ulimit -v the Playwright driver dies at start, printing a native backtrace: the check says so in one
    line (exit 2), with the backtrace kept off the terminal."""
    need_chromium()
    import resource

    html = tmp_path / "html"
    html.mkdir()
    (html / "index.html").write_text("<html><body><p>x</p></body></html>")
    cap = int(cap_gb * 2**30)
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_pages.py"), str(html)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)),
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert "could not start" in lines[0] and "no page was checked" in lines[0]


def test_each_chapter_gets_the_cores_that_other_work_leaves_free(monkeypatch):
    """Beside busy processes a chapter's kernel gets one thread (OpenMP's threads spin waiting for one another
    when they outnumber the free cores), on a quiet machine every core; a count the user set is kept."""
    import torch

    book = book_tool()
    measure = book.busy_cores
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(book, "USER_THREADS", False)
        for var in book.THREAD_VARS:
            monkeypatch.delenv(var, raising=False)
        cores = os.cpu_count() or 1
        monkeypatch.setattr(book, "busy_cores", lambda: float(cores))  # every core busy: one thread still
        assert book.share_the_cores() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
        monkeypatch.setattr(book, "busy_cores", lambda: 0.0)
        assert book.share_the_cores() == cores and os.environ["MKL_NUM_THREADS"] == str(cores)
        monkeypatch.setattr(book, "USER_THREADS", True)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        monkeypatch.setattr(book, "busy_cores", lambda: 0.0)
        assert book.share_the_cores() == 1  # the user's count, whatever the load
        busy = measure(0.05)
        assert busy is None or 0.0 <= busy <= cores + 0.01  # read from /proc/stat where there is one
    finally:
        torch.set_num_threads(before)
