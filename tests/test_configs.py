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
        ("llama-2-7b", {"hidden_act": "relu"}, "hidden_act"),
        ("llama-2-7b", {"rms_norm_eps": 0.0}, "rms_norm_eps = 0.0"),
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
        ("phi-2", {"qk_layernorm": True}, "qk_layernorm = True"),
        ("opt-6.7b", {"word_embed_proj_dim": 512}, "word_embed_proj_dim"),
        ("deepseek-v3", {"scoring_func": "softmax"}, "scoring_func = 'softmax'"),
        ("deepseek-v3", {"num_experts_per_tok": 1}, "num_experts_per_tok"),
        ("bert-base", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ("gemma-2-9b", {"use_bidirectional_attention": True}, "use_bidirectional_attention = True"),
        ("llama-2-7b", {"model_type": "rwkv"}, "model_type 'rwkv' is not a family attnid knows; it knows gpt2"),
        ("llama-2-7b", {"model_type": "jamba"}, "model_type 'jamba': its Mamba-1 mixers"),
        ("llama-2-7b", {"model_type": "mamba2"}, "it has no attention layer; chapter 9 counts a Mamba-2 mixer"),
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


@pytest.mark.parametrize(
    ("base", "fields"),
    [
        ("llama-3-8b", {"unsloth_fixed": True}),  # an unsloth re-upload's mark
        ("llama-3-8b", {"is_llama_config": True, "rope_interleaved": False}),  # SmolLM2
        ("llama-3-8b", {"transformers.js_config": {"dtype": "q4"}}),  # SmolLM2 1.7B
        (
            "phi-4-mini",
            {
                "attention_bias": False,
                "mlp_bias": False,
                "lm_head_bias": False,
                "full_attn_mod": 1,
                "interpolate_factor": 1,
            },
        ),  # Phi-4-mini, as served
        ("qwen2-7b", {"attention_bias": True}),  # Qwen2's code gives q, k, v biases whatever this says
    ],
)
def test_a_field_no_code_of_the_family_reads_is_accepted_and_said_so(tmp_path, base, fields):
    from attnid.configs import unread_reason

    p = config_preset(edited(tmp_path, base, **fields))
    q = config_preset(CONFIG_DIR / f"{base}.json")
    assert (p.config, p.model.layers, p.model.ffn) == (q.config, q.model.layers, q.model.ffn)
    for k in fields:
        assert p.reading["neutral"][k] == unread_reason(p.hf_type), k


def test_the_rule_reads_the_familys_code_a_plant_flips_it(tmp_path, monkeypatch):
    """mlp_bias is read by Llama's code (its MLP gets biases): refused. The same field planted as unread (the
    snapshot's list of fields the code reads without it) is accepted; a made-up field planted as read is refused."""
    from attnid import configs
    from attnid.library_configs import code_reads

    with pytest.raises(ValueError, match="mlp_bias = True"):
        scope_count(config_preset(edited(tmp_path, "llama-2-7b", mlp_bias=True)), "block", "llama")
    reads = code_reads("llama")
    assert "mlp_bias" in reads and "unsloth_fixed" not in reads
    monkeypatch.setattr(configs, "code_reads", lambda t: reads - {"mlp_bias"} | {"unsloth_fixed"})
    p = config_preset(edited(tmp_path, "llama-2-7b", mlp_bias=True))
    assert p.reading["neutral"]["mlp_bias"] and scope_count(p, "block", "llama").total_params > 0
    with pytest.raises(ConfigError, match="unsloth_fixed = True"):
        config_preset(edited(tmp_path, "llama-2-7b", unsloth_fixed=True))


def test_the_neutral_list_holds_only_fields_some_familys_code_reads():
    """A field no code reads needs no entry (it is accepted as unread); each entry is one the code reads."""
    from attnid.library_configs import snapshot

    read_somewhere = set().union(*(set(t["code_reads"]) for t in snapshot()["types"].values()))
    assert sorted(k for k in NEUTRAL if k not in read_somewhere) == []


@pytest.mark.parametrize(
    ("base", "fields", "named"),
    [
        ("llama-2-7b", {"mlp_bias": True}, "mlp_bias = True"),
        ("opt-6.7b", {"do_layer_norm_before": False}, "do_layer_norm_before = False"),
        ("gpt-neox-20b", {"use_parallel_residual": False}, "use_parallel_residual = False"),
    ],
)
def test_a_field_of_the_block_alone_refuses_the_block_and_the_model_not_the_attention(tmp_path, base, fields, named):
    p = config_preset(edited(tmp_path, base, **fields))
    assert scope_count(p, "attention", base) == scope_count(ALL_PRESETS[base], "attention", base)
    for scope in ("block", "model"):
        with pytest.raises(ValueError, match=named):
            scope_count(p, scope, base)
    r = run("count", "--config", edited(tmp_path, base, **fields), "--scope", "block")
    assert r.returncode == 2 and named in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("base", ["llama-2-7b", "mistral-7b", "qwen3-8b"])
def test_partial_rotary_factor_in_a_full_rope_family(tmp_path, base):
    """Below 1 with the default RoPE the family's own initialiser rotates every dimension (counted as full RoPE,
    and said); with a scaled RoPE the model cannot run (refused); a value outside (0, 1] is refused."""
    p = config_preset(edited(tmp_path, base, partial_rotary_factor=0.5))
    assert p.config == ALL_PRESETS[base].config and "default RoPE" in p.reading["neutral"]["partial_rotary_factor"]
    scaled = {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(ConfigError, match="the model does not run"):
        config_preset(edited(tmp_path, base, partial_rotary_factor=0.5, rope_scaling=scaled))
    for bad in (0, 1.5, "0.5", -0.25):
        with pytest.raises(ConfigError, match=r"must be a number in \(0, 1\]"):
            config_preset(edited(tmp_path, base, partial_rotary_factor=bad))


def test_which_families_rotate_part_of_a_head_is_what_their_code_does():
    """HFType.partial_rope names exactly the families whose own default initialiser reads partial_rotary_factor; a
    full-RoPE family's rotary embedding built with 0.5 still gives one frequency per pair of the whole head."""
    import importlib
    import inspect
    import warnings

    from attnid.families import HF_TYPES

    for name, t in HF_TYPES.items():
        if t.rotary is None:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = importlib.import_module(f"transformers.models.{t.module}.modeling_{t.module}")
        source = inspect.getsource(getattr(mod, t.rotary).compute_default_rope_parameters)
        assert ("partial_rotary_factor" in source) == t.partial_rope, name
    from transformers import GraniteConfig
    from transformers.models.granite.modeling_granite import GraniteRotaryEmbedding

    c = GraniteConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, partial_rotary_factor=0.5)
    assert GraniteRotaryEmbedding(c).inv_freq.numel() == 16 // 2


@pytest.mark.parametrize("moe_layers", [[0, 48], [-1], [3, 3], [0.5], "all"])
def test_llama4_moe_layers_must_name_layers_of_the_model(tmp_path, moe_layers):
    d = json.loads((CONFIG_DIR / "llama-4-scout.json").read_text())
    d["text_config"]["moe_layers"] = moe_layers
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="moe_layers"):
        config_preset(tmp_path)


