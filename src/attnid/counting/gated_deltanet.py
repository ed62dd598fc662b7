"""Gated DeltaNet (chapter 9), the linear attention of Qwen3-Next's layers that are not softmax attention.
``in_proj_qkvz`` gives queries and keys (``key_heads`` heads of ``key_dim``), values and a gate ``z`` (``value_heads``
heads of ``value_dim``), ``in_proj_ba`` a write strength ``b`` and a decay input ``a`` per value head; the channels of
``q``, ``k`` and ``v`` are each convolved along time with their own causal filter of ``kernel`` taps (no bias) and
passed through SiLU; queries and keys are then normalised to unit length per head, and each value head runs the
delta rule on a matrix state,

    S_t = exp(g_t) S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ,    o_t = S_t q_t,
    β_t = σ(b_t),    g_t = -exp(A_log) softplus(a_t + dt_bias),

and ``out_proj`` reads ``w ⊙ n(o) ⊙ silu(z)``, an RMSNorm over each head's ``value_dim`` channels whose weight ``w``
(``value_dim`` entries) all value heads share.

What keeps the function: a factor on a convolved channel's ``in_proj_qkvz`` row against its inverse on the channel's
filter, which reads that row alone, before the SiLU (``2 key_heads key_dim + value_heads value_dim`` directions); and
a factor on the shared norm weight's entry ``i`` against its inverse on ``out_proj``'s columns of channel ``i`` in
every value head (``value_dim``). Nothing else: queries and keys leave a SiLU and a unit-length normalisation, so the
state-basis changes the delta rule alone allows reach no parameter; ``β``, the decay and the gate leave a sigmoid, a
softplus and a SiLU.
"""

from __future__ import annotations

from ..inputs import check_sizes
from .attention import Count


def count_gated_deltanet(
    embed: int, key_heads: int, value_heads: int, key_dim: int, value_dim: int, kernel: int
) -> Count:
    """:class:`Count` of one Gated DeltaNet layer of width ``embed`` E (Qwen3-Next's ``linear_*`` sizes: key and
    value heads and their dimensions, ``linear_conv_kernel_dim`` taps): the free directions of the module
    docstring."""
    check_sizes(
        embed=embed, key_heads=key_heads, value_heads=value_heads, key_dim=key_dim, value_dim=value_dim, kernel=kernel
    )
    if value_heads % key_heads:
        raise ValueError(f"key_heads: {key_heads} key heads must divide the {value_heads} value heads")
    E, keys, values = embed, key_heads * key_dim, value_heads * value_dim
    conv_dim = 2 * keys + values
    params = {
        "in_proj": E * (2 * keys + 2 * values) + E * 2 * value_heads,  # q, k, v, z; then b and a per value head
        "filters": conv_dim * kernel,
        "decay": 2 * value_heads,  # dt_bias, A_log
        "gated_norm": value_dim,
        "out_proj": values * E,
    }
    return Count(sum(params.values()), params, {"channel_scales": conv_dim, "gated_norm_scale": value_dim})
