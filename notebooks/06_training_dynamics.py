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
# # Training dynamics on tiny Shakespeare
#
# The earlier chapters are about the geometry of a fixed layer. This one asks what training does with
# the unidentified directions (§5 of {cite:t}`morrow2026identification`). We train a nanoGPT-style
# character model {cite:p}`karpathy2022nanogpt` on tiny Shakespeare {cite:p}`karpathy2015charrnn` with
# plain SGD, SGD with weight decay, AdamW, and AdamW with periodic rebalancing, plus an SGD
# learning-rate sweep, each with several seeds, and record every 10 steps how much of each update moves
# along the symmetry.
#
# **What to expect.** A loss that sees $W_Q, W_K$ only through $W_K^\top W_Q$ has a gradient orthogonal to
# the symmetry directions $(S W_Q, -S^\top W_K)$, so gradient *flow* conserves
# $\beta = W_Q W_Q^\top - W_K W_K^\top$ {cite:p}`du2018balanced,kunin2021neural`. With biases the
# symmetry acts on the augmented matrices $[W_Q \mid b_Q]$, $[W_K \mid b_K]$, so the metrics below use
# those. The share of an update $(A, B)$ lying in the symmetry directions is
#
# $$
# \rho = \frac{\|(S W_Q,\,-S^\top W_K)\|_F^2}{\|(A, B)\|_F^2},\qquad S G_Q + G_K S = A W_Q^\top - W_K B^\top ,
# $$ (eq-rho)
#
# with $G_Q = W_Q W_Q^\top$, $G_K = W_K W_K^\top$. The Sylvester equation has exactly one solution when
# no eigenvalue of $G_Q$ plus one of $G_K$ is zero: both are positive semi-definite, so it suffices that
# they are not both singular. $\rho$ is zero for a plain gradient step, $D/(2E')$ on average for an
# isotropic random step of the $D \times E'$ matrices ($1/(2H)$ without biases, $E' = E$; with the bias
# column $E' = E + 1$), and one for a step along the symmetry.
#
# **How ρ is measured.** The update is the optimizer's own step, computed in float64 from its state
# (for SGD $-\eta(g + \lambda W)$, for AdamW $-\eta\lambda W - \eta\,\hat m/(\sqrt{\hat v} + \varepsilon)$),
# not the difference of two float32 weight tensors: that difference carries the rounding of the new
# weights, a floor that grows as the steps shrink. Both are recorded (`rho` and `rho_diff`) so that the
# floor can be seen below. Every number of this chapter comes from `attnid.lm.analysis`, which
# reads the run records; `attnid claims --profile cpu` prints the table at the end of the chapter from
# the same records.
#
# :::{admonition} In this chapter
# :class: tip
# In this build's rerun ({glue:text}`rerun_label`, {glue:text}`n_seeds` seeds per case), a plain
# SGD step puts a share {glue:text}`rho_sgd:.0e` of its energy into the unidentified directions: the
# float32 round-off of its gradient, so a gradient step does not move along the symmetry. An AdamW
# step puts {glue:text}`rho_adamw:.3f` there, {glue:text}`rho_adamw_iso:.2f` of what an isotropic
# random step would. Under SGD with weight decay, β follows the first-order law
# $\beta_T \approx \prod_t (1 - \eta_t\lambda)^2 \beta_0$ only where the second-order remainder is small:
# {glue:text}`wd_sentence`. The key bias has no gradient, yet AdamW moves it: Adam's division by
# $\sqrt{\hat v} + \varepsilon$ turns a round-off gradient into steps of
# {glue:text}`kb_coherent:.2%` to {glue:text}`kb_walk:.1%` of the learning rate per coordinate.
# Read at {glue:text}`ladder_scales` scales (this rerun and the committed records), {glue:text}`ladder_with`
# claims are on the side of whoever states them at every scale, {glue:text}`ladder_against` against it at every
# scale, {glue:text}`ladder_changes` change with scale and {glue:text}`ladder_partial` are decided at some scales
# only (each claim counted once, its same-loss reading with it; {ref}`sec-ladder`).
# :::

# %% tags=["parameters"]
# "smoke": seconds; "cpu": ~5 min (7 cases x 3 seeds, 2 cores); "mid": the committed mid records (what retraining
# them cost is in their summaries, summed under "Where the records come from"); "paper": nanoGPT scale
profile = "cpu"
seed = 0  # unused: each profile's seeds are fixed (attnid.lm.profiles.SUITES)
device = "auto"

