"""Chapter 7 (heads under the microscope): head importance, pruning and the head-count sweep at fixed width,
from the run records' head analyses (:mod:`attnid.lm.ablation`) and ρ (:mod:`attnid.lm.analysis`).

The chapter reads two suites: chapter 6's ``dynamics`` (its AdamW run of the lowest seed carries the head
analysis) and ``heads`` (the sweep over H at fixed E, with a control of smaller heads).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..counting import count
from ..lm import analysis as an
from ..lm.ablation import PRUNE_TOLERANCES, prunable
from ..lm.analysis import SuiteRuns
from ..lm.profiles import HEAD_COUNTS, HEADS_CONTROL, SUITES, make_config
from ..lm.records import Record
from . import PAPER_CMD, read_suite, with_formats

READS = ("dynamics", "heads")  # the suites whose records chapter 7 reads (the book's cache watches them)


@dataclass
class HeadRuns:
    """What chapter 7 reads: the AdamW record with a head analysis, the head-count sweep, and whether the
    paper-scale records hold a head analysis (``paper_heads``: ``"here"``, ``"pending"`` or ``"available"``)."""

    profile: str
    adamw: Record
    sweep: SuiteRuns
    paper_heads: str


def load(profile: str) -> HeadRuns:
    """Chapter 6's runs and the head-count sweep at ``profile``, read from the records (nothing is trained here;
    :func:`attnid.chapters.read_suite`); every record must hold a head analysis."""

    def analysed(rec: Record) -> bool:
        return rec.heads is not None

    dynamics = read_suite(profile, "dynamics", current=analysed)
    sweep = read_suite(profile, "heads", every_seed=True, current=analysed)
    if profile == "paper":
        paper = "here"
    else:
        committed = an.load_suite("paper", "dynamics")
        done = "adamw" in committed and committed.first("adamw").heads is not None
        paper = "available" if done else "pending"
    return HeadRuns(profile, dynamics.first("adamw"), sweep, paper)


def intro_sentence(h: HeadRuns) -> str:
    """The model whose heads are analysed, and whether the paper scale has a head analysis."""
    heads = h.adamw.heads
    assert heads is not None
    L, H = np.shape(heads["importance"])
    paper = {
        "here": "in this build's records.",
        "pending": f"pending (the paper-scale records predate the head analysis; `{PAPER_CMD}` on a GPU makes it).",
        "available": "available.",
    }[h.paper_heads]
    return (
        f"AdamW model of chapter 6 ({h.profile} profile, seed {h.adamw.summary['seed']}): {L} layers × {H} heads, "
        f"validation loss {heads['baseline']:.4f} on {heads['n_batches']} fixed batches. Head analysis at paper "
        f"scale: {paper}"
    )


# ------------------------------------------------------------------------------ one model's heads
def fig_head_grids(h: HeadRuns):
    """Per head of the AdamW model (layers × heads): importance (Δ validation loss when removed alone), mean ρ
    over training and the effective rank of the final QK product, each value written in its cell."""
    import matplotlib.pyplot as plt

    from ..plotting import panels

    assert h.adamw.heads is not None
    importance = np.array(h.adamw.heads["importance"])
    L, H = importance.shape
    D = make_config(h.profile, "adamw").gpt_config().head_dim
    fig, axes = panels(3, height=1.6 + 0.6 * L)
    grids = (
        (importance, "importance (Δ val loss)", "magma", "{:.3f}"),
        (an.head_rho(h.adamw), "mean ρ (AdamW)", "viridis", "{:.3f}"),
        (an.final_effective_rank(h.adamw), f"QK effective rank (D = {D})", "cividis", "{:.1f}"),
    )
    for ax, (grid, title, cmap, fmt) in zip(axes.flat, grids):
        im = ax.imshow(grid, cmap=cmap, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, fmt.format(v), ha="center", va="center", color="w" if v < grid.mean() else "k", fontsize=9.5)
        ax.set_xticks(range(H), [f"h{j + 1}" for j in range(H)])
        ax.set_yticks(range(L), [f"layer {i + 1}" for i in range(L)])
        ax.set_title(title)
        ax.grid(False)
        fig.colorbar(im, ax=ax, shrink=0.8)
    plt.show()
    return fig


def prunable_fractions(h: HeadRuns) -> dict[float, float]:
    """Per tolerance of :data:`attnid.lm.ablation.PRUNE_TOLERANCES`: the largest fraction of heads removed
    (least important first) with the validation loss within that tolerance."""
    assert h.adamw.heads is not None
    return {tol: prunable(h.adamw.heads, tol) for tol in PRUNE_TOLERANCES}


def fig_pruning(h: HeadRuns):
    """Validation loss against the fraction of heads removed, least important first, with each tolerance's
    band and the fraction it allows."""
    import matplotlib.pyplot as plt

    heads = h.adamw.heads
    assert heads is not None
    curve, baseline = heads["pruning_curve"], heads["baseline"]
    fig, ax = plt.subplots()
    ax.plot([c["fraction"] for c in curve], [c["loss"] for c in curve], "o-", label="validation loss")
    for (tol, f), c in zip(prunable_fractions(h).items(), ("C2", "C1", "C4")):
        label = f"+{tol:.0%}: up to {f:.0%} of heads prunable"
        ax.axhline(baseline * (1 + tol), color=c, ls="--", lw=1, label=label)
        ax.axvline(f, color=c, ls=":", lw=1)
    n = np.size(heads["importance"])
    ax.set(xlabel="fraction of heads removed", ylabel="validation loss (nats per character)")
    ax.set_title(f"Pruning the {n} heads of the AdamW model")
    ax.legend()
    plt.show()
    return fig


def pruning_sentence(h: HeadRuns) -> str:
    """The fraction of heads prunable within each tolerance."""
    within = "; ".join(f"within {tol:.0%}: {f:.0%} of heads" for tol, f in prunable_fractions(h).items())
    return f"Prunable: {within}."


# ------------------------------------------------------------------------------ the head-count sweep
def sweep_rows(h: HeadRuns) -> pd.DataFrame:
    """One row per case and seed of the sweep: H, D, validation loss, attention weights per layer and their
    identified fraction (the closed form of :mod:`attnid.counting`, without biases as in chapter 2), mean ρ and
    the isotropic share, the importance–ρ correlation over heads (overall and within layers) and the mean QK
    effective rank."""
    rows = []
    for case in SUITES["heads"].cases:
        for s, rec in sorted(h.sweep.runs[case].items()):
            cfg = make_config(h.profile, case, seed=s)
            arch = cfg.gpt_config().attention_config().with_(bias="none")
            assert rec.heads is not None  # load() checks every record has its head analysis
            rho, imp = an.head_rho(rec), np.array(rec.heads["importance"])
            many = cfg.n_head > 1
            rows.append(
                {
                    "case": case,
                    "H": cfg.n_head,
                    "D": arch.D,
                    "seed": s,
                    "val loss": rec.summary["final_val_loss"],
                    "weights / layer": count(arch).total_params,
                    "identified fraction": count(arch).identified_fraction,
                    "mean ρ": float(rho.mean()),
                    "isotropic": an.isotropic_rho(rec.config),
                    "corr": float(np.corrcoef(imp.ravel(), rho.ravel())[0, 1]) if many else np.nan,
                    "corr within layers": an.corr_within_layers(imp, rho) if many else np.nan,
                    "QK effective rank": float(an.final_effective_rank(rec).mean()),
                    "heads": imp.size,
                }
            )
    return pd.DataFrame(rows)


def table_sweep(rows: pd.DataFrame) -> pd.DataFrame:
    """Per case of the sweep (over seeds): validation loss (mean, min, max), weights per layer, identified
    fraction, AdamW's mean ρ, the isotropic share, their ratio and the QK effective rank."""
    agg = {
        "val loss, nats/char (mean)": ("val loss", "mean"),
        "val loss, nats/char (min)": ("val loss", "min"),
        "val loss, nats/char (max)": ("val loss", "max"),
        "weights / layer": ("weights / layer", "first"),
        "identified fraction": ("identified fraction", "first"),
        "mean ρ (AdamW)": ("mean ρ", "mean"),
        "isotropic D/(2(E+1))": ("isotropic", "first"),
        "QK effective rank": ("QK effective rank", "mean"),
    }
    out = rows.groupby(["case", "H", "D"], sort=False).agg(**agg).reset_index()
    out["ρ / isotropic"] = out["mean ρ (AdamW)"] / out["isotropic D/(2(E+1))"]
    f4 = "{:.4f}"
    four = [*list(agg)[:3], "identified fraction", "mean ρ (AdamW)", "isotropic D/(2(E+1))"]
    return with_formats(out, **dict.fromkeys(four, f4), **{"QK effective rank": "{:.2f}", "ρ / isotropic": "{:.2f}"})


