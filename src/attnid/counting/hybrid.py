"""The decoder layers of hybrid models whose sequence mixer is not attention (chapter 9): LFM2's short-convolution
layers, Bamba's Mamba-2 layers and Qwen3-Next's Gated DeltaNet, beside attention layers. Such a layer is wired as a
pre-norm attention layer is,

    h = x + mixer(N₁ x),    y = h + mlp(N₂ h),

with RMSNorms ``N₁``, ``N₂`` and a gated MLP (or a mixture of experts). Its free directions are the mixer's own
(:mod:`.short_conv`, :mod:`.mamba`, :mod:`.gated_deltanet`), each norm's weight against the columns of the maps that
read it (``E`` each: the mixer's input projections read ``N₁``, the MLP's gate and up maps ``N₂``), and the MLP's
own (its unit scales, ``F``), as in an attention layer (:func:`attnid.counting.count_block`).
:class:`attnid.counting.MixerBlock` holds the layer as the attention layer it replaces, and
:func:`attnid.counting.count_mixer_block` counts it. Across layers nothing new appears: the mixers read the stream
through a norm and a linear map and write to it through a linear map, as attention does, so a whole model's terms
(the stream's rotation and scale, the final norm, the logit shift) are those of :func:`attnid.counting.count_model`."""

from __future__ import annotations

from ..inputs import check_sizes
from .gated_deltanet import count_gated_deltanet
from .mamba import count_mamba
from .models import BlockConfig, MixerBlock
from .short_conv import count_short_conv

# the mixers a hybrid layer can hold, by the name its count prints, with the sizes :func:`mixer_block` takes for each
MIXER_SIZES = {
    "short convolution": ("kernel", "bias"),  # LFM2: count_short_conv's
    "mamba2": ("expand", "heads", "groups", "state", "kernel", "bias", "conv_bias"),  # Bamba: count_mamba's
    # Qwen3-Next: count_gated_deltanet's
    "gated deltanet": ("key_heads", "value_heads", "key_dim", "value_dim", "kernel"),
}
MIXERS = tuple(MIXER_SIZES)


def mixer_block(mixer: str, block: BlockConfig, sizes: dict, *, norm_eps_zero: bool = False) -> MixerBlock:
    """The :class:`~attnid.counting.MixerBlock` of ``block`` (its norms and MLP) around ``mixer`` of ``sizes`` (its
    names in :data:`MIXER_SIZES`: ``expand x E`` inner channels for Mamba-2); ``norm_eps_zero``: the mixer's norms'
    ε is 0 (released models have ε > 0)."""
    if mixer not in MIXER_SIZES:
        raise ValueError(f"mixer: expected one of {', '.join(MIXERS)}, got {mixer!r}")
    if set(sizes) != set(MIXER_SIZES[mixer]):
        raise ValueError(f"sizes: a {mixer} has sizes {', '.join(MIXER_SIZES[mixer])}, got {', '.join(sorted(sizes))}")
    s, E = sizes, block.E
    if mixer == "short convolution":
        return MixerBlock(mixer, count_short_conv(E, s["kernel"], s["bias"]), block)
    if mixer == "gated deltanet":
        gdn = count_gated_deltanet(E, s["key_heads"], s["value_heads"], s["key_dim"], s["value_dim"], s["kernel"])
        return MixerBlock(mixer, gdn, block)
    check_sizes(expand=s["expand"])
    mamba = count_mamba(E, s["expand"] * E, s["heads"], s["groups"], s["state"], s["kernel"], bias=s["bias"],
                        conv_bias=s["conv_bias"], norm_eps_zero=norm_eps_zero)  # fmt: skip
    return MixerBlock(mixer, mamba, block)
