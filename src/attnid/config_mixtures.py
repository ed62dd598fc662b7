"""Reading a config's mixture of experts and its layer kinds (:mod:`attnid.configs`' readers for Mixtral, Qwen3-MoE,
gpt-oss, Llama 4, GLM-4.5, dots.llm1, ERNIE 4.5 and Hunyuan-A13B), and the checked integer fields they share."""

from __future__ import annotations

import math

from .config_fields import ACTIVATIONS, MIN_WINDOW, ConfigError
from .config_rope import positive_number, rope_of
from .counting import MLAConfig
from .families import nope_layer_flags
from .inputs import printable
from .presets import Model


def _mixture_model(c, hf_type: str, read: set[str]) -> Model:
    """The :class:`Model` of a softmax-routed mixture of experts in every layer (Mixtral, Qwen3-MoE, gpt-oss),
    adding the fields read to ``read``; refuses fewer than two chosen experts, and Qwen3-MoE's dense layers (every
    layer a mixture is the case attnid counts)."""
    qwen = hf_type in ("qwen3_moe", "qwen3_vl_moe", "qwen3_next", "qwen3_5_moe")
    key = "num_experts" if qwen else "num_local_experts"
    read |= {key, "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
             "swiglu_limit", "swiglu_alpha", "experts_per_token"}  # fmt: skip
    if hf_type not in ("qwen3_vl_moe", "qwen3_5_moe"):  # their code renormalises the chosen weights, reading no field
        read.add("norm_topk_prob")
    experts, chosen = _positive(c, key, default=None), _positive(c, "num_experts_per_tok", default=None)
    if hf_type == "gpt_oss":
        _check_gpt_oss_experts(c, chosen)
    _check_chosen("num_experts_per_tok", chosen, experts)
    if hf_type in ("qwen3_moe", "qwen3_vl_moe", "qwen3_next") and (c.decoder_sparse_step != 1 or c.mlp_only_layers):
        raise ConfigError(f"decoder_sparse_step = {c.decoder_sparse_step}, mlp_only_layers = "
                          f"{printable(repr(c.mlp_only_layers), 60)}: dense layers among the mixtures are not modelled "
                          "(attnid counts a mixture in every layer)")  # fmt: skip
    ffn = _positive(c, "moe_intermediate_size" if qwen else "intermediate_size", default=None)
    return Model(c.num_hidden_layers, ffn, c.vocab_size, bool(c.tie_word_embeddings), "", experts=experts)


def _grouped_mixture_model(c, t, read: set[str]) -> Model:
    """GLM-4.5's and dots.llm1's text model, DeepSeek-V3's mixture around attention of their own: the first
    ``first_k_dense_replace`` layers have one MLP (``intermediate_size``), the others ``n_routed_experts`` experts of
    ``moe_intermediate_size``, ``num_experts_per_tok`` (two or more) chosen by a sigmoid router, beside
    ``n_shared_experts`` shared ones of that size; the fields read are added to ``read``."""
    read |= {"n_routed_experts", "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size",
             "first_k_dense_replace", "norm_topk_prob", "intermediate_size"}  # fmt: skip
    experts, chosen = _positive(c, "n_routed_experts", default=None), _positive(c, "num_experts_per_tok", default=None)
    if experts is None or chosen is None:
        raise ConfigError(f"n_routed_experts, num_experts_per_tok: {experts}, {chosen}; transformers builds "
                          f"{t.module}'s mixture from both (give them)")  # fmt: skip
    _check_chosen("num_experts_per_tok", chosen, experts)
    shared = _positive(c, "n_shared_experts", default=None)
    if shared is None:
        raise ConfigError(f"n_shared_experts: null; transformers builds {t.module}'s shared experts n_shared_experts "
                          "x moe_intermediate_size wide (give their number)")  # fmt: skip
    layers, dense = c.num_hidden_layers, c.first_k_dense_replace
    if not (isinstance(dense, int) and not isinstance(dense, bool) and 0 <= dense <= layers):
        raise ConfigError(f"first_k_dense_replace: {printable(repr(dense))} must be a layer count from 0 to {layers}")
    ffn = _positive(c, "moe_intermediate_size", default=None)
    return Model(layers, ffn, c.vocab_size, bool(c.tie_word_embeddings), "", experts=experts, shared_ffn=shared * ffn,
                 dense_layers=dense, dense_ffn=_positive(c, "intermediate_size", default=None) if dense else 0,
                 **_layer_kinds_and_head(c, t, read))  # fmt: skip


