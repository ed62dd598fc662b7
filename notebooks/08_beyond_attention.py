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
# # Beyond attention: whole blocks and models
#
# The paper counts the unidentified parameters of one attention layer. A trained model is more than
# its attention layers: each decoder layer wraps attention in norms, an MLP and residual connections,
# and the layers share one residual stream between an embedding and an output head. This chapter
# derives the exact number of unidentified directions of a whole decoder layer and of a whole causal
# language model, checks each count against the Jacobian rank of the real Hugging Face `transformers`
# classes, tabulates it for the published architectures, and sets it beside two recent papers that
# count symmetries of whole transformers.
#
# :::{admonition} In this chapter
# :class: tip
# Every one of the {glue:text}`n_block_audits` whole-layer audits and
# {glue:text}`n_model_audits` whole-model audits of the real modules gives exactly the closed form.
# GPT-2 small has {glue:text}`gpt2_model:,` unidentified directions, not the
# {glue:text}`gpt2_product:,` that a product of per-layer attention groups gives; in Llama-2-7B the
# rotations of the residual stream alone account for {glue:text}`llama_rotation:,` of its
# {glue:text}`llama_model:,` ({glue:text}`llama_rotation_share:.0%`), a symmetry no product of
# per-layer groups contains. Transformers' float32 RMSNorm blurs the rank: the gap between the null
# directions and the rest falls from {glue:text}`gap64:.0e` with float64 norms to
# {glue:text}`gap32:.0e`, too small for the audit to trust.
# :::

# %% tags=["parameters"]
profile = "cpu"
seed = 0
device = "auto"

# %%
from myst_nb import glue

from attnid.chapters import blocks as ch
from attnid.chapters import md
from attnid.lm.profiles import check_profile
from attnid.plotting import set_style, table

check_profile(profile)
set_style()
small = profile == "smoke"  # the smoke profile audits a subset of the shapes

# %% [markdown]
# ## Three scopes, every published architecture
#
# For each published architecture: the unidentified share of one attention layer (chapter 4), of one
# whole decoder layer, and of the whole model, from the closed forms derived below
# (`attnid presets`; `attnid count --preset NAME --scope model` gives the terms). Layers, MLP size,
# vocabulary and head tying come from each model's released configuration; the parameter totals
# reproduce the published ones (GPT-2 small 124,439,808; Llama-2-7B 6,738,415,616). **Verified**:
# the structure of the whole decoder layer (norms, attention with its sharing, biases and RoPE, MLP,
# residual) was built at $E = 8$ from the real `transformers` class and its Jacobian rank equals the
# closed form. A dash: attnid does not count that block (an encoder, or a type it cannot build).

# %%
rows, n_preset_audits = ch.preset_table_rows(
    small
)  # verifies the blocks on real modules
table(ch.table_presets(rows))

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-three-scopes", "caption": "Unidentified share of the parameters of each published architecture at three scopes: one attention layer, one whole decoder layer, and the whole model (log scale)."}}
fig = ch.fig_three_scopes(rows)

# %%
md(ch.scopes_sentence(rows))