def test_llama4_no_rope_layers_must_flag_every_layer(tmp_path):
    """One flag per layer: more (the layer kinds derived from them then outnumber the layers) or fewer (beside
    layer kinds given in full) are refused."""
    d = json.loads((CONFIG_DIR / "llama-4-scout.json").read_text())
    flags = d["text_config"]["no_rope_layers"]
    d["text_config"]["no_rope_layers"] = [*flags, 0, 0, 0]
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="layer_types"):
        config_preset(tmp_path)
    d["text_config"]["no_rope_layers"] = flags[:-1]
    d["text_config"]["layer_types"] = ["full_attention"] * len(flags)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=r"no_rope_layers: .* must give each of the 48 layers a flag"):
        config_preset(tmp_path)


@pytest.mark.parametrize(
    ("base", "change", "says"),
    [
        ("llama-2-7b", {"num_attention_heads": 0}, "num_attention_heads = 0, which the class divides by"),
        ("gemma-3-12b", {"text_config": None}, "describes its text model under text_config"),
        ("llama-4-scout", {"text_config": "x"}, "describes its text model under text_config"),
    ],
)
def test_a_config_that_divides_by_zero_or_lacks_its_text_model_is_one_line(tmp_path, base, change, says):
    d = json.loads((CONFIG_DIR / f"{base}.json").read_text())
    d.update(change)
    if change.get("text_config", 1) is None:
        del d["text_config"]
    (tmp_path / "config.json").write_text(json.dumps(d))
    r = run("count", "--config", str(tmp_path))
    assert r.returncode == 2 and says in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_file_too_large_for_a_config_is_refused_unread(tmp_path):
    from attnid.configs import MAX_CONFIG_BYTES

    big = tmp_path / "config.json"
    with big.open("wb") as f:  # sparse: no byte of it is written, and none is read
        f.truncate(MAX_CONFIG_BYTES + 1)
    r = run("count", "--config", str(big))
    assert r.returncode == 2 and "more than a model's config.json" in r.stderr and r.stderr.count("\n") == 1


