"""Optimizers compared at the same loss (:mod:`attnid.lm.claims`): the claims that compare optimizers read a second
time where each run first reaches the best validation loss all of them reach (:func:`matched_loss_twin`), since at
the same step a run that learns faster is at a later stage of training."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..analysis import (
    Cases,
    series,
)
from ..metrics import Key
from ..records import Record
from .claim import Claim, Undecidable

# the claims that compare optimizers, read a second time where each run first reaches the same validation loss: at
# the same step, a run that learns faster is at a later stage of training than the run it is compared with
MATCHED_LOSS = ("adamw_closest", "adamw_changes_beta", "adamw_spreads_tau")
MATCHED_SUFFIX = "_at_loss"
READ_TOLERANCE = 0.03  # nats: a run is read within this of the target (its estimate's distance plus its error)
SMOOTH_ROWS = 5  # the training loss is smoothed over this many rows (centred) before it shapes the curve
COVERAGE = 0.95  # the reading's error: a prediction interval at this level (prediction_error)
MIN_RESIDUALS = 3  # leave-one-out residuals a run needs before its reading's error is estimated


def matched_loss(recs: list[Record]) -> float:
    """The best validation loss that every run of ``recs`` reaches and holds: the largest of their
    :func:`held_best` (the largest of their best evaluations would be a noise dip of the slowest run's, which
    :func:`reading_at` rightly does not take for a crossing: that run would never reach the target)."""
    return max(held_best(r) for r in recs)


def held_best(rec: Record) -> float:
    """The lowest validation loss ``rec`` reaches and holds (:func:`val_loss_estimate`,
    :func:`first_crossing_that_holds`): over its rows, the least of the larger of the row's estimate and the median
    of the estimates that follow it over one interval between evaluations. :func:`reading_at` this target finds the
    run."""
    steps, est, se, _ = val_loss_estimate(rec)
    rows = _holding_rows(steps, se)
    return float(min(max(est[i], np.median(est[i : i + rows])) for i in range(len(est))))


@dataclass(frozen=True)
class Reading:
    """Where one run is read at a target loss: the row's ``step``, the validation loss estimated there (``loss``),
    and ``error``, the half-width of the estimate's 95 % prediction interval (:func:`prediction_error`; nan where
    the run has too few evaluations to estimate it)."""

    step: int
    loss: float
    error: float

    def off_target(self, target: float) -> float:
        """How far from ``target`` this reading may be: the estimate's distance plus its error (nan: unknown)."""
        return abs(self.loss - target) + self.error

    def text(self) -> str:
        err = "error unknown" if math.isnan(self.error) else f"± {self.error:.3f}"
        return f"step {self.step} ({self.loss:.3f} nats/char, {err})"


def _smooth(x: np.ndarray, k: int = SMOOTH_ROWS) -> np.ndarray:
    """Centred moving average over ``k`` values (fewer at the ends)."""
    half = k // 2
    c = np.concatenate([[0.0], np.cumsum(x)])
    lo = np.clip(np.arange(len(x)) - half, 0, len(x))
    hi = np.clip(np.arange(len(x)) + half + 1, 0, len(x))
    return (c[hi] - c[lo]) / (hi - lo)


