"""What the book's chapters draw and say, as tested functions: each chapter module returns figures
(``fig_*``), tables (``table_*`` -> DataFrame) and ``facts`` (numbers and phrases for myst-nb ``glue``)
computed from the records or the math, so that a chapter keeps only prose, parameters and calls.

It builds on :mod:`attnid` and :mod:`attnid.lm`; nothing below it imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..lm import analysis as an
from ..lm.analysis import SuiteRuns
from ..lm.launch import run_suite
from ..lm.profiles import LR_SWEEP, SUITES, resolve_device
from ..lm.records import Record

PAPER_CMD = "attnid experiments --profile paper --device cuda"
CASE_LABELS = {  # the optimizer cases' display names, applied only when a table or figure is drawn
    **{case: f"SGD, η = {lr:g}" for lr, case in LR_SWEEP.items()},
    "sgd": "SGD",
    "sgd_wd": "SGD + weight decay",
    "adamw": "AdamW",
    "adamw_rebalance": "AdamW + rebalancing",
}


def with_formats(df, **formats):
    """``df`` carrying its display formats (``attnid.plotting.table`` reads ``df.attrs["formats"]``)."""
    df.attrs["formats"] = formats
    return df


def md(text: str) -> None:
    """Show ``text`` as Markdown in the notebook (a computed sentence beside its table)."""
    from IPython.display import Markdown, display

    display(Markdown(text))


def labelled(df, col: str = "case"):
    """For display only: the case ids of column ``col`` as their names."""
    return df.assign(**{col: df[col].map(CASE_LABELS)})


def trains_here(profile: str, device: str = "auto") -> bool:
    """Whether a chapter trains the runs it reads at ``profile`` on ``device``: always, except at the paper
    profile without a GPU, where it reads the committed records alone."""
    return profile != "paper" or resolve_device(device).startswith("cuda")


def train_suites(
    profile: str, suites: Iterable[str], device: str = "auto", report: Callable[[str], None] = lambda _: None
) -> int:
    """Train the runs of ``suites`` that :func:`ensure_suite` would train (none at the paper profile without
    a GPU); returns how many. The book tool calls it before it executes a chapter, so that the chapter reads
    records it does not change and executes once."""
    if not trains_here(profile, device):
        return 0
    return sum(run_suite(profile, suite, device=device, report=report) for suite in suites)


def ensure_suite(
    profile: str,
    suite: str,
    device: str = "auto",
    *,
    every_seed: bool = False,
    current: Callable[[Record], bool] = lambda rec: True,
    hint: str = PAPER_CMD,
) -> SuiteRuns:
    """The finished runs of ``suite`` at ``profile``: trained here first (finished runs are reused) unless the
    profile is the paper's and no GPU is present, when the records alone are read. Raises
    :class:`~attnid.lm.analysis.RecordError` naming every case that is missing, lacks one of the profile's
    seeds (``every_seed``) or whose first record fails ``current`` (made by an older probe), and ``hint``,
    the command that makes them."""
    if trains_here(profile, device):
        run_suite(profile, suite, device=device)
    spec = SUITES[suite]
    seeds = list(spec.seeds[profile])
    runs = an.load_suite(profile, suite, seeds=seeds if every_seed else None)
    missing = [
        c
        for c in spec.cases_at(profile)
        if c not in runs or (every_seed and len(runs.runs[c]) < len(seeds)) or not current(runs.first(c))
    ]
    if missing:
        raise an.RecordError(
            f"the {profile} profile needs every {suite!r} record, made by the current code; missing or older: "
            f"{', '.join(missing)}. Make them with `{hint}`"
        )
    return runs
