"""The families that are known ones in new clothes (OLMo 3, ...): each released file (``data/configs/families``, its
source named in the file) is counted at every scope, every field accounted for, and its whole model's total equals the
parameters of transformers' own model built from the same file (on the meta device: no weights are made)."""

import copy
import json
import logging
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch
import transformers

from attnid.config_multimodal import FLAT_TEXT_MODELS, flat_text_config
from attnid.configs import CONFIG_DIR, SOURCE_KEY, ConfigError, config_preset
from attnid.counting import SCOPES
from attnid.families import HF_TYPES
from attnid.hf import structure_audit
from attnid.presets import scope_count

FAMILIES = Path(__file__).resolve().parents[1] / "data" / "configs" / "families"
FILES = sorted(FAMILIES.glob("*.json"))


def library_total(fields: dict) -> int:
    """The parameters of transformers' causal LM for ``fields``: of its language model and head where it is a
    multimodal model (its vision tower is not counted)."""
    fields = {k: v for k, v in copy.deepcopy(fields).items() if k != SOURCE_KEY}
    model_type = fields.pop("model_type")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("transformers").setLevel(logging.ERROR)
        config = transformers.AutoConfig.for_model(model_type, **fields)
        with torch.device("meta"):
            try:
                model = transformers.AutoModelForCausalLM.from_config(config)
            except ValueError:  # a multimodal model (Qwen2.5-VL's) is one of images and text to text
                model = transformers.AutoModelForImageTextToText.from_config(config)
    text = getattr(getattr(model, "model", None), "language_model", None)
    parts = [model] if text is None else [text, model.lm_head]
    params = {id(p): p for part in parts for p in part.parameters()}  # a tied head counted once
    return sum(p.numel() for p in params.values())


def test_every_file_names_its_release():
    assert [p.stem for p in FILES] == ["apertus-8b", "bamba-9b", "bloom", "command-r7b-12-2024", "dots.llm1.inst",
                                       "ernie-4.5-21b-a3b", "exaone-4.0-32b", "glm-4.5-air", "hunyuan-a13b-instruct",
                                       "internlm3-8b-instruct", "lfm2-1.2b", "olmo-3-7b",
                                       "qwen2.5-vl-7b-instruct", "qwen3-next-80b-a3b-instruct",
                                       "qwen3-vl-2b-instruct", "qwen3-vl-30b-a3b-instruct", "qwen3.5-35b-a3b",
                                       "qwen3.5-4b"]  # fmt: skip
    for path in FILES:
        note = json.loads(path.read_text())[SOURCE_KEY]
        assert note["source"].startswith("https://huggingface.co/") and note["note"], path.name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_family_file_is_counted_at_every_scope_with_transformers_total(path):
    """Every scope, and the whole model's total equals transformers' model; a model with a LayerNorm on its token
    embeddings (BLOOM) is refused at scope model, by name, and counted at the others."""
    p = config_preset(path)
    embedding_norm = HF_TYPES[p.hf_type].embedding_norm
    scopes = [s for s in SCOPES if not (embedding_norm and s == "model")]
    counts = {scope: scope_count(p, scope, path.stem) for scope in scopes}
    for c in counts.values():
        assert 0 < c.unidentified < c.total_params
    fields = json.loads(path.read_text())
    fields.pop(SOURCE_KEY)
    r = p.reading
    text = fields
    if fields["model_type"] in FLAT_TEXT_MODELS:  # a multimodal file: its text model's fields are what is read
        text = flat_text_config(fields, fields["model_type"])["text_config"]
    elif "text_config" in fields:
        text = fields["text_config"]
    assert set(text) | {"model_type"} == set(r["read"]) | set(r["neutral"]) | set(r["fixed"]) | set(r["at_default"])
    if embedding_norm:
        with pytest.raises(ValueError, match="word_embeddings_layernorm"):
            scope_count(p, "model", path.stem)
        return
    assert counts["model"].total_params == library_total(fields)


