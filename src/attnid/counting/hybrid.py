"""The decoder layers of hybrid models whose sequence mixer is not attention (chapter 9): LFM2's short-convolution
layers and Bamba's Mamba-2 layers, beside attention layers. Such a layer is wired as a pre-norm
attention layer is,

    h = x + mixer(N₁ x),    y = h + mlp(N₂ h),

with RMSNorms ``N₁``, ``N₂`` and a gated MLP. Its free directions are the mixer's own (:mod:`.short_conv`,
:mod:`.mamba`, :mod:`.gated_deltanet`), each norm's weight against the columns of the maps that read it (``E``
each: the mixer's input projections read ``N₁``, the MLP's gate and up maps ``N₂``), and the MLP's unit scales
(``F``), as in an attention layer (:func:`attnid.counting.count_block`). Across layers nothing new appears: the
mixers read the stream through a norm and a linear map and write to it through a linear map, as attention does, so
a whole model's terms (the stream's rotation and scale, the final norm, the logit shift) are those of
:func:`attnid.counting.count_model`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..inputs import check_sizes
from .attention import Count
from .mamba import count_mamba
from .short_conv import count_short_conv

# the mixers a hybrid layer can hold, by the name its count prints, with the sizes :func:`mixer_block` takes for each
MIXER_SIZES = {
    "short convolution": ("kernel", "bias"),  # LFM2: count_short_conv's
    "mamba2": ("expand", "heads", "groups", "state", "kernel", "bias", "conv_bias"),  # Bamba: count_mamba's
}
MIXERS = tuple(MIXER_SIZES)


@dataclass(frozen=True)
class MixerBlock:
    """One decoder layer of width ``embed`` around a sequence mixer that is not attention: ``mixer`` (one of
    :data:`MIXERS`) with its closed form ``count`` (:func:`~attnid.counting.short_conv.count_short_conv` or
    :func:`~attnid.counting.mamba.count_mamba` without its block; :func:`mixer_block` builds either), two RMSNorms
    and a gated MLP of inner size ``ffn`` without biases (module docstring)."""

    mixer: str
    count: Count
    embed: int
    ffn: int

    def __post_init__(self) -> None:
        if self.mixer not in MIXERS:
            raise ValueError(f"mixer: expected one of {', '.join(MIXERS)}, got {self.mixer!r}")
        if not isinstance(self.count, Count):
            raise TypeError(f"count: expected the mixer's Count, got {type(self.count).__name__}")
        if "norm_scale" in self.count.unidentified_by_block:
            raise ValueError("count: give the mixer's own count (the layer's norms are counted here)")
        check_sizes(embed=self.embed, ffn=self.ffn)


def count_mixer_block(block: MixerBlock) -> Count:
    """Unidentified dimensions of one hybrid layer (module docstring): the mixer's terms, ``norm_scale`` (``2 E``: the
    two norms' weights against their readers' columns) and ``mlp_rescaling`` (``F``: the gated MLP's up row ``j``
    against its down column ``j``)."""
    if not isinstance(block, MixerBlock):
        raise TypeError(f"block: expected a MixerBlock, got {type(block).__name__}")
    E, F = block.embed, block.ffn
    params = {"mixer": block.count.total_params, "norms": 2 * E, "mlp": 3 * E * F}
    terms = {**block.count.unidentified_by_block, "norm_scale": 2 * E, "mlp_rescaling": F}
    return Count(sum(params.values()), params, terms)


def mixer_block(mixer: str, embed: int, ffn: int, sizes: dict, *, norm_eps_zero: bool = False) -> MixerBlock:
    """The :class:`MixerBlock` of width ``embed`` around ``mixer`` of ``sizes`` (its names in :data:`MIXER_SIZES`:
    ``expand x embed`` inner channels for Mamba-2) and a gated MLP of inner size ``ffn``; ``norm_eps_zero``: the
    norms' ε is 0 (released models have ε > 0)."""
    if mixer not in MIXER_SIZES:
        raise ValueError(f"mixer: expected one of {', '.join(MIXERS)}, got {mixer!r}")
    if set(sizes) != set(MIXER_SIZES[mixer]):
        raise ValueError(f"sizes: a {mixer} has sizes {', '.join(MIXER_SIZES[mixer])}, got {', '.join(sorted(sizes))}")
    s = sizes
    if mixer == "short convolution":
        return MixerBlock(mixer, count_short_conv(embed, s["kernel"], s["bias"]), embed, ffn)
    check_sizes(expand=s["expand"])
    mamba = count_mamba(embed, s["expand"] * embed, s["heads"], s["groups"], s["state"], s["kernel"], bias=s["bias"],
                        conv_bias=s["conv_bias"], norm_eps_zero=norm_eps_zero)  # fmt: skip
    return MixerBlock(mixer, mamba, embed, ffn)
