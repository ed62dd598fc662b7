"""LFM2's short convolution (chapter 9), a sequence mixer that is not attention: ``in_proj`` gives each channel
``i`` three linear forms of the input, ``B_i``, ``C_i`` and ``x_i``; their product ``u_i = B_i x_i`` is convolved
along time with the channel's own causal filter of ``kernel`` taps, multiplied by ``C_i``, and ``out_proj`` mixes
the channels::

    y_t = W_out (C_t ⊙ (w ⋆ (B ⊙ x))_t) (+ b_out)

What keeps the function, per channel: a factor on ``B_i``'s row against its inverse on ``x_i``'s (only the product
``u_i`` is read), and factors on ``u_i``, on the filter and on ``C_i``'s row, which ``out_proj``'s column ``i``
takes back; with biases (``conv_bias``) each factor carries its row's bias, and the filter's bias, with it. Four
directions per channel, ``4 E`` in all; the output bias writes to the output and is identified. Nothing mixes two
channels: the filter is one per channel (depthwise), and a product of two linear forms has no other freedom.
"""

from __future__ import annotations

from ..inputs import check_sizes
from .attention import Count


def count_short_conv(embed: int, kernel: int, bias: bool = False) -> Count:
    """:class:`Count` of one short convolution of width ``embed`` E with ``kernel`` taps (LFM2's ``conv_L_cache``),
    with or without ``bias`` (``conv_bias``: on ``in_proj``, the filters and ``out_proj``): four free scales per
    channel (module docstring)."""
    check_sizes(embed=embed, kernel=kernel)
    E = embed
    params = {
        "in_proj": 3 * E * E + (3 * E if bias else 0),
        "filters": E * kernel + (E if bias else 0),
        "out_proj": E * E + (E if bias else 0),
    }
    return Count(sum(params.values()), params, {"channel_scales": 4 * E})