def test_internlm3_is_read_as_the_llama_its_library_builds(tmp_path):
    """InternLM3's class keeps qkv_bias and bias under Llama's names, and its validator requires them equal (Llama's
    code biases all four attention maps alike): biases on both give Llama's attention with biases, its MLP biases
    refusing the block by name; biases on one only are refused, as transformers refuses them."""
    d = json.loads((FAMILIES / "internlm3-8b-instruct.json").read_text())
    p = config_preset(FAMILIES / "internlm3-8b-instruct.json")
    assert p.hf_type == "llama" and {"qkv_bias", "bias"} <= set(p.reading["read"]) | set(p.reading["at_default"])
    (tmp_path / "config.json").write_text(json.dumps({**d, "qkv_bias": True, "bias": True}))
    biased = config_preset(tmp_path)
    assert biased.config.bias == "qkvo" and biased.model is None and "mlp_bias" in biased.attention_only
    (tmp_path / "config.json").write_text(json.dumps({**d, "qkv_bias": True}))
    with pytest.raises(ConfigError, match="qkv_bias different from bias"):
        config_preset(tmp_path)


def test_a_nope_layer_is_not_counted_as_a_rope_layer(monkeypatch):
    """Command R7B's full-attention layers have no RoPE: the real layer's Jacobian shows the whole GL(D) gauge, which
    the closed form of a RoPE layer misses; behind its shift-free LayerNorm, a one-head NoPE layer at D = E shares
    one direction between the gauge and the norm's mean directions, and a closed form that counts it twice is refused
    by the audit."""
    from attnid.counting import count, models
    from attnid.hf import HFAuditError, audit_hf, equivalent_config

    r = audit_hf("cohere2", scope="attention", embed=8, heads=2, nope=True)
    assert (
        r.unidentified
        == r.details["theory_unidentified"]
        != count(equivalent_config("cohere2", embed=8, heads=2)).unidentified
    )
    assert audit_hf("cohere2", scope="block", embed=8, heads=1, nope=True, ffn=16).unidentified == 207
    monkeypatch.setattr(models, "_nope_overlap", lambda cfg: 0)
    with pytest.raises(HFAuditError, match="closed form 208"):
        audit_hf("cohere2", scope="block", embed=8, heads=1, nope=True, ffn=16)


def test_which_layers_have_no_rope_is_one_rule_for_configs_and_checkpoints():
    """Command R7B rotates in its sliding-window layers only, EXAONE 4 too unless no window is set (then in every
    layer); a checkpoint's NoPE layers (audit --checkpoint) are the ones the config count takes apart."""
    from attnid.checkpoints import layer_config
    from attnid.families import nope_layer_flags

    kinds = ["sliding_attention"] * 3 + ["full_attention"]
    r7b = transformers.Cohere2Config(num_hidden_layers=4, layer_types=kinds, sliding_window=8)
    assert nope_layer_flags("cohere2", r7b) == [False, False, False, True]
    windowless = transformers.Cohere2Config(num_hidden_layers=4, sliding_window=None)
    assert nope_layer_flags("cohere2", windowless) == [True] * 4
    exaone = transformers.Exaone4Config(num_hidden_layers=4, sliding_window=None, layer_types=["full_attention"] * 4)
    assert nope_layer_flags("exaone4", exaone) == [False] * 4
    cfg = config_preset(FAMILIES / "command-r7b-12-2024.json").config
    assert layer_config(cfg, "cohere2", r7b, 0) == cfg and not layer_config(cfg, "cohere2", r7b, 3).rope
    assert config_preset(FAMILIES / "command-r7b-12-2024.json").model.nope_layers == 8


MISTRAL_SMALL_3_1 = {  # mistralai/Mistral-Small-3.1-24B-Instruct-2503's config.json, its text model transcribed
    "architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10, "model_type": "mistral3",
    "multimodal_projector_bias": False, "projector_hidden_act": "gelu", "spatial_merge_size": 2,
    "text_config": {"head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
                    "intermediate_size": 32768, "max_position_embeddings": 131072, "model_type": "mistral",
                    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                    "rope_theta": 1000000000.0, "sliding_window": None, "use_cache": True, "vocab_size": 131072},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"model_type": "pixtral", "hidden_size": 1024, "num_hidden_layers": 24},
    "vision_feature_layer": -1,
}  # fmt: skip


