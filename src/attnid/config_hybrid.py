"""A hybrid model's ``config.json`` read (chapter 9): LFM2 (short convolutions beside attention layers), Bamba (Mamba-2
mixers beside them), Granite 4 (Mamba-2 beside NoPE attention, a mixture of experts and a shared MLP in every layer),
Qwen3-Next (Gated DeltaNet beside gated attention, a mixture of experts with a gated shared expert in every layer) and
Qwen3.5 (Qwen3-Next's layers with one MLP each, or its mixture), their layers' kinds and their mixers' sizes as
transformers builds them. The attention layers are read as any family's (:mod:`attnid.configs`); the layers of the other
kind become the model's ``mixer_layers`` (:class:`attnid.counting.MixerBlock`)."""

from __future__ import annotations

import math

from .attention_config import AttentionConfig
from .config_fields import ConfigError
from .config_mixtures import _check_chosen, _mixture_model, _positive
from .counting.hybrid import mixer_block
from .families import HF_TYPES, block_config
from .inputs import printable
from .presets import Model

_GATED_DELTANET = (
    "layer_types",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_value_head_dim",
    "rms_norm_eps",
    "hidden_act",
)
GATED_DELTANET_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")  # Gated DeltaNet beside gated softmax attention

# the fields each hybrid family's reader takes (its layer kinds, its MLP's inner size, its mixers)
HYBRID_FIELDS = {
    "lfm2": ("layer_types", "full_attn_idxs", "intermediate_size", "block_auto_adjust_ff_dim",
             "block_ffn_dim_multiplier", "block_multiple_of", "conv_L_cache", "conv_bias", "norm_eps"),
    "bamba": ("attn_layer_indices", "layer_types", "intermediate_size", "mamba_n_heads", "mamba_d_head",
              "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_conv_bias", "mamba_proj_bias",
              "mamba_chunk_size", "time_step_limit", "rms_norm_eps"),
    "granitemoehybrid": ("layer_types", "intermediate_size", "shared_intermediate_size", "num_local_experts",
                         "num_experts_per_tok", "mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state",
                         "mamba_d_conv", "mamba_expand", "mamba_conv_bias", "mamba_proj_bias", "mamba_chunk_size",
                         "time_step_limit", "rms_norm_eps", "hidden_act", "position_embedding_type"),
    "qwen3_next": (*_GATED_DELTANET, "shared_expert_intermediate_size"),
    "qwen3_5": (*_GATED_DELTANET, "intermediate_size"),
    "qwen3_5_moe": (*_GATED_DELTANET, "shared_expert_intermediate_size"),
}  # fmt: skip


