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
# # The attention of recent models: QK-norm, soft-capping, latent attention
#
# The paper's count rests on the structure of dot-product attention: the scores see the query and key
# maps only through their product, so any invertible map between them is free, and the softmax
# ignores a shift that is the same for every key. Three changes made since 2024 touch exactly that
# structure. Qwen3, Gemma 3 and OLMo 2 put an RMSNorm on the queries and on the keys before the
# product (*QK-norm*); Gemma 2 caps the scores with $c \tanh(a/c)$ before the softmax
# (*soft-capping*); DeepSeek-V2 and V3 compute keys and values from a shared low-rank latent
# (*multi-head latent attention*). This chapter derives what each leaves unidentified, checks every
# count against the Jacobian rank of our layer and of the real `transformers` module, asks what
# the paper's conserved quantity becomes, and counts the published models' whole decoder layers,
# whose norms now also sit after the attention and the MLP.
#
# :::{admonition} In this chapter
# :class: tip
# All {glue:text}`n_variants` variants give exactly their closed form in our layer, and the
# {glue:text}`n_real` that a released module has give it in the real module too (singular-value gap at
# least {glue:text}`min_gap:.0e`); the others ({glue:text}`ours_only`) are checked on our layer only:
# {glue:text}`ours_only_reason`.
# QK-norm shrinks Qwen3-8B's unidentified query–key directions per layer from
# {glue:text}`qwen_qk_without:,` to {glue:text}`qwen_qk:,`. Gradient flow still conserves what the
# surviving symmetries protect: the largest rate of change is {glue:text}`max_exact_rate:.0e`
# at $\varepsilon = 0$, against at least {glue:text}`min_moved_scale_rate:.0e` for the norms'
# scales once $\varepsilon > 0$. One attention layer of DeepSeek-V3 leaves
# {glue:text}`v3_unidentified:,` directions unidentified ({glue:text}`v3_share:.1%`),
# {glue:text}`v3_latents:,` of them maps of its two latents; the whole model,
# {glue:text}`v3_model_unidentified:,`. Norms placed after the attention and the MLP (OLMo 2,
# Gemma) take away the residual stream's rotations, {glue:text}`qwen_rotation_share:.0%` of
# Qwen3-8B's whole count. The norms and gates of Llama 4, StableLM 2, Command R and Qwen3-Next (the last
# section) give their closed form in {glue:text}`ng_agree` of {glue:text}`ng_checks` Jacobian counts.
# :::

# %% tags=["parameters"]
profile = "cpu"
seed = 0
device = "auto"

# %%
from myst_nb import glue

from attnid.chapters import recent as ch
from attnid.lm.profiles import check_profile
from attnid.plotting import set_style, table

check_profile(profile)
set_style()
small = (
    profile == "smoke"
)  # the smoke profile audits our layer only, not the real modules

# %% [markdown]
# ## What an RMSNorm in front of the product leaves
#
# Write one head's normalised query as $q = g_Q \odot \mathrm{rms}(W_Q x)$ with
# $\mathrm{rms}(u) = u / \sqrt{\lVert u \rVert^2 / D + \varepsilon}$, and its key likewise with $g_K$.
# A change of $W_Q$ that keeps every score must keep $\mathrm{rms}(W_Q x)$ up to a map that the
# rest of the layer undoes. At $\varepsilon = 0$ the norm ignores a positive scale,
# $\mathrm{rms}(s\,u) = \mathrm{rms}(u)$, and commutes with orthogonal maps,
# $\mathrm{rms}(O u) = O\,\mathrm{rms}(u)$, and with nothing else. An orthogonal map would have to
# pass through the weights: $O^\top G_Q R_\delta G_K O' = G_Q R_\delta G_K$ for every RoPE rotation
# $R_\delta$ ($G = \mathrm{diag}(g)$). At $\delta = 0$ this reads $A\,M = M B$ with
# $M = G_Q G_K$ diagonal, whose solutions with skew $A, B$ vanish as soon as the products
# $g_{Q,i}\, g_{K,i}$ differ in size: generic norm weights leave no orthogonal symmetry. What is
# left:
#
# * **the scale** of each normalised projection ($W_Q^h$ with its bias, per head; $W_K^g$, per key
#   group): $H + G$ directions when each head is normalised alone, 2 when the norm spans the whole
#   projection (OLMo 2). Exact at $\varepsilon = 0$ only: with $\varepsilon > 0$ the scale moves the
#   output a little, which chapter 8 met for the norms of a block;
# * **the trade** of the query-norm weight against the key-norm weight: scaling $g_Q$ by $t$ and $g_K$
#   by $1/t$ keeps every score if $t$ is the same on the two coordinates of a rotated pair (RoPE mixes
#   them) — one factor per pair and per unrotated coordinate, $R/2 + (D - R)$. Qwen3 and Gemma 3
#   share one weight of size $D$ among all heads, so the trade appears once; OLMo 2 has a weight per
#   coordinate of the projection, and a key group's weight is shared by its query heads, so it
#   appears $G$ times;
# * the key bias, now inside the norm, no longer shifts a query's scores by a constant: identified.
#
# Soft-capping is simpler. $c \tanh(a / c)$ is one-to-one, so every map that keeps the raw scores keeps
# the capped ones, but adding $q^\top b_K$, the same for every key, to the raw scores is no shift of
# the capped ones: the key bias becomes identified, and nothing else changes.
#
# ## Every variant against the Jacobian
#
# The same layer ($E = 16$, $H = 2$ heads of $D = 8$), in each variant: the closed
# form of `attnid.counting.count` term by term, the Jacobian count of our own layer
# (`attnid.attention`), and that of the real `transformers` module (`attnid audit --hf TYPE`;
# float64, the norms and Gemma 2's eager softmax kept in float64). Gemma 2's row checks that the cap leaves
# every other symmetry in place; the cap's own effect, an identified key bias, shows only without RoPE on the
# key bias's directions, which no released module has, so the last two rows are our layer's alone.