# %% tags=["hide-input"]
from myst_nb import glue

from attnid.chapters import decay, labelled, ladder, md, sweep, verdicts
from attnid.chapters import dynamics as ch
from attnid.lm.launch import train_suites
from attnid.lm.profiles import check_profile
from attnid.plotting import set_style, table

check_profile(profile)
set_style()
train_suites(
    profile, ch.READS, device
)  # the runs this chapter reads that are not finished (the book trained them)
scales = ch.load_scales(profile)  # reads the records
title = ch.titles(scales)
live = list(scales)[-1]  # this build's rerun
rerun = scales[live]
for name, value in verdicts.facts(scales).items():
    glue(name, value, display=False)
md(ch.runs_sentence(scales))
table(labelled(ch.table_status(scales)))

# %% [markdown]
# The chapter reads up to three scales. The paper-scale records (6 layers, 6 heads, $E = 384$, context 256,
# batch 64, 5,000 steps; one seed) were made on one NVIDIA H200 with bf16 autocast, the seven runs trained as one
# stacked model (`attnid.lm.batched`), measured with the same float64 probe as the other scales. bf16 round-off
# leaves the key bias a gradient of a few percent of the query bias's, so those records decide neither bias
# theorem; the fp32 scales do. The mid records keep the paper's depth,
# heads and dropout at a width a CPU trains (6 layers, 6 heads, $E = 96$, context 64, batch 16, 2,000 steps;
# `attnid.lm.profiles`), measured with the float64 probe. Both are committed under `data/runs/`, each with its
# provenance in its `summary.json`; the rerun is executed by this build with the profile named in its
# parameters ({doc}`reproducibility`). Figures show the mean over seeds as a line and the range over
# seeds as a band.

# %% tags=["hide-input"]
md(ladder.records_sentence(scales))

# %% [markdown]
# ## Loss curves

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-loss", "caption": "Validation loss per optimizer, at each scale (mean over seeds, range shaded): the paper-scale records and this build's rerun (profile and size in the panel titles)."}}
fig = ch.fig_loss(scales, title)

# %% [markdown]
# ## How much of each step is unidentified?

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-rho", "caption": "Unidentified-step fraction ρ of each recorded update (mean over layers and heads; mean over seeds, range shaded) per optimizer, at each scale, with the isotropic reference D/(2(E+1)) of the bias-augmented matrices. Every scale: ρ of the float64 optimizer update."}}
fig = ch.fig_rho(scales, title)

# %% tags=["hide-input"]
rho_rows = ch.rho_rows(scales)
table(ch.table_rho(rho_rows))

# %% tags=["hide-input"]
md(ch.rho_sentence(rho_rows, rerun))

# %% [markdown]
# ## The float32 floor, and the paper's late spikes
#
# The difference of two float32 weight tensors carries the rounding of the new weights, about
# $2^{-24}\|W\|$ per coordinate, whatever the step. Its share of the step's energy grows as the step
# shrinks: as the learning rate decays along the cosine schedule, and at smaller learning rates.
# {numref}`fig-floor` shows plain SGD's $\rho$ both ways, with the learning rate.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-floor", "caption": "Plain SGD, this build's rerun (profile in the panel title; mean over seeds, range shaded): ρ of the float32 weight difference and of the float64 optimizer update (mean over heads), and the learning rate (right axis). Left: over training. Right: mean over training against the learning rate of the SGD sweep."}}
fig = ch.fig_floor(rerun, title[live])

# %% tags=["hide-input"]
late = ch.table_late(scales)
table(labelled(late))
md(ch.late_sentence(late, rerun))

# %% [markdown]
# The same comparison shows why the bias column matters. The symmetry acts on $[W \mid b]$; measured on the
# weights alone, the part of a step that moves the biases to follow $S$ is missing, and even a plain
# gradient step no longer looks orthogonal.

# %% tags=["hide-input"]
md(ch.weights_only_sentence(rho_rows, live))

