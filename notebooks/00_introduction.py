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
# # Attention as parameter identification
#
# A statistician calls a parameter *identified* when different values of it produce different
# predictions. A neural-network layer whose weights can be changed without changing anything it
# computes carries parameters that no amount of data can pin down. {cite:t}`morrow2026identification`
# asks how much of a dot-product attention layer {cite:p}`vaswani2017attention` is of that kind,
# and answers: in a single head with a square query–key product, half of the query and key weights;
# spread over $H$ heads, only a share $1/(2H)$ of all attention weights.
#
# This book re-derives every claim of the paper, checks each one numerically, and regenerates every
# figure from code. It is built on a small Python package, `attnid`, which you can also point at
# your own attention layers.
#
# :::{admonition} This book in one figure
# :class: tip
#
# ```{glue:figure} headline
# :name: fig-headline
#
# Share of the attention weights that no data can identify, per layer, for the published
# architectures of chapters 4 and 9, latent attention included (closed form, which those chapters check
# against the Jacobian of the real Hugging Face modules). The line is the paper's $1/(2H)$ for plain
# multi-head attention; layers that coincide share a label.
# ```
#
# Across the {glue:text}`n_models` published architectures, {glue:text}`worst_share:.2%` (the
# most) to {glue:text}`best_share:.4%` (the least) of each attention layer's weights are
# unidentified; plain multi-head attention follows $1/(2H)$, and RoPE with grouped keys (GQA) takes
# the share far below it.
# :::
#
# ## What each chapter found
#
# Every number below is measured by the chapter it names, in this build.
#
# - {doc}`01_definitions`: the layer as the paper writes it (tokens as columns) is the same
#   function as PyTorch's and nanoGPT's attention, to
#   {glue:text}`01_definitions.ipynb::max_difference:.0e` in float64.
# - {doc}`02_invariances`: the two reparameterisations change the output by at most
#   {glue:text}`02_invariances.ipynb::max_change:.0e`, and the Jacobian rank gives the closed-form
#   count on all {glue:text}`02_invariances.ipynb::n_configs:d` configurations tested.
# - {doc}`03_biases`: the key bias's gradient is {glue:text}`03_biases.ipynb::key_bias_grad:.0e`
#   (zero) without RoPE and {glue:text}`03_biases.ipynb::key_bias_grad_rope:.2f` with it.
# - {doc}`04_rope_gqa`: in Llama-2-70B, RoPE with GQA leaves
#   {glue:text}`04_rope_gqa.ipynb::llama_qk:,` unidentified query–key dimensions per layer, not
#   the paper's 131,072; {glue:text}`04_rope_gqa.ipynb::n_verified:d` preset structures were
#   verified through the real `transformers` modules.
# - {doc}`05_equivalence`: a single head matching 12 heads is
#   {glue:text}`05_equivalence.ipynb::width_h12:.2f` times as wide, not the paper's 1.60.
# - {doc}`06_training_dynamics`: the unidentified share of an SGD step is
#   {glue:text}`06_training_dynamics.ipynb::rho_sgd:.0e` (round-off), of an AdamW step
#   {glue:text}`06_training_dynamics.ipynb::rho_adamw:.2f`.
# - {doc}`07_heads`: splitting the same width into more heads, AdamW's unidentified share of a
#   step is {glue:text}`07_heads.ipynb::rho_h1:.2f` of its isotropic value at $H = 1$ and
#   {glue:text}`07_heads.ipynb::rho_hmax:.2f` at $H = 16$.
# - {doc}`08_beyond_attention`: a whole GPT-2 small has
#   {glue:text}`08_beyond_attention.ipynb::gpt2_model:,` unidentified directions, not the
#   {glue:text}`08_beyond_attention.ipynb::gpt2_product:,` of a product of per-layer attention
#   groups; every whole-layer and whole-model audit of the real modules equals the closed form.
# - {doc}`09_recent_attention`: QK-norm leaves one layer of Qwen3-8B
#   {glue:text}`09_recent_attention.ipynb::qwen_qk:,` unidentified query–key directions, not
#   {glue:text}`09_recent_attention.ipynb::qwen_qk_without:,`; soft-capping identifies the key bias.
# - {doc}`10_your_model`: {glue:text}`10_your_model.ipynb::narrow_generic:d` of the
#   {glue:text}`10_your_model.ipynb::narrow_layers:d` layers of trained narrow runs sit at the generic
#   count, their weakest identified direction down to
#   {glue:text}`10_your_model.ipynb::narrow_weakest_min:.0e` of the strongest; moving a trained model
#   along its symmetries changes its invariants by at most
#   {glue:text}`10_your_model.ipynb::sym_max_invariants:.0e`.
# - {doc}`/counter`: the counts of any `config.json` you paste or drop, worked out in your browser by
#   the same code as `attnid count`, with nothing to install.
#
# ## The answer in one line
#
# The scores of one head depend on the query and key weights only through the product
# $W_K^\top W_Q$; any invertible $S$ gives the same product with $(S W_Q,\, S^{-\top} W_K)$. The
# values and outputs have the same freedom through $W_O W_V$. With $H$ heads of size $D = E/H$ this
# leaves $2 H D^2 = 2E^2/H$ directions out of $4E^2$ weights with no effect at all:
#
# $$
# \frac{\text{unidentified}}{\text{total}} \;=\; \frac{2E^2/H}{4E^2} \;=\; \frac{1}{2H}.
# $$ (eq-one-over-2h)

