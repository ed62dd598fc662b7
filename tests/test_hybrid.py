"""Hybrid models, counted layer kind by layer kind (chapter 9): LFM2's short convolutions and Bamba's Mamba-2 mixers
beside attention layers. The closed form of a whole model (attnid.counting.count_model with its mixer_layers) equals
the Jacobian rank of transformers' own model in float64; a closed form that drops a mixer's trade, or counts the
mixer layers as attention, is refused; their config files are read as transformers builds them."""

import json
from pathlib import Path

import pytest

from attnid.configs import ConfigError, config_preset
from attnid.counting import MixerBlock, ModelConfig, count_block, count_mixer_block, count_model
from attnid.counting.hybrid import mixer_block
from attnid.counting.short_conv import count_short_conv
from attnid.families import block_config, equivalent_config
from attnid.presets import mixer_layers_note, scope_count


def lfm2_block(embed: int = 8, ffn: int = 8):
    return block_config("lfm2", equivalent_config("lfm2", embed=embed, heads=2, groups=1), ffn)


def lfm2_model(**changes) -> ModelConfig:
    conv = mixer_block("short convolution", lfm2_block(), dict(kernel=3, bias=False))
    return ModelConfig(lfm2_block(), **{**dict(layers=2, vocab=24, mixer_layers=((conv, 1),)), **changes})


def test_a_mixer_layer_adds_its_norms_and_mlp_to_the_mixers_own_count():
    conv = count_short_conv(8, 3)
    c = count_mixer_block(MixerBlock("short convolution", conv, lfm2_block(ffn=12)))
    assert {k: v for k, v in c.unidentified_by_block.items() if v} == {"channel_scales": 4 * 8, "norm_scale": 2 * 8,
                                                                        "mlp_rescaling": 12}  # fmt: skip
    assert c.total_params == conv.total_params + 2 * 8 + 3 * 8 * 12
    # the attention layer it replaces, less its attention, plus the mixer
    attention = count_block(lfm2_block(ffn=12))
    assert c.unidentified - conv.unidentified == attention.unidentified - sum(
        attention.unidentified_by_block[k] for k in ("qk", "vo", "key_bias", "value_bias")
    )


def test_a_hybrid_model_adds_its_mixer_layers_to_the_attention_layers():
    one_attention = count_model(lfm2_model(layers=1, mixer_layers=()))
    hybrid = count_model(lfm2_model())
    conv = count_mixer_block(mixer_block("short convolution", lfm2_block(), dict(kernel=3, bias=False)))
    assert hybrid.unidentified_by_block["mixer_blocks"] == conv.unidentified
    assert hybrid.unidentified == one_attention.unidentified + conv.unidentified
    assert hybrid.total_params == one_attention.total_params + conv.total_params


@pytest.mark.parametrize(
    "changes, says",
    [
        (dict(layers=1), "at least one attention layer"),
        (
            dict(
                mixer_layers=((mixer_block("short convolution", lfm2_block(embed=12), dict(kernel=3, bias=False)), 1),)
            ),
            "width 12",
        ),
        (dict(mixer_layers=(("conv", 1),)), "pairs"),
        (
            dict(mixer_layers=((mixer_block("short convolution", lfm2_block(), dict(kernel=3, bias=False)), 0),)),
            "positive",
        ),
    ],
)
def test_a_hybrid_model_that_was_not_derived_is_refused_by_name(changes, says):
    with pytest.raises((ValueError, TypeError), match=says):
        lfm2_model(**changes)


def test_hybrid_layers_beside_layernorm_blocks_are_refused():
    gpt2 = block_config("gpt2", equivalent_config("gpt2", embed=8, heads=2), 8)
    conv = mixer_block("short convolution", lfm2_block(), dict(kernel=3, bias=False))
    with pytest.raises(ValueError, match="pre-norm RMSNorm"):
        ModelConfig(gpt2, 2, 24, mixer_layers=((conv, 1),))
    with pytest.raises(ValueError, match="pre-norm RMSNorm"):
        mixer_block("short convolution", gpt2, dict(kernel=3, bias=False))


@pytest.mark.parametrize(
    "mixer, sizes, says",
    [
        ("attention", dict(kernel=3, bias=False), "expected one of"),
        ("short convolution", dict(kernel=3), "has sizes kernel, bias"),
        ("mamba2", dict(expand=0, heads=2, groups=1, state=2, kernel=2, bias=False, conv_bias=True), "expand"),
    ],
)
def test_a_mixer_block_with_wrong_sizes_is_refused(mixer, sizes, says):
    with pytest.raises(ValueError, match=says):
        mixer_block(mixer, lfm2_block(), sizes)


