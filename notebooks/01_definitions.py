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
# # Multi-head attention, defined
#
# This chapter fixes the notation of the whole book and checks that it describes the layer that
# everybody uses. We write tokens as **columns**: an input sequence of length $L$ is a matrix
# $X \in \mathbb{R}^{E \times L}$. Head $h$ of $H$ forms queries, keys and values
#
# $$
# Q_h = W_Q^h X + b_Q^h \mathbf 1^\top,\qquad K_h = W_K^h X + b_K^h \mathbf 1^\top,\qquad
# V_h = W_V^h X + b_V^h \mathbf 1^\top,
# $$ (eq-qkv)
#
# with $W_Q^h, W_K^h \in \mathbb{R}^{D\times E}$ and $W_V^h \in \mathbb{R}^{C \times E}$. Its
# attention matrix $P_h$ applies a softmax to every column of the scores $K_h^\top Q_h/\sqrt D$
# (one column per query, one row per key), and the layer adds up what every head writes back:
#
# $$
# Y \;=\; \sum_{h=1}^{H} W_O^h\, V_h\, P_h \;+\; b_O \mathbf 1^\top,\qquad W_O^h \in \mathbb{R}^{E\times C}.
# $$ (eq-layer)
#
# Stacking the $W_O^h$ side by side gives the familiar "concatenate the heads, then project" form of
# {cite:t}`vaswani2017attention`. Eq. {eq}`eq-layer` is the form the identification arguments of
# {cite:t}`morrow2026identification` use, because each head's contribution appears as a product of
# matrices whose factors can trade scale and rotation without changing the product.
#
# :::{admonition} In this chapter
# :class: tip
# The column form of Eq. {eq}`eq-layer` is the layer everybody uses: on the same weights it agrees
# with `torch.nn.MultiheadAttention`, a concatenate-and-project implementation and nanoGPT's own
# attention module to {glue:text}`max_difference:.0e` (largest difference, float64), with and
# without a causal mask. A layer of $H$ heads of size $E/H$ has $4E^2$ weights whatever $H$ is.
# :::

# %% tags=["parameters"]
profile = "cpu"
seed = 0
device = "auto"

# %%
import pandas as pd
import torch
from myst_nb import glue
from torch import nn

from attnid.attention import (
    AttentionConfig,
    attention,
    attention_steps,
    concat_project_attention,
    from_torch_mha,
    init_params,
    to_fused,
    to_torch_mha,
)
from attnid.counting import multi_head_params, single_head_params
from attnid.lm.gpt import CausalSelfAttention, GPTConfig
from attnid.lm.profiles import check_profile
from attnid.plotting import table

check_profile(profile)
_ = torch.manual_seed(seed)  # every draw below; the generator it returns is not shown

# %% [markdown]
# ## Three implementations, one layer
#
# `attnid.attention.attention` implements Eq. {eq}`eq-layer` directly with `einsum`.
# We compare it in float64 with an independent concatenate-and-project implementation (built on
# PyTorch's `scaled_dot_product_attention`), with `torch.nn.MultiheadAttention` and with a
# nanoGPT-style fused `c_attn` / `c_proj` pair {cite:p}`karpathy2022nanogpt`, all on the same weights.

# %%
E, H, L, B = 24, 4, 11, 3
rows = []
for causal in (False, True):
    mha = nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for prm in mha.parameters():
            prm.add_(
                0.2 * torch.randn_like(prm)
            )  # torch starts biases at zero; make them matter
    cfg, p = from_torch_mha(mha, causal=causal)
    x = torch.randn(B, L, E, dtype=torch.float64)
    y_col = attention(x.transpose(1, 2), p, cfg).transpose(1, 2)
    mask = torch.ones(L, L, dtype=torch.bool).triu(1) if causal else None
    y_torch = mha(x, x, x, need_weights=False, attn_mask=mask)[0]
    y_cat = concat_project_attention(x, p, cfg)
    compared = [
        ("concatenate-and-project", y_cat),
        ("torch.nn.MultiheadAttention", y_torch),
    ]
    if (
        causal
    ):  # nanoGPT's attention is causal: its own module, weights copied in, float64
        gpt_attn = (
            CausalSelfAttention(GPTConfig(n_embd=E, n_head=H, bias=True))
            .double()
            .eval()
        )
        with torch.no_grad():
            for prm, value in zip(
                (
                    gpt_attn.c_attn.weight,
                    gpt_attn.c_attn.bias,
                    gpt_attn.c_proj.weight,
                    gpt_attn.c_proj.bias,
                ),
                to_fused(cfg, p),
            ):
                prm.copy_(value)
        compared.append(("attnid.lm.gpt.CausalSelfAttention (nanoGPT)", gpt_attn(x)))
    for name, y in compared:
        rows.append(
            {
                "causal mask": causal,
                "compared with": name,
                "max |ΔY|": float((y - y_col).detach().abs().max()),
                "max |Y|": float(y_col.detach().abs().max()),
            }
        )
