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
# # Bias terms
#
# §4.6 of {cite:t}`morrow2026identification` looks at the biases. Write the score of query $j$ on key
# $i$ with biases:
#
# $$
# k_i^\top q_j = (W_K x_i + b_K)^\top (W_Q x_j + b_Q)
# = x_i^\top W_K^\top q_j \;+\; b_K^\top q_j .
# $$ (eq-key-bias)
#
# The second term does not depend on the key $i$: it adds the same number to every entry of column
# $j$ of the scores, and the column softmax ignores such a shift. So **the key bias has no effect at
# all**, and its gradient is exactly zero. The value bias passes through the attention unchanged,
# because each column of $P_h$ sums to one: $(W_V X + b_V \mathbf 1^\top) P_h = W_V X P_h + b_V \mathbf 1^\top$,
# so the heads only contribute the constant $\sum_h W_O^h b_V^h$, which the output bias $b_O$ can
# absorb. The query bias enters through $x_i^\top W_K^\top b_Q$, which does depend on the key: it is
# identified.
#
# :::{admonition} In this chapter
# :class: tip
# Without RoPE the key bias has no effect at all: shifting it by up to $10^2$ changes the output
# by at most {glue:text}`max_shift_change:.0e`, and its gradient is
# {glue:text}`key_bias_grad:.0e`, against {glue:text}`key_bias_grad_rope:.2f` under RoPE. The value
# bias folds into the output bias; with biases the closed-form count equals the Jacobian on all
# {glue:text}`n_bias_configs` configurations tested.
# :::

# %% tags=["parameters"]
profile = "cpu"
seed = 0
device = "auto"

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from myst_nb import glue

from attnid.attention import AttentionConfig, attention, init_params
from attnid.audit import audit
from attnid.counting import count
from attnid.lm.profiles import check_profile
from attnid.plotting import set_style, table
from attnid.symmetry import (
    absorb_value_bias,
    bias_gradient_norms,
    bias_gradients,
    shift_key_bias,
    value_bias_direction,
)

check_profile(profile)
set_style()
gen = torch.Generator().manual_seed(seed)
small = profile == "smoke"

# %% [markdown]
# ## Shifting the key bias, absorbing the value bias

# %%
cfg = AttentionConfig(24, 4, bias="all", causal=True)
p = init_params(cfg, seed=seed)
X = torch.randn(4, cfg.E, 12, generator=gen, dtype=torch.float64)
Y = attention(X, p, cfg)
rows = []
for size in (1e-2, 1.0, 1e2):
    delta = size * torch.randn(cfg.G, cfg.D, generator=gen, dtype=torch.float64)
    rows.append(
        {
            "change": f"key bias + shift of size {size:g}",
            "max |ΔY|": float(
                (attention(X, shift_key_bias(p, delta), cfg) - Y).abs().max()
            ),
        }
    )
absorbed = absorb_value_bias(p, cfg)
rows.append(
    {
        "change": "value bias moved into b_O (b_V = 0)",
        "max |ΔY|": float((attention(X, absorbed, cfg) - Y).abs().max()),
    }
)
q = dict(
    p,
    b_Q=p["b_Q"]
    + 1e-2 * torch.randn(p["b_Q"].shape, generator=gen, dtype=torch.float64),
)
rows.append(
    {
        "change": "query bias + shift of size 0.01 (control)",
        "max |ΔY|": float((attention(X, q, cfg) - Y).abs().max()),
    }
)
bias_table = pd.DataFrame(rows)
assert (bias_table["max |ΔY|"][:4] <= 1e-10).all() and bias_table["max |ΔY|"].iloc[
    4
] > 1e-4
glue("max_shift_change", float(bias_table["max |ΔY|"][:3].max()), display=False)
table(bias_table, formats={"max |ΔY|": "{:.1e}"})

# %% [markdown]
# A shift of the key bias by 100 leaves the output unchanged to round-off; the softmax removes it
# exactly. (Very large shifts eventually lose digits to cancellation inside the exponentials, but
# never change the mathematics.)
#
# ## Gradients of every bias
#
# At a random point and for a random linear loss $\langle R, Y\rangle$, the gradient of the key bias
# is zero up to float64 round-off, while the other biases get ordinary gradients
# ({numref}`fig-bias-grads`). With RoPE (last group of bars) the picture changes; see below.

# %%
cfg_rope = cfg.with_(rope=True)
g_plain = bias_gradient_norms(p, cfg, X, seed=seed)
g_rope = bias_gradient_norms(init_params(cfg_rope, seed=seed), cfg_rope, X, seed=seed)
names = list(g_plain)

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-bias-grads", "caption": "Gradient norm of each bias for a random linear loss at a random point (float64), without and with RoPE. The key bias has a zero gradient up to round-off, but only without RoPE."}}
fig, ax = plt.subplots()
w = 0.38
xs = np.arange(len(names))
ax.bar(xs - w / 2, [max(g_plain[n], 1e-300) for n in names], w, label="no RoPE")
ax.bar(xs + w / 2, [g_rope[n] for n in names], w, label="with RoPE")
ax.set_yscale("log")
ax.axhline(np.finfo(np.float64).eps, color="k", ls=":", label="float64 ε")
ax.set_xticks(xs, [f"${n[0]}_{n[2]}$" for n in names])
ax.set(
    ylabel="‖∂⟨R, Y⟩ / ∂b‖", title="Bias gradients at a random point", ylim=(1e-18, 1e3)
)
ax.legend()
plt.show()