def _per_layer(c, name: str, layers: int) -> int:
    """A mixture field that may give one value or one per layer (Hunyuan-A13B's ``moe_topk``, ``num_experts``), read
    as the one value every layer has; a positive integer, or :class:`ConfigError` naming it."""
    v = getattr(c, name)
    if isinstance(v, list):
        if len(v) < layers or len(set(map(repr, v[:layers]))) != 1:
            raise ConfigError(f"{name}: {printable(repr(v), 60)}: layers with different values are not modelled "
                              f"(attnid counts one value for all {layers} layers)")  # fmt: skip
        v = v[0]
    if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        raise ConfigError(f"{name}: {printable(repr(v))} must be a positive integer")
    return v


def _hunyuan_model(c, t, read: set[str]) -> Model:
    """Hunyuan-A13B's text model: in every layer ``num_experts`` experts, ``moe_topk`` (two or more) chosen by a
    softmax router renormalised over them, and one shared MLP, each ``intermediate_size`` wide (transformers' code
    builds them all from that field); the fields read are added to ``read``."""
    read |= {"num_experts", "moe_topk", "intermediate_size"}
    layers = c.num_hidden_layers
    experts, chosen = _per_layer(c, "num_experts", layers), _per_layer(c, "moe_topk", layers)
    _check_chosen("moe_topk", chosen, experts)
    ffn = _positive(c, "intermediate_size", default=None)
    return Model(layers, ffn, c.vocab_size, bool(c.tie_word_embeddings), "", experts=experts, shared_ffn=ffn,
                 **_layer_kinds_and_head(c, t, read))  # fmt: skip


def _ernie_mixture_model(c, t, read: set[str]) -> Model:
    """ERNIE 4.5's mixtures: layer ``i`` is a mixture where ``(i + 1) % moe_layer_interval == 0`` and
    ``moe_layer_start_index <= i <= moe_layer_end_index``, the others one MLP (``intermediate_size``); a mixture has
    ``moe_num_experts`` experts of ``moe_intermediate_size``, ``moe_k`` (two or more) chosen by a softmax router (a
    bias per expert in the choice only), beside ``moe_num_shared_experts`` shared ones of that size; the fields read
    are added to ``read``."""
    read |= {"moe_num_experts", "moe_k", "moe_num_shared_experts", "moe_intermediate_size", "moe_layer_start_index",
             "moe_layer_end_index", "moe_layer_interval", "moe_norm_min", "intermediate_size"}  # fmt: skip
    experts, chosen = _positive(c, "moe_num_experts", default=None), _positive(c, "moe_k", default=None)
    _check_chosen("moe_k", chosen, experts)
    floor = c.moe_norm_min
    if not (isinstance(floor, (int, float)) and not isinstance(floor, bool) and 0 <= floor < chosen / experts):
        raise ConfigError(f"moe_norm_min: {printable(repr(floor))}: the floor of the chosen weights' sum must stay "
                          f"below {chosen}/{experts}, the least that sum can be, or it moves the weights")  # fmt: skip
    layers = c.num_hidden_layers
    bounds = [c.moe_layer_start_index, c.moe_layer_end_index, c.moe_layer_interval]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in bounds) or bounds[2] < 1:
        raise ConfigError(f"moe_layer_start_index, moe_layer_end_index, moe_layer_interval: {bounds} must be integers, "
                          "the interval positive")  # fmt: skip
    start, end, every = bounds
    moe = sum((i + 1) % every == 0 and start <= i <= end for i in range(layers))
    if not moe:
        raise ConfigError(f"moe_layer_start_index, moe_layer_end_index, moe_layer_interval: {bounds} leave no mixture "
                          f"layer among the {layers}")  # fmt: skip
    shared = c.moe_num_shared_experts
    if not (isinstance(shared, int) and not isinstance(shared, bool) and shared >= 0):
        raise ConfigError(f"moe_num_shared_experts: {printable(repr(shared))} must be an integer >= 0")
    ffn = _positive(c, "moe_intermediate_size", default=None)
    dense = layers - moe
    return Model(layers, ffn, c.vocab_size, bool(c.tie_word_embeddings), "", experts=experts, shared_ffn=shared * ffn,
                 dense_layers=dense, dense_ffn=_positive(c, "intermediate_size", default=None) if dense else 0,
                 **_layer_kinds_and_head(c, t, read))  # fmt: skip