def test_a_memory_error_without_text_says_out_of_memory(monkeypatch, capsys):
    from attnid import cli

    def no_memory(a):
        raise MemoryError()

    monkeypatch.setattr("attnid.cli.count.count_parser", _parser_with(no_memory))
    assert cli.main(["count", "--preset", "gpt2"]) == 1
    assert capsys.readouterr().err == "attnid: error: out of memory\n"


def _parser_with(func):
    from attnid.cli import count as count_cli

    real = count_cli.count_parser

    def parser(sub):
        real(sub)
        sub.choices["count"].set_defaults(func=func)

    return parser


SEED_OSS_36B = {  # ByteDance Seed-OSS-36B's architecture (its model card and config), transcribed field by field
    "architectures": ["SeedOssForCausalLM"], "model_type": "seed_oss", "hidden_size": 5120, "num_hidden_layers": 64,
    "intermediate_size": 27648, "num_attention_heads": 80, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-06, "vocab_size": 155136, "rope_theta": 10000000.0, "rope_scaling": {"rope_type": "default"},
    "max_position_embeddings": 524288, "tie_word_embeddings": False, "attention_bias": True,
    "attention_out_bias": False, "attention_dropout": 0.1, "residual_dropout": 0.1,
}  # fmt: skip


def test_seed_oss_is_counted_with_its_biases_switched_apart(tmp_path):
    """Seed-OSS, a model_type of its own: Llama's block with q/k/v biases (attention_bias) and an output bias
    (attention_out_bias); its whole model is the published 36.15B."""
    (tmp_path / "config.json").write_text(json.dumps(SEED_OSS_36B))
    p = config_preset(tmp_path)
    assert p.config.bias == "qkv" and {"attention_bias", "attention_out_bias"} <= set(p.reading["read"])
    assert scope_count(p, "model", "seed-oss").total_params == 36_151_104_512
    (tmp_path / "config.json").write_text(json.dumps({**SEED_OSS_36B, "attention_out_bias": True}))
    assert config_preset(tmp_path).config.bias == "qkvo"


ERNIE_45_03B = {  # Baidu ERNIE-4.5-0.3B's architecture (its model card and config), transcribed field by field
    "architectures": ["Ernie4_5ForCausalLM"], "model_type": "ernie4_5", "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 18, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 128, "vocab_size": 103424, "tie_word_embeddings": True, "rope_theta": 500000.0, "use_bias": False,
    "rms_norm_eps": 1e-05, "max_position_embeddings": 131072,
}  # fmt: skip


def test_ernie45_is_counted_and_its_use_bias_refuses_the_block_not_the_attention(tmp_path):
    """ERNIE 4.5 (dense), a model_type of its own: Llama's block with interleaved rotary pairs (the same count) and
    tied embeddings; the published 0.36B. use_bias puts biases on the gated MLP too: the block is refused by name."""
    (tmp_path / "config.json").write_text(json.dumps(ERNIE_45_03B))
    assert scope_count(config_preset(tmp_path), "model", "ernie").total_params == 360_748_032
    (tmp_path / "config.json").write_text(json.dumps({**ERNIE_45_03B, "use_bias": True}))
    p = config_preset(tmp_path)
    assert p.config.bias == "qkvo" and scope_count(p, "attention", "ernie").unidentified > 0
    with pytest.raises(ValueError, match="use_bias = True"):
        scope_count(p, "block", "ernie")


def test_falcon_with_alibi_is_counted_as_a_layer_without_a_position_map(tmp_path):
    """Falcon RW's ALiBi (alibi = true) is BLOOM's fixed bias on the scores: its attention counts as a layer without
    a position map (the whole GL(D) gauge of each head), not as a RoPE layer (tests/test_families.py checks BLOOM's
    real module)."""
    from attnid.counting import count

    rope = config_preset(CONFIG_DIR / "falcon-7b.json").config
    alibi = config_preset(edited(tmp_path, "falcon-7b", alibi=True)).config
    assert rope.rope and not alibi.rope and alibi == rope.with_(rope=False)
    assert count(alibi).unidentified > count(rope).unidentified
