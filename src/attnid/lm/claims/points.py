"""Chapter 10's claims on trained points (:data:`POINT_CLAIMS`): each trained run's layers audited at their
trained weights, and weight decay's motion along the symmetry, read from the saved snapshots."""

from __future__ import annotations

import numpy as np

from ..analysis import (
    Cases,
)
from ..profiles import SUITES
from ..records import Record
from .claim import Claim, Undecidable

POINT_CASES = tuple(SUITES["points"].cases)  # the four optimizer cases at the width audited exactly


def _corpus():
    from ..data import DataError, load

    try:
        return load()
    except DataError as e:
        raise Undecidable(f"auditing a trained point reads validation text: {e}") from None


def _point_audits(rec: Record) -> list[dict]:
    """Every layer's trained-point audit of ``rec``'s final weights (kept in its ``points.json``)."""
    from ..points import audit_run

    try:
        return audit_run(rec.path, _corpus(), seed=int(rec.config["seed"]), cache=True)
    except FileNotFoundError:
        raise Undecidable(f"{rec.name} kept no weights (model.pt); rerun it with --save-model --force") from None


def off_generic(c: Cases) -> float:
    """Layers of the narrow optimizer runs (:data:`POINT_CASES`) whose audit does not give the generic count."""
    return float(sum(r["at_generic"] is not True for case in POINT_CASES for r in _point_audits(c[case])))


def weakest_point(c: Cases) -> float:
    """The weakest identified direction (share of the strongest) over the layers of the narrow optimizer runs."""
    return min(float(r["weakest"]) for case in POINT_CASES for r in _point_audits(c[case]) if r["weakest"] is not None)


def along_symmetry(rec: Record) -> float:
    """The share of the squared distance from initialisation that the symmetry undoes at the last snapshot,
    ``1 − (orbit / raw)²``, mean over layers (:func:`attnid.lm.points.snapshot_distances`)."""
    from ..points import snapshot_distances

    try:
        rows = snapshot_distances(rec.path, points=1, cache=True)
    except FileNotFoundError:
        raise Undecidable(f"{rec.name} kept no snapshots (model.pt); rerun it with --save-model --force") from None
    last = [r for r in rows if r["step"] == max(r["step"] for r in rows)]
    return float(np.mean([1 - (r["orbit"] / r["raw"]) ** 2 for r in last]))


POINT_CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="trained_points_generic",
        claim="trained attention layers sit at the generic count (no head collapses)",
        metric="layers of the four narrow optimizer runs (E = 16, 2 heads) off the generic count",
        value=off_generic,
        op="<",
        threshold=0.5,
        why="the count holds for almost every parameter value; a layer off it is a special point (a head whose "
        "query map lost rank r adds (D − r)(E − 1 − D) directions). The audit is exact at this width (the whole "
        "Jacobian's singular values), so one seed decides",
        cases=POINT_CASES,
        control_text="the weakest identified direction over those layers (share of the strongest)",
        control=weakest_point,
        kind="theorem",
        suite="points",
        stated_by="chapter 10",
    ),
    Claim(
        id="wd_moves_along_symmetry",
        claim="weight decay moves SGD's weights along the symmetry",
        metric="share of the squared distance from initialisation that the symmetry undoes at the end, SGD + weight "
        "decay − SGD",
        value=lambda c: along_symmetry(c["sgd_wd"]) - along_symmetry(c["sgd"]),
        op=">",
        threshold=0.1,
        why="weight decay shrinks the weights toward the smallest point of their orbit, a move that changes no "
        "output; ten percentage points more of the distance undone than under plain SGD, the control, whose "
        "curved path is itself partly undone by the fit",
        cases=("sgd", "sgd_wd"),
        control_text="plain SGD's share",
        control=lambda c: along_symmetry(c["sgd"]),
        stated_by="chapter 10",
    ),
)
POINT_CLAIM_IDS = tuple(c.id for c in POINT_CLAIMS)
