"""Closed-form counts beyond one attention layer (book chapters 8–9): one decoder layer (:class:`BlockConfig`,
:func:`count_block`: norms, the MLP, residual wiring, routers of a mixture of experts) and a whole causal model
(:class:`ModelConfig`, :func:`count_model`: embeddings, positions, the output head), term by term on top of the
attention counts of :mod:`attnid.counting.attention`."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..attention_config import AttentionConfig
from .attention import Count, MLAConfig, count, count_mla


def layer_gauge_dims(cfg: AttentionConfig) -> int:
    """Dimension of one layer's attention gauge group without biases: ``(GL(D))^G x (GL(C))^G``, with RoPE
    the rotations' commutant in place of ``GL(D)`` (``H(D² + C²)`` for plain multi-head attention). A
    whole model's count as a product of these per-layer groups is ``layers x`` this (chapter 8)."""
    return count(cfg.with_(bias="")).unidentified


NORMS = ("layer", "rms", "layer_noshift")  # LayerNorm with a shift; RMSNorm (a scale only); LayerNorm, no shift
# GELU-like (no continuous symmetry), ReLU, gated (SiLU or GELU gate), and gpt-oss's gated unit with biases,
# (up x + b + 1) * g(gate x + b') with g(z) = z σ(α z), its inputs clamped (a clamp inactive at generic points)
MLPS = ("gelu", "relu", "swiglu", "geglu", "swiglu_biased", "xielu")
# xIELU's own parameters in each MLP (Apertus): its two curvatures, alpha_p and alpha_n, identified. It is a z² + b z
# above 0 and a' (e^z − 1 − z) + b z below, with no power of a scale c to give on both sides: no unit rescaling
XIELU_PARAMS = 2
GATED_MLPS = ("swiglu", "geglu", "swiglu_biased")  # three maps, act(gate x) * (up x) read by down
BIASED_GATED_MLPS = ("swiglu_biased",)  # the gated MLPs with biases on every map
RESIDUALS = ("sequential", "parallel", "shared_norm")
# where a block's norms sit: before each sub-layer (GPT-2, Llama), after it, before the residual sum (OLMo 2),
# or both (Gemma 2 and 3)
NORM_POSITIONS = ("pre", "post", "sandwich")
SCOPES = ("attention", "block", "model")  # one attention layer, one decoder layer, a whole model
# how a mixture's router turns its logits into the chosen experts' weights (a softmax one with or without a bias)
ROUTERS = ("sigmoid", "softmax", "softmax_biased")