# %% [markdown]
# ## A decoder layer has more freedoms than its attention
#
# Write a pre-norm decoder layer as $h = x + \mathrm{attn}(N_1 x)$,
# $y = h + \mathrm{mlp}(N_2 h)$ (GPT-2, OPT, Llama, Mistral, Qwen2), or, with a parallel residual,
# $y = x + \mathrm{attn}(N_1 x) + \mathrm{mlp}(N_2 x)$ (GPT-NeoX), possibly with one norm for both
# (Phi). Every direction below changes parameters and leaves $y$ unchanged for every input $x$.
#
# **Norm scale** ($E$ per norm). A norm's output is $\gamma \odot \hat x$ (plus $\beta$ for
# LayerNorm). Multiplying $\gamma_i$ by $c$ and dividing column $i$ of every map that reads the norm
# ($W_Q, W_K, W_V$, or the MLP's input maps) by $c$ changes nothing.
#
# **LayerNorm shift** ($E$ per LayerNorm). A reader sees $W(\gamma\odot\hat x + \beta) + b$: moving
# $\beta$ by $\delta$ and $b$ by $-W\delta$ changes nothing. When the reader has no bias of its own,
# the next direction takes its place, and the reader still behaves as if it had a free bias
# $W\beta + b$. So behind a LayerNorm the attention counts as one with query, key and value biases,
# and its key bias drops out of the softmax (chapter 3) even when the module has none.
#
# **LayerNorm's mean direction** (one per biased reader row). $\hat x$ has zero mean, so
# $\sum_i (\gamma\odot\hat x + \beta)_i / \gamma_i = \sum_i \beta_i/\gamma_i$ is the same constant
# $c_0$ for every token. Adding $a\,(1/\gamma)^\top$ to $W$ moves $W(\cdot) + b$ by the constant
# $a c_0$, which the bias takes back. Every row of every biased reader has this freedom: $H D + G D
# + G C$ for the attention, $F$ for the MLP's input map.
#
# **MLP rescaling** ($F$ for ReLU and SwiGLU, none for GELU). $\mathrm{relu}(cz) = c\,\mathrm{relu}(z)$
# for $c > 0$: row $j$ of the input map and its bias against column $j$ of the output map. In SwiGLU,
# $\mathrm{silu}(g_j)\, u_j$ is linear in the up-projection $u_j$: its row against the down column.
#
# **Output biases on one stream.** In a parallel block $b_O$ and the MLP's output bias both add to
# $y$: $E$ directions. In a sequential block with LayerNorm, $b_O$ also feeds $N_2$, which removes the
# mean of $h$: only $b_O + t\mathbf 1$, $b_{\mathrm{mlp}} - t\mathbf 1$ survives, one direction.
# Without LayerNorm (RMSNorm divides by $\lVert h\rVert$, it does not subtract a mean) none.
#
# Together (`attnid.counting.count_block`):
#
# $$
# u_{\text{block}} = u_{\text{attn}}^{\text{eff}} + nE + n_{\text{LN}}E
#   + [\text{LN}]\,(r_{\text{attn}} + r_{\text{mlp}}) + [\text{ReLU, SwiGLU}]\,F + u_{\text{out}},
# $$
#
# with $n$ norms, $u_{\text{attn}}^{\text{eff}}$ the attention count of chapters 2–4 with the
# effective biases, $r$ the biased reader rows and $u_{\text{out}} \in \{0, 1, E\}$. Two of these
# overlap with the attention's own freedoms only in appearance: the effective key bias is one set of
# directions whether it comes from $b_K$ or from $W_K\beta$ (counted once, in the attention term), and
# the value bias's constant output is absorbed by whichever output bias sits on the same stream
# (counted once, in the attention's value-bias term).
#
# Two of these freedoms, checked on the real GPT-2 layer in float64:

# %%
table(ch.gpt2_block_moves(seed))  # raises unless the moves behave as derived

# %% [markdown]
# ### The Jacobian of every real decoder layer agrees
#
# For each model type, a few shapes (multi-, grouped- and multi-query attention where the type has
# them, partial RoPE, $F \ne 4E$, one head, with and without biases), audited as one whole layer of the
# real `transformers` class in float64 with sdpa's math kernel (`attnid audit --hf TYPE --block`).
# The test suite runs six shapes per type.

# %%
cases = ch.BLOCK_CASES[::4] if small else ch.BLOCK_CASES
blocks = ch.table_block_audits(
    cases, seed
)  # raises if one differs from its closed form
glue("n_block_audits", len(blocks) + n_preset_audits, display=False)
table(blocks)