equal = pd.DataFrame(rows)
assert (equal["max |ΔY|"] <= 1e-10).all()
glue("max_difference", float(equal["max |ΔY|"].max()), display=False)
table(equal, formats={"max |ΔY|": "{:.1e}", "max |Y|": "{:.2f}"})

# %% [markdown]
# The differences are at the level of float64 round-off (about $10^{-16}$ relative), so the
# column form is the same function as the layers in PyTorch and nanoGPT.
#
# ## How many weights?
#
# One head with $W_Q, W_K \in \mathbb{R}^{D \times E}$ and a square value map $W_V \in \mathbb{R}^{E\times E}$
# (no output map) has $2DE + E^2$ weights. $H$ heads with output maps have $2HE(D + C)$, which is
# $4E^2$ when $D = C = E/H$: splitting a layer into heads does not change its size.

# %%
rows = []
for E_, H_ in [(64, 8), (384, 6), (768, 12), (1024, 16), (12288, 96)]:
    D = E_ // H_
    rows.append(
        {
            "E": E_,
            "H": H_,
            "D = C = E/H": D,
            "single head 2DE+E² (D=E)": single_head_params(E_, E_),
            "multi-head 2HE(D+C)": multi_head_params(E_, H_, D, D),
            "4E²": 4 * E_ * E_,
        }
    )
    # an independent count: PyTorch's own layer (on the meta device: no memory)
    mha = nn.MultiheadAttention(E_, H_, bias=False, device="meta")
    assert sum(q.numel() for q in mha.parameters()) == multi_head_params(E_, H_, D, D)
counts = pd.DataFrame(rows)
table(counts)

# %% [markdown]
# The last row is the size of GPT-3's attention layer (175B model): 604 million weights per layer.
#
# ## A worked example
#
# Two tokens, $E = 6$, $H = 3$ heads with $D = C = 2$, biases on. Every intermediate of
# Eq. {eq}`eq-qkv`–{eq}`eq-layer` is printed; the probabilities in each column sum to one.

# %%
cfg = AttentionConfig(6, 3, bias="all")
p = init_params(cfg, seed=seed)
X = torch.randn(
    1, 6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
)
steps = attention_steps(X, p, cfg)
torch.set_printoptions(precision=3, sci_mode=False)
print("X (E x L) =\n", X[0])
for h in range(cfg.H):
    print(f"\n--- head {h + 1} ---")
    for name in ("Q", "K", "V"):
        print(f"{name}_{h + 1} =\n", steps[name][0, h])
    print("scores K^T Q / sqrt(D) (keys x queries) =\n", steps["A"][0, h])
    print(f"P_{h + 1} = column softmax =\n", steps["P"][0, h])
    print(f"head output W_O^{h + 1} V_{h + 1} P_{h + 1} =\n", steps["head_out"][0, h])
print("\nY = sum of head outputs + b_O =\n", steps["Y"][0])
assert torch.allclose(steps["P"].sum(-2), torch.ones(1, 3, 2, dtype=torch.float64))
# an independent check of the printed Y: PyTorch's layer with the same weights
# (its tokens are rows)
y_torch = to_torch_mha(cfg, p)(X.mT, X.mT, X.mT, need_weights=False)[0]
assert torch.allclose(y_torch[0].mT, steps["Y"][0], atol=1e-12)

# %% [markdown]
# ## What this chapter checked
#
# - The column form equals concatenate-and-project and `torch.nn.MultiheadAttention` to $\le 10^{-10}$ in
#   float64, with and without a causal mask, and the causal form equals the forward pass of the training
#   model's own attention module (`attnid.lm.gpt.CausalSelfAttention`, nanoGPT's fused `c_attn`/`c_proj`)
#   with the same weights (`tests/test_attention.py`).
# - $H$ heads of size $E/H$ have $2HE(D+C) = 4E^2$ weights for every $(E, H)$ in the table
#   (`tests/test_counting.py`).
# - In the worked example every column of every $P_h$ sums to one and $Y$ is the sum of the head
#   outputs plus $b_O$.
