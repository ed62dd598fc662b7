"""Trained transformers checkpoints (attnid.checkpoints, `attnid audit --checkpoint`): a save_pretrained folder
audited at its weights, against the generic count on the inputs it really sees."""

import json
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from attnid.checkpoints import audit_checkpoint, generic_count_on, input_deficiency
from attnid.cli import main
from attnid.configs import ConfigError
from attnid.counting import biased_reader_rows, collapsed_query_dims, count
from attnid.families import equivalent_config
from attnid.hf import HFAuditError, build_model

E, H, D = 16, 2, 8


def save(model, d):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(d)
    return d


def tiny(hf_type: str, **kw):
    """A 2-layer ``hf_type`` LM with seeded random weights (norm weights and shifts away from 1 and 0)."""
    cfg = equivalent_config(hf_type, embed=E, heads=H, **kw)
    model, _ = build_model(hf_type, cfg, ffn=24, layers=2, vocab=64, tied=False, seq_len=64, seed=1)
    return cfg, model


def collapse_gpt2_query(model, layer: int, rank: int) -> None:
    """Head 0's augmented query map ``[W_Q | b_Q]`` of ``layer`` cut to ``rank`` (0: removed)."""
    a = model.transformer.h[layer].attn
    with torch.no_grad():
        Wb = torch.cat([a.c_attn.weight[:, :D], a.c_attn.bias[None, :D]], 0)  # (E + 1, D): GPT-2's Conv1D layout
        U, s, Vh = torch.linalg.svd(Wb, full_matrices=False)
        cut = U[:, :rank] @ torch.diag(s[:rank]) @ Vh[:rank]
        a.c_attn.weight[:, :D] = cut[:E]
        a.c_attn.bias[:D] = cut[E]


def test_a_random_gpt2_checkpoint_is_generic_and_a_collapsed_head_adds_the_closed_form(tmp_path):
    cfg, model = tiny("gpt2")
    rows = audit_checkpoint(save(model, tmp_path / "generic"))
    generic = count(cfg).unidentified + biased_reader_rows(cfg)  # a LayerNorm's hyperplane: one per biased row
    assert [(r["layer"], r["unidentified"], r["generic"], r["at_generic"]) for r in rows] == [
        (1, generic, generic, True),
        (2, generic, generic, True),
    ]  # layers numbered from 1, as every table and flag numbers them
    assert all(r["hyperplane"] and r["gap"] > 1e6 and 0 < r["weakest"] < 1 for r in rows)
    for rank in (0, 1):  # the verdict flips, by exactly the closed form's extra directions
        _, model = tiny("gpt2")
        collapse_gpt2_query(model, 1, rank)  # the second layer (index 1)
        (row,) = audit_checkpoint(save(model, tmp_path / f"rank{rank}"), layers=[2])
        extra = collapsed_query_dims(cfg, rank, hyperplane_inputs=True)
        assert (row["unidentified"], row["at_generic"]) == (generic + extra, False), rank
        assert row["gap"] > 1e6


def test_a_rope_head_without_its_query_map_adds_its_whole_key_map(tmp_path):
    """Qwen2 (RoPE, biased q, k, v; RMSNorm: no hyperplane), head 0 of layer 2 with W_Q = 0 and b_Q = 0: its
    scores vanish, so its key map and bias, D (E + 1) directions, are unidentified, where a generic RoPE head
    leaves D (its commutant) and identifies the key bias: D E more. The no-RoPE closed form, (D − 0)(E − D), does
    not apply, and collapsed_query_dims refuses RoPE rather than give it."""
    cfg, model = tiny("qwen2")
    a = model.model.layers[1].self_attn
    with torch.no_grad():
        a.q_proj.weight[:D] = 0
        a.q_proj.bias[:D] = 0
    (row,) = audit_checkpoint(save(model, tmp_path), layers=[2])
    assert row["unidentified"] - row["generic"] == D * E and not row["hyperplane"] and row["gap"] > 1e6
    with pytest.raises(ValueError, match="without RoPE"):
        collapsed_query_dims(cfg, 0, hyperplane_inputs=False)


def test_a_llama_checkpoint_with_grouped_keys_reads_on_unconstrained_inputs(tmp_path):
    cfg, model = tiny("llama", groups=1)
    (row,) = audit_checkpoint(save(model, tmp_path), layers=[2])
    assert (row["unidentified"], row["generic"], row["hyperplane"]) == (72, count(cfg).unidentified, False)
    assert row["gap"] > 1e6


def test_the_inputs_span_is_read_off_the_tokens():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 6, generator=g, dtype=torch.float64)
    assert input_deficiency(x) == (0, 0)
    w = torch.randn(6, generator=g, dtype=torch.float64)
    on_plane = x - ((x @ w - 3.0) / (w @ w))[:, None] * w  # w·x = 3 for every token
    assert input_deficiency(on_plane) == (0, 1)
    through_origin = x - ((x @ w) / (w @ w))[:, None] * w
    assert input_deficiency(through_origin) == (1, 1)
    cfg = equivalent_config("gpt2", embed=6, heads=2)
    assert generic_count_on(cfg, x) == (count(cfg).unidentified, False)
    assert generic_count_on(cfg, on_plane) == (count(cfg).unidentified + biased_reader_rows(cfg), True)
    with pytest.raises(HFAuditError, match="span only 5 of 6"):
        generic_count_on(cfg, through_origin)
    x8 = torch.randn(200, 8, generator=g, dtype=torch.float64)
    w8 = torch.randn(8, generator=g, dtype=torch.float64)
    with pytest.raises(HFAuditError, match="no bias"):  # Llama's readers have no bias to take the constant back
        generic_count_on(equivalent_config("llama", embed=8, heads=2), x8 - ((x8 @ w8 - 3.0) / (w8 @ w8))[:, None] * w8)


