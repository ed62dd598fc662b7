"""Gated DeltaNet, Qwen3-Next's linear attention (chapter 9): the closed form of attnid.counting.gated_deltanet equals
the Jacobian rank of transformers' own Qwen3NextGatedDeltaNet and Qwen3_5GatedDeltaNet in float64, with a clear gap; a
closed form that takes the shared norm weight for one per value channel is refused."""

import pytest

pytest.importorskip("transformers")

from attnid.counting import gated_deltanet
from attnid.hf import gated_deltanet as hf_gdn
from attnid.hf.build import HFAuditError

# small widths, a fraction of a second to a few seconds each: key heads shared by value heads or one each, two to
# four taps, the norm at ε = 0 and ε > 0
SHAPES = [
    dict(embed=4, key_heads=1, value_heads=2, key_dim=2, value_dim=2, kernel=2, norm_eps=1e-6),
    dict(embed=6, key_heads=1, value_heads=3, key_dim=3, value_dim=2, kernel=2),
    dict(embed=6, key_heads=2, value_heads=2, key_dim=2, value_dim=3, kernel=3),
    dict(embed=4, key_heads=1, value_heads=1, key_dim=3, value_dim=3, kernel=4),
]


@pytest.mark.parametrize("hf_type", ["qwen3_next", "qwen3_5"])
@pytest.mark.parametrize("kw", SHAPES, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_the_real_layer_keeps_the_closed_forms_free_directions(kw, hf_type):
    """Qwen3-Next's layer and Qwen3.5's, whose maps into the convolved channels, the gate and the decay are four
    matrices apart rather than two of each head's maps side by side: the same function, the same count."""
    r = hf_gdn.audit_gated_deltanet_hf(**kw, hf_type=hf_type)  # raises on a difference or a blurred gap
    assert r.unidentified == r.details["theory_unidentified"] == sum(r.details["terms"].values())
    assert r.sv_gap > 1e6
    conv_dim = 2 * kw["key_heads"] * kw["key_dim"] + kw["value_heads"] * kw["value_dim"]
    assert r.details["terms"] == {"channel_scales": conv_dim, "gated_norm_scale": kw["value_dim"]}


def test_a_closed_form_with_a_norm_weight_per_value_channel_is_refused(monkeypatch):
    """Planted: the norm weight taken as one per value channel of every head (as Mamba-2's gated norm has), not one
    shared by the heads: the real layer's Jacobian refuses it."""
    original = gated_deltanet.count_gated_deltanet

    def per_channel(embed, key_heads, value_heads, key_dim, value_dim, kernel):
        c = original(embed, key_heads, value_heads, key_dim, value_dim, kernel)
        return c.__class__(c.total_params, c.params_by_block,
                           {**c.unidentified_by_block, "gated_norm_scale": value_heads * value_dim})  # fmt: skip

    monkeypatch.setattr(hf_gdn, "count_gated_deltanet", per_channel)
    with pytest.raises(HFAuditError, match="the Jacobian gives"):
        hf_gdn.audit_gated_deltanet_hf(**SHAPES[1])


def test_a_layer_that_cannot_be_built_is_refused_by_name():
    with pytest.raises(ValueError, match="key_heads: 2 key heads must divide the 3 value heads"):
        gated_deltanet.count_gated_deltanet(6, 2, 3, 2, 2, 2)
    with pytest.raises(ValueError, match="kernel must be an integer >= 1"):
        gated_deltanet.count_gated_deltanet(6, 1, 3, 2, 2, 0)