@dataclass(frozen=True)
class BlockConfig:
    """One decoder layer: ``attention`` (an :class:`~attnid.attention.AttentionConfig`, or an :class:`MLAConfig`
    for latent attention), an MLP of inner size ``ffn``, its norms.

    ``residual``: ``"sequential"`` (``h = x + attn(N₁ x)``, ``y = h + mlp(N₂ h)``: GPT-2, OPT, Llama),
    ``"parallel"`` (``y = x + attn(N₁ x) + mlp(N₂ x)``: GPT-NeoX) or ``"shared_norm"`` (one norm for
    both: ``y = x + attn(N x) + mlp(N x)``: Phi). ``mlp_bias``: biases on both MLP maps.
    ``norm_position`` (sequential RMSNorm blocks only for ``"post"`` and ``"sandwich"``): ``"pre"`` as above,
    ``"post"`` (``h = x + N₁(attn(x))``, ``y = h + N₂(mlp(h))``: OLMo 2) or ``"sandwich"``
    (``h = x + N₂(attn(N₁ x))``, ``y = h + N₄(mlp(N₃ h))``: Gemma 2 and 3). ``norm_eps_zero``: the norms' ε
    is 0 (a norm after a sub-layer then ignores that sub-layer's scale). ``experts``: 0 for one MLP; ``k ≥ 1``
    for a mixture of ``k`` routed gated experts (``k = 1`` with a sigmoid router only) of inner size ``ffn`` with
    a linear router (``k x E``), plus shared experts of total inner size ``shared_ffn`` (DeepSeek-V3, Llama 4).
    A sigmoid router is identified when its scores are normalised over two or more chosen experts (DeepSeek-V3
    chooses eight: with one, the normalised weight would be 1 whatever its scores), or when the score itself scales
    the chosen expert (Llama 4: one expert, its input times ``σ(logit)``). ``router``: ``"sigmoid"`` (DeepSeek-V3,
    Llama 4) or ``"softmax"`` (Mixtral, Qwen3-MoE: a softmax over all ``k`` logits, the top ones kept, renormalised
    or not), whose weights ignore a shift of every logit: the same vector added to each router row is free (``E``),
    or ``"softmax_biased"`` (gpt-oss: a router with a bias, a softmax over the chosen logits): ``E + 1``.
    ``choice_bias``: a parameter per expert added to the router's scores for the choice of experts only (ERNIE 4.5's
    ``e_score_correction_bias``): the choice is constant near almost every input, so its ``experts`` entries reach no
    output. ``shared_gate``: the shared experts' output times ``σ(g·x)`` (Qwen3-Next), ``E`` parameters; a sigmoid has
    no shift or scale to give, and the shared experts' output has no scale the gate could take back: identified.
    """

    attention: AttentionConfig | MLAConfig
    ffn: int
    norm: str = "layer"
    mlp: str = "gelu"
    mlp_bias: bool = True
    residual: str = "sequential"
    norm_position: str = "pre"
    norm_eps_zero: bool = False
    experts: int = 0
    shared_ffn: int = 0
    router: str = "sigmoid"
    choice_bias: bool = False
    shared_gate: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.attention, (AttentionConfig, MLAConfig)):
            raise TypeError(f"attention: expected an AttentionConfig or MLAConfig, got {type(self.attention).__name__}")
        for name, lo in (("ffn", 1), ("experts", 0), ("shared_ffn", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
        for name, value, allowed in (("norm", self.norm, NORMS), ("mlp", self.mlp, MLPS),
                                     ("residual", self.residual, RESIDUALS),
                                     ("norm_position", self.norm_position, NORM_POSITIONS)):  # fmt: skip
            if value not in allowed:
                raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
        self._check_structure()

    def _check_structure(self) -> None:
        """Refuse the combinations no closed form here was derived and checked for."""
        self._check_mlp_biases()
        if self.norm_position != "pre" and (self.norm != "rms" or self.residual != "sequential"):
            raise ValueError(
                f"norm_position: a {self.norm_position}-norm block is counted with RMSNorm and a sequential "
                "residual only"
            )
        if self.norm == "layer_noshift" and (self.residual != "shared_norm" or self.experts):
            raise ValueError("norm: a LayerNorm without a shift is counted in a shared-norm parallel block (Command R)")
        if (self.experts or self.shared_ffn) and (self.mlp not in GATED_MLPS or self.norm_position != "pre"):
            raise ValueError("experts: a mixture of experts is counted with gated experts in a pre-norm block only")
        if self.experts == 1 and self.router != "sigmoid":
            raise ValueError("experts: a softmax router over one expert gives it weight 1 whatever its logits; attnid "
                             "counts a softmax router over two or more experts (a sigmoid router that scales its one "
                             "expert, as Llama 4's, is counted)")  # fmt: skip
        if self.shared_ffn and not self.experts:
            raise ValueError("shared_ffn: shared experts belong to a mixture of experts (experts >= 1)")
        if (self.choice_bias and not self.experts) or (self.shared_gate and not self.shared_ffn):
            raise ValueError(
                "choice_bias, shared_gate: a bias that chooses experts belongs to a mixture of experts "
                "(experts >= 1), a gate on the shared experts to a mixture with them (shared_ffn >= 1)"
            )
        if self.router not in ROUTERS:
            raise ValueError(f"router: expected one of {', '.join(ROUTERS)}, got {self.router!r}")
        if isinstance(self.attention, MLAConfig):
            if self.norm != "rms" or self.norm_position != "pre" or self.residual != "sequential":
                raise ValueError("attention: latent attention is counted in a sequential pre-norm RMSNorm block only")
        elif self.attention.rope and self.attention.D > self.attention.E:
            raise ValueError("head_dim: counting with RoPE assumes D <= E")

    def _check_mlp_biases(self) -> None:
        """Refuse MLP biases the MLP kind counted here does not have (or lacks where it has them)."""
        if self.mlp == "xielu" and self.mlp_bias:
            raise ValueError("mlp_bias: the xIELU MLP counted here (Apertus's) has no biases")
        if self.mlp in GATED_MLPS and self.mlp_bias != (self.mlp in BIASED_GATED_MLPS):
            has = "biases" if self.mlp in BIASED_GATED_MLPS else "no biases"
            raise ValueError(f"mlp_bias: the gated ({self.mlp}) MLPs counted here have {has}")

    @property
    def E(self) -> int:
        return self.attention.embed if isinstance(self.attention, MLAConfig) else self.attention.E

    def mlp_params(self) -> int:
        E, F = self.E, self.ffn
        maps = 3 if self.mlp in GATED_MLPS else 2
        if self.experts:  # routed experts, shared experts, router (with their biases)
            biases = self.experts * (2 * F + E + 1) if self.mlp_bias else 0
            choice = self.experts if self.choice_bias else 0
            gate = E if self.shared_gate else 0
            return maps * E * (self.experts * F + self.shared_ffn) + self.experts * E + biases + choice + gate
        return maps * E * F + ((F + E) if self.mlp_bias else 0) + (XIELU_PARAMS if self.mlp == "xielu" else 0)

    def norms(self) -> tuple[int, int]:
        """``(before, after)``: how many norms read a sub-layer's input, and how many normalise its output."""
        if self.norm_position == "post":
            return 0, 2
        if self.norm_position == "sandwich":
            return 2, 2
        return (1 if self.residual == "shared_norm" else 2), 0

    def norm_params(self) -> int:
        per_norm = 2 * self.E if self.norm == "layer" else self.E  # a shift-free LayerNorm: its weight only
        return per_norm * sum(self.norms())


def effective_attention(block: BlockConfig) -> AttentionConfig:
    """The attention layer a block's output actually depends on (chapter 8).

    Behind a LayerNorm ``N(x) = γ ⊙ x̂ + β`` every reader ``W`` sees ``W diag(γ) x̂ + (W β + b)``: a free
    effective bias whether or not the reader has one, so the query, key and value maps count as biased.
    A constant added to the attention output is absorbed by the output bias, or, in a parallel block, by
    the MLP's output bias on the same stream: the value bias then counts as absorbed. Behind a LayerNorm per head on
    queries and keys (``qk_norm = "layer"``) the effective query and key biases ``W β`` only add to the directions the
    centring already frees (``W + 1 aᵀ``): they count as biased only where the maps have biases of their own."""
    cfg = block.attention
    if not isinstance(cfg, AttentionConfig):
        raise TypeError("effective_attention: latent attention has no biases and sits behind RMSNorm: use it as is")
    letters = set(cfg.bias)
    if block.norm == "layer":  # a LayerNorm per head on queries and keys centres their effective biases away
        letters |= set("v" if cfg.qk_norm == "layer" else "qkv")
    if block.residual != "sequential" and block.mlp_bias:
        letters.add("o")
    return cfg.with_(bias="".join(c for c in "qkvo" if c in letters))


def _attention_terms(block: BlockConfig) -> tuple[dict[str, int], dict[str, int]]:
    """``(unidentified, params)`` by term of a block's attention: :func:`count_mla`, or :func:`count` of
    :func:`effective_attention` (its parameters those of the attention as built)."""
    cfg = block.attention
    if isinstance(cfg, MLAConfig):
        attn = count_mla(cfg)
        return dict(attn.unidentified_by_block), dict(attn.params_by_block)
    if block.norm == "layer" and block.residual == "sequential" and ("o" in cfg.bias) != block.mlp_bias:
        # only one output bias behind a mean-removing norm: part of the value bias's constant is absorbed
        # along 1 only; no model type attnid builds has this, so no closed form was checked against it
        raise ValueError("block: a sequential LayerNorm block with one output bias has no checked closed form")
    return dict(count(effective_attention(block)).unidentified_by_block), dict(count(cfg).params_by_block)


def biased_reader_rows(cfg: AttentionConfig) -> int:
    """Rows of the query, key and value maps of ``cfg`` that carry a bias: behind a LayerNorm (inputs on the
    hyperplane ``Σ (x_i − β_i)/γ_i = 0``) each is one more unidentified direction, ``W + a (1/γ)ᵀ`` with the
    bias taking back the constant (``norm_mean`` of :func:`count_block`; chapter 10 at trained points). Behind a
    LayerNorm per head on queries and keys, one of a head's directions (``a ∝ 1``) is the centring's ``W + 1 aᵀ``,
    which :func:`count` has: one less per biased query and key head."""
    centred = (cfg.H * ("q" in cfg.bias) + cfg.G * ("k" in cfg.bias)) if cfg.qk_norm == "layer" else 0
    return (
        (cfg.H * cfg.D if "q" in cfg.bias else 0)
        + (cfg.G * cfg.D if "k" in cfg.bias else 0)
        + (cfg.G * cfg.C if "v" in cfg.bias else 0)
        - centred
    )


def collapsed_query_dims(cfg: AttentionConfig, rank: int, *, hyperplane_inputs: bool) -> int:
    """Unidentified directions one head gains when its query map, on the span of its (augmented) inputs, has
    rank ``rank < D`` instead of ``D``: ``(D − rank)(E_k − D)``, with ``E_k`` the dimensions of the key
    inputs that the scores see (``E``, one less on a LayerNorm's hyperplane; the constant one is lost to the
    softmax). The differential of ``(A, B) ↦ AᵀB`` at rank ``r`` has image ``E_q D + r E_k − r D`` (rows in
    ``B``'s row space plus columns in ``Aᵀ``'s column space, less their intersection), so the head leaves
    ``D E_k − r (E_k − D)`` unidentified, ``D²`` at ``r = D`` (chapter 10). Needs biased keys and queries, and
    no RoPE."""
    if not ("q" in cfg.bias and "k" in cfg.bias):
        raise ValueError("collapsed_query_dims: derived for a layer with query and key biases")
    if cfg.rope:  # a Qwen2 head without its query map adds D·E, not D(E − D) (tests/test_checkpoints.py)
        raise ValueError("collapsed_query_dims: derived without RoPE (the rotations identify more of the key map)")
    if not (isinstance(rank, int) and 0 <= rank <= cfg.D):
        raise ValueError(f"rank must be an integer in [0, D={cfg.D}], got {rank!r}")
    key_dims = cfg.E - 1 if hyperplane_inputs else cfg.E
    if key_dims < cfg.D:
        raise ValueError(f"collapsed_query_dims: needs E_k = {key_dims} >= D = {cfg.D}")
    return (cfg.D - rank) * (key_dims - cfg.D)


def count_block(block: BlockConfig) -> Count:
    """Unidentified dimensions of a whole decoder layer, by term (chapters 8 and 9 derive each one):

    * ``qk``, ``vo``, ``key_bias``, ``value_bias``: :func:`count` of :func:`effective_attention` (for latent
      attention the terms of :func:`count_mla`);
    * ``norm_scale``: ``E`` per norm that reads a sub-layer's input, its weight ``γ_i`` against column ``i`` of
      every map that reads it;
    * ``norm_shift``: ``E`` per LayerNorm, its shift ``β`` against the readers' (effective) biases;
    * ``norm_mean``: per LayerNorm, one direction per row of a reader *with* a bias: ``x̂`` has zero mean,
      so ``W + a (1/γ)ᵀ`` only moves ``W x̂ + b`` by the constant ``a Σ β_i/γ_i``, which the bias takes back; behind
      a LayerNorm without a shift (Command R) the constant is 0, so every reader row has one, with or without a bias
      (a gated MLP's gate and up rows: ``2F``), less those a one-head NoPE layer's gauge already moves
      (:func:`_nope_overlap`);
    * ``mlp_rescaling``: ``F`` for ReLU (``relu(c z) = c relu(z)``, ``c > 0``) and gated MLPs (up-projection
      row ``j`` against down-projection column ``j``), for each expert of a mixture; none for GELU or xIELU. A
      mixture's sigmoid router is identified (its scores have no shift or scale to give);
    * ``choice_bias``: a bias that only chooses the experts (ERNIE 4.5's), one per expert: unidentified;
    * ``router_shift`` (a softmax router only): its weights ignore a logit added to every expert, so the same
      vector added to every router row is free: ``E``, and with a router bias the same constant added to each: 1;
    * with gpt-oss's biased gated unit (``swiglu_biased``), ``mlp_rescaling`` is the up-projection row ``j`` with its
      bias (``c (u + b) + c − 1``, so that ``u + b + 1`` scales by ``c``) against down-projection column ``j``; its
      gate ``z σ(α z)`` has no scale to give, and the experts' output biases write to the stream: identified;
    * ``output_bias``: in a parallel block the attention's and the MLP's output biases add to one stream
      (``E``); in a sequential block with LayerNorm only their sum along ``1`` is free (``N₂`` removes the
      mean of ``h``, so ``b_O + t·1``, ``b_MLP − t·1`` changes nothing): ``1``;
    * ``post_norm_scale`` (norms after a sub-layer only): at ``ε = 0`` such a norm ignores the scale of what it
      normalises, so the attention's output map (with its bias) and the MLP's down-projection each keep one
      free scale: 1 per norm; none for ``ε > 0``. Its weight writes to the stream and trades with nothing.
    """
    if not isinstance(block, BlockConfig):
        raise TypeError(f"block: expected a BlockConfig, got {type(block).__name__}")
    cfg, F, E = block.attention, block.ffn, block.E
    before, after = block.norms()
    layer = block.norm == "layer"
    terms, params = _attention_terms(block)
    bias = "" if isinstance(cfg, MLAConfig) else cfg.bias
    out_biases = ("o" in bias) + block.mlp_bias
    if out_biases < 2:
        output_bias = 0
    elif block.residual == "sequential":
        output_bias = 1 if layer else 0
    else:
        output_bias = E
    gated_or_relu = block.mlp in ("relu", *GATED_MLPS)
    units = block.experts * F + block.shared_ffn if block.experts else F
    terms.update(
        norm_scale=before * E,
        norm_shift=before * E if layer else 0,
        norm_mean=_norm_mean_rows(block),
        mlp_rescaling=units if gated_or_relu else 0,
        output_bias=output_bias,
    )
    if after:
        terms["post_norm_scale"] = after if block.norm_eps_zero else 0
    if block.experts and block.router != "sigmoid":
        terms["router_shift"] = E + (1 if block.router == "softmax_biased" else 0)
    if block.choice_bias:
        terms["choice_bias"] = block.experts
    params.update(norms=block.norm_params(), mlp=block.mlp_params())
    return Count(sum(params.values()), params, terms)


def _norm_mean_rows(block: BlockConfig) -> int:
    """``norm_mean`` of :func:`count_block`: the rows of the maps reading a LayerNorm that carry their own bias, or
    every reader row behind a LayerNorm without a shift; none behind RMSNorm."""
    if block.norm == "rms":
        return 0
    cfg, F = block.attention, block.ffn
    assert isinstance(cfg, AttentionConfig)
    if block.norm == "layer_noshift":
        rows = biased_reader_rows(cfg.with_(bias="qkv")) + (2 if block.mlp in GATED_MLPS else 1) * F
        return rows - _nope_overlap(cfg)
    return biased_reader_rows(cfg) + (F if block.mlp_bias else 0)


def _nope_overlap(cfg: AttentionConfig) -> int:
    """The directions counted twice behind a LayerNorm without a shift (Command R7B) in a NoPE layer whose every
    key/value group has one query head (``H = G``) with ``D`` above the ``E − 1`` dimensions the centred input
    spans: the query/key gauge ``S = I + a bᵀ`` with ``b`` off the query map's ``E − 1`` columns and ``a`` off the
    key map's leaves both maps on that input unchanged, so ``(D − E + 1)²`` of each group's ``GL(D)`` directions are
    mean directions already counted (the Jacobian of a one-head layer at ``D = E`` shows it: one)."""
    if cfg.rope or cfg.qk_norm or cfg.H != cfg.G:
        return 0
    return cfg.G * max(0, cfg.D - (cfg.E - 1)) ** 2


@dataclass(frozen=True)
class MixerBlock:
    """A decoder layer of a hybrid model whose sequence mixer is not attention (:mod:`attnid.counting.hybrid`):
    ``block`` with its attention replaced by ``mixer`` (a name, :data:`attnid.counting.hybrid.MIXERS`), whose own
    closed form is ``count``. The layer keeps ``block``'s norms and MLP (or mixture of experts), so it is counted
    beside a sequential pre-norm RMSNorm ``block`` only, where nothing the norms or the MLP free depends on the
    attention."""

    mixer: str
    count: Count
    block: BlockConfig

    def __post_init__(self) -> None:
        if not (isinstance(self.mixer, str) and self.mixer):
            raise ValueError(f"mixer: expected the mixer's name, got {self.mixer!r}")
        if not isinstance(self.count, Count):
            raise TypeError(f"count: expected the mixer's Count, got {type(self.count).__name__}")
        if "norm_scale" in self.count.unidentified_by_block:
            raise ValueError("count: give the mixer's own count (the layer's norms are counted with its block)")
        b = self.block
        if not isinstance(b, BlockConfig):
            raise TypeError(f"block: expected a BlockConfig, got {type(b).__name__}")
        if b.norm != "rms" or b.norm_position != "pre" or b.residual != "sequential":
            raise ValueError("block: a hybrid layer is counted in a sequential pre-norm RMSNorm block only")

    @property
    def E(self) -> int:
        return self.block.E


def count_mixer_block(layer: MixerBlock) -> Count:
    """Unidentified dimensions of one hybrid layer: the mixer's own terms, and every term of :func:`count_block` of
    its ``block`` but the attention's (``norm_scale``, ``E`` per norm: each weight against the columns of the maps
    that read it, the mixer's input projections among them; ``mlp_rescaling``; a softmax router's shift)."""
    if not isinstance(layer, MixerBlock):
        raise TypeError(f"layer: expected a MixerBlock, got {type(layer).__name__}")
    attention_terms, attention_params = _attention_terms(layer.block)
    whole = count_block(layer.block)
    terms = {**layer.count.unidentified_by_block,
             **{k: v for k, v in whole.unidentified_by_block.items() if k not in attention_terms}}  # fmt: skip
    params = {"mixer": layer.count.total_params,
              **{k: v for k, v in whole.params_by_block.items() if k not in attention_params}}  # fmt: skip
    return Count(sum(params.values()), params, terms)


# "learned": position rows added to the embeddings; "rope" and "alibi" add no parameter (a rotation of the queries
# and keys, or a fixed bias on the scores)
POSITIONS = ("rope", "learned", "alibi")


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only language model: token embedding (``vocab x E``), learned position embeddings
    (``positions = "learned"``: ``context`` rows used, ``unused_positions`` more never read, as OPT's
    offset of 2), ``layers`` blocks, a final norm of the blocks' kind, an LM head (``tied`` to the
    embedding or not, ``head_bias``), read through ``log_softmax``. ``norm_eps_zero``: the norms' ε is 0
    (exact scale invariance). ``dense_layers``: of the ``layers``, the first ``dense_layers`` have one MLP of
    inner size ``dense_ffn`` in place of ``block``'s mixture of experts (DeepSeek-V3's first three).
    ``nope_layers``: of the ``layers``, this many have no RoPE (SmolLM3's every fourth, Llama 4's NoPE layers): their
    attention keeps the whole ``GL(D)`` query/key gauge of the paper; with ``nope_qk_norm`` False they also have no
    QK-norm (Llama 4 normalises queries and keys in its RoPE layers only); ``nope_dense_layers`` of them are dense
    layers (the rest of the NoPE layers hold the mixture). ``final_softcap`` c: the logits capped to
    ``c tanh(z / c)`` before ``log_softmax`` (Gemma 2), which breaks the logit shift of an untied head.
    ``mixer_layers``: of the ``layers``, those whose sequence mixer is not attention, ``(MixerBlock, how many)`` for
    each kind (a hybrid model: LFM2's short convolutions, Mamba-2, Gated DeltaNet); counted beside pre-norm RMSNorm
    blocks only."""

    block: BlockConfig
    layers: int
    vocab: int
    tied: bool = False
    positions: str = "rope"
    context: int = 0
    unused_positions: int = 0
    head_bias: bool = False
    norm_eps_zero: bool = False
    dense_layers: int = 0
    dense_ffn: int = 0
    nope_layers: int = 0
    nope_qk_norm: bool = True
    nope_dense_layers: int = 0
    final_softcap: float | None = None
    mixer_layers: tuple[tuple[MixerBlock, int], ...] = ()

    def __post_init__(self) -> None:
        for name in ("layers", "vocab"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions: expected one of {', '.join(POSITIONS)}, got {self.positions!r}")
        if self.positions == "learned" and self.context < 1:
            raise ValueError("context: learned positions need the number of position rows read (context >= 1)")
        if self.tied and self.head_bias:
            raise ValueError("head_bias: the tied heads counted here have no bias")
        if self.block.norms()[1] and self.block.norm_eps_zero != self.norm_eps_zero:
            raise ValueError("norm_eps_zero: the model's and its blocks' norms must have the same ε")
        d = self.dense_layers
        if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= self.layers:
            raise ValueError(f"dense_layers must be an integer in [0, layers], got {d!r}")
        if d and (not self.block.experts or self.dense_ffn < 1):
            raise ValueError("dense_layers: dense layers replace a mixture of experts, with dense_ffn >= 1")
        self._check_nope()
        self._check_mixers()
        cap = self.final_softcap
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < math.inf):
            raise ValueError(f"final_softcap must be a positive finite number or None, got {cap!r}")

    def _check_nope(self) -> None:
        """Refuse NoPE layer counts that do not fit the model's layers (dense and mixture)."""
        k, d = self.nope_layers, self.dense_layers
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= self.layers:
            raise ValueError(f"nope_layers must be an integer in [0, layers], got {k!r}")
        if k and (not isinstance(self.block.attention, AttentionConfig) or not self.block.attention.rope):
            raise ValueError("nope_layers: NoPE layers are counted beside RoPE layers")
        nd = self.nope_dense_layers
        if not isinstance(nd, int) or isinstance(nd, bool) or not 0 <= nd <= min(d, k):
            raise ValueError(f"nope_dense_layers must be an integer in [0, min(dense_layers, nope_layers)], got {nd!r}")
        if self.layers - d < k - nd:
            raise ValueError("nope_layers: more NoPE mixture layers than mixture layers")

    def _check_mixers(self) -> None:
        """Refuse hybrid layers where no closed form was derived: beside blocks that are not sequential pre-norm
        RMSNorm ones, of another width, beside dense or NoPE layers, or leaving no attention layer."""
        if not self.mixer_layers:
            return
        b = self.block
        for item in self.mixer_layers:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], MixerBlock)):
                raise TypeError(f"mixer_layers: expected (MixerBlock, how many) pairs, got {item!r}")
            n = item[1]
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"mixer_layers: each kind's number of layers must be a positive integer, got {n!r}")
            if item[0].E != b.E:
                raise ValueError(f"mixer_layers: a {item[0].mixer} layer of width {item[0].E} in a model of {b.E}")
        if b.norm != "rms" or b.norm_position != "pre" or b.residual != "sequential":
            raise ValueError("mixer_layers: hybrid layers are counted beside sequential pre-norm RMSNorm blocks only")
        if self.dense_layers or self.nope_layers:
            raise ValueError("mixer_layers: hybrid layers are not counted beside dense or NoPE layers")
        if sum(n for _, n in self.mixer_layers) >= self.layers:
            raise ValueError("mixer_layers: a hybrid model has at least one attention layer among its layers")

    def attention_layers(self) -> int:
        """How many of the ``layers`` are attention layers (all but the ``mixer_layers``)."""
        return self.layers - sum(n for _, n in self.mixer_layers)

    def _dense(self, block: BlockConfig) -> BlockConfig:
        """``block`` with one MLP of inner size ``dense_ffn`` in place of its mixture of experts."""
        return replace(block, ffn=self.dense_ffn, experts=0, shared_ffn=0, choice_bias=False, shared_gate=False)

    def blocks(self) -> list[tuple[BlockConfig, int]]:
        """``(block, how many)`` for each kind of layer the model stacks."""
        dense = self._dense(self.block) if self.dense_layers else None
        nope = nope_dense = None
        if self.nope_layers:
            assert isinstance(self.block.attention, AttentionConfig)
            nope = replace(self.block, attention=nope_attention(self.block.attention, self.nope_qk_norm))
            nope_dense = self._dense(nope) if self.dense_layers else None
        nd = self.nope_dense_layers
        kinds = [(dense, self.dense_layers - nd), (nope_dense, nd), (nope, self.nope_layers - nd),
                 (self.block, self.attention_layers() - self.dense_layers - self.nope_layers + nd)]  # fmt: skip
        return [(b, n) for b, n in kinds if b is not None and n]

    def total_params(self) -> int:
        E = self.block.E
        final_norm = 2 * E if self.block.norm == "layer" else E  # the blocks' kind of norm
        n = sum(k * count_block(b).total_params for b, k in self.blocks()) + self.vocab * E + final_norm
        n += sum(k * count_mixer_block(b).total_params for b, k in self.mixer_layers)
        n += 0 if self.tied else self.vocab * E + (self.vocab if self.head_bias else 0)
        if self.positions == "learned":
            n += (self.context + self.unused_positions) * E
        return n