# %%
variants = ch.variant_table(seed, real=not small)
table(variants)

# %% [markdown]
# ## Published models
#
# The QK block's unidentified directions in one layer of each published model with these features,
# and the same layer without its QK-norm or cap (`attnid count --preset NAME`); the published
# configurations have $\varepsilon = 10^{-6}$, so the norms' scales are not counted. The attention
# layer's unidentified share barely moves: the value–output block, which neither feature touches,
# holds almost all of it. The next section counts their decoder layers and whole models.

# %%
published = ch.published_table()
table(published)

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-recent-qk", "caption": "Unidentified directions of the query-key block in one layer of each published model with QK-norm or soft-capping, as released and without that feature (log scale)."}}
fig = ch.fig_published(published)

# %% [markdown]
# ## What gradient flow still conserves
#
# Chapter 6 followed the paper's $\beta = W_Q W_Q^\top - W_K W_K^\top$, which gradient flow conserves
# because of the $GL(D)$ symmetry of the product. Under QK-norm that symmetry is gone, and with it
# $\beta$. Each surviving symmetry has its own conserved quantity (Noether): the squared norm
# $\lVert [W \mid b] \rVert^2$ of each normalised projection (whose gradient is always orthogonal to
# it at $\varepsilon = 0$), and $\sum g_Q^2 - \sum g_K^2$ over each trade group. Their rates of
# change under gradient flow for a regression loss on a random layer
# (`attnid.dynamics.qk_norm_flow_rates`):

# %%
conservation = ch.conservation_table(seed)
table(conservation)

# %% [markdown]
# With $\varepsilon > 0$ the scales drift and only the trade is conserved. Plain SGD with step
# $\eta$ does not conserve the scales exactly even at $\varepsilon = 0$: a step orthogonal to $W$
# grows $\lVert W \rVert^2$ by $\eta^2 \lVert \nabla_W \rVert^2$, the familiar reason a normalised
# weight's effective learning rate falls as training goes on.

# %% [markdown]
# ## Multi-head latent attention
#
# DeepSeek-V2 and V3 compute keys and values from one latent $c = \gamma \odot \mathrm{rms}(W_{c} x)$
# of rank $r_{kv}$ shared by all heads, $k_h = W_{K}^h c$ and $v_h = W_{V}^h c$, queries likewise
# from a latent of rank $r_q$ (or straight from $x$), and give each score a second part with RoPE,
# $q_{h}^{\mathrm{rope}\top} R\, k^{\mathrm{rope}}$, whose key is one projection of $x$ shared by all
# heads. The paper's symmetries survive where the layer still has a product: $GL(d_{\mathrm{nope}})$
# per head on the position-free query–key part and $GL(d_v)$ per head on values and outputs. The
# rotary part is multi-query attention with RoPE: the commutant of the rotations,
# $d_{\mathrm{rope}}$ directions. New are the latents: any map $\mathrm{diag}(\gamma')\,O$ with $O$
# orthogonal acts on a latent ($O$ commutes with the norm, the up-projection undoes the rest), and at
# $\varepsilon = 0$ the down-projection's scale: $r(r-1)/2 + r\,(+1)$ per latent; the latent's norm
# weight is entirely unidentified. The small shapes are audited through transformers'
# `DeepseekV3Attention` (`attnid audit --hf deepseek_v3`); the published rows use the released
# configurations.
#
# DeepSeek-V3.2 keeps this layer and adds sparse attention: an indexer with queries of its own (from the query
# latent), one key per token (through a LayerNorm) and a weight per head scores every earlier key, and each query
# reads only the keys of its top-$k$ scores. The scores reach the output through that choice alone, and the choice
# is the same near almost every point, so no small change of an indexer weight moves the output: every parameter of
# the indexer is unidentified, as the choice bias of a router is, and the rest of the layer keeps the count above (a
# query that reads a chosen set of keys is a causal query with a mask). The real `DeepseekV32Attention` and its
# decoder layer agree on four shapes, with the indexer choosing four of eight keys, and a count that identifies the
# indexer is refused (`tests/test_sparse_attention.py`). Counted from its file, DeepSeek-V3.2-Exp's whole model has
# the total of the model `transformers` builds from the same fields.

# %%
mla = ch.mla_table(seed, real=not small)
table(mla)