def _llama4_model(c, read: set[str]) -> Model:
    """Llama 4's text model: mixture layers (``moe_layers``: the router's σ of one chosen logit scales that expert's
    input, beside a shared expert as wide as each expert) and dense ones (``intermediate_size_mlp``), NoPE layers
    (``no_rope_layers``, 0 marks one) without QK-norm, a query temperature in them, attention in chunks in the
    others; the fields read are added to ``read``."""
    read |= {"num_local_experts", "num_experts_per_tok", "intermediate_size", "intermediate_size_mlp", "moe_layers",
             "interleave_moe_layer_step", "no_rope_layers", "no_rope_layer_interval", "layer_types",
             "attention_chunk_size", "attn_temperature_tuning", "attn_scale", "floor_scale"}  # fmt: skip
    experts, chosen = _positive(c, "num_local_experts", default=None), _positive(c, "num_experts_per_tok", default=None)
    if chosen > experts:
        raise ConfigError(f"num_experts_per_tok: {chosen} of {experts} experts")
    chunk = c.attention_chunk_size
    if chunk is not None and not (isinstance(chunk, int) and chunk >= MIN_WINDOW):
        raise ConfigError(f"attention_chunk_size: {printable(repr(chunk))}: a chunk of one token leaves each query "
                          f"only itself; attnid counts chunks of at least {MIN_WINDOW} tokens")  # fmt: skip
    for name in ("attn_scale", "floor_scale"):  # the temperature 1 + s log(⌊(p + 1)/f⌋ + 1) must stay positive
        v = getattr(c, name)
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
            raise ConfigError(f"{name}: {printable(repr(v))} must be a finite number >= 0 (the query temperature)")
    layers = c.num_hidden_layers
    moe = set(_layer_indices(c.moe_layers, layers, "moe_layers"))
    if not (isinstance(c.no_rope_layers, list) and len(c.no_rope_layers) >= layers):
        raise ConfigError(f"no_rope_layers: {printable(repr(c.no_rope_layers), 60)} must give each of the {layers} "
                          "layers a flag (transformers reads one per layer)")  # fmt: skip
    nope = [i for i, u in enumerate(c.no_rope_layers[:layers]) if not u]  # entries past the last layer: never read
    dense = layers - len(moe)
    return Model(layers, _positive(c, "intermediate_size", default=None), c.vocab_size, bool(c.tie_word_embeddings),
                 "", experts=experts, shared_ffn=c.intermediate_size, dense_layers=dense,
                 dense_ffn=_positive(c, "intermediate_size_mlp", default=None) if dense else 0, nope_layers=len(nope),
                 nope_qk_norm=False, nope_dense_layers=sum(i not in moe for i in nope))  # fmt: skip


def _layer_indices(value, layers: int, name: str) -> list[int]:
    """A list of distinct layer indices in ``0 .. layers - 1`` (Llama 4's ``moe_layers``), or :class:`ConfigError`."""
    ok = isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    if not ok or any(not 0 <= i < layers for i in value) or len(set(value)) != len(value):
        raise ConfigError(f"{name}: {printable(repr(value), 80)} must be distinct layer indices from 0 to {layers - 1}")
    return value


def _check_gpt_oss_experts(c, chosen: int) -> None:
    """gpt-oss's gated unit ``(u + 1) z σ(α z)`` with its inputs clamped at ``limit``: the count takes ``α > 0`` (at 0
    the gate is linear) and a positive limit (generic inputs lie inside it, where the clamp does nothing);
    ``experts_per_token``, an older copy of ``num_experts_per_tok``, must agree with it."""
    for name in ("swiglu_alpha", "swiglu_limit"):
        v = getattr(c, name)
        if not positive_number(v):
            raise ConfigError(f"{name}: {printable(repr(v))} must be a positive number (gpt-oss's gated unit)")
    copy = getattr(c, "experts_per_token", chosen)
    if copy != chosen:
        raise ConfigError(f"experts_per_token: {printable(repr(copy))} differs from num_experts_per_tok = {chosen}")


def _layer_kinds_and_head(c, t, read: set[str]) -> dict:
    """The :class:`Model` fields of a config beyond sizes, adding the fields read to ``read``: its NoPE layers
    (SmolLM3's ``no_rope_layers``, 0 marks a layer without RoPE) and its logits' cap (Gemma 2's
    ``final_logit_softcapping``: an untied head's logit shift is then identified)."""
    nope = 0
    if t.nope_layers:
        read |= ({"layer_types", "sliding_window", "sliding_window_pattern"} if t.rope_in_windows else
                 {"no_rope_layers", "no_rope_layer_interval", "layer_types", "use_sliding_window"})  # fmt: skip
        nope = sum(nope_layer_flags(t.module, c))
        if t.rope_in_windows and nope == c.num_hidden_layers:
            raise ConfigError(
                f"sliding_window: null leaves every {t.module} layer without RoPE (it rotates queries "
                "and keys in sliding-window layers only); attnid counts models with RoPE layers"
            )
    d = c.to_dict()
    cap = d.get("final_logit_softcapping")
    if "final_logit_softcapping" in d:
        read.add("final_logit_softcapping")
    if not positive_number(cap):
        cap = None  # None, or a value refused by name in _refuse_unmodelled (POSITIVE)
    return {"nope_layers": nope, "final_softcap": None if cap is None else float(cap)}


