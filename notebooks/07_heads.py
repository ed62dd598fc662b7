# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Heads under the microscope
#
# Two popular claims about attention heads can be measured on the models of the previous chapter.
# First, that many heads are redundant and can be pruned after training {cite:p}`michel2019sixteen`.
# Second, the paper's thesis {cite:p}`morrow2026identification`: more heads help partly because a larger
# share of the attention weights is identified, $1 - 1/(2H)$ — with the paper's own caveat that
# identification is not the only mechanism at work.
#
# **Ablation.** A head is removed by deleting its term $W_O^h V_h P_h$ from the layer's sum (its output is
# zeroed before the output projection; the output bias stays). Its *importance* is the increase of the
# validation loss, on a fixed seeded set of batches, when it alone is removed. Every training run does
# this analysis on its own device when it finishes and stores it in its run record (`heads.json`), so
# this chapter reads records and never loads weights.
#
# :::{admonition} In this chapter
# :class: tip
# Within 5 % of the AdamW model's validation loss, {glue:text}`prunable_5:.0%` of its heads can be
# removed. Splitting the same width into more heads raises the identified fraction from 1/2 to
# $1 - 1/(2H)$, and AdamW's unidentified share of a step goes from {glue:text}`rho_h1:.2f` of its
# isotropic value at $H = 1$ to {glue:text}`rho_hmax:.2f` at $H = 16$ (this build's head-count
# sweep).
# :::

# %% tags=["parameters"]
profile = "cpu"
seed = 0
device = "auto"

# %% tags=["hide-input"]
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display
from myst_nb import glue

from attnid import count
from attnid.lm import analysis as an
from attnid.lm.ablation import PRUNE_TOLERANCES, prunable
from attnid.lm.launch import run_suite
from attnid.lm.profiles import (
    HEAD_COUNTS,
    HEADS_CONTROL,
    SUITES,
    check_profile,
    make_config,
    resolve_device,
)
from attnid.plotting import panels, set_style, table

check_profile(profile)
set_style()
dev = resolve_device(device)
PAPER_CMDS = (
    "`attnid experiments --profile paper --device cuda` and "
    "`attnid experiments --profile paper --suite heads --device cuda`"
)


def md(text: str) -> None:
    display(Markdown(text))


if profile != "paper" or dev.startswith("cuda"):
    run_suite(
        profile, "dynamics", device=device
    )  # chapter 6's runs: reused when finished
    run_suite(profile, "heads", device=device)
dynamics = an.load_suite(profile, "dynamics")
sweep_runs = an.load_suite(profile, "heads", seeds=list(SUITES["heads"].seeds[profile]))
n_seeds = len(SUITES["heads"].seeds[profile])
missing = [
    c for c in SUITES["heads"].cases if len(sweep_runs.runs.get(c, {})) < n_seeds
]
missing += [] if "adamw" in dynamics else ["adamw"]
if missing or dynamics.first("adamw").heads is None:
    raise an.RecordError(
        f"no {profile} records with a head analysis for "
        f"{', '.join(missing or ['adamw'])}: make "
        f"them with {PAPER_CMDS}"
    )
adamw = dynamics.first(
    "adamw"
)  # the chapter-6 run of the lowest seed: its record holds the head analysis
heads = adamw.heads
importance, baseline = np.array(heads["importance"]), heads["baseline"]
L, H = importance.shape
paper = an.load_suite("paper", "dynamics") if profile != "paper" else None
md(
    f"AdamW model of chapter 6 ({profile} profile, seed {adamw.summary['seed']}): {L} "
    f"layers × {H} "
    f"heads, validation loss {baseline:.4f} on {heads['n_batches']} fixed batches. "
    "Head analysis at "
    "paper scale: "
    + (
        "in this build's records."
        if profile == "paper"
        else "pending (the paper-scale records predate the head analysis; "
        "`attnid experiments --profile paper --device cuda` on a GPU makes it)."
        if "adamw" not in paper or paper.first("adamw").heads is None
        else "available."
    )
)