# %% tags=["parameters"]
# "smoke" (seconds), "cpu" (the book's default), "paper" (paper scale, GPU)
profile = "cpu"
seed = 0
device = "auto"

# %%
import pandas as pd
from myst_nb import glue

from attnid import AttentionConfig, count
from attnid.audit import audit
from attnid.lm.profiles import check_profile
from attnid.plotting import set_style, table

check_profile(profile)
set_style()
rows = []
for H in (1, 2, 4, 6, 8, 12, 16):
    c = count(AttentionConfig(384, H))
    rows.append(
        {
            "heads H": H,
            "head size D": 384 // H,
            "weights": c.total_params,
            "unidentified": c.unidentified,
            "unidentified share": c.unidentified / c.total_params,
            "1/(2H)": 1 / (2 * H),
        }
    )
shares = pd.DataFrame(rows)
# an independent check of the closed form: the Jacobian rank of small layers
# (the audit of chapter 2)
for H in (1, 2, 4):
    small = AttentionConfig(8, H)
    assert audit(small, seed=seed).unidentified == count(small).unidentified
table(shares, formats={"unidentified share": "{:.4f}", "1/(2H)": "{:.4f}"})

# %% tags=["hide-input"]
import matplotlib.pyplot as plt

from attnid.chapters.landing import headline_figure, published_layers

models = published_layers()  # every preset, latent attention included
fig = headline_figure(models)
glue("headline", fig, display=False)
glue("n_models", len(models), display=False)
glue("worst_share", float(models["share"].max()), display=False)
glue("best_share", float(models["share"].min()), display=False)
plt.close(fig)

# %% [markdown]
# The table counts the weights of one attention layer with embedding size $E = 384$ (the size of the
# paper's nanoGPT model {cite:p}`karpathy2022nanogpt`) and checks Eq. {eq}`eq-one-over-2h` for
# every head count.
#
# ## Map of the book
#
# | chapter | what it shows |
# |---|---|
# | {doc}`01_definitions` | the column form of the layer, equal to PyTorch's and nanoGPT's; weight counts; a worked example |
# | {doc}`02_invariances` | the $S/S^{-\top}$ invariance, first- vs second-order change, the $1/(2H)$ count against the Jacobian |
# | {doc}`03_biases` | key biases do nothing (without RoPE), value biases fold into the output bias |
# | {doc}`04_rope_gqa` | RoPE and GQA shrink the symmetry; published models; a correction for Llama-2-70B |
# | {doc}`05_equivalence` | how wide a single head must be to match $H$ heads, and a correction to the paper's 60% |
# | {doc}`06_training_dynamics` | training a character GPT with SGD, AdamW and rebalancing: how much of each step is unidentified |
# | {doc}`07_heads` | head importance by ablation, pruning, and the head count against the identified fraction |
# | {doc}`reproducibility` | the profile, device, time and commit every chapter ran with |
# | {doc}`template_experiment` | a notebook to copy for your own experiment |
#
# ## Rerun a chapter
#
# Every chapter is a jupytext text file in `notebooks/`. From a clone of the repository:
#
# ```bash
# make book                                     # every chapter (profile cpu), then the HTML
# make chapter NB=notebooks/00_introduction.py  # one chapter, then the HTML
# make book PROFILE=paper DEVICE=cuda           # paper-scale runs on a GPU
# ```
#
# or drive papermill yourself, with any parameters of the chapter's parameters cell:
#
# ```bash
# jupytext --to ipynb --set-kernel python3 \
#     -o intro.ipynb notebooks/00_introduction.py
# papermill intro.ipynb intro-out.ipynb -p profile smoke -p seed 1
# ```
#
# ## Start your own experiment
#
# Copy `notebooks/template_experiment.py` to a new file, edit its parameters cell and its body, and
# run it as above. It runs as it is: a small audit of an attention layer of your choice.
