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
# # Your model
#
# The earlier chapters count the unidentified directions of attention at *generic* parameters, for
# architectures typed in by hand. A researcher with a model of their own asks three further questions.
# How many directions of *my* model are unidentified? Does a *trained* layer sit at a generic point, or
# has training taken it somewhere special (a collapsed head) or close to it (identified directions so
# weak that no finite data set sees them)? And when two checkpoints differ, how much of the difference is
# real, and how much is motion along the symmetries that changes nothing? This chapter answers each with a
# tool that takes the model as it is saved: a `config.json`, a run folder, two sets of weights.
#
# :::{admonition} In this chapter
# :class: tip
# The {glue:text}`n_configs` shipped configs leave {glue:text}`share_min:.3%` to
# {glue:text}`share_max:.2%` of an attention layer's weights unidentified. Moves along the
# {glue:text}`n_symmetry_moves` symmetries of a trained layer shift its weights by at least
# {glue:text}`sym_min_weights:.1e` (relative) but its invariants by at most
# {glue:text}`sym_max_invariants:.0e`; moves that change the function shift the invariants by at
# least {glue:text}`ident_min_invariants:.0e`. {glue:text}`narrow_generic` of the
# {glue:text}`narrow_layers` layers of the narrow trained runs sit at the generic count, with their
# weakest identified direction at {glue:text}`narrow_weakest_min:.0e` to
# {glue:text}`narrow_weakest_max:.0e` of the strongest on the {glue:text}`narrow_tokens:,` validation tokens each
# audit read (a measure of those windows: more data, a larger value). By the end of chapter 6's training runs,
# the symmetry undoes {glue:text}`along_min:.0%` to {glue:text}`along_max:.0%` of the squared
# distance their attention layers moved.
# :::

