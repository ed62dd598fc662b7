"""Whole decoder layers and whole models of real transformers classes against the closed form
(attnid.counting.count_block / count_model; chapter 8)."""

import json

import pytest

pytest.importorskip("transformers")

from attnid.attention import AttentionConfig
from attnid.cli import main
from attnid.counting import BlockConfig, ModelConfig, count, count_block, count_model
from attnid.hf import HF_TYPES, HFAuditError, audit_hf, check_hf_audit, structure_audit, verify_presets
from attnid.presets import PRESETS, preset_count, preset_rows

# five or six shapes per model type at E <= 12 (three heads at E = 6 where the layer is large): GQA/MQA where the
# type has it, partial RoPE, F != 4E, the bias settings the type can express, and H = 1 where the single head meets
# another feature of the type (partial RoPE, a NoPE layer, biases, a wiring: GPT-NeoX, Phi, GLM-4, StableLM, Phi-3,
# BLOOM, Seed-OSS, Command R7B, EXAONE 4, Falcon)
BLOCK_SHAPES = {
    "gpt2": [dict(heads=2), dict(heads=4), dict(heads=2, ffn=12), dict(heads=2, ffn=36),
             dict(embed=12, heads=3, ffn=20)],
    "opt": [dict(heads=2), dict(heads=2, bias="none"), dict(heads=4, ffn=12),
            dict(heads=2, bias="none", ffn=20), dict(embed=6, heads=3, ffn=15)],
    "llama": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12),
              dict(heads=2, bias="all", ffn=30), dict(embed=6, heads=3, groups=1, bias="all")],
    "mistral": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12),
                dict(heads=2, head_dim=2, ffn=30), dict(embed=6, heads=3, groups=1)],
    "qwen2": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12),
              dict(heads=2, ffn=30), dict(embed=6, heads=3, groups=3)],
    "gpt_neox": [dict(heads=2), dict(heads=1, rope_dims=4), dict(heads=1, rope_dims=6), dict(heads=2, bias="none"),
                 dict(heads=2, rope_dims=4, ffn=12), dict(embed=12, heads=2, rope_dims=2, ffn=20)],
    "phi": [dict(heads=2), dict(heads=1, rope_dims=6), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12),
            dict(heads=2, rope_dims=4, ffn=20), dict(embed=8, heads=2, groups=1, rope_dims=2)],
    "qwen3": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12),
              dict(heads=2, bias="all", ffn=30), dict(embed=6, heads=3, groups=1, bias="all")],
    # norms after attention and MLP (OLMo 2) and on both sides (Gemma 2 and 3), all at ε = 0
    "olmo2": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12),
              dict(heads=2, bias="all", ffn=30), dict(embed=6, heads=3, groups=1, bias="all")],
    "olmo3": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12),
              dict(heads=2, bias="all", ffn=20), dict(embed=6, heads=3, groups=3)],
    "gemma2": [dict(heads=2, ffn=12), dict(heads=4, groups=2, ffn=12),
               dict(heads=4, groups=1, head_dim=4, ffn=12), dict(heads=2, head_dim=6, bias="all", ffn=20),
               dict(embed=12, heads=3, groups=1, bias="all", ffn=16)],
    "gemma3": [dict(heads=2, ffn=12), dict(heads=4, groups=2, ffn=12),
               dict(heads=4, groups=1, head_dim=4, ffn=12), dict(heads=2, head_dim=6, bias="all", ffn=20),
               dict(embed=12, heads=3, groups=1, bias="all", ffn=16)],
    # a mixture of four experts (two chosen per token), each F wide: a softmax router's shift, E more
    "mixtral": [dict(heads=2, ffn=4), dict(heads=4, groups=2, ffn=4),
                dict(heads=4, groups=1, ffn=6),
                dict(heads=2, head_dim=2, ffn=6), dict(embed=6, heads=3, groups=1, ffn=3)],
    "qwen3_moe": [dict(heads=2, ffn=4), dict(heads=4, groups=2, ffn=4),
                  dict(heads=4, groups=1, ffn=6), dict(heads=2, bias="all", ffn=6),
                  dict(embed=6, heads=3, groups=1, bias="all", ffn=3)],
    "granite": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12),
                dict(heads=2, bias="all", ffn=30), dict(embed=6, heads=3, groups=1, bias="all")],
    # LayerNorm, GELU: biases on every map (use_bias) or on none
    "starcoder2": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, bias="none", ffn=12),
                   dict(heads=2, bias="none", ffn=20), dict(embed=12, heads=3, groups=1, ffn=20)],
    # norms before and after each sub-layer (as Gemma), q/k/v biases, rotary on part of each head
    "glm4": [dict(heads=1, rope_dims=4), dict(heads=2, rope_dims=2), dict(heads=4, groups=2, rope_dims=2),
             dict(heads=4, groups=1, rope_dims=2, bias="none", ffn=12), dict(heads=1, rope_dims=6, ffn=20),
             dict(embed=8, heads=2, groups=1, rope_dims=2)],
    # LayerNorm with a gated MLP without biases, q/k/v biases or none
    "stablelm": [dict(heads=1, rope_dims=2), dict(heads=2, rope_dims=2), dict(heads=4, groups=2, rope_dims=2),
                 dict(heads=4, groups=1, rope_dims=2, bias="qkv", ffn=12),
                 dict(heads=1, rope_dims=6, bias="qkv", ffn=20), dict(embed=8, heads=2, groups=1, rope_dims=2)],
    "phi3": [dict(heads=1, rope_dims=6), dict(heads=2, rope_dims=2), dict(heads=4, groups=2, rope_dims=2),
             dict(heads=4, groups=1, rope_dims=2, ffn=12), dict(heads=1, rope_dims=4, ffn=20),
             dict(embed=8, heads=2, groups=1, rope_dims=2)],
    # gpt-oss: sinks, all biases, four biased gated experts under a biased softmax router (E + 1 free)
    "gpt_oss": [dict(heads=2, ffn=4), dict(heads=4, groups=1, ffn=4), dict(heads=4, groups=2, ffn=6),
                dict(heads=2, head_dim=2, ffn=3), dict(embed=6, heads=3, groups=1, ffn=3),
                dict(heads=2, bias="none", ffn=4)],
    "smollm3": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12),
                dict(heads=2, bias="all", ffn=30), dict(embed=6, heads=3, groups=1, bias="all")],
    # Llama 4: L2 QK-norm, four experts under a sigmoid router choosing one, a shared expert; a NoPE layer
    # Qwen2.5-VL's text layers: Qwen2's with M-RoPE (text positions here; tests/test_families.py: a multimodal map)
    "qwen2_5_vl": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12),
                   dict(heads=2, groups=1), dict(embed=12, heads=2, groups=1, ffn=20)],
    # Qwen3-VL's text layers: Qwen3's with M-RoPE whose streams take the pairs in turn (a multimodal map: test_families)
    "qwen3_vl": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12),
                 dict(heads=2, bias="all", ffn=30), dict(embed=12, heads=2, groups=1, ffn=20)],
    # BLOOM: GPT-2's block with ALiBi; its code fixes the MLP at 4E
    "bloom": [dict(embed=6, heads=2), dict(embed=6, heads=1, ffn=24), dict(embed=6, heads=3, ffn=24),
              dict(embed=4, heads=1, ffn=16), dict(embed=4, heads=2, ffn=16), dict(embed=8, heads=4, ffn=32)],
    # ERNIE 4.5's mixtures: a softmax router whose choice adds a bias per expert (a parameter, unidentified)
    "ernie4_5_moe": [dict(heads=2, ffn=4), dict(heads=4, groups=2, head_dim=4, ffn=4),
                     dict(heads=4, groups=1, ffn=6), dict(heads=2, groups=1, head_dim=6, ffn=4),
                     dict(embed=6, heads=3, groups=1, ffn=3)],
    # Hunyuan-A13B: a QK-norm per head after RoPE, a softmax router, one shared MLP as wide as each expert
    "hunyuan_v1_moe": [dict(heads=2, ffn=4), dict(heads=4, groups=2, head_dim=4, ffn=4),
                       dict(heads=4, groups=1, ffn=6), dict(heads=2, bias="all", ffn=4),
                       dict(embed=6, heads=3, groups=1, ffn=3)],
    # GLM-4.5 and dots.llm1: DeepSeek-V3's mixture (a sigmoid router, one shared expert) around attention of their own
    "glm4_moe": [dict(heads=2, ffn=4), dict(heads=4, groups=2, head_dim=4, bias="qkv", ffn=4),
                 dict(heads=4, groups=1, head_dim=4, rope_dims=2, ffn=6), dict(heads=2, qk_norm="head", ffn=4),
                 dict(heads=2, bias="qkv", qk_norm="head", ffn=6)],
    "dots1": [dict(heads=2, ffn=4), dict(heads=4, groups=2, head_dim=4, ffn=4),
              dict(heads=4, groups=1, bias="all", ffn=6), dict(heads=2, bias="all", ffn=4),
              dict(embed=6, heads=3, groups=1, ffn=3)],
    "llama4": [dict(heads=2, ffn=4), dict(heads=4, groups=2, head_dim=4, ffn=4),
               dict(heads=4, groups=1, head_dim=4, ffn=6), dict(heads=2, groups=2, nope=True, ffn=4),
               dict(heads=2, bias="all", ffn=4)],
    # ERNIE 4.5: Llama's block with interleaved rotary pairs (use_bias off: with it the MLP has biases)
    "ernie4_5": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12),
                 dict(heads=2, head_dim=6, ffn=20), dict(embed=12, heads=3, groups=1, ffn=16)],
    # Seed-OSS: Llama's block with q/k/v biases, and its output bias switched apart
    "seed_oss": [dict(heads=2, bias="qkv"), dict(heads=1, bias="qkv"), dict(heads=4, groups=2, bias="qkvo"),
                 dict(heads=4, groups=1, bias="none", ffn=12), dict(heads=2, bias="o", ffn=20),
                 dict(embed=12, heads=3, groups=1, bias="qkv", ffn=16)],
    # Command R7B: Cohere's block, RoPE in the sliding-window layers, none in the full-attention ones
    "cohere2": [dict(heads=2), dict(heads=1, nope=True), dict(heads=4, groups=2), dict(heads=4, groups=2, nope=True),
                dict(heads=2, bias="all", ffn=12), dict(embed=12, heads=3, groups=1, nope=True, ffn=16)],
    # EXAONE 4: norms after each sub-layer, QK-norm per head, NoPE full-attention layers
    "exaone4": [dict(heads=2), dict(heads=1, nope=True), dict(heads=4, groups=2), dict(heads=4, groups=2, nope=True),
                dict(heads=2, head_dim=6, ffn=12), dict(embed=12, heads=3, groups=1, nope=True, ffn=16)],
    # Falcon: one LayerNorm before attention and MLP side by side (Falcon-7B: multi-query), a LayerNorm each (the new
    # architecture of Falcon-40B and 180B, groups of keys), one for both in the new architecture (Falcon 2), or a
    # sequential layer (parallel_attn off); biases on every map or none
    "falcon": [dict(heads=2), dict(heads=4, groups=1), dict(heads=4, groups=2, residual="parallel"),
               dict(heads=2, residual="sequential", bias="all"), dict(heads=4, groups=2, residual="shared_norm"),
               dict(heads=1, residual="parallel", bias="all", ffn=12)],
    # Arcee: Llama's layer with an MLP of two maps through ReLU², whose units rescale as ReLU's do
    "arcee": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12),
              dict(heads=2, bias="all", ffn=20), dict(embed=6, heads=3, groups=1, bias="all")],
    # Granite 4's NoPE attention layer, four experts (a softmax over the chosen logits) beside a shared MLP
    "granitemoehybrid": [dict(heads=2, ffn=4), dict(heads=4, groups=2, ffn=4), dict(heads=2, bias="all", ffn=6),
                         dict(heads=4, groups=1, ffn=3), dict(embed=12, heads=3, groups=1, ffn=4)],
    # Qwen3-Next's softmax layer: gated heads, a mixture of four experts beside a shared one behind a sigmoid gate
    "qwen3_next": [dict(heads=2, ffn=4), dict(heads=4, groups=2, ffn=4), dict(heads=2, bias="all", ffn=6),
                   dict(heads=4, groups=1, ffn=3), dict(embed=12, heads=3, groups=1, ffn=4)],
    # Apertus: QK-norm per head, an MLP of two maps through xIELU (two parameters of its own, no unit scale)
    "apertus": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12), dict(heads=2, bias="all"),
                dict(embed=6, heads=3, groups=1, ffn=18)],
    # Qwen3-VL's mixtures: Qwen3-MoE's layers with interleaved M-RoPE
    "qwen3_vl_moe": [dict(heads=2, ffn=4), dict(heads=4, groups=2, ffn=4), dict(heads=4, groups=1, ffn=6),
                     dict(heads=2, bias="all", ffn=6), dict(embed=6, heads=3, groups=1, bias="all", ffn=3)],
    # Qwen3.5's attention layers: Qwen3-Next's with interleaved M-RoPE, one MLP each or Qwen3-Next's mixture
    "qwen3_5": [dict(heads=2, ffn=4), dict(heads=4, groups=2, ffn=4), dict(heads=2, bias="all", ffn=6),
                dict(heads=4, groups=1, ffn=3), dict(embed=12, heads=3, groups=1, ffn=4)],
    "qwen3_5_moe": [dict(heads=2, ffn=4), dict(heads=4, groups=2, ffn=4), dict(heads=2, bias="all", ffn=6),
                    dict(heads=4, groups=1, ffn=3), dict(embed=12, heads=3, groups=1, ffn=4)],
    # the attention layers of the hybrid models LFM2 (QK-norm per head) and Bamba (half of each head rotated)
    "lfm2": [dict(heads=2), dict(heads=4, groups=2), dict(heads=4, groups=1, ffn=12), dict(heads=2, ffn=20),
             dict(embed=12, heads=3, groups=1)],
    "bamba": [dict(heads=2), dict(heads=2, groups=1, bias="all"), dict(heads=1, ffn=12), dict(heads=2, ffn=20),
              dict(embed=12, heads=3, groups=1, bias="all")],
    # Command R: one LayerNorm without a shift before attention and MLP side by side; Command R+'s QK LayerNorm
    "cohere": [dict(heads=2), dict(heads=4, groups=2), dict(heads=2, qk_norm="layer"),
               dict(heads=2, bias="all", ffn=12), dict(embed=12, heads=3, groups=1, qk_norm="layer", ffn=16)],
}  # fmt: skip
# StableLM 2 12B's LayerNorm per head on queries and keys, behind the block's LayerNorm (its shift gives effective
# biases that the centring removes), with and without q/k/v biases of their own
BLOCK_SHAPES["stablelm"] += [dict(heads=2, groups=1, rope_dims=2, qk_norm="layer"),
                             dict(heads=2, groups=2, rope_dims=2, qk_norm="layer", bias="qkv")]  # fmt: skip