def nope_attention(cfg: AttentionConfig, keeps_qk_norm: bool) -> AttentionConfig:
    """A model's NoPE layer beside its RoPE layers ``cfg``: no rotation, and no QK-norm unless ``keeps_qk_norm``."""
    return cfg.with_(rope=False) if keeps_qk_norm else cfg.with_(rope=False, qk_norm="", qk_norm_eps=0.0)


def _layer_norm_terms(model: ModelConfig) -> dict[str, int]:
    """The terms of :func:`count_model` that a LayerNorm's mean removal adds (its docstring derives each)."""
    b = model.block
    cfg, E, V = b.attention, b.E, model.vocab
    assert isinstance(cfg, AttentionConfig)
    out_biases = ("o" in cfg.bias) + b.mlp_bias
    per_layer = cfg.H * cfg.C + b.ffn + out_biases - (1 if out_biases == 2 else 0)
    terms = {"writer_mean": model.layers * per_layer, "embedding_mean": 0 if model.tied else V}
    if model.positions == "learned":
        terms["position_mean"] = model.context
        terms["embedding_position_shift"] = E if model.tied else E - 1
    elif model.tied:  # every token row + t·1: each LayerNorm removes it, the tied head shifts every logit alike
        terms["embedding_shift"] = 1
    terms["unused_positions"] = model.unused_positions * E if model.positions == "learned" else 0
    absorbed = "o" in cfg.bias or (b.residual != "sequential" and b.mlp_bias)  # a bias takes the constant
    # a value head as wide as the stream (C >= E) already moves its constant through the value/output gauge and
    # the writers' mean: no direction of its own (tests/test_blocks.py, one-head OPT and StableLM models)
    terms["value_mean"] = 0 if absorbed or cfg.G * cfg.C < E or cfg.C >= E else model.layers
    if b.norm == "layer_noshift":  # no shift: no effective value bias to send a constant along 1
        terms["value_mean"] = 0
    return terms


