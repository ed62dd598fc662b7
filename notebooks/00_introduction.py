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
profile = "cpu"  # "smoke" (seconds), "cpu" (the book's default), "paper" (paper scale, GPU)
seed = 0
device = "auto"

# %%
import pandas as pd

from attnid import AttentionConfig, count
from attnid.lm.profiles import check_profile

check_profile(profile)
rows = []
for H in (1, 2, 4, 6, 8, 12, 16):
    c = count(AttentionConfig(384, H))
    rows.append(
        {
            "heads H": H,
            "head dim D": 384 // H,
            "weights": c.total_params,
            "unidentified": c.unidentified,
            "unidentified share": c.unidentified / c.total_params,
            "1/(2H)": 1 / (2 * H),
        }
    )
table = pd.DataFrame(rows).set_index("heads H")
assert all(abs(r["unidentified share"] - r["1/(2H)"]) < 1e-15 for r in rows)
table.style.format({"unidentified share": "{:.4f}", "1/(2H)": "{:.4f}", "weights": "{:,}", "unidentified": "{:,}"})

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
# make book                                   # all chapters, profile "cpu", then the HTML
# make chapter NB=notebooks/00_introduction.py  # one chapter, then the HTML
# make book PROFILE=paper DEVICE=cuda         # paper-scale runs on a GPU
# ```
#
# or drive papermill yourself, with any parameters of the chapter's parameters cell:
#
# ```bash
# jupytext --to ipynb --set-kernel python3 -o intro.ipynb notebooks/00_introduction.py
# papermill intro.ipynb intro-out.ipynb -p profile smoke -p seed 1
# ```
#
# ## Start your own experiment
#
# Copy `notebooks/template_experiment.py` to a new file, edit its parameters cell and its body, and
# run it as above. It runs as it is: a small audit of an attention layer of your choice.