FAMILIES = Path(__file__).resolve().parents[1] / "data" / "configs" / "families"


def test_lfm2_1_2b_is_counted_with_its_short_convolution_layers():
    """LFM2-1.2B: 6 attention layers, 10 short-convolution layers, an MLP of 8,192 (two thirds of block_ff_dim
    12,288, rounded to 256), a tied head: 1,170,340,608 parameters, its checkpoint's total."""
    p = config_preset(f"{FAMILIES}/lfm2-1.2b.json")
    assert p.model.ffn == 8192 and p.model.tied
    ((conv, n),) = p.model.mixer_layers
    assert (conv.mixer, n) == ("short convolution", 10)
    model = scope_count(p, "model", "lfm2")
    assert model.total_params == 1_170_340_608
    E, F = 2048, 8192
    assert model.unidentified_by_block["mixer_blocks"] == 10 * (4 * E + 2 * E + F)
    assert model.unidentified_by_block["blocks"] == 6 * scope_count(p, "block", "lfm2").unidentified
    assert "6 attention layers" in mixer_layers_note(p) and "10 short convolution layers" in mixer_layers_note(p)


def test_bamba_is_counted_with_its_mamba_layers():
    p = config_preset(f"{FAMILIES}/bamba-9b.json")
    ((mamba, n),) = p.model.mixer_layers
    assert (mamba.mixer, n) == ("mamba2", 29)
    inner, heads, state = 2 * 4096, 128, 128
    assert mamba.count.unidentified_by_block["channel_scales"] == inner + 2 * state
    assert mamba.count.unidentified_by_block["time_step_bias"] == 0 and mamba.count.params_by_block["scan"] == 3 * heads
    assert mamba.count.unidentified_by_block["gated_norm_scale"] == inner
    assert p.config.R == p.config.D // 2  # its code rotates half of each head
    assert scope_count(p, "model", "bamba").total_params == 9_780_235_392


def _write(tmp_path, base: str, **changes):
    fields = json.loads((FAMILIES / f"{base}.json").read_text())
    fields.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields))
    return path


@pytest.mark.parametrize(
    "base, changes, says",
    [
        ("bamba-9b", dict(time_step_limit=[0.001, 0.1]), "time_step_limit"),
        ("bamba-9b", dict(attn_layer_indices=[]), "no layer is attention"),
        ("bamba-9b", dict(attn_layer_indices=[40]), "attn_layer_indices"),
        ("bamba-9b", dict(mamba_n_heads=100), "mamba_n_heads"),
        ("lfm2-1.2b", dict(layer_types=["conv"] * 16), "no layer is attention"),
        ("lfm2-1.2b", dict(layer_types=["mamba"] * 16), "layer_types"),
        ("lfm2-1.2b", dict(block_ffn_dim_multiplier=-1.0), "block_ffn_dim_multiplier"),
    ],
)
def test_a_hybrid_file_attnid_cannot_count_is_refused_by_name(tmp_path, base, changes, says):
    with pytest.raises(ConfigError, match=says):
        config_preset(_write(tmp_path, base, **changes))


def test_lfm2s_mlp_size_follows_its_code(tmp_path):
    """Without the auto-adjust the inner size is block_ff_dim itself; with a multiplier of 1.5 it is rounded up to
    a multiple of block_multiple_of."""
    plain = config_preset(_write(tmp_path, "lfm2-1.2b", block_auto_adjust_ff_dim=False))
    assert plain.model.ffn == 12288
    wider = config_preset(_write(tmp_path, "lfm2-1.2b", block_ffn_dim_multiplier=1.5, block_multiple_of=1000))
    assert wider.model.ffn == 13000  # int(1.5 x 8192) = 12288, up to 13 x 1000


