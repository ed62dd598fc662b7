"""Shared test setup. No global dtype: each test states float64 where the math needs it, and the
model and training tests run in float32, as the book does."""

import os

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
        pytest.skip(f"corpus not available: {e}")


@pytest.fixture(scope="session")
def paper():
    """The committed paper-scale records of the dynamics suite; skipped where the checkout lacks them."""
    from attnid.lm.analysis import load_suite

    runs = load_suite("paper")
    if not {"sgd", "sgd_wd", "adamw"} <= set(runs.runs):
        pytest.skip("the committed paper-scale records are not in this checkout")
    return runs


FIRST = "tests/test_book.py"  # the longest file (it builds the smoke book): started first, beside the others


def pytest_collection_modifyitems(items):
    """Under ``--dist loadfile --no-loadscope-reorder`` (make test) files go to the workers in collection order,
    and a worker takes its next file only when its current one is nearly done: the longest file goes first,
    so that the other worker runs everything else meanwhile instead of one file waiting behind it."""
    items.sort(key=lambda item: item.nodeid.split("::")[0] != FIRST)
