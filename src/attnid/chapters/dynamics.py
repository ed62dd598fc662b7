"""Chapter 6 (the paper's §5, training dynamics): the runs it reads at each scale, the loss and ρ curves, ρ per
optimizer and the float32 floor, from run records (:mod:`attnid.lm.claims`, :mod:`attnid.lm.analysis`). Weight
decay, the law, β, τ and the biases are in :mod:`attnid.chapters.decay`; the QK spectra and the learning-rate sweep in
:mod:`attnid.chapters.sweep`; the claims table in :mod:`attnid.chapters.verdicts`; the scales side by side in
:mod:`attnid.chapters.ladder`.

``scales`` maps a short label (``"paper scale"``, ``"cpu rerun"``) to the :class:`~attnid.lm.analysis.SuiteRuns`
of that scale, the paper scale first.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..lm import analysis as an
from ..lm import claims as cl
from ..lm import records
from ..lm.analysis import SuiteRuns
from ..lm.metrics import Key
from ..lm.profiles import LR_SWEEP, OPTIMIZER_CASES
from . import CASE_LABELS, PAPER_CMD, read_suite, with_formats

Scales = dict[str, SuiteRuns]
READS = ("dynamics",)  # the suites whose records chapter 6 reads (the book's cache re-executes it when they change)
MAIN = ("sgd", "sgd_wd", "adamw")  # the optimizer cases every comparison reads


# ------------------------------------------------------------------------------ the runs


def load_scales(profile: str) -> Scales:
    """The chapter's scales, read from the records (nothing is trained here): the committed records of the paper and
    mid profiles (when this build reads another profile and they hold the main cases), then this build's rerun of
    ``profile`` (:func:`attnid.chapters.read_suite`; every record must hold the float64 ρ)."""
    rerun = read_suite(profile, "dynamics", current=lambda rec: an.rho_key(rec) == Key.RHO)
    scales = {}
    for committed in records.COMMITTED_PROFILES:  # read beside this build's rerun
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
                    "precision": str(runs.first(case).summary.get("precision", "fp32")),
                    LATE_F32: an.over_seeds(runs, case, an.late_ratio)["mean"],
                    LATE_F64: an.over_seeds(runs, case, lambda r: an.late_ratio(r, Key.RHO))["mean"] if exact else None,
                }
            )
    return with_formats(pd.DataFrame(rows), seeds="{:.0f}")


def late_sentence(late: pd.DataFrame, runs: SuiteRuns) -> str:
    """Which optimizers' float32-difference ρ rises at the end of training (the claim ``late_spike_sgd``'s
    threshold), and the floor across the SGD sweep of the rerun ``runs``."""
    claim = next(c for c in cl.CLAIMS if c.id == "late_spike_sgd")
    bf = ~late["precision"].isin(cl.BIAS_PRECISIONS)  # bf16 records: their floor is not float32's
    read = late[~bf]
    up = read[[claim.holds(v) for v in read[LATE_F32]]]
    rest = read.loc[~read.index.isin(up.index), LATE_F32]
    rising = ", ".join(f"{CASE_LABELS[r['case']]} ({r['scale']}, {r[LATE_F32]:.1f}×)" for _, r in up.iterrows())
    apart = sorted(set(late.loc[bf, "scale"]))
    lrs, floor, exact = floor_by_lr(runs)
    unread = (
        f" (the {' and '.join(apart)} records, trained at bf16, are not read here: their floor is bf16's own rounding, "
        "far above float32's)"
        if apart
        else ""
    )
    ratio = floor[0]["mean"] / floor[-1]["mean"]
    return (
        f"Over the last tenth of training against the middle, the float32-difference ρ rises by more than "
        f"{claim.threshold:g}× for {rising or 'no optimizer'}; for the others it stays between {rest.min():.2f}× "
        f"and {rest.max():.2f}×{unread}. Across the sweep the floor is {ratio:.1f}× higher at η = {lrs[0]} than at "
        f"η = {lrs[-1]}, while the float64 update stays at or below {max(v['max'] for v in exact):.2g}. So a spike "
        "of ρ at the end of training (the paper's §5.3) is the rounding floor of plain SGD's shrinking steps, where it "
        "appears at all; AdamW's normalised steps do not shrink with the gradient, and its float32 difference shows "
        "none."
    )
