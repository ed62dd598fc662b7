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
# gap {glue:text}`sv_gap:.0e`). Change the parameters cell and this box follows.
# :::

# %% tags=["parameters"]
profile = "cpu"
seed = 0
device = "auto"
embed = 16  # E
heads = 4  # H
bias = "all"  # "none", "all" or letters from q,k,v,o
rope = False

# %%
import matplotlib.pyplot as plt
import numpy as np
from myst_nb import glue

from attnid import AttentionConfig, count
from attnid.audit import audit
from attnid.lm.profiles import check_profile
from attnid.plotting import set_style

check_profile(profile)
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