BLOCK_CASES = [(t, i) for t in BLOCK_SHAPES for i in range(len(BLOCK_SHAPES[t]))]


def test_every_model_type_has_block_shapes():
    assert set(BLOCK_SHAPES) == {t for t, spec in HF_TYPES.items() if spec.layer}
    assert all(len(v) >= 5 for v in BLOCK_SHAPES.values())


@pytest.mark.parametrize(
    "hf_type,i", [pytest.param(t, i, marks=[pytest.mark.slow] if i else []) for t, i in BLOCK_CASES]
)
def test_whole_decoder_layer_count_equals_the_closed_form(hf_type, i):
    kw = dict(dict(embed=8), **BLOCK_SHAPES[hf_type][i])
    if i:  # the first shape has the family's MLP width; the others F = 2E unless given (half the cost, same terms)
        kw.setdefault("ffn", 2 * kw["embed"])
    r = audit_hf(hf_type, scope="block", **kw)  # raises HFAuditError on a difference or a blurred gap
    assert r.unidentified == r.details["theory_unidentified"] == sum(r.details["terms"].values())
    assert r.sv_gap > 1e6
    # the block has more unidentified directions than its attention alone
    assert r.unidentified > count(_attention_config(hf_type, kw)).unidentified


def _attention_config(hf_type, kw):
    from attnid.hf import equivalent_config

    return equivalent_config(hf_type, **{k: v for k, v in kw.items() if k not in ("ffn", "residual")})