def test_mistral3s_text_model_is_counted_once_its_tying_is_not_in_doubt(tmp_path):
    """Mistral 3 (Mistral Small 3.1) wraps Mistral's text model. transformers 5.24 ties its embeddings by the outer
    tie_word_embeddings, True by default, while the text model's says False: a file that sets neither is refused
    (the two counts differ by V E); with the outer field set, the text model is counted with that tying, its total
    that of the model transformers builds (a text_config field beside it is read by no code, and said so); a text
    model of another type is refused by name."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MISTRAL_SMALL_3_1))
    with pytest.raises(ConfigError, match=r"by the multimodal class's default \(which decides\).* refuses to choose"):
        config_preset(path)
    for tie in (False, True):
        path.write_text(json.dumps({**MISTRAL_SMALL_3_1, "tie_word_embeddings": tie}))
        p = config_preset(path)
        assert p.hf_type == "mistral" and "vision tower is not counted" in p.description and p.model.tied == tie
        text = {**MISTRAL_SMALL_3_1["text_config"], "tie_word_embeddings": tie}
        assert scope_count(p, "model", "mistral-small").total_params == library_total(text)
    inner = {**MISTRAL_SMALL_3_1["text_config"], "tie_word_embeddings": True}
    path.write_text(json.dumps({**MISTRAL_SMALL_3_1, "tie_word_embeddings": False, "text_config": inner}))
    p = config_preset(path)
    assert not p.model.tied and "no code reads it" in p.reading["neutral"]["tie_word_embeddings"]
    other = {**MISTRAL_SMALL_3_1, "tie_word_embeddings": False,
             "text_config": {**MISTRAL_SMALL_3_1["text_config"], "model_type": "ministral3"}}  # fmt: skip
    path.write_text(json.dumps(other))
    with pytest.raises(ConfigError, match="'ministral3' is not one attnid reads inside mistral3"):
        config_preset(path)


def test_a_grouped_router_mixture_is_deepseeks_around_attention_of_its_own(monkeypatch, tmp_path):
    """GLM-4.5 and dots.llm1: DeepSeek-V3's mixture (a sigmoid router whose experts are chosen within groups, its
    weights renormalised and scaled by a fixed factor, one shared expert beside) around their own attention. The real
    decoder layer's Jacobian equals the closed form; a closed form without the shared expert is refused by the audit.
    The released files read their dense first layers and their shared experts' width; a file that leaves the shared
    experts' number null, or chooses one expert per token, is refused with what transformers would build."""
    import dataclasses

    from attnid import families
    from attnid.hf import HFAuditError, audit_hf

    r = audit_hf("glm4_moe", scope="block", embed=8, heads=2, groups=1, bias="qkv", ffn=4)
    assert r.unidentified == r.details["theory_unidentified"] and r.sv_gap > 1e6
    assert r.details["terms"]["mlp_rescaling"] == 5 * 4  # four routed experts and the shared one, 4 units each
    monkeypatch.setitem(families.HF_TYPES, "glm4_moe", dataclasses.replace(families.HF_TYPES["glm4_moe"],
                                                                           shared_expert=False))  # fmt: skip
    with pytest.raises(HFAuditError, match="closed form"):
        audit_hf("glm4_moe", scope="block", embed=8, heads=2, groups=1, bias="qkv", ffn=4)
    monkeypatch.undo()
    air = config_preset(FAMILIES / "glm-4.5-air.json")
    assert (air.model.dense_layers, air.model.experts, air.model.shared_ffn) == (1, 128, 1408)
    assert air.config.bias == "qkv" and air.config.R == 64 and not air.config.qk_norm
    dots = config_preset(FAMILIES / "dots.llm1.inst.json")
    assert (dots.model.shared_ffn, dots.config.qk_norm) == (2 * 1408, "head")
    fields = json.loads((FAMILIES / "dots.llm1.inst.json").read_text())
    for change, message in ((dict(n_shared_experts=None), "n_shared_experts: null"),
                            (dict(num_experts_per_tok=1), "num_experts_per_tok: 1 of 128"),
                            (dict(first_k_dense_replace=63), "first_k_dense_replace: 63 must be")):  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps({**fields, **change}))
        with pytest.raises(ConfigError, match=message):
            config_preset(tmp_path)


