"""Released config files read as downloaded, and the mechanisms of recent attention (chapter 9): sinks, NoPE
layers, the soft-capped untied head, softmax-routed experts, the families of 2025. Each closed form equals the
Jacobian rank of the real transformers module, and a planted change moves the count."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from test_cli import run

from attnid import hf
from attnid.attention import AttentionConfig, attention, concat_project_attention, init_params
from attnid.audit import audit, audit_module
from attnid.configs import CONFIG_DIR, NEUTRAL, REMOTE_CODE_NOTE, ConfigError, config_preset, unread_reason
from attnid.counting import SCOPES, count
from attnid.hf import audit_hf, build_attention
from attnid.hf.build import _is_router
from attnid.presets import scope_count

RELEASED = CONFIG_DIR / "released"
SOURCES = json.loads((RELEASED / "SOURCES.json").read_text())


def test_every_released_copy_names_its_source():
    assert sorted(SOURCES) == sorted(p.stem for p in RELEASED.glob("*.json") if p.name != "SOURCES.json")
    for name, s in SOURCES.items():
        assert s["released"].startswith("https://huggingface.co/") and s["copied_from"] and s["as"], name


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_a_released_file_is_counted_at_every_scope(name):
    p = config_preset(RELEASED / f"{name}.json")
    for scope in SCOPES:
        c = scope_count(p, scope, name)
        assert 0 < c.unidentified < c.total_params
    # every field of the file is accounted for: read, neutral (with its reason), fixed by code, at the default
    fields = json.loads((RELEASED / f"{name}.json").read_text())
    r = p.reading
    assert set(fields) == set(r["read"]) | set(r["neutral"]) | set(r["fixed"]) | set(r["at_default"])
    assert all(len(why) > 20 for why in r["neutral"].values())


# the parameter totals of the released checkpoints (their safetensors; the model cards round them)
PUBLISHED_TOTALS = {
    "gemma-2-2b-it": 2_614_341_888, "gpt-oss-20b": 20_914_757_184, "gpt2": 124_439_808,
    "llama-2-7b-chat-hf": 6_738_415_616, "llama-3.1-8b": 8_030_261_248, "llama-3.2-1b-instruct": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824, "mixtral-8x7b-v0.1": 46_702_792_704, "olmo-2-0425-1b": 1_484_916_736,
    "phi-2": 2_779_683_840, "phi-3-medium-4k-instruct": 13_960_238_080, "phi-3-mini-4k-instruct": 3_821_079_552,
    "qwen2-72b-instruct": 72_706_203_648, "qwen2-7b-instruct": 7_615_616_512, "qwen2.5-14b": 14_770_033_664,
    "qwen2.5-32b": 32_763_876_352, "qwen2.5-3b": 3_085_938_688, "qwen2.5-7b": 7_615_616_512,
    "qwen3-14b": 14_768_307_200, "qwen3-30b-a3b": 30_532_122_624, "qwen3-32b": 32_762_123_264,
    "qwen3-4b": 4_022_468_096, "qwen3-8b": 8_190_735_360, "smollm3-3b-base": 3_075_098_624,
    "yi-1.5-34b": 34_388_917_248, "gemma-2-9b-it": 9_241_705_984, "llama-3.2-1b": 1_235_814_400,
    "phi-4": 14_659_507_200, "mistral-nemo-base-2407": 12_247_782_400, "qwen2-0.5b": 494_032_768,
    "mistral-7b-v0.1": 7_241_732_096, "qwen2.5-0.5b": 494_032_768, "meta-llama-3-8b": 8_030_261_248,
    "phi-3.5-mini-instruct": 3_821_079_552, "qwen2.5-1.5b-instruct": 1_543_714_304,
    "tinyllama-1.1b-chat-v1.0": 1_100_048_384, "qwen3-4b-thinking-2507": 4_022_468_096,
    "smollm2-1.7b-instruct": 1_711_376_384, "smollm2-135m": 134_515_008,
    "unsloth-llama-3.2-1b-instruct": 1_235_814_400, "starcoder2-15b": 15_957_889_024,
}  # fmt: skip


@pytest.mark.parametrize(
    "name, fields",
    [
        ("unsloth-llama-3.2-1b-instruct", ["unsloth_fixed"]),  # the re-uploader's marker
        ("smollm2-135m", ["is_llama_config", "rope_interleaved"]),  # the training framework's own fields
        ("smollm2-1.7b-instruct", ["transformers.js_config"]),  # the settings of another runtime
        ("starcoder2-15b", ["mlp_type", "norm_type"]),  # the training framework's names for what the code fixes
    ],
)
def test_fields_no_code_of_the_family_reads_are_accepted_in_the_files_as_downloaded(name, fields):
    p = config_preset(RELEASED / f"{name}.json")
    for k in fields:
        assert p.reading["neutral"][k] == unread_reason(p.hf_type), k


def test_released_totals_equal_the_published_ones():
    """Chapter 9 says so of every released file: the whole model's parameters, counted from the file."""
    assert sorted(PUBLISHED_TOTALS) == sorted(SOURCES)
    for name, total in PUBLISHED_TOTALS.items():
        assert scope_count(config_preset(RELEASED / f"{name}.json"), "model", name).total_params == total, name