def test_block_terms_of_a_gpt2_layer():
    """GPT-2 layer at E = 8, H = 2, F = 32: each term as chapter 8 derives it."""
    b = BlockConfig(AttentionConfig(8, 2, bias="all", causal=True), 32)
    t = count_block(b).unidentified_by_block
    # behind LayerNorm: 2E for each norm's weight and shift, one mean direction per biased reader row
    assert (t["norm_scale"], t["norm_shift"], t["norm_mean"]) == (16, 16, 3 * 8 + 32)
    assert t["mlp_rescaling"] == 0 and t["output_bias"] == 1  # GELU; only the mean of b_O + b_MLP
    assert count_block(BlockConfig(b.attention, 32, mlp="relu")).unidentified_by_block["mlp_rescaling"] == 32
    parallel = count_block(BlockConfig(b.attention, 32, residual="parallel")).unidentified_by_block
    assert parallel["output_bias"] == 8


# whole tiny models: (type, keyword arguments); the parallel types need a vocabulary of about 3F
MODEL_CASES = [
    ("gpt2", dict(ffn=16)),  # tied, learned positions
    ("arcee", dict(ffn=16)),  # ReLU² units, each switched on by the audit's tokens
    ("gpt2", dict(ffn=16, tied=False)),
    ("gpt2", dict(layers=2, ffn=8)),  # the stream across two layers (at F = 8: 2.5 s instead of 18)
    ("opt", dict(seed=1)),  # tied, ReLU, two unused position rows; seed 0 has a dead ReLU unit (see below)
    ("opt", dict(bias="none")),  # no output bias: the value bias along 1 (value_mean)
    ("opt", dict(bias="none", seed=2)),
    ("llama", dict()),
    ("llama", dict(layers=2, tied=True, embed=6, heads=1, head_dim=6)),
    ("mistral", dict(heads=4, groups=1)),
    ("qwen2", dict(heads=4, groups=2)),
    ("gpt_neox", dict(ffn=12)),
    ("phi", dict(ffn=16)),  # the LM head has a bias (at F = 12 a near-null direction blurs the gap)
    ("olmo2", dict(ffn=12)),  # norms after each sub-layer: no stream rotation
    ("gemma3", dict(ffn=12)),  # tied, norms on both sides, QK-norm
    ("gemma2", dict(ffn=12, tied=False)),  # soft-capped; untied: the final norm and the logit shift
    ("starcoder2", dict(ffn=16)),  # tied LayerNorm with RoPE: one shift of every token row along 1
    ("starcoder2", dict(ffn=16, groups=1, bias="none")),
    ("stablelm", dict(heads=1, rope_dims=2)),  # LayerNorm, no output bias, C = E: no value_mean of its own
    ("opt", dict(heads=1, bias="none")),  # one head as wide as the stream: no value_mean of its own
    ("glm4", dict(heads=1, rope_dims=4)),
    ("phi3", dict(heads=2, rope_dims=2, tied=True)),  # (one head of 8, rope 6: a near-null value at seed 0)
    ("cohere", dict(groups=1, ffn=8)),  # tied, a LayerNorm without a shift in a parallel block (vocabulary 4F)
    ("cohere", dict(groups=1, ffn=8, tied=False, seed=1)),  # untied: each head row along 1/γ reads nothing
    ("cohere", dict(groups=2, ffn=8, qk_norm="layer", bias="all")),
    ("stablelm", dict(heads=2, groups=1, rope_dims=2, qk_norm="layer")),  # the LayerNorm per head of StableLM 2 12B
    ("falcon", dict(heads=4, groups=2, ffn=8, residual="parallel")),  # Falcon-40B's wiring: a LayerNorm each, tied
    ("falcon", dict(bias="all", residual="sequential", tied=False)),  # Falcon RW's wiring (with RoPE), biases
]


