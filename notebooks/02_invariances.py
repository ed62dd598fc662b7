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
# # Invariances and identification
#
# This chapter follows §4.1–4.5 of {cite:t}`morrow2026identification`. A head's scores
# $K^\top Q = X^\top W_K^\top W_Q X$ (biases aside) depend on the query and key weights only through
# the $E\times E$ product $W_K^\top W_Q$. For any invertible $S \in \mathbb{R}^{D\times D}$,
#
# $$
# (S^{-\top} W_K)^\top (S W_Q) = W_K^\top S^{-1} S W_Q = W_K^\top W_Q ,
# $$ (eq-qk-invariance)
#
# so the pair $(S W_Q, S^{-\top} W_K)$ computes exactly the same layer: a $D^2$-dimensional family of
# weights that no data can tell apart. The values and outputs have the same freedom,
# $(W_O S^{-1}, S W_V)$ with $S \in \mathbb{R}^{C\times C}$. Symmetries of this kind, and the flat
# directions they create, are surveyed by {cite:t}`zhao2025symmetry`.
#
# :::{admonition} In this chapter
# :class: tip
# Both reparameterisations leave a causal layer with biases unchanged to
# {glue:text}`max_change:.0e` (largest output change, $\kappa(S) \le 10^4$, float64). A step $t$
# along the tangent of the symmetry changes the output at order {glue:text}`slope_tangent:.2f` in
# $t$ (the log–log slope), a step along a generic direction at order
# {glue:text}`slope_generic:.2f`. At $D = E/H$ a share $1/(2H)$ of the
# weights is unidentified, and the closed form equals the rank of the Jacobian on all
# {glue:text}`n_configs` configurations tested.
# :::

# %% tags=["parameters"]
profile = "cpu"
seed = 0
device = "auto"

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from myst_nb import glue

from attnid.attention import AttentionConfig, attention, init_params
from attnid.audit import audit, qk_product_rank, svd_construction_rank
from attnid.counting import count, orthonormal_qk_dof, qk_identified_fraction
from attnid.lm.profiles import check_profile
from attnid.plotting import set_style, table
from attnid.symmetry import qk_direction, step_response, transform_qk, transform_vo

check_profile(profile)
set_style()
gen = torch.Generator().manual_seed(seed)
small = profile == "smoke"

# %% [markdown]
# ## The invariance holds to round-off, however ill-conditioned $S$ is
#
# We apply random $S$ with prescribed condition numbers (singular values spread log-uniformly) to
# every head of a causal layer with biases, and measure the largest change of the output. Float64
# round-off grows with the condition number of $S$ (inverting it loses about $\log_{10}\kappa$ digits);
# the dashed line is $\varepsilon_{64}\,\kappa(S)\,\max|Y|$.

# %%
cfg = AttentionConfig(32, 4, bias="all", causal=True)
p = init_params(cfg, seed=seed)
X = torch.randn(4, cfg.E, 16, generator=gen, dtype=torch.float64)
Y = attention(X, p, cfg)


def conditioned(n, kappa):
    U, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return (
        U @ torch.diag(torch.logspace(0, np.log10(kappa), n, dtype=torch.float64)) @ V.T
    )


kappas = [1, 1e2, 1e4, 1e6, 1e8] if not small else [1, 1e4]
rows = []
for kappa in kappas:
    S = torch.stack([conditioned(cfg.D, kappa) for _ in range(cfg.G)])
    rows.append(
        {
            "κ(S)": kappa,
            "QK: max |ΔY|": float(
                (attention(X, transform_qk(p, cfg, S), cfg) - Y).abs().max()
            ),
            "VO: max |ΔY|": float(
                (attention(X, transform_vo(p, cfg, S), cfg) - Y).abs().max()
            ),
        }
    )
inv = pd.DataFrame(rows)
eps = np.finfo(np.float64).eps

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-invariance-conditioning", "caption": "Largest change of the layer's output (float64) when the weights are replaced by (S W_Q, S^{-T} W_K) or (W_O S^{-1}, S W_V), against the condition number of S, with the float64 round-off level ε κ(S) max|Y| (dashed)."}}
fig, ax = plt.subplots()
ax.loglog(inv["κ(S)"], inv["QK: max |ΔY|"], "o-", label=r"$(S W_Q,\ S^{-\top} W_K)$")
ax.loglog(inv["κ(S)"], inv["VO: max |ΔY|"], "s-", label=r"$(W_O S^{-1},\ S W_V)$")
ax.loglog(
    inv["κ(S)"],
    eps * inv["κ(S)"] * float(Y.abs().max()),
    "k--",
    label=r"$\varepsilon_{64}\,\kappa(S)\,\max|Y|$",
)
ax.set(
    xlabel="condition number κ(S)",
    ylabel="max |ΔY| (output units)",
    title="Transformed weights, same outputs (float64)",
)
ax.legend()
plt.show()