# %%
assert (
    g_plain["b_K"] < 1e-12
    and min(g_plain["b_Q"], g_plain["b_V"], g_plain["b_O"]) > 1e-3
)
assert g_rope["b_K"] > 1e-3
glue("key_bias_grad", float(g_plain["b_K"]), display=False)
glue("key_bias_grad_rope", float(g_rope["b_K"]), display=False)

# %% [markdown]
# The value bias has a large gradient, and yet it is unidentified. There is no contradiction: what is
# unidentified is not $b_V$ alone but the *combined* direction that moves $b_V$ by $\delta$ and $b_O$ by
# $-\sum_h W_O^h \delta^h$, along which the output does not change. The gradient must be orthogonal to
# that direction, and it is:

# %%
grads = bias_gradients(p, cfg, X, seed=seed)
rows = []
for trial in range(3):
    d = value_bias_direction(
        p, cfg, torch.randn(cfg.G, cfg.C, generator=gen, dtype=torch.float64)
    )
    along = sum(float((grads[k] * d[k]).sum()) for k in d)
    scale = float(
        torch.cat([grads[k].reshape(-1) for k in d]).norm()
        * torch.cat([v.reshape(-1) for v in d.values()]).norm()
    )
    rows.append(
        {
            "random δ": trial + 1,
            "‖∇b_V‖": float(grads["b_V"].norm()),
            "⟨∇, combined direction⟩": along,
            "relative to ‖∇‖‖d‖": abs(along) / scale,
        }
    )
vdir = pd.DataFrame(rows)
assert (vdir["relative to ‖∇‖‖d‖"] < 1e-12).all()
table(
    vdir,
    formats={
        "‖∇b_V‖": "{:.2f}",
        "⟨∇, combined direction⟩": "{:.1e}",
        "relative to ‖∇‖‖d‖": "{:.1e}",
    },
)

# %% [markdown]
# ## Counting with biases
#
# Without RoPE the key bias adds $G\,D$ unidentified parameters ($E$ for standard multi-head
# attention), the value bias $G\,C$ as long as there is an output bias to absorb it (and
# $\max(0, GC - E)$ without one). The paper's counts, $E$ for the key bias and $H C$ for the value
# bias, are the multi-head special case $G = H$, $D = C = E/H$: under grouped-query attention they
# overcount (the shared keys and values have only $G D$ and $G C$ bias entries), and without an
# output bias the value bias is unidentified only in as far as $GC > E$. The Jacobian agrees with the
# general forms on every combination:

# %%
rows = []
combos = (
    ["none", "q", "k", "v", "qk", "vo", "qkv", "all"]
    if not small
    else ["none", "k", "all"]
)
for b in combos:
    for rope in (False, True):
        c = AttentionConfig(12, 3, bias=b, rope=rope, causal=True)
        th, r = count(c), audit(c, seed=seed, method="dense")
        rows.append(
            {
                "biases": b,
                "RoPE": rope,
                "params": th.total_params,
                **{f"theory {k}": v for k, v in th.unidentified_by_block.items()},
                "theory total": th.unidentified,
                "Jacobian": r.unidentified,
                "sv gap": r.sv_gap,
            }
        )
bias_counts = pd.DataFrame(rows)
assert (bias_counts["theory total"] == bias_counts["Jacobian"]).all()
glue("n_bias_configs", len(bias_counts), display=False)
table(bias_counts, formats={"sv gap": "{:.1e}"})

# %% [markdown]
# ## What RoPE does to the key-bias invariance
#
# The paper's bias argument assumes no position encoding. With RoPE {cite:p}`su2021roformer` the
# rotation is applied after the bias, so the score of query $n$ on key $m$ becomes
#
# $$
# (R_m k_m)^\top (R_n q_n) = x_m^\top W_K^\top R_{n-m}\, q_n \;+\; b_K^\top R_{n-m}\, q_n .
# $$ (eq-rope-bias)
#
# The bias term now depends on the key's position through $R_{n-m}$, so it is no longer constant
# over a column and the softmax no longer removes it: **with RoPE the key bias is identified**.
# The Jacobian confirms it (the `key_bias` column is 0 in every RoPE row above, and theory equals
# the Jacobian), the gradient of $b_K$ is of ordinary size ({numref}`fig-bias-grads`), and a shift now
# changes the output:

# %%
p_rope = init_params(cfg_rope, seed=seed)
delta = torch.randn(cfg.G, cfg.D, generator=gen, dtype=torch.float64)
change = float(
    (
        attention(X, shift_key_bias(p_rope, delta), cfg_rope)
        - attention(X, p_rope, cfg_rope)
    )
    .abs()
    .max()
)
print(f"RoPE layer, key bias shifted by a random vector: max |ΔY| = {change:.3f}")
assert change > 1e-3

# %% [markdown]
# What survives is smaller: the commutant of the rotations acts on the augmented key matrix
# $[W_K \mid b_K]$, so the key bias only moves together with $W_K$ (chapter on RoPE and GQA).
#
# ## What this chapter checked
#
# - Key-bias shifts and value-bias absorption leave the output unchanged to $\le 10^{-10}$; a query-bias
#   shift does not (`tests/test_symmetry.py`).
# - The key-bias gradient is zero up to round-off without RoPE, and of ordinary size with RoPE.
# - The closed-form counts with every bias combination, with and without RoPE, equal the Jacobian
#   counts (`tests/test_audit.py`).
# - With RoPE the key bias is identified: shifting it changes the output.
