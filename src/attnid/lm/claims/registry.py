"""The claims of the paper's §5 and of chapter 6 (:data:`CLAIMS`), each with its metric, threshold and why, its
control and the cases it reads; the comparisons of optimizers also read at the same loss (:mod:`.matched`)."""

from __future__ import annotations

import numpy as np

from ..analysis import (
    drift_order_p,
    drift_reversal_p,
    drift_slope,
    final_drift,
    max_rho,
    mean_rho,
    min_sv_ratio,
    tau_spread_growth,
    values,
)
from ..metrics import Key
from ..profiles import DEEP_SGD, LR_SWEEP
from .claim import Claim, need
from .law import LAW_STATED_BY, LAW_TOLERANCE, _law_detail, _laws, law_values
from .matched import MATCHED_LOSS, matched_loss_twin
from .readings import (
    BIAS_CASES,
    BIAS_FLOOR,
    _iso,
    _rho_of,
    _sgd_wd_setting,
    _tested_remainder,
    bias_scale,
    float32_late_ratio,
    key_bias_ratio,
    mean_imbalance,
    query_bias_margin,
    rebalance_loss_change,
)

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
        value=lambda c: float32_late_ratio(c["sgd"]),
        op=">",
        threshold=2.0,
        why="a doubling; the float32 rounding floor grows as the cosine schedule shrinks the steps (fp32 and tf32 "
        "records only: a bf16 record's floor is bf16's own)",
        cases=("sgd", "adamw"),
        control_text="the same ratio for AdamW (whose steps do not shrink with the gradient)",
        control=lambda c: float32_late_ratio(c["adamw"]),
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
        metric="share of random orders of the layers with at most as many pairs out of order (an earlier layer "
        "drifting less than a later one) as the final SGD drift, per seed (the row: the largest); plain SGD of ≥ 4 "
        "layers",
        value=lambda c: drift_order_p(c[DEEP_SGD]),
        op="<",
        threshold=0.05,
        why="the null is a random order of the layers: the order counts as earlier-layers-drift-more when fewer than "
        "5 % of the L! orders are as ordered (Mahonian numbers), in every seed, and as against the paper only when "
        "the opposite order is as rare (later layers drifting more), in every seed; a seed that rejects the null "
        "neither way is no evidence either way. The threshold on the count follows from the depth (4 layers: only "
        "the full order, 1 in 24; 6 layers: at most 2 of 15 pairs, 20 in 720) instead of being chosen. 3 layers "
        "can never pass (the full order is 1 in 6), so a verdict needs 4; where the profile's model has fewer, a "
        "4-layer SGD case is trained for it",
        cases=(DEEP_SGD,),
        min_layers=4,
        stand_in=((DEEP_SGD, "sgd"),),
        against=lambda c: drift_reversal_p(c[DEEP_SGD]),
        aggregate="max",
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
        stated_by=LAW_STATED_BY,
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
        "typical query-bias gradient, and 1e-4 is the share round-off is granted (a chosen margin, six times that "
        "size, not derived). The scale is "
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


CLAIMS = tuple(t for c in CLAIMS for t in ((c, matched_loss_twin(c)) if c.id in MATCHED_LOSS else (c,)))
CLAIM_IDS = tuple(c.id for c in CLAIMS)