# the real models, at the smallest shapes that show each mechanism: width 8, one or two layers of each kind
LFM2_SHAPES = [
    dict(),  # a short convolution then an attention layer, tied head, ε = 0
    dict(tied=False),  # the stream's rotation, the final norm and the logit shift
    dict(layer_types=("full_attention", "conv"), mixer=dict(bias=True), tied=False),
    dict(layer_types=("conv", "full_attention"), norm_eps=1e-2, heads=4, groups=2),
]
BAMBA_SHAPES = [
    dict(),  # a Mamba-2 layer then an attention layer, tied head, ε = 0
    dict(tied=False),
    dict(mixer=dict(bias=True, heads=2, groups=2)),  # in_proj biases: each head's time-step bias trades with dt_bias
    dict(layer_types=("full_attention", "linear_attention"), mixer=dict(kernel=2, state=2), norm_eps=1e-2),
]
# Qwen3-Next: a Gated DeltaNet layer and a gated softmax layer, each with four experts beside a gated shared one (at
# seed 0 the weakest identified direction sits 8e5 above round-off, under the audit's gap of 1e6)
QWEN3_NEXT_SHAPES = [dict(layer_types=("linear_attention", "full_attention"), ffn=4, seed=1)]
# Qwen3.5: Qwen3-Next's two kinds of layer with one MLP each (at seed 0 the first shape's weakest identified direction
# sits 4e5 above round-off), or with Qwen3-Next's mixture (untied too, tried: 13 s, agrees)
QWEN3_5_SHAPES = [
    dict(layer_types=("linear_attention", "full_attention"), ffn=8, seed=2),
    dict(layer_types=("full_attention", "linear_attention"), ffn=8, tied=False),
    dict(layer_types=("full_attention", "linear_attention"), ffn=8, heads=4, groups=2, norm_eps=1e-2),
]
QWEN3_5_MOE_SHAPES = [dict(layer_types=("linear_attention", "full_attention"), ffn=4, seed=1)]
BAMBA_LAYERS = {"layer_types": ("linear_attention", "full_attention")}
# Granite 4: a Mamba-2 layer and a NoPE attention layer, each with four experts beside a shared MLP
GRANITE_SHAPES = [dict(layer_types=("linear_attention", "full_attention"), ffn=4, tied=False)]
CASES = [
    *[("qwen3_next", kw) for kw in QWEN3_NEXT_SHAPES],
    *[("qwen3_5", kw) for kw in QWEN3_5_SHAPES],
    *[("qwen3_5_moe", kw) for kw in QWEN3_5_MOE_SHAPES],
    *[("granitemoehybrid", kw) for kw in GRANITE_SHAPES],
    *[("lfm2", kw) for kw in LFM2_SHAPES],
    *[("bamba", {**BAMBA_LAYERS, **kw}) for kw in BAMBA_SHAPES],
]


@pytest.mark.parametrize("hf_type, kw", CASES, ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v)))
def test_a_real_hybrid_model_keeps_the_closed_forms_free_directions(hf_type, kw):
    hf_hybrid = pytest.importorskip("attnid.hf.hybrid")
    r = hf_hybrid.audit_hybrid_hf(hf_type, **kw)  # raises on a difference or a blurred gap
    assert r.unidentified == r.details["theory_unidentified"] == sum(r.details["terms"].values())
    assert r.sv_gap > 1e6
    assert r.details["terms"]["mixer_blocks"] > 0


def test_a_closed_form_without_the_mixers_trade_is_refused(monkeypatch):
    """Planted: the short convolution's four scales per channel left out of the model's count."""
    hf_hybrid = pytest.importorskip("attnid.hf.hybrid")
    from attnid.hf.build import HFAuditError

    original = hf_hybrid.mixer_block

    def without_scales(*args, **kwargs):
        b = original(*args, **kwargs)
        c = b.count
        return MixerBlock(b.mixer, c.__class__(c.total_params, c.params_by_block, {"channel_scales": 0}), b.block)

    monkeypatch.setattr(hf_hybrid, "mixer_block", without_scales)
    with pytest.raises(HFAuditError, match="the Jacobian gives"):
        hf_hybrid.audit_hybrid_hf("lfm2")


def test_mixer_layers_counted_as_attention_are_refused(monkeypatch):
    """Planted: the hybrid model counted as if every layer were attention (no mixer_layers)."""
    hf_hybrid = pytest.importorskip("attnid.hf.hybrid")
    from dataclasses import replace

    from attnid.hf.build import HFAuditError

    original = hf_hybrid.hybrid_model_config
    monkeypatch.setattr(hf_hybrid, "hybrid_model_config", lambda *a, **k: replace(original(*a, **k), mixer_layers=()))
    with pytest.raises(HFAuditError, match="parameters"):
        hf_hybrid.audit_hybrid_hf("bamba", layer_types=("linear_attention", "full_attention"))


