"""The paper's §5 claims as data, each tested where it can fail (chapter 6's table, ``attnid claims``).

A :class:`Claim` is a reading of §5 (or of chapter 6's weight-decay law) with the number that tests it, the
threshold and why, the control it is read against, the cases and seeds it needs. :func:`evaluate_claim`
turns it into one row with a verdict:

* ``yes`` / ``no``: every seed agrees that the claim holds / fails; a theorem check reads ``no`` as soon as one
  seed fails it (one counterexample refutes an exact property) and ``yes`` only when every seed passes;
* ``inconclusive``: the seeds' range crosses the threshold, there are too few seeds or layers (the reason
  then says on which side the seeds lie: "1 seed, against the paper"), a value is not finite, or a value the
  records should hold is missing (null);
* ``pending``: records are missing, or a seed the caller named has no record.

A claim is of one of two kinds (:data:`KINDS`): a *theorem check* (an exact property of the model, such as a
zero gradient: one seed decides) or a *statistic of training* (a number that varies from seed to seed: three
seeds, :data:`MIN_SEEDS`). A claim is the paper's unless ``stated_by`` names the chapter whose own reading it is
(the weight-decay law: chapter 6's).

Every claim has a test that plants a violation in synthetic records and watches its verdict turn to
``no`` (``tests/test_claims.py``, ``pytest -k planted``).

The weight-decay law (:func:`wd_beta_law`): under SGD with weight decay λ the gradient part of a step
conserves β = [W_Q | b_Q][W_Q | b_Q]ᵀ − [W_K | b_K][W_K | b_K]ᵀ to first order and the decay scales it by
(1 − η_t λ)², so ``β_T = c_T β_0 + R_T`` with ``c_T = Π_t (1 − η_t λ)²`` and ``R_T`` the second-order
remainder. The law is tested on its own residual ``‖β_T − c_T β_0‖ / ‖c_T β_0‖`` (the row key
``beta_law_residual``; on older records, on τ = tr β per head), in the layers where plain SGD's own drift,
the same remainder without decay, is smaller than ``c_T`` (median over the seeds, so every seed tests the same
layers and one seed's outlier does not choose them; :data:`LAW_CUT`); a remainder or residual that is not finite in
any layer and seed makes it inconclusive. The remainder varies with training like any other metric, so the law is
a statistic of training (three seeds), and its row says which cut of the remainder would change its verdict.

Shapes: ``L`` layers, ``H`` heads (:data:`attnid.lm.metrics.SCHEMA`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .analysis import (
    Cases,
    SuiteRuns,
    best_val_loss,
    drift_slope,
    final_drift,
    isotropic_rho,
    late_ratio,
    layers_out_of_order,
    max_rho,
    mean_rho,
    min_sv_ratio,
    rho_measure,
    tau_spread_growth,
    values,
)
from .metrics import Key
from .profiles import DEEP_SGD, LR_SWEEP, SUITES, RunConfig, beta_law_factor
from .records import MissingValues, Record, series

MIN_SEEDS = 3  # seeds a statistic of training needs before it is decided
KINDS = {"theorem": 1, "training": MIN_SEEDS}  # a claim's kind -> the seeds it needs
LAW_TOLERANCE = 1e-2  # the weight-decay law "holds" in a layer when its residual is below 1 %
LAW_CUT = 1.0  # a layer tests the law where plain SGD's remainder (median over seeds) is below LAW_CUT × c_T
EPS32 = float(np.finfo(np.float32).eps)  # 1.2e-7: float32's relative resolution
# A bias gradient below this share of its run's typical query-bias gradient (the median over heads and steps) is
# round-off: 840 ε₃₂. The key-bias gradients of the records reach 1.6e-5 of it (paper scale, TF32)
BIAS_FLOOR = 1e-4
# the precisions whose round-off stays under BIAS_FLOOR in that cancelling sum. bf16 autocast does not: its
# attention backward leaves 3.8e-2 of the typical query-bias gradient in the key bias (paper scale, 2026-12-04),
# so a bf16 record can neither confirm nor refute the two bias theorems
BIAS_PRECISIONS = ("fp32", "tf32")


class Undecidable(ValueError):
    """A claim's value cannot be computed from these records for a stated reason (the row reads
    ``inconclusive`` and gives it)."""


def need(rec: Record, key: Key) -> np.ndarray:
    """``values(rec, key)``; raises ``KeyError`` naming ``key`` when no row of the record holds it."""
    v = values(rec, key)
    if not len(v):
        raise KeyError(str(key))
    return v


# ------------------------------------------------------------------------------ the weight-decay law
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
    side = seed_side(holds)
    if len(laws) < KINDS["training"]:
        return f"inconclusive ({side})"
    return {"with the paper": "yes", "against the paper": "no"}.get(side, "inconclusive")


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
    residual = np.mean([w.residual for w in laws], axis=0)
    remainder = law_remainder(laws)
    tested = law_tested(laws)
    changes = law_cut_changes(laws)
    passing = [i for i in range(len(residual)) if residual[i] < LAW_TOLERANCE]
    failing = [i for i in range(len(residual)) if i not in passing]
    fail_text = ""
    if failing:
        fail_text = (
            f"; it fails in layer(s) {_layers(failing)} (residual {residual[failing].min():.2g} to "
            f"{residual[failing].max():.2g}), where plain SGD's remainder is {remainder[failing].min():.2g} to "
            f"{remainder[failing].max():.2g} times c_T"
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


# ------------------------------------------------------------------------------ helpers of the claims
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


# ------------------------------------------------------------------------------ the claims
@dataclass(frozen=True)
class Claim:
    """One reading of the paper's §5 and how it is tested.

    ``value`` computes the tested number from one seed's records (``cases``); the claim holds for that seed
    when ``value op threshold``. ``values``, where given, computes every seed's number at once instead (a claim
    whose test reads all seeds, such as the law's tested layers). ``control`` is the number it is compared against
    (same seed), in words in ``control_text``. ``kind`` is ``"theorem"`` (a check of an exact property: one seed
    decides) or ``"training"`` (a statistic of training: :data:`MIN_SEEDS` seeds); a verdict also needs models
    of ``min_layers`` layers. ``setting``
    says what the verdict depends on, computed from the records; ``rho`` names the ρ measure the value uses;
    ``detail`` adds keys to the row from every seed's records. ``stand_in`` maps a case to the one whose records
    stand in for it at profiles whose suite does not run it (``sgd_deep`` at paper scale, where ``sgd`` has 6
    layers). ``stated_by`` says whose claim it is (the paper's, or a chapter's own), in the side the seeds lie on.
    """

    id: str
    claim: str
    metric: str
    value: Callable[[Cases], float]
    op: str
    threshold: float
    why: str
    cases: tuple[str, ...]
    control_text: str = ""
    control: Callable[[Cases], float] | None = None
    kind: str = "training"
    min_layers: int = 1
    setting: Callable[[Cases], str] | None = None
    rho: Callable[[Cases], str] | None = None
    detail: Callable[[list[Cases]], dict] | None = None
    stand_in: tuple[tuple[str, str], ...] = ()
    values: Callable[[list[Cases]], list[float]] | None = None
    suite: str = "dynamics"  # the suite whose records it reads
    stated_by: str = "the paper"  # whose claim it is: the seeds lie "with" or "against" it

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {self.kind!r}")

    @property
    def min_seeds(self) -> int:
        """Seeds a verdict needs: one for a theorem check, :data:`MIN_SEEDS` for a statistic of training."""
        return KINDS[self.kind]

    def holds(self, v: float) -> bool:
        return v < self.threshold if self.op == "<" else v > self.threshold


SWEEP = tuple(LR_SWEEP.values())

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="sgd_orthogonal",
        claim="plain SGD steps stay out of the unidentified directions",
        metric="mean ρ of SGD / isotropic share D/(2(E+1))",
        value=lambda c: mean_rho(c["sgd"]) / _iso(c),
        op="<",
        threshold=1e-3,
        why="an exact gradient step has ρ = 0 (a theorem, so one seed decides). With ρ of the optimizer's float64 "
        "update (the probe's own measure) this row checks the probe, which gives about 1e-14; with ρ of a float32 "
        "weight difference (older records) it checks that the rounding floor stays below 1e-3 of the isotropic share",
        cases=("sgd", "adamw"),
        control_text="AdamW's mean ρ / isotropic share",
        control=lambda c: mean_rho(c["adamw"]) / _iso(c),
        kind="theorem",
        rho=_rho_of("sgd"),
    ),
    Claim(
        id="wd_toward_symmetry",
        claim="weight decay moves SGD's steps into the unidentified directions",
        metric="mean ρ of SGD + weight decay / isotropic share",
        value=lambda c: mean_rho(c["sgd_wd"]) / _iso(c),
        op=">",
        threshold=1e-2,
        why="1 % of the isotropic share is ten times the bound that plain SGD stays under (previous row), "
        "so it cannot be round-off",
        cases=("sgd", "sgd_wd", "adamw"),
        control_text="plain SGD's mean ρ / isotropic share",
        control=lambda c: mean_rho(c["sgd"]) / _iso(c),
        setting=lambda c: f"weight decay λ = {c['sgd_wd'].config['weight_decay']:g}",
        rho=_rho_of("sgd_wd"),
    ),
    Claim(
        id="adamw_closest",
        claim="AdamW's steps lie further in the unidentified directions than SGD + weight decay's",
        metric="mean ρ, AdamW / SGD + weight decay",
        value=lambda c: mean_rho(c["adamw"]) / mean_rho(c["sgd_wd"]),
        op=">",
        threshold=1.0,
        why="1 is equality of the two means",
        cases=("sgd_wd", "adamw"),
        control_text="SGD + weight decay's mean ρ / isotropic share",
        control=lambda c: mean_rho(c["sgd_wd"]) / _iso(c),
        setting=_sgd_wd_setting,
        rho=_rho_of("adamw", "sgd_wd"),
    ),
    Claim(
        id="adamw_covers",
        claim="some AdamW steps lie mostly in the unidentified directions",
        metric="largest per-head ρ of any AdamW step",
        value=lambda c: max_rho(c["adamw"]),
        op=">",
        threshold=0.5,
        why="more than half of one head's step energy in the invariant directions",
        cases=("adamw",),
        control_text="the same for SGD + weight decay",
        control=lambda c: max_rho(c["sgd_wd"]),
        rho=_rho_of("adamw"),
    ),
    Claim(
        id="late_spike_sgd",
        claim="ρ of plain SGD's float32 weight difference rises at the end of training",
        metric="mean ρ (float32 difference) over the last tenth / over the middle fifth, SGD",
        value=lambda c: late_ratio(c["sgd"]),
        op=">",
        threshold=2.0,
        why="a doubling; the float32 rounding floor grows as the cosine schedule shrinks the steps",
        cases=("sgd", "adamw"),
        control_text="the same ratio for AdamW (whose steps do not shrink with the gradient)",
        control=lambda c: late_ratio(c["adamw"]),
        rho=lambda c: "float32 difference",
    ),
    Claim(
        id="sgd_conserves_beta",
        claim="plain SGD approximately conserves β = W_Q W_Qᵀ − W_K W_Kᵀ",
        metric="largest final β drift over layers, SGD",
        value=lambda c: float(final_drift(c["sgd"]).max()),
        op="<",
        threshold=0.1,
        why="β moves only at second order in the step; 10 % of its initial size",
        cases=("sgd", "adamw"),
        control_text="the same for AdamW",
        control=lambda c: float(final_drift(c["adamw"]).max()),
    ),
    Claim(
        id="drift_falls_with_lr",
        claim="SGD's β drift falls with the learning rate",
        metric="slope of log(final drift, mean over layers) against log η over the SGD sweep",
        value=drift_slope,
        op=">",
        threshold=0.0,
        why="the paper claims a fall, not a rate (a fixed-gradient step would give slope 2)",
        cases=("sgd", *SWEEP),
    ),
    Claim(
        id="drift_earlier_layers",
        claim="SGD's β drift is larger in earlier layers",
        metric="pairs of layers out of order in the final SGD drift, per seed (an earlier layer drifting less than a "
        "later one), plain SGD of ≥ 4 layers",
        value=lambda c: layers_out_of_order(c[DEEP_SGD]),
        op="<",
        threshold=1.5,
        why="every pair of layers ordered the paper's way but at most one (two neighbouring layers of nearly equal "
        "drift may swap), in every seed: a count of pairs, so the test means the same at every depth (a share of the "
        "pairs, such as Kendall's τ, tolerates more disorder in a deeper model), and a slope over the layers would "
        "let one layer's large drift stand for all. A trend needs at least 3 layers (with 2 it is a coin flip); where "
        "the profile's model has fewer, a 4-layer SGD case is trained for it",
        cases=(DEEP_SGD,),
        min_layers=3,
        stand_in=((DEEP_SGD, "sgd"),),
    ),
    Claim(
        id="adamw_changes_beta",
        claim="AdamW changes β far more than SGD",
        metric="final β drift (mean over layers), AdamW / SGD",
        value=lambda c: float(final_drift(c["adamw"]).mean() / final_drift(c["sgd"]).mean()),
        op=">",
        threshold=2.0,
        why="at least twice SGD's drift",
        cases=("sgd", "adamw"),
        control_text="SGD's final drift (mean over layers)",
        control=lambda c: float(final_drift(c["sgd"]).mean()),
    ),
    Claim(
        id="adamw_spreads_tau",
        claim="AdamW spreads τ = tr β across heads more than SGD",
        metric="growth of the spread of τ over heads (end / start), AdamW / SGD",
        value=lambda c: tau_spread_growth(c["adamw"]) / tau_spread_growth(c["sgd"]),
        op=">",
        threshold=2.0,
        why="SGD is the control: training itself spreads τ, so AdamW must spread it at least twice as much",
        cases=("sgd", "adamw"),
        control_text="SGD's growth of the τ spread (end / start)",
        control=lambda c: tau_spread_growth(c["sgd"]),
    ),
    Claim(
        id="qk_full_rank",
        claim="the trained QK products have no rank deficiency",
        metric="smallest σ_min / σ_max of a final QK product (any head; SGD, SGD + wd, AdamW)",
        value=lambda c: min(min_sv_ratio(c[k]) for k in ("sgd", "sgd_wd", "adamw")),
        op=">",
        threshold=1e-4,
        why="float32 weights resolve about 1e-7 of a product's largest singular value, so a ratio below 1e-4, a "
        "thousand times that, would be a direction that training has switched off, not rounding",
        cases=("sgd", "sgd_wd", "adamw"),
    ),
    Claim(
        id="wd_beta_law",
        claim="under SGD + weight decay, β_T = Π_t (1 − η_t λ)² β_0 to within 1 % wherever plain SGD's "
        "second-order remainder is smaller than that factor",
        metric="largest ‖β_T − c_T β_0‖ / ‖c_T β_0‖ over the tested layers (τ per head on older records)",
        value=lambda c: law_values(_laws([c]))[0],  # one seed alone; the row reads `values` (all seeds)
        op="<",
        threshold=LAW_TOLERANCE,
        why="the gradient part conserves β to first order and the decay scales it by c_T. Its residual is the "
        "second-order remainder, which varies with training like any other statistic (three seeds), so the law is "
        "tested in the layers where plain SGD's own drift, that remainder without decay, is below c_T (median over "
        "the seeds: the same layers in every seed); the row lists every layer's residual and the cuts that would "
        "change the verdict. The law is chapter 6's own reading of §5, not the paper's",
        cases=("sgd", "sgd_wd"),
        control_text="plain SGD's final drift / c_T, largest over the layers where it is below c_T (median over seeds)",
        control=lambda c: float(np.nanmax(_tested_remainder(c))),
        values=lambda per_seed: law_values(_laws(per_seed)),
        detail=_law_detail,
        stated_by="chapter 6",
    ),
    Claim(
        id="key_bias_grad_zero",
        claim="key-bias gradients are numerically zero under every optimizer",
        metric="largest ‖∇b_K‖ over training and heads / the run's median ‖∇b_Q‖ over heads and steps, SGD, SGD + "
        "wd and AdamW",
        value=key_bias_ratio,
        op="<",
        threshold=BIAS_FLOOR,
        why="the key bias shifts every score of a query by the same amount, so its exact gradient is 0 (a theorem: "
        "one seed decides); float32 (and TF32) round-off of the cancelling sum reaches about 1e-5 of the run's "
        "typical query-bias gradient, and 1e-4 (840 ε₃₂) is the largest share round-off is granted. The scale is "
        "the median over every head, so a dead head's query bias does not move it",
        cases=BIAS_CASES,
        control_text="the median ‖∇b_K‖ on the same scale",
        control=lambda c: max(float(np.median(need(c[k], Key.GRAD_BK))) / bias_scale(c[k]) for k in BIAS_CASES),
        kind="theorem",
    ),
    Claim(
        id="query_bias_grad_nonzero",
        claim="query-bias gradients are small but nonzero",
        metric="smallest per-head median ‖∇b_Q‖ over training / the run's median ‖∇b_Q‖ over heads and steps",
        value=query_bias_margin,
        op=">",
        threshold=10 * BIAS_FLOOR,
        why="the query bias is identified (chapter 3, a theorem: one seed decides): every head's query bias must "
        "receive a gradient ten times above the round-off share that the key-bias row grants (1e-4 of the run's "
        "typical query-bias gradient); a dead head's would be at round-off",
        cases=BIAS_CASES,
        kind="theorem",
        control_text="median ‖∇b_Q‖ over training, heads and cases (nats/char per unit)",
        control=lambda c: float(np.median(np.concatenate([need(c[k], Key.GRAD_BQ).ravel() for k in BIAS_CASES]))),
    ),
    Claim(
        id="rebalance_keeps_loss",
        claim="rebalancing leaves the loss unchanged",
        metric="largest |loss after − loss before| of a rebalance, AdamW + rebalancing (nats/char)",
        value=lambda c: rebalance_loss_change(c["adamw_rebalance"]),
        op="<",
        threshold=1e-5,
        why="a rebalance is an exact symmetry of the model (one seed decides); a float32 forward pass of the same "
        "batch resolves the loss to about 1e-7 (ε₃₂ times the loss), and 1e-5 is a hundred times that",
        cases=("adamw", "adamw_rebalance"),
        control_text="final validation loss, AdamW + rebalancing − AdamW (nats/char; the optimizer's moments are not "
        "transformed, so the runs part)",
        control=lambda c: float(values(c["adamw_rebalance"], Key.VAL_LOSS)[-1] - values(c["adamw"], Key.VAL_LOSS)[-1]),
        kind="theorem",
    ),
    Claim(
        id="rebalance_changes_beta",
        claim="periodic rebalancing changes the behaviour of the conserved quantity",
        metric="mean relative imbalance ‖β‖ / (‖G_Q‖ + ‖G_K‖) over training, AdamW + rebalancing / AdamW",
        value=lambda c: mean_imbalance(c["adamw_rebalance"]) / mean_imbalance(c["adamw"]),
        op="<",
        threshold=0.5,
        why="each rebalance sets β = 0 in every head; AdamW rebuilds it between rebalances, so the imbalance "
        "averaged over training must at least halve",
        cases=("adamw", "adamw_rebalance"),
        control_text="AdamW's mean relative imbalance",
        control=lambda c: mean_imbalance(c["adamw"]),
    ),
)


# ------------------------------------------------------------------------------ optimizers compared at the same loss
# the claims that compare optimizers, read a second time where each run first reaches the same validation loss: at
# the same step, a run that learns faster is at a later stage of training than the run it is compared with
MATCHED_LOSS = ("adamw_closest", "adamw_changes_beta", "adamw_spreads_tau")
MATCHED_SUFFIX = "_at_loss"


def matched_loss(recs: list[Record]) -> float:
    """The best validation loss that every run of ``recs`` reaches: the largest of their best losses."""
    return max(best_val_loss(r) for r in recs)


def up_to_loss(rec: Record, target: float) -> Record:
    """``rec`` cut after the first evaluation whose validation loss is at or below ``target`` (float32 rounding
    of the records allowed): the run as it stood when it first reached that loss."""
    for i, row in enumerate(rec.rows):
        v = row.get(Key.VAL_LOSS)
        if v is not None and v <= target * (1 + 1e-6):
            config = {**rec.config, "read_to_step": row[Key.STEP]}
            return Record(rec.path, config, rec.summary, rec.rows[: i + 1], rec.heads)
    raise Undecidable(f"{rec.name} never reaches a validation loss of {target:.4g}")


def at_matched_loss(c: Cases, cases: tuple[str, ...]) -> Cases:
    """``c`` with each of ``cases`` cut where it first reaches :func:`matched_loss` of them."""
    target = matched_loss([c[k] for k in cases])
    return {**c, **{k: up_to_loss(c[k], target) for k in cases}}


def _matched_setting(c: Cases, cases: tuple[str, ...]) -> str:
    target = matched_loss([c[k] for k in cases])
    steps = ", ".join(f"{k} at step {up_to_loss(c[k], target).rows[-1][Key.STEP]}" for k in cases)
    return f"read where each run first reaches a validation loss of {target:.3f} nats/char ({steps})"


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
        setting=lambda c: _matched_setting(c, cases),
        why=claim.why + "; compared at the same loss, not the same step, so that a run that learns faster is not "
        "read at a later stage of training",
    )


CLAIMS = tuple(t for c in CLAIMS for t in ((c, matched_loss_twin(c)) if c.id in MATCHED_LOSS else (c,)))
CLAIM_IDS = tuple(c.id for c in CLAIMS)


# ------------------------------------------------------------------------------ chapter 10: trained points
POINT_CASES = tuple(SUITES["points"].cases)  # the four optimizer cases at the width audited exactly


def _corpus():
    from .data import DataError, load

    try:
        return load()
    except DataError as e:
        raise Undecidable(f"auditing a trained point reads validation text: {e}") from None


def _point_audits(rec: Record) -> list[dict]:
    """Every layer's trained-point audit of ``rec``'s final weights (kept in its ``points.json``)."""
    from .points import audit_run

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
    from .points import snapshot_distances

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


def _tested_remainder(c: Cases) -> np.ndarray:
    law = wd_beta_law(c["sgd_wd"], c["sgd"])
    assert law.remainder is not None
    return law.remainder[law.tested] if law.tested else np.array([np.nan])


# ------------------------------------------------------------------------------ verdicts
def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def resolve_cases(claim: Claim, runs: SuiteRuns) -> dict[str, str]:
    """Each case of ``claim`` -> the case whose records it reads at this profile (itself, or its stand-in
    where the suite does not run it)."""
    ran = SUITES[runs.suite].cases_at(runs.profile)
    stand = dict(claim.stand_in)
    return {c: (stand[c] if c in stand and c not in ran else c) for c in claim.cases}


def _seed_cases(runs: SuiteRuns, seed: int, cases: dict[str, str]) -> Cases:
    """Every case's record of ``seed``, with each stand-in also under the name of the case it stands in for."""
    c = runs.by_seed(seed)
    return {**c, **{k: c[v] for k, v in cases.items()}}


