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
    best_val_loss,
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


def matched_loss(recs: list[Record]) -> float:
    """The best validation loss that every run of ``recs`` reaches: the largest of their best losses."""
    return max(best_val_loss(r) for r in recs)


@dataclass(frozen=True)
class Reading:
    """Where one run is read at a target loss: the row's ``step``, the validation loss estimated there (``loss``),
    and ``error``, the estimate's error bound (nan where the run has too few evaluations to bound it)."""

    step: int
    loss: float
    error: float

    def off_target(self, target: float) -> float:
        """How far from ``target`` this reading may be: the estimate's distance plus its error bound."""
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
    evaluations either side (leave-one-out, over twice the interval: a conservative bound), nan where it has no
    neighbour on both sides among the evaluations used."""
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


def reading_at(rec: Record, target: float) -> Reading:
    """Where ``rec`` first reaches validation loss ``target`` (:func:`val_loss_estimate`): of the rows up to the first
    whose estimate is at or below it, the one whose estimate is nearest (unique even for a run whose loss rises
    again later). Its error is the larger leave-one-out error of the evaluations either side (where both have one;
    nan before the second evaluation, where no pair of evaluations bounds it)."""
    steps, est, se, loo = val_loss_estimate(rec)
    below = np.nonzero(est <= target * (1 + 1e-6))[0]  # float32 rounding of the records allowed
    if len(below) == 0:
        raise Undecidable(f"{rec.name} never reaches a validation loss of {target:.4g}")
    first = int(below[0])
    i = first if first == 0 or abs(est[first] - target) <= abs(est[first - 1] - target) else first - 1
    after = int(np.searchsorted(se, steps[i]))  # the evaluation at or after the reading
    bracket = [j for j in (after - 1, after) if 0 <= j < len(se)]
    bounded = [j for j in bracket if not np.isnan(loo[j])] or [j for j in range(len(se)) if not np.isnan(loo[j])]
    if after < len(se) and se[after] == steps[i] and (after >= 1 or len(se) <= 2):
        error = 0.0  # read at an evaluation the estimate passes through
    else:
        error = math.nan if after <= 1 or not bounded else float(max(loo[j] for j in bounded))
    return Reading(int(steps[i]), float(est[i]), error)


def up_to_loss(rec: Record, target: float) -> Record:
    """``rec`` cut at its :func:`reading_at` ``target``: the run as it stood when it reached that loss (its config
    says so: ``read_to_step``, ``read_loss``, ``read_error``)."""
    r = reading_at(rec, target)
    rows = [row for row in rec.rows if row[Key.STEP] <= r.step]
    config = {**rec.config, "read_to_step": r.step, "read_loss": r.loss, "read_error": r.error}
    return Record(rec.path, config, rec.summary, rows, rec.heads)


def at_matched_loss(c: Cases, cases: tuple[str, ...], shift: float = 0.0) -> Cases:
    """``c`` with each of ``cases`` cut where it first reaches :func:`matched_loss` of them (``+ shift`` nats)."""
    target = matched_loss([c[k] for k in cases]) + shift
    return {**c, **{k: up_to_loss(c[k], target) for k in cases}}


def band_sides(claim: Claim, per_seed: list[Cases], cases: tuple[str, ...]) -> list[list[bool | None]]:
    """Per seed, whether ``claim`` holds when the target moves by ``-``, ``0`` and ``+`` :data:`READ_TOLERANCE`
    (None where a run never reaches the moved target, or the value is not finite): a verdict that a seed's side
    crosses within this band is not decided by the reading."""
    out = []
    for c in per_seed:
        sides: list[bool | None] = []
        for shift in (-READ_TOLERANCE, 0.0, READ_TOLERANCE):
            try:
                v = claim.value(at_matched_loss(c, cases, shift))
                sides.append(claim.holds(v) if math.isfinite(v) else None)
            except (Undecidable, KeyError):
                sides.append(None)
        out.append(sides)
    return out


def within_band(sides: list[list[bool | None]]) -> bool:
    """Whether some seed's side changes within the band (:func:`band_sides`): the reading does not decide it."""
    return any(len({s for s in seed if s is not None}) > 1 for seed in sides)


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
        why=claim.why + "; compared at the same loss, not the same step, so that a run that learns faster is not "
        "read at a later stage of training",
    )