# %% [markdown]
# ## Whole layers and models
#
# Chapter 8 counted decoder layers whose norms sit before the attention and the MLP. OLMo 2 puts
# them after each sub-layer, $h = x + N_1(\mathrm{attn}(x))$, and Gemma 2 and 3 on both sides,
# $h = x + N_2(\mathrm{attn}(N_1 x))$. A norm after a sub-layer changes three terms of chapter 8's
# count:
#
# * its weight writes to the residual stream, where nothing can undo it: no trade with the maps
#   that read it (a norm *before* a sub-layer gives $E$ directions, its weight against the columns
#   of its readers);
# * at $\varepsilon = 0$ it ignores the scale of what it normalises, so the attention's output map
#   and the MLP's down-projection each keep one free scale; with the released
#   $\varepsilon = 10^{-6}$ these are only near-null directions, as the norms' scales of chapter 8;
# * the whole model loses the stream's rotations: an orthogonal change of basis $Q$ of the stream
#   would have to pass through $Q\,\mathrm{diag}(\gamma)$, which no norm's output is. Qwen3-8B,
#   with its norms in front, keeps {glue:text}`qwen_rotations:,` of them; OLMo 2 and Gemma none.
#
# DeepSeek-V3 puts its norms in front, as Llama, and replaces the MLP of all but its first three
# layers with a mixture of 256 routed experts and one shared expert. Each expert keeps its own
# up/down rescaling ({glue:text}`v3_experts_rescaling:,` directions per layer); the router, whose
# sigmoid scores of the chosen experts are normalised to sum to one, has no shift or scale to give
# once two or more experts are chosen. The whole model leaves {glue:text}`v3_model_unidentified:,`
# parameters unidentified, {glue:text}`v3_model_share:.3%` of its parameters.
#
# Each structure is audited as a small decoder layer through its `transformers` class
# ({glue:text}`n_layer_audits` audits, `attnid presets --verify`; DeepSeek-V3's with four experts,
# two chosen per token): every Jacobian count equals its closed form, with a singular-value gap of at
# least {glue:text}`min_layer_gap:.0e`. `attnid count --preset NAME --scope model` prints the terms.

# %%
scopes = ch.scopes_table(seed, real=not small)
table(scopes)

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-recent-scopes", "caption": "Unidentified share of the parameters of each published model in one attention layer, one decoder layer and the whole model (log scale)."}}
fig = ch.fig_scopes(scopes)

# %% [markdown]
# The stream's rotations are {glue:text}`qwen_rotation_share:.0%` of Qwen3-8B's unidentified
# parameters. A model whose norms write to the stream leaves little beyond its layers: OLMo-2-7B
# {glue:text}`olmo_beyond_layers:,` directions (its final norm against the untied head, and the
# logit shift), Gemma-3-12B, whose head is its embedding, {glue:text}`gemma_beyond_layers:,`.

# %%
facts = ch.facts(variants, published, conservation, mla, scopes)
for name, value in facts.items():
    glue(name, value, display=False)

# %% [markdown]
# ## Sinks, NoPE layers, a capped head and routed experts: the models of 2025–2026
#
# Four more changes reach the structure the count rests on.
#
# **Attention sinks** (gpt-oss) give each head one learned logit $s_h$ in the softmax's denominator
# that no value reads: $P_{kq} = e^{a_{kq}} / (\sum_{k'} e^{a_{k'q}} + e^{s_h})$. A shift of one
# query's scores is no longer invisible, since it moves weight between the keys and the sink, so the key
# bias is identified even where RoPE leaves some of its coordinates unrotated. And a query's weights
# now sum to $1 - \pi_h(q) < 1$, which changes from query to query and from head to head:
# $\sum_h (1 - \pi_h(q))\, W_O^h b_V^g$ is no constant, so the output bias no longer absorbs the
# value bias. The query–key and value–output gauges keep the scores and $V P$, and stay as they were.
#
# **NoPE layers** (SmolLM3's every fourth layer, Llama 4's) drop RoPE, and with it the rotations that
# cut the query–key gauge down to their commutant: those layers have the whole $GL(D)$ per key group
# again, while the other layers keep the commutant. A model is counted layer type by layer type.
#
# **A soft-capped head.** Gemma 2 caps the logits, $c \tanh(z / c)$, before the softmax over the
# vocabulary. The softmax ignores a shift of the logits, but the cap does not pass one through:
# $c \tanh((z + a)/c)$ is no shift of $c \tanh(z / c)$. With an untied head, the $E$ directions that
# add one vector to every row of the head (the logit shift of chapter 8) are identified under the
# cap; a tied head had none to lose.
#
# **Routed experts.** A mixture's router turns its logits into the weights of the experts it chooses.
# DeepSeek-V3's sigmoid scores have nothing to give. A softmax over the logits (Mixtral, Qwen3-MoE)
# ignores a logit added to every expert, and so does the choice of the top ones: one vector added to
# every router row is free, $E$ directions a layer. gpt-oss's router has a bias, and one constant added
# to every bias is free too: $E + 1$. Its experts compute $(u + 1)\, z\,\sigma(\alpha z)$ from an
# up-projection $u$ and a gate $z$, both with biases: row $j$ of the up-projection with its bias can make
# $u_j + 1$ into $c\,(u_j + 1)$ while column $j$ of the down-projection takes $1/c$, one direction a
# unit as in any gated MLP; the gate $z\,\sigma(\alpha z)$ has no scale to give.
#
# The table sets each closed form beside the Jacobian count of our layer and of the real
# `transformers` module (gpt-oss's `GptOssAttention` with its sinks, SmolLM3's `SmolLM3Attention` in a
# NoPE layer, a one-layer Gemma 2 model with an untied head, and Mixtral's and gpt-oss's decoder layers
# with four experts, two chosen per token), with the mechanism and without it where it can be taken out.

# %%
from attnid.chapters import released as rel

