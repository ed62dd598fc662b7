"""Chapter 6's weight-decay law, read from the records (:mod:`attnid.lm.claims`).

The weight-decay law (:func:`wd_beta_law`): under SGD with weight decay λ the gradient part of a step
conserves β = [W_Q | b_Q][W_Q | b_Q]ᵀ − [W_K | b_K][W_K | b_K]ᵀ to first order and the decay scales it by
(1 − η_t λ)², so ``β_T = c_T β_0 + R_T`` with ``c_T = Π_t (1 − η_t λ)²`` and ``R_T`` the second-order
remainder. The law is tested on its own residual ``‖β_T − c_T β_0‖ / ‖c_T β_0‖`` (the row key
``beta_law_residual``; on older records, on τ = tr β per head), in the layers where plain SGD's own drift,
the same remainder without decay, is smaller than ``c_T`` (median over the seeds, so every seed tests the same
layers and one seed's outlier does not choose them; :data:`LAW_CUT`); a remainder or residual that is not finite in
any layer and seed makes it inconclusive. The remainder varies with training like any other metric, so the law is
a statistic of training (three seeds), and its row says which cut of the remainder would change its verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis import (
    Cases,
    final_drift,
    series,
    span,
)
from ..metrics import Key
from ..profiles import RunConfig, beta_law_factor
from ..records import Record
from .claim import KINDS, Undecidable, seed_side

LAW_TOLERANCE = 1e-2  # the weight-decay law "holds" in a layer when its residual is below 1 %
LAW_CUT = 1.0  # a layer tests the law where plain SGD's remainder (median over seeds) is below LAW_CUT × c_T
LAW_STATED_BY = "chapter 6"  # the law is chapter 6's own reading of §5: its seeds lie with or against it


@dataclass(frozen=True)
class WdLaw:
    """The weight-decay law on one SGD + weight-decay record, per layer (``(L,)`` arrays).

    ``residual``: ``‖β_T − c_T β_0‖ / ‖c_T β_0‖`` at the last step (``measure`` says whether of β, from the
    probe, or of τ = tr β per head, on records without the key). ``remainder``: plain SGD's final drift
    ``‖β_T − β_0‖ / ‖β_0‖`` (the second-order remainder without decay) over ``c_T``; ``None`` without a
    control. ``tested``: the layers where ``remainder < 1`` (all without a control). ``curve``: the residual
    over training, ``(n_rows, L)`` at ``steps``.
    """

    factor: float  # c_T
    measure: str
    residual: np.ndarray
    remainder: np.ndarray | None
    tested: list[int]
    steps: np.ndarray
    curve: np.ndarray

    @property
    def passing(self) -> list[int]:
        return [i for i in range(len(self.residual)) if self.residual[i] < LAW_TOLERANCE]

    @property
    def failing(self) -> list[int]:
        return [i for i in range(len(self.residual)) if not self.residual[i] < LAW_TOLERANCE]

    @property
    def worst_tested(self) -> float:
        """The largest residual over the tested layers (``nan`` if none is tested)."""
        return float(self.residual[self.tested].max()) if self.tested else float("nan")


def law_residual(rec: Record, on_tau: bool = False) -> tuple[str, np.ndarray, np.ndarray]:
    """``(measure, steps, residual (n_rows, L))`` of the weight-decay law over training.

    From the probe's ``beta_law_residual`` when the record holds it (and ``on_tau`` is false); else from τ = tr β
    per head, which the law scales the same way: ``‖τ_t − (c_t / c_1) τ_1‖ / ‖(c_t / c_1) τ_1‖`` over the heads
    of a layer, from the first recorded step ``1`` (the records hold no τ before the first step)."""
    steps, res = series(rec.rows, Key.BETA_LAW)
    if len(steps) and not on_tau:
        return "β (the probe's residual)", steps, res
    steps, tau = series(rec.rows, Key.TAU)
    if not len(steps):
        raise KeyError(str(Key.TAU))
    c = np.asarray(beta_law_factor(RunConfig.from_dict(rec.config)))
    scale = (c[steps] / c[steps[0]])[:, None, None]
    pred = scale * tau[0]
    res = np.linalg.norm(tau - pred, axis=-1) / np.linalg.norm(pred, axis=-1)
    return "τ = tr β per head (records without the law's residual)", steps, res


def wd_beta_law(rec: Record, control: Record | None = None) -> WdLaw:
    """The weight-decay law on ``rec`` (SGD + weight decay), with plain SGD of the same seed as ``control``."""
    cfg = RunConfig.from_dict(rec.config)
    if cfg.optimizer != "sgd" or not cfg.weight_decay:
        raise ValueError(f"wd_beta_law: {rec.name} is not an SGD run with weight decay")
    factor = float(beta_law_factor(cfg)[-1])
    measure, steps, curve = law_residual(rec)
    remainder = None if control is None else final_drift(control) / factor
    L = curve.shape[1]
    tested = list(range(L)) if remainder is None else [i for i in range(L) if remainder[i] < 1.0]
    return WdLaw(factor, measure, curve[-1], remainder, tested, steps, curve)


def _layers(idx: list[int]) -> str:
    return ", ".join(str(i + 1) for i in idx) or "none"


def _laws(per_seed: list[Cases]) -> list[WdLaw]:
    return [wd_beta_law(c["sgd_wd"], c["sgd"]) for c in per_seed]


def law_remainder(laws: list[WdLaw]) -> np.ndarray:
    """Plain SGD's remainder / c_T per layer, median over the seeds, ``(L,)``: one seed's outlier does not move it
    (with three seeds). :class:`Undecidable` if a remainder or a residual of any layer and seed is not finite (a
    null in the control would otherwise drop its layer from the tested set)."""
    rem = [w.remainder for w in laws if w.remainder is not None]
    if len(rem) < len(laws):
        raise Undecidable("the law needs plain SGD of the same seed as its control")
    for what, arrays in (("plain SGD's remainder", rem), ("the law's residual", [w.residual for w in laws])):
        bad = sorted({i + 1 for a in arrays for i in np.flatnonzero(~np.isfinite(a))})
        if bad:
            raise Undecidable(f"{what} is not finite in layer(s) {', '.join(map(str, bad))} (a null in the records)")
    return np.median(rem, axis=0)


def law_tested(laws: list[WdLaw], cut: float = LAW_CUT) -> list[int]:
    """The layers that test the law in every seed: those whose remainder, median over the seeds, is below ``cut``
    (one set for all seeds, chosen by a statistic that one seed's outlier cannot carry)."""
    rem = law_remainder(laws)
    return [i for i in range(len(rem)) if rem[i] < cut]


def law_values(laws: list[WdLaw], cut: float = LAW_CUT) -> list[float]:
    """Per seed, the largest residual over the layers tested at ``cut``."""
    tested = law_tested(laws, cut)
    if not tested:
        raise Undecidable(
            "in every layer plain SGD's remainder (median over the seeds) exceeds c_T: the first-order law has no say"
        )
    return [float(w.residual[tested].max()) for w in laws]


def law_verdict(laws: list[WdLaw], cut: float = LAW_CUT) -> str:
    """The law's verdict at ``cut`` from these seeds' laws (too few seeds: the side they lie on)."""
    try:
        holds = [v < LAW_TOLERANCE for v in law_values(laws, cut)]
    except Undecidable:
        return "undecidable"
    side = seed_side(holds, LAW_STATED_BY)
    if len(laws) < KINDS["training"]:
        return f"inconclusive ({side})"
    return {f"with {LAW_STATED_BY}": "yes", f"against {LAW_STATED_BY}": "no"}.get(side, "inconclusive")


def law_cut_changes(laws: list[WdLaw]) -> list[dict]:
    """The cuts nearest to :data:`LAW_CUT`, above and below, at which the law's verdict changes: ``[{"cut",
    "verdict"}]``. The tested set changes only where the cut passes a layer's remainder: above a layer's
    remainder that layer is tested, at or below it it is not."""
    rem = law_remainder(laws)
    base = law_verdict(laws)
    out = []
    above = sorted(r for r in rem if r >= LAW_CUT)
    for r in above:  # raising the cut just past r adds that layer
        cut = float(np.nextafter(r, np.inf))
        if (v := law_verdict(laws, cut)) != base:
            out.append({"cut": cut, "verdict": v})
            break
    for r in sorted((r for r in rem if r < LAW_CUT), reverse=True):  # lowering it to r removes that layer
        if (v := law_verdict(laws, float(r))) != base:
            out.append({"cut": float(r), "verdict": v})
            break
    return out


def _cut_text(changes: list[dict]) -> str:
    if not changes:
        return "no cut of the remainder changes the verdict"
    return "; ".join(
        (f"a cut above {c['cut']:.3g} × c_T" if c["cut"] > LAW_CUT else f"a cut at or below {c['cut']:.3g} × c_T")
        + f" makes it {c['verdict']}"
        for c in changes
    )


def _law_detail(per_seed: list[Cases]) -> dict:
    laws = _laws(per_seed)
    law = laws[0]
    residual = np.median([w.residual for w in laws], axis=0)  # as the chapter reads it, and as the layers are chosen
    remainder = law_remainder(laws)
    tested = law_tested(laws)
    changes = law_cut_changes(laws)
    passing = [i for i in range(len(residual)) if residual[i] < LAW_TOLERANCE]
    failing = [i for i in range(len(residual)) if i not in passing]
    fail_text = ""
    if failing:
        fail_text = (
            f"; it fails in layer(s) {_layers(failing)} (residual {span(residual[failing], '.2g')}), where plain "
            f"SGD's remainder is {span(remainder[failing], '.2g')} times c_T"
        )
    return {
        "predicted_factor": law.factor,
        "law_measure": law.measure,
        "per_layer": residual.tolist(),
        "per_layer_by_seed": [w.residual.tolist() for w in laws],
        "remainder_per_layer": remainder.tolist(),
        "tested_layers": tested,
        "passing_layers": passing,
        "failing_layers": failing,
        "cut": LAW_CUT,
        "cut_changes": changes,
        "depends_on": (
            f"c_T = {law.factor:.4g}; {len(laws)} seed{'s' * (len(laws) > 1)} ({law.measure.split(' ')[0]}), tested "
            f"in layer(s) {_layers(tested)} of {len(residual)} in every seed, where plain SGD's remainder (median over "
            f"the seeds) is below {LAW_CUT:g} × c_T; the law holds to {LAW_TOLERANCE:.0%} (mean over the seeds) in "
            f"layer(s) {_layers(passing)}" + fail_text + f"; {_cut_text(changes)}"
        ),
    }
