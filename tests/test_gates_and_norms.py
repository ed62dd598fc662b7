"""The attention of Llama 4, Qwen3-Next, Command R and StableLM 2 (chapter 9): a QK-norm without a weight, a
LayerNorm per head on queries and keys, gated head outputs, a LayerNorm without a shift in a parallel block, a
sigmoid router choosing one expert beside a shared one, and NoPE layers with a query temperature. Each closed form
equals the Jacobian rank of our layer and of the real transformers module, a planted change moves the count, and
the families' config files are read with what they hold."""

import json

import pytest
import torch

from attnid.attention import AttentionConfig, attention, concat_project_attention, init_params
from attnid.audit import audit
from attnid.counting import SCOPES, count

SHAPES = [  # MHA, GQA, MQA; RoPE on all, part or none of each head; biases
    dict(embed=12, heads=3, head_dim=4, rope=True),
    dict(embed=12, heads=2, head_dim=6, rope_dims=2),
    dict(embed=12, heads=4, groups=2, head_dim=4, bias="qkvo", rope=True),
    dict(embed=12, heads=2, groups=1, head_dim=6, bias="qk"),
]
MECHANISMS = {  # each with the setting it replaces: the plant whose count the Jacobian must refuse
    "l2": (dict(qk_norm="l2"), dict(qk_norm="head")),
    "layer": (dict(qk_norm="layer"), dict(qk_norm="head")),
    "gate": (dict(output_gate=True), dict(output_gate=False)),
}


def _name(kw: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in kw.items())