@pytest.mark.parametrize("scope", ["attention", "block"])
def test_count_says_which_kind_of_layer_the_attention_and_block_scopes_show(scope):
    from test_cli import run

    text = run("count", "--config", f"{FAMILIES}/lfm2-1.2b.json", "--scope", scope)
    assert text.returncode == 0, text.stderr
    assert "one of its 6 attention layers; its 10 short convolution layers are counted at scope model" in text.stdout
    out = json.loads(run("count", "--config", f"{FAMILIES}/bamba-9b.json", "--scope", scope, "--json").stdout)
    assert "29 mamba2 layers" in out["shows"]


def test_count_at_scope_model_adds_the_mixer_layers_term():
    from test_cli import run

    out = json.loads(run("count", "--config", f"{FAMILIES}/lfm2-1.2b.json", "--scope", "model", "--json").stdout)
    assert out["total_params"] == 1_170_340_608
    assert out["unidentified_by_block"]["mixer_blocks"] == 10 * (6 * 2048 + 8192)
    assert "shows" not in out


def test_chapter_9s_hybrid_table_adds_up_layer_kind_by_layer_kind():
    pytest.importorskip("pandas")
    from attnid.chapters import released as rel

    t = rel.hybrid_table().set_index("file")
    assert list(t.index) == ["bamba-9b", "lfm2-1.2b", "qwen3-next-80b-a3b-instruct", "qwen3.5-35b-a3b", "qwen3.5-4b"]
    for name, row in t.iterrows():
        total = (row["attention layers"] * row["attention layer unidentified"]
                 + row["other layers"] * row["other layer unidentified"] + row["model-wide terms"])  # fmt: skip
        assert total == row["model unidentified"], name
    assert t.loc["lfm2-1.2b", "model-wide terms"] == 0  # tied, ε > 0: no stream rotation, final norm or logit shift
    assert t.loc["bamba-9b", "model-wide terms"] == 4096 * 4095 // 2 + 2 * 4096  # untied: rotation, norm, shift
    facts = rel.hybrid_facts(rel.hybrid_table())
    assert facts["lfm2_conv_layer"] == 4 * 2048 + 2 * 2048 + 8192
    # Qwen3.5-4B's Gated DeltaNet layer: its 8192 + 4096 convolved channels' filters, the norm's 128 shared by the
    # value heads, two norms' weights and the MLP's unit scales
    assert facts["qwen3_5_deltanet_layer"] == (2 * 16 * 128 + 32 * 128) + 128 + 2 * 2560 + 9216


def test_a_time_step_limit_that_is_not_a_pair_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="time_step_limit"):
        config_preset(_write(tmp_path, "bamba-9b", time_step_limit=5))


@pytest.mark.parametrize(
    "layer_types, says",
    [(("conv", "full_attention"), "layer_types"), (("linear_attention",), "at least one attention layer")],
)
def test_an_audit_of_layers_the_family_cannot_build_is_refused_by_name(layer_types, says):
    hf_hybrid = pytest.importorskip("attnid.hf.hybrid")
    with pytest.raises(ValueError, match=says):
        hf_hybrid.audit_hybrid_hf("bamba", layer_types=layer_types)
    with pytest.raises(ValueError, match="mixer: lfm2's mixer has sizes kernel, bias, not state"):
        hf_hybrid.audit_hybrid_hf("lfm2", mixer=dict(state=4))