def _main(summary: pd.DataFrame) -> pd.DataFrame:
    return summary[summary["case"] != HEADS_CONTROL]


def fig_rho_vs_h(rows: pd.DataFrame, summary: pd.DataFrame, profile: str):
    """AdamW's mean ρ against H at fixed width (each seed, and the mean) with the isotropic share (log–log)."""
    import matplotlib.pyplot as plt

    main, each = _main(summary), _main(rows)
    fig, ax = plt.subplots()
    ax.loglog(each["H"], each["mean ρ"], "o", alpha=0.6, label="AdamW mean ρ (each seed)")
    ax.loglog(main["H"], main["mean ρ (AdamW)"], "-", color="C0", label="mean over seeds")
    ax.loglog(main["H"], main["isotropic D/(2(E+1))"], "k--", label="isotropic D/(2(E+1))")
    ax.set_xticks(list(HEAD_COUNTS), [str(h) for h in HEAD_COUNTS])
    ax.set(xlabel="heads H (D = E/H)", ylabel="mean ρ", title=f"Unidentified share of AdamW's steps ({profile})")
    ax.legend()
    plt.show()
    return fig


def rho_slope_sentence(summary: pd.DataFrame) -> str:
    """AdamW's mean ρ against the isotropic share at the smallest and largest H, and its log–log slope
    (:func:`attnid.lm.analysis.rho_slope_reading`)."""
    main = _main(summary)
    ratio = main.set_index("H")["ρ / isotropic"]
    slope = np.polyfit(np.log(main["H"]), np.log(main["mean ρ (AdamW)"]), 1)[0]
    reading = {
        "slower": "It falls more slowly than 1/(2H).",
        "as fast": "It falls about as fast as 1/(2H).",
        "faster": "It falls faster than 1/(2H).",
    }[an.rho_slope_reading(slope)]
    return (
        f"AdamW's mean ρ is {ratio.iloc[0]:.2f} of the isotropic share at H = {ratio.index[0]} and "
        f"{ratio.iloc[-1]:.2f} of it at H = {ratio.index[-1]}; its log–log slope against H is {slope:.2f} (the "
        f"isotropic share has slope −1). {reading}"
    )


