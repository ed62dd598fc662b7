"""Chapter 6 (the paper's §5, training dynamics): the weight-decay law, the key-bias step and the claims
table, from run records (:mod:`attnid.lm.claims`, :mod:`attnid.lm.analysis`).

``scales`` maps a short label (``"paper scale"``, ``"cpu rerun"``) to the :class:`~attnid.lm.analysis.SuiteRuns`
of that scale, the paper scale first.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..lm import analysis as an
from ..lm import claims as cl
from ..lm.analysis import SuiteRuns
from ..lm.metrics import Key
from ..lm.profiles import DEEP_SGD, LR_SWEEP, OPTIMIZER_CASES, RunConfig, lr_at
from . import CASE_LABELS, PAPER_CMD, read_suite, with_formats

Scales = dict[str, SuiteRuns]
READS = ("dynamics",)  # the suites whose records chapter 6 reads (the book's cache re-executes it when they change)
MAIN = ("sgd", "sgd_wd", "adamw")  # the optimizer cases every comparison reads


# ------------------------------------------------------------------------------ the runs
COMMITTED = ("paper", "mid")  # the profiles whose records are committed, read beside this build's rerun


def load_scales(profile: str) -> Scales:
    """The chapter's scales, read from the records (nothing is trained here): the committed records of the paper and
    mid profiles (when this build reads another profile and they hold the main cases), then this build's rerun of
    ``profile`` (:func:`attnid.chapters.read_suite`; every record must hold the float64 ρ)."""
    rerun = read_suite(profile, "dynamics", current=lambda rec: an.rho_key(rec) == Key.RHO)
    scales = {}
    for committed in COMMITTED:
        if committed != profile:
            runs = an.load_suite(committed, "dynamics")
            if all(c in runs for c in MAIN):
                scales[runs.short_label()] = runs
    scales[rerun.short_label()] = rerun
    return scales


def titles(scales: Scales) -> dict[str, str]:
    """Each scale's panel title, e.g. ``"cpu rerun (2 × 4 × 64, cpu)"``."""
    return {name: runs.label() for name, runs in scales.items()}


def runs_sentence(scales: Scales) -> str:
    """Which runs the chapter reads, per scale, and which are pending."""
    text = "; ".join(
        f"*{runs.label()}*: {len(runs.runs)} cases, seeds {runs.seeds() or runs.seeds(MAIN)}"
        for runs in scales.values()
    )
    status = table_status(scales)
    pending = [f"{r.case} ({r.scale})" for r in status[status["status"] == "pending"].itertuples()]
    if pending:
        text += f". **Pending** (not yet run; make them on a GPU with `{PAPER_CMD}`): {', '.join(pending)}"
    return f"**Runs in this chapter.** {text}."


def table_status(scales: Scales) -> pd.DataFrame:
    """One row per case and scale: status, seeds, steps, best validation loss, how ρ was measured."""
    rows = pd.DataFrame([{"scale": name, **row} for name, runs in scales.items() for row in an.run_summary(runs)])
    rows = rows.rename(
        columns={
            "best_val_loss": "best val loss, mean (nats/char)",
            "best_val_loss_low": "min",
            "best_val_loss_high": "max",
            "rho_measure": "ρ measured from",
        }
    )
    f3 = "{:.3f}"
    col = "best val loss, mean (nats/char)"
    return with_formats(rows, **{col: f3, "min": f3, "max": f3, "steps": "{:,.0f}", "seeds": "{:.0f}"})


def _layers(idx) -> str:
    idx = [int(i) + 1 for i in idx]
    return ", ".join(map(str, idx)) if idx else "none"


# ------------------------------------------------------------------------------ reducers and figures over training
def per_head(v: np.ndarray) -> np.ndarray:
    """``(rows, L, H) -> (rows,)``: the mean over layers and heads."""
    return np.nanmean(v, axis=(1, 2))


def per_layer(v: np.ndarray) -> np.ndarray:
    """``(rows, L) -> (rows,)``: the mean over layers."""
    return v.mean(1)


def median_head(v: np.ndarray) -> np.ndarray:
    """``(rows, L, H) -> (rows,)``: the median over every head."""
    return np.median(v.reshape(len(v), -1), 1)