def seed_side(holds: list[bool], stated_by: str = "the paper") -> str:
    """On which side of the threshold the seeds lie: ``"with the paper"``, ``"against the paper"`` (or with and
    against whoever ``stated_by`` names) or ``"split"``."""
    if all(holds):
        return f"with {stated_by}"
    return f"against {stated_by}" if not any(holds) else "split"


def _blank_row(claim: Claim, runs: SuiteRuns, cases: dict[str, str], seeds: list[int]) -> dict:
    """A claim's row before anything is read: ``pending``, every key present."""
    return {
        "id": claim.id,
        "claim": claim.claim,
        "profile": runs.profile,
        "metric": claim.metric,
        "value": None,
        "low": None,
        "high": None,
        "values": [],
        "threshold": claim.threshold,
        "op": claim.op,
        "why": claim.why,
        "control": claim.control_text or None,
        "control_value": None,
        "kind": claim.kind,
        "stated_by": claim.stated_by,
        "seeds": len(seeds),
        "seed_list": seeds,
        "side": None,
        "verdict": "pending",
        "reason": "",
        "depends_on": None,
        "rho_measure": None,
        "cases": dict(cases),
    }


def _context(claim: Claim, per_seed: list[Cases]) -> dict:
    """What a row says beside its value: the control, the setting, the ρ measure and the claim's detail."""
    out: dict = {}
    if claim.control is not None:
        with contextlib.suppress(KeyError, Undecidable, MissingValues):  # no control where its records lack it
            out["control_value"] = float(np.mean([claim.control(c) for c in per_seed]))
    if claim.setting is not None:
        out["depends_on"] = claim.setting(per_seed[0])
    if claim.rho is not None:
        out["rho_measure"] = claim.rho(per_seed[0])
    if claim.detail is not None:
        out.update(claim.detail(per_seed))
    return out