# %% [markdown]
# ## Weight decay: a first-order law for β
#
# Write one SGD step with weight decay on the augmented matrices as $Q' = aQ - \eta A$,
# $K' = aK - \eta B$ with $a = 1 - \eta\lambda$ and the loss gradients $A = K G$, $B = Q G^\top$
# ($G$ the gradient with respect to $K^\top Q$). Then
#
# $$
# \beta' = a^2 \beta - a\eta\,(Q A^\top + A Q^\top - K B^\top - B K^\top) + \eta^2 (A A^\top - B B^\top),
# $$
#
# and $Q A^\top = Q G^\top K^\top = (K B^\top)^\top$, so the first-order term vanishes: the gradient
# conserves β up to the second-order term, and the decay multiplies it by $a^2$. Over a run,
#
# $$
# \beta_T = c_T\,\beta_0 + R_T,\qquad c_T = \prod_t (1 - \eta_t\lambda)^2 ,
# $$ (eq-wd-law)
#
# where $R_T$ collects the second-order terms, each shrunk by the decay of the steps after it. SGD
# applies the decay to the biases too, so this holds for the augmented matrices. The schedule and
# $\lambda$ fix $c_T$ before training; the law is tested on its own residual
# $\|\beta_T - c_T\beta_0\|_F / \|c_T\beta_0\|_F$ per layer, which the probe records
# (`beta_law_residual`). The drift $\|\beta_T - \beta_0\| / \|\beta_0\|$ compared with $1 - c_T$ would
# not do: once $c_T$ is small, a remainder orthogonal to $\beta_0$ enters that norm only squared, and a
# remainder twice as large as $c_T\beta_0$ moves it by under 1 % (`tests/test_claims.py` plants one). Records
# made before the probe kept the residual are tested on $\tau = \operatorname{tr}\beta$ per head, which the law
# scales the same way; the tables say which measure each scale was read on, and how the two compare where a
# record holds both.
#
# How large can $R_T$ be? Plain SGD with the same seed and schedule has no decay, so its drift is the
# remainder alone (of a run of its own: where each run draws its own dropout masks the two share their noise,
# but the committed paper-scale records shared one stream across their stack, so there they share the seed
# only); divided by $c_T$ it says how large the remainder is against what the law predicts. A
# layer is *tested* where that ratio, median over the seeds, is below one (`attnid.lm.claims.LAW_CUT`): there
# the first-order term $c_T\beta_0$ is the larger part of $\beta_T$, and the test reads whether the residual
# is below 1 % (`attnid.lm.claims.LAW_TOLERANCE`). The same layers are tested in every seed, and the claims
# table says which cut of the remainder would change the verdict. The remainder varies from seed to seed like
# any statistic of training, so the law needs three seeds, as the other training claims do.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-wd-law", "caption": "SGD + weight decay. Left: the law's residual ‖β_t − c_t β_0‖ / ‖c_t β_0‖ of every layer over training (seed 0 of this build's rerun) with the 1 % tolerance. Right: the final residual of every layer at every scale and seed against plain SGD's final drift divided by c_T (its second-order remainder relative to the prediction); dotted, residual = remainder; dash-dotted, the limit of the tested layers."}}
fig = decay.fig_wd_law(scales, title)

# %% tags=["hide-input"]
law_table = decay.table_wd_law(scales)
table(law_table)
md(decay.law_paragraph(law_table))
md(ladder.law_measure_sentence(ladder.scale_quantities(scales)))

# %% [markdown]
# The decay's own symmetry component solves $S G_Q + G_K S = -\eta\lambda\beta$: it is proportional to
# $\beta$ and vanishes at a balanced point. How much of the *whole* step that is depends on how large the
# gradient is beside it. {numref}`fig-wd` shows the early steps.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-wd", "caption": "SGD + weight decay, this build's rerun (profile in the panel title), over the first fifth of training, mean over seeds with the range shaded: ρ (mean over layers and heads) and the relative imbalance ‖β‖ / (‖G_Q‖ + ‖G_K‖)."}}
cut = decay.transient_cut(rerun)
fig = decay.fig_wd_transient(rerun, cut, title[live])

# %% tags=["hide-input"]
md(decay.transient_sentence(rerun, cut))

# %% [markdown]
# ## The conserved quantity: β and τ
#
# The drift $\|\beta_t - \beta_0\| / \|\beta_0\|$ compares with the *initial* imbalance, which is random.
# Two things make it misleading alone: a run whose $\beta$ shrinks to zero (weight decay) tends to a drift
# of one, and so does a rebalanced run right after each rebalance. The relative imbalance
# $\|\beta_t\| / (\|G_Q\| + \|G_K\|)$ beside it says how unbalanced the layer is now, on its own scale.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-beta", "caption": "This build's rerun (profile in the panel title), mean over layers, mean over seeds with the range shaded: left, drift of β = Q Qᵀ − K Kᵀ (augmented) from its initial value; right, relative imbalance ‖β‖ / (‖G_Q‖ + ‖G_K‖)."}}
fig = ch.fig_beta(rerun, title[live])