def plot_cases(ax, runs: SuiteRuns, key, reduce, *, label: str = "{case}", floor: float | None = None, **line_kw):
    """One line per optimizer case of ``runs`` (mean over seeds, range shaded) of ``reduce(values of key)``, in the
    case's colour; ``key`` may be a function of the case's first record (ρ's measure), ``label`` a format with
    ``{case}`` and ``{best}`` (the smallest mean), ``floor`` clips the values from below (for a log axis)."""
    from ..plotting import band

    for i, case in enumerate(OPTIMIZER_CASES):
        if case not in runs:
            continue
        k = key(runs.first(case)) if callable(key) else key
        steps, *curves = an.band(runs, case, k, reduce)
        if floor is not None:
            curves = [np.clip(c, floor, None) for c in curves]
        text = label.format(case=CASE_LABELS[case], best=curves[0].min())
        band(ax, steps, *curves, color=f"C{i}", label=text, **line_kw)


def fig_loss(scales: Scales, titles: dict[str, str]):
    """Validation loss per optimizer case at each scale (mean over seeds, range shaded)."""
    import matplotlib.pyplot as plt

    from ..plotting import panels

    fig, axes = panels(len(scales), height=3.6)
    for ax, (name, runs) in zip(axes[0], scales.items()):
        plot_cases(ax, runs, Key.VAL_LOSS, lambda v: v, label="{case} (best {best:.3f})", marker="o", ms=3)
        ax.set(
            xlabel="training step",
            ylabel="validation cross-entropy (nats per character)",
            title=titles[name],
        )
        ax.legend()
    plt.show()
    return fig


def fig_rho(scales: Scales, titles: dict[str, str]):
    """ρ per optimizer case at each scale (mean over layers and heads, over seeds; range shaded) with the isotropic
    share, each scale in the ρ measure its records hold."""
    import matplotlib.pyplot as plt

    from ..plotting import panels

    fig, axes = panels(len(scales), height=3.6, sharey=True)
    for ax, (name, runs) in zip(axes[0], scales.items()):
        plot_cases(ax, runs, an.rho_key, per_head, lw=1)
        iso = an.isotropic_rho(runs.first("adamw").config)
        ax.axhline(iso, color="k", ls="--", lw=1, label="isotropic D/(2(E+1))")
        ax.set_yscale("log")
        ax.set(title=titles[name], xlabel="training step")
    axes[0, 0].set_ylabel("ρ (share of the update's energy)")
    for ax in axes[0]:
        ax.legend()
    plt.show()
    return fig


def fig_beta(runs: SuiteRuns, title: str):
    """β drift and relative imbalance per optimizer case (mean over layers; over seeds, range shaded)."""
    import matplotlib.pyplot as plt

    from ..plotting import panels

    fig, axes = panels(2, height=3.6)
    ax, bx = axes[0]
    plot_cases(ax, runs, Key.BETA_DRIFT, per_layer)
    plot_cases(bx, runs, Key.BETA_REL, per_layer)
    ax.set_yscale("log")
    ax.set(
        xlabel="training step",
        ylabel="‖β_t − β_0‖ / ‖β_0‖",
        title=f"β drift, {title}",
    )
    bx.set_yscale("log")
    bx.set(xlabel="training step", ylabel="‖β‖ / (‖G_Q‖ + ‖G_K‖)", title="relative imbalance")
    ax.legend()
    plt.show()
    return fig


def fig_bias(runs: SuiteRuns, title: str):
    """Median bias-gradient norms per head (query solid, key dashed) and the key bias's norm, per optimizer case."""
    import matplotlib.pyplot as plt

    from ..plotting import panels

    fig, axes = panels(2, height=3.6)
    ax, bx = axes[0]
    plot_cases(ax, runs, Key.GRAD_BQ, median_head, label="{case}, $b_Q$")
    plot_cases(ax, runs, Key.GRAD_BK, median_head, label="{case}, $b_K$", ls="--")
    plot_cases(bx, runs, Key.NORM_BK, median_head, floor=1e-12)
    ax.set_yscale("log")
    bx.set_yscale("log")
    ax.set(
        xlabel="training step",
        ylabel="gradient norm per head",
        title=f"bias gradients, {title}",
    )
    bx.set(xlabel="training step", ylabel="‖b_K‖ per head", title="the key bias itself")
    ax.legend(ncol=2, loc="center")
    bx.legend(loc="center right")
    plt.show()
    return fig