def verdict_of(claim: Claim, seeds: list[int], vals: list[float], layers: int) -> tuple[str, str, str | None]:
    """``(verdict, reason, side)`` from every seed's value, by the rules of the module docstring, in order: a value
    that is not finite, too few layers, too few seeds, then every seed on one side or not."""
    holds = [claim.holds(v) for v in vals]
    bad = [s for s, v in zip(seeds, vals) if not math.isfinite(v)]
    if bad:
        return (
            "inconclusive",
            f"the value is not finite for seed(s) {', '.join(map(str, bad))} (a zero or missing quantity)",
            None,
        )
    side = seed_side(holds, claim.stated_by)
    if layers < claim.min_layers:
        return "inconclusive", f"needs ≥ {claim.min_layers} layers, the model has {layers}", side
    if claim.kind == "theorem" and not all(holds):  # one counterexample refutes an exact property
        against = [s for s, h in zip(seeds, holds) if not h]
        return "no", f"fails in seed(s) {', '.join(map(str, against))}", side
    if len(seeds) < claim.min_seeds:
        n = len(seeds)
        return "inconclusive", f"{n} seed{'s' * (n > 1)}, {side}; {claim.min_seeds} needed for a spread", side
    if side != "split":
        return ("yes" if all(holds) else "no"), "", side
    return "inconclusive", f"the seeds' range {min(vals):.3g} to {max(vals):.3g} crosses the threshold", side