@pytest.mark.parametrize(
    "hf_type,kw",
    [pytest.param(t, kw, marks=[pytest.mark.slow] if j > 1 else []) for j, (t, kw) in enumerate(MODEL_CASES)],
)
def test_whole_model_count_equals_the_closed_form(hf_type, kw):
    kw = dict(dict(embed=8, heads=2), **kw)
    r = audit_hf(hf_type, scope="model", **kw)
    assert r.unidentified == r.details["theory_unidentified"] == sum(r.details["terms"].values())
    assert r.details["terms"]["stream_scale"] == 1  # ε = 0 by default
    assert r.sv_gap > 1e6 and r.details["near_null"] == 0


def test_norm_epsilon_turns_the_scale_symmetry_into_a_near_null_direction():
    """With ε > 0 the stream's scale is no longer exact: one singular value leaves the null space but
    stays within 1e-5 of the largest, so no clear gap; the audit says so instead of printing a count."""
    r = audit_hf("llama", embed=8, heads=2, scope="model", norm_eps=1e-6, check=False)
    with pytest.raises(HFAuditError, match="only nearly a symmetry"):
        check_hf_audit(r)  # what audit_hf(..., check=True) raises
    exact = audit_hf("llama", embed=8, heads=2, scope="model")
    assert r.details["terms"]["stream_scale"] == 0
    assert r.unidentified == r.details["theory_unidentified"] == exact.unidentified - 1
    assert r.details["near_null"] >= 1 and r.sv_gap < 1e6


