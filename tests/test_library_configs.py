"""A config file read without transformers (:mod:`attnid.library_configs`) reads as transformers' own config classes
read it: the snapshot equals the installed library, and on every shipped and released file, each with every one of
its fields left out in turn and with planted values, the fields and the count (or the refusal) are the same."""

import copy
import json
import logging
import warnings

import pytest

pytest.importorskip("transformers")

import transformers
from booktool import ROOT, tool

from attnid import configs
from attnid.config_multimodal import FLAT_TEXT_MODELS, TEXT_MODELS, _text_fields, flat_text_config
from attnid.configs import CONFIG_DIR, ConfigError, _truth_values, config_preset, read_config
from attnid.library_configs import LibraryConfigError, default_dict, library_config

FILES = sorted([*CONFIG_DIR.glob("*.json"), *(CONFIG_DIR / "released").glob("*.json")])
FILES = [p for p in FILES if p.name != "SOURCES.json"]
# the families' released files (tests/test_families.py)
FILES += sorted((ROOT / "data" / "configs" / "families").glob("*.json"))
UNCOMPARED = ("dtype", "transformers_version", "_name_or_path")  # a torch dtype object there, a version, a path


def _library(model_type: str, fields: dict):
    """transformers' own config object, as attnid read it before the snapshot."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("transformers").setLevel(logging.ERROR)
        try:
            return transformers.AutoConfig.for_model(model_type, **copy.deepcopy(fields))
        except Exception as e:
            raise ConfigError(f"config: transformers refuses this {model_type} config: {e.__cause__ or e}") from None


def through_transformers(monkeypatch, path):
    """``config_preset(path)`` with transformers' own classes in place of the snapshot: a Preset or the refusal."""
    with monkeypatch.context() as m:
        m.setattr(
            configs, "_library_config", lambda t, f: _library(t, {k: v for k, v in f.items() if k != "model_type"})
        )
        m.setattr(configs, "default_dict", lambda t: transformers.CONFIG_MAPPING[t]().to_dict())
        return outcome(path)


def outcome(path):
    try:
        return config_preset(path)
    except ConfigError as e:
        return ConfigError(str(e))


def same(a, b) -> bool:
    """Two outcomes agree: equal presets (their readings included), or two refusals (the same sentence unless it is
    the library's own refusal, worded by each)."""
    if isinstance(a, ConfigError) or isinstance(b, ConfigError):
        both = isinstance(a, ConfigError) and isinstance(b, ConfigError)
        return both and (("refuses this" in str(a) and "refuses this" in str(b)) or str(a) == str(b))
    ra, rb = dict(a.reading), dict(b.reading)
    for r in (ra, rb):  # the library's version among the defaults taken differs by construction
        r["defaults"] = {k: v for k, v in r["defaults"].items() if k not in UNCOMPARED}
    return (a.config, a.model, a.description, a.attention_only, ra) == (b.config, b.model, b.description,
                                                                         b.attention_only, rb)  # fmt: skip


def fields_of(path) -> tuple[str, dict]:
    fields, _ = read_config(path)
    model_type = fields["model_type"]
    if model_type in TEXT_MODELS and model_type in FLAT_TEXT_MODELS and "text_config" not in fields:
        fields = flat_text_config(fields, model_type)  # gathered as the multimodal class gathers them
    if model_type in TEXT_MODELS and isinstance(fields.get("text_config"), dict):
        fields = _text_fields(fields, model_type)
        model_type = fields["model_type"]
    fields, _ = _truth_values(fields)
    fields.pop("auto_map", None)
    return model_type, fields


def test_the_snapshot_is_the_installed_transformers(capsys):
    """tools/snapshot_library_configs.py --check, in this process (transformers is imported here already)."""
    code = tool("snapshot_library_configs").main(["--check"])
    assert code == 0, capsys.readouterr().out


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem if p.parent == CONFIG_DIR else f"{p.parent.name}/{p.stem}")
def test_every_field_left_out_in_turn_reads_as_transformers_reads_it(path):
    """The file, and the file with each field removed (its default, or what the class derives, in its place): the
    fields transformers' class holds, and the whole reading, agree."""
    model_type, fields = fields_of(path)
    cls = transformers.CONFIG_MAPPING[model_type]
    for left_out in [None, *fields]:
        f = {k: v for k, v in fields.items() if k != left_out}
        try:
            light = library_config(model_type, f).to_dict()
        except LibraryConfigError:
            light = "refused"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                real = cls(**copy.deepcopy({k: v for k, v in f.items() if k != "model_type"})).to_dict()
        except Exception:
            real = "refused"
        if "refused" in (light, real):
            assert light == real, (left_out, light if light == "refused" else real)
            continue
        for d in (light, real):
            for k in UNCOMPARED:
                d.pop(k, None)
        assert light == real, left_out


