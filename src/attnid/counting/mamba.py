"""Mamba-2's mixer (chapter 9), the state-space layer of the hybrid models of 2025 (Granite 4, Falcon-H1, Zamba2,
Bamba), a sequence mixer that is not attention. ``in_proj`` gives a gate ``z`` (``inner`` wide), the ``conv_dim =
inner + 2 groups state`` channels of ``x``, ``B`` and ``C``, and a time step per head; each of those channels is
convolved along time with its own causal filter of ``kernel`` taps (plus a bias) and passed through SiLU; per head
``h`` (``inner / heads`` channels of ``x``, the ``B`` and ``C`` of its group) the scan

    s_t = exp(Δ_t A_h) s_{t-1} + Δ_t x_t B_tᵀ,    y_t = s_t C_t + D_h x_t,    Δ_t = softplus(dt_t + dt_bias_h)

runs, and ``out_proj`` reads ``w ⊙ n(y ⊙ silu(z))``, an RMSNorm ``n`` over each group's channels with a weight ``w``.

What keeps the function: a factor on a convolved channel's ``in_proj`` row (and its bias) against its inverse on the
channel's filter, since the filter reads that row alone, before its bias and the SiLU (``conv_dim`` directions); a
factor on the gated norm's weight ``w_i`` against its inverse on ``out_proj``'s column ``i`` (``inner``); and, with
``in_proj`` biases (``use_bias``), the bias of a head's time-step row against ``dt_bias_h``, which only their sum
reaches (``heads``). Nothing else in general: ``B`` and ``C`` leave the SiLU, so the change of state basis ``B → Mᵀ B``,
``C → M⁻¹ C`` that the scan alone allows reaches no parameter; the time step leaves a softplus, the decay ``A_h`` and
the skip ``D_h`` are read as they are. With one tap (``kernel = 1``) and both biases, a channel's ``in_proj`` bias
and its filter's bias reach it only as ``w b + c`` (``conv_dim`` more). With two taps and both biases, that pair
changes a channel at the first token alone; ``C`` there is read only through ``y_0 = (Δ_0 B_0·C_0 + D_h) x_0``, one
number per head times ``x_0``, which the gated norm removes when each group of its channels is one head
(``groups = heads``) and its ε is 0: one more direction per ``C`` channel (``groups state``); at ε > 0 they are only
nearly free. A decoder layer (``x + mixer(N(x))``) adds its RMSNorm's weight against ``in_proj``'s columns
(``embed``).
"""

from __future__ import annotations

from ..inputs import check_sizes
from .attention import Count


def count_mamba(
    embed: int, inner: int, heads: int, groups: int, state: int, kernel: int, *, bias: bool = False,
    conv_bias: bool = True, block: bool = False, norm_eps_zero: bool = True,
) -> Count:  # fmt: skip
    """:class:`Count` of one Mamba-2 mixer of width ``embed`` E, ``inner`` channels (``expand x E``) in ``heads``
    heads, ``groups`` groups of ``B`` and ``C`` with ``state`` dimensions each, filters of ``kernel`` taps, ``bias``
    on ``in_proj`` and ``out_proj`` (``use_bias``) and on the filters (``conv_bias``); with ``block``, the decoder
    layer around it (an RMSNorm before it, a residual); ``norm_eps_zero``: the norms' ε is 0 (released models have
    ε > 0). The free directions are the module docstring's."""
    check_sizes(embed=embed, inner=inner, heads=heads, groups=groups, state=state, kernel=kernel)
    if inner % heads:
        raise ValueError(f"heads: {heads} heads must divide the {inner} inner channels")
    if heads % groups:
        raise ValueError(f"groups: {groups} groups of B and C must divide the {heads} heads")
    E, conv_dim = embed, inner + 2 * groups * state
    projected = inner + conv_dim + heads  # z, then x, B and C, then a time step per head
    params = {
        "in_proj": E * projected + (projected if bias else 0),
        "filters": conv_dim * kernel + (conv_dim if conv_bias else 0),
        "scan": 3 * heads,  # dt_bias, A_log, D
        "gated_norm": inner,
        "out_proj": inner * E + (E if bias else 0),
    }
    both_biases = bias and conv_bias
    first_token = groups * state if kernel == 2 and both_biases and groups == heads and norm_eps_zero else 0
    free = {"channel_scales": conv_dim, "gated_norm_scale": inner, "time_step_bias": heads if bias else 0,
            "filter_bias": conv_dim if kernel == 1 and both_biases else 0,
            "first_token_biases": first_token}  # fmt: skip
    if block:
        params["norm"] = E
        free["norm_scale"] = E
    return Count(sum(params.values()), params, free)