# %% tags=["hide-input"]
beta_table = decay.table_beta(scales)
table(labelled(beta_table))
md(decay.tau_sentence(beta_table))

# %% [markdown]
# Is plain SGD's drift larger in earlier layers, as the paper-scale record suggests? The test asks how rare the
# drift's order is among random orders of the layers: with 3 layers even the full order is 1 in 6, so it needs at
# least four; where this build's profile trains a 2-layer model, it also trains plain SGD with 4 layers
# (`sgd_deep`, same seeds) for this question alone. An order that is not rare either way is no evidence against
# the paper: the claim reads "no" only when later layers drift more by more than chance.

# %% tags=["hide-input"]
table(decay.table_drift_by_layer(scales))

# %% [markdown]
# ## The key bias: no gradient, yet AdamW moves it
#
# The key bias shifts every score of a query by the same amount, so the softmax ignores it and its
# gradient is zero: in float32 it is round-off (the table below gives its size). Biases sit in
# AdamW's no-decay group and start at zero, so weight decay never touches them. SGD multiplies the round-off gradient by the
# learning rate and the key bias stays where it started. Adam divides it by $\sqrt{\hat v} + \varepsilon$
# with $\varepsilon = 10^{-8}$, so a round-off gradient becomes a step of some fraction of the learning
# rate, in a direction set by the round-off. How large a fraction can be read from the key bias's final
# norm: if every step pointed the same way it would be $\|b_K\| / (\sqrt{D}\sum_t \eta_t)$, if the steps
# were independent $\|b_K\| / \sqrt{D \sum_t \eta_t^2}$ (`attnid.chapters.decay.key_bias_step`). This
# is an optimizer moving a parameter the loss does not see.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-bias", "caption": "This build's rerun (profile in the panel title), mean over seeds with the range shaded: left, median gradient norm per head of the query bias (solid) and key bias (dashed) per optimizer; right, norm of the key bias per head (median over heads)."}}
fig = ch.fig_bias(rerun, title[live])

# %% tags=["hide-input"]
bias_table = decay.table_bias(scales)
md(decay.key_bias_sentence(bias_table, rerun))
table(labelled(bias_table))
glue("bf16_kb", decay.bf16_key_bias_share(bias_table, scales), display=False)

# %% [markdown]
# ## QK spectra at the end
#
# The QK product $K^\top Q$ of a head has rank at most $D$. {numref}`fig-spectra` shows the singular values
# of every head of the first layer at the end of training, for each optimizer and scale (seed 0).

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-spectra", "caption": "Singular values of each head's QK product Kᵀ Q (augmented), layer 1, at the last evaluation, normalised by the largest; one line per head, one colour per optimizer (seed 0)."}}
fig = sweep.fig_spectra(scales, title)

# %% tags=["hide-input"]
table(sweep.table_spectra(scales))

# %% [markdown]
# ## Rebalancing
#
# Every few hundred steps the AdamW + rebalancing run replaces each head's $(Q, K)$ by
# $(SQ, S^{-\top}K)$ with $S$ chosen so that $\beta = 0$, the minimum-norm point of the orbit. The model's
# outputs cannot change, and the loss on a fixed batch before and after shows it. AdamW's moment estimates
# are not transformed, so afterwards the optimizer state refers to the old coordinates; whether that
# matters would need controls (moments transformed; state reset at the same steps), which this chapter
# does not run, so it makes no claim about it.

# %% tags=["hide-input"]
events = decay.table_rebalance(rerun)
md(decay.rebalance_sentence(events, rerun))
table(events)

# %% [markdown]
# ## The SGD learning-rate sweep
#
# A single SGD step moves $\beta$ by $\eta^2 (g_Q g_Q^\top - g_K g_K^\top)$, second order in the step
# (`tests/test_dynamics.py` checks it). Over a whole run the gradients themselves depend on the trajectory,
# so the final drift need not scale as $\eta^2$; {numref}`fig-sweep` measures it, and the table gives
# the slope of $\log(\text{drift})$ against $\log\eta$ per layer.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-sweep", "caption": "Final β drift per layer against the SGD learning rate (log–log; mean over seeds, bars: range), this build's rerun (profile in the title)."}}
fig = sweep.fig_sweep(rerun, title[live])