# %% [markdown]
# ## Importance, ρ and effective rank, head by head
#
# Next to the importance grid: the mean unidentified-step fraction $\rho$ of each head over AdamW
# training (chapter 6) and the effective rank of each head's final QK product (the exponential of the
# entropy of its normalised singular values; at most $D$, here of the bias-augmented product).

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-head-grids", "caption": "The chapter-6 AdamW run of this build (profile stated above), per head (layers × heads): loss increase when the head alone is removed, mean ρ over AdamW training, and effective rank of the final QK product."}}
rho = an.head_rho(adamw)  # (L, H)
erank = an.final_effective_rank(adamw)
D = make_config(profile, "adamw").gpt_config().head_dim
fig, axes = panels(3, height=1.6 + 0.6 * L)
for ax, grid, title, cmap, fmt in (
    (axes.flat[0], importance, "importance (Δ val loss)", "magma", "{:.3f}"),
    (axes.flat[1], rho, "mean ρ (AdamW)", "viridis", "{:.3f}"),
    (axes.flat[2], erank, f"QK effective rank (D = {D})", "cividis", "{:.1f}"),
):
    im = ax.imshow(grid, cmap=cmap, aspect="auto")
    for (i, j), v in np.ndenumerate(grid):
        ax.text(
            j,
            i,
            fmt.format(v),
            ha="center",
            va="center",
            color="w" if v < grid.mean() else "k",
            fontsize=9.5,
        )
    ax.set_xticks(range(H), [f"h{j + 1}" for j in range(H)])
    ax.set_yticks(range(L), [f"layer {i + 1}" for i in range(L)])
    ax.set_title(title)
    ax.grid(False)
    fig.colorbar(im, ax=ax, shrink=0.8)
plt.show()

# %% [markdown]
# ## Pruning
#
# Heads are removed cumulatively, least important first, and the validation loss is measured after each
# removal ({numref}`fig-pruning`).

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-pruning", "caption": "The chapter-6 AdamW run of this build (profile stated above): validation loss against the fraction of heads removed (least important first), with the 1 % and 5 % tolerance bands of the unpruned loss."}}
curve = heads["pruning_curve"]
fractions = {tol: prunable(heads, tol) for tol in PRUNE_TOLERANCES}
fig, ax = plt.subplots()
ax.plot(
    [c["fraction"] for c in curve],
    [c["loss"] for c in curve],
    "o-",
    label="validation loss",
)
for (tol, f), c in zip(fractions.items(), ("C2", "C1", "C4")):
    ax.axhline(
        baseline * (1 + tol),
        color=c,
        ls="--",
        lw=1,
        label=f"+{tol:.0%}: up to {f:.0%} of heads prunable",
    )
    ax.axvline(f, color=c, ls=":", lw=1)
ax.set(
    xlabel="fraction of heads removed",
    ylabel="validation loss (nats per character)",
    title=f"Pruning the {L * H} heads of the AdamW model",
)
ax.legend()
plt.show()

# %% tags=["hide-input"]
md(
    "Prunable: "
    + "; ".join(f"within {tol:.0%}: {f:.0%} of heads" for tol, f in fractions.items())
    + "."
)
glue("prunable_5", float(fractions[0.05]), display=False)

# %% [markdown]
# ## More heads at the same width
#
# We train the same model with $H \in \{1, 2, 4, 8, 16\}$ heads at fixed $E$ ($D = E/H$), same data,
# steps and seeds, with AdamW. The attention layers all have $4E^2$ weights; only the split changes, and
# with it the identified fraction $1 - 1/(2H)$. The control keeps $H = 4$ but shrinks the heads to
# $D = C = 8 < E/H$: fewer weights and an identified fraction $1 - D/(2E)$ (stated below for this
# profile's $E$).

# %% tags=["hide-input"]
seeds = SUITES["heads"].seeds[profile]
records = []
for case in SUITES["heads"].cases:
    for s in seeds:
        rec = sweep_runs.runs[case][s]
        cfg = make_config(profile, case, seed=s)
        arch = (
            cfg.gpt_config().attention_config().with_(bias="none")
        )  # the weights, as in chapter 2
        rho_heads = an.head_rho(rec)  # (L, H)
        imp = np.array(rec.heads["importance"])
        records.append(
            {
                "case": case,
                "H": cfg.n_head,
                "D": arch.D,
                "seed": s,
                "val loss": rec.summary["final_val_loss"],
                "weights / layer": count(arch).total_params,
                "identified fraction": count(arch).identified_fraction,
                "mean ρ": float(rho_heads.mean()),
                "isotropic": an.isotropic_rho(rec.config),
                "corr": float(np.corrcoef(imp.ravel(), rho_heads.ravel())[0, 1])
                if cfg.n_head > 1
                else np.nan,
                "corr within layers": an.corr_within_layers(imp, rho_heads)
                if cfg.n_head > 1
                else np.nan,
                "QK effective rank": float(an.final_effective_rank(rec).mean()),
            }
        )