def test_alibi_is_counted_as_the_layer_without_a_position_map_it_is(monkeypatch):
    """BLOOM's ALiBi adds -m_h (i - j) to head h's scores: a fixed bias, no parameter. Every symmetry of a layer
    without a position map stays (the whole GL(D) query/key gauge of each head; the key bias still drops out, since
    q_i . b_K is the same for every key j) and none is added. The real attention module and decoder layer agree with
    the closed form of that layer; a closed form that counts ALiBi as RoPE is refused by the audit. The released
    file is counted at scopes attention and block and refused at scope model, naming its LayerNorm on the
    embeddings."""
    from attnid.attention import AttentionConfig
    from attnid.counting import count
    from attnid.hf import HFAuditError, audit_hf, scopes

    r = audit_hf("bloom", scope="attention", embed=8, heads=2)
    nope = count(AttentionConfig(8, 2, bias="qkvo", causal=True))
    assert r.unidentified == r.details["theory_unidentified"] == nope.unidentified and r.sv_gap > 1e6
    assert nope.unidentified > count(AttentionConfig(8, 2, bias="qkvo", causal=True, rope=True)).unidentified
    monkeypatch.setattr(scopes, "count", lambda cfg: count(cfg.with_(rope=True)))
    with pytest.raises(HFAuditError, match="closed form"):
        audit_hf("bloom", scope="attention", embed=8, heads=2)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="ffn: bloom's code fixes the MLP's inner size to 32"):
        audit_hf("bloom", scope="block", embed=8, heads=2, ffn=16)
    with pytest.raises(ValueError, match="LayerNorm on its token embeddings"):
        audit_hf("bloom", scope="model", embed=8, heads=2)
    p = config_preset(FAMILIES / "bloom.json")
    assert (p.hf_type, p.config.E, p.config.H, p.config.rope, p.config.bias) == ("bloom", 14336, 112, False, "qkvo")
    block = scope_count(p, "block", "bloom")
    assert block.total_params == 12 * 14336**2 + 13 * 14336  # attention and MLP maps with biases, two LayerNorms
    with pytest.raises(ValueError, match="word_embeddings_layernorm"):
        scope_count(p, "model", "bloom")