@pytest.mark.parametrize(
    "base, fields, reason",
    [
        ("deepseek-v3", {"auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}}, REMOTE_CODE_NOTE),
        ("deepseek-v3", {"n_group": 1, "topk_group": 1}, NEUTRAL["n_group"]),  # Kimi-K2's routing
        ("gemma-2-9b", {"cache_implementation": "hybrid", "sliding_window_size": 4096}, unread_reason("gemma2")),
        ("qwen2-7b", {"use_mrope": False}, None),
        ("falcon-7b", {"apply_residual_connection_post_layernorm": False}, None),
    ],
)
def test_bookkeeping_fields_of_released_files_are_accepted_with_their_reason(tmp_path, base, fields, reason):
    d = json.loads((CONFIG_DIR / f"{base}.json").read_text())
    plain = config_preset(CONFIG_DIR / f"{base}.json")
    (tmp_path / "config.json").write_text(json.dumps({**d, **fields}))
    p = config_preset(tmp_path)
    assert p.config == plain.config and p.model == plain.model
    where = p.reading["neutral"] if reason else p.reading["fixed"]
    assert set(fields) <= set(where)
    if reason:
        assert reason in where.values()


@pytest.mark.parametrize(
    "base, fields, named",
    [
        ("qwen2-7b", {"use_mrope": True}, "use_mrope = True"),
        ("falcon-7b", {"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm"),
        ("gemma-2-9b", {"final_logit_softcapping": 0.0}, "final_logit_softcapping = 0.0"),
        ("llama-2-7b", {"model_type": "my_remote_family", "auto_map": {"AutoConfig": "x.Y"}}, "my_remote_family"),
    ],
)
def test_a_bookkeeping_field_at_another_value_is_still_refused(tmp_path, base, fields, named):
    d = json.loads((CONFIG_DIR / f"{base}.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**d, **fields}))
    with pytest.raises(ConfigError, match=named):
        config_preset(tmp_path)


def test_count_config_says_what_it_read(tmp_path):
    r = run("count", "--config", str(RELEASED / "gpt-oss-20b.json"), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)["config_fields"]
    assert {"num_key_value_heads", "num_local_experts", "swiglu_limit"} <= set(out["read"])
    assert out["neutral"]["initial_context_length"] == unread_reason("gpt_oss")
    text = run("count", "--config", str(RELEASED / "smollm3-3b-base.json")).stdout
    assert "library defaults taken: " in text and "no_rope_layers" in text
    assert "nope layers (9 of the model's)" in text


# ------------------------------------------------------------------------------------------------ attention sinks
SINK_SHAPES = [  # and dict(embed=16, heads=4, groups=2) in tests/test_hf.py
    dict(embed=16, heads=4, groups=1),
    dict(embed=16, heads=2, groups=2, head_dim=4),
    dict(embed=8, heads=2, groups=2, bias="none"),
]


@pytest.mark.parametrize("kw", SINK_SHAPES)
def test_sinks_closed_form_equals_the_rank_of_gpt_oss_attention(kw):
    r = audit_hf("gpt_oss", **kw)  # raises HFAuditError on a difference or an unclear gap
    assert r.unidentified == r.details["theory_unidentified"]
    assert r.details["terms"]["value_bias"] == 0 and r.details["terms"]["key_bias"] == 0


def test_removing_the_sinks_confounds_the_value_bias_again():
    """Planted: the sink logits sent to -inf (exp = 0). The value bias is again absorbed by the output bias
    (G·C more null directions) and each dead sink logit is a null direction of its own (H)."""
    cfg = AttentionConfig(16, 4, groups=2, bias="all", rope=True, causal=True, sinks=True)
    module, forward = build_attention("gpt_oss", cfg, seed=0)
    x = torch.randn(24, 8, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)  # 3,072 outputs
    live = audit_module(module, (x,), forward=forward)
    with torch.no_grad():
        module.sinks.fill_(-1e4)  # exp(-1e4) is 0 in float64
    dead = audit_module(module, (x,), forward=forward)
    without = count(cfg.with_(sinks=False))
    assert live.unidentified == count(cfg).unidentified
    assert dead.unidentified == without.unidentified + cfg.H
    assert dead.unidentified - live.unidentified == cfg.G * cfg.C + cfg.H


@pytest.mark.parametrize(
    "cfg",
    [
        AttentionConfig(8, 2, bias="all", causal=True, sinks=True),
        AttentionConfig(12, 4, groups=2, bias="qkv", causal=True, sinks=True),
        AttentionConfig(16, 2, head_dim=8, bias="all", rope_dims=4, causal=True, sinks=True),
    ],
)
def test_sinks_closed_form_equals_the_rank_of_our_layer(cfg):
    """Without RoPE the key bias is identified too (a per-query shift moves weight to the sink)."""
    r = audit(cfg, method="dense")
    assert r.unidentified == count(cfg).unidentified < count(cfg.with_(sinks=False)).unidentified
    p = init_params(cfg)
    X = torch.randn(2, cfg.E, 5, dtype=torch.float64)
    y = concat_project_attention(X.transpose(1, 2), p, cfg).transpose(1, 2)
    assert torch.allclose(attention(X, p, cfg), y, atol=1e-12)


def test_certify_refuses_sinks_by_name():
    with pytest.raises(ValueError, match="sinks and output gates change"):
        audit(AttentionConfig(16, 4, bias="all", causal=True, sinks=True), method="certify")


# --------------------------------------------------------------------------------------------------- NoPE layers
NOPE_SHAPES = [
    dict(embed=16, heads=4, groups=2),
    dict(embed=16, heads=4, groups=1),
    dict(embed=16, heads=2, groups=2, head_dim=4, bias="all"),
    dict(embed=8, heads=2, groups=2, scope="block", ffn=21),
]


@pytest.mark.parametrize("kw", NOPE_SHAPES)
def test_a_nope_layer_keeps_the_whole_gauge_in_smollm3(kw):
    r = audit_hf("smollm3", nope=True, **kw)  # its RoPE layers: tests/test_hf.py and tests/test_blocks.py
    rope = count(hf.equivalent_config("smollm3", **{k: v for k, v in kw.items() if k not in ("scope", "ffn")}))
    assert r.unidentified == r.details["theory_unidentified"]
    if r.details["scope"] == "attention":
        assert r.unidentified > rope.unidentified


def test_a_model_counts_its_nope_layers_apart():
    p = config_preset(RELEASED / "smollm3-3b-base.json")
    assert p.model.nope_layers == 9
    cfg = p.config
    per_layer = count(cfg.with_(rope=False)).unidentified - count(cfg).unidentified
    plain = config_preset(RELEASED / "smollm3-3b-base.json")
    from dataclasses import replace

    all_rope = replace(plain, model=replace(plain.model, nope_layers=0))
    assert scope_count(p, "model", "x").unidentified - scope_count(all_rope, "model", "x").unidentified == 9 * per_layer


# --------------------------------------------------------------------------------- soft-capped logits, untied head
CAPPED_SHAPES = [dict(heads=2, groups=2), dict(heads=1, groups=1), dict(heads=4, groups=2), dict(heads=2, groups=1)]


@pytest.mark.parametrize("kw", CAPPED_SHAPES)
def test_an_untied_soft_capped_head_identifies_the_logit_shift(kw):
    """Audited with the cap in place (a one-layer Gemma 2 model, F = 12): the closed form without the E logit-shift
    directions of an untied head is the Jacobian's count; planted, the cap taken out gives them back."""
    capped = audit_hf("gemma2", embed=8, ffn=12, scope="model", tied=False, final_softcap=30.0, **kw)
    assert capped.unidentified == capped.details["theory_unidentified"]
    assert capped.details["terms"]["logit_shift"] == 0
    if kw == CAPPED_SHAPES[0]:  # the uncapped twin: tests/test_blocks.py audits it at this shape too
        plain = audit_hf("gemma2", embed=8, ffn=12, scope="model", tied=False, **kw)
        assert plain.details["terms"]["logit_shift"] == 8 and plain.unidentified - capped.unidentified == 8


def test_a_config_with_an_untied_capped_head_is_counted_without_the_shift(tmp_path):
    d = json.loads((CONFIG_DIR / "gemma-2-9b.json").read_text())
    for tied, cap in ((False, 30.0), (False, None), (True, 30.0)):
        (tmp_path / "config.json").write_text(json.dumps({**d, "tie_word_embeddings": tied,
                                                          "final_logit_softcapping": cap}))  # fmt: skip
        terms = scope_count(config_preset(tmp_path), "model", "x").unidentified_by_block
        assert terms["logit_shift"] == (d["hidden_size"] if not tied and cap is None else 0)


# --------------------------------------------------------------------------------- softmax-routed mixtures
@pytest.mark.parametrize("hf_type", ["mixtral", "qwen3_moe"])
def test_a_softmax_router_ignores_a_vector_added_to_every_row_and_no_other(hf_type):
    """The router_shift directions are exact: one vector added to every router row leaves the real layer's output
    unchanged to round-off; planted, the same vector added to one row only changes it (and the Jacobian count of
    the layer equals the closed form with its E directions: tests/test_blocks.py)."""
    cfg = hf.equivalent_config(hf_type, embed=8, heads=2, groups=2)
    layer, forward = hf.build_block(hf_type, cfg, ffn=4, experts=4)
    router = next(m for m in layer.modules() if _is_router(m))
    x = torch.randn(8, 8, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    v = torch.randn(8, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 0.1
    with torch.no_grad():
        y = forward(layer, x)
        router.weight += v  # every row
        shifted = forward(layer, x)
        router.weight[0] += v  # one row more: no longer a shift of every logit
        planted = forward(layer, x)
    assert (shifted - y).abs().max() < 1e-12
    assert (planted - y).abs().max() > 1e-4


@pytest.mark.parametrize(
    "name, total",
    [("mixtral-8x7b-v0.1", 46_702_792_704), ("qwen3-30b-a3b", 30_532_122_624), ("gpt-oss-20b", 20_914_757_184)],
)
def test_released_mixtures_are_counted_at_every_scope_with_their_published_totals(name, total):
    p = config_preset(RELEASED / f"{name}.json")
    assert p.model.experts and scope_count(p, "model", name).total_params == total
    layers = p.model.layers
    assert (
        scope_count(p, "model", name).unidentified_by_block["blocks"]
        == layers * scope_count(p, "block", name).unidentified
    )


# ------------------------------------------------------------------------------------- families read from files
FAMILY_FILES = {  # architecture fields of released models, as their cards and files give them
    "granite": {"model_type": "granite", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                "num_hidden_layers": 40, "intermediate_size": 12800, "vocab_size": 49155, "tie_word_embeddings": True,
                "attention_multiplier": 0.0078125, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                "logits_scaling": 16.0, "rms_norm_eps": 1e-5},
    "starcoder2": {"model_type": "starcoder2", "hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 2,
                   "num_hidden_layers": 30, "intermediate_size": 12288, "vocab_size": 49152, "use_bias": True,
                   "norm_epsilon": 1e-5, "sliding_window": 4096, "tie_word_embeddings": True},
    "glm4": {"model_type": "glm4", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 2,
             "head_dim": 128, "num_hidden_layers": 40, "intermediate_size": 13696, "vocab_size": 151552,
             "attention_bias": True, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-5},
    "stablelm": {"model_type": "stablelm", "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 32,
                 "num_hidden_layers": 24, "intermediate_size": 5632, "vocab_size": 100352, "use_qkv_bias": True,
                 "partial_rotary_factor": 0.25, "layer_norm_eps": 1e-5},
}  # fmt: skip
FAMILY_BIAS_READ = {"granite": "", "starcoder2": "qkvo", "glm4": "qkv", "stablelm": "qkv"}
FAMILY_TOTALS = {"granite": 8_170_848_256, "glm4": 9_400_279_040, "stablelm": 1_644_515_328}


@pytest.mark.parametrize("family", sorted(FAMILY_FILES))
def test_a_family_file_is_read_with_its_bias_field_and_counted_at_every_scope(tmp_path, family):
    (tmp_path / "config.json").write_text(json.dumps(FAMILY_FILES[family]))
    p = config_preset(tmp_path)
    assert p.hf_type == family and p.config.bias == FAMILY_BIAS_READ[family]
    for scope in SCOPES:
        assert scope_count(p, scope, family).unidentified > 0
    if family in FAMILY_TOTALS:
        assert scope_count(p, "model", family).total_params == FAMILY_TOTALS[family]
    off = {"granite": "attention_bias", "starcoder2": "use_bias", "glm4": "attention_bias", "stablelm": "use_qkv_bias"}
    (tmp_path / "config.json").write_text(json.dumps({**FAMILY_FILES[family], off[family]: not p.config.bias}))
    assert config_preset(tmp_path).config.bias == ("qkvo" if family == "granite" else "")


def test_a_tied_layernorm_model_with_rope_has_one_shift_of_its_embedding(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(FAMILY_FILES["starcoder2"]))
    terms = scope_count(config_preset(tmp_path), "model", "x").unidentified_by_block
    assert terms["embedding_shift"] == 1 and terms["logit_shift"] == terms["embedding_mean"] == 0


@pytest.mark.parametrize("name", ["attention_multiplier", "residual_multiplier"])
def test_a_granite_multiplier_of_zero_is_refused_by_name(tmp_path, name):
    (tmp_path / "config.json").write_text(json.dumps({**FAMILY_FILES["granite"], name: 0.0}))
    with pytest.raises(ConfigError, match=f"{name}: 0.0 must be a finite number other than 0"):
        config_preset(tmp_path)


def test_the_chapters_released_facts_follow_the_tables():
    """Chapter 9's sentences on the mechanisms and the released files are glued from these facts; a planted wrong
    closed form lowers the count of agreements the chapter prints."""
    from attnid.chapters import released as rel

    mechanisms, released = rel.mechanism_table(real=False), rel.released_table()
    facts = rel.released_facts(mechanisms, released)
    assert facts["n_agree"] == facts["n_checks"] == 4
    assert facts["n_released"] == facts["n_counted_model"] == len(SOURCES)
    assert facts["sink_gain"] == facts["sink_gc"] and facts["mixtral_router"] == rel.SMALL_E
    planted = mechanisms.copy()
    planted.loc[0, "closed form"] += 1
    assert rel.released_facts(planted, released)["n_agree"] == 3