# %% tags=["hide-input"]
sweep_table = sweep.table_sweep(rerun)
md(sweep.sweep_sentence(sweep_table))
table(sweep_table)

# %% [markdown]
# ## The paper's §5, point by point
#
# Each row states one reading of the paper's experiments, the number that tests it, the threshold and
# why it was chosen, the control beside it, and the verdict at each scale:
# **yes** or **no** when every seed agrees, **inconclusive** when the seeds disagree or there are too
# few of them (a claim about training needs three; an exact law, one) or too few layers, **pending**
# when the records are missing. When a row has too few seeds, its reason says on which side of the
# threshold they lie. Every claim has a test that plants a violation in synthetic records and watches
# the verdict turn to **no** (`tests/test_claims.py`). The table is `attnid.lm.claims.evaluate_claims`,
# the same as `attnid claims --profile <profile> --json`.

# %% tags=["hide-input"]
claim_rows = verdicts.claim_rows(scales)
table(verdicts.table_claims(claim_rows))

# %% tags=["hide-input"]
md(verdicts.claims_list())
md(verdicts.depends_sentence(claim_rows))
md(verdicts.disagreements(claim_rows))

# %% [markdown]
# (sec-ladder)=
# ## The ladder of scales
#
# The same claims at every scale the chapter reads, from the smallest model to the largest: the verdict, the
# seeds it rests on and, where the seeds do not decide, the side they lie on. A row whose side is the same at
# every scale is a result that does not depend on scale within this range; a row that changes says at which
# scale it turns, and the mid records, with three seeds at the paper's depth, say which way the turn goes.

# %% tags=["hide-input"]
table(ladder.table_ladder(claim_rows, scales))
md(ladder.ladder_sentence(claim_rows, scales))
for name, value in ladder.ladder_facts(claim_rows, scales).items():
    glue(name, value, display=False)

# %% [markdown]
# Some of the numbers behind these rows have a natural dependence on scale: the isotropic share
# $D/(2(E+1))$ that $\rho$ is read against, the law's factor $c_T$ (set by the schedule and $\lambda$) and the
# remainder beside it, and how plain SGD's drift falls with depth. {numref}`fig-ladder` draws them against
# scale, so that a trend reads as a trend and not as three unrelated numbers.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-ladder", "caption": "Against scale (models ordered by size; layers × heads × E). Left: mean ρ of SGD + weight decay and AdamW (mean over seeds, each scale in the measure its records hold) with the isotropic share. Right: the weight-decay law's factor c_T, its largest residual over the tested layers and plain SGD's remainder / c_T there, with the 1 % tolerance. Bottom: plain SGD's final β drift per layer against relative depth, every seed."}}
fig = ladder.fig_ladder(scales)

# %% tags=["hide-input"]
table(ladder.scale_quantities(scales).drop(columns=["size"]))

# %% [markdown]
# ## What this chapter checked
#
# - A plain SGD step is orthogonal to the symmetry: its float64 ρ is float32 round-off of the gradient
#   here and below $10^{-12}$ in `tests/test_train.py`; the float32-difference ρ sits orders of
#   magnitude higher and rises as steps shrink.
# - The float64 update read from the optimizer state equals the applied float32 step to rounding
#   (`tests/test_train.py`), for SGD with weight decay and for AdamW.
# - Under SGD + weight decay β follows $c_T\beta_0$ to first order; the probe's residual of the law equals
#   the one computed from the weights (`tests/test_train.py`), and the paper-scale record's per-layer
#   residuals are checked in `tests/test_claims.py`.
# - Every claim's verdict, threshold and control live in `attnid.lm.claims`, and each is tested there
#   on records that satisfy it and on records with a planted violation (`tests/test_claims.py`).
# - bf16 autocast (the GPU default) keeps plain SGD's ρ below $10^{-4}$ (`tests/test_train.py`); its floor is
#   about $10^{-6}$ at smoke scale, against about $10^{-14}$ in float32. Its key-bias gradients are bf16's own
#   round-off, below $10^{-2}$ of the query bias's at smoke scale (`tests/test_train.py`) and
#   {glue:text}`bf16_kb`: above the $10^{-4}$ the bias theorems grant float32, so bf16 records decide neither.