def _check_chosen(field: str, chosen: int | None, experts: int | None) -> None:
    """Refuse a mixture that chooses fewer than two experts per token, or more than it has (``field`` names the
    config's count of chosen experts)."""
    if experts is None or chosen is None or chosen < 2 or experts < chosen:
        raise ConfigError(f"{field}: {chosen} of {experts} experts; attnid counts two or more chosen (with one, a "
                          "renormalised router's weight is 1 whatever its logits)")  # fmt: skip


def _positive(c, name: str, default):
    """A config's integer field ``name``: ``default`` where the config leaves it out (None), else a positive
    integer, or :class:`ConfigError` naming it (transformers cannot build a layer of 0 heads or width 0)."""
    v = getattr(c, name, None)
    if v is None:
        return default
    if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        raise ConfigError(f"{name}: {printable(repr(v))} must be a positive integer")
    return v


def read_latent(c) -> tuple[MLAConfig, Model, set[str]]:
    """DeepSeek-V3's latent attention and its mixture of experts; DeepSeek-V3.2's indexer (its top-k at least two
    keys: one would leave each query a single key, whose weight is 1 whatever the scores)."""
    if c.num_experts_per_tok < 2:
        raise ConfigError(f"num_experts_per_tok: {c.num_experts_per_tok}; attnid counts two or more chosen experts")
    if c.hidden_act not in ACTIVATIONS["swiglu"]:
        raise ConfigError(f"hidden_act: {c.hidden_act!r} is not modelled (its gated experts have silu)")
    rope_of(c, partial=False)
    try:
        cfg = MLAConfig(c.hidden_size, c.num_attention_heads, kv_rank=c.kv_lora_rank, q_rank=c.q_lora_rank,
                        nope_dim=c.qk_nope_head_dim, rope_dim=c.qk_rope_head_dim, v_dim=c.v_head_dim,
                        norm_eps=c.rms_norm_eps, **_indexer(c))  # fmt: skip
    except ValueError as e:
        raise ConfigError(f"config: {e}") from None
    model = Model(c.num_hidden_layers, c.moe_intermediate_size, c.vocab_size, bool(c.tie_word_embeddings), "",
                  experts=c.n_routed_experts, shared_ffn=c.n_shared_experts * c.moe_intermediate_size,
                  dense_layers=_dense_layers(c), dense_ffn=c.intermediate_size)  # fmt: skip
    read = {"hidden_size", "num_attention_heads", "num_key_value_heads", "kv_lora_rank", "q_lora_rank",
            "qk_nope_head_dim", "qk_rope_head_dim", "qk_head_dim", "head_dim", "v_head_dim", "num_hidden_layers",
            "moe_intermediate_size", "vocab_size", "tie_word_embeddings", "n_routed_experts", "n_shared_experts",
            "first_k_dense_replace", "intermediate_size", "num_experts_per_tok", "hidden_act", "rope_parameters",
            "rope_interleave", "index_n_heads", "index_head_dim", "index_topk", "mlp_layer_types",
            "layer_types"}  # fmt: skip
    return cfg, model, read


def _dense_layers(c) -> int:
    """How many of DeepSeek's first layers have one MLP: ``first_k_dense_replace``, or DeepSeek-V3.2's
    ``mlp_layer_types``, which attnid counts where its dense layers come first."""
    kinds = getattr(c, "mlp_layer_types", None)
    if kinds is None:
        return c.first_k_dense_replace
    dense = sum(k == "dense" for k in kinds) if isinstance(kinds, list) else -1
    if dense < 0 or kinds != ["dense"] * dense + ["sparse"] * (c.num_hidden_layers - dense):
        raise ConfigError(f"mlp_layer_types: {printable(repr(kinds), 80)}; attnid counts 'dense' layers first, then "
                          f"'sparse' ones, one entry for each of the {c.num_hidden_layers} layers")  # fmt: skip
    return dense


def _indexer(c) -> dict:
    """DeepSeek-V3.2's indexer's sizes (none for DeepSeek-V3), its top-k checked."""
    if not hasattr(c, "index_topk"):
        return {}
    k = c.index_topk
    if not (isinstance(k, int) and not isinstance(k, bool) and k >= 2):
        raise ConfigError(f"index_topk: {printable(repr(k))}; attnid counts an indexer that keeps two keys or more "
                          "for each query")  # fmt: skip
    return dict(index_heads=_positive(c, "index_n_heads", default=None), index_dim=_positive(c, "index_head_dim",
                                                                                            default=None))  # fmt: skip
