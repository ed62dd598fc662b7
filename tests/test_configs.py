"""`attnid count --config` / `audit --config`: a model's config.json read through transformers' own config
classes, equal to the presets it ships for, and refusing what attnid does not model by name."""

import json

import pytest

pytest.importorskip("transformers")

from test_cli import run

from attnid.configs import CONFIG_DIR, NEUTRAL, ConfigError, config_preset
from attnid.counting import SCOPES
from attnid.hf import structure_audit
from attnid.presets import ALL_PRESETS, scope_count

SHIPPED = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def edited(tmp_path, base: str, **fields) -> str:
    """A copy of shipped config ``base`` with ``fields`` set, as a folder holding config.json."""
    d = json.loads((CONFIG_DIR / f"{base}.json").read_text())
    d.update(fields)
    (tmp_path / "config.json").write_text(json.dumps(d))
    return str(tmp_path)


def test_every_preset_ships_its_config_and_no_config_lacks_a_preset():
    assert sorted(ALL_PRESETS) == SHIPPED
    for name in SHIPPED:
        note = json.loads((CONFIG_DIR / f"{name}.json").read_text())["_attnid"]
        assert note["source"].startswith("https://") and note["note"]


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_config_reads_to_its_preset_at_every_scope(name):
    p, q = config_preset(CONFIG_DIR / f"{name}.json"), ALL_PRESETS[name]
    assert p.config == q.config and p.hf_type == q.hf_type
    assert (p.model is None) == (q.model is None)
    if q.model is not None:
        assert p.model.source.startswith(q.model.source)
        assert {**vars(p.model), "source": ""} == {**vars(q.model), "source": ""}
    for scope in SCOPES if q.model is not None and q.hf_type is not None else ("attention",):
        assert scope_count(p, scope, name) == scope_count(q, scope, name)


@pytest.mark.parametrize("scope", SCOPES)
def test_count_config_prints_what_count_preset_prints(scope):
    for name in ("llama-3-8b", "gpt2", "deepseek-v3", "qwen3-8b"):
        a = run("count", "--config", str(CONFIG_DIR / f"{name}.json"), "--scope", scope, "--json")
        b = run("count", "--preset", name, "--scope", scope, "--json")
        assert a.returncode == b.returncode == 0, a.stderr
        ja, jb = json.loads(a.stdout), json.loads(b.stdout)
        assert set(ja.pop("config_fields")) == {"read", "at_default", "neutral", "fixed", "defaults", "truth_values"}
        assert ja.pop("source") == {"path": str(CONFIG_DIR / f"{name}.json"), "repo": None, "revision": None,
                                    "commit": None}  # fmt: skip
        if ja.get("model"):
            assert ja["model"].pop("source").startswith(jb["model"].pop("source"))
        assert ja == jb


def test_a_field_left_out_takes_the_librarys_default(tmp_path):
    from transformers import LlamaConfig

    lib = LlamaConfig()
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4})
    )
    p = config_preset(tmp_path)
    assert (p.model.ffn, p.model.layers, p.model.vocab) == (lib.intermediate_size, lib.num_hidden_layers,
                                                            lib.vocab_size)  # fmt: skip
    assert p.config.G == 4 and p.config.D == 16 and p.config.rope and not p.config.bias


@pytest.mark.parametrize(
    "base, fields, named",
    [
        ("llama-2-7b", {"mlp_bias": True}, "mlp_bias = True"),
        ("llama-2-7b", {"hidden_act": "relu"}, "hidden_act"),
        ("llama-2-7b", {"rms_norm_eps": 0.0}, "rms_norm_eps = 0.0"),
        ("llama-2-7b", {"my_attention": "linear"}, "my_attention = 'linear' (a field unknown here)"),
        (
            "llama-2-7b",
            {"rope_scaling": {"rope_type": "su", "factor": 2.0, "original_max_position_embeddings": 2048}},
            "rope_type 'su'",
        ),
        (  # planted: the second pair's factor brings its frequency onto the first's
            "llama-2-7b",
            {
                "rope_scaling": {
                    "rope_type": "longrope",
                    "factor": 2.0,
                    "short_factor": [1.0] * 64,
                    "long_factor": [1.0, 10000.0 ** (-2 / 128)] + [1.0] * 62,
                    "original_max_position_embeddings": 2048,
                }
            },
            "long_factor of longrope RoPE makes two pairs rotate at one frequency",
        ),
        ("llama-2-7b", {"num_attention_heads": 33}, "not a multiple"),
        ("pythia-6.9b", {"use_parallel_residual": False}, "use_parallel_residual = False"),
        ("phi-2", {"qk_layernorm": True}, "qk_layernorm = True"),
        ("opt-6.7b", {"do_layer_norm_before": False}, "do_layer_norm_before = False"),
        ("opt-6.7b", {"word_embed_proj_dim": 512}, "word_embed_proj_dim"),
        ("qwen2-7b", {"attention_bias": True}, "attention_bias = True (a field unknown here)"),
        ("falcon-7b", {"alibi": True}, "alibi"),
        ("deepseek-v3", {"scoring_func": "softmax"}, "scoring_func = 'softmax'"),
        ("deepseek-v3", {"num_experts_per_tok": 1}, "num_experts_per_tok"),
        ("bert-base", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ("gemma-2-9b", {"use_bidirectional_attention": True}, "use_bidirectional_attention = True"),
        ("llama-2-7b", {"model_type": "mamba"}, "model_type 'mamba' is not a family attnid knows; it knows gpt2"),
    ],
)
def test_what_attnid_does_not_model_is_refused_by_name_in_one_line(tmp_path, base, fields, named):
    path = edited(tmp_path, base, **fields)
    with pytest.raises(ConfigError) as e:
        config_preset(path)
    assert named in str(e.value)
    r = run("count", "--config", path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and named in r.stderr


def test_a_modelled_change_changes_the_count(tmp_path):
    """The fields attnid reads are not ignored either: biases, groups and sizes move the count."""
    base = config_preset(CONFIG_DIR / "llama-2-7b.json")
    for fields in ({"attention_bias": True}, {"num_key_value_heads": 8}, {"head_dim": 64},
                   {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}):  # fmt: skip
        p = config_preset(edited(tmp_path, "llama-2-7b", **fields))
        changed = scope_count(p, "model", "x") != scope_count(base, "model", "x")
        assert changed != ("rope_scaling" in fields), fields  # a rescaled RoPE keeps distinct frequencies


def test_neutral_fields_each_say_why():
    assert all(len(why) > 20 for why in NEUTRAL.values())


def test_audit_config_is_the_audit_of_its_presets_structure():
    """`audit --config` of a shipped config runs the very audit `presets --verify` runs for its preset (equal
    keys; the preset audits are tests of their own), and one runs end to end."""
    for name in SHIPPED:
        p, q = config_preset(CONFIG_DIR / f"{name}.json"), ALL_PRESETS[name]
        if q.hf_type is None:
            with pytest.raises(ValueError, match="builds no transformers module"):
                structure_audit(p, "attention", name)
            continue
        for scope in ("attention", "block") if q.model is not None else ("attention",):
            assert structure_audit(p, scope, name)[0] == structure_audit(q, scope, name)[0]
    r = run("audit", "--config", str(CONFIG_DIR / "qwen3-8b.json"), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["hf_type"] == "qwen3" and out["unidentified"] == out["details"]["theory_unidentified"]