sweep = pd.DataFrame(records)
summary = (
    sweep.groupby(["case", "H", "D"], sort=False)
    .agg(
        **{
            "val loss (mean)": ("val loss", "mean"),
            "val loss (min)": ("val loss", "min"),
            "val loss (max)": ("val loss", "max"),
            "weights / layer": ("weights / layer", "first"),
            "identified fraction": ("identified fraction", "first"),
            "mean ρ (AdamW)": ("mean ρ", "mean"),
            "isotropic D/(2(E+1))": ("isotropic", "first"),
            "QK effective rank": ("QK effective rank", "mean"),
        }
    )
    .reset_index()
)
summary["ρ / isotropic"] = summary["mean ρ (AdamW)"] / summary["isotropic D/(2(E+1))"]
main = summary[summary["case"] != HEADS_CONTROL]
glue("rho_h1", float(main["ρ / isotropic"].iloc[0]), display=False)
glue("rho_hmax", float(main["ρ / isotropic"].iloc[-1]), display=False)
loss_units = {
    f"val loss ({k})": f"val loss, nats/char ({k})" for k in ("mean", "min", "max")
}
table(
    summary.drop(columns="case").rename(columns=loss_units),
    formats={
        **{c: "{:.4f}" for c in loss_units.values()},
        "identified fraction": "{:.4f}",
        "mean ρ (AdamW)": "{:.4f}",
        "isotropic D/(2(E+1))": "{:.4f}",
        "QK effective rank": "{:.2f}",
        "ρ / isotropic": "{:.2f}",
    },
)

# %% [markdown]
# ### Does AdamW's unidentified share follow $1/(2H)$?
#
# The paper's thesis is that more heads leave a smaller share of the attention weights unidentified. If
# AdamW's updates were isotropic, their mean $\rho$ would fall like that share, $D/(2(E+1)) \approx 1/(2H)$.
# {numref}`fig-rho-vs-h` compares the two.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-rho-vs-h", "caption": "Head-count sweep of this build (profile in the title): AdamW's mean ρ over training against the number of heads at fixed width (markers: seeds), with the isotropic share D/(2(E+1)) ≈ 1/(2H)."}}
fig, ax = plt.subplots()
m = sweep[sweep["case"] != HEADS_CONTROL]
ax.loglog(m["H"], m["mean ρ"], "o", alpha=0.6, label="AdamW mean ρ (each seed)")
ax.loglog(main["H"], main["mean ρ (AdamW)"], "-", color="C0", label="mean over seeds")
ax.loglog(main["H"], main["isotropic D/(2(E+1))"], "k--", label="isotropic D/(2(E+1))")
ax.set_xticks(list(HEAD_COUNTS), [str(h) for h in HEAD_COUNTS])
ax.set(
    xlabel="heads H (D = E/H)",
    ylabel="mean ρ",
    title=f"Unidentified share of AdamW's steps ({profile})",
)
ax.legend()
plt.show()

# %% tags=["hide-input"]
ratio = main.set_index("H")["ρ / isotropic"]
slope = np.polyfit(np.log(main["H"]), np.log(main["mean ρ (AdamW)"]), 1)[0]
md(
    f"AdamW's mean ρ is {ratio.iloc[0]:.2f} of the isotropic share at H = "
    f"{ratio.index[0]} and "
    f"{ratio.iloc[-1]:.2f} of it at H = {ratio.index[-1]}; its log–log slope against H "
    f"is {slope:.2f} "
    f"(the isotropic share has slope −1). "
    + {
        "slower": "It falls more slowly than 1/(2H).",
        "as fast": "It falls about as fast as 1/(2H).",
        "faster": "It falls faster than 1/(2H).",
    }[an.rho_slope_reading(slope)]
)