def test_a_relu_unit_the_data_never_switch_is_refused():
    with pytest.raises(HFAuditError, match="switches on only"):
        audit_hf("opt", embed=8, heads=2, scope="model", seed=0)


def test_scope_arguments_are_checked():
    with pytest.raises(ValueError, match="scope"):
        audit_hf("gpt2", embed=8, heads=2, scope="layer")
    with pytest.raises(ValueError, match="only a whole-model audit"):
        audit_hf("gpt2", embed=8, heads=2, scope="block", vocab=10)
    with pytest.raises(ValueError, match="ffn must be a positive integer"):
        audit_hf("gpt2", embed=8, heads=2, scope="block", ffn=0)
    with pytest.raises(ValueError, match="has no MLP"):
        audit_hf("gpt2", embed=8, heads=2, ffn=8)
    with pytest.raises(ValueError, match="under-determined"):
        audit_hf("gpt_neox", embed=8, heads=2, scope="model", ffn=16, vocab=24)
    with pytest.raises(ValueError, match="norm_eps"):
        audit_hf("gpt2", embed=8, heads=2, scope="model", norm_eps=-1.0)
    with pytest.raises(ValueError, match="no checked closed form"):
        count_block(BlockConfig(AttentionConfig(8, 2, bias="qkv"), 8))
    with pytest.raises(ValueError, match=r"gated \(swiglu\) MLPs counted here have no biases"):
        BlockConfig(AttentionConfig(8, 2), 8, mlp="swiglu")
    with pytest.raises(ValueError, match="context"):
        ModelConfig(BlockConfig(AttentionConfig(8, 2), 8), 1, 10, positions="learned")