@pytest.mark.parametrize("shape", SHAPES, ids=_name)
@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_closed_form_equals_the_rank_of_our_layer_and_a_plant_does_not(mechanism, shape):
    on, off = MECHANISMS[mechanism]
    cfg = AttentionConfig(causal=True, **shape, **on)
    res = audit(cfg, seed=0)
    assert res.unidentified == count(cfg).unidentified and res.sv_gap > 1e6
    assert count(cfg.with_(**off)).unidentified != res.unidentified  # the planted closed form is caught
    X = torch.randn(2, cfg.E, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    p = init_params(cfg, seed=1)
    theirs = concat_project_attention(X.transpose(1, 2), p, cfg).transpose(1, 2)
    assert float((attention(X, p, cfg) - theirs).abs().max()) < 1e-12


@pytest.mark.parametrize("qk_norm", ["l2", "layer"])
def test_a_positive_epsilon_leaves_the_scales_identified(qk_norm):
    cfg = AttentionConfig(16, 4, groups=2, rope=True, causal=True, qk_norm=qk_norm, qk_norm_eps=0.05)
    assert count(cfg.with_(qk_norm_eps=0.0)).unidentified - count(cfg).unidentified == 4 + 2  # H + G scales
    res = audit(cfg, seed=0)
    assert res.unidentified == count(cfg).unidentified and res.sv_gap > 1e6


@pytest.mark.parametrize("shape", [dict(embed=10, heads=1, head_dim=5), dict(embed=12, heads=3, groups=1, head_dim=3)],
                         ids=["n1", "D3"])  # fmt: skip
def test_a_layernorm_per_head_without_rope_turns_its_hyperplanes(shape):
    """Without RoPE, a LayerNorm per head leaves one more direction per group when a key head serves one query head
    or a head has three dimensions: orthogonal maps of the centred hyperplanes that move the weight products."""
    cfg = AttentionConfig(causal=True, qk_norm="layer", **shape)
    res = audit(cfg, seed=0)
    assert res.unidentified == count(cfg).unidentified and res.sv_gap > 1e6
    two_groups = AttentionConfig(12, 4, groups=2, head_dim=4, causal=True, qk_norm="layer")  # n = 2, D = 4: none
    assert audit(two_groups, seed=0).unidentified == count(two_groups).unidentified


def test_an_output_gate_keeps_only_diagonal_value_maps_and_sees_the_value_bias():
    """Gated heads (Qwen3-Next): the value/output gauge shrinks from GL(C) to the diagonal, and the value bias, no
    longer a constant output, is identified even beside an output bias."""
    cfg = AttentionConfig(16, 4, groups=2, bias="all", rope=True, causal=True, output_gate=True)
    gated, plain = count(cfg).unidentified_by_block, count(cfg.with_(output_gate=False)).unidentified_by_block
    assert (gated["vo"], plain["vo"]) == (2 * 4, 2 * 4**2)
    assert (gated["value_bias"], plain["value_bias"]) == (0, 2 * 4)


def test_published_shapes_of_the_new_norms():
    """Llama 4 Scout's RoPE layers (E 5120, 40 heads in 8 groups of 128, ε = 1e-5): a rotation per rotated pair and
    group, 8 x 64; StableLM 2 12B's LayerNorm per head: the centring (E per head) dominates."""
    scout = AttentionConfig(5120, 40, groups=8, head_dim=128, rope=True, qk_norm="l2", qk_norm_eps=1e-5)
    assert count(scout).unidentified_by_block["qk"] == 8 * 64
    stablelm = AttentionConfig(5120, 32, groups=8, head_dim=160, rope_dims=40, qk_norm="layer", qk_norm_eps=1e-5)
    assert count(stablelm).unidentified_by_block["qk"] == 40 * 5120 + 8 * (20 + 120)


def test_the_new_settings_are_refused_where_they_are_not_derived():
    from attnid.dynamics import qk_norm_quantities
    from attnid.invariants import layer_invariants

    for kw in (dict(qk_norm="l2"), dict(qk_norm="layer"), dict(output_gate=True)):
        cfg = AttentionConfig(16, 4, rope=True, causal=True, **kw)
        with pytest.raises(ValueError, match="not written yet"):
            layer_invariants(cfg, init_params(cfg))
        with pytest.raises(ValueError, match="method: certify"):
            audit(cfg, method="certify")
    with pytest.raises(ValueError, match="qk_norm_quantities: written for RMSNorm with a weight"):
        cfg = AttentionConfig(16, 4, qk_norm="l2")
        qk_norm_quantities(init_params(cfg), cfg)
    with pytest.raises(ValueError, match="head_dim: counting a LayerNorm per head assumes D >= 3"):
        count(AttentionConfig(8, 4, qk_norm="layer"))
    with pytest.raises(ValueError, match="output_gate must be True or False"):
        AttentionConfig(8, 2, output_gate=1)


# ------------------------------------------------------------------------------------------ the real modules
hf = pytest.importorskip("attnid.hf")

REAL = [  # four shapes of each family, float64 throughout (their float32 rotations and norms patched out)
    ("llama4", dict(heads=4, groups=2)),  # a RoPE layer: L2 QK-norm after the complex rotation
    ("llama4", dict(heads=2, groups=1, head_dim=8, bias="all")),
    ("llama4", dict(heads=4, groups=2, nope=True)),  # a NoPE layer: no norm, a query temperature varying by position
    ("llama4", dict(heads=4, groups=4, nope=True, bias="all")),
    ("llama4", dict(heads=2, groups=1, head_dim=6, nope=True)),
    ("qwen3_next", dict(heads=4, groups=2, head_dim=4, rope_dims=2)),  # gated heads, (1 + w) QK-norm
    ("qwen3_next", dict(heads=2, groups=1, head_dim=6, rope_dims=2, bias="all")),
    ("qwen3_next", dict(heads=4, groups=4)),
    ("qwen3_next", dict(heads=2, groups=2, head_dim=8, rope_dims=2, norm_eps=0.05)),
    ("cohere", dict(heads=4, groups=2, qk_norm="layer")),  # Command R+: a LayerNorm per head
    ("cohere", dict(heads=4, groups=4, qk_norm="layer", bias="all")),
    ("cohere", dict(heads=2, groups=1, qk_norm="layer", norm_eps=0.05)),
    ("cohere", dict(heads=4, groups=1)),  # Command R: no QK-norm, interleaved rotary pairs
    ("stablelm", dict(heads=4, groups=2, rope_dims=2, qk_norm="layer")),  # StableLM 2 12B
    ("stablelm", dict(heads=4, groups=4, rope_dims=2, qk_norm="layer", bias="qkv")),
    ("stablelm", dict(heads=2, groups=1, rope_dims=4, qk_norm="layer")),
    ("stablelm", dict(heads=2, groups=2, rope_dims=6, qk_norm="layer", norm_eps=0.05)),
]


@pytest.mark.parametrize("hf_type, kw", REAL, ids=[f"{t}-{_name(kw)}" for t, kw in REAL])
def test_closed_form_equals_the_rank_of_the_real_attention(hf_type, kw):
    pytest.importorskip("transformers")
    r = hf.audit_hf(hf_type, embed=16, **kw)  # raises HFAuditError on a difference or a gap under 1e6
    assert r.unidentified == r.details["theory_unidentified"] and r.sv_gap >= hf.MIN_GAP


def test_llama4s_nope_layer_runs_its_temperature():
    """The audited NoPE layer scales its queries by a temperature that changes along the audit's positions (the
    configured floor of 2 tokens), so the count covers it; a RoPE layer has none and normalises instead."""
    pytest.importorskip("transformers")
    nope, _ = hf.build_attention("llama4", hf.equivalent_config("llama4", embed=16, heads=4, groups=2, nope=True))
    rope, _ = hf.build_attention("llama4", hf.equivalent_config("llama4", embed=16, heads=4, groups=2))
    assert nope.attn_temperature_tuning and not nope.use_rope and nope.floor_scale == 2
    assert not hasattr(nope, "qk_norm") and hasattr(rope, "qk_norm") and rope.use_rope


def test_a_plant_in_a_gated_module_is_caught():
    """The real gated module against the closed form of the same layer without gates: the audit refuses."""
    pytest.importorskip("transformers")
    shape = dict(embed=12, heads=2, groups=1, head_dim=4, rope_dims=2)
    r = hf.audit_hf("qwen3_next", check=False, **shape)
    assert r.unidentified == r.details["theory_unidentified"]
    r.details["theory_unidentified"] = count(
        hf.equivalent_config("qwen3_next", **shape).with_(output_gate=False)
    ).unidentified
    with pytest.raises(hf.HFAuditError, match="the closed form"):
        hf.check_hf_audit(r)


# ------------------------------------------------------------------------------------------ config files
def preset_of(tmp_path, fields: dict):
    """The preset attnid reads from a ``config.json`` of ``fields`` written in ``tmp_path``."""
    from attnid.configs import config_preset

    (tmp_path / "config.json").write_text(json.dumps(fields))
    return config_preset(tmp_path)


QWEN3_NEXT = {  # Qwen3-Next-80B-A3B's architecture fields, as its model card and public copies give them
    "model_type": "qwen3_next", "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "num_hidden_layers": 48, "full_attention_interval": 4, "partial_rotary_factor": 0.25,
    "rope_theta": 10000000, "rms_norm_eps": 1e-6, "num_experts": 512, "num_experts_per_tok": 10,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "linear_num_value_heads": 32,
    "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "vocab_size": 151936, "tie_word_embeddings": False,
}  # fmt: skip


def test_qwen3_next_counts_its_gated_softmax_layers_and_its_linear_ones_apart(tmp_path):
    """Qwen3-Next-80B-A3B: one gated softmax layer to three of Gated DeltaNet, a mixture of 512 experts (10 chosen)
    beside a gated shared expert in every layer. Scopes attention and block count a softmax layer and say so; scope
    model counts every kind, its total that of transformers' own model built from the same fields."""
    pytest.importorskip("transformers")
    from attnid.presets import mixer_layers_note, scope_count

    p = preset_of(tmp_path, QWEN3_NEXT)
    cfg = p.config
    assert (cfg.output_gate, cfg.qk_norm, cfg.R, cfg.D, cfg.G) == (True, "head", 64, 256, 2)
    assert count(cfg).unidentified_by_block["vo"] == 2 * 256  # diagonal value maps per group
    assert "one of its 12 attention layers; its 36 gated deltanet layers" in mixer_layers_note(p)
    block = scope_count(p, "block", "qwen3-next")
    E, F = 2048, 512
    assert block.unidentified_by_block["mlp_rescaling"] == 512 * F + F  # each routed expert and the shared one
    assert block.unidentified_by_block["router_shift"] == E  # the softmax router; its gate on the shared expert: none
    model = scope_count(p, "model", "qwen3-next")
    assert model.total_params == 79_674_391_296  # transformers' Qwen3NextForCausalLM from these fields
    keys, values = 16 * 128, 32 * 128
    deltanet = (2 * keys + values) + 128 + 2 * E + 512 * F + F + E  # channels, norm weight, norms, experts, router
    assert model.unidentified_by_block["mixer_blocks"] == 36 * deltanet
    from test_cli import run

    r = run("count", "--config", str(tmp_path), "--json")
    assert r.returncode == 0 and "36 gated deltanet layers are counted at scope model" in r.stdout
    r = run("count", "--config", str(tmp_path), "--scope", "model")
    assert r.returncode == 0 and "79,674,391,296 parameters" in r.stdout
    with pytest.raises(Exception, match="no layer is attention"):
        preset_of(tmp_path, {**QWEN3_NEXT, "layer_types": ["linear_attention"] * 48})
    with pytest.raises(Exception, match="mlp_only_layers"):
        preset_of(tmp_path, {**QWEN3_NEXT, "mlp_only_layers": [0]})


COMMAND_R = {  # Command R (v01) and, with use_qk_norm, Command R+'s architecture fields, as their files give them
    "model_type": "cohere", "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 64,
    "num_hidden_layers": 40, "intermediate_size": 22528, "vocab_size": 256000, "layer_norm_eps": 1e-5,
    "logit_scale": 0.0625, "rope_theta": 8000000.0, "use_qk_norm": False, "tie_word_embeddings": True,
}  # fmt: skip


def test_command_r_is_counted_at_every_scope_with_and_without_its_qk_norm(tmp_path):
    pytest.importorskip("transformers")
    from attnid.presets import scope_count

    plain = preset_of(tmp_path, COMMAND_R)
    normed = preset_of(tmp_path, {**COMMAND_R, "use_qk_norm": True})
    assert (plain.config.qk_norm, normed.config.qk_norm, normed.config.qk_norm_eps) == ("", "layer", 1e-5)
    for scope in SCOPES:
        assert 0 < scope_count(plain, scope, "r").unidentified < scope_count(normed, scope, "r+").unidentified
    block = scope_count(plain, "block", "r").unidentified_by_block
    assert block["norm_shift"] == 0 and block["norm_mean"] == 3 * 8192 + 2 * 22528  # every reader row, no shift
    with pytest.raises(Exception, match=r"logit_scale: 0\.0 must be a finite number other than 0"):
        preset_of(tmp_path, {**COMMAND_R, "logit_scale": 0.0})


def test_stablelm_2_12b_reads_its_layernorm_per_head(tmp_path):
    pytest.importorskip("transformers")
    fields = {"model_type": "stablelm", "hidden_size": 5120, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 40, "intermediate_size": 13824, "vocab_size": 100352, "qk_layernorm": True,
              "partial_rotary_factor": 0.25, "layer_norm_eps": 1e-5, "use_qkv_bias": False}  # fmt: skip
    p = preset_of(tmp_path, fields)
    assert (p.config.qk_norm, p.config.R, p.config.qk_norm_eps) == ("layer", 40, 1e-5)
    assert preset_of(tmp_path, {**fields, "qk_layernorm": False}).config.qk_norm == ""


def test_llama4_scout_is_counted_at_every_scope_with_its_published_total():
    """The shipped Llama 4 Scout file (multimodal: its text model counted) at every scope. Its text model's total, with
    the vision tower and projector that transformers builds for its vision_config, is the released checkpoint's
    108,641,793,536 parameters (the card's 109B)."""
    tf = pytest.importorskip("transformers")
    from attnid.configs import CONFIG_DIR, config_preset
    from attnid.presets import layer_type_counts, scope_count

    p = config_preset(CONFIG_DIR / "llama-4-scout.json")
    assert p.reading["truth_values"] == {"attn_temperature_tuning": "4 read as True (the model's code reads its "
                                                                    "truth value)"}  # fmt: skip
    model = scope_count(p, "model", "scout")
    fields = json.loads((CONFIG_DIR / "llama-4-scout.json").read_text())
    from transformers.models.llama4 import modeling_llama4 as m

    cfg = tf.Llama4Config(text_config={**fields["text_config"], "attn_temperature_tuning": True},
                          vision_config=fields["vision_config"])  # fmt: skip
    with torch.device("meta"):  # the vision tower and its projector, as Llama4ForConditionalGeneration builds them
        towers = (m.Llama4VisionModel(cfg.vision_config), m.Llama4MultiModalProjector(cfg))
    vision = sum(q.numel() for t in towers for q in t.parameters())
    assert model.total_params + vision == 108_641_793_536
    kinds = layer_type_counts(p)
    assert kinds["nope"].unidentified_by_block["qk"] == 8 * 128**2  # GL(D) per group, no QK-norm
    assert kinds["rope"].unidentified_by_block["qk"] == 8 * 64  # a rotation per pair and group
    block = scope_count(p, "block", "scout").unidentified
    assert model.unidentified_by_block["blocks"] == 36 * block + 12 * (
        block - kinds["rope"].unidentified + kinds["nope"].unidentified
    )


def test_llama4_totals_equal_transformers_own_on_the_meta_device(tmp_path):
    """Scout and a Maverick-like text model (dense layers between the mixtures, every NoPE layer a mixture one, no
    QK-norm): attnid's total equals the parameters transformers' own Llama4ForCausalLM allocates."""
    tf = pytest.importorskip("transformers")
    from attnid.configs import CONFIG_DIR
    from attnid.presets import scope_count

    scout = json.loads((CONFIG_DIR / "llama-4-scout.json").read_text())["text_config"]
    small = {**scout, "hidden_size": 64, "head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 32, "intermediate_size_mlp": 96, "vocab_size": 500, "num_hidden_layers": 8,
             "num_local_experts": 4, "attn_temperature_tuning": True, "pad_token_id": None, "bos_token_id": None,
             "eos_token_id": None}  # fmt: skip
    maverick_like = {**small, "interleave_moe_layer_step": 2, "use_qk_norm": False}
    for fields in (dict(small, moe_layers=list(range(8)), no_rope_layers=[1, 1, 1, 0] * 2),
                   {k: v for k, v in maverick_like.items() if k not in ("moe_layers", "no_rope_layers")}):  # fmt: skip
        p = preset_of(tmp_path, fields)
        c = tf.AutoConfig.for_model("llama4_text", **{k: v for k, v in fields.items() if k != "model_type"})
        with torch.device("meta"):
            built = tf.Llama4ForCausalLM(c)
        assert scope_count(p, "model", "x").total_params == sum(q.numel() for q in built.parameters())
    p = preset_of(tmp_path, {k: v for k, v in maverick_like.items() if k not in ("moe_layers", "no_rope_layers")})
    assert (p.model.dense_layers, p.model.nope_layers, p.model.nope_dense_layers) == (4, 2, 0)
    assert p.config.qk_norm == ""


@pytest.mark.parametrize("field, value, says", [("attention_chunk_size", 1, "a chunk of one token"),
                                                ("attn_scale", -0.1, "must be a finite number >= 0")])  # fmt: skip
def test_llama4_fields_that_change_the_function_are_refused_by_name(tmp_path, field, value, says):
    pytest.importorskip("transformers")
    from attnid.configs import CONFIG_DIR

    text = json.loads((CONFIG_DIR / "llama-4-scout.json").read_text())["text_config"]
    with pytest.raises(Exception, match=says):
        preset_of(tmp_path, {**text, field: value})


def test_the_cli_takes_the_new_norms_and_gates():
    pytest.importorskip("transformers")
    from test_cli import run

    r = run("count", "-E", "16", "-H", "4", "--qk-norm", "layer", "--output-gate", "--json")
    out = json.loads(r.stdout)
    cfg = AttentionConfig(16, 4, qk_norm="layer", output_gate=True)
    assert r.returncode == 0 and out["unidentified"] == count(cfg).unidentified and out["architecture"]["output_gate"]
    r = run("audit", "--hf", "qwen3", "--qk-norm", "layer")
    assert r.returncode == 2 and "is the module of stablelm, cohere" in r.stderr
    r = run("audit", "--hf", "llama", "--output-gate")
    assert r.returncode == 2 and "it is the module of qwen3_next" in r.stderr
    r = run("audit", "--hf", "llama4", "--qk-norm", "none", "--embed", "16", "--heads", "4", "--groups", "2")
    assert r.returncode == 0, r.stderr


def test_the_chapters_norms_and_gates_facts_follow_the_tables():
    """Chapter 9's sentences on the norms and gates are glued from these facts; a planted wrong closed form lowers
    the count of agreements the chapter prints."""
    from attnid.chapters import released as rel

    gates, models = rel.norms_and_gates_table(real=False), rel.norms_and_gates_models()
    facts = rel.norms_and_gates_facts(gates, models)
    assert facts["ng_agree"] == facts["ng_checks"] == 2 * len(rel.NORMS_AND_GATES)
    assert facts["qwen_next_vo"] == 2 * 256 and facts["qwen_next_vo_without"] == 2 * 256**2
    assert facts["stablelm_centring"] == (32 + 8) * 5120 < facts["stablelm_qk"]
    assert (
        facts["scout_rope"] == count(rel.NORMS_AND_GATES_MODELS["Llama-4-Scout-17B-16E (RoPE layers)"][1]).unidentified
    )
    planted = gates.copy()
    planted.loc[0, "closed form"] += 1
    assert rel.norms_and_gates_facts(planted, models)["ng_agree"] == facts["ng_agree"] - 1