def val_loss_estimate(rec: Record) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The validation loss at every row that holds a training loss, between the evaluations: the training loss
    smoothed over :data:`SMOOTH_ROWS` rows (the curve's shape, every ``metric_interval`` steps) plus the gap between
    the two losses (dropout, overfitting), interpolated linearly between the evaluations after the first and held
    before the second (the first, at initialisation, has no gap yet and the smoothing's bias is largest there).
    Returns ``(steps, estimate, eval_steps, loo)``: ``loo`` per evaluation, the error of predicting it from the
    evaluations either side (leave-one-out, over twice the interval), nan where it has no neighbour on both sides
    among the evaluations used. :func:`prediction_error` turns them into the reading's error."""
    st, tr = series(rec.rows, Key.TRAIN_LOSS)
    se, ve = series(rec.rows, Key.VAL_LOSS)
    if len(st) == 0 or len(se) == 0:
        raise Undecidable(f"{rec.name} holds no training or validation loss to read it at a loss")
    smooth = _smooth(tr)
    at_evals = np.interp(se, st, smooth)
    gap = ve - at_evals
    used = slice(1, None) if len(se) > 2 else slice(None)
    est = smooth + np.interp(st, se[used], gap[used])
    loo = np.full(len(se), np.nan)
    for j in range(used.start + 1 if used.start else 1, len(se) - 1):
        g = np.interp(se[j], [se[j - 1], se[j + 1]], [gap[j - 1], gap[j + 1]])
        loo[j] = abs(at_evals[j] + g - ve[j])
    return st, est, se, loo


def prediction_error(loo: np.ndarray, coverage: float = COVERAGE) -> float:
    """The half-width of a ``coverage`` prediction interval for an evaluation the estimate did not see, from a run's
    leave-one-out residuals ``loo`` (nan ignored): ``t_{(1+coverage)/2, n} · sqrt(1 + 1/n) · RMS(loo)`` with ``n``
    residuals (Student's t: the residuals' scale is estimated from few of them, 8 at mid, 18 at paper scale). The
    interval covers the evaluation's own noise too, so a reading taken at an evaluation carries it. Held out one at
    a time, the committed records' evaluations lie inside it 96 % (mid) and 95 % (paper) of the time
    (``tests/test_claims.py`` measures it). nan with fewer than :data:`MIN_RESIDUALS` residuals."""
    from scipy import stats

    r = loo[~np.isnan(loo)]
    n = len(r)
    if n < MIN_RESIDUALS:
        return math.nan
    return float(stats.t.ppf((1 + coverage) / 2, n) * math.sqrt(1 + 1 / n) * math.sqrt(float(np.mean(r**2))))


def _holding_rows(steps: np.ndarray, se: np.ndarray) -> int:
    """How many rows a crossing must hold for (:func:`reading_at`): the rows of one interval between evaluations (the
    estimate's gap is measured once per interval), at least :data:`SMOOTH_ROWS`."""
    if len(steps) < 2 or len(se) < 2:
        return SMOOTH_ROWS
    return max(SMOOTH_ROWS, round(float(np.median(np.diff(se))) / float(np.median(np.diff(steps)))))


def first_crossing_that_holds(est: np.ndarray, target: float, rows: int) -> int | None:
    """The first row whose estimate is at or below ``target`` and from which the median of the next ``rows`` estimates
    (the row's own among them; fewer at the end) is too: the curve has reached the target, not dipped to it (a
    stretch of noise shorter than half the window leaves that median where the curve is). None: no such row."""
    reached = target * (1 + 1e-6)  # float32 rounding of the records allowed
    for i in np.nonzero(est <= reached)[0]:
        if np.median(est[i : i + rows]) <= reached:
            return int(i)
    return None


def reading_at(rec: Record, target: float, or_best: bool = False) -> Reading:
    """Where ``rec`` first reaches validation loss ``target`` (:func:`val_loss_estimate`) and holds it: of the rows up
    to the first whose estimate is at or below it and stays there for most of the next interval between evaluations
    (:func:`first_crossing_that_holds`; on a slow run's plateau a dip of noise is not a crossing), the one whose
    estimate is nearest (unique even for a run whose loss rises again later). Its error is the run's
    :func:`prediction_error` (nan before the second evaluation, where the estimate has no measured gap yet). A run
    that never reaches ``target`` is :class:`Undecidable`, or with ``or_best`` read where its estimate is lowest
    (its closest approach)."""
    steps, est, se, loo = val_loss_estimate(rec)
    first = first_crossing_that_holds(est, target, _holding_rows(steps, se))
    if first is None:
        if not or_best:
            raise Undecidable(f"{rec.name} never reaches a validation loss of {target:.4g}")
        i = int(np.argmin(est))
    else:
        i = first if first == 0 or abs(est[first] - target) <= abs(est[first - 1] - target) else first - 1
    after = int(np.searchsorted(se, steps[i]))  # the evaluation at or after the reading
    before_second = after <= 1 and not (after == 1 and se[1] == steps[i])
    error = math.nan if before_second else prediction_error(loo)
    return Reading(int(steps[i]), float(est[i]), error)


def held_out_coverage(rec: Record) -> tuple[int, int]:
    """How often the reading's error covers an evaluation it did not see: each evaluation after the second and before
    the last is removed in turn, the run estimated without it (:func:`val_loss_estimate`), and counted inside when
    ``|estimate - evaluation| <= prediction_error``. Returns ``(inside, counted)``."""
    se, ve = series(rec.rows, Key.VAL_LOSS)
    inside = counted = 0
    for j in range(2, len(se) - 1):
        rows = [{k: v for k, v in r.items() if k != Key.VAL_LOSS} if r[Key.STEP] == se[j] else r for r in rec.rows]
        steps, est, _, loo = val_loss_estimate(Record(rec.path, rec.config, rec.summary, rows, rec.heads))
        i = int(np.searchsorted(steps, se[j]))
        err = prediction_error(loo)
        if i < len(steps) and steps[i] == se[j] and not math.isnan(err):
            counted += 1
            inside += int(abs(est[i] - ve[j]) <= err)
    return inside, counted


def evaluation_reading(rec: Record, target: float) -> Reading:
    """Where ``rec`` reaches ``target`` read from its evaluations alone, a second reading method beside
    :func:`reading_at`: the step where the line between the two evaluations that bracket the first one at or below
    ``target`` crosses it (the row of the training loss nearest that step), or the run's best evaluation when it never
    does. Its error is nan: it is a cross-check of the method, not an estimate."""
    se, ve = series(rec.rows, Key.VAL_LOSS)
    steps, _ = series(rec.rows, Key.TRAIN_LOSS)
    if len(se) == 0 or len(steps) == 0:
        raise Undecidable(f"{rec.name} holds no training or validation loss to read it at a loss")
    below = np.nonzero(ve <= target * (1 + 1e-6))[0]
    if len(below) == 0:
        step, loss = float(se[int(np.argmin(ve))]), float(ve.min())
    elif below[0] == 0:
        step, loss = float(se[0]), float(ve[0])
    else:
        j = int(below[0])
        frac = (ve[j - 1] - target) / (ve[j - 1] - ve[j]) if ve[j - 1] != ve[j] else 1.0
        step, loss = float(se[j - 1] + frac * (se[j] - se[j - 1])), float(target)
    return Reading(int(steps[int(np.argmin(np.abs(steps - step)))]), loss, math.nan)


def cut_at(rec: Record, r: Reading) -> Record:
    """``rec`` as it stood at reading ``r``: the rows up to its step (its config says so: ``read_to_step``,
    ``read_loss``, ``read_error``)."""
    rows = [row for row in rec.rows if row[Key.STEP] <= r.step]
    config = {**rec.config, "read_to_step": r.step, "read_loss": r.loss, "read_error": r.error}
    return Record(rec.path, config, rec.summary, rows, rec.heads)


def up_to_loss(rec: Record, target: float) -> Record:
    """``rec`` cut at its :func:`reading_at` ``target``: the run as it stood when it reached that loss."""
    return cut_at(rec, reading_at(rec, target))


def at_matched_loss(c: Cases, cases: tuple[str, ...], shift: float = 0.0, method: str = "estimate") -> Cases:
    """``c`` with each of ``cases`` cut where it first reaches :func:`matched_loss` of them (``+ shift`` nats), read
    by :func:`reading_at` (``method="estimate"``; a target below a run's reach reads it at its closest approach)
    or from the evaluations alone (``"evaluations"``, :func:`evaluation_reading`)."""
    target = matched_loss([c[k] for k in cases]) + shift
    if method == "evaluations":
        return {**c, **{k: cut_at(c[k], evaluation_reading(c[k], target)) for k in cases}}
    if method != "estimate":
        raise ValueError(f"method must be estimate or evaluations, got {method!r}")
    return {**c, **{k: cut_at(c[k], reading_at(c[k], target, or_best=shift < 0)) for k in cases}}


def reading_band(c: Cases, cases: tuple[str, ...]) -> float:
    """How far the target is moved either way to test a verdict against the reading: the largest error of the
    seed's readings (:func:`reading_at`), at least :data:`READ_TOLERANCE` nats."""
    errors = [r.error for r in readings(c, cases)[1].values() if not math.isnan(r.error)]
    return max([READ_TOLERANCE, *errors])


def band_sides(claim: Claim, per_seed: list[Cases], cases: tuple[str, ...]) -> list[list[bool | None]]:
    """Per seed, whether ``claim`` holds read four ways, in this order: at the target, at the target moved down
    and up by the seed's :func:`reading_band` (a run that never reaches the lower target read at its closest
    approach), and from the evaluations alone (:func:`evaluation_reading`). None where the value is not finite or
    cannot be read: a verdict that a seed's side crosses among them is not decided by the reading."""
    out = []
    for c in per_seed:
        band = reading_band(c, cases)
        sides: list[bool | None] = []
        for shift, method in ((0.0, "estimate"), (-band, "estimate"), (band, "estimate"), (0.0, "evaluations")):
            try:
                v = claim.value(at_matched_loss(c, cases, shift, method))
                sides.append(claim.holds(v) if math.isfinite(v) else None)
            except (Undecidable, KeyError):
                sides.append(None)
        out.append(sides)
    return out


def within_band(sides: list[list[bool | None]]) -> bool:
    """Whether some seed's side changes among the readings (:func:`band_sides`), or cannot be read by one of them:
    the reading does not decide it."""
    return any(len({s for s in seed if s is not None}) > 1 or None in seed for seed in sides)


def readings(c: Cases, cases: tuple[str, ...]) -> tuple[float, dict[str, Reading]]:
    """The target of ``cases`` (:func:`matched_loss`) and where each run is read at it (:func:`reading_at`)."""
    target = matched_loss([c[k] for k in cases])
    return target, {k: reading_at(c[k], target) for k in cases}


def _matched_setting(per_seed: list[Cases], cases: tuple[str, ...]) -> str:
    """Where every seed's runs are read, and which of them lie further than :data:`READ_TOLERANCE` from the target
    (their evaluations are too far apart, or their loss too steep there, to place them closer)."""
    parts, far = [], []
    for c in per_seed:
        s = c[cases[0]].config.get("seed")
        target, read = readings(c, cases)
        where = ", ".join(f"{k} at {r.text()}" for k, r in read.items())
        parts.append(f"seed {s}: a validation loss of {target:.3f}, {where}")
        far += [f"seed {s} {k}" for k, r in read.items() if not r.off_target(target) <= READ_TOLERANCE]  # nan: far
    text = "each run read where its validation loss, estimated between evaluations, reaches the best all reach; "
    text += "; ".join(parts)
    if far:
        text += (f"; not placed within {READ_TOLERANCE} nats of the target (its evaluations too far apart, or the "
                 f"reading before its second evaluation): {', '.join(far)}")  # fmt: skip
    return text


def _read_at(per_seed: list[Cases], cases: tuple[str, ...]) -> dict:
    """The row's ``read_at``: per seed, the target and each run's step, loss and error."""
    out = []
    for c in per_seed:
        target, read = readings(c, cases)
        seed = c[cases[0]].config.get("seed")
        out.append({"seed": seed, "target": target, **{k: dataclasses.asdict(r) for k, r in read.items()}})
    return {"read_at": out}


def _undecided_by_reading(row: dict) -> str:
    """The reason a matched-loss row is not decided by its reading (:func:`within_band`), or ''."""
    sides = row.get("band_sides")
    if not isinstance(sides, list) or not within_band(sides):
        return ""
    seeds = [
        str(s)
        for s, seed in zip(row["seed_list"], sides)
        if len({x for x in seed if x is not None}) > 1 or None in seed
    ]
    return (f"the reading decides it not: seed(s) {', '.join(seeds)} change side, or cannot be read, when the loss "
            f"read at moves by the reading's error (at least {READ_TOLERANCE} nats) or is read from the evaluations "
            "alone")  # fmt: skip


def matched_loss_twin(claim: Claim) -> Claim:
    """``claim`` read where each of its runs first reaches the best validation loss that all of them reach, instead
    of at the same (last) step: the same test on the runs cut there (:func:`at_matched_loss`)."""
    cases = claim.cases

    def value(c: Cases) -> float:
        return claim.value(at_matched_loss(c, cases))

    control = None if claim.control is None else (lambda c: claim.control(at_matched_loss(c, cases)))  # type: ignore[misc]
    return dataclasses.replace(
        claim,
        id=claim.id + MATCHED_SUFFIX,
        claim=claim.claim + " (the runs compared at the same validation loss)",
        metric=claim.metric + ", each run read where it first reaches the best validation loss all of them reach",
        value=value,
        control=control,
        setting=None,
        setting_of_seeds=lambda per_seed: _matched_setting(per_seed, cases),
        detail=lambda per_seed: {**_read_at(per_seed, cases), "band_sides": band_sides(claim, per_seed, cases)},
        undecided=_undecided_by_reading,
        why=claim.why + "; compared at the same loss, not the same step, so that a run that learns faster is not "
        "read at a later stage of training",
    )