def test_a_bias_that_only_chooses_experts_is_counted_and_unidentified(monkeypatch, tmp_path):
    """ERNIE 4.5's router adds a parameter per expert to its scores to choose the experts, not to weight them: the
    choice is constant near almost every input, so those parameters reach no output. The real decoder layer's
    Jacobian shows them unidentified; a closed form without them is refused. The released file's mixture layers are
    the ones moe_layer_start_index, moe_layer_end_index and moe_layer_interval pick; use_bias (biases on the gated
    MLP too) refuses the block by name, and a floor on the chosen weights' sum that could bind is refused."""
    import dataclasses

    from attnid import families
    from attnid.hf import HFAuditError, audit_hf

    r = audit_hf("ernie4_5_moe", scope="block", embed=8, heads=2, ffn=4)
    assert r.unidentified == r.details["theory_unidentified"] and r.details["terms"]["choice_bias"] == 4
    monkeypatch.setitem(families.HF_TYPES, "ernie4_5_moe", dataclasses.replace(families.HF_TYPES["ernie4_5_moe"],
                                                                               choice_bias=False))  # fmt: skip
    with pytest.raises(HFAuditError, match="closed form"):
        audit_hf("ernie4_5_moe", scope="block", embed=8, heads=2, ffn=4)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="use_bias puts biases on its gated MLP too"):
        audit_hf("ernie4_5_moe", scope="block", embed=8, heads=2, ffn=4, bias="all")
    p = config_preset(FAMILIES / "ernie-4.5-21b-a3b.json")
    assert (p.model.dense_layers, p.model.experts, p.model.shared_ffn) == (1, 64, 2 * 1536)
    fields = json.loads((FAMILIES / "ernie-4.5-21b-a3b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**fields, "moe_layer_interval": 2}))
    assert config_preset(tmp_path).model.dense_layers == 14  # layers 1, 3, ... 27 are mixtures
    (tmp_path / "config.json").write_text(json.dumps({**fields, "use_bias": True}))
    biased = config_preset(tmp_path)
    assert biased.model is None and "use_bias = True" in biased.attention_only
    (tmp_path / "config.json").write_text(json.dumps({**fields, "moe_norm_min": 0.5}))
    with pytest.raises(ConfigError, match=r"moe_norm_min: 0\.5"):
        config_preset(tmp_path)


M_ROPE_SHAPES = [("attention", dict(embed=16, heads=2)), ("attention", dict(embed=16, heads=4, groups=2)),
                 ("attention", dict(embed=24, heads=2, groups=1)),
                 ("block", dict(embed=8, heads=4, groups=2, ffn=16))]  # fmt: skip
# Qwen3.5 rotates a share of each head: six of eight channels here, three pairs, one for each stream
QWEN3_5_M_ROPE_SHAPES = [("attention", dict(embed=8, heads=1, rope_dims=6)),
                         ("attention", dict(embed=16, heads=2, rope_dims=6)),
                         ("attention", dict(embed=12, heads=2, groups=1, head_dim=6, rope_dims=6)),
                         ("block", dict(embed=8, heads=1, rope_dims=6, ffn=4))]  # fmt: skip


@pytest.mark.parametrize(
    "hf_type,scope,kw",
    [(t, scope, kw) for t in ("qwen2_5_vl", "qwen3_vl") for scope, kw in M_ROPE_SHAPES]
    + [("qwen3_5", scope, kw) for scope, kw in QWEN3_5_M_ROPE_SHAPES]
    + [("qwen3_vl_moe", "block", dict(embed=8, heads=2, ffn=4))],
)
def test_m_rope_is_counted_as_rope_at_text_and_multimodal_positions(hf_type, scope, kw):
    """Qwen2.5-VL's M-RoPE turns each rotated pair by one of three position streams (time, height, width), in three
    runs of pairs; Qwen3-VL's and Qwen3.5's deal the pairs to the streams in turn. The frequencies stay distinct, so the
    query/key gauge that commutes with every turn is the same as RoPE's, one rotation and scale per pair, whichever
    stream turns it: at a text's positions (the three streams equal) and at a multimodal map where each stream moves
    on its own, the real module's Jacobian equals the RoPE closed form."""
    from attnid.hf import audit_hf

    for positions in ("text", "grid"):
        r = audit_hf(hf_type, scope=scope, positions=positions, **kw)
        assert r.unidentified == r.details["theory_unidentified"] and r.sv_gap > 1e6, positions
        assert r.details["positions"] == positions


@pytest.mark.parametrize(
    "hf_type,kw",
    [("qwen2_5_vl", dict(embed=16, heads=2)), ("qwen3_vl", dict(embed=16, heads=2)),
     ("qwen3_5", dict(embed=16, heads=2, rope_dims=6))],
)  # fmt: skip
def test_a_stream_that_never_moves_leaves_its_pairs_unrotated(monkeypatch, hf_type, kw):
    """The RoPE count of M-RoPE needs every stream to move over the data: planted, a map whose height stream is the
    same for every token leaves that stream's pairs turned by nothing, as in a layer without RoPE, and the audit
    refuses the RoPE closed form; a position map other than a text's is refused by name where no M-RoPE reads it."""
    from attnid.hf import HFAuditError, audit_hf, build

    def frozen(B, L):
        streams = original(B, L).clone()
        streams[1] = 0
        return streams

    original = build.grid_positions
    monkeypatch.setattr(build, "grid_positions", frozen)
    with pytest.raises(HFAuditError, match="closed form"):
        audit_hf(hf_type, scope="attention", positions="grid", **kw)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="positions: a grid position map is read by an M-RoPE layer only"):
        audit_hf("llama", scope="attention", positions="grid", embed=16, heads=2)


def test_a_qwen2_5_vl_file_is_read_flat_as_released_or_nested_as_saved_now(tmp_path):
    """Qwen2.5-VL's release is flat (its text model's fields beside the vision tower's), which transformers' class
    gathers into text_config: read either way, the text model counts the same. Its multimodal class decides the
    tying; an mrope_section whose pairs do not add up to head_dim / 2 is refused by name."""
    flat = json.loads((FAMILIES / "qwen2.5-vl-7b-instruct.json").read_text())
    flat.pop(SOURCE_KEY)
    p = config_preset(FAMILIES / "qwen2.5-vl-7b-instruct.json")
    assert (p.hf_type, p.config.rope, p.config.bias, p.model.tied) == ("qwen2_5_vl", True, "qkv", False)
    (tmp_path / "config.json").write_text(json.dumps(flat_text_config(flat, "qwen2_5_vl")))
    nested = config_preset(tmp_path)
    for scope in SCOPES:
        assert scope_count(nested, scope, "nested") == scope_count(p, scope, "flat")
    (tmp_path / "config.json").write_text(json.dumps({**flat, "tie_word_embeddings": True}))
    assert config_preset(tmp_path).model.tied
    sections = {**flat["rope_scaling"], "mrope_section": [16, 24, 23]}
    (tmp_path / "config.json").write_text(json.dumps({**flat, "rope_scaling": sections}))
    with pytest.raises(ConfigError, match=r"mrope_section \[16, 24, 23\] must give the three position streams"):
        config_preset(tmp_path)


def test_a_qwen3_vl_file_ties_as_its_multimodal_class_says(tmp_path):
    """Qwen3-VL's released files write tie_word_embeddings inside text_config and beside it; transformers ties by the
    one beside it (its text config class has no such field), so the inner one is accepted as unread and a file
    whose outer field says false counts an untied head, whatever the inner one says. Its streams take the pairs in
    turn, so mrope_section need not add up to head_dim / 2; three counts it must be."""
    path = FAMILIES / "qwen3-vl-2b-instruct.json"
    d = json.loads(path.read_text())
    d.pop(SOURCE_KEY)
    p = config_preset(path)
    assert (p.hf_type, p.config.qk_norm, p.model.tied) == ("qwen3_vl", "head", True)
    assert "no code reads it" in p.reading["neutral"]["tie_word_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps({**d, "tie_word_embeddings": False}))
    untied = config_preset(tmp_path)
    assert not untied.model.tied
    gap = scope_count(untied, "model", "untied").total_params - scope_count(p, "model", "tied").total_params
    assert gap == library_total({**d, "tie_word_embeddings": False}) - library_total(d) == 151936 * 2048
    text = d["text_config"]
    for sections, ok in (([16, 24, 24], True), ([24, 20], False)):
        rope = {**text["rope_scaling"], "mrope_section": sections}
        (tmp_path / "config.json").write_text(json.dumps({**d, "text_config": {**text, "rope_scaling": rope}}))
        if ok:
            assert scope_count(config_preset(tmp_path), "model", "q") == scope_count(p, "model", "q")
        else:
            with pytest.raises(ConfigError, match=r"mrope_section \[24, 20\] must give the three position streams"):
                config_preset(tmp_path)


def test_a_qk_norm_after_rope_trades_its_weights_per_coordinate(monkeypatch):
    """Hunyuan-A13B normalises each head's queries and keys after RoPE. A rotation keeps the norm, so the scores are
    n(q)ᵀ R_mᵀ diag(w_Q w_K) R_n n(k): only the product of the two weights reaches them, coordinate by coordinate, a
    trade per coordinate (D) where the norm before RoPE (Qwen3's) has one per rotated pair (D/2); and no rotation of
    the pairs commutes with a generic diag(w_Q w_K). The real layer agrees, our layer too, and the closed form of
    the norm before RoPE is refused by the audit."""
    from attnid.audit import audit
    from attnid.counting import attention as counting_attention
    from attnid.hf import HFAuditError, audit_hf, equivalent_config

    kw = dict(embed=16, heads=4, groups=2)
    r = audit_hf("hunyuan_v1_moe", scope="attention", **kw)
    ours = audit(equivalent_config("hunyuan_v1_moe", **kw), method="dense")
    assert r.unidentified == r.details["theory_unidentified"] == ours.unidentified and r.sv_gap > 1e6
    cfg = equivalent_config("hunyuan_v1_moe", **kw)
    before = counting_attention._qk_norm_fiber(cfg.with_(qk_norm="head"), cfg.E)
    assert counting_attention._qk_norm_fiber(cfg, cfg.E) - before == cfg.D // 2
    original = counting_attention._qk_norm_fiber

    def before_rope(c, q_cols):  # the planted closed form: the norm counted as if it came before the rotation
        return original(c.with_(qk_norm="head") if c.qk_norm == "head_rope" else c, q_cols)

    monkeypatch.setattr(counting_attention, "_qk_norm_fiber", before_rope)
    with pytest.raises(HFAuditError, match="closed form"):
        audit_hf("hunyuan_v1_moe", scope="attention", **kw)


@pytest.mark.parametrize("embed,kernel,bias", [(4, 2, False), (6, 3, False), (8, 3, True), (5, 4, True), (8, 1, False)])
def test_a_short_convolution_keeps_four_scales_per_channel(embed, kernel, bias):
    """LFM2's short convolution, y = W_out (C ⊙ (w ⋆ (B ⊙ x))): per channel, a factor on B's row against its inverse
    on x's, and factors on the product, the filter and C's row that out_proj's column takes back: 4E directions, with
    or without biases (each factor carries its row's bias). The real module's Jacobian in float64 agrees."""
    from attnid.hf.short_conv import audit_short_conv_hf

    r = audit_short_conv_hf(embed, kernel, bias)  # raises on a difference or a blurred gap
    assert r.unidentified == r.details["theory_unidentified"] == 4 * embed and r.sv_gap > 1e6


def test_a_short_convolution_without_the_product_freedom_is_refused(monkeypatch):
    """Planted: a closed form that forgets the B/x trade (three scales per channel) is refused by the real module; a
    filter of no tap is refused by name."""
    from attnid.counting import short_conv
    from attnid.counting.attention import Count
    from attnid.hf import HFAuditError
    from attnid.hf import short_conv as hf_short_conv

    original = short_conv.count_short_conv

    def three_scales(embed, kernel, bias=False):
        c = original(embed, kernel, bias)
        return Count(c.total_params, c.params_by_block, {"channel_scales": 3 * embed})

    monkeypatch.setattr(hf_short_conv, "count_short_conv", three_scales)
    with pytest.raises(HFAuditError, match="closed form 18"):
        hf_short_conv.audit_short_conv_hf(6, 3)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="kernel must be an integer >= 1, got 0"):
        short_conv.count_short_conv(8, 0)


def test_a_whole_qwen2_5_vl_model_is_not_audited_and_says_why():
    """transformers' whole Qwen2.5-VL model carries its vision tower, and its text model has no causal-LM class of
    its own: a whole-model audit is refused with that reason (the closed form still counts a released file's text
    model)."""
    from attnid.hf import audit_hf

    with pytest.raises(ValueError, match="text model has no causal-LM class of its own"):
        audit_hf("qwen2_5_vl", scope="model", embed=8, heads=2)
    assert scope_count(config_preset(FAMILIES / "qwen2.5-vl-7b-instruct.json"), "model", "qwen").total_params > 0


FALCON = json.loads((FAMILIES.parent / "falcon-7b.json").read_text())
FALCON_40B = {"hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60}  # its sizes
# Falcon's three switches and the wiring each gives: Falcon-7B's file, the new architecture of Falcon-40B and 180B
# (a LayerNorm each for attention and MLP, eight groups of keys), Falcon 2's (one LayerNorm for both), a sequential one
FALCON_WIRINGS = [
    ({}, "shared_norm"),
    ({**FALCON_40B, "new_decoder_architecture": True, "num_kv_heads": 8}, "parallel"),
    ({**FALCON_40B, "new_decoder_architecture": True, "num_kv_heads": 8, "num_ln_in_parallel_attn": 1}, "shared_norm"),
    ({"parallel_attn": False, "multi_query": False, "bias": True}, "sequential"),
]


@pytest.mark.parametrize("changes,residual", FALCON_WIRINGS)
def test_a_falcon_file_is_counted_as_its_switches_wire_its_layers(tmp_path, changes, residual):
    """Each wiring of a Falcon file is read as transformers' Falcon code builds it, and its whole model's total is the
    parameters of transformers' own model built from the same fields; one LayerNorm for both sub-layers counts
    otherwise than one each."""
    fields = dict(FALCON, **changes)
    (tmp_path / "config.json").write_text(json.dumps(fields))
    p = config_preset(tmp_path / "config.json")
    assert (p.hf_type, p.model.residual) == ("falcon", residual)
    assert scope_count(p, "model", "falcon").total_params == library_total(fields)
    other = "parallel" if residual == "shared_norm" else "shared_norm"
    block = scope_count(p, "block", "falcon").unidentified
    assert scope_count(replace(p, model=replace(p.model, residual=other)), "block", "falcon").unidentified != block
    if not changes:  # Falcon-7B as released (its safetensors: 6,921,720,704)
        assert scope_count(p, "model", "falcon").total_params == 6_921_720_704
    key, _ = structure_audit(p, "block", "falcon")  # `attnid audit --config --block` audits the file's own wiring
    assert ("residual", residual) in key[2]


@pytest.mark.parametrize(
    "changes,named",
    [
        ({"new_decoder_architecture": True, "parallel_attn": False}, "builds no such layer"),
        ({"num_ln_in_parallel_attn": 2}, "builds no such layer"),  # two LayerNorms made, one read
        ({"new_decoder_architecture": True, "num_ln_in_parallel_attn": 3}, "builds no such layer"),
        ({"activation": "relu"}, "activation: 'relu' is not modelled for falcon"),
    ],
)
def test_a_falcon_layer_its_code_cannot_build_is_refused_by_name(tmp_path, changes, named):
    (tmp_path / "config.json").write_text(json.dumps(dict(FALCON, **changes)))
    with pytest.raises(ConfigError, match=named):
        config_preset(tmp_path / "config.json")


def test_falcon_rw_counts_its_alibi_attention_and_says_why_its_layer_is_not(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(FALCON, alibi=True, parallel_attn=False, bias=True)))
    p = config_preset(tmp_path / "config.json")
    assert p.hf_type is None and not p.config.rope and p.model is None
    with pytest.raises(ValueError, match="ALiBi"):
        scope_count(p, "block", "falcon-rw")


def test_a_falcon_layer_is_audited_with_its_wiring_and_refuses_another_closed_form():
    """Planted: the audit of Falcon 2's layer (one LayerNorm before attention and MLP, the new architecture's groups)
    read against the closed form of a LayerNorm each: the difference is named."""
    from attnid.counting import count_block
    from attnid.families import block_config, equivalent_config
    from attnid.hf import HFAuditError, audit_hf, check_hf_audit

    r = audit_hf("falcon", scope="block", embed=8, heads=4, groups=2, residual="shared_norm", ffn=16)
    assert r.unidentified == r.details["theory_unidentified"] and r.details["residual"] == "shared_norm"
    cfg = equivalent_config("falcon", embed=8, heads=4, groups=2)
    two_norms = count_block(block_config("falcon", cfg, 16, residual="parallel")).unidentified
    assert two_norms != r.unidentified
    r.details["theory_unidentified"] = two_norms
    with pytest.raises(HFAuditError, match="closed form"):
        check_hf_audit(r)
    with pytest.raises(ValueError, match="sequential layer shares keys and values across every head"):
        audit_hf("falcon", scope="block", embed=8, heads=4, groups=2, residual="sequential")
    with pytest.raises(ValueError, match="the attention module has no residual wiring"):
        audit_hf("falcon", embed=8, heads=2, residual="parallel")
    with pytest.raises(ValueError, match="llama's layers are wired 'sequential', not 'parallel'"):
        audit_hf("llama", scope="block", embed=8, heads=2, residual="parallel")


ARCEE = {  # an AFM-4.5B-like file: Llama's attention and norms, a ReLU² MLP of two maps without biases
    "model_type": "arcee", "hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 20,
    "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 18432, "hidden_act": "relu2",
    "vocab_size": 128004, "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
}  # fmt: skip


def test_arcee_counts_its_relu2_units_as_relus_and_has_transformers_total(tmp_path):
    """ReLU² is positively homogeneous, relu(c z)² = c² relu(z)²: each unit's up row trades with its down column as a
    ReLU's does (F directions); the whole model's total is transformers' own; an MLP with biases refuses the block."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(ARCEE))
    p = config_preset(path)
    assert scope_count(p, "block", "arcee").unidentified_by_block["mlp_rescaling"] == 18432
    assert scope_count(p, "model", "arcee").total_params == library_total(ARCEE)
    path.write_text(json.dumps({**ARCEE, "mlp_bias": True}))
    with pytest.raises(ValueError, match="mlp_bias"):
        scope_count(config_preset(path), "block", "arcee")
    path.write_text(json.dumps({**ARCEE, "hidden_act": "gelu"}))
    with pytest.raises(ConfigError, match="hidden_act"):
        config_preset(path)


def test_chapter_9s_family_facts_are_the_tables_numbers():
    """The numbers chapter 9 glues beside its table of family files: Apertus-8B's total is transformers' own."""
    pytest.importorskip("pandas")
    from attnid.chapters import released as rel

    facts = rel.families_facts(rel.families_table())
    fields = json.loads((FAMILIES / "apertus-8b.json").read_text())
    fields.pop(SOURCE_KEY)
    assert facts["apertus_total"] == library_total(fields) == 8_053_338_176
    assert 0 < facts["glm_air_share"] < 0.01 and 0 < facts["ernie_share"] < 0.01


@pytest.mark.parametrize("outer, inner", [(None, None), (False, None), (True, False), (False, True)])
def test_a_gemma_3_file_is_tied_as_its_multimodal_class_ties(tmp_path, outer, inner):
    """transformers 5.24 ties Gemma 3's head by the multimodal class's field (default true), whatever text_config says:
    given beside text_config it decides (an inner one is read by no code, and said so); left out, its default decides
    unless text_config says otherwise, which is refused by name. Each count is transformers' own total."""
    fields = json.loads((CONFIG_DIR / "gemma-3-12b.json").read_text())
    fields.pop(SOURCE_KEY, None)
    text = {k: v for k, v in fields["text_config"].items() if k != "tie_word_embeddings"}
    if inner is not None:
        text["tie_word_embeddings"] = inner
    file = {k: v for k, v in fields.items() if k != "tie_word_embeddings"} | {"text_config": text}
    if outer is not None:
        file["tie_word_embeddings"] = outer
    (tmp_path / "config.json").write_text(json.dumps(file))
    if outer is None and inner is False:
        with pytest.raises(ConfigError, match="refuses to choose"):
            config_preset(tmp_path)
        return
    p = config_preset(tmp_path)
    assert p.model.tied == (True if outer is None else outer)
    assert scope_count(p, "model", "gemma3").total_params == library_total(file)
