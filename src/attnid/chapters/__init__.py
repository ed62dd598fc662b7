"""What the book's chapters draw and say, as tested functions: each chapter module returns figures
(``fig_*``), tables (``table_*`` -> DataFrame) and ``facts`` (numbers and phrases for myst-nb ``glue``)
computed from the records or the math, so that a chapter keeps only prose, parameters and calls.

It builds on :mod:`attnid` and :mod:`attnid.lm` and only reads run records: training the runs a chapter reads is
:func:`attnid.lm.launch.train_suites`'s job. Nothing below it imports it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..lm import analysis as an
from ..lm.analysis import SuiteRuns
from ..lm.profiles import DEEP_SGD, LR_SWEEP, SUITES
from ..lm.records import Record

PAPER_CMD = "attnid experiments --profile paper --device cuda"
CASE_LABELS = {  # the optimizer cases' display names, applied only when a table or figure is drawn
    **{case: f"SGD, η = {lr:g}" for lr, case in LR_SWEEP.items()},
    "sgd": "SGD",
    "sgd_wd": "SGD + weight decay",
    "adamw": "AdamW",
    "adamw_rebalance": "AdamW + rebalancing",
    DEEP_SGD: f"SGD, {SUITES['dynamics'].cases[DEEP_SGD]['n_layer']} layers",  # the deeper SGD run of shallow profiles
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
    """For display only: the case ids of column ``col`` as their names (an id without one shown as itself)."""
    return df.assign(**{col: df[col].map(lambda c: CASE_LABELS.get(c, c))})


def read_suite(
    profile: str,
    suite: str,
    *,
    every_seed: bool = False,
    current: Callable[[Record], bool] = lambda rec: True,
) -> SuiteRuns:
    """The finished runs of ``suite`` at ``profile``, read from the records on disk (nothing is trained here: the
    book tool trains a chapter's runs before its kernel starts, and a chapter run by hand calls
    :func:`attnid.lm.launch.train_suites` first). Raises :class:`~attnid.lm.analysis.RecordError` naming every
    case that is missing, lacks one of the profile's seeds (``every_seed``) or whose first record fails
    ``current`` (made by an older probe), and the command that makes them."""
    spec = SUITES[suite]
    seeds = list(spec.seeds[profile])
    runs = an.load_suite(profile, suite, seeds=seeds if every_seed else None)
    missing = [
        c
        for c in spec.cases_at(profile)
        if c not in runs or (every_seed and len(runs.runs[c]) < len(seeds)) or not current(runs.first(c))
    ]
    if missing:
        make = PAPER_CMD if profile == "paper" else f"attnid experiments --profile {profile} --suite {suite}"
        raise an.RecordError(
            f"the {profile} profile needs every {suite!r} record, made by the current code; missing or older: "
            f"{', '.join(missing)}. Make them with `{make} --force` (or `make chapter NB=...`, which trains what a "
            "chapter reads)"
        )
    return runs