def correlation_sentence(rows: pd.DataFrame) -> str:
    """The importance–ρ correlation of every run with more than one head, its sign over runs
    (:func:`attnid.lm.analysis.sign_reading`) and what is left of it within layers."""
    corr = rows.dropna(subset=["corr"])
    each = "; ".join(
        f"H = {r.H}{f' (D = {r.D})' if r.case == HEADS_CONTROL else ''}, seed {r.seed}: {r.corr:+.2f} (n = {r.heads})"
        for r in corr.itertuples()
    )
    c, w = corr["corr"], corr["corr within layers"]
    n_within = int((w > 0).sum())
    layer_effect = "not only a layer effect" if n_within == len(corr) else "partly a layer effect"
    return (
        f"Correlation across heads between importance and mean ρ, per run (n = number of heads): {each}. Over "
        f"these {len(corr)} runs it ranges from {c.min():+.2f} to {c.max():+.2f}, and it is positive in "
        f"{int((c > 0).sum())} of them: it is {an.sign_reading(c)}. Even a sign that repeats would be a pattern, "
        "not yet a cause: both numbers are taken on the same heads of one model, and both differ systematically "
        "between layers (depth changes the size of a head's updates and its share of the residual stream), so a "
        "layer effect alone could make them agree. With each layer's mean removed from both, the correlation "
        f"ranges from {w.min():+.2f} to {w.max():+.2f}, positive in {n_within} of {len(corr)} runs, so the "
        f"pattern is {layer_effect}. A head's weight norm and the size of its steps under Adam's normalisation "
        "are further confounds that these records do not separate."
    )


