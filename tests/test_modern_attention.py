"""The attention of recent models: QK-norm (at ε = 0, where the norms' scales are exact symmetries, and ε > 0,
where they are not) and logit soft-capping. The closed form of :func:`attnid.counting.count` against the
Jacobian rank of our own layer and of the real Qwen3, OLMo 2 and Gemma 2 attention modules."""

import pytest
import torch

from attnid.attention import AttentionConfig, attention, concat_project_attention, init_params
from attnid.audit import audit
from attnid.counting import count

SHAPES = [  # every kind of sharing, RoPE on all, part or none of each head, biases
    dict(embed=16, heads=4),
    dict(embed=16, heads=4, rope=True),
    dict(embed=12, heads=2, head_dim=6, rope_dims=2),
    dict(embed=16, heads=4, groups=2, bias="qkvo", rope=True),
    dict(embed=16, heads=4, groups=1, bias="qkvo"),
    dict(embed=16, heads=2, groups=1, head_dim=8, rope=True, bias="qk"),
]


@pytest.mark.parametrize("qk_norm", ["head", "proj"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_qk_norm_count_equals_the_jacobian_rank(qk_norm, shape):
    cfg = AttentionConfig(qk_norm=qk_norm, causal=True, **shape)
    res = audit(cfg, seed=0)
    assert res.unidentified == count(cfg).unidentified and res.sv_gap > 1e6


@pytest.mark.parametrize("qk_norm", ["head", "proj"])
def test_a_positive_epsilon_leaves_only_the_weight_trade(qk_norm):
    """ε > 0: the scale of a normalised projection changes the output (slightly), so only the trade of the
    query-norm weight against the key-norm weight stays unidentified."""
    cfg = AttentionConfig(16, 4, groups=2, rope=True, causal=True, qk_norm=qk_norm, qk_norm_eps=0.05)
    scales = {"head": 4 + 2, "proj": 2}[qk_norm]
    assert count(cfg.with_(qk_norm_eps=0.0)).unidentified - count(cfg).unidentified == scales
    res = audit(cfg, seed=0)
    assert res.unidentified == count(cfg).unidentified and res.sv_gap > 1e6


def test_qk_norm_layer_equals_an_independent_implementation():
    for qk_norm in ("head", "proj"):
        cfg = AttentionConfig(16, 4, groups=2, bias="qkvo", rope=True, causal=True, qk_norm=qk_norm, qk_norm_eps=1e-3)
        p = init_params(cfg, seed=1)
        X = torch.randn(3, 16, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        ours = attention(X, p, cfg)
        theirs = concat_project_attention(X.transpose(1, 2), p, cfg).transpose(1, 2)
        assert float((ours - theirs).abs().max()) < 1e-12


def test_qk_norm_terms_of_a_published_shape():
    """Qwen3-8B's attention (E 4096, 32 heads in 8 groups of 128, RoPE): H + G + D/2 = 104 in the QK block,
    against G D = 1,024 for the same layer without QK-norm."""
    cfg = AttentionConfig(4096, 32, groups=8, head_dim=128, rope=True, qk_norm="head")
    assert count(cfg).unidentified_by_block["qk"] == 32 + 8 + 64
    assert count(cfg.with_(qk_norm="")).unidentified_by_block["qk"] == 8 * 128
    olmo = AttentionConfig(4096, 32, rope=True, qk_norm="proj")  # OLMo-2-7B: a weight per coordinate
    assert count(olmo).unidentified_by_block["qk"] == 2 + 32 * 64


@pytest.mark.parametrize(
    "shape",
    [
        dict(heads=4, bias="qkvo"),
        dict(heads=2, head_dim=8, rope_dims=4, bias="qkvo"),
        dict(heads=4, groups=1, bias="kv"),
    ],
    ids=["no-rope", "partial-rope", "mqa"],
)
def test_soft_capping_identifies_the_key_bias(shape):
    """c tanh(a / c) keeps every symmetry of the raw scores but not the softmax's per-query shift: the key
    bias (its unrotated coordinates) becomes identified, and nothing else changes."""
    cfg = AttentionConfig(16, causal=True, logit_softcap=1.0, **shape)
    res = audit(cfg, seed=0)
    assert res.unidentified == count(cfg).unidentified and res.sv_gap > 1e6
    plain = count(cfg.with_(logit_softcap=None))
    assert plain.unidentified_by_block["key_bias"] > 0 == count(cfg).unidentified_by_block["key_bias"]
    assert plain.unidentified - count(cfg).unidentified == plain.unidentified_by_block["key_bias"]
    X = torch.randn(2, 16, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    p = init_params(cfg, seed=1)
    theirs = concat_project_attention(X.transpose(1, 2), p, cfg).transpose(1, 2)
    assert float((attention(X, p, cfg) - theirs).abs().max()) < 1e-12


def test_bad_qk_norm_settings_are_refused():
    with pytest.raises(ValueError, match="qk_norm: expected one of"):
        AttentionConfig(16, 4, qk_norm="batch")
    with pytest.raises(ValueError, match="qk_norm_eps must be a number"):
        AttentionConfig(16, 4, qk_norm="head", qk_norm_eps=-1.0)
    with pytest.raises(ValueError, match="logit_softcap must be a positive finite number"):
        AttentionConfig(16, 4, logit_softcap=0.0)


hf = pytest.importorskip("attnid.hf")


@pytest.mark.parametrize(
    "hf_type, kw",
    [
        ("qwen3", dict(embed=16, heads=4, groups=2)),
        ("qwen3", dict(embed=16, heads=4, groups=4, bias="qkvo")),
        ("qwen3", dict(embed=16, heads=2, groups=1, head_dim=8)),
        ("olmo2", dict(embed=16, heads=4, groups=2)),
        ("olmo2", dict(embed=16, heads=4, groups=4, bias="qkvo")),
        ("olmo2", dict(embed=16, heads=2, groups=1)),
        ("gemma3", dict(embed=16, heads=4, groups=2)),  # QK-norm per head with Gemma's (1 + w) RMSNorm
        ("gemma3", dict(embed=16, heads=2, groups=2, head_dim=8, norm_eps=0.05)),  # ε > 0: the scales are not free
        ("gemma2", dict(embed=16, heads=4, groups=4, bias="qkvo")),  # soft-capped at its released c = 50
        ("gemma2", dict(embed=16, heads=2, groups=1, head_dim=8)),
    ],
)
def test_real_modules_of_recent_models_equal_the_closed_form(hf_type, kw):
    pytest.importorskip("transformers")
    res = hf.audit_hf(hf_type, **kw)  # raises HFAuditError on a difference or a gap under 1e6
    assert res.unidentified == res.details["theory_unidentified"] and res.sv_gap >= hf.MIN_GAP
    assert res.details["attn_implementation"] == ("eager" if hf_type == "gemma2" else "sdpa")  # what ran


def test_a_soft_capped_block_says_it_ran_eager():
    """Gemma 2's block and model are built eager (sdpa cannot cap the scores): their details say so, as the
    attention scope's do; the recorded implementation follows the soft cap, so a model without one says sdpa."""
    for hf_type in ("gemma2", "llama"):
        assert hf.implementation_of(hf_type) == ("eager" if hf_type == "gemma2" else "sdpa")
        plan = hf.SCOPE_AUDITS["block"](hf_type, AttentionConfig(8, 2, groups=1), seed=0, ffn=None, norm_eps=1e-6)
        assert plan.details["attn_implementation"] == hf.implementation_of(hf_type)


def test_real_qwen3_decoder_layer_equals_the_closed_form():
    pytest.importorskip("transformers")
    res = hf.audit_hf("qwen3", scope="block", embed=8, heads=2, groups=1)
    assert res.unidentified == res.details["theory_unidentified"] and res.sv_gap >= hf.MIN_GAP
    assert res.details["terms"]["qk"] == 2 + 1 + 2  # H + G + D/2


@pytest.mark.parametrize("hf_type", ["olmo2", "gemma3"])
def test_a_norm_after_a_sublayer_frees_its_scale_at_eps_zero_only(hf_type):
    """Chapter 9: a norm after the attention (or the MLP) ignores the scale of what it normalises at ε = 0, one
    free direction per such norm; at ε = 0.05 the audit finds them (and the QK-norm scales) identified, and the
    closed form, told ε, drops exactly them."""
    pytest.importorskip("transformers")
    kw = dict(embed=8, heads=2, groups=1, ffn=12, scope="block")
    exact = hf.audit_hf(hf_type, **kw)
    assert exact.details["terms"]["post_norm_scale"] == 2
    moved = hf.audit_hf(hf_type, norm_eps=0.05, **kw)
    assert moved.details["terms"]["post_norm_scale"] == 0 and moved.sv_gap >= hf.MIN_GAP
    qk_scales = 2 + 1 if hf_type == "gemma3" else 2  # H + G per head, 2 over the projection
    assert exact.unidentified - moved.unidentified == 2 + qk_scales
    # no stream rotation in a model whose norms write to the stream
    assert hf.audit_hf(hf_type, embed=8, heads=2, ffn=12, scope="model").details["terms"]["stream_rotation"] == 0


def test_cli_refuses_norm_eps_for_an_attention_without_norms(capsys):
    from attnid.cli import main

    assert main(["audit", "--hf", "llama", "--norm-eps", "0.1"]) == 2
    assert "llama's attention has no norm; audit a block or a model (--block, --model)" in capsys.readouterr().err


def test_a_post_norm_block_refuses_what_it_was_not_derived_for():
    from attnid.counting import BlockConfig, ModelConfig

    with pytest.raises(ValueError, match="counted with RMSNorm and a sequential"):
        BlockConfig(AttentionConfig(8, 2), 8, norm="layer", norm_position="post")
    with pytest.raises(ValueError, match="norm_position: expected one of"):
        BlockConfig(AttentionConfig(8, 2), 8, norm="rms", norm_position="middle")
    with pytest.raises(ValueError, match="a softmax router over one expert gives it weight 1"):
        BlockConfig(AttentionConfig(8, 2), 8, norm="rms", mlp="swiglu", mlp_bias=False, experts=1, router="softmax")
    with pytest.raises(ValueError, match="shared experts belong to a mixture"):
        BlockConfig(AttentionConfig(8, 2), 8, norm="rms", mlp="swiglu", mlp_bias=False, shared_ffn=4)
    post = BlockConfig(AttentionConfig(8, 2), 8, norm="rms", mlp="swiglu", mlp_bias=False, norm_position="post")
    with pytest.raises(ValueError, match="the same ε"):
        ModelConfig(post, 2, 16, norm_eps_zero=True)  # its blocks' norms have ε > 0
    with pytest.raises(ValueError, match="dense layers replace a mixture"):
        ModelConfig(post, 2, 16, dense_layers=1, dense_ffn=8)


def _regression(cfg, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(4, cfg.E, 6, dtype=torch.float64, generator=g)
    T = torch.randn(4, cfg.E, 6, dtype=torch.float64, generator=g)
    return lambda q: ((attention(X, q, cfg) - T) ** 2).mean()


@pytest.mark.parametrize("qk_norm", ["head", "proj"])
def test_gradient_flow_conserves_the_norm_scales_at_eps_zero_and_the_weight_trade_always(qk_norm):
    """Noether for QK-norm (chapter 9): the rates d/dt of ‖[W | b]‖² of each normalised projection and of
    Σ g_Q² − Σ g_K² per trade group are zero at ε = 0; at ε = 0.05 the scales move and the trade does not."""
    from attnid.dynamics import qk_norm_flow_rates

    cfg = AttentionConfig(16, 4, groups=2, bias="qkvo", rope_dims=2, causal=True, qk_norm=qk_norm)
    p = init_params(cfg, seed=0)
    exact = qk_norm_flow_rates(p, cfg, _regression(cfg))
    assert max(float(v.abs().max()) for v in exact.values()) < 1e-12
    eps = cfg.with_(qk_norm_eps=0.05)
    moved = qk_norm_flow_rates(p, eps, _regression(eps))
    assert float(moved["scale_Q"].abs().min()) > 1e-4 and float(moved["trade"].abs().max()) < 1e-12


def test_a_rotated_pair_trades_as_one(monkeypatch):
    """Planted: treat the two coordinates of a rotated pair as two trades. RoPE mixes them, so the split
    quantities are not conserved; the unrotated coordinates, alone, still are."""
    from attnid import dynamics

    cfg = AttentionConfig(16, 4, rope_dims=2, causal=True, qk_norm="head")  # D = 4: one pair, two alone
    p = init_params(cfg, seed=0)
    monkeypatch.setattr(dynamics, "trade_groups", lambda c: [[i] for i in range(c.D)])
    rates = dynamics.qk_norm_flow_rates(p, cfg, _regression(cfg))["trade"]
    assert float(rates[:2].abs().min()) > 1e-6 and float(rates[2:].abs().max()) < 1e-12


# ------------------------------------------------------------------ multi-head latent attention (DeepSeek-V2/V3)
MLA_SHAPES = [
    dict(embed=16, heads=2, kv_rank=6, q_rank=6, nope_dim=4, rope_dim=2, v_dim=4),  # query latent (V3)
    dict(embed=16, heads=2, kv_rank=6, q_rank=None, nope_dim=4, rope_dim=2, v_dim=4),  # none (V2-Lite)
    dict(embed=16, heads=3, kv_rank=5, q_rank=7, nope_dim=2, rope_dim=2, v_dim=3),  # odd sizes
    dict(embed=16, heads=2, kv_rank=6, q_rank=6, nope_dim=4, rope_dim=2, v_dim=4, norm_eps=0.05),  # ε > 0
]


@pytest.mark.parametrize("shape", MLA_SHAPES, ids=["q-latent", "no-q-latent", "odd", "eps"])
def test_real_mla_module_equals_the_closed_form(shape):
    """transformers' DeepseekV3Attention against count_mla: per head GL(nope_dim) and GL(v_dim), the RoPE
    commutant of the one shared rotary key, and per latent diag(γ')·O(r) (+ its scale at ε = 0)."""
    pytest.importorskip("transformers")
    from attnid.counting import MLAConfig, count_mla

    cfg = MLAConfig(**shape)
    res = hf.audit_mla_hf(cfg)  # raises HFAuditError on a difference or a gap under 1e6
    terms = count_mla(cfg).unidentified_by_block
    assert res.unidentified == sum(terms.values()) and res.sv_gap >= hf.MIN_GAP
    r = cfg.kv_rank
    assert terms["kv_latent"] == r * (r - 1) // 2 + r + (cfg.norm_eps == 0)


def test_mla_shapes_outside_the_closed_form_are_refused():
    from attnid.counting import MLAConfig, count_mla

    with pytest.raises(ValueError, match="kv_rank = 8 > heads x"):
        count_mla(MLAConfig(12, 1, kv_rank=8, q_rank=None, nope_dim=4, rope_dim=4, v_dim=2))
    with pytest.raises(ValueError, match="rope_dim must be even"):
        MLAConfig(16, 2, kv_rank=6, q_rank=6, nope_dim=4, rope_dim=3, v_dim=4)


def test_cli_audits_deepseek_v3_with_its_own_size_flags(capsys):
    import json

    from attnid.cli import main

    rc = main(["audit", "--hf", "deepseek_v3", "--embed", "16", "--heads", "2", "--kv-rank", "6", "--q-rank", "0",
               "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["unidentified"] == out["theory_unidentified"] == 88
    assert main(["audit", "--hf", "deepseek_v3", "--groups", "2"]) == 2
    assert "is audited as one attention layer or one decoder layer" in capsys.readouterr().err
    assert main(["audit", "--hf", "deepseek_v3", "--experts", "4"]) == 2
    assert "has no MLP; add --block" in capsys.readouterr().err
    assert main(["audit", "--hf", "llama", "--kv-rank", "4"]) == 2
    assert "only deepseek_v3 and deepseek_v32 take latents and experts" in capsys.readouterr().err


@pytest.mark.parametrize("experts", [0, 4], ids=["dense", "experts"])
def test_real_deepseek_v3_decoder_layer_equals_the_closed_form(experts):
    """DeepseekV3DecoderLayer: latent attention behind an RMSNorm, then one SwiGLU MLP (its first layers) or a
    mixture of routed experts and a shared one: each expert keeps its own rescaling, the router none."""
    pytest.importorskip("transformers")
    from attnid.counting import MLAConfig, count_mla

    cfg = MLAConfig(12, 2, kv_rank=5, q_rank=None, nope_dim=3, rope_dim=2, v_dim=3)
    res = hf.audit_mla_hf(cfg, scope="block", ffn=6, experts=experts)  # raises on a difference or a blurred gap
    t = res.details["terms"]
    assert res.unidentified == sum(t.values()) and res.sv_gap >= hf.MIN_GAP
    assert t["norm_scale"] == 2 * 12 and t["mlp_rescaling"] == (6 * experts + 6 if experts else 6)
    assert res.unidentified == count_mla(cfg).unidentified + t["norm_scale"] + t["mlp_rescaling"]


def test_an_expert_the_audit_data_seldom_choose_is_refused(monkeypatch):
    """Planted: ask every expert to take 60% of the tokens (two of four are chosen per token, so at most 50% on
    average): the audit refuses instead of counting an under-excited expert's weights as unidentified."""
    pytest.importorskip("transformers")
    from attnid.counting import MLAConfig

    monkeypatch.setattr(hf.scopes, "MIN_EXPERT_SHARE", 0.6)
    cfg = MLAConfig(12, 2, kv_rank=5, q_rank=None, nope_dim=3, rope_dim=2, v_dim=3)
    with pytest.raises(ValueError, match="chosen for only"):
        hf.audit_mla_hf(cfg, scope="block", ffn=6, experts=4)
    with pytest.raises(ValueError, match="at least 2"):
        hf.audit_mla_hf(cfg, scope="block", experts=1)


def test_deepseek_v3_preset_counts_at_three_scopes(capsys):
    import json

    from attnid.cli import main
    from attnid.presets import MLA_PRESETS, preset_count

    p = MLA_PRESETS["deepseek-v3"]
    block, model = preset_count("deepseek-v3", "block"), preset_count("deepseek-v3", "model")
    E, m = 7168, p.model
    assert block.unidentified_by_block["mlp_rescaling"] == 256 * 2048 + 2048  # routed experts + the shared one
    dense = preset_count("deepseek-v3").unidentified + 2 * E + 18432  # the first three layers: one MLP each
    assert model.unidentified_by_block["blocks"] == 3 * dense + 58 * block.unidentified
    assert model.unidentified_by_block["stream_rotation"] == E * (E - 1) // 2
    assert main(["count", "--preset", "deepseek-v3", "--scope", "model", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["unidentified"] == model.unidentified and d["architecture"]["kv_rank"] == 512 and m.dense_layers == 3
    assert main(["count", "--preset", "DeepSeek-V3"]) == 0
    assert "kv_latent" in capsys.readouterr().out


def test_deepseek_v3_preset_structure_is_verified():
    pytest.importorskip("transformers")
    from attnid.presets import MLA_PRESETS, preset_rows

    names = list(MLA_PRESETS)
    attention, block = hf.verify_presets(names), hf.verify_presets(names, scope="block")
    assert block["deepseek-v3"].details["experts"] == 4  # its layers are mostly mixtures of experts
    rows = preset_rows(attention, block, presets=MLA_PRESETS)
    assert all(r["verified"] and r["verified_block"] for r in rows)


def test_certify_is_refused_where_the_symmetries_are_not_the_papers():
    """certify checks the paper's symmetry directions: for QK-norm or soft-capping it would reject them, so it is
    refused in one line; "auto" audits such a layer densely."""
    for changes in (dict(qk_norm="head"), dict(logit_softcap=1.0)):
        cfg = AttentionConfig(64, 8, rope=True, causal=True, **changes)
        with pytest.raises(ValueError, match="certify checks the paper's symmetries"):
            audit(cfg, method="certify")