# ------------------------------------------------------------------------------ ρ per optimizer
def rho_rows(scales: Scales) -> pd.DataFrame:
    """Per scale and optimizer case: :func:`attnid.lm.analysis.rho_summary` (mean ρ over seeds and its range,
    largest per-head ρ, the isotropic share, the float32-difference and weights-only ρ), case ids as ids."""
    return pd.DataFrame(
        [{"scale": name, **row} for name, runs in scales.items() for row in an.rho_summary(runs, OPTIMIZER_CASES)]
    )


def table_rho(rows: pd.DataFrame) -> pd.DataFrame:
    """:func:`rho_rows` as the chapter shows it."""
    shown = rows.assign(case=rows["case"].map(CASE_LABELS)).rename(
        columns={
            "rho_measure": "ρ measured from",
            "mean_rho": "mean ρ (over seeds)",
            "mean_rho_low": "min",
            "mean_rho_high": "max",
            "max_rho": "largest per-head ρ",
            "isotropic": "isotropic D/(2(E+1))",
            "mean_rho_diff": "mean ρ, float32 difference",
            "mean_rho_w": "mean ρ, weights only",
        }
    )
    return with_formats(shown, seeds="{:.0f}")


def rho_sentence(rows: pd.DataFrame, runs: SuiteRuns) -> str:
    """The main optimizers ranked by mean ρ at each scale, plain SGD's largest ρ in the rerun ``runs`` and what
    float32 round-off predicts for it."""
    ranked = "; ".join(
        f"*{name}*: "
        + " > ".join(
            f"{CASE_LABELS[case]} ({r:.2g})"
            for case, r in part.set_index("case").loc[list(MAIN), "mean_rho"].sort_values(ascending=False).items()
        )
        for name, part in rows.groupby("scale", sort=False)
    )
    sgd_max = an.over_seeds(runs, "sgd", an.max_rho)["max"]
    return (
        f"Mean ρ, largest first: {ranked}. Plain SGD's ρ in the rerun is at most {sgd_max:.1e} over "
        f"{len(runs.runs['sgd'])} seeds. A float32 gradient carries a rounding error of about "
        "$2^{-24} \\approx 6\\times10^{-8}$ of each coordinate, in no particular direction, so a share of the "
        "order of its square ($\\approx 4\\times10^{-15}$) lands in the invariant directions; a float64 "
        "gradient would put about $10^{-32}$ there. What the paper-scale records show for SGD is the much "
        "higher rounding floor of the float32 weight difference (next section), not motion along the symmetry."
    )


def weights_only_sentence(rows: pd.DataFrame, scale: str) -> str:
    """ρ measured on the weights alone against the bias-augmented ρ, plain SGD and AdamW, at ``scale``."""
    r = rows[rows["scale"] == scale].set_index("case")
    return (
        f"Plain SGD, rerun: ρ of the weights alone {r.loc['sgd', 'mean_rho_w']:.1e} against "
        f"{r.loc['sgd', 'mean_rho']:.1e} with the bias column; AdamW: {r.loc['adamw', 'mean_rho_w']:.3f} "
        f"against {r.loc['adamw', 'mean_rho']:.3f} (means over {int(r.loc['adamw', 'seeds'])} seeds)."
    )


# ------------------------------------------------------------------------------ the float32 floor
def floor_by_lr(runs: SuiteRuns) -> tuple[list[float], list[dict], list[dict]]:
    """Over the plain-SGD sweep: the learning rates (ascending) and, per rate, mean ρ over training of the
    float32 weight difference and of the float64 update (:func:`attnid.lm.analysis.over_seeds` dicts)."""
    sweep = {lr: case for lr, case in sorted(LR_SWEEP.items()) if case in runs}
    lrs = list(sweep)
    floor = [an.over_seeds(runs, sweep[lr], lambda r: an.mean_rho(r, Key.RHO_DIFF)) for lr in lrs]
    exact = [an.over_seeds(runs, sweep[lr], lambda r: an.mean_rho(r, Key.RHO)) for lr in lrs]
    return lrs, floor, exact


