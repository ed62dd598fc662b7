"""Real attention modules of Hugging Face transformers against the closed form (the [hf] extra)."""

import subprocess
import sys

import pytest

pytest.importorskip("transformers")

from attnid.attention import AttentionConfig
from attnid.audit import audit
from attnid.hf import HF_TYPES, HFAuditError, audit_hf, check_hf_audit, equivalent_config, verify_presets
from attnid.presets import PRESETS, preset_rows

# every model type through its own attention class and rotary code, with the settings it can express
CASES = {
    "gpt2": dict(),  # fused Conv1D, all biases
    "opt": dict(bias="none"),
    "llama": dict(groups=2, bias="all"),  # RoPE, GQA, attention_bias
    "mistral": dict(groups=1),  # multi-query
    "qwen2": dict(groups=2),  # q/k/v biases under full RoPE: the key bias is identified
    "gpt_neox": dict(rope_dims=2),  # partial rotary, fused interleaved qkv with biases
    "phi": dict(groups=2, rope_dims=2),  # partial rotary, biases, GQA
    "qwen3": dict(groups=2, bias="all"),  # QK-norm per head, one weight for all heads (tests/test_modern_attention.py)
    "olmo2": dict(groups=1),  # QK-norm over the whole projection, multi-query
    "olmo3": dict(groups=2),  # OLMo 2's attention in OLMo 3 (its sliding-window layers differ only in the mask)
    "gemma2": dict(groups=2),  # logit soft-capping (eager attention, its softmax kept in float64)
    "gemma3": dict(groups=1, bias="all"),  # QK-norm per head with Gemma's (1 + w) RMSNorm, multi-query
    "granite": dict(groups=2, bias="all"),  # Llama with fixed multipliers (its own score scale)
    "starcoder2": dict(groups=2),  # biases on every map, GQA, RoPE
    "glm4": dict(groups=2, rope_dims=2),  # q/k/v biases, rotary on part of each head in adjacent pairs
    "stablelm": dict(groups=2, rope_dims=2, bias="qkv"),  # q/k/v biases, a quarter of each head rotated
    "phi3": dict(groups=2, rope_dims=2),  # fused qkv, partial rotary, GQA, no biases (Phi-4-mini)
    "gpt_oss": dict(groups=2),  # a sink logit per head (eager attention), all biases: value and key biases seen
    "mixtral": dict(groups=2),  # Mistral's attention in a mixture-of-experts model (its block is not counted)
    "qwen3_moe": dict(groups=1, bias="all"),  # Qwen3's attention in a mixture-of-experts model
    "smollm3": dict(groups=2),  # a RoPE layer (its NoPE layers: tests/test_released.py)
    "llama4": dict(groups=2),  # a RoPE layer with L2 QK-norm, complex rotary (its NoPE layers: test_released.py)
    "qwen3_next": dict(groups=2),  # gated heads, (1 + w) QK-norm, a quarter of each head rotated
    "apertus": dict(groups=2),  # Llama's attention with a QK-norm per head (its xIELU MLP: tests/test_blocks.py)
    "qwen3_vl_moe": dict(groups=2),  # Qwen3-VL's attention in its mixture models
    "qwen3_5": dict(groups=2),  # Qwen3-Next's attention with interleaved M-RoPE on its rotated quarter
    "qwen3_5_moe": dict(groups=2, bias="all"),
    "ernie4_5": dict(groups=2, bias="all"),  # interleaved rotary pairs, use_bias on every map
    "seed_oss": dict(groups=2, bias="qkvo"),  # q/k/v biases and an output bias, switched apart
    "cohere2": dict(groups=2),  # a sliding-window layer: RoPE (its NoPE layers: tests/test_blocks.py)
    "exaone4": dict(groups=2),  # QK-norm per head in a sliding-window layer (its NoPE layers: tests/test_blocks.py)
    "cohere": dict(groups=2),  # interleaved rotary pairs (its QK LayerNorm: tests/test_modern_attention.py)
    "glm4_moe": dict(groups=2, bias="qkv", rope_dims=2, qk_norm="head"),  # q/k/v biases, half rotated, QK-norm
    "dots1": dict(groups=2, bias="all"),  # Qwen3's attention in dots.llm1
    "ernie4_5_moe": dict(groups=2, bias="all"),  # ERNIE 4.5's attention in its mixture models
    "qwen2_5_vl": dict(groups=2),  # M-RoPE at text positions (a multimodal map: tests/test_families.py)
    "qwen3_vl": dict(
        groups=2, bias="all"
    ),  # Qwen3's attention with interleaved M-RoPE (a multimodal map: test_families)
    "hunyuan_v1_moe": dict(groups=2, bias="all"),  # its QK-norm per head after RoPE, all four biases
    "bloom": dict(),  # ALiBi: a fixed bias on the scores, no position map on queries and keys; fused qkv per head
    "falcon": dict(groups=2, bias="all"),  # fused qkv per group of keys (its new architecture), biases on every map
    "lfm2": dict(groups=2),  # Qwen3's QK-norm per head, no biases (its short convolutions: tests/test_hybrid.py)
    "bamba": dict(groups=2, bias="all"),  # half of each head rotated by its code (its Mamba-2: tests/test_hybrid.py)
    "granitemoehybrid": dict(groups=2, bias="all"),  # Granite 4's NoPE attention (its Mamba-2: tests/test_hybrid.py)
    "arcee": dict(groups=2, bias="all"),  # Llama's attention (its ReLU² MLP: tests/test_blocks.py)
}