@pytest.mark.parametrize(
    ("base", "change"),
    [
        ("llama-2-7b", {"hidden_size": "4096"}),  # a string where an int goes
        ("llama-2-7b", {"rms_norm_eps": 1}),  # an int where a float goes (strict)
        ("llama-2-7b", {"tie_word_embeddings": 1}),
        ("llama-2-7b", {"num_attention_heads": 7}),  # not a divisor of the width (Llama's validator)
        ("llama-2-7b", {"rope_scaling": {"type": "linear", "factor": 2.0}}),  # the old key of the RoPE type
        ("llama-3-8b", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}),  # the pretraining length moved in
        ("gemma-3-12b", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}),  # into the full layers' RoPE
        ("phi-4-mini", {"rope_scaling": None, "partial_rotary_factor": 0.5}),
        ("qwen2-7b", {"use_sliding_window": True, "max_window_layers": 3}),  # windows from layer 3 on
        ("smollm3-3b", {"no_rope_layer_interval": 3, "no_rope_layers": None}),
        ("gpt-neox-20b", {"rotary_pct": 0.5, "rotary_emb_base": 20000}),
        ("gpt2", {"n_embd": 1024, "n_head": 16}),  # through the attribute map
        ("qwen3-30b-a3b", {"num_experts": 64}),  # an attribute-mapped name that is also declared
        ("mistral-7b", {"layer_types": ["full_attention"] * 31}),  # one per layer, or refused
    ],
)
def test_planted_values_read_as_transformers_reads_them(tmp_path, monkeypatch, base, change):
    d = json.loads((CONFIG_DIR / f"{base}.json").read_text())
    target = d.get("text_config", d)
    target.update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    a, b = outcome(path), through_transformers(monkeypatch, path)
    assert same(a, b), (a, b)


def test_a_planted_difference_is_caught(tmp_path, monkeypatch):
    """The comparison can fail: a Llama class that filled in 8 key/value groups where a file leaves them out (the
    library fills in one per head) reads such a file differently from the library."""
    d = json.loads((CONFIG_DIR / "llama-2-7b.json").read_text())
    d.pop("num_key_value_heads", None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    assert same(outcome(path), through_transformers(monkeypatch, path))
    real_post_init = configs.library_config.__globals__["POST_INIT"]["llama"]
    monkeypatch.setitem(configs.library_config.__globals__["POST_INIT"], "llama",
                        lambda c, kw: (real_post_init(c, kw), setattr(c, "num_key_value_heads", 8)))  # fmt: skip
    assert not same(outcome(path), through_transformers(monkeypatch, path))


def test_the_default_instance_is_the_snapshots():
    for model_type in ("llama", "gemma3_text", "qwen3_moe", "gpt2"):
        real = transformers.CONFIG_MAPPING[model_type]().to_dict()
        assert {k: v for k, v in default_dict(model_type).items() if k not in UNCOMPARED} == {
            k: v for k, v in real.items() if k not in UNCOMPARED
        }


def test_a_classifiers_labels_from_a_file_cost_nothing_and_bad_ids_are_one_line(tmp_path):
    """num_labels is a classification head's (neutral): a huge one makes no huge table; id2label keys that are not
    ids are refused as the library refuses them."""
    d = json.loads((CONFIG_DIR / "llama-2-7b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**d, "num_labels": 10**12}))
    assert config_preset(tmp_path).reading["neutral"]["num_labels"]
    (tmp_path / "config.json").write_text(json.dumps({**d, "id2label": {"x": "a"}}))
    with pytest.raises(ConfigError, match="id2label: its keys must be label ids"):
        config_preset(tmp_path)
