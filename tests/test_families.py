"""The families that are known ones in new clothes (OLMo 3, ...): each released file (``tests/families``, its source
named in the file) is counted at every scope, every field accounted for, and its whole model's total equals the
parameters of transformers' own model built from the same file (on the meta device: no weights are made)."""

import copy
import json
import logging
import warnings
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch
import transformers

from attnid.configs import SOURCE_KEY, ConfigError, config_preset
from attnid.counting import SCOPES
from attnid.presets import scope_count

FAMILIES = Path(__file__).with_name("families")
FILES = sorted(FAMILIES.glob("*.json"))


def library_total(fields: dict) -> int:
    """The parameters of transformers' causal LM for ``fields``."""
    fields = {k: v for k, v in copy.deepcopy(fields).items() if k != SOURCE_KEY}
    model_type = fields.pop("model_type")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("transformers").setLevel(logging.ERROR)
        config = transformers.AutoConfig.for_model(model_type, **fields)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_every_file_names_its_release():
    assert [p.stem for p in FILES] == ["command-r7b-12-2024", "exaone-4.0-32b", "internlm3-8b-instruct", "olmo-3-7b"]
    for path in FILES:
        note = json.loads(path.read_text())[SOURCE_KEY]
        assert note["source"].startswith("https://huggingface.co/") and note["note"], path.name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_family_file_is_counted_at_every_scope_with_transformers_total(path):
    p = config_preset(path)
    counts = {scope: scope_count(p, scope, path.stem) for scope in SCOPES}
    for c in counts.values():
        assert 0 < c.unidentified < c.total_params
    fields = json.loads(path.read_text())
    fields.pop(SOURCE_KEY)
    r = p.reading
    assert set(fields) == set(r["read"]) | set(r["neutral"]) | set(r["fixed"]) | set(r["at_default"])
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
    (the two counts differ by V E); with the outer field set, the text model is counted, its total that of the
    model transformers builds; a text model of another type is refused by name."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MISTRAL_SMALL_3_1))
    with pytest.raises(ConfigError, match=r"by its class's default .* refuses to choose"):
        config_preset(path)
    path.write_text(json.dumps({**MISTRAL_SMALL_3_1, "tie_word_embeddings": False}))
    p = config_preset(path)
    assert p.hf_type == "mistral" and "vision tower is not counted" in p.description
    text = {**MISTRAL_SMALL_3_1["text_config"], "tie_word_embeddings": False}
    assert scope_count(p, "model", "mistral-small").total_params == library_total(text)
    path.write_text(json.dumps({**MISTRAL_SMALL_3_1, "tie_word_embeddings": True}))
    with pytest.raises(ConfigError, match="refuses to choose"):
        config_preset(path)
    other = {**MISTRAL_SMALL_3_1, "tie_word_embeddings": False,
             "text_config": {**MISTRAL_SMALL_3_1["text_config"], "model_type": "ministral3"}}  # fmt: skip
    path.write_text(json.dumps(other))
    with pytest.raises(ConfigError, match="'ministral3' is not one attnid reads inside mistral3"):
        config_preset(path)