# %% tags=["hide-input"]
assert (
    (inv.loc[inv["κ(S)"] <= 1e4, ["QK: max |ΔY|", "VO: max |ΔY|"]] <= 1e-10).all().all()
)
roundoff = eps * inv[["κ(S)"]].to_numpy() * float(Y.abs().max())
assert (inv[["QK: max |ΔY|", "VO: max |ΔY|"]].to_numpy() <= 100 * roundoff).all()
well_conditioned = inv.loc[inv["κ(S)"] <= 1e4, ["QK: max |ΔY|", "VO: max |ΔY|"]]
glue("max_change", float(well_conditioned.to_numpy().max()), display=False)

# %% [markdown]
# The paper names three familiar special cases of $S$: a permutation of a head's query/key dimensions
# (relabelling them), an orthogonal $S$ (a rotation, $S^{-\top} = S$), and a compensating scaling
# $S = \operatorname{diag}(c)$, which multiplies query row $i$ by $c_i$ and key row $i$ by $1/c_i$:


# %%
def special(kind: str) -> torch.Tensor:
    D_ = cfg.D
    if kind == "permutation":
        return torch.eye(D_, dtype=torch.float64)[torch.randperm(D_, generator=gen)]
    if kind == "orthogonal":
        return torch.linalg.qr(torch.randn(D_, D_, generator=gen, dtype=torch.float64))[
            0
        ]
    return torch.diag(
        torch.exp(2 * torch.randn(D_, generator=gen, dtype=torch.float64))
    )


rows = []
for kind in ("permutation", "orthogonal", "compensating scaling"):
    S = torch.stack([special(kind) for _ in range(cfg.G)])
    q = transform_qk(p, cfg, S)
    rows.append(
        {
            "S": kind,
            "max |ΔW_Q|": float((q["W_Q"] - p["W_Q"]).abs().max()),
            "max |ΔY|": float((attention(X, q, cfg) - Y).abs().max()),
        }
    )
special_table = pd.DataFrame(rows)
assert (special_table["max |ΔY|"] <= 1e-10).all() and (
    special_table["max |ΔW_Q|"] > 1e-2
).all()
table(special_table, formats={"max |ΔW_Q|": "{:.2f}", "max |ΔY|": "{:.1e}"})

# %% [markdown]
# The smallest case makes the point most plainly. With one input dimension ($E = 1$) a head's query and
# key weights are two vectors $w_Q, w_K \in \mathbb{R}^D$ and the score is $x^2\, w_K^\top w_Q$: only the
# inner product matters, so of the $2D$ weights one direction is identified and $2D - 1$ are not. The
# rank of the product map's Jacobian says the same:

# %%
rank_one = pd.DataFrame(
    [
        {
            "D": D_,
            "weights 2D": 2 * D_,
            "rank of (w_Q, w_K) ↦ w_Kᵀw_Q": qk_product_rank(1, D_).rank,
            "unidentified (2D − rank)": 2 * D_ - qk_product_rank(1, D_).rank,
            "2D − 1": 2 * D_ - 1,
        }
        for D_ in (1, 2, 3, 4, 8)
    ]
)
assert (rank_one["unidentified (2D − rank)"] == rank_one["2D − 1"]).all()
table(rank_one)

# %% [markdown]
# ## First order is not second order
#
# Differentiating $t \mapsto (e^{tS} W_Q, e^{-tS^\top} W_K)$ at $t=0$ gives the tangent direction
# $(S W_Q, -S^\top W_K)$. Along it the output has **zero derivative for every input**. But a straight
# step $W + t\,d$ leaves the curved orbit, so the output changes at second order, $|\Delta Y| \propto t^2$;
# along a generic direction it changes at first order, $|\Delta Y| \propto t$.

# %%
S = torch.randn(cfg.G, cfg.D, cfg.D, generator=gen, dtype=torch.float64)
tangent = qk_direction(p, cfg, S)
generic = {
    k: torch.randn(v.shape, generator=gen, dtype=torch.float64) for k, v in p.items()
}
steps = np.logspace(-5, -1, 9)
resp_t = step_response(p, cfg, X, tangent, steps).numpy()
resp_g = step_response(p, cfg, X, generic, steps).numpy()
slope_t = np.polyfit(np.log(steps[:6]), np.log(resp_t[:6]), 1)[0]
slope_g = np.polyfit(np.log(steps[:6]), np.log(resp_g[:6]), 1)[0]

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-first-order", "caption": "Largest output change after a step of size t along a tangent direction (S W_Q, −Sᵀ W_K) and along a generic direction, log–log: slope 2 means the first derivative is zero, slope 1 that it is not."}}
fig, ax = plt.subplots()
ax.loglog(
    steps, resp_t, "o-", label=f"tangent $(SW_Q, -S^\\top W_K)$: slope {slope_t:.2f}"
)
ax.loglog(steps, resp_g, "s-", label=f"generic direction: slope {slope_g:.2f}")
ax.set(
    xlabel="step size t",
    ylabel="max |Y(θ + t d) − Y(θ)|",
    title="Output change along a direction",
)
ax.legend()
plt.show()