# %% tags=["parameters"]
profile = "cpu"
seed = 0
device = "auto"
# your model: the fields of a config.json (a family attnid knows;
# a field it cannot count is refused by name)
my_config = {
    "model_type": "llama",
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
# chapter 6's runs audited by the certificate (about 15 s a layer on
# 2 cores, kept in each run's points.json): a list of optimizer cases
# ("sgd", "sgd_wd", "adamw", "adamw_rebalance"), True: all four,
# False: none; None: AdamW's at every profile but smoke
certify_chapter6 = None
# a transformers checkpoint of your own (the folder save_pretrained
# writes; a small one of a family attnid knows), audited at its
# trained weights; None: none
my_checkpoint = None

# %% tags=["hide-input"]
import torch
from myst_nb import glue

from attnid.chapters import md
from attnid.chapters import yourmodel as ch
from attnid.lm.data import load
from attnid.lm.launch import train_suites
from attnid.lm.profiles import check_profile
from attnid.plotting import set_style, table

check_profile(profile)
set_style()
certified = ch.certified_cases(profile, certify_chapter6)
train_suites(
    profile, ch.READS, device
)  # the runs this chapter reads that are not finished (the book trained them)
data = load()

# %% [markdown]
# ## How many directions of a released model are unidentified
#
# `attnid count --config PATH` reads a `config.json` (or the folder `save_pretrained` writes, or a model's
# name on the Hugging Face Hub, `ORG/NAME[@REVISION]`, of which only `config.json` is fetched) as the
# `transformers` class of its family reads it, so a field the file leaves out takes the library's own
# default, and counts the model at the scope asked for: one attention layer (chapters 1–5), one decoder
# layer with its norms and MLP (chapter 8), or the whole model with its embeddings (chapter 8). A
# field that the family's `transformers` code reads but attnid does not model (an attention variant, a
# bias the family's code adds, a norm placement) is refused by name rather than ignored (one that shapes
# only the decoder layer around the attention refuses the block and the model, not the attention); a
# field that no code of the family reads cannot change the function and is accepted, and so is a field
# that is read but cannot change the count (a generation cache, a dropout, `auto_map`, whose remote code
# is never read), each with its reason, which the command prints with the fields it read and the
# defaults it took.
# The book ships the architecture fields of each preset's released config in `data/configs/`; each
# reads back to its preset exactly (a test), so a preset and a reader's file take one path. Released
# files as published, read as they come, are in chapter 9.

# %% tags=["hide-input"]
shipped = ch.table_shipped_configs()
glue("n_configs", len(shipped), display=False)
glue("share_min", float(shipped["attention share"].min()), display=False)
glue("share_max", float(shipped["attention share"].max()), display=False)
table(shipped)

# %% [markdown]
# Edit `my_config` in the parameters cell (or pass it to papermill with `-p`) to count a model of your
# own; the same numbers come from `attnid count --config config.json --scope model`, or from pasting the
# file into {doc}`/counter`.

# %% tags=["hide-input"]
table(ch.table_your_config(my_config))

# %% [markdown]
# ## What a layer's data can identify: its invariants
#
# The counts say how many directions are free; `attnid.invariants` names what is fixed. For head $h$
# reading key/value group $g$, with $\tilde x = [x; 1]$ and the augmented maps $[W \mid b]$ of
# chapter 3, the data identify
#
# * the score form $M_h = [W_Q^h \mid b_Q^h]^\top [W_K^g \mid b_K^g]/\sqrt{D}$, without its last
#   column (the key bias's terms are the same for every key, and the softmax removes them); with RoPE,
#   two such forms per rotated pair, $A_i = Q_i^\top K_i$ and $B_i = Q_i^\top J K_i$, whose cosine and
#   sine mixture at each offset is the score; with QK-norm, the forms scaled by the norm weights and
#   the Gram forms of the normalised projections;
# * the value–output map $O_h = W_O^h W_V^g$;
# * the output bias the layer really adds, $b_O + \sum_h W_O^h b_V^g$.
#
# The list is complete: the layer's output is computed from these alone, and their Jacobian has
# exactly the rank of the identified directions in every variant of chapters 1–9 (tests). Heads are
# matched up to their permutation (within a key/value group, and the groups as wholes) before two layers
# are compared, which makes the distance between the invariants a distance *modulo the symmetry
# group*. Behind a LayerNorm, the norm's weight and bias are folded into the layer and its input maps
# projected onto the norm's hyperplane, so that trading scale between the norm and the layer, or moving
# a biased row across the hyperplane (chapter 8), moves nothing either.
#
# The table moves chapter 6's trained AdamW model along each symmetry, and along two directions that
# are not symmetries, and measures how far the weights, the invariants and the logits on validation
# text move.

# %% tags=["hide-input"]
model = ch.load_trained(profile, "adamw", seed=seed)
if model is None:
    model = ch.load_trained(
        profile, ch.POINTS_PREFIX + "adamw", seed=seed
    )  # the narrow twin keeps its weights
tokens, _ = data.batch(
    "val", 4, model.cfg.block_size, torch.Generator().manual_seed(seed)
)
moves = ch.table_moves(model, tokens)
for name, value in ch.moves_facts(moves).items():
    glue(name, value, display=False)
table(moves)

# %% [markdown]
# ## Does a trained layer sit at a generic point?
#
# Every count in this book holds for almost every parameter value. A trained layer is one particular
# value, chosen by an optimizer that the unidentified directions do not steer. `attnid audit --run DIR`
# takes a finished run's weights (`model.pt`, kept by default at the smoke and cpu profiles) and audits
# each attention layer there, on what the layer really reads: the residual stream entering it, through
# its LayerNorm, on validation text. It compares the Jacobian's rank with the generic count (the
# layer's own, plus one direction per biased query, key or value row that the LayerNorm's hyperplane
# adds) and reports the gap between kept and dropped singular values and the weakest identified
# direction relative to the strongest. A head whose query map lost rank $r < D$ would add
# $(D - r)(E - 1 - D)$ directions (`attnid.counting.collapsed_query_dims`; a planted collapsed head
# gives exactly that, a test).
#
# Chapter 6's layers have 16,640 parameters each, too many for the whole Jacobian; each of the four
# optimizer cases is therefore also trained at a width whose layers are audited exactly
# ($E = 16$, two heads: 1,088 parameters a layer), with the same profile otherwise.

# %% tags=["hide-input"]
narrow = ch.table_points(profile, data, seed=seed)
for name, value in ch.points_facts(narrow, "narrow").items():
    glue(name, value, display=False)
table(narrow.assign(case=narrow["case"].map(ch.CASE_LABELS)))
md(ch.points_sentence(narrow, "the narrow runs"))

# %% [markdown]
# Chapter 6's own runs are audited by the certificate of chapter 1 (AdamW's by default, half a minute on
# 2 cores; `certify_chapter6` names others): the known null directions are checked to be null, and the
# rest certified of full rank. Here $W_O$ is square ($HC = E$), so the
# layer's Jacobian is $W_O$ times one factor per key/value group; the rank of the product is the sum of
# the groups' ranks when $W_O$ is invertible, and each factor's rank is decided at its own scale (its
# smallest singular value above $10^{-9}$ of its largest). The weakest identified direction of the
# whole layer is then bounded from below by the product of the two weakest ones, which a trained,
# ill-conditioned $W_O$ pulls far down. A certificate that fails says *undecided*, with that bound.

# %% tags=["hide-input"]
if certified:
    wide = ch.table_points(profile, data, seed=seed, prefix="", cases=certified)
    table(wide.assign(case=wide["case"].map(ch.CASE_LABELS)))
    md(ch.points_sentence(wide, "chapter 6's " + ch.cases_named(certified)))
else:
    md(
        f"Not audited at the {profile} profile (`certify_chapter6`); "
        "`attnid audit --run DIR` audits a run."
    )

# %% [markdown]
# A checkpoint saved by `transformers` (`save_pretrained`) is audited the same way by
# `attnid audit --checkpoint DIR`: the folder's `config.json` is read as above, the model is loaded
# offline in float64, and each attention layer is audited on the hidden states its own model makes
# from random tokens. Whether those inputs lie on a hyperplane (a LayerNorm's) is read off the inputs
# themselves; inputs that span less than the width are refused, since the count would then describe
# the data. Set `my_checkpoint` in the parameters cell to audit one here.

# %% tags=["hide-input"]
if my_checkpoint is not None:
    table(ch.table_checkpoint(my_checkpoint, seed=seed))
else:
    md("No checkpoint given (`my_checkpoint`).")

# %% [markdown]
# ## How much of the weights' motion is motion along the symmetry
#
# Two layers are the same function exactly when their invariants agree, but the invariants are products
# of weights: their distance does not say how far, in the weights' own units, a layer moved for real.
# That is the distance from one set of weights to the *orbit* of the other under the symmetry group,
# $\min_g \lVert g\cdot\theta_t - \theta_0\rVert$, over every symmetry in the table above (the heads
# matched, an invertible query–key and value–output map per head, the bias moves, the norm's scale and
# hyperplane). `attnid.lm.points.orbit_distance` fits it (a local fit from a least-squares start: an upper
# bound, exact to 1e-8 on the moves of the table, a test). Runs that keep their weights also keep the
# attention layers' weights at every evaluation; {numref}`fig-motion` follows each optimizer case from
# initialisation, and the table gives the share of the squared distance that the symmetry undoes,
# $1 - (\text{orbit}/\text{weights})^2$, at the end of training.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-motion", "caption": "Chapter 6's optimizer runs of this build (profile and seed as set above): distance of the attention layers (weights and LayerNorm) from their initialisation over training, of the weights themselves and to the symmetry orbit of the weights at that step (Frobenius norm, mean over layers)."}}
frame = ch.motion_frame(
    profile, seed=seed, points=1 if profile == "smoke" else ch.MOTION_POINTS
)
fig = ch.fig_motion(frame)

# %% tags=["hide-input"]
motion = ch.table_motion(frame) if not frame.empty else frame
for name, value in ch.motion_facts(motion).items():
    glue(name, value, display=False)
if not motion.empty:
    table(motion.assign(case=motion["case"].map(ch.CASE_LABELS)))
md(ch.motion_sentence(motion))

# %% [markdown]
# ## Verdicts
#
# The chapter's two readings are claims of `attnid claims`, after the paper's, each with a test that
# plants a violation and sees its verdict turn to `no`: the narrow runs' layers sit at the generic count
# (a theorem check on exact audits: one seed decides), and weight decay moves SGD's weights along the
# symmetry (a statistic of training: three seeds).

# %% tags=["hide-input"]
table(ch.table_claims(profile))

# %% [markdown]
# ## Doing this for your own model
#
# * `attnid count --config path/to/config.json --scope attention|block|model`: the counts, term by term
#   (`--config ORG/NAME` for a model on the Hub; `pip install 'attnid[hub]'` is the counter alone, without torch;
#   in Python, `attnid.count_config`). {doc}`/counter` runs the same code in your browser on a file you paste,
#   with nothing to install.
# * `attnid audit --config path/to/config.json [--block]`: the family's real `transformers` module at the
#   config's structure and a small width, its Jacobian rank against the closed form.
# * `attnid audit --run DIR [--layer K]`: a trained attnid run at its trained weights (`attnid train`
#   keeps `model.pt` at the smoke and cpu profiles; `--save-model` elsewhere).
# * `attnid audit --checkpoint DIR [--layer K]`: a small `transformers` checkpoint at its trained
#   weights, each attention layer against the generic count on its own inputs.
# * `attnid.invariants.layer_invariants(cfg, params)` and `invariant_distance(a, b)`: the invariants of
#   any layer in the column form of chapter 1 (`attnid.attention.from_fused` and `from_torch_mha`
#   convert common layouts), and the distance between two layers modulo their symmetries.