# %% tags=["hide-input"]
corr = sweep.dropna(subset=["corr"])
n_within = int((corr["corr within layers"] > 0).sum())
glue("corr_sign", an.sign_reading(corr["corr"]), display=False)
md(
    "Correlation across heads between importance and mean ρ, per run (n = number of "
    "heads): "
    + "; ".join(
        f"H = {r.H}{'' if r.case != HEADS_CONTROL else f' (D = {r.D})'}, seed "
        f"{r.seed}: "
        f"{r.corr:+.2f} "
        f"(n = {r.H * adamw.config['n_layer']})"
        for r in corr.itertuples()
    )
    + ". "
    f"Over these {len(corr)} runs it ranges from {corr['corr'].min():+.2f} to "
    f"{corr['corr'].max():+.2f}, and it is positive in {int((corr['corr'] > 0).sum())} "
    f"of them: it is {an.sign_reading(corr['corr'])}. "
    "Even a sign that repeats would be a pattern, not yet a cause: both numbers are "
    "taken on the same heads of "
    "one model, and both differ systematically between layers (depth changes the size "
    "of a head's "
    "updates and its share of the residual stream), so a layer effect alone could make "
    "them agree. "
    "With each layer's mean removed from both, the correlation ranges from "
    f"{corr['corr within layers'].min():+.2f} to "
    f"{corr['corr within layers'].max():+.2f}, positive "
    f"in {n_within} of {len(corr)} runs"
    + (
        ", so the pattern is not only a layer effect. "
        if n_within == len(corr)
        else ", so part of the pattern is a layer effect. "
    )
    + "A head's weight norm and the size of its steps under Adam's normalisation are "
    "further "
    "confounds that these records do not separate."
)

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-head-sweep", "caption": "Head-count sweep of this build (profile in the title): final validation loss against the number of heads at fixed width (mean and range over seeds), with the identified fraction 1 − 1/(2H) on the right axis; the square is the control with H = 4 and D = 8."}}
fig, ax = plt.subplots()
err = [
    main["val loss (mean)"] - main["val loss (min)"],
    main["val loss (max)"] - main["val loss (mean)"],
]
ax.errorbar(
    main["H"],
    main["val loss (mean)"],
    yerr=err,
    fmt="o-",
    capsize=4,
    label=f"D = E/H ({len(seeds)} seed(s))",
)
ctrl = summary[summary["case"] == HEADS_CONTROL]
ax.errorbar(
    ctrl["H"],
    ctrl["val loss (mean)"],
    yerr=[
        ctrl["val loss (mean)"] - ctrl["val loss (min)"],
        ctrl["val loss (max)"] - ctrl["val loss (mean)"],
    ],
    fmt="s",
    color="C3",
    capsize=4,
    ms=8,
    label="control: H = 4, D = 8",
)
ax.set_xscale("log", base=2)
ax.set_xticks(list(HEAD_COUNTS), [str(h) for h in HEAD_COUNTS])
ax.set(
    xlabel="heads H",
    ylabel="final validation loss (nats per character)",
    title=f"Head count at fixed width ({profile})",
)
ax2 = ax.twinx()
ax2.plot(
    main["H"],
    main["identified fraction"],
    "d--",
    color="0.4",
    label="identified fraction 1 − 1/(2H)",
)
ax2.set_ylabel("identified fraction of attention weights")
ax2.grid(False)
h1, l1 = ax.get_legend_handles_labels()
h2, l2 = ax2.get_legend_handles_labels()
ax.legend(h1 + h2, l1 + l2, loc="upper center")
plt.show()

# %% tags=["hide-input"]
by_h = main.set_index("H")["val loss (mean)"]
spread = float((main["val loss (max)"] - main["val loss (min)"]).max())
gain = by_h.loc[1] - by_h.min()
md(
    f"Validation loss: H = 1 → {by_h.loc[1]:.4f}, best at H = {by_h.idxmin()} "
    f"({by_h.min():.4f}), a difference of "
    f"{gain:.4f} against a largest seed-to-seed range of {spread:.4f} over {len(seeds)}"
    " seed(s): "
    + {
        "no estimate": "one seed gives no noise estimate, so no conclusion.",
        "within": "within seed noise.",
        "beyond": "larger than the seed noise.",
    }[an.against_seed_noise(gain, spread, len(seeds))]
    + f" Control (H = 4, D = {int(ctrl['D'].iloc[0])}): identified fraction "
    f"{float(ctrl['identified fraction'].iloc[0]):.4f}"
    + (
        f", that of H = {same[0]}"
        if (
            same := [
                int(h)
                for h, f in zip(main["H"], main["identified fraction"])
                if np.isclose(f, ctrl["identified fraction"].iloc[0])
            ]
        )
        else ", which no head count of the sweep has"
    )
    + f"; validation loss {float(ctrl['val loss (mean)'].iloc[0]):.4f} with "
    f"{int(ctrl['weights / layer'].iloc[0]):,} weights per layer, against "
    f"{by_h.loc[4]:.4f} with "
    f"{int(main.set_index('H').loc[4, 'weights / layer']):,} for H = 4, D = "
    f"{int(main.set_index('H').loc[4, 'D'])}."
)

# %% [markdown]
# ## What the numbers support, and what they do not
#
# - **Pruning.** The fractions prunable within 1 % and 5 % stated above are what one trained model
#   allows; with few heads per layer a single removal is a large step. Claims of "most heads are
#   redundant" come from much larger models; here they are measured rather than assumed.
# - **Importance and identification.** The correlations stated above are each over the heads of one run,
#   a handful of numbers, {glue:text}`corr_sign`; the confounds named above (layer, weight norm, Adam's
#   per-coordinate step size) are not separated, so they are reported, not interpreted as a mechanism.
# - **Head count.** At fixed width the identified fraction rises from 1/2 to $1 - 1/(2H)$ for the largest
#   $H$, and the validation loss is shown against it, with the seed-to-seed range as the yardstick. The
#   control separates the two effects only partly: it has a higher identified fraction than $H = 4$ but
#   fewer weights, so a worse loss there is explained by capacity as easily as by identification. The
#   data do not isolate identification as the cause of any gain, which is the paper's own caveat.
#
# ## What this chapter checked
#
# - Masking no head reproduces the baseline loss exactly, and masking a head removes exactly its term of
#   the column-form layer in float64 (`tests/test_heads.py`).
# - The head sweep's identified fractions are the closed forms of `attnid.counting`, which chapter 2
#   checks against the Jacobian rank.