def lfm2_ffn(c) -> int:
    """LFM2's MLP inner size as ``Lfm2MLP`` computes it: ``intermediate_size`` (``block_ff_dim`` in older files),
    with ``block_auto_adjust_ff_dim`` two thirds of it, times ``block_ffn_dim_multiplier`` and rounded up to a
    multiple of ``block_multiple_of`` when a multiplier is given."""
    ffn = _positive(c, "intermediate_size", default=None)
    if ffn is None:
        raise ConfigError("intermediate_size: LFM2's MLP needs its inner size (intermediate_size or block_ff_dim)")
    if not isinstance(c.block_auto_adjust_ff_dim, bool):
        raise ConfigError(f"block_auto_adjust_ff_dim: {printable(repr(c.block_auto_adjust_ff_dim))} must be true "
                          "or false")  # fmt: skip
    if not c.block_auto_adjust_ff_dim:
        return ffn
    ffn = int(2 * ffn / 3)
    multiplier = c.block_ffn_dim_multiplier
    if multiplier is not None:
        ok = isinstance(multiplier, (int, float)) and not isinstance(multiplier, bool) and math.isfinite(multiplier)
        if not ok or multiplier <= 0:
            raise ConfigError(f"block_ffn_dim_multiplier: {printable(repr(multiplier))} must be a positive number")
        step = _positive(c, "block_multiple_of", default=None)
        if step is None:
            raise ConfigError("block_multiple_of: LFM2 rounds its MLP's inner size up to it; give a positive integer")
        ffn = step * -(-int(multiplier * ffn) // step)
    if ffn < 1:
        raise ConfigError(f"intermediate_size: {c.intermediate_size} leaves LFM2's MLP no inner size")
    return ffn


def _layer_kinds(hf_type: str, c) -> list[str]:
    """The kind of each layer (its config's names), each one checked."""
    n = c.num_hidden_layers
    if hf_type == "bamba":
        chosen = c.attn_layer_indices
        ok = chosen is None or (isinstance(chosen, list) and all(isinstance(i, int) and 0 <= i < n for i in chosen))
        if not ok:
            raise ConfigError(f"attn_layer_indices: {printable(repr(chosen), 80)} must list layer numbers below {n}")
        return ["full_attention" if chosen and i in chosen else "linear_attention" for i in range(n)]
    kinds = c.layer_types
    mixer = HF_TYPES[hf_type].mixer_layer()[0]
    if not (isinstance(kinds, list) and len(kinds) == n and all(k in ("full_attention", mixer) for k in kinds)):
        raise ConfigError(f"layer_types: {printable(repr(kinds), 80)} must give each of the {n} layers "
                          f"'full_attention' or {mixer!r}")  # fmt: skip
    return kinds


def _mixer_sizes(hf_type: str, c) -> dict:
    """The sizes of a hybrid family's mixer (:data:`attnid.counting.hybrid.MIXER_SIZES`) from its config."""
    if hf_type in GATED_DELTANET_TYPES:
        sizes = {name: _positive(c, f"linear_{field}", default=None) for name, field in (
            ("key_heads", "num_key_heads"), ("value_heads", "num_value_heads"), ("key_dim", "key_head_dim"),
            ("value_dim", "value_head_dim"), ("kernel", "conv_kernel_dim"))}  # fmt: skip
        if None in sizes.values() or sizes["value_heads"] % sizes["key_heads"]:
            raise ConfigError(f"linear_num_key_heads: {sizes['key_heads']} key heads must divide the "
                              f"{sizes['value_heads']} value heads of Gated DeltaNet")  # fmt: skip
        return sizes
    if hf_type == "lfm2":
        if not isinstance(c.conv_bias, bool):
            raise ConfigError(f"conv_bias: {printable(repr(c.conv_bias))} must be true or false")
        return dict(kernel=_positive(c, "conv_L_cache", default=None), bias=c.conv_bias)
    for name in ("mamba_conv_bias", "mamba_proj_bias"):
        if not isinstance(getattr(c, name), bool):
            raise ConfigError(f"{name}: {printable(repr(getattr(c, name)))} must be true or false")
    E, expand, heads = c.hidden_size, c.mamba_expand, _positive(c, "mamba_n_heads", default=None)
    if not (isinstance(expand, int) and not isinstance(expand, bool) and expand > 0):
        raise ConfigError(f"mamba_expand: {printable(repr(expand))} must be a positive integer (attnid counts "
                          "whole multiples of hidden_size)")  # fmt: skip
    if heads is None or (expand * E) % heads or c.mamba_d_head != expand * E // heads:
        raise ConfigError(f"mamba_n_heads: {heads} heads of mamba_d_head {printable(repr(c.mamba_d_head))} must split "
                          f"the {expand} x {E} inner channels evenly")  # fmt: skip
    limit = c.time_step_limit
    if not isinstance(limit, (list, tuple)) or tuple(limit) != (0.0, math.inf):
        raise ConfigError(f"time_step_limit: {printable(repr(limit))} clamps Mamba-2's time step; attnid counts the "
                          "mixer without a clamp, (0.0, inf)")  # fmt: skip
    _positive(c, "mamba_chunk_size", default=None)  # the scan's chunks: the function is the same for any size
    return dict(expand=expand, heads=heads, groups=_positive(c, "mamba_n_groups", default=None),
                state=_positive(c, "mamba_d_state", default=None), kernel=_positive(c, "mamba_d_conv", default=None),
                bias=c.mamba_proj_bias, conv_bias=c.mamba_conv_bias)  # fmt: skip


def _granite_mixture(c) -> tuple[int, int, int]:
    """``(ffn, experts, shared_ffn)`` of Granite 4's layers: ``num_local_experts`` experts of ``intermediate_size``,
    ``num_experts_per_tok`` (two or more) weighted by a softmax over their logits, beside a shared MLP of
    ``shared_intermediate_size`` that every token passes, or with no experts (a dense hybrid) that MLP alone; its
    attention without RoPE."""
    if c.position_embedding_type not in (None, "nope"):
        raise ConfigError(f"position_embedding_type: {printable(repr(c.position_embedding_type))}: attnid counts "
                          "Granite 4's hybrids with NoPE attention layers (null or 'nope'), as released")  # fmt: skip
    experts = c.num_local_experts
    if experts == 0:  # a dense hybrid: its shared MLP alone in every layer
        return _positive(c, "shared_intermediate_size", default=None), 0, 0
    experts = _positive(c, "num_local_experts", default=None)
    _check_chosen("num_experts_per_tok", _positive(c, "num_experts_per_tok", default=None), experts)
    return (_positive(c, "intermediate_size", default=None), experts,
            _positive(c, "shared_intermediate_size", default=None))  # fmt: skip


def hybrid_model(hf_type: str, c, cfg: AttentionConfig, read: set[str]) -> Model:
    """The :class:`~attnid.presets.Model` of a hybrid family's config ``c`` (its attention ``cfg`` read already), its
    layers whose mixer is not attention as ``mixer_layers``; the fields read are added to ``read``."""
    read |= set(HYBRID_FIELDS[hf_type])
    kinds = _layer_kinds(hf_type, c)
    mixers = sum(k != "full_attention" for k in kinds)
    if mixers == len(kinds):
        raise ConfigError(f"{'attn_layer_indices' if hf_type == 'bamba' else 'layer_types'}: no layer is attention; "
                          f"attnid counts a hybrid {hf_type} model with at least one attention layer")  # fmt: skip
    experts, shared = 0, 0
    if hf_type == "granitemoehybrid":
        ffn, experts, shared = _granite_mixture(c)
    elif hf_type in ("qwen3_next", "qwen3_5_moe"):  # a mixture in every layer, beside a gated shared expert
        mixture = _mixture_model(c, hf_type, read)
        ffn, experts = mixture.ffn, mixture.experts
        shared = _positive(c, "shared_expert_intermediate_size", default=None)
        if shared is None:
            raise ConfigError(f"shared_expert_intermediate_size: {hf_type}'s shared expert needs its inner size")
    else:
        ffn = lfm2_ffn(c) if hf_type == "lfm2" else _positive(c, "intermediate_size", default=None)
    try:
        block = block_config(
            hf_type, cfg.with_(causal=True), ffn, experts=experts, shared_ffn=shared if experts else None
        )
        layer = mixer_block(HF_TYPES[hf_type].mixer_layer()[1], block, _mixer_sizes(hf_type, c))
    except ValueError as e:
        raise ConfigError(f"config: {e}") from None
    tied = c.tie_word_embeddings
    if not isinstance(tied, bool):
        raise ConfigError(f"tie_word_embeddings: {printable(repr(tied))} must be true or false")
    return Model(c.num_hidden_layers, ffn, c.vocab_size, tied, "", experts=experts, shared_ffn=shared,
                 mixer_layers=((layer, mixers),) if mixers else ())  # fmt: skip