def test_every_model_type_is_tested():
    assert set(CASES) == set(HF_TYPES)


@pytest.mark.parametrize("hf_type", list(CASES))
def test_real_module_count_equals_the_closed_form(hf_type):
    """The real module's Jacobian count is the closed form's; for a rotary type it is also our layer's, though
    transformers pairs dimension i with i + R/2 and our layer 2i with 2i + 1."""
    kw = dict(embed=16, heads=4, **CASES[hf_type])
    r = audit_hf(hf_type, **kw)
    assert r.unidentified == r.details["theory_unidentified"]
    assert r.sv_gap > 1e6
    assert r.seconds < 60
    if HF_TYPES[hf_type].rotary:
        ours = audit(equivalent_config(hf_type, **kw), method="dense")
        assert (r.unidentified, r.total_params) == (ours.unidentified, ours.total_params)


def test_float32_internals_are_reported_not_miscounted():
    """The eager GPT-NeoX path runs its softmax in float32: the bias symmetries hold only to ~1e-8 and
    the singular values show no gap. The audit refuses to read a count off them."""
    r = audit_hf("gpt_neox", embed=16, heads=4, rope_dims=2, attn_implementation="eager", check=False)
    assert r.sv_gap < 1e6
    with pytest.raises(HFAuditError, match="no clear gap"):
        check_hf_audit(r)  # what audit_hf(..., check=True) raises


def test_settings_a_model_type_cannot_express_are_refused():
    with pytest.raises(ValueError, match="gpt2 has no grouped-query attention"):
        equivalent_config("gpt2", embed=16, heads=4, groups=2)
    with pytest.raises(ValueError, match="qwen2 can have biases 'qkv', not 'none'"):
        equivalent_config("qwen2", embed=16, heads=4, bias="none")
    with pytest.raises(ValueError, match="llama rotates all head dimensions"):
        equivalent_config("llama", embed=16, heads=4, rope_dims=2)
    with pytest.raises(ValueError, match="rope/rope_dims: opt has no rotary embeddings"):
        equivalent_config("opt", embed=16, heads=4, rope_dims=2)
    with pytest.raises(ValueError, match="unknown model type"):
        equivalent_config("bert", embed=16, heads=4)
    assert equivalent_config("gpt_neox", embed=32, heads=4) == AttentionConfig(
        32, 4, bias="all", rope_dims=4, causal=True
    )


@pytest.mark.slow
def test_every_preset_with_a_model_type_is_verified():
    verified = verify_presets()
    for name, p in PRESETS.items():
        r = verified[name]
        if p.hf_type is None:
            assert r is None
        else:
            assert r is not None and r.unidentified == r.details["theory_unidentified"], name
            assert r.details["hf_type"] == p.hf_type
            # the audited structure is the preset's: same sharing, biases, and RoPE on all, part or none
            c = r.details["config"]
            assert (c["G"] == c["H"]) == (p.config.G == p.config.H)
            assert (c["G"] == 1) == (p.config.G == 1)
            assert c["bias"] == (p.config.bias or "none")
            assert (c["R"] == 0, c["R"] == c["D"]) == (p.config.R == 0, p.config.R == p.config.D)
    rows = preset_rows(verified)
    assert [r["verified"] for r in rows] == [None if p.hf_type is None else True for p in PRESETS.values()]