mechanisms = rel.mechanism_table(seed, real=not small)
table(mechanisms)

# %% [markdown]
# All {glue:text}`n_agree` of {glue:text}`n_checks` Jacobian counts in the table equal their closed form.
# In the audited shape the sinks identify {glue:text}`sink_gain` more directions, the value bias's
# $G \cdot C =$ {glue:text}`sink_gc`; in one layer of gpt-oss-20b that is
# {glue:text}`gpt_oss_value_bias:,`. A NoPE layer leaves {glue:text}`nope_loss` more unidentified than
# its RoPE twin. The routers leave {glue:text}`mixtral_router` (Mixtral's softmax) and
# {glue:text}`gpt_oss_router` (gpt-oss's, with its bias) directions in these layers of width
# $E = 8$.
#
# ## Released files, as downloaded
#
# `attnid count --config` reads a model's `config.json` as its `transformers` config class reads it (so does
# {doc}`/counter`, in the browser, on a file you paste). Every
# field of a released file is read, or accepted because it cannot change the count (each with its
# reason, which the command prints: a generation cache, a dropout, `auto_map`, whose remote code is
# never read, or a field no code of the family reads at all), or holds the one value the library's code
# implements, or is refused by name. The
# copies under `data/configs/released` are released files as public sources hold them (beside them,
# each one's source and how faithful the copy is: byte for byte, or field for field).
# Of these {glue:text}`n_released` files, {glue:text}`n_counted_model` are counted at every scope, and
# their parameter totals are the published ones. SmolLM3-3B's whole model leaves
# {glue:text}`smollm3_share:.3%` of its parameters unidentified, its NoPE layers counted apart;
# gpt-oss-20b's, {glue:text}`gpt_oss_share:.3%`.

# %%
released = rel.released_table()
for name, value in rel.released_facts(mechanisms, released).items():
    glue(name, value, display=False)
table(released)