def count_model(model: ModelConfig) -> Count:
    """Unidentified dimensions of a whole causal LM (chapter 8 derives each term):

    * ``blocks``: :func:`count_block` of each layer (dense and mixture-of-experts layers by kind);
    * ``mixer_blocks`` (hybrid models): :func:`count_mixer_block` of each layer whose mixer is not attention; the
      terms below hold for them as they are (:mod:`attnid.counting.hybrid`);
    * ``stream_rotation``: an orthogonal change of basis ``Q`` of the residual stream, absorbed by every
      writer (``Q W``) and reader (``W Qᵀ``; the norms' ``γ`` first moved into the readers). RMSNorm keeps
      ``‖x‖``: ``E(E−1)/2``; LayerNorm needs ``Q 1 = 1``: ``(E−1)(E−2)/2``. Exact for any ε. None with a
      tied head (the final norm's ``γ`` would have to commute with ``Q``), and none when a norm writes to the
      stream (post- and sandwich-norm blocks: ``Q diag(γ)`` is no norm's output).
    * ``stream_scale``: ``x → c x`` with every writer, exact only when ε = 0: 1;
    * ``final_norm``: the final norm against the LM head (``E`` for γ; with LayerNorm ``E`` for the shift
      and, with a head bias, ``V`` mean directions), untied only;
    * ``logit_shift``: ``log_softmax`` ignores a constant over the vocabulary: the same vector added to
      every head row, ``E`` (behind a LayerNorm: ``E − 1`` on the head and a constant on its effective bias); none
      when the logits are soft-capped (``c tanh((z + a) / c)`` is no shift of ``c tanh(z / c)``);
    * LayerNorm only, ``writer_mean``: every LayerNorm removes the stream's mean, so each writer column's
      component along ``1`` is invisible: ``HC + F`` per layer, ``+1`` per output bias, less the one the block
      already counts; ``embedding_mean``: ``V`` (untied); ``position_mean``: the context's rows;
      ``embedding_position_shift``: token rows ``+ a``, position rows ``− a``: ``E − 1`` more untied, ``E``
      tied (the head's shift ``a`` is a logit shift); ``embedding_shift`` (tied, RoPE: Starcoder2): every token row
      plus one multiple of ``1``, which each LayerNorm removes and the tied head turns into the same shift of every
      logit: 1; ``unused_positions``: rows never read; ``value_mean``:
      with no output bias on the attention's stream (OPT without biases), the effective value bias ``W_V β``
      that the norm gives still adds ``Σ_h W_O^h b_h`` to every token, and the one direction whose sum is
      along ``1`` is removed by every later norm: 1 per layer (when ``G·C ≥ E``, so that ``1`` is in reach, and
      ``C < E``: a value head as wide as the stream reaches the same direction through its gauge and the writers'
      mean);
    * LayerNorm without a shift (Command R): the LayerNorm terms above but ``value_mean`` (no shift, no effective
      value bias), the stream rotation that keeps ``1``, and, untied, ``final_norm`` ``E + V`` (each head row
      ``+ a (1/γ)ᵀ`` reads ``1ᵀ x̂ = 0``) with a logit shift of ``E − 1`` (its direction along ``1/γ`` is one of those).
    """
    if not isinstance(model, ModelConfig):
        raise TypeError(f"model: expected a ModelConfig, got {type(model).__name__}")
    b = model.block
    E, V = b.E, model.vocab
    layer, shiftless = b.norm == "layer", b.norm == "layer_noshift"
    blocks = [(count_block(kind), k) for kind, k in model.blocks()]
    terms = {"blocks": sum(c.unidentified * k for c, k in blocks)}
    mixers = [(count_mixer_block(kind), k) for kind, k in model.mixer_layers]
    terms.update({"mixer_blocks": sum(c.unidentified * k for c, k in mixers)} if mixers else {})
    if layer or shiftless:
        terms.update(_layer_norm_terms(model))
    if model.tied:
        terms["stream_rotation"] = 0
        terms["final_norm"] = 0
        terms["logit_shift"] = 0
    else:
        rotation = (E - 1) * (E - 2) // 2 if layer or shiftless else E * (E - 1) // 2
        terms["stream_rotation"] = rotation if b.norm_position == "pre" else 0
        terms["final_norm"] = (2 * E + (V if model.head_bias else 0)) if layer else E
        terms["logit_shift"] = 0 if model.final_softcap is not None else E
        if shiftless:  # each head row + a (1/γ)ᵀ reads 1ᵀ x̂ = 0: V more, one of them the logit shift along 1/γ
            terms["final_norm"] = E + V
            terms["logit_shift"] -= 1 if model.final_softcap is None else 0
    terms["stream_scale"] = 1 if model.norm_eps_zero else 0
    in_blocks = sum(c.total_params * k for c, k in blocks + mixers)
    params = {"blocks": in_blocks, "embeddings": model.total_params() - in_blocks}
    return Count(model.total_params(), params, terms)