def test_cli_audit_hf_json(capsys):
    import json

    from attnid.cli import main

    assert main(["audit", "--hf", "qwen2", "--embed", "16", "--heads", "4", "--groups", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["hf_type"] == "qwen2" and d["module"].endswith("Qwen2Attention")
    assert d["unidentified"] == d["theory_unidentified"] == 40
    assert {"total_params", "rank", "sv_gap", "seconds", "details"} <= set(d)


def test_cli_rejects_what_the_model_type_cannot_express(capsys):
    from attnid.cli import main

    assert main(["audit", "--hf", "gpt2", "--embed", "16", "--heads", "4", "--groups", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "attnid: error: groups: gpt2 has no grouped-query attention (groups must equal heads)"
    ]


def test_without_transformers_the_message_says_how_to_install():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from attnid.hf import audit_hf\n"
        "try:\n    audit_hf('llama')\nexcept ImportError as e:\n    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "pip install 'attnid[audit]'" in r.stdout


@pytest.mark.parametrize("hf_type", ["gpt_neox", "phi"])
def test_partial_rope_modules_are_built_with_exactly_the_rotary_dims_asked_for(hf_type):
    """30 of 44 dims: 30 / 44 * 44 is 29.999..., which transformers' int() made 29."""
    from attnid import AttentionConfig
    from attnid.hf import build_attention

    module, _ = build_attention(hf_type, AttentionConfig(44, 1, rope_dims=30))
    assert module.rotary_ndims == 30


def test_hf_audit_too_large_for_memory_is_refused_before_it_starts():
    from attnid.hf import audit_hf

    with pytest.raises(ValueError, match="GiB"):
        audit_hf("gpt2", embed=16, heads=2, max_memory=1e3)
    with pytest.raises(ValueError, match="attn_implementation"):
        audit_hf("gpt2", embed=16, heads=2, attn_implementation="bogus")


def test_preset_verification_shows_progress_on_stderr(capsys):
    from attnid.hf import verify_presets

    out = verify_presets(["gpt2", "bert-base"], progress=True)
    captured = capsys.readouterr()
    assert "verifying presets" in captured.err and captured.out == ""
    assert out["bert-base"] is None and out["gpt2"].unidentified == out["gpt2"].details["theory_unidentified"]


@pytest.mark.parametrize(
    "kw",
    [
        dict(scope="model", vocab=10**9),
        dict(scope="model", layers=10**9),
        dict(scope="block", ffn=10**9),
    ],
)
def test_hf_memory_guard_runs_before_anything_is_built(kw, monkeypatch):
    """The estimate comes from the closed form's shapes: a size that cannot fit is refused before a module
    (or its parameters) exists."""
    import attnid.hf.scopes as hf

    def refuse(*a, **k):
        raise AssertionError("built before the memory check")

    for name in ("build_attention", "build_block", "build_model"):
        monkeypatch.setattr(hf, name, refuse)
    with pytest.raises(ValueError, match="GiB available"):
        hf.audit_hf("llama", embed=8, heads=2, **kw)


def test_plain_audit_memory_guard_runs_before_the_parameters_exist(monkeypatch):
    import attnid.audit as audit_mod
    from attnid import AttentionConfig

    monkeypatch.setattr(audit_mod, "init_params", lambda *a, **k: pytest.fail("allocated before the check"))
    with pytest.raises(ValueError, match="GiB available"):
        audit_mod.audit(AttentionConfig(100_000, 1))


def test_available_memory_sees_ulimit(monkeypatch):
    import resource

    from attnid.audit import available_memory

    free = available_memory()
    assert free is not None and free > 0
    monkeypatch.setattr(resource, "getrlimit", lambda r: (2**31, resource.RLIM_INFINITY))
    assert available_memory() <= 2**31  # what is left under `ulimit -v 2GiB`, less what the process already maps


@pytest.mark.parametrize(
    "kw, word",
    [
        (dict(scope="model", vocab=1), "vocab: 1 tokens"),
        (dict(scope="model", vocab=8), "vocab: 8 tokens show the 8-dimensional stream"),  # V = E: one short
        (dict(scope="model", vocab=9), None),  # V = E + 1: the closed form, with a clear gap
    ],
)
def test_a_vocabulary_too_small_to_see_the_stream_is_refused(kw, word):
    from attnid.hf import audit_hf

    if word is None:
        r = audit_hf("llama", embed=8, heads=2, **kw)
        assert r.unidentified == r.details["theory_unidentified"] and r.sv_gap > 1e6
    else:
        with pytest.raises(ValueError, match=word):
            audit_hf("llama", embed=8, heads=2, **kw)


@pytest.mark.parametrize("hf_type, kw, word", [
    ("gpt2", dict(scope="block", embed=2, heads=1), "embed: a LayerNorm over 2 feature"),
    ("opt", dict(scope="model", embed=3, heads=1), "embed: a LayerNorm over 3 feature"),
    ("phi", dict(scope="model", embed=8, heads=2, tied=True), "tied: the phi LM head has a bias"),
    ("gpt2", dict(embed=8, heads=2, rope_dims=4), "rope/rope_dims: gpt2 has no rotary"),
])  # fmt: skip
def test_a_degenerate_or_impossible_setting_names_its_argument(hf_type, kw, word):
    from attnid.hf import audit_hf

    with pytest.raises(ValueError, match=word):
        audit_hf(hf_type, **kw)


def test_a_closed_form_off_by_one_is_refused(monkeypatch):
    """``audit_hf`` judges its own audit (:func:`check_hf_audit`): a closed form that miscounts by one raises."""
    import dataclasses

    import attnid.hf.scopes as hf

    real_count = hf.count

    def off_by_one(cfg):
        c = real_count(cfg)
        return dataclasses.replace(
            c, unidentified_by_block={**c.unidentified_by_block, "vo": c.unidentified_by_block["vo"] + 1}
        )

    monkeypatch.setattr(hf, "count", off_by_one)
    with pytest.raises(HFAuditError, match=r"the Jacobian gives 40 unidentified parameters, the closed form 41"):
        audit_hf("llama", embed=8, heads=2)
    assert audit_hf("llama", embed=8, heads=2, check=False).unidentified == 40
