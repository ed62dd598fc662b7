"""Mamba-2's mixer and decoder layer (chapter 9): the closed form of attnid.counting.mamba equals the Jacobian rank
of transformers' own Mamba2Mixer and Mamba2Block in float64, with a clear gap; a closed form without a mechanism is
refused, and so is a mixer that cannot be built."""

import pytest

pytest.importorskip("transformers")

from attnid.audit import audit_module
from attnid.counting import mamba
from attnid.hf import mamba as hf_mamba
from attnid.hf.build import HFAuditError
from attnid.hf.mixers import float64_forward

# widths 4 to 6: a fraction of a second each. Groups of B and C shared by heads or one per head, one to four taps,
# each bias on and off, the layer around the mixer at ε = 0 and ε > 0
SHAPES = [
    dict(embed=4, expand=2, heads=2, groups=1, state=2, kernel=3),
    dict(embed=4, expand=2, heads=2, groups=2, state=2, kernel=2),
    dict(embed=6, expand=1, heads=3, groups=3, state=2, kernel=3, conv_bias=False),
    dict(embed=4, expand=2, heads=1, groups=1, state=3, kernel=4),
    dict(embed=4, expand=2, heads=4, groups=2, state=2, kernel=2, bias=True),
    dict(embed=4, expand=2, heads=2, groups=1, state=2, kernel=1, bias=True),
    dict(embed=4, expand=2, heads=2, groups=1, state=2, kernel=3, bias=True, scope="block", norm_eps=1e-5),
    dict(embed=4, expand=2, heads=4, groups=2, state=2, kernel=3, scope="block"),
]


@pytest.mark.parametrize("kw", SHAPES, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_the_real_mixer_keeps_the_closed_forms_free_directions(kw):
    r = hf_mamba.audit_mamba2_hf(**kw)  # raises on a difference or a blurred gap
    assert r.unidentified == r.details["theory_unidentified"] == sum(r.details["terms"].values())
    assert r.sv_gap > 1e6
    inner = kw["expand"] * kw["embed"]
    conv_dim = inner + 2 * kw["groups"] * kw["state"]
    assert r.details["terms"]["channel_scales"] == conv_dim and r.details["terms"]["gated_norm_scale"] == inner


def test_a_closed_form_without_the_filters_trade_is_refused(monkeypatch):
    """Planted: the count without the trade of a channel's in_proj row against its filter (as if the convolution
    were not there): the real mixer's Jacobian refuses it."""
    original = mamba.count_mamba

    def without_filters(*args, **kwargs):
        c = original(*args, **kwargs)
        return c.__class__(c.total_params, c.params_by_block, {**c.unidentified_by_block, "channel_scales": 0})

    monkeypatch.setattr(hf_mamba, "count_mamba", without_filters)
    with pytest.raises(HFAuditError, match="the Jacobian gives"):
        hf_mamba.audit_mamba2_hf(**SHAPES[0])


def test_two_taps_and_both_biases_free_c_at_the_first_token_when_each_group_is_one_head():
    """Two taps with both biases: a channel's bias pair moves it at the first token alone, where C is read through
    one number per head, which the gated norm removes at ε = 0 when each group is one head: groups x state more
    free directions. Not with groups shared by two heads, and only nearly at ε > 0 (planted: the closed form
    without that term is refused at ε = 0)."""
    kw = dict(embed=4, expand=2, heads=2, groups=2, state=2, kernel=2, bias=True, conv_bias=True)
    r = hf_mamba.audit_mamba2_hf(**kw)
    assert r.details["terms"]["first_token_biases"] == 2 * 2 and r.sv_gap > 1e6
    assert hf_mamba.audit_mamba2_hf(**kw, norm_eps=1e-2).details["terms"]["first_token_biases"] == 0
    assert hf_mamba.audit_mamba2_hf(**{**kw, "heads": 4}).details["terms"]["first_token_biases"] == 0
    module, x = hf_mamba.build_mamba2(**kw, scope="mixer")
    without = mamba.count_mamba(4, 8, 2, 2, 2, 2, bias=True, norm_eps_zero=False).unidentified
    assert audit_module(module, (x,), forward=float64_forward).unidentified == without + 2 * 2


@pytest.mark.parametrize(
    "args,named",
    [
        ((4, 8, 3, 1, 2, 3), "heads: 3 heads must divide the 8 inner channels"),
        ((4, 8, 2, 4, 2, 3), "groups: 4 groups of B and C must divide the 2 heads"),
        ((4, 8, 2, 1, 0, 3), "state must be an integer >= 1"),
    ],
)
def test_a_mixer_that_cannot_be_built_is_refused_by_name(args, named):
    with pytest.raises(ValueError, match=named):
        mamba.count_mamba(*args)
