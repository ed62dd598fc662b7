import pytest

from attnid.attention import AttentionConfig
from attnid.counting import (
    count,
    multi_head_params,
    orthonormal_qk_dof,
    qk_identified_fraction,
    single_head_params,
    total_params,
)
from attnid.presets import PRESETS, preset


def test_textbook_formulas():
    assert single_head_params(6, 2) == 2 * 2 * 6 + 36
    assert multi_head_params(384, 6, 64, 64) == 4 * 384**2
    assert qk_identified_fraction(384, 384) == 0.5
    assert qk_identified_fraction(384, 64) == 1 - 1 / 12
    assert orthonormal_qk_dof(384, 64) == 2 * 64 * 384 - 64**2


@pytest.mark.parametrize("E,H", [(64, 8), (384, 6), (768, 12)])
def test_multi_head_unidentified_share_is_one_over_2H(E, H):
    c = count(AttentionConfig(E, H))
    assert c.total_params == 4 * E * E
    assert c.unidentified == 2 * E * E // H
    assert c.identified_fraction == pytest.approx(1 - 1 / (2 * H), abs=1e-15)


def test_llama_2_70b_qk_counts():
    cfg = preset("llama-2-70b")
    assert (cfg.E, cfg.H, cfg.G, cfg.D) == (8192, 64, 8, 128)
    assert count(cfg.with_(groups=64, rope=False)).unidentified_by_block["qk"] == 1_048_576  # H·D²
    assert count(cfg.with_(rope=False)).unidentified_by_block["qk"] == 131_072  # G·D²
    assert count(cfg).unidentified_by_block["qk"] == 1_024  # G·D
    assert count(cfg).unidentified_by_block["vo"] == 131_072  # G·C²


def test_bias_blocks():
    c = count(AttentionConfig(64, 8, bias="all"))
    assert c.unidentified_by_block == {"qk": 512, "vo": 512, "key_bias": 64, "value_bias": 64}
    assert c.unidentified == 1152 and c.total_params == 16_640
    rope = count(AttentionConfig(64, 8, bias="all", rope=True))
    assert rope.unidentified_by_block["key_bias"] == 0 and rope.unidentified_by_block["qk"] == 64
    assert count(AttentionConfig(64, 8, bias="qkv")).unidentified_by_block["value_bias"] == 0


def test_presets_are_real_configs():
    assert len(PRESETS) >= 8
    gpt2 = preset("gpt2")
    assert total_params(gpt2) == 4 * 768**2 + 4 * 768
    assert preset("qwen2-7b").bias == "qkv" and preset("qwen2-7b").G == 4
    with pytest.raises(ValueError, match="preset"):
        preset("gpt-5")


def test_rope_with_large_head_dim_is_refused():
    with pytest.raises(ValueError, match="head_dim"):
        count(AttentionConfig(4, 1, head_dim=6, rope=True))


def test_equivalent_single_head_width():
    from attnid.counting import equivalent_single_head_width, single_head_total_over_multi

    assert equivalent_single_head_width(12, "half_of_all") == pytest.approx(1.5986, abs=1e-4)  # "60% larger"
    assert equivalent_single_head_width(12, "qk_square_v") == pytest.approx((2 - 1 / 12) ** 0.5)
    assert equivalent_single_head_width(1, "full_head") == pytest.approx(1.0)
    assert single_head_total_over_multi(1, "full_head") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="convention"):
        equivalent_single_head_width(4, "bogus")


def test_wrong_argument_types_name_the_argument():
    import pytest

    from attnid.attention import AttentionConfig

    with pytest.raises(TypeError, match="cfg"):
        count(None)
    with pytest.raises(TypeError, match="bias"):
        AttentionConfig(8, 2, bias=123)
