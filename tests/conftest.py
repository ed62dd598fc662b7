"""Shared test setup. No global dtype: each test states float64 where the math needs it, and the
model and training tests run in float32, as the book does."""

import os
import resource
from collections import Counter

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # about one worker per core (make test): one thread each
    import torch

    torch.set_num_threads(1)
    # and in the processes the tests start (kernels, commands): threads beyond the cores spin and cost CPU
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")


@pytest.fixture(scope="session")
def corpus():
    """The tiny Shakespeare corpus ($ATTNID_DATA, the local copy, or a download); skipped without it."""
    from attnid.lm import data as data_mod

    try:
        return data_mod.load()
    except data_mod.DataError as e:
        if os.environ.get("CI"):  # CI must run the training tests, not skip them: `make data` runs first there
            pytest.fail(f"corpus not available in CI: {e}")
        pytest.skip(f"corpus not available: {e}")


@pytest.fixture(scope="session")
def paper():
    """The committed paper-scale records of the dynamics suite; skipped where the checkout lacks them."""
    from attnid.lm.analysis import load_suite

    runs = load_suite("paper")
    if not {"sgd", "sgd_wd", "adamw"} <= set(runs.runs):
        pytest.skip("the committed paper-scale records are not in this checkout")
    return runs


# the longest files of `make test-book` and `make test` (the CPU seconds each took, printed below each run): started
# first, beside the others, so that no long file starts last and runs alone
FIRST = ("tests/test_book.py", "tests/test_book_tool.py", "tests/test_blocks.py", "tests/test_hf.py")
BOOK_FIXTURE = "smoke_book"  # tests/test_book.py's: every chapter executed at profile smoke and the book built


def pytest_collection_modifyitems(items):
    """Under ``--dist loadfile --no-loadscope-reorder`` (make test) files go to the workers in collection order,
    and a worker takes its next file only when its current one is nearly done: the longest files go first,
    so that the other workers run everything else meanwhile instead of one file waiting behind them.

    The book's tests are marked ``book`` (``make test-book`` runs them, ``make test`` the others): the files that
    execute chapters, build books or open pages mark themselves, and a test that reads the smoke book is marked here
    wherever it is."""
    for item in items:
        if BOOK_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.book)

    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return FIRST.index(path) if path in FIRST else len(FIRST)

    items.sort(key=rank)


# ------------------------------------------------------------------ what each test file costs in CPU
# `--durations` gives wall seconds, which on a busy machine (three workers on two cores) say more about the
# neighbours than the test. The suite's time on two cores is bounded below by its CPU seconds over two; this is
# the budget each file takes of it, printed at the end of every run.
CPU_KEY = "cpu_s"
_CPU_START = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    """User and system seconds of this process and of every child it has waited for (commands, kernels)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_START] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "teardown" and _CPU_START in item.stash:  # setup, call and teardown (and the fixtures made)
        report.user_properties.append((CPU_KEY, _cpu_seconds() - item.stash[_CPU_START]))


def cpu_by_file(reports) -> Counter:
    """CPU seconds by test file, from the reports' ``cpu_s`` properties (they travel from the xdist workers)."""
    cost: Counter = Counter()
    for r in reports:
        for key, value in getattr(r, "user_properties", ()):
            if key == CPU_KEY:
                cost[r.nodeid.split("::")[0]] += value
    return cost


def pytest_terminal_summary(terminalreporter):
    cost = cpu_by_file(r for reports in terminalreporter.stats.values() for r in reports)
    if not cost:
        return
    terminalreporter.section("CPU seconds by test file (less sensitive than wall time to a busy machine)")
    shown = cost.most_common(12)
    for name, seconds in shown:
        terminalreporter.write_line(f"{seconds:8.1f}  {name}")
    if len(cost) > len(shown):
        rest = sum(cost.values()) - sum(s for _, s in shown)
        terminalreporter.write_line(f"{rest:8.1f}  the other {len(cost) - len(shown)} files")
    total, cores = sum(cost.values()), os.cpu_count() or 1
    terminalreporter.write_line(f"{total:8.1f}  in all: this run needs at least {total / cores:.0f} s on {cores} cores")