def fig_head_sweep(summary: pd.DataFrame, profile: str, n_seeds: int):
    """Final validation loss against H at fixed width (mean, bars: range over seeds) and the control, with
    the identified fraction 1 − 1/(2H) on the right axis."""
    import matplotlib.pyplot as plt

    m = "val loss, nats/char (mean)"

    def err(df):
        return [df[m] - df["val loss, nats/char (min)"], df["val loss, nats/char (max)"] - df[m]]

    main, ctrl = _main(summary), summary[summary["case"] == HEADS_CONTROL]
    fig, ax = plt.subplots()
    ax.errorbar(main["H"], main[m], yerr=err(main), fmt="o-", capsize=4, label=f"D = E/H ({n_seeds} seed(s))")
    label = f"control: H = {int(ctrl['H'].iloc[0])}, D = {int(ctrl['D'].iloc[0])}"
    ax.errorbar(ctrl["H"], ctrl[m], yerr=err(ctrl), fmt="s", color="C3", capsize=4, ms=8, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(HEAD_COUNTS), [str(h) for h in HEAD_COUNTS])
    ax.set(xlabel="heads H", ylabel="final validation loss (nats per character)")
    ax.set_title(f"Head count at fixed width ({profile})")
    ax2 = ax.twinx()
    ax2.plot(main["H"], main["identified fraction"], "d--", color="0.4", label="identified fraction 1 − 1/(2H)")
    ax2.set_ylabel("identified fraction of attention weights")
    ax2.grid(False)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper center")
    plt.show()
    return fig


def loss_sentence(summary: pd.DataFrame, n_seeds: int) -> str:
    """The loss at H = 1 against the best H, set against the seed-to-seed range
    (:func:`attnid.lm.analysis.against_seed_noise`), and the control against H = 4 at the same width."""
    m = "val loss, nats/char (mean)"
    main, ctrl = _main(summary), summary[summary["case"] == HEADS_CONTROL].iloc[0]
    by_h = main.set_index("H")[m]
    spread = float((main["val loss, nats/char (max)"] - main["val loss, nats/char (min)"]).max())
    gain = by_h.loc[1] - by_h.min()
    noise = {
        "no estimate": "one seed gives no noise estimate, so no conclusion.",
        "within": "within seed noise.",
        "beyond": "larger than the seed noise.",
    }[an.against_seed_noise(gain, spread, n_seeds)]
    same = [
        int(h) for h, f in zip(main["H"], main["identified fraction"]) if np.isclose(f, ctrl["identified fraction"])
    ]
    match = f", that of H = {same[0]}" if same else ", which no head count of the sweep has"
    four = main.set_index("H").loc[int(ctrl["H"])]
    return (
        f"Validation loss: H = 1 → {by_h.loc[1]:.4f}, best at H = {by_h.idxmin()} ({by_h.min():.4f}), a difference "
        f"of {gain:.4f} against a largest seed-to-seed range of {spread:.4f} over {n_seeds} seed(s): {noise} "
        f"Control (H = {int(ctrl['H'])}, D = {int(ctrl['D'])}): identified fraction "
        f"{ctrl['identified fraction']:.4f}{match}; validation loss {ctrl[m]:.4f} with "
        f"{int(ctrl['weights / layer']):,} weights per layer, against {four[m]:.4f} with "
        f"{int(four['weights / layer']):,} for H = {int(ctrl['H'])}, D = {int(four['D'])}."
    )


def facts(h: HeadRuns, rows: pd.DataFrame, summary: pd.DataFrame) -> dict[str, object]:
    """The numbers the chapter glues: the share of heads prunable within 5 %, AdamW's ρ against the isotropic
    share at the smallest and largest H, and the sign of the importance–ρ correlation."""
    main = _main(summary)
    return {
        "prunable_5": float(prunable_fractions(h)[0.05]),
        "rho_h1": float(main["ρ / isotropic"].iloc[0]),
        "rho_hmax": float(main["ρ / isotropic"].iloc[-1]),
        "corr_sign": an.sign_reading(rows.dropna(subset=["corr"])["corr"]),
    }