# %% tags=["hide-input"]
assert abs(slope_t - 2) < 0.1 and abs(slope_g - 1) < 0.1
glue("slope_tangent", float(slope_t), display=False)
glue("slope_generic", float(slope_g), display=False)

# %% [markdown]
# ## Counting: $D^2$ per head, $2DE - D^2$ left
#
# The products $W_K^\top W_Q$ with $D \le E$ form the set of $E \times E$ matrices of rank at most
# $D$, a manifold of dimension $D(2E - D) = 2DE - D^2$. So of the $2DE$ query and key weights of a
# head, $D^2$ are unidentified and the identified share is $1 - D/(2E)$: one half when $D = E$.
# The paper reaches the same number through a construction: write the product as a thin SVD
# $W_K^\top W_Q = U \Sigma V^\top$ with $U, V \in \mathbb{R}^{E \times D}$ having orthonormal columns and
# $\Sigma$ diagonal. That is $2DE + D$ numbers under $D(D+1)$ constraints ($U^\top U = I$ and $V^\top V = I$,
# $D(D+1)/2$ each), leaving $2DE - D^2$. A count of constraints is only an upper bound until two
# things are checked: the constraints are independent (their Jacobian has rank $D(D+1)$, so the tangent
# space has dimension $2DE - D^2$), and the product map is injective on that tangent space (its Jacobian
# restricted to it has full rank). Both are checked below with `attnid.audit.svd_construction_rank`,
# next to the rank of the product map with free factors. (The rank of the product map's image alone
# cannot test the count: any parametrisation that reaches every rank-$D$ matrix gives $2DE - D^2$.)

# %%
rows = []
for E_, D_ in [(6, 2), (8, 3), (10, 10), (12, 5)]:
    svd = svd_construction_rank(E_, D_, seed=seed)
    rows.append(
        {
            "E": E_,
            "D": D_,
            "2DE − D²": orthonormal_qk_dof(E_, D_),
            "rank, free factors": qk_product_rank(E_, D_, seed=seed).rank,
            "SVD: parameters": svd["parameters"],
            "SVD: independent constraints": svd["constraints"],
            "SVD: tangent dimension": svd["tangent_dim"],
            "SVD: rank on the tangent": svd["rank_on_tangent"],
            "identified share 1 − D/(2E)": qk_identified_fraction(E_, D_),
        }
    )
prod = pd.DataFrame(rows)
assert (prod["2DE − D²"] == prod["rank, free factors"]).all()
assert (prod["SVD: independent constraints"] == prod["D"] * (prod["D"] + 1)).all()
assert (prod["2DE − D²"] == prod["SVD: tangent dimension"]).all()
assert (prod["SVD: tangent dimension"] == prod["SVD: rank on the tangent"]).all()
table(prod, formats={"identified share 1 − D/(2E)": "{:.3f}"})

# %% [markdown]
# ## The identified fraction over heads and head sizes
#
# For a whole layer (QK and VO blocks, $C = D$, no biases) the unidentified count is $2HD^2$ of
# $4HDE$ weights, so the identified fraction is $1 - D/(2E)$, whatever $H$. With the usual
# $D = E/H$ it is $1 - 1/(2H)$ ({numref}`fig-heatmap`): more, smaller heads are better identified.
# The map depends on $H$ and $D$ only through $D/E$: the number of heads does not enter the fraction
# at all, only the head size relative to the width, and every cell of a column is the same.