def fig_floor(runs: SuiteRuns, title: str):
    """Plain SGD's ρ from the float32 weight difference and from the float64 update: over training with the
    learning rate (left), and its mean over training against the sweep's learning rate (right)."""
    import matplotlib.pyplot as plt

    from ..plotting import band, panels

    fig, axes = panels(2, height=3.6)
    ax, bx = axes[0]
    band(ax, *an.band(runs, "sgd", Key.RHO_DIFF, per_head), color="C3", label="float32 weight difference")
    s, m, lo, hi = an.band(runs, "sgd", Key.RHO, per_head)
    band(ax, s, *(np.clip(v, 1e-18, None) for v in (m, lo, hi)), color="C0", label="float64 update")
    ax.set_yscale("log")
    ax.set(xlabel="training step", ylabel="ρ", title=f"plain SGD, {title}")
    lr_ax = ax.twinx()
    lr_ax.plot(*an.series(runs.first("sgd").rows, Key.LR), color="0.5", ls=":", label="learning rate")
    lr_ax.set_ylabel("learning rate")
    lr_ax.grid(False)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = lr_ax.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2)
    lrs, floor, exact = floor_by_lr(runs)
    for vals, mk, c, lab in ((floor, "o", "C3", "float32 weight difference"), (exact, "s", "C0", "float64 update")):
        mean = np.clip([v["mean"] for v in vals], 1e-18, None)
        err = [
            mean - np.clip([v["min"] for v in vals], 1e-18, None),
            np.clip([v["max"] for v in vals], 1e-18, None) - mean,
        ]
        bx.errorbar(lrs, mean, yerr=err, fmt=f"{mk}-", color=c, capsize=3, label=lab)
    bx.set_xscale("log")
    bx.set_yscale("log")
    bx.set(xlabel="SGD learning rate", ylabel="mean ρ over training", title="the float32 floor rises as steps shrink")
    bx.set_xticks(lrs, [str(lr) for lr in lrs])
    bx.minorticks_off()
    bx.legend()
    plt.show()
    return fig


LATE_F32 = "last tenth / middle, float32 difference"
LATE_F64 = "last tenth / middle, float64 update"


def table_late(scales: Scales) -> pd.DataFrame:
    """Per scale and optimizer case: mean ρ over the last tenth of training against the middle
    (:func:`attnid.lm.analysis.late_ratio`, mean over seeds), from the float32 difference and, where the
    records hold it, from the float64 update. Case ids as ids."""
    rows = []
    for name, runs in scales.items():
        for case in (c for c in OPTIMIZER_CASES if c in runs):
            exact = an.rho_key(runs.first(case)) == Key.RHO
            rows.append(
                {
                    "scale": name,
                    "case": case,
                    "seeds": len(runs.runs[case]),
                    LATE_F32: an.over_seeds(runs, case, an.late_ratio)["mean"],
                    LATE_F64: an.over_seeds(runs, case, lambda r: an.late_ratio(r, Key.RHO))["mean"] if exact else None,
                }
            )
    return with_formats(pd.DataFrame(rows), seeds="{:.0f}")


def late_sentence(late: pd.DataFrame, runs: SuiteRuns) -> str:
    """Which optimizers' float32-difference ρ rises at the end of training (the claim ``late_spike_sgd``'s
    threshold), and the floor across the SGD sweep of the rerun ``runs``."""
    claim = next(c for c in cl.CLAIMS if c.id == "late_spike_sgd")
    up = late[[claim.holds(v) for v in late[LATE_F32]]]
    rest = late.loc[~late.index.isin(up.index), LATE_F32]
    rising = ", ".join(f"{CASE_LABELS[r['case']]} ({r['scale']}, {r[LATE_F32]:.1f}×)" for _, r in up.iterrows())
    lrs, floor, exact = floor_by_lr(runs)
    return (
        f"Over the last tenth of training against the middle, the float32-difference ρ rises by more than "
        f"{claim.threshold:g}× for {rising or 'no optimizer'}; for the others it stays between {rest.min():.2f}× "
        f"and {rest.max():.2f}×. Across the sweep the floor is {floor[0]['mean'] / floor[-1]['mean']:.1f}× higher "
        f"at η = {lrs[0]} than at η = {lrs[-1]}, while the float64 update stays below "
        f"{max(v['max'] for v in exact):.0e}. So a spike of ρ at the end of training (the paper's §5.3) is the "
        "rounding floor of plain SGD's shrinking steps, where it appears at all; AdamW's normalised steps do not "
        "shrink with the gradient, and its float32 difference shows none."
    )


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


