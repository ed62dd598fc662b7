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
# # Template: your own experiment
#
# Copy this file (`notebooks/template_experiment.py`) to start a new experiment. It is a complete,
# runnable chapter: a parameters cell that papermill can override, calls into `attnid`, one figure,
# and an assertion that makes the build fail if the result changes.
#
# Here it audits one attention layer: it counts the parameters with no effect on the output twice,
# from the closed form and from the rank of the Jacobian {cite:p}`morrow2026identification`.
#
# :::{admonition} In this chapter
# :class: tip
# The layer of the parameters cell has {glue:text}`total_params:,` parameters; the closed form and
# the rank of the Jacobian both find {glue:text}`unidentified:,` of them unidentified (singular-value
# gap {glue:text}`sv_gap:.0e`), and a random $(S W_Q, S^{-\top} W_K)$ leaves its output unchanged on
# {glue:text}`device`. Change the parameters cell and this box follows; `profile` sizes the layer.
# :::

# %% tags=["parameters"]
profile = "cpu"  # sizes the layer below (SIZES)
seed = 0
device = "auto"  # where the symmetry is checked: "auto", "cpu", "cuda"
embed = None  # E; None: the profile's size
heads = None  # H; None: the profile's size
bias = "all"  # "none", "all" or letters from q,k,v,o
rope = False

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
from myst_nb import glue

from attnid import AttentionConfig, attention, count, init_params
from attnid.audit import audit
from attnid.lm.profiles import check_profile, resolve_device
from attnid.plotting import set_style
from attnid.symmetry import transform_qk

# A fork sizes its work by the profile: (E, H) of the audited layer. The dense
# audit's cost grows as the square of the parameter count: about a second at
# cpu, a minute at paper on 2 cores
SIZES = {"smoke": (8, 2), "cpu": (16, 4), "mid": (24, 4), "paper": (32, 4)}
E, H = SIZES[check_profile(profile)]
embed = E if embed is None else embed
heads = H if heads is None else heads
dev = resolve_device(device)
set_style()
cfg = AttentionConfig(embed, heads, bias=bias, rope=rope, causal=True)
theory = count(cfg)
result = audit(cfg, seed=seed, method="dense")
print(f"{theory.total_params} parameters")
print(f"closed form: {theory.unidentified} unidentified")
print(f"Jacobian:    {result.unidentified} (singular-value gap {result.sv_gap:.1e})")
assert result.unidentified == theory.unidentified
glue("total_params", theory.total_params, display=False)
glue("unidentified", result.unidentified, display=False)
glue("sv_gap", result.sv_gap, display=False)

# the symmetry itself, on the chosen device: (S W_Q, S^-T W_K) leaves the
# layer's output unchanged
p = {k: v.to(dev) for k, v in init_params(cfg, seed=seed).items()}
g = torch.Generator().manual_seed(seed)
S = torch.randn(cfg.G, cfg.D, cfg.D, generator=g, dtype=torch.float64).to(dev)
# X: (batch, E, L), tokens are columns
X = torch.randn(2, cfg.E, 6, generator=g, dtype=torch.float64).to(dev)
change = (
    (attention(X, transform_qk(p, cfg, S), cfg) - attention(X, p, cfg))
    .abs()
    .max()
    .item()
)
print(f"on {dev}: largest output change under a random S: {change:.1e}")
assert change < 1e-8
glue("device", dev, display=False)

# %% mystnb={"figure": {"name": "fig-template-spectrum", "caption": "Singular values of the Jacobian of this experiment's layer, divided by the largest, with the rank the audit reads (dashed)."}}
sv = np.array(result.singular_values)
fig, ax = plt.subplots()
ax.semilogy(
    np.arange(1, len(sv) + 1), sv / sv[0], ".", label="singular values / largest"
)
ax.axvline(result.rank + 0.5, color="C3", ls="--", label=f"rank = {result.rank}")
ax.axhline(result.tol / sv[0], color="0.4", ls=":", label="tolerance")
ax.set(
    xlabel="index",
    ylabel="relative singular value",
    title=f"Jacobian spectrum, E={embed}, H={heads}",
)
ax.legend()
plt.show()