# %% [markdown]
# ## Known families in new clothes
#
# Several releases of 2025 name a model type of their own for a block the chapters above already count. OLMo 3 is
# OLMo 2's block with three sliding-window layers to each full-attention one, and a window of at least two tokens
# leaves the count of causal attention as it is. InternLM3 has a config class of its own, but `transformers` builds
# its model with Llama's code, so it is read as Llama. Command R7B and EXAONE 4 rotate queries and keys in their
# sliding-window layers only: their full-attention layers are NoPE layers, each with the whole $GL(D)$ query/key gauge
# of chapter 2, counted apart as SmolLM3's are. Each of these decoder layers equals the Jacobian rank of the real
# module on six shapes (`tests/test_blocks.py`), and each released file's whole-model total equals that of the model
# `transformers` builds from it (`tests/test_families.py`).
#
# One shape needs care. Behind a LayerNorm without a shift (Command R7B's), the norm's output $u = \gamma \odot \hat x$
# lies in the $E - 1$ dimensions orthogonal to $1/\gamma$, so every row of a map reading it has a free mean direction.
# In a NoPE layer whose key/value group holds one query head, the gauge $S = I + a b^\top$ leaves both maps unchanged
# on every such $u$ when $b$ is orthogonal to the values $W_Q u$ can take and $a$ to those of $W_K u$; with
# $D > E - 1$ that gives $(D - E + 1)^2$ gauge directions that are mean directions already counted. Only a one-head
# layer with $D = E$ meets it, by one direction: its real module's Jacobian shows it, and the closed form subtracts it.
#
# GLM-4.5 (and 4.6) and dots.llm1 put DeepSeek-V3's mixture of experts (chapter 8) around attention that chapter 4
# counts: GLM's has biases on its queries, keys and values and rotates half of each head; dots.llm1's is Qwen3's, with
# its QK-norm per head. Their router scores every expert with a sigmoid, lets a token choose only among the experts
# of its best groups, adds a bias that moves the choice and nothing else, renormalises the chosen scores and
# multiplies them by a fixed factor. The choice is constant near almost every input, so neither the groups nor the
# choice bias (a buffer, not a parameter) reaches the Jacobian; the fixed factor is taken up by the experts'
# down-projections; and a sigmoid has no shift or scale to give, so the router is identified, as DeepSeek-V3's is.
# What stays free is each expert's own rescaling, one direction per hidden unit of every routed and shared expert.
# Their real decoder layers agree with the closed form on six shapes each, and a closed form that forgets the shared
# expert is refused by the audit (`tests/test_families.py`). ERNIE 4.5's mixtures choose their experts with a softmax
# router, renormalised over the chosen ones as Mixtral's (so every router row takes the same added vector freely),
# and add a bias per expert to the scores they choose by, not to the weights they mix with. In transformers that bias
# is a parameter, so it counts among the model's parameters, and, since the choice it moves is constant near almost
# every input, all of it is unidentified: one direction per expert and mixture layer, which the real decoder layer's
# Jacobian shows and a closed form without them fails.
#
# Hunyuan-A13B normalises each head's queries and keys *after* RoPE, with one weight per norm shared by all heads. A
# rotation keeps the norm, so the scores are $\hat q_m^\top R_m^\top \operatorname{diag}(w_Q \odot w_K) R_n \hat k_n$:
# only the product of the two weights reaches them, coordinate by coordinate, and the weights trade once per
# coordinate, $D$ directions, where the norm before RoPE (Qwen3's) trades once per rotated pair. No rotation of a pair
# commutes with a generic $\operatorname{diag}(w_Q \odot w_K)$, so no gauge is left beside the trades and, at
# $\varepsilon = 0$, the projections' scales. The real layer's Jacobian agrees, and the closed form of the norm
# before RoPE is refused. Its mixture is Mixtral's softmax router beside one shared MLP as wide as each expert.
#
# **ReLU²** (Arcee's AFM) replaces the gated MLP by two maps around $\mathrm{relu}(z)^2$. It is positively
# homogeneous of degree two, $\mathrm{relu}(c z)^2 = c^2\, \mathrm{relu}(z)^2$ for $c > 0$, so a unit's up row times
# $c$ against its down column times $c^{-2}$ keeps the layer: one direction per unit, as a ReLU's or a gated unit's,
# and nothing else changes. Its real decoder layer agrees on five shapes and a tiny model on one
# (`tests/test_blocks.py`).
#
# **xIELU** (Apertus) goes the other way. Its two maps surround $a z^2 + b z$ for $z > 0$ and
# $a' (e^{z} - 1 - z) + b z$ below, with the curvatures $a$ and $a'$ parameters of each MLP and $b$ fixed. No power of
# a scale $c$ passes through both sides: $a$ could take up $c$ on the positive side, but the negative side is not
# homogeneous at all. So an Apertus unit keeps no scale of its own, and its two curvatures are identified: the MLP
# adds nothing to the block's count beyond its norm, and Apertus's layer counts as Llama's with a QK-norm per head,
# its unit rescalings gone. Its real decoder layer agrees on five shapes, and a count that gives each unit a ReLU's
# scale is refused. Apertus-8B's file (rebuilt from the fields public code quotes) counts
# {glue:text}`apertus_total:,` parameters, transformers' own total for the model built from it, its `qk_norm`,
# `post_norm` and `mlp_bias` read by no code of the family.
#
# **ALiBi** (BLOOM and Falcon RW; MPT too, whose model type attnid does not read) gives queries and keys no
# position map at all: it adds $-m_h (i - j)$ to head $h$'s score of query $i$ on key $j$, a fixed slope per head and
# no parameter. Every symmetry of a layer without a position map survives, since the added term holds neither a
# query nor a key: each head keeps the whole $GL(D)$ gauge $(S^\top q_i)^\top (S^{-1} k_j) = q_i^\top k_j$, and the
# key bias still drops out, since $q_i^\top b_K$ is the same for every key $j$ that query $i$ reads and the softmax
# ignores a constant. None is added, since the slopes are not weights. An ALiBi layer therefore counts as a NoPE layer,
# not as a RoPE layer: BLOOM's real attention and decoder layers agree with that closed form (six shapes), and a closed
# form that takes ALiBi for RoPE is refused (`tests/test_families.py`). Falcon RW's attention (`alibi = true`) is
# counted the same way. BLOOM's whole model is not counted: a LayerNorm on its token embeddings is a piece attnid's
# model count does not have, and the count says so by name.
#
# **Falcon** wires its layer by three switches of its file, and each wiring is one chapter 8 counts already.
# `parallel_attn` off gives GPT-2's sequential layer. On, Falcon-7B's one LayerNorm feeds attention and MLP side by
# side (Phi's wiring, where the single norm's scale and shift are shared by both readers). The new architecture of
# Falcon-40B and 180B gives each sub-layer a LayerNorm of its own (GPT-NeoX's), or one for both with
# `num_ln_in_parallel_attn = 1`, and shares keys and values by groups. A file is read into the wiring its code builds,
# the real layer's Jacobian agrees with that wiring's closed form (six shapes), and the closed form of the other
# wiring is refused. Counted from its file, Falcon-7B's whole model has its checkpoint's parameter total, and each
# wiring's total is that of transformers' own model built from the same fields. Falcon RW, with ALiBi, is counted at
# its attention.
#
# **M-RoPE** (Qwen2.5-VL's text layers) keeps RoPE's frequencies and turns each rotated pair by one of three
# position streams, time, height and width (`mrope_section` pairs each). Text tokens advance all three together, so on
# text the layer is a RoPE layer. On an image the streams part, but each pair still turns by its own frequency times
# a difference of positions, and the maps that commute with every such turn are RoPE's: one rotation and one scale
# per pair and key group, whichever stream turns it. So M-RoPE counts as RoPE, at a text's positions and at a
# multimodal map in which every stream moves: the real Qwen2.5-VL attention and decoder layer agree at both (four
# shapes; `attnid audit --hf qwen2_5_vl` at a text's positions), and a map in which one stream never moves is refused,
# since that stream's pairs then turn by nothing and keep the larger gauge of a layer without RoPE. A released
# Qwen2.5-VL file is read flat, as released, or nested, as transformers now saves it; its vision tower is not counted.
# Qwen3-VL's text layers are Qwen3's (a QK-norm per head) with the streams dealt to the pairs in turn rather than in
# three runs: time, height, width, time, and so on, height and width stopping after their `mrope_section` counts. That
# moves which stream turns a pair, never a pair's frequency, so the count is Qwen3's again; the real Qwen3-VL attention
# and decoder layer agree at a text's positions and at the multimodal map (four shapes), and refuse the RoPE count when
# a stream never moves. Its mixture models (`qwen3_vl_moe`, Qwen3-VL-30B-A3B) are Qwen3-MoE's layers with the same
# M-RoPE, and their code renormalises the chosen experts' weights whatever `norm_topk_prob` says (a field it never
# reads). Their released files write `tie_word_embeddings` beside `text_config`, and Qwen3-VL's inside it too; the
# library ties by the one beside it, so an inner one is accepted as a field no code reads. Where a file leaves the
# outer field out, the multimodal class's default ties the head, and where the text model's own field or default says
# otherwise (Mistral Small 3.1's file) the count is refused until the file says which tying its weights have.
#
# **A short convolution** (LFM2's layers that are not attention) mixes along time with no softmax at all: `in_proj`
# gives each channel $i$ three linear forms of the input, $B_i$, $C_i$ and $x_i$; the product $u_i = B_i x_i$ is
# convolved with the channel's own causal filter $w_i$, multiplied by $C_i$, and `out_proj` mixes the channels,
# $y = W_{\mathrm{out}} (C \odot (w \star u))$. Per channel, a factor on $B_i$'s row against its inverse on $x_i$'s
# keeps $u_i$, and factors on $u_i$, on the filter and on $C_i$'s row are taken back by `out_proj`'s column $i$: four
# directions per channel, $4E$ in all, with or without biases (each factor carries its row's bias). Nothing mixes two
# channels, since each filter is its own channel's. The real `Lfm2ShortConv` agrees on five shapes (one to four taps,
# with and without biases), and a closed form without the $B_i$/$x_i$ trade is refused. LFM2 interleaves these layers with
# attention ones; its whole model is counted below, layer kind by layer kind.
#
# **Mamba-2's mixer** (the state-space layers of Granite 4's hybrids, Falcon-H1, Zamba2 and Bamba) is not attention
# either. `in_proj` gives a gate $z$, the channels of $x$, $B$ and $C$ and a time step per head; each channel of $x$,
# $B$ and $C$ is convolved along time with its own short causal filter, plus a bias, and passed through SiLU. Head $h$
# then scans $s_t = e^{\Delta_t A_h} s_{t-1} + \Delta_t x_t B_t^\top$, $y_t = s_t C_t + D_h x_t$ with
# $\Delta_t = \mathrm{softplus}(dt_t + b_h)$, and `out_proj` reads $w \odot n(y \odot \mathrm{silu}(z))$, an RMSNorm
# over each group's channels. A channel's filter reads its `in_proj` row alone, before the filter's bias and the SiLU,
# so a factor on the row (and its bias) against its inverse on the filter keeps the function: one direction per
# convolved channel. The gated norm's weight trades with `out_proj`'s columns, one direction per inner channel, and
# with `in_proj` biases a head's time-step bias trades with $b_h$ (and, with a filter of one tap, a channel's two
# biases reach it only as a sum). Nothing else is free. The scan alone would allow a change of state basis,
# $B \to M^\top B$ and $C \to M^{-1} C$, as the $(S, S^{-\top})$ pair of attention does, but $B$ and $C$ leave a SiLU,
# through which only a permutation passes, and a permutation moves no parameter continuously; the time step leaves a
# softplus; the decay $A_h$ and the skip $D_h$ are read as they are. The real `Mamba2Mixer` and `Mamba2Block` agree on
# eight shapes (one to four taps, groups shared by heads or one per head, each bias on and off), and a closed form
# without the filters' trade is refused. One case adds directions: with two taps and both biases, a channel's two
# biases can trade at the first token alone, where $C_0$ is read only through
# $y_0 = (\Delta_0 B_0^\top C_0 + D_h)\,x_0$, one number per head times $x_0$. When each group of $B$ and $C$ serves
# one head, the gated norm removes that number at $\varepsilon = 0$, and one more direction per channel of $C$ is
# free; at $\varepsilon > 0$ it is only nearly free, and with a group shared by two heads not at all. Bamba, which stacks
# these layers with attention ones, is counted below, layer kind by layer kind.
#
# **Gated DeltaNet** (Qwen3-Next's layers that are not softmax attention) is a linear attention with a matrix state.
# Its queries, keys and values are convolved per channel and passed through SiLU, as Mamba-2's are; queries and keys
# are then normalised to unit length per head, and each value head writes with the delta rule,
# $S_t = e^{g_t} S_{t-1} (I - \beta_t k_t k_t^\top) + \beta_t v_t k_t^\top$, $o_t = S_t q_t$, with
# $\beta_t = \sigma(b_t)$ and a decay $g_t$ from a softplus; `out_proj` reads $w \odot n(o) \odot \mathrm{silu}(z)$.
# The convolved channels trade with their filters as before, one direction each. The norm's weight $w$ is one vector
# that all value heads share, so it trades with `out_proj`'s columns of one channel in every head together: one
# direction per value channel of a head, not per channel of the layer. Nothing else is free, for the same reasons as
# Mamba-2's. The real `Qwen3NextGatedDeltaNet` agrees on four shapes (key heads shared by value heads or one each,
# two to four taps), and a closed form that gives the norm a weight per channel of the layer is refused.
# Qwen3-Next's model, which stacks three of these layers to one of gated softmax attention, is counted below, layer
# kind by layer kind.
#
# The table below counts the released files of the families of this section (each transcribed field by field, its
# source named inside, under `data/configs/families`). GLM-4.5-Air's whole model leaves
# {glue:text}`glm_air_share:.3%` of its parameters unidentified, dots.llm1's {glue:text}`dots_share:.3%` and
# ERNIE-4.5-21B-A3B's {glue:text}`ernie_share:.3%`.