# ------------------------------------------------------------------------------ QK spectra
MAIN = ("sgd", "sgd_wd", "adamw")


def fig_spectra(scales: Scales, titles: dict[str, str]):
    """Singular values of every head's QK product, layer 1, at the last evaluation, over the largest; one line
    per head, one colour per optimizer case (seed 0), a panel per scale."""
    import matplotlib.pyplot as plt

    from ..plotting import panels

    fig, axes = panels(len(scales), height=3.6, sharey=True)
    for ax, (name, runs) in zip(axes[0], scales.items()):
        for i, case in enumerate(MAIN):
            sv = an.values(runs.first(case), Key.QK_SV)[-1]  # (L, H, D)
            for h in range(sv.shape[1]):
                ax.semilogy(
                    np.arange(1, sv.shape[-1] + 1),
                    sv[0, h] / sv[0, h, 0],
                    color=f"C{i}",
                    lw=0.8,
                    label=CASE_LABELS[case] if h == 0 else None,
                )
        ax.set(title=titles[name], xlabel="index", ylabel="σ / σ_max")
        ax.legend()
    plt.show()
    return fig


def table_spectra(scales: Scales) -> pd.DataFrame:
    """Per scale and case: the smallest σ_min / σ_max of any final QK product (any head and seed) and the mean
    effective rank (case names, for display)."""
    df = pd.DataFrame(
        [
            {
                "scale": name,
                "case": case,
                "smallest σ / largest (any head, any seed)": an.over_seeds(runs, case, an.min_sv_ratio)["min"],
                "effective rank (mean over heads and seeds)": an.over_seeds(
                    runs, case, lambda r: float(an.final_effective_rank(r).mean())
                )["mean"],
                "D": an.values(runs.first(case), Key.QK_SV).shape[-1],
            }
            for name, runs in scales.items()
            for case in MAIN
        ]
    )
    df["case"] = df["case"].map(CASE_LABELS)
    return with_formats(
        df,
        **{
            "smallest σ / largest (any head, any seed)": "{:.2e}",
            "effective rank (mean over heads and seeds)": "{:.1f}",
        },
    )


# ------------------------------------------------------------------------------ the SGD learning-rate sweep
def sweep_finals(runs: SuiteRuns) -> dict[float, np.ndarray]:
    """Final β drift of the plain-SGD sweep: learning rate -> ``(seeds, L)``, ascending in η."""
    return {
        lr: np.array([an.final_drift(r) for _, r in sorted(runs.runs[case].items())])
        for lr, case in sorted(LR_SWEEP.items())
        if case in runs
    }


def fig_sweep(runs: SuiteRuns, title: str):
    """Final β drift per layer against the SGD learning rate (log–log; mean over seeds, bars: range)."""
    import matplotlib.pyplot as plt

    finals = sweep_finals(runs)
    lrs = list(finals)
    fig, ax = plt.subplots()
    for layer in range(next(iter(finals.values())).shape[1]):
        mean = np.array([finals[lr][:, layer].mean() for lr in lrs])
        lo = np.array([finals[lr][:, layer].min() for lr in lrs])
        hi = np.array([finals[lr][:, layer].max() for lr in lrs])
        ax.errorbar(lrs, mean, yerr=[mean - lo, hi - mean], fmt="o-", capsize=3, label=f"layer {layer + 1}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set(
        xlabel="SGD learning rate η",
        ylabel="final ‖β_T − β_0‖ / ‖β_0‖",
        title=f"β drift against the step size, {title}",
    )
    ax.set_xticks(lrs, [str(lr) for lr in lrs])
    ax.minorticks_off()
    ax.legend()
    plt.show()
    return fig