def test_a_layernorm_without_shift_is_refused_not_miscounted(tmp_path):
    _, model = tiny("gpt2")
    with torch.no_grad():
        model.transformer.h[0].ln_1.bias.zero_()  # its inputs now lie on a hyperplane through the origin
    with pytest.raises(HFAuditError, match="span only 15 of 16") as refused:
        audit_checkpoint(save(model, tmp_path), layers=[1])
    assert "the cause: layer 1's input norm (transformer.h.0.ln_1) has a shift of zero" in str(refused.value)
    assert "untrained" in str(refused.value)


def test_a_folder_that_is_no_checkpoint_of_a_known_family_is_refused(tmp_path):
    _, model = tiny("llama")
    d = save(model, tmp_path / "ok")
    for bad in (0, 3):
        with pytest.raises(ValueError, match="layer must be an integer from 1 to 2"):
            audit_checkpoint(d, layers=[bad])
    with pytest.raises(ConfigError, match="not a folder"):
        audit_checkpoint(d / "config.json")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((d / "config.json").read_text())
    with pytest.raises(ConfigError, match="holds no weights"):
        audit_checkpoint(bare)
    (bare / "model.safetensors").write_bytes(b"not a weight file")
    with pytest.raises(ConfigError, match="cannot load"):
        audit_checkpoint(bare)
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 16, "num_attention_heads": 2}))
    (bert / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"audits trained checkpoints of gpt2.*this one is bert"):
        audit_checkpoint(bert)


def test_cli_audits_a_checkpoint_and_refuses_the_flags_it_fixes(tmp_path, capsys):
    _, model = tiny("gpt2")
    d = str(save(model, tmp_path))
    assert main(["audit", "--checkpoint", d, "--layer", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["checkpoint"] == d and [r["at_generic"] for r in out["layers"]] == [True]
    for extra, why in (
        (["--embed", "8"], "--embed cannot be combined with --checkpoint"),
        (["--method", "dense"], "--method cannot be combined with --checkpoint"),
        (["--run", d], "give --run DIR or --checkpoint DIR, not both"),
        (["--max-memory", "0"], "max-memory must be a positive number"),
    ):
        assert main(["audit", "--checkpoint", d, *extra]) == 2
        assert why in capsys.readouterr().err
    assert main(["audit", "--checkpoint", d, "--max-memory", "1e-9"]) == 2
    assert "GiB" in capsys.readouterr().err


def test_chapter_table_of_a_checkpoint(tmp_path):
    from attnid.chapters import yourmodel as ch

    cfg, model = tiny("gpt2")
    t = ch.table_checkpoint(save(model, tmp_path))
    generic = count(cfg).unidentified + biased_reader_rows(cfg)
    assert list(t["layer"]) == [1, 2] and list(t["unidentified"]) == [generic, generic]
    assert t["at_generic"].all() and t["hyperplane"].all() and "weakest" in t.attrs["formats"]


@pytest.mark.parametrize("hf_type", ["smollm3", "llama4"])
def test_a_checkpoints_nope_layer_is_audited_against_its_own_count(tmp_path, hf_type):
    """A 2-layer checkpoint whose second layer has no RoPE (SmolLM3; Llama 4, whose NoPE layer also has no QK-norm
    and whose RoPE layer rotates in complex numbers): each layer is at the generic count of its own kind, and the
    two kinds differ, so a NoPE layer read against the RoPE count would be called off it."""
    tf = pytest.importorskip("transformers")
    common = dict(hidden_size=E, num_attention_heads=H, num_key_value_heads=1, num_hidden_layers=2, vocab_size=64,
                  intermediate_size=24, no_rope_layers=[1, 0], pad_token_id=None, bos_token_id=None,
                  eos_token_id=None, tie_word_embeddings=False)  # fmt: skip
    if hf_type == "llama4":
        config = tf.Llama4TextConfig(**common, head_dim=D, moe_layers=[], intermediate_size_mlp=24, floor_scale=2)
        model = tf.Llama4ForCausalLM(config)
    else:
        model = tf.SmolLM3ForCausalLM(tf.SmolLM3Config(**common))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name else torch.randn_like(p) / E**0.5)
    rows = audit_checkpoint(save(model.to(torch.float64), tmp_path))
    cfg = equivalent_config(
        hf_type, embed=E, heads=H, groups=1, head_dim=D, norm_eps=1e-6 if hf_type == "llama4" else 0
    )
    nope = equivalent_config(hf_type, embed=E, heads=H, groups=1, head_dim=D, nope=True)
    assert [(r["generic"], r["at_generic"]) for r in rows] == [(count(cfg).unidentified, True),
                                                               (count(nope).unidentified, True)]  # fmt: skip
    assert count(cfg).unidentified != count(nope).unidentified and all(r["gap"] > 1e6 for r in rows)


def test_a_mixture_of_experts_checkpoint_is_audited_in_float64(tmp_path):
    """A genuine save_pretrained folder of a mixture family: transformers runs its experts through a grouped product
    that has no float64, unless the experts' own loop is asked for; each layer is read at its generic count."""
    _, model = tiny("mixtral")
    model.config._experts_implementation = "grouped_mm"  # what a saved model asks for by default
    rows = audit_checkpoint(save(model, tmp_path))
    assert [r["layer"] for r in rows] == [1, 2]
    assert all(r["at_generic"] and r["unidentified"] == r["generic"] for r in rows), rows