GRANITE_4_H = {  # a Granite 4.0-H-Tiny-like file: 40 layers, 4 of them NoPE attention, 64 experts beside a shared MLP
    "model_type": "granitemoehybrid", "hidden_size": 1536, "num_hidden_layers": 40, "num_attention_heads": 12,
    "num_key_value_heads": 4, "intermediate_size": 512, "shared_intermediate_size": 1024, "num_local_experts": 64,
    "num_experts_per_tok": 6, "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1,
    "mamba_d_conv": 4, "mamba_expand": 2, "vocab_size": 100352, "tie_word_embeddings": True,
    "position_embedding_type": "nope", "embedding_multiplier": 12, "logits_scaling": 6, "residual_multiplier": 0.22,
    "attention_multiplier": 0.0078125,
    "layer_types": ["attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40)],
}  # fmt: skip


def test_a_granite_4_hybrid_is_counted_with_its_mamba_layers_and_transformers_total(tmp_path):
    pytest.importorskip("transformers")
    from test_families import library_total
    from test_gates_and_norms import preset_of

    p = preset_of(tmp_path, GRANITE_4_H)
    assert not p.config.rope and p.model.experts == 64 and p.model.shared_ffn == 1024
    ((mamba, n),) = p.model.mixer_layers
    assert (mamba.mixer, n) == ("mamba2", 36)
    block = scope_count(p, "block", "granite")
    assert block.unidentified_by_block["mlp_rescaling"] == 64 * 512 + 1024  # each expert, and the shared MLP
    assert block.unidentified_by_block["router_shift"] == 1536
    assert scope_count(p, "model", "granite").total_params == library_total(GRANITE_4_H)
    for change, says in [(dict(position_embedding_type="rope"), "position_embedding_type"),
                         (dict(num_experts_per_tok=1), "num_experts_per_tok")]:  # fmt: skip
        with pytest.raises(ConfigError, match=says):
            preset_of(tmp_path, {**GRANITE_4_H, **change})


@pytest.mark.parametrize("hf_type, term, change", [
    ("qwen3_next", "router_shift", 1),  # the sigmoid gate on the shared expert counted as if its scale were free
    ("granitemoehybrid", "router_shift", -8),  # the softmax over the chosen logits counted without its shift
])  # fmt: skip
def test_a_mixture_counted_without_its_own_mechanism_is_refused(monkeypatch, hf_type, term, change):
    """Planted in the decoder layers of the hybrids' mixtures: the real layer's Jacobian refuses each."""
    hf = pytest.importorskip("attnid.hf")
    from attnid.hf import scopes
    from attnid.hf.build import HFAuditError

    original = scopes.count_block

    def planted(block):
        c = original(block)
        terms = {**c.unidentified_by_block, term: c.unidentified_by_block[term] + change}
        return c.__class__(c.total_params, c.params_by_block, terms)

    monkeypatch.setattr(scopes, "count_block", planted)
    with pytest.raises(HFAuditError, match="the Jacobian gives"):
        hf.audit_hf(hf_type, scope="block", embed=8, heads=2, ffn=4)


def test_a_dense_granite_4_hybrid_is_counted_with_its_shared_mlp_alone(tmp_path):
    """Granite 4's dense hybrids (no experts): each layer's shared MLP alone, its units' rescaling; the real model's
    Jacobian agrees, and the file's total is transformers' own."""
    pytest.importorskip("transformers")
    from test_families import library_total
    from test_gates_and_norms import preset_of

    from attnid.hf.hybrid import audit_hybrid_hf

    dense = {**GRANITE_4_H, "num_local_experts": 0}
    p = preset_of(tmp_path, dense)
    assert p.model.experts == 0 and p.model.ffn == 1024
    block = scope_count(p, "block", "granite")
    assert block.unidentified_by_block["mlp_rescaling"] == 1024 and "router_shift" not in block.unidentified_by_block
    assert scope_count(p, "model", "granite").total_params == library_total(dense)
    r = audit_hybrid_hf("granitemoehybrid", layer_types=("linear_attention", "full_attention"), ffn=8, experts=0)
    assert r.unidentified == r.details["theory_unidentified"] and r.sv_gap > 1e6
    with pytest.raises(ValueError, match="give 2 or more"):
        audit_hybrid_hf("qwen3_next", experts=0)


def test_attnid_audit_takes_a_hybrid_models_layer_kinds():
    """`attnid audit --hf TYPE --model --layer-types ...` audits the whole hybrid model, each layer of the kind named,
    against the closed form counted layer kind by layer kind; the flag is refused by name where no hybrid model reads
    it, and so are the sizes a hybrid audit does not take."""
    pytest.importorskip("transformers")
    from test_cli import run

    r = run("audit", "--hf", "lfm2", "--model", "--layer-types", "conv,full_attention", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["unidentified"] == out["details"]["theory_unidentified"] and out["details"]["terms"]["mixer_blocks"] > 0
    assert out["details"]["config"]["layer_types"] == ["conv", "full_attention"]
    for args, says in [
        (("--hf", "llama", "--model", "--layer-types", "full_attention"), "llama is not a hybrid model"),
        (("--hf", "lfm2", "--layer-types", "conv,full_attention"), "add --model"),
        (("--layer-types", "conv"), "give --hf TYPE --model"),
        (("--hf", "lfm2", "--model", "--layer-types", "conv,full_attention", "--bias", "all"), "--bias: a hybrid"),
        (("--hf", "lfm2", "--model", "--layer-types", "conv,mamba"), "'full_attention' or 'conv'"),
    ]:
        r = run("audit", *args)
        assert r.returncode != 0 and says in r.stderr, (args, r.stderr)