# published parameter counts (the models' cards), which the closed form's accounting must reproduce
PUBLISHED_PARAMS = {
    "gpt2": 124_439_808,
    "llama-2-7b": 6_738_415_616,
    "mistral-7b": 7_241_732_096,
    "qwen2-7b": 7_615_616_512,
    "pythia-6.9b": 6_857_302_016,
    "phi-2": 2_779_683_840,
    "opt-6.7b": 6_658_473_984,
    # the safetensors totals of the released checkpoints
    "smollm3-3b": 3_075_098_624,
    "mixtral-8x7b": 46_702_792_704,
    "qwen3-30b-a3b": 30_532_122_624,
    "gpt-oss-20b": 20_914_757_184,
    "phi-4-mini": 3_836_021_760,
    "falcon-7b": 6_921_720_704,
}
# the cards give these to the stated digits only (Gemma 3 without its vision tower; DeepSeek-V3 without its
# multi-token-prediction module): billions
PUBLISHED_BILLIONS = {"olmo-2-7b": "7.30", "gemma-2-9b": "9.24", "gemma-3-12b": "11.77", "deepseek-v3": "671"}


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMS))
def test_preset_models_have_their_published_parameter_counts(name):
    assert preset_count(name, "model").total_params == PUBLISHED_PARAMS[name]


@pytest.mark.parametrize("name", list(PUBLISHED_BILLIONS))
def test_recent_preset_models_have_their_published_sizes(name):
    digits = PUBLISHED_BILLIONS[name]
    decimals = len(digits.partition(".")[2])
    assert f"{preset_count(name, 'model').total_params / 1e9:.{decimals}f}" == digits


def test_presets_carry_three_scopes():
    rows = preset_rows()
    for r in rows:
        p = PRESETS[r["name"]]
        if p.model is None:
            assert r["block_unidentified"] is None and r["model_unidentified"] is None
            with pytest.raises(ValueError, match="no block structure"):
                preset_count(r["name"], "model")
        else:
            assert r["source"].startswith("https://")
            # a whole layer is mostly MLP: its unidentified share is below the attention's
            assert r["block_unidentified_share"] < 1 - r["identified_fraction"]
            assert r["model_unidentified"] >= p.model.layers * r["block_unidentified"]


@pytest.fixture(scope="module")
def block_audits() -> dict:
    """The block audits made so far, by structure: presets of one structure share one audit."""
    return {}


# one test per preset (each a few seconds; one test of them all would be the file's longest)
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, p in PRESETS.items() if p.model is not None and p.hf_type is not None])
def test_every_preset_block_structure_is_verified(name, block_audits):
    key, run = structure_audit(PRESETS[name], "block", name)
    if key not in block_audits:
        block_audits[key] = run(0)
    r = block_audits[key]
    assert r.unidentified == r.details["theory_unidentified"] and r.details["scope"] == "block"