# %%
families = rel.families_table()
for name, value in rel.families_facts(families).items():
    glue(name, value, display=False)
table(families)

# %% [markdown]
# ## Hybrid models, layer kind by layer kind
#
# A hybrid model stacks attention layers and layers of another mixer, each wired as a pre-norm decoder layer,
# $h = x + \mathrm{mixer}(N_1 x)$, $y = h + \mathrm{mlp}(N_2 h)$, with RMSNorms and a gated MLP. A layer of the other
# kind leaves free its mixer's own directions (above), each norm's weight against the columns of the maps that read
# it ($E$ per norm: the mixer's input projections read $N_1$, the MLP's gate and up maps $N_2$), and the MLP's unit
# scales ($F$), as an attention layer does (chapter 8). Across layers nothing new appears: every mixer reads the
# stream through a norm and a linear map and writes to it through a linear map, so a rotation of the stream, its
# scale at $\varepsilon = 0$, the final norm against an untied head and the logit shift are free exactly as in a
# model of attention layers alone, and so the whole model's count is its attention layers' blocks, its other layers'
# blocks, and chapter 8's model-wide terms. The real `Lfm2ForCausalLM` (short convolutions) and `BambaForCausalLM`
# (Mamba-2) agree with that count on four shapes each, tied and untied, with and without the mixers' biases, at
# $\varepsilon = 0$ and $\varepsilon > 0$; a count that drops the short convolution's four scales per channel is
# refused, and so is one that counts the other layers as attention (`tests/test_hybrid.py`).
#
# Qwen3-Next puts a mixture of experts in every layer, of either kind: a softmax router (its logits' common shift is
# free, $E$ directions), each expert's unit scales, and a shared expert whose output is multiplied by
# $\sigma(g^\top x)$. That gate is identified: a sigmoid has no shift or scale to give, and no scale of the shared
# expert's output can pass through it. Its real decoder layer agrees on five shapes (`tests/test_blocks.py`), and its
# whole model, a Gated DeltaNet layer beside a gated softmax one, agrees too.
#
# Qwen3.5 (`qwen3_5`, and `qwen3_5_moe` for its mixtures) keeps Qwen3-Next's two kinds of layer, three Gated DeltaNet
# layers to each gated softmax one, with two changes. Its dense models give each layer one MLP instead of a mixture,
# and its softmax layers turn their rotated quarter of each head by Qwen3-VL's interleaved M-RoPE, which counts as RoPE
# (above). Its Gated DeltaNet writes the maps into the convolved channels, the gate and the decay as four matrices
# instead of two with each head's maps side by side: the same function, and its real layer agrees with the closed
# form on the same four shapes as Qwen3-Next's. Its real attention, decoder layer (five shapes each, dense and mixture)
# and whole models (three dense, one with experts) agree; a file's `attn_output_gate`, `mtp_*` fields (weights of a
# multi-token-prediction head the library does not load) and `mamba_ssm_dtype` are read by no code of the family, and
# a `full_attention_interval` beside `layer_types` is not read either (the class takes the kinds from the list).
#
# Granite 4's hybrids (`granitemoehybrid`) stack Mamba-2 layers and attention layers without RoPE, each with a mixture
# whose router takes a softmax over the chosen experts' logits (a shift common to every logit is still free, $E$
# directions) beside a shared MLP that every token passes (its own unit scales). Granite's fixed multipliers, on the
# embedding, the scores, each branch and the logits, are taken up by the weights beside them; its dense hybrids
# (no experts) keep the shared MLP alone. Its real attention, decoder layer (five shapes) and whole models (with and
# without experts) agree, and a model's total is that of the model `transformers` builds from the same file.
#
# One short-convolution layer of LFM2-1.2B leaves {glue:text}`lfm2_conv_layer:,` directions free, against
# {glue:text}`lfm2_attention_layer:,` for one of its attention layers; the whole model leaves
# {glue:text}`lfm2_share:.3%` of its parameters unidentified, Bamba-9B {glue:text}`bamba_share:.3%` (its
# untied head lets the stream rotate) and Qwen3-Next-80B-A3B {glue:text}`qwen_next_share:.3%`, where a Gated
# DeltaNet layer leaves {glue:text}`qwen_next_deltanet_layer:,` directions free against
# {glue:text}`qwen_next_attention_layer:,` for a softmax one (most of either, its 512 experts' unit scales).
# Qwen3.5-4B leaves {glue:text}`qwen3_5_share:.3%`, a Gated DeltaNet layer {glue:text}`qwen3_5_deltanet_layer:,`
# directions and a softmax one {glue:text}`qwen3_5_attention_layer:,`; Qwen3.5-35B-A3B
# {glue:text}`qwen3_5_moe_share:.3%`. `attnid count --scope attention` and `--scope block` on such a file count one
# attention layer and say so; `--scope model` counts every kind.