# %%
E0 = 384
Hs = [1, 2, 3, 4, 6, 8, 12, 16]
Ds = [16, 32, 48, 64, 96, 128, 192, 384]
frac = pd.DataFrame(
    [
        [count(AttentionConfig(E0, H_, head_dim=D_)).identified_fraction for D_ in Ds]
        for H_ in Hs
    ],
    index=pd.Index(Hs, name="heads H"),
    columns=pd.Index(Ds, name="head dim D"),
)

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-heatmap", "caption": "Identified fraction 1 − D/(2E) of the attention weights at E = 384 over heads H and head size D; red cells are D = E/H, where it equals 1 − 1/(2H)."}}
fig, ax = plt.subplots(figsize=(7.5, 4.8))
sns.heatmap(
    frac,
    annot=True,
    fmt=".3f",
    cmap="viridis",
    cbar_kws={"label": "identified fraction"},
    ax=ax,
)
for i, H_ in enumerate(Hs):
    if E0 // H_ in Ds:
        ax.add_patch(
            plt.Rectangle((Ds.index(E0 // H_), i), 1, 1, fill=False, ec="red", lw=2)
        )
ax.set_title(f"Identified fraction of attention weights, E = {E0} (red: D = E/H)")
plt.show()

# %%
# regression guards, not checks: the closed form (attnid.counting) against the
# same formula written by hand; the Jacobian checks the closed form below
assert all(
    abs(frac.loc[H_, E0 // H_] - (1 - 1 / (2 * H_))) < 1e-12
    for H_ in Hs
    if E0 // H_ in Ds
)
assert np.allclose(
    frac.to_numpy(), 1 - np.array(Ds)[None, :] / (2 * E0)
)  # a function of D/E alone

# %% [markdown]
# ## Theory against the Jacobian
#
# The gold standard is numerical: at a random point, in float64, over enough random sequences, the
# number of unidentified directions is the number of parameters minus the rank of the Jacobian of
# all outputs with respect to all parameters. The table compares it with the closed form of
# `attnid.counting` and gives the singular-value gap that justified the rank decision.

# %%
grid = [
    AttentionConfig(8, 1),
    AttentionConfig(8, 2),
    AttentionConfig(8, 4),
    AttentionConfig(8, 8),
    AttentionConfig(12, 3, head_dim=2, value_dim=5),
    AttentionConfig(12, 2, head_dim=3, value_dim=3, causal=True),
]
if not small:
    grid += [
        AttentionConfig(16, 4, causal=True),
        AttentionConfig(16, 2, head_dim=4, value_dim=6),
        AttentionConfig(12, 6, causal=True),
        AttentionConfig(16, 8),
    ]
rows = []
for c in grid:
    r = audit(c, seed=seed, method="dense")
    th = count(c)
    rows.append(
        {
            "E": c.E,
            "H": c.H,
            "D": c.D,
            "C": c.C,
            "causal": c.causal,
            "params": r.total_params,
            "theory": th.unidentified,
            "Jacobian": r.unidentified,
            "sv gap": r.sv_gap,
            "unidentified share": r.unidentified / r.total_params,
            "1/(2H) (if D=C=E/H)": 1 / (2 * c.H)
            if c.D == c.C == c.E // c.H
            else np.nan,
        }
    )
jac = pd.DataFrame(rows)
assert (jac["theory"] == jac["Jacobian"]).all() and (jac["sv gap"] > 1e6).all()
glue("n_configs", len(jac), display=False)
table(
    jac,
    formats={
        "sv gap": "{:.1e}",
        "unidentified share": "{:.4f}",
        "1/(2H) (if D=C=E/H)": "{:.4f}",
    },
)

# %%
mh = jac[~jac["1/(2H) (if D=C=E/H)"].isna()]

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-share-vs-heads", "caption": "Unidentified share of the attention weights from the Jacobian rank at a random point (dots, D = C = E/H), against 1/(2H) (line)."}}
fig, ax = plt.subplots()
Hgrid = np.arange(1, 17)
ax.plot(Hgrid, 1 / (2 * Hgrid), "k-", label="1/(2H)")
ax.plot(
    mh["H"], mh["unidentified share"], "o", ms=9, label="Jacobian rank (random point)"
)
ax.set(
    xlabel="heads H",
    ylabel="unidentified share of weights",
    title="Unidentified share against the number of heads",
)
ax.legend()
plt.show()

# %% [markdown]
# ## What this chapter checked
#
# - $(SW_Q, S^{-\top}W_K)$ and $(W_O S^{-1}, S W_V)$ leave the outputs unchanged to $\le 10^{-10}$ for
#   $\kappa(S) \le 10^4$, and to round-off proportional to $\kappa(S)$ beyond (`tests/test_symmetry.py`).
# - Permutations, orthogonal matrices and compensating scalings are special cases, each leaving the output
#   unchanged to $10^{-10}$; in the rank-one case ($E = 1$) $2D - 1$ of $2D$ weights are unidentified.
# - Along the tangent the output changes with slope 2 in $t$, along a generic direction with slope 1.
# - The product map has rank $2DE - D^2$ with free factors, and the paper's SVD construction has
#   $D(D+1)$ independent constraints, a tangent space of dimension $2DE - D^2$ and full rank on it
#   (`tests/test_audit.py`).
# - The identified fraction is $1 - 1/(2H)$ at $D = E/H$, and the closed-form count equals the
#   Jacobian count on every configuration of the table (`tests/test_audit.py` runs a larger grid).
