"""Chapter 6, weight decay and the β symmetry: the early steps under weight decay, the weight-decay law, β drift by
depth, β and τ per optimizer, the query and key biases, and rebalancing (the paper's §5), from run records.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..lm import analysis as an
from ..lm import claims as cl
from ..lm.analysis import SuiteRuns, span
from ..lm.metrics import Key
from ..lm.profiles import DEEP_SGD, RunConfig, lr_at
from . import with_formats
from .dynamics import MAIN, Scales, per_head, per_layer


def _layers(idx) -> str:
    idx = [int(i) + 1 for i in idx]
    return ", ".join(map(str, idx)) if idx else "none"


# ------------------------------------------------------------------------------ the early steps under weight decay
def transient_cut(runs: SuiteRuns) -> int:
    """The early steps shown for SGD + weight decay: the first fifth of training, at least three metric rows."""
    cfg = runs.first("sgd_wd").config
    return max(cfg["max_iters"] // 5, 3 * cfg["metric_interval"])


def fig_wd_transient(runs: SuiteRuns, cut: int, title: str):
    """SGD + weight decay over its first ``cut`` steps: ρ (mean over layers and heads) and the relative
    imbalance (mean over layers), mean over seeds with the range shaded."""
    import matplotlib.pyplot as plt

    from ..plotting import band, panels

    fig, axes = panels(2, height=3.6)
    ax, bx = axes[0]
    for a, key, reduce in ((ax, Key.RHO, per_head), (bx, Key.BETA_REL, per_layer)):
        steps, mean, lo, hi = an.band(runs, "sgd_wd", key, reduce)
        early = steps <= cut
        band(a, steps[early], mean[early], lo[early], hi[early], color="C1")
    ax.set(xlabel="training step", ylabel="ρ", title=f"SGD + weight decay, {title}")
    bx.set(xlabel="training step", ylabel="‖β‖ / (‖G_Q‖ + ‖G_K‖)", title="relative imbalance")
    plt.show()
    return fig


def transient_sentence(runs: SuiteRuns, cut: int) -> str:
    """SGD + weight decay over its first ``cut`` steps (:func:`attnid.lm.analysis.wd_transient`): whether the
    early fall of ρ comes with the gradient growing beside the decay."""
    t = an.wd_transient(runs, cut)
    reading = (
        "So the early fall of ρ does not come from the decay balancing the layer (the imbalance, to which the "
        "decay's symmetry component is proportional, barely moves); it comes with the gradients growing beside "
        "the decay."
        if t["gradient_explains"]
        else "In this build these numbers do not attribute the change of ρ to the gradient growing beside the "
        "decay (that needs ρ to halve while the imbalance changes by less than a quarter and the gradient at "
        "least doubles; see `attnid.lm.analysis.wd_transient`)."
    )
    return (
        f"SGD + weight decay (mean over seeds): ρ = {t['rho_first']:.3f} at the first recorded step and "
        f"{t['rho_last']:.3f} at step {t['last_step']}, {t['rho_end']:.3f} at the end. Over those first {cut} "
        f"steps the relative imbalance changes by {t['imbalance_change']:.0%} ({t['imbalance_first']:.3f} → "
        f"{t['imbalance_last']:.3f}) and the median query-bias gradient by a factor "
        f"{t['grad_last'] / t['grad_first']:.2g} ({t['grad_first']:.1e} → {t['grad_last']:.1e}). {reading}"
    )


# ------------------------------------------------------------------------------ the weight-decay law
def table_wd_law(scales: Scales) -> pd.DataFrame:
    """One row per scale, seed and layer: the law's residual ``‖β_T − c_T β_0‖ / ‖c_T β_0‖``, plain SGD's
    remainder over ``c_T``, whether the layer is tested and whether the law holds there (to
    :data:`attnid.lm.claims.LAW_TOLERANCE`), and what the residual was measured on."""
    rows = []
    for name, runs in scales.items():
        if "sgd_wd" not in runs or "sgd" not in runs:
            continue
        seeds = runs.seeds(("sgd", "sgd_wd"))
        laws = [cl.wd_beta_law(runs.runs["sgd_wd"][s], runs.runs["sgd"][s]) for s in seeds]
        tested = cl.law_tested(laws)  # one set for every seed, as the claim reads it
        for s, law in zip(seeds, laws):
            assert law.remainder is not None
            for i, r in enumerate(law.residual):
                rows.append(
                    {
                        "scale": name,
                        "seed": s,
                        "layer": i + 1,
                        "c_T": law.factor,
                        "law residual": float(r),
                        "SGD remainder / c_T": float(law.remainder[i]),
                        "tested": i in tested,
                        "holds (< 1 %)": bool(r < cl.LAW_TOLERANCE),
                        "measured on": "β" if law.measure.startswith("β") else "τ per head",
                    }
                )
    df = pd.DataFrame(rows)
    return with_formats(df, c_T="{:.4f}", **{"law residual": "{:.2e}", "SGD remainder / c_T": "{:.3g}"})


def law_paragraph(table: pd.DataFrame) -> str:
    """The law per layer at every scale (:func:`law_sentence`) and how its residual compares with plain SGD's
    remainder (:func:`law_remainder_reading`)."""
    per_scale = "; ".join(law_sentence(table, name) for name in table["scale"].unique())
    return (
        f"Per layer, median over seeds (as the claim chooses its layers): {per_scale}. {law_remainder_reading(table)}."
    )


def law_sentence(table: pd.DataFrame, scale: str) -> str:
    """What the law does at one scale, from :func:`table_wd_law`: the median over seeds per layer (the claim chooses
    its layers by the median remainder), and, where the seeds differ, how many pass a layer."""
    part = table[table["scale"] == scale]
    t = part.groupby("layer")[["law residual", "SGD remainder / c_T", "c_T"]].median()
    passing = part.groupby("layer")["law residual"].apply(lambda r: int((r < cl.LAW_TOLERANCE).sum()))
    seeds = part.groupby("layer")["law residual"].size()
    holds = t[t["law residual"] < cl.LAW_TOLERANCE]
    fails = t[~(t["law residual"] < cl.LAW_TOLERANCE)]
    on = part["measured on"].iloc[0]
    text = f"at the {scale} (read on {on}, c_T = {t['c_T'].iloc[0]:.3g}) the law holds to 1 % in "
    text += (
        f"layer(s) {_layers(holds.index - 1)} (residual ≤ {holds['law residual'].max():.2g}, plain SGD's remainder "
        f"{span(holds['SGD remainder / c_T'], '.2g')} times c_T)"
        if len(holds)
        else "no layer"
    )
    if len(fails):
        text += (
            f" and fails in layer(s) {_layers(fails.index - 1)} (residual {span(fails['law residual'], '.2g')}, "
            f"remainder {span(fails['SGD remainder / c_T'], '.2g')} times c_T)"
        )
    split = [f"{passing[i]} of {seeds[i]} seeds pass layer {i}" for i in t.index if 0 < passing[i] < seeds[i]]
    if split:
        text += f" ({'; '.join(split)})"
    return text


def law_remainder_reading(table: pd.DataFrame) -> str:
    """How the law's residual compares with plain SGD's remainder over every layer, scale and seed of
    :func:`table_wd_law`, and what a remainder below ``c_T`` therefore predicts of the residual in the tested
    layers, as a sentence computed from the table."""
    ratio = table["law residual"] / table["SGD remainder / c_T"]
    lo, hi = float(ratio.min()), float(ratio.max())
    tested = table[table["tested"]]
    n_pass = int(tested["holds (< 1 %)"].sum())
    where = (
        f"In the tested layers the residual is below 1 % in {n_pass} of {len(tested)} (layer, seed) pairs"
        if len(tested)
        else "No layer is tested at any scale"
    )
    if hi <= 1:
        bound = (
            f"The residual is {span([lo, hi], '.2g')} times plain SGD's remainder in every layer, scale and seed: the "
            f"law's error is of the size of the second-order remainder, so a remainder below c_T bounds the residual "
            f"by about {hi:.2g}, not by the 1 % tolerance, and whether it is below 1 % is what the test reads"
        )
    else:
        bound = (
            f"The residual is {span([lo, hi], '.2g')} times plain SGD's remainder: in some layers something beyond the "
            "second-order remainder of the steps breaks the law"
        )
    return f"{bound}. {where}"


def fig_wd_law(scales: Scales, titles: dict[str, str]):
    """Left: the law's residual over training, every layer of the last scale (seed 0 of it, usually this build's
    rerun). Right: every layer at every scale and seed, final residual against plain SGD's remainder / c_T, with
    the 1 % tolerance and the line where the residual equals the remainder."""
    import matplotlib.pyplot as plt

    from ..plotting import panels

    fig, axes = panels(2, height=3.8)
    ax, bx = axes[0]
    name = list(scales)[-1]
    runs = scales[name]
    law = cl.wd_beta_law(runs.first("sgd_wd"), runs.first("sgd"))
    for layer in range(law.curve.shape[1]):
        ax.plot(law.steps, np.clip(law.curve[:, layer], 1e-9, None), color=f"C{layer}", label=f"layer {layer + 1}")
    ax.axhline(cl.LAW_TOLERANCE, color="k", ls="--", lw=1, label="1 % tolerance")
    ax.set_yscale("log")
    ax.set(xlabel="training step", ylabel="‖β_t − c_t β_0‖ / ‖c_t β_0‖", title=f"law residual, {titles[name]}")
    ax.legend(fontsize="small")
    t = table_wd_law(scales)
    for k, (scale, part) in enumerate(t.groupby("scale", sort=False)):
        bx.scatter(
            part["SGD remainder / c_T"],
            part["law residual"],
            marker="os^"[k % 3],
            color=f"C{k}",
            label=f"{scale} ({part['measured on'].iloc[0]})",
        )
    lo = min(t["SGD remainder / c_T"].min(), t["law residual"].min(), 1e-3) / 2
    hi = max(t["SGD remainder / c_T"].max(), t["law residual"].max(), 1.0) * 2
    bx.plot([lo, hi], [lo, hi], color="0.5", lw=1, ls=":", label="residual = remainder")
    bx.axhline(cl.LAW_TOLERANCE, color="k", ls="--", lw=1, label="1 % tolerance")
    bx.axvline(1.0, color="0.3", lw=0.8, ls="-.", label="tested: remainder < c_T")
    bx.set_xscale("log")
    bx.set_yscale("log")
    bx.set(
        xlim=(lo, hi),
        ylim=(lo, hi),
        xlabel="plain SGD's final drift / c_T (its remainder)",
        ylabel="final law residual",
        title="every layer, every seed",
    )
    bx.legend(fontsize="small", loc="upper left")
    plt.show()
    return fig


# ------------------------------------------------------------------------------ β drift by depth
def table_drift_by_layer(scales: Scales) -> pd.DataFrame:
    """Plain SGD's final β drift per layer, one row per scale and seed, and the order the claim reads from it
    (Kendall's τ of earlier layer against larger drift, :func:`attnid.lm.analysis.layer_order`), from the deepest
    plain-SGD case the scale has (``sgd_deep`` where its profile trains one)."""
    rows = []
    for name, runs in scales.items():
        case = DEEP_SGD if DEEP_SGD in runs else "sgd"
        if case not in runs:
            continue
        for seed, rec in sorted(runs.runs[case].items()):
            drift = an.final_drift(rec)
            rows.append(
                {
                    "scale": name,
                    "case": case,
                    "seed": seed,
                    "final drift per layer, first to last": ", ".join(f"{d:.3g}" for d in drift),
                    "order (Kendall's τ; 1: every earlier layer drifts more)": an.layer_order(rec),
                }
            )
    return with_formats(
        pd.DataFrame(rows), seed="{:.0f}", **{"order (Kendall's τ; 1: every earlier layer drifts more)": "{:.2f}"}
    )


# ------------------------------------------------------------------------------ the key bias
def key_bias_step(rec) -> tuple[float, float]:
    """The key bias's step per coordinate as a share of the learning rate, read from its final norm per head
    (median head; it starts at zero): ``(coherent, walk)``, the share that explains the norm if every step
    points the same way (``‖b_K‖ / (√D Σ_t η_t)``) or if the steps are independent
    (``‖b_K‖ / √(D Σ_t η_t²)``). The true share lies between the two."""
    cfg = RunConfig.from_dict(rec.config)
    norm = float(np.median(an.values(rec, Key.NORM_BK)[-1]))
    D = cfg.gpt_config().head_dim
    assert D is not None
    eta = np.array([lr_at(cfg, t) for t in range(cfg.max_iters)])
    return norm / (np.sqrt(D) * eta.sum()), norm / np.sqrt(D * (eta**2).sum())


# ------------------------------------------------------------------------------ β, τ and the biases
def table_beta(scales: Scales) -> pd.DataFrame:
    """Per scale and main optimizer: final β drift of the first and last layer and the growth of τ's spread
    over the heads (mean over seeds; range of the latter). Case ids as ids."""
    rows = []
    for name, runs in scales.items():
        for case in MAIN:
            tau = an.over_seeds(runs, case, an.tau_spread_growth)
            rows.append(
                {
                    "scale": name,
                    "case": case,
                    "seeds": len(runs.runs[case]),
                    "final drift, layer 1": an.over_seeds(runs, case, lambda r: an.final_drift(r)[0])["mean"],
                    "final drift, last layer": an.over_seeds(runs, case, lambda r: an.final_drift(r)[-1])["mean"],
                    "τ spread end / start": tau["mean"],
                    "min": tau["min"],
                    "max": tau["max"],
                }
            )
    return with_formats(pd.DataFrame(rows), seeds="{:.0f}")


def tau_sentence(beta: pd.DataFrame) -> str:
    """τ's spread under AdamW against plain SGD (the control) at each scale."""
    per_scale = "; ".join(
        f"*{name}*: AdamW's spread grows {b.loc['adamw', 'τ spread end / start']:.1f}×, "
        f"SGD's {b.loc['sgd', 'τ spread end / start']:.1f}×"
        for name, b in ((n, part.set_index("case")) for n, part in beta.groupby("scale", sort=False))
    )
    return (
        "Plain SGD is the control for τ: training spreads τ over the heads whatever the optimizer. "
        f"{per_scale}. The claims table below compares the two."
    )


def table_bias(scales: Scales) -> pd.DataFrame:
    """Per scale and main optimizer: median query- and key-bias gradient norms per head, the largest key-bias
    gradient and the key bias's final norm (median head), over seeds. Case ids as ids."""

    def median_of(key):
        return lambda r: float(np.median(an.values(r, key)))

    rows = []
    for name, runs in scales.items():
        for case in MAIN:
            has_norm = Key.NORM_BK in runs.first(case).rows[0]  # the paper-scale records predate it
            final = (
                an.over_seeds(runs, case, lambda r: float(np.median(an.values(r, Key.NORM_BK)[-1])))["mean"]
                if has_norm
                else None
            )
            rows.append(
                {
                    "scale": name,
                    "case": case,
                    "median ‖∇b_Q‖": an.over_seeds(runs, case, median_of(Key.GRAD_BQ))["mean"],
                    "median ‖∇b_K‖": an.over_seeds(runs, case, median_of(Key.GRAD_BK))["mean"],
                    "largest ‖∇b_K‖": an.over_seeds(runs, case, lambda r: float(an.values(r, Key.GRAD_BK).max()))[
                        "max"
                    ],
                    "final ‖b_K‖ (median head)": final,
                }
            )
    df = pd.DataFrame(rows)
    return with_formats(df, **{k: "{:.2e}" for k in df.columns[2:]})


def key_bias_sentence(bias: pd.DataFrame, runs: SuiteRuns) -> str:
    """The key bias's final norm per optimizer in the rerun ``runs`` and AdamW's step share
    (:func:`key_bias_step`)."""
    bk = bias[bias["scale"] == runs.short_label()].set_index("case")["final ‖b_K‖ (median head)"]
    coherent, walk = adamw_key_bias_steps(runs)
    return (
        f"Final key-bias norm per head (rerun, median head, mean over seeds): AdamW {bk['adamw']:.1e}, plain SGD "
        f"{bk['sgd']:.1e}, SGD + weight decay {bk['sgd_wd']:.1e}. AdamW's key-bias steps are therefore "
        f"{coherent:.2%} (all aligned) to {walk:.1%} (independent) of the learning rate per coordinate."
    )


def bf16_key_bias_share(bias: pd.DataFrame, scales: Scales) -> str:
    """In words: the largest key-bias gradient of each scale trained at bf16 as a share of its typical query-bias
    gradient (the measure of the claim ``key_bias_grad_zero``, from :func:`table_bias`, largest over the cases): the
    round-off that keeps bf16 records from deciding the bias theorems (they grant
    :data:`attnid.lm.claims.BIAS_FLOOR`)."""
    parts = []
    for name, runs in scales.items():
        precision = str(runs.first(MAIN[0]).summary.get("precision", "fp32"))
        if precision in cl.BIAS_PRECISIONS:
            continue
        part = bias[bias["scale"] == name]
        share = float((part["largest ‖∇b_K‖"] / part["median ‖∇b_Q‖"]).max())
        parts.append(f"up to {share:.1e} of the typical query-bias gradient at the {name}")
    return "; ".join(parts) if parts else "not read here (no bf16 records among these scales)"


def adamw_key_bias_steps(runs: SuiteRuns) -> tuple[float, float]:
    """AdamW's key-bias step share (:func:`key_bias_step`), aligned and independent, mean over seeds."""
    shares = np.array([key_bias_step(rec) for _, rec in sorted(runs.runs["adamw"].items())])
    return float(shares[:, 0].mean()), float(shares[:, 1].mean())


def table_rebalance(runs: SuiteRuns) -> pd.DataFrame:
    """Every rebalancing event of the ``adamw_rebalance`` runs: seed, step, loss on a fixed batch before and
    after, and the change (float32)."""
    events = pd.DataFrame(
        [{"seed": s, **e} for s, rec in sorted(runs.runs["adamw_rebalance"].items()) for e in rec.summary["rebalances"]]
    )
    events["|Δ loss|"] = (events["loss_after"] - events["loss_before"]).abs()
    f6 = "{:.6f}"
    return with_formats(events, loss_before=f6, loss_after=f6, **{"|Δ loss|": "{:.1e}"})


def rebalance_sentence(events: pd.DataFrame, runs: SuiteRuns) -> str:
    """The largest loss change at a rebalance, and the final validation loss with and without rebalancing."""
    end = {c: an.over_seeds(runs, c, an.final_val_loss) for c in ("adamw", "adamw_rebalance")}
    a, b = end["adamw"], end["adamw_rebalance"]
    return (
        f"Largest loss change at a rebalance: {events['|Δ loss|'].max():.1e} (float32). Final validation loss "
        f"over {a['n']} seeds: AdamW {a['mean']:.4f} (range {a['min']:.4f}–{a['max']:.4f}), AdamW + rebalancing "
        f"{b['mean']:.4f} (range {b['min']:.4f}–{b['max']:.4f})."
    )