# %%
hybrids = rel.hybrid_table()
for name, value in rel.hybrid_facts(hybrids).items():
    glue(name, value, display=False)
table(hybrids)

# %% [markdown]
# ## Norms and gates of 2025–2026
#
# Five more changes come with Llama 4, StableLM 2, Command R and Qwen3-Next.
#
# **A QK-norm without a weight** (Llama 4's RoPE layers) divides each head's query and key by their
# root mean square, after the rotation. A rotation keeps the norm, so before or after is one function.
# What keeps every score: a scale of each head's projection (exact at $\varepsilon = 0$, $H + G$
# directions), and an orthogonal map $O$ applied to the queries and keys of a key group that commutes with
# every rotation $R_{n-m}$, since $(R_m O q)^\top R_n O k = q^\top O^\top R_{n-m} O k$. With distinct
# frequencies those are one plane rotation per rotated pair, and any orthogonal map of the unrotated
# coordinates: $R/2 + (D - R)(D - R - 1)/2$ per group. The $GL(D)$ of the paper shrinks to a group of
# rotations, because a norm keeps only maps that keep lengths.
#
# **A LayerNorm per head** on the queries and keys, without a shift and with a weight per head (StableLM 2
# 12B, Command R+), first removes each head's mean over its $D$ coordinates. Whatever a projection adds
# along the all-ones vector $\mathbf{1}$ of its head is gone: $W \to W + \mathbf{1} a^\top$ is free, $E$
# directions per query head and per key head (and one more per biased head, $b \to b + c\,\mathbf{1}$).
# At $\varepsilon = 0$ each projection's scale is free too. The weights trade as RMSNorm's do: a factor on a
# query weight against its inverse on the key weight, once per rotated pair and per unrotated coordinate
# and key group. Without RoPE there can be one more: the centred queries and keys live in a hyperplane of
# dimension $D - 1$, and an orthogonal map of it can move with the weight products. Counting unknowns,
# $(n + 1)(D - 1)(D - 2)/2 + nD$, against conditions, $n (D - 1)^2$, leaves exactly one when a key head
# serves one query head ($n = 1$) or heads have three dimensions, and none otherwise; the Jacobian agrees.
# Behind a block's LayerNorm with a shift, the shift gives every query and key an effective bias, but its
# component along $\mathbf{1}$ is centred away: those biases add nothing, and a biased reader row's mean
# direction (chapter 8) along $\mathbf{1}$ is the centring's own.
#
# **An output gate** (Qwen3-Next's softmax layers) multiplies head $h$'s mixture, channel by channel, by
# $\sigma(W_G^h x + b_G^h)$ computed from the query's input, before $W_O^h$. A map $S$ of the value channels
# survives only if $S^{-1} \operatorname{diag}(\sigma) S = \operatorname{diag}(\sigma)$ for every gate value,
# so $S$ is diagonal: the value–output gauge falls from $C^2$ to $C$ per key group. The gate's own weights
# are identified ($\sigma$ has no scale to give), and the value bias reaches the output as
# $\sum_h W_O^h (\sigma_h \odot b_V^g)$, which changes with the query, so it is identified even beside an
# output bias. Qwen3-Next's other layers (three of four) are linear attention, which is not softmax attention:
# they are counted as Gated DeltaNet layers, in the section on hybrid models above.
#
# **A LayerNorm without a shift** (Command R) feeds the attention and the MLP side by side. Without a shift
# there is no constant for a reader's bias to take back: every row of every map that reads the norm, biased or
# not, has its direction $W + a (1/\gamma)^\top$, which reads $\mathbf{1}^\top \hat x = 0$ (for the gated MLP,
# its gate and up rows). The rest of chapter 8's LayerNorm terms hold, except the value bias's constant, which
# needs a shift to exist.
#
# **Llama 4's experts.** Its router scores the experts with a linear map, keeps the top one, and scales that
# expert's *input* by the sigmoid of its logit, beside a shared expert every token passes. No shift or scale of
# the logits leaves the sigmoid unchanged, so the router is identified even with one expert chosen; each
# expert, and the shared one, keeps the up/down rescaling of a gated MLP. Its NoPE layers have no QK-norm and
# multiply the queries by a temperature that depends on the position only, which commutes with every map of
# $GL(D)$: the count of a NoPE layer holds. Its RoPE layers attend in chunks, a mask of at least two tokens,
# which leaves the count of causal attention.
#
# The table sets each closed form beside our layer's Jacobian count and the real module's (Llama 4's
# `Llama4TextAttention` in a RoPE and a NoPE layer, StableLM's with `qk_layernorm`, Qwen3-Next's gated
# attention), with the mechanism and with it taken out, and audits a Llama 4 and a Command R decoder layer
# whole.

# %%
gates = rel.norms_and_gates_table(seed, real=not small)
table(gates)

# %% [markdown]
# All {glue:text}`ng_agree` of {glue:text}`ng_checks` Jacobian counts in the table equal their closed form.
# In the released models below, one RoPE layer of Llama 4 Scout leaves {glue:text}`scout_rope:,`
# directions unidentified and a NoPE layer {glue:text}`scout_nope:,`. Qwen3-Next's gates cut the
# value–output directions of a full-attention layer from {glue:text}`qwen_next_vo_without:,` to
# {glue:text}`qwen_next_vo:,`. StableLM 2 12B's LayerNorm per head leaves {glue:text}`stablelm_qk:,`
# query–key directions unidentified, {glue:text}`stablelm_centring:,` of them the centring's;
# all told, {glue:text}`stablelm_share:.2%` of the layer.
# `attnid count --config` reads each family's `config.json`, and `attnid audit --config FILE --block`
# audits its layer through the real module.

# %%
released_layers = rel.norms_and_gates_models()
for name, value in rel.norms_and_gates_facts(gates, released_layers).items():
    glue(name, value, display=False)
table(released_layers)
