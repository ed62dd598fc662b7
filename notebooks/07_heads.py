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
from myst_nb import glue

from attnid.chapters import heads as ch
from attnid.chapters import md
from attnid.lm.launch import train_suites
from attnid.lm.profiles import SUITES, check_profile
from attnid.plotting import set_style, table

check_profile(profile)
set_style()
train_suites(
    profile, ch.READS, device
)  # the runs this chapter reads that are not finished (the book trained them)
runs = ch.load(profile)  # reads chapter 6's runs and the head-count sweep
n_seeds = len(SUITES["heads"].seeds[profile])
rows = ch.sweep_rows(runs)  # one row per run of the sweep
summary = ch.table_sweep(rows)  # one row per head count
for name, value in ch.facts(runs, rows, summary).items():
    glue(name, value, display=False)
md(ch.intro_sentence(runs))

# %% [markdown]
# ## Importance, ρ and effective rank, head by head
#
# Next to the importance grid: the mean unidentified-step fraction $\rho$ of each head over AdamW
# training (chapter 6) and the effective rank of each head's final QK product (the exponential of the
# entropy of its normalised singular values; at most $D$, here of the bias-augmented product).

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-head-grids", "caption": "The chapter-6 AdamW run of this build (profile stated above), per head (layers × heads): loss increase when the head alone is removed, mean ρ over AdamW training, and effective rank of the final QK product."}}
fig = ch.fig_head_grids(runs)

# %% [markdown]
# ## Pruning
#
# Heads are removed cumulatively, least important first, and the validation loss is measured after each
# removal ({numref}`fig-pruning`).

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-pruning", "caption": "The chapter-6 AdamW run of this build (profile stated above): validation loss against the fraction of heads removed (least important first), with the 1 % and 5 % tolerance bands of the unpruned loss."}}
fig = ch.fig_pruning(runs)

# %% tags=["hide-input"]
md(ch.pruning_sentence(runs))

# %% [markdown]
# ## More heads at the same width
#
# We train the same model with $H \in \{1, 2, 4, 8, 16\}$ heads at fixed $E$ ($D = E/H$), same data,
# steps and seeds, with AdamW. The attention layers all have $4E^2$ weights; only the split changes, and
# with it the identified fraction $1 - 1/(2H)$. The control keeps $H = 4$ but shrinks the heads to
# $D = C = 8 < E/H$: fewer weights and an identified fraction $1 - D/(2E)$ (stated below for this
# profile's $E$).

# %% tags=["hide-input"]
table(summary.drop(columns="case"))

# %% [markdown]
# ### Does AdamW's unidentified share follow $1/(2H)$?
#
# The paper's thesis is that more heads leave a smaller share of the attention weights unidentified. If
# AdamW's updates were isotropic, their mean $\rho$ would fall like that share, $D/(2(E+1)) \approx 1/(2H)$.
# {numref}`fig-rho-vs-h` compares the two.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-rho-vs-h", "caption": "Head-count sweep of this build (profile in the title): AdamW's mean ρ over training against the number of heads at fixed width (markers: seeds), with the isotropic share D/(2(E+1)) ≈ 1/(2H)."}}
fig = ch.fig_rho_vs_h(rows, summary, profile)

# %% tags=["hide-input"]
md(ch.rho_slope_sentence(summary))

# %% tags=["hide-input"]
md(ch.correlation_sentence(rows))

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-head-sweep", "caption": "Head-count sweep of this build (profile in the title): final validation loss against the number of heads at fixed width (mean and range over seeds), with the identified fraction 1 − 1/(2H) on the right axis; the square is the control with H = 4 and D = 8."}}
fig = ch.fig_head_sweep(summary, profile, n_seeds)

# %% tags=["hide-input"]
md(ch.loss_sentence(summary, n_seeds))

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