# %% [markdown]
# The columns `qk` to `value_bias` are the attention's terms (with the effective biases), the rest the
# block's. OPT without biases still loses its whole key bias: the LayerNorm's shift gives the keys a
# bias the module does not have. The gap is the ratio of the smallest kept to the largest dropped
# singular value; every count is read off a gap of at least $10^6$.
#
# ## Whole models: the residual stream
#
# A whole causal language model adds token embeddings (and, for GPT-2 and OPT, learned positions),
# a final norm and the output head, read through `log_softmax`. Each layer's freedoms remain, and
# the shared residual stream adds its own (`attnid.counting.count_model`):
#
# - **Rotations of the stream.** Turn the stream by an orthogonal $Q$: every writer (embedding, $W_O$,
#   the MLP's output map, their biases) becomes $QW$ and every reader, once the norms' $\gamma$ has
#   been moved into it, $WQ^\top$. RMSNorm keeps $\lVert x\rVert$: $E(E-1)/2$ directions. LayerNorm
#   also needs $Q\mathbf 1 = \mathbf 1$: $(E-1)(E-2)/2$. This is the "computational invariance" that
#   SliceGPT {cite:p}`ashkboos2024slicegpt` and QuaRot {cite:p}`ashkboos2024quarot` rotate by, and
#   it holds for any $\epsilon$. With a tied head it is gone: the final norm's $\gamma$ would have to
#   commute with $Q$.
# - **Scale of the stream.** $x \to cx$ with every writer scaled: exact only when the norms'
#   $\epsilon = 0$ (one direction).
# - **The final norm and the head**: $E$ for its $\gamma$, with LayerNorm $E$ for its shift and, with a
#   head bias (Phi), one mean direction per vocabulary row; `log_softmax` ignores a constant over the
#   vocabulary, so the same vector added to every head row is invisible ($E$).
# - **LayerNorm removes the stream's mean**, so every writer column's component along $\mathbf 1$ is
#   invisible to all later layers: $HC + F$ per layer plus one per output bias (less the one the block
#   already counts), $V$ for an untied embedding, one per position row; and token rows $+a$ with
#   position rows $-a$ leave the stream unchanged ($E-1$ new directions; $E$ with a tied head, where
#   it also shifts every logit by the same amount). The same holds for the constant the attention adds
#   when no output bias takes it (OPT without biases): the norm's shift gives the values an effective
#   bias $b$, every token receives $\sum_h W_O^h b_h$, and the one $b$ that makes this sum a multiple
#   of $\mathbf 1$ is invisible to every later norm (one per layer, when $GC \ge E$).
#
# Audited on tiny whole models of each type ($E = 8$; one or two layers; norms at $\epsilon = 0$; OPT
# with seed 1, because at seed 0 one ReLU unit of its first layer never switches on the audit's
# tokens and the audit refuses to count it):

# %%
cases = [ch.MODEL_CASES[0], ch.MODEL_CASES[3]] if small else ch.MODEL_CASES
models = ch.table_model_audits(cases, seed)
glue("n_model_audits", len(models), display=False)
table(models)

# %% [markdown]
# In a parallel block the first layer's MLP reads the token embedding alone, so a tiny model sees it
# at only $V$ points; the audits of GPT-NeoX and Phi use $V = 3F$ tokens so that it is identified (a
# published vocabulary is far larger than that).
#
# ### The spectrum, and two ways to blur it
#
# The singular values of a small Llama's Jacobian (two layers, one in the smoke profile; vocabulary
# 24), divided by the largest:
# exact float64 norms at $\epsilon = 0$; the same at $\epsilon = 10^{-6}$, where the stream's scale is
# no longer a symmetry; and `transformers`' own RMSNorm, which computes in float32 whatever its input.

# %%
spectra = ch.llama_spectra(small, seed)  # three whole-model audits
glue("gap64", spectra.gap(ch.E0), display=False)
glue("gap32", spectra.gap(ch.F32), display=False)

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-llama-spectrum", "caption": "The smallest singular values of the Jacobian of a tiny whole Llama (divided by the largest) with exact float64 norms at ε = 0 and ε = 1e-6, and with transformers' float32 RMSNorm; grey, the near-null band."}}
fig = ch.fig_llama_spectrum(spectra)

# %%
table(ch.table_spectra(spectra))

# %%
md(ch.spectrum_sentence(spectra))

# %% [markdown]
# ## Against the product of per-layer groups
#
# {cite:t}`gauge2025complete` characterise the gauge group of multi-head attention as
# $((GL(d_k))^h \times (GL(d_v))^h) \rtimes S_h$ (the RoPE commutant in place of $GL(d_k)$), state
# that the group of a whole model is the product of its layers' groups, and from that count "over 1.1
# million" redundant dimensions in a 110M-parameter Transformer Base. {cite:t}`fibers2026generic`
# prove that generic multi-head attention has no symmetries beyond the known ones and give its
# functional dimension. Both agree with the attention-layer counts of chapters 2–4 (the per-layer
# group is the `qk` + `vo` terms without biases). The table counts GPT-2 small and Llama-2-7B both
# ways.

# %%
compare = ch.table_compare()
for name, value in ch.compare_facts(compare).items():
    glue(name, value, display=False)
table(compare)

# %%
md(ch.compare_points(compare))
