import pytest
import torch
from torch import nn

from attnid.attention import (
    AttentionConfig,
    ColumnAttention,
    attention,
    concat_project_attention,
    from_fused,
    from_torch_mha,
    fused_qk_views,
    init_params,
    parse_bias,
    to_fused,
    to_torch_mha,
)

CONFIGS = [
    AttentionConfig(12, 3, bias="all"),
    AttentionConfig(12, 3, bias="none", causal=True),
    AttentionConfig(12, 4, groups=2, head_dim=4, value_dim=2, bias="qkv", rope=True, causal=True),
    AttentionConfig(8, 4, groups=1, head_dim=6, value_dim=5, bias="ko"),
    AttentionConfig(6, 3, head_dim=2, value_dim=2, bias="all", rope=True),
]


def _x(cfg, B=3, L=7, seed=1):
    return torch.randn(B, L, cfg.E, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_column_form_equals_concat_project(cfg):
    p = init_params(cfg, seed=3)
    x = _x(cfg)
    y_col = attention(x.transpose(1, 2), p, cfg).transpose(1, 2)
    y_cat = concat_project_attention(x, p, cfg)
    assert (y_col - y_cat).abs().max() <= 1e-10
    assert y_col.abs().max() > 1e-2  # not trivially zero


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_equals_torch_multihead_attention(bias, causal):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, bias=bias, batch_first=True, dtype=torch.float64)
    with torch.no_grad():  # torch initialises biases to zero; make them count
        for prm in mha.parameters():
            prm.add_(0.3 * torch.randn_like(prm))
    cfg, p = from_torch_mha(mha, causal=causal)
    x = _x(cfg, L=9)
    mask = torch.ones(9, 9, dtype=torch.bool).triu(1) if causal else None
    y_ref = mha(x, x, x, need_weights=False, attn_mask=mask)[0]
    y = attention(x.transpose(1, 2), p, cfg).transpose(1, 2)
    assert (y - y_ref).abs().max() <= 1e-10
    back = to_torch_mha(cfg, p)
    assert (back(x, x, x, need_weights=False, attn_mask=mask)[0] - y_ref).abs().max() <= 1e-10


def test_fused_round_trip_and_views():
    cfg = AttentionConfig(12, 3, bias="all", causal=True)
    p = init_params(cfg, seed=5)
    w, b, wp, bp = to_fused(cfg, p)
    cfg2, p2 = from_fused(w, b, wp, bp, 3)
    assert cfg2 == cfg
    for k in p:
        assert torch.equal(p[k], p2[k])
    W_Q, _b_Q, _W_K, b_K = fused_qk_views(w, b, 3)
    assert torch.equal(W_Q, p["W_Q"]) and torch.equal(b_K, p["b_K"])
    assert W_Q.data_ptr() == w.data_ptr()  # a view, not a copy


def test_module_wrapper_matches_function():
    cfg = AttentionConfig(8, 2, bias="qk")
    m = ColumnAttention(cfg, seed=2)
    X = _x(cfg).transpose(1, 2)
    assert torch.equal(m(X), attention(X, init_params(cfg, seed=2), cfg))


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(embed=10, heads=3), "heads"),
        (dict(embed=12, heads=4, groups=3), "groups"),
        (dict(embed=12, heads=4, head_dim=3, rope=True), "head_dim"),
        (dict(embed=0, heads=1), "embed"),
        (dict(embed=8, heads=-2), "heads"),
        (dict(embed=8, heads=2, value_dim=0), "value_dim"),
        (dict(embed=8, heads=2, bias="qx"), "bias"),
    ],
)
def test_bad_architecture_raises_named_error(kwargs, word):
    with pytest.raises(ValueError, match=word):
        AttentionConfig(**kwargs)


def test_parse_bias():
    assert parse_bias("all") == "qkvo" and parse_bias("none") == "" and parse_bias("v,q") == "qv"


def test_column_form_equals_the_training_models_attention():
    """The nanoGPT module's own forward (fused c_attn/c_proj, scaled_dot_product_attention), not a
    round trip through the converters."""
    from attnid.attention import from_fused
    from attnid.lm.gpt import CausalSelfAttention, GPTConfig

    torch.manual_seed(3)
    layer = CausalSelfAttention(GPTConfig(n_embd=24, n_head=4, bias=True)).double().eval()
    with torch.no_grad():
        for prm in layer.parameters():
            prm.normal_()
    cfg, p = from_fused(layer.c_attn.weight, layer.c_attn.bias, layer.c_proj.weight, layer.c_proj.bias, 4)
    x = torch.randn(3, 9, 24, dtype=torch.float64)
    y = attention(x.transpose(1, 2), p, cfg).transpose(1, 2)
    assert (layer(x) - y).abs().max() <= 1e-10 * y.abs().max()


def test_parameters_of_another_config_are_refused():
    cfg = AttentionConfig(16, 4, bias="all")
    X = torch.randn(2, 16, 5, dtype=torch.float64)
    other = init_params(AttentionConfig(16, 2, bias="all"))
    with pytest.raises(ValueError, match=r"W_Q: expected shape \(4, 4, 16\).*got \(2, 8, 16\)"):
        attention(X, other, cfg)
    with pytest.raises(ValueError, match="X: expected shape"):
        attention(X[:, :8], init_params(cfg), cfg)
    with pytest.raises(ValueError, match=r"\['b_K'\] missing"):
        attention(X, {k: v for k, v in init_params(cfg).items() if k != "b_K"}, cfg)
    with pytest.raises(ValueError, match=r"\['b_O'\] given but not"):
        attention(X, init_params(cfg), cfg.with_(bias="qkv"))
    with pytest.raises(ValueError, match="dtype"):
        attention(X.float(), init_params(cfg), cfg)
    with pytest.raises(TypeError, match="cfg"):
        attention(X, init_params(cfg), None)


@pytest.mark.parametrize(
    "kw, word",
    [
        (dict(embed=True, heads=True), "embed"),
        (dict(embed=8, heads=2, groups=True), "groups"),
        (dict(embed=8, heads=2, rope="yes"), "rope"),
        (dict(embed=8, heads=2, rope=True, rope_base=1.0), "rope_base"),
        (dict(embed=8, heads=2, rope=True, rope_base=float("nan")), "rope_base"),
        (dict(embed=8, heads=2, rope=True, rope_base=0.0), "rope_base"),
        (dict(embed=8, heads=2, rope=True, rope_base=-10.0), "rope_base"),
    ],
)
def test_config_refuses_wrong_types_and_degenerate_rope(kw, word):
    with pytest.raises(ValueError, match=word):
        AttentionConfig(**kw)
