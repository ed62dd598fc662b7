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
# # Equivalence: how wide must a single head be?
#
# §4.10 of {cite:t}`morrow2026identification` turns the counts around: if a single-head layer were to
# have as many *identified* parameters as an $H$-head layer of width $E$, how large would its
# embedding dimension $E'$ have to be? The paper answers "roughly 60% larger for 12 heads". This
# chapter derives $E'$ under each way of counting and checks which one is right.
#
# :::{admonition} In this chapter
# :class: tip
# A single head with as many identified weights as a 12-head layer is
# {glue:text}`width_h12:.2f` times as wide, not the paper's {glue:text}`width_h12_paper:.2f`: the
# Jacobian shows that a single head with a square value map loses a third of its weights, not half,
# on all {glue:text}`n_widths` widths tested.
# :::
#
# **The multi-head layer.** $H$ heads with $D = C = E/H$ have $4E^2$ weights, of which $2E^2/H$ are
# unidentified (chapter on invariances), so
#
# $$ N_\text{id}^{(H)} = 4E^2\left(1 - \tfrac{1}{2H}\right). $$ (eq-multi-id)
#
# **The single head.** Three conventions for a single head of width $E'$:
#
# 1. *Q, K and a square V, no output map* ($D = E'$, the paper's $2DE + E^2$ layer): $3E'^2$ weights.
#    Only the QK block has a symmetry ($E'^2$ dimensions); a square $W_V$ with nothing after it is
#    identified. $N_\text{id} = 2E'^2$.
# 2. *A full head* with $W_Q, W_K, W_V, W_O$ all $E'\times E'$: $4E'^2$ weights, $E'^2$ lost in QK and
#    $E'^2$ in VO. $N_\text{id} = 2E'^2$.
# 3. *Half of everything*: the layer of convention 1, but with half of **all** $3E'^2$ weights counted
#    as unidentified (the one-head fraction $1/2$ applied to V as well). $N_\text{id} = 1.5E'^2$.
#
# Setting $N_\text{id} = $ Eq. {eq}`eq-multi-id` gives
#
# $$
# \frac{E'}{E} = \sqrt{2 - \tfrac1H}\ \ \text{(conventions 1 and 2)},\qquad
# \frac{E'}{E} = \sqrt{\tfrac{8}{3}\left(1 - \tfrac1{2H}\right)}\ \ \text{(convention 3)}.
# $$ (eq-width)

# %% tags=["parameters"]
profile = "cpu"
seed = 0
device = "auto"

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from myst_nb import glue

from attnid.attention import AttentionConfig
from attnid.audit import audit, audit_block
from attnid.counting import (
    CONVENTIONS,
    equivalent_single_head_width,
    single_head_total_over_multi,
)
from attnid.lm.profiles import check_profile
from attnid.plotting import panels, set_style, table

check_profile(profile)
set_style()

# %% [markdown]
# ## Which single-head count is right?
#
# The Jacobian decides. For convention 1 we audit a single head with $D = C = E'$ and keep $W_O$ fixed
# (a fixed invertible output map is the same as none, up to relabelling the outputs); for convention 2
# we audit the full head.

# %%
rows = []
for Ep in [4, 6] if profile == "smoke" else [4, 6, 8]:
    c = AttentionConfig(Ep, 1, head_dim=Ep, value_dim=Ep)
    qkv = audit_block(c, ("W_Q", "W_K", "W_V"), seed=seed)
    full = audit(c, seed=seed, method="dense")
    rows.append(
        {
            "E'": Ep,
            "conv. 1 weights 3E'²": qkv.total_params,
            "conv. 1 Jacobian unidentified": qkv.unidentified,
            "conv. 3 claims": qkv.total_params // 2,
            "conv. 2 weights 4E'²": full.total_params,
            "conv. 2 Jacobian unidentified": full.unidentified,
        }
    )
single = pd.DataFrame(rows)
assert (single["conv. 1 Jacobian unidentified"] == single["E'"] ** 2).all()
assert (single["conv. 2 Jacobian unidentified"] == 2 * single["E'"] ** 2).all()
glue("n_widths", len(single), display=False)
table(single)

# %% [markdown]
# The single head with a square value map loses $E'^2$ of its $3E'^2$ weights — a third, not a half.
# Convention 3 applies the QK fraction $1/2$ to weights (the value map) that have no symmetry.
#
# ## $E'/E$ and the size of the equivalent single head

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-equivalence", "caption": "Left: width E'/E of a single head with as many identified parameters as an H-head layer of width E, for each counting convention. Right: its total weights relative to the multi-head layer's 4E². The marker is the paper's 'roughly 60% larger for 12 heads'."}}
Hs = np.arange(1, 33)
fig, axes = panels(2, height=3.6)
axes = axes[0]
labels = {
    "qk_square_v": "1: Q, K, square V (correct)",
    "full_head": "2: full head Q, K, V, O (correct)",
    "half_of_all": "3: half of all weights (paper's 60%)",
}
styles = {"qk_square_v": "-", "full_head": "--", "half_of_all": ":"}
for conv in CONVENTIONS:
    for ax, quantity in zip(
        axes, (equivalent_single_head_width, single_head_total_over_multi)
    ):
        ax.plot(
            Hs, [quantity(h, conv) for h in Hs], styles[conv], lw=2, label=labels[conv]
        )
w12 = equivalent_single_head_width(12, "half_of_all")
axes[0].plot([12], [w12], "o", color="C3", ms=9, label=f"H = 12: E'/E = {w12:.2f}")
axes[0].set(
    xlabel="heads H of the multi-head layer",
    ylabel="E' / E",
    title="Width of the equivalent single head",
)
axes[1].set(
    xlabel="heads H of the multi-head layer",
    ylabel="single-head weights / 4E²",
    title="Its size",
)
fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=2)
plt.show()

# %%
rows = [
    {
        "convention": CONVENTIONS[c].description,
        "E'/E at H = 12": equivalent_single_head_width(12, c),
        "weights relative to 4E²": single_head_total_over_multi(12, c),
    }
    for c in CONVENTIONS
]
eq12 = pd.DataFrame(rows)
glue("width_h12", equivalent_single_head_width(12, "qk_square_v"), display=False)
glue("width_h12_paper", equivalent_single_head_width(12, "half_of_all"), display=False)
table(eq12, formats={"E'/E at H = 12": "{:.3f}", "weights relative to 4E²": "{:.3f}"})

# %% [markdown]
# :::{important}
# **On the paper's "roughly 60% larger for 12 heads".** The 60% ($E'/E = 1.599$) comes only from
# convention 3, which counts half of *all* single-head weights as unidentified. The Jacobian shows that
# a single head with a square value map loses only the QK block's $E'^2$, so the matching width is
# $E'/E = \sqrt{2 - 1/12} \approx 1.38$: about **38% larger**, and with a full single head (convention 2)
# the answer is the same. The qualitative point stands — matching the identification of 12 heads with
# one head takes a much wider layer (about 1.9× the weights with a full head) — but the number is 38%,
# not 60%. As $H\to\infty$ the correct ratio tends to $\sqrt 2$.
# :::
#
# ## What this chapter checked
#
# - A single head with Q, K and a square V has $E'^2$ unidentified weights of $3E'^2$; a full single head
#   $2E'^2$ of $4E'^2$ (Jacobian, `tests/test_audit.py`).
# - $E'/E = \sqrt{2 - 1/H}$ under the correct conventions, $1.38$ at $H = 12$; the paper's $1.60$ follows
#   from the "half of all weights" convention (`tests/test_counting.py`).