def table_sweep(runs: SuiteRuns) -> pd.DataFrame:
    """Per layer: the slope of log(final drift) against log η (mean, min and max over seeds) and the drift at each
    learning rate (mean over seeds)."""
    finals = sweep_finals(runs)
    lrs = list(finals)
    n_seeds, n_layers = finals[lrs[0]].shape
    slopes = np.array(
        [
            [np.polyfit(np.log(lrs), np.log([finals[lr][i, layer] for lr in lrs]), 1)[0] for layer in range(n_layers)]
            for i in range(n_seeds)
        ]
    )  # (seeds, layers)
    df = pd.DataFrame(
        {
            "layer": np.arange(1, n_layers + 1),
            "slope of log drift vs log η (mean over seeds)": slopes.mean(0),
            "min": slopes.min(0),
            "max": slopes.max(0),
            **{f"drift at η = {lr}": finals[lr].mean(0) for lr in lrs},
        }
    )
    return with_formats(df, min="{:.2f}", max="{:.2f}", **{f"drift at η = {lr}": "{:.2e}" for lr in lrs})


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
    return f"Per layer, mean over seeds: {per_scale}. {law_remainder_reading(table)}."


def law_sentence(table: pd.DataFrame, scale: str) -> str:
    """What the law does at one scale, from :func:`table_wd_law` (mean over seeds per layer)."""
    part = table[table["scale"] == scale]
    t = part.groupby("layer")[["law residual", "SGD remainder / c_T", "c_T"]].mean()
    holds = t[t["law residual"] < cl.LAW_TOLERANCE]
    fails = t[~(t["law residual"] < cl.LAW_TOLERANCE)]
    on = part["measured on"].iloc[0]
    text = f"at the {scale} (read on {on}, c_T = {t['c_T'].iloc[0]:.3g}) the law holds to 1 % in "
    text += (
        f"layer(s) {_layers(holds.index - 1)} (residual ≤ {holds['law residual'].max():.2g}, plain SGD's remainder "
        f"{holds['SGD remainder / c_T'].min():.2g} to {holds['SGD remainder / c_T'].max():.2g} times c_T)"
        if len(holds)
        else "no layer"
    )
    if len(fails):
        text += (
            f" and fails in layer(s) {_layers(fails.index - 1)} (residual {fails['law residual'].min():.2g} to "
            f"{fails['law residual'].max():.2g}, remainder {fails['SGD remainder / c_T'].min():.2g} to "
            f"{fails['SGD remainder / c_T'].max():.2g} times c_T)"
        )
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
            f"The residual is {lo:.2g} to {hi:.2g} times plain SGD's remainder in every layer, scale and seed: the "
            f"law's error is of the size of the second-order remainder, so a remainder below c_T bounds the residual "
            f"by about {hi:.2g}, not by the 1 % tolerance, and whether it is below 1 % is what the test reads"
        )
    else:
        bound = (
            f"The residual is {lo:.2g} to {hi:.2g} times plain SGD's remainder: in some layers something beyond the "
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


def sweep_sentence(sweep: pd.DataFrame) -> str:
    """The slope of log drift against log η per layer (:func:`table_sweep`)."""
    col = "slope of log drift vs log η (mean over seeds)"
    slopes = ", ".join(f"layer {layer}: {v:.2f}" for layer, v in zip(sweep["layer"], sweep[col]))
    return (
        f"Slopes per layer (mean over seeds): {slopes}. The drift falls with the learning rate wherever the slope "
        "is positive; a fixed gradient would give slope 2."
    )


def adamw_key_bias_steps(runs: SuiteRuns) -> tuple[float, float]:
    """AdamW's key-bias step share (:func:`key_bias_step`), aligned and independent, mean over seeds."""
    shares = np.array([key_bias_step(rec) for _, rec in sorted(runs.runs["adamw"].items())])
    return float(shares[:, 0].mean()), float(shares[:, 1].mean())


# ------------------------------------------------------------------------------ the claims table
def claim_rows(scales: Scales) -> pd.DataFrame:
    """Every claim at every scale (:func:`attnid.lm.claims.evaluate_claims`), one row each."""
    return pd.DataFrame([{"scale": name, **row} for name, runs in scales.items() for row in cl.evaluate_claims(runs)])


def table_claims(rows: pd.DataFrame) -> pd.DataFrame:
    """The claims table as the chapter shows it (its display formats attached)."""

    def shown(r) -> str:
        if r["value"] is None or pd.isna(r["value"]):
            return "—"
        rng = f" ({r['low']:.3g} to {r['high']:.3g})" if r["seeds"] > 1 else ""
        return f"{r['value']:.3g}{rng}"

    shown = pd.DataFrame(
        {
            "id": rows["id"],
            "scale": rows["scale"],
            "value (range over seeds)": rows.apply(shown, axis=1),
            "test": rows["op"] + " " + rows["threshold"].map("{:g}".format),
            "control": rows["control_value"],
            "seeds": rows["seeds"],
            "verdict": rows["verdict"] + rows["reason"].map(lambda s: f" ({s})" if s else ""),
        }
    )
    return with_formats(shown, seeds="{:.0f}", control="{:.3g}")


def claims_list() -> str:
    """Every claim as a Markdown bullet: its metric, test, threshold and why, and its control."""
    return "\n".join(
        f"- **{c.id}**: {c.claim}. *Metric*: {c.metric}; *test*: {c.op} {c.threshold:g}, because {c.why}."
        + (f" *Control*: {c.control_text}." if c.control_text else "")
        for c in cl.CLAIMS
    )


def depends_sentence(rows: pd.DataFrame) -> str:
    """What each verdict that depends on a setting depends on."""
    settings = rows.dropna(subset=["depends_on"])
    return "**What the verdicts depend on.** " + " ".join(
        f"*{r.id}* ({r.scale}): {r.depends_on}." for r in settings.itertuples()
    )


def facts(scales: Scales) -> dict[str, object]:
    """The numbers the chapter's summary glues, from the rerun (the last scale): its title and seeds, mean ρ of
    plain SGD and of AdamW (and AdamW's against the isotropic share), the law's sentence and AdamW's key-bias
    step share (aligned and independent)."""
    name, runs = list(scales.items())[-1]
    rho = rho_rows({name: runs}).set_index("case")
    coherent, walk = adamw_key_bias_steps(runs)
    return {
        "rerun_label": runs.label(),
        "n_seeds": len(runs.seeds(MAIN)),
        "rho_sgd": float(rho.loc["sgd", "mean_rho"]),
        "rho_adamw": float(rho.loc["adamw", "mean_rho"]),
        "rho_adamw_iso": float(rho.loc["adamw", "mean_rho"] / rho.loc["adamw", "isotropic"]),
        "wd_sentence": law_sentence(table_wd_law({name: runs}), name),
        "kb_coherent": coherent,
        "kb_walk": walk,
    }


def disagreements(rows: pd.DataFrame) -> str:
    """Where the records go against the claims: the decided rows reading ``no``, the undecided rows whose seeds all
    lie against it, the rows whose seeds split, the pending ones, and how many undecided rows lean its way."""
    undecided = rows["verdict"] == "inconclusive"

    def listed(part: pd.DataFrame, seeds: bool = False) -> str:
        return "; ".join(
            f"{r.id} ({r.scale}" + (f", {r.seeds} seed{'s' * (r.seeds > 1)})" if seeds else ")")
            for r in part.itertuples()
        )

    no = rows[rows["verdict"] == "no"]
    parts = [
        "Read **no**: " + ("; ".join(f"{r.claim} ({r.scale})" for r in no.itertuples()) or "none"),
        "Undecided, every seed against the paper: "
        + (listed(rows[undecided & (rows["side"] == "against the paper")], True) or "none"),
        "Seeds split: " + (listed(rows[undecided & (rows["side"] == "split")]) or "none"),
        "Pending: " + (listed(rows[rows["verdict"] == "pending"]) or "none"),
    ]
    leaning = int((undecided & (rows["side"] == "with the paper")).sum())
    return ". ".join(parts) + f". The other {leaning} undecided rows have every seed on the paper's side."