def evaluate_claim(claim: Claim, runs: SuiteRuns) -> dict:
    """One claim's row: ``id``, ``claim``, ``profile``, ``metric``, ``value`` (mean over seeds), ``low``,
    ``high``, ``values`` (per seed), ``threshold``, ``op``, ``why``, ``control``, ``control_value``, ``kind``,
    ``seeds``, ``seed_list``, ``side`` (where the seeds lie: with or against the paper, or split), ``verdict``,
    ``reason``, ``depends_on``, ``rho_measure``, ``cases`` (the records read, after stand-ins) and the keys of the
    claim's ``detail``."""
    cases = resolve_cases(claim, runs)
    seeds = runs.seeds(tuple(cases.values()))
    named_missing = missing_named_seeds(runs, list(cases.values()))
    row = _blank_row(claim, runs, cases, seeds)
    if not seeds:
        missing = [v for v in cases.values() if v not in runs]
        row["reason"] = named_missing or f"no records of {', '.join(missing)} at this profile"
        return row
    per_seed = [_seed_cases(runs, s, cases) for s in seeds]
    try:
        vals = [float(v) for v in claim.values(per_seed)] if claim.values else [float(claim.value(c)) for c in per_seed]
    except KeyError as e:  # a record without the metric (an older format)
        row["verdict"], row["reason"] = "inconclusive", f"the records lack {e}"
        return row
    except (Undecidable, MissingValues) as e:
        row["verdict"], row["reason"] = "inconclusive", str(e)
        return row
    row.update(values=vals, value=float(np.mean(vals)), low=float(np.min(vals)), high=float(np.max(vals)))
    row.update(_context(claim, per_seed))
    layers = per_seed[0][claim.cases[0]].config["n_layer"]
    row["verdict"], row["reason"], row["side"] = verdict_of(claim, seeds, vals, layers)
    if named_missing:  # what the seeds found say, but no verdict without the seeds the caller named
        found = row["verdict"] + (f" ({row['reason']})" if row["reason"] else "")
        row["verdict"], row["reason"] = "pending", f"{named_missing}; seed(s) {', '.join(map(str, seeds))} read {found}"
    return {k: _finite(v) for k, v in row.items()}


def missing_named_seeds(runs: SuiteRuns, cases: list[str]) -> str:
    """The seeds the caller named (``runs.requested``) that some case lacks, in words (``""`` if none)."""
    if runs.requested is None:
        return ""
    missing = {c: [s for s in runs.requested if s not in runs.runs.get(c, {})] for c in dict.fromkeys(cases)}
    parts = [f"{c} (seed {', '.join(map(str, m))})" for c, m in missing.items() if m]
    return "named seed(s) without a record: " + "; ".join(parts) if parts else ""


def evaluate_claims(runs: SuiteRuns) -> list[dict]:
    """Every claim of :data:`CLAIMS` on ``runs`` (a dynamics suite)."""
    return [evaluate_claim(c, runs) for c in CLAIMS]


def evaluate_point_claims(suites: dict[str, SuiteRuns]) -> list[dict]:
    """Every claim of :data:`POINT_CLAIMS` (chapter 10) on the runs of its suite (``suites[claim.suite]``)."""
    return [evaluate_claim(c, suites[c.suite]) for c in POINT_CLAIMS]
