"""The numbers the dynamics claims read from one seed's records (:mod:`attnid.lm.claims`): the bias theorems' ratios
(:func:`key_bias_ratio`, :func:`query_bias_margin`, at the precisions that can decide them), rebalancing's
effects, and the settings a row reports."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..analysis import (
    Cases,
    best_val_loss,
    isotropic_rho,
    late_ratio,
    rho_measure,
)
from ..metrics import Key
from ..records import Record
from .claim import Undecidable, need
from .law import wd_beta_law

# A bias gradient below this share of its run's typical query-bias gradient (the median over heads and steps) is
# granted as round-off: a chosen margin (about 840 float32 epsilons), not derived; the key-bias gradients of the
# float32 and TF32 records reach 1.6e-5 of it (paper scale, TF32), a sixth of the margin
BIAS_FLOOR = 1e-4
# the precisions whose round-off stays under BIAS_FLOOR in that cancelling sum. bf16 autocast does not: its
# attention backward leaves 3.8e-2 of the typical query-bias gradient in the key bias (paper scale, 2026-12-04),
# so a bf16 record can neither confirm nor refute the two bias theorems
BIAS_PRECISIONS = ("fp32", "tf32")


def _iso(c: Cases) -> float:
    return isotropic_rho(c["adamw"].config)


def _sgd_wd_setting(c: Cases) -> str:
    wd = c["sgd_wd"].config["weight_decay"]
    return (
        f"SGD + weight decay with λ = {wd:g} reaches a best validation loss of {best_val_loss(c['sgd_wd']):.3f} "
        f"nats/char, AdamW {best_val_loss(c['adamw']):.3f}: the two are compared at different losses here, at the "
        "same loss in adamw_closest_at_loss"
    )


BIAS_CASES = ("sgd", "sgd_wd", "adamw")


def bias_scale(rec: Record) -> float:
    """A run's typical query-bias gradient: the median ‖∇b_Q‖ over its heads and recorded steps. One dead head
    (or a few) does not move it, so it is a scale for both bias claims that neither claim's violation shifts.
    :class:`Undecidable` for a record trained at a precision not in :data:`BIAS_PRECISIONS`."""
    precision = rec.summary.get("precision", "fp32")
    if precision not in BIAS_PRECISIONS:
        raise Undecidable(
            f"{rec.name} trained at {precision}, whose round-off exceeds the {BIAS_FLOOR:g} of the typical query-bias "
            f"gradient that the bias theorems grant it; only {' or '.join(BIAS_PRECISIONS)} records decide them"
        )
    scale = float(np.median(need(rec, Key.GRAD_BQ)))
    if not scale > 0:
        raise Undecidable(f"{rec.name}: the query-bias gradients are zero in most heads and steps (no scale)")
    return scale


def float32_late_ratio(rec: Record) -> float:
    """:func:`attnid.lm.analysis.late_ratio` of ρ's float32 weight difference, for a record whose weights' rounding
    is float32's (:data:`BIAS_PRECISIONS`); :class:`Undecidable` for a bf16 record, whose floor is bf16's own (160
    times TF32's at paper scale) and says nothing of the float32 rounding the claim reads."""
    precision = rec.summary.get("precision", "fp32")
    if precision not in BIAS_PRECISIONS:
        raise Undecidable(
            f"{rec.name} trained at {precision}: its ρ floor is that precision's own rounding, not the float32 "
            f"rounding the claim reads; only {' or '.join(BIAS_PRECISIONS)} records decide it"
        )
    return late_ratio(rec)


def key_bias_ratio(c: Cases) -> float:
    """Largest ‖∇b_K‖ over training and heads / the run's :func:`bias_scale`, over the optimizer cases."""
    return max(float(np.max(need(c[k], Key.GRAD_BK))) / bias_scale(c[k]) for k in BIAS_CASES)


def query_bias_margin(c: Cases) -> float:
    """Smallest per-head median ‖∇b_Q‖ over training / the run's :func:`bias_scale`, over the optimizer cases: how
    far the weakest head's query-bias gradient sits above zero on the run's own scale."""
    return min(float(np.median(need(c[k], Key.GRAD_BQ), axis=0).min()) / bias_scale(c[k]) for k in BIAS_CASES)


def rebalance_loss_change(rec: Record) -> float:
    """Largest |loss after − loss before| of a rebalance (nats/char), from the record's summary."""
    events = rec.summary.get("rebalances") or []
    if not events:
        raise Undecidable(f"{rec.name} records no rebalance")
    return max(abs(e["loss_after"] - e["loss_before"]) for e in events)


def mean_imbalance(rec: Record) -> float:
    """Mean relative imbalance ‖β‖ / (‖G_Q‖ + ‖G_K‖) over training and layers."""
    return float(need(rec, Key.BETA_REL).mean())


def _rho_of(*cases: str) -> Callable[[Cases], str]:
    return lambda c: "; ".join(f"{k}: {rho_measure(c[k])}" for k in cases)


def _tested_remainder(c: Cases) -> np.ndarray:
    law = wd_beta_law(c["sgd_wd"], c["sgd"])
    assert law.remainder is not None
    return law.remainder[law.tested] if law.tested else np.array([np.nan])