def test_presets_without_a_counted_block_are_not_verified_and_the_table_says_which_are():
    without = [n for n, p in PRESETS.items() if p.model is None or p.hf_type is None]
    assert without and verify_presets(without, scope="block") == dict.fromkeys(without)
    one = verify_presets(["gpt2"], scope="block")["gpt2"]
    verified = {n: one for n in PRESETS if n not in without}
    rows = preset_rows(verified_block={**verified, **dict.fromkeys(without)})
    assert [r["verified_block"] for r in rows] == [None if p.model is None else True for p in PRESETS.values()]


def test_cli_count_scope_and_block_audit(capsys):
    assert main(["count", "--preset", "llama-2-7b", "--scope", "model", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["scope"] == "model" and d["unidentified"] == preset_count("llama-2-7b", "model").unidentified
    assert d["unidentified_by_block"]["stream_rotation"] == 4096 * 4095 // 2
    assert main(["audit", "--hf", "phi", "--block", "--embed", "8", "--heads", "2", "--ffn", "12", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["unidentified"] == d["theory_unidentified"] and d["details"]["scope"] == "block"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["count", "--embed", "8", "--heads", "2", "--scope", "block"], "needs --preset"),
        (["count", "--preset", "gemma-7b", "--scope", "block"], "no block structure"),
        (["audit", "--embed", "8", "--heads", "2", "--block"], "through --hf"),
        (["audit", "--embed", "8", "--heads", "2", "--residual", "parallel"], "through --hf"),
        (["audit", "--hf", "falcon", "--residual", "parallel"], "the attention module has no residual wiring"),
        (["audit", "--hf", "llama", "--block", "--residual", "parallel"], "wired 'sequential', not 'parallel'"),
        (["audit", "--hf", "deepseek_v3", "--block", "--residual", "parallel"], "--residual"),
        (["audit", "--hf", "gpt2", "--block", "--model"], "not both"),
        (["audit", "--hf", "gpt2", "--block", "--layers", "2"], "only a whole-model audit"),
        (["audit", "--hf", "gpt2", "--ffn", "8"], "has no MLP"),
        (["audit", "--hf", "llama", "--model", "--layers", "0"], "layers must be a positive integer"),
        (["audit", "--hf", "llama", "--model", "--vocab", "-3"], "vocab must be a positive integer"),
    ],
)
def test_cli_refuses_scope_flags_it_cannot_use(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_model_count_adds_the_residual_stream_to_the_blocks():
    """Llama-2-7B: the blocks, the stream's rotations (E(E−1)/2, QuaRot's and SliceGPT's invariance),
    the final norm and the logit shift; ε > 0 leaves no scale direction."""
    c = preset_count("llama-2-7b", "model")
    E, L = 4096, 32
    assert c.unidentified_by_block["blocks"] == L * preset_count("llama-2-7b", "block").unidentified
    assert c.unidentified_by_block["stream_rotation"] == E * (E - 1) // 2
    assert c.unidentified == L * preset_count("llama-2-7b", "block").unidentified + E * (E - 1) // 2 + 2 * E
    tied = count_model(ModelConfig(_llama_block(), 2, 24, tied=True))
    assert tied.unidentified_by_block["stream_rotation"] == 0


def _llama_block():
    return BlockConfig(AttentionConfig(8, 2, rope=True, causal=True), 21, norm="rms", mlp="swiglu", mlp_bias=False)


def test_value_mean_is_counted_only_without_an_output_bias():
    """Behind LayerNorm the effective value bias adds Σ_h W_O^h b_h to every token; with no output bias to take
    it, its one direction along 1 is invisible to the later norms (OPT without biases: 209 was one short)."""
    from attnid.counting import count_model
    from attnid.hf import default_seq_len, equivalent_config, model_config

    def terms(bias: str, layers: int = 1) -> dict:
        cfg = equivalent_config("opt", embed=8, heads=2, bias=bias)
        mc = model_config("opt", cfg, ffn=32, layers=layers, vocab=24, tied=True, seq_len=default_seq_len(cfg),
                          norm_eps=0.0)  # fmt: skip
        return count_model(mc).unidentified_by_block

    assert terms("none")["value_mean"] == 1 and terms("none", layers=3)["value_mean"] == 3
    assert terms("qkvo")["value_mean"] == 0  # the output bias absorbs the whole constant
    assert sum(terms("none").values()) == 210  # the Jacobian of the real OPT module (seeds 0 and 2)


@pytest.mark.parametrize(
    "kwargs,argv",
    [
        (dict(hf_type="gpt2", scope="block", layers=2), ["--hf", "gpt2", "--block", "--layers", "2"]),
        (dict(hf_type="gpt2", scope="block", layers=1), ["--hf", "gpt2", "--block", "--layers", "1"]),
        (dict(hf_type="llama", scope="attention", vocab=40), ["--hf", "llama", "--vocab", "40"]),
        (dict(hf_type="gpt2", ffn=8), ["--hf", "gpt2", "--ffn", "8"]),
        (dict(hf_type="llama", norm_eps=0.1), ["--hf", "llama", "--norm-eps", "0.1"]),
        (dict(hf_type="llama", scope="model", layers=0), ["--hf", "llama", "--model", "--layers", "0"]),
        (dict(hf_type="llama", scope="model", vocab=-3), ["--hf", "llama", "--model", "--vocab", "-3"]),
        (dict(hf_type="llama", scope="model", vocab=8), ["--hf", "llama", "--model", "--vocab", "8"]),
        (dict(hf_type="phi", scope="model", tied=True), ["--hf", "phi", "--model", "--tied"]),
        (dict(hf_type="nope"), ["--hf", "nope"]),
    ],
)
def test_a_refusal_reads_the_same_from_the_library_and_the_cli(kwargs, argv, capsys):
    """Every check on an audit's values lives once, in the library: the CLI prints the library's own message."""
    kwargs = dict(dict(embed=8, heads=2), **kwargs)
    with pytest.raises(ValueError) as e:
        audit_hf(kwargs.pop("hf_type"), **kwargs)
    assert main(["audit", "--embed", "8", "--heads", "2", *argv]) == 2
    assert capsys.readouterr().err.strip() == f"attnid: error: {e.value}"


ONE_EXPERT_SHAPES = [dict(heads=2, ffn=4), dict(heads=4, groups=2, head_dim=4, ffn=4),
                     dict(heads=2, groups=2, nope=True, ffn=4), dict(heads=1, ffn=6)]  # fmt: skip


@pytest.mark.parametrize("kw", ONE_EXPERT_SHAPES, ids=range(len(ONE_EXPERT_SHAPES)))
def test_a_llama4_block_with_one_expert_equals_the_closed_form(monkeypatch, kw):
    """One expert under Llama 4's sigmoid router (its σ scales the expert's input), beside the shared expert: the
    router stays identified, and the real layer's Jacobian equals the terms (0.3-5 s each at E = 8)."""
    from attnid.hf import scopes

    monkeypatch.setattr(scopes, "AUDIT_EXPERTS", 1)
    r = audit_hf("llama4", scope="block", embed=8, **kw)
    assert r.details["experts"] == 1 and r.unidentified == r.details["theory_unidentified"] and r.sv_gap > 1e6


def test_one_expert_under_a_softmax_router_is_refused_with_a_true_sentence():
    from attnid.counting import BlockConfig

    attn = AttentionConfig(8, 2, rope=True, causal=True)
    assert (
        count_block(
            BlockConfig(attn, 4, norm="rms", mlp="swiglu", mlp_bias=False, experts=1, shared_ffn=4)
        ).unidentified
        > 0
    )
    with pytest.raises(ValueError, match="a softmax router over one expert gives it weight 1"):
        BlockConfig(attn, 4, norm="rms", mlp="swiglu", mlp_bias=False, experts=1, router="softmax")


def test_an_xielu_mlp_keeps_no_unit_scale(monkeypatch):
    """Apertus's xIELU, a z² + b z above 0 and a' (e^z − 1 − z) + b z below, is not positively homogeneous: no scale
    of an up-projection row passes through it to the down-projection column, and its two curvatures are identified.
    Planted: the block counted as if each unit had a ReLU's scale (F more directions); the real layer refuses it."""
    from attnid.hf import scopes
    from attnid.hf.build import HFAuditError

    r = audit_hf("apertus", scope="block", embed=8, heads=2, ffn=16)
    assert r.details["terms"]["mlp_rescaling"] == 0 and r.unidentified == r.details["theory_unidentified"]
    original = scopes.count_block

    def planted(block):
        c = original(block)
        terms = {**c.unidentified_by_block, "mlp_rescaling": block.ffn}
        return c.__class__(c.total_params, c.params_by_block, terms)

    monkeypatch.setattr(scopes, "count_block", planted)
    with pytest.raises(HFAuditError, match="the Jacobian gives"):
        audit_hf("apertus", scope="block", embed=8, heads=2, ffn=16)
