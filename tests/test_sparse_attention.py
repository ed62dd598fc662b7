"""DeepSeek-V3.2's sparse attention (chapter 9): its indexer scores the keys only to choose the top-k each query reads,
so none of its parameters reaches the output near a generic point. The closed form (latent attention's count plus
every indexer parameter) equals the Jacobian rank of transformers' own DeepseekV32Attention and decoder layer in
float64, with the indexer choosing fewer keys than a query could read; a closed form without the indexer's term is
refused, and a released file is read with its indexer and its layers' MLP kinds."""

import json

import pytest

from attnid.configs import ConfigError
from attnid.counting import MLAConfig, count_mla
from attnid.presets import scope_count

SHAPES = [
    (dict(embed=16, heads=2, kv_rank=6, q_rank=6, nope_dim=4, rope_dim=2, v_dim=4, index_heads=2, index_dim=4),
     "attention"),
    (dict(embed=16, heads=2, kv_rank=6, q_rank=6, nope_dim=4, rope_dim=2, v_dim=4, index_heads=1, index_dim=2),
     "attention"),
    (dict(embed=12, heads=3, kv_rank=4, q_rank=5, nope_dim=2, rope_dim=2, v_dim=2, index_heads=2, index_dim=6),
     "attention"),
    (dict(embed=16, heads=2, kv_rank=6, q_rank=6, nope_dim=4, rope_dim=2, v_dim=4, index_heads=1, index_dim=2),
     "block"),
]  # fmt: skip


def test_the_indexer_adds_every_parameter_of_its_own():
    plain = MLAConfig(16, 2, kv_rank=6, q_rank=6, nope_dim=4, rope_dim=2, v_dim=4)
    sparse = MLAConfig(16, 2, kv_rank=6, q_rank=6, nope_dim=4, rope_dim=2, v_dim=4, index_heads=2, index_dim=4)
    indexer = 2 * 4 * 6 + 4 * 16 + 2 * 4 + 2 * 16  # queries from the latent, the key, its LayerNorm, head weights
    assert count_mla(sparse).unidentified_by_block["indexer"] == indexer
    assert count_mla(sparse).unidentified == count_mla(plain).unidentified + indexer
    assert count_mla(sparse).total_params == count_mla(plain).total_params + indexer
    for bad, says in [(dict(index_heads=2), "both"), (dict(q_rank=None, index_heads=1, index_dim=4), "query latent"),
                      (dict(index_heads=1, index_dim=1), "rope_dim")]:  # fmt: skip
        with pytest.raises(ValueError, match=says):
            MLAConfig(**{**dict(embed=16, heads=2, kv_rank=6, q_rank=6, nope_dim=4, rope_dim=2, v_dim=4), **bad})


@pytest.mark.parametrize("kw, scope", SHAPES)
def test_the_real_sparse_attention_leaves_its_indexer_free(kw, scope):
    hf_mla = pytest.importorskip("attnid.hf.mla")
    r = hf_mla.audit_mla_hf(MLAConfig(**kw), scope=scope)  # raises on a difference or a blurred gap
    assert r.unidentified == r.details["theory_unidentified"] and r.sv_gap > 1e6
    assert r.details["module"].endswith("DeepseekV32Attention" if scope == "attention" else "DeepseekV32DecoderLayer")
    assert r.details["terms"]["indexer"] > 0


def test_a_closed_form_that_identifies_the_indexer_is_refused(monkeypatch):
    """Planted: the indexer's parameters counted as identified (as if its scores weighted the keys)."""
    hf_mla = pytest.importorskip("attnid.hf.mla")
    from attnid.hf.build import HFAuditError

    original = hf_mla.count_mla

    def identified(cfg):
        c = original(cfg)
        return c.__class__(c.total_params, c.params_by_block, {**c.unidentified_by_block, "indexer": 0})

    monkeypatch.setattr(hf_mla, "count_mla", identified)
    with pytest.raises(HFAuditError, match="the Jacobian gives"):
        hf_mla.audit_mla_hf(MLAConfig(**SHAPES[1][0]))


DEEPSEEK_V32 = {  # DeepSeek-V3.2-Exp's architecture fields, as its model card and public code give them
    "model_type": "deepseek_v32", "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 256, "n_shared_experts": 1, "moe_intermediate_size": 2048, "intermediate_size": 18432,
    "first_k_dense_replace": 3, "num_hidden_layers": 61, "vocab_size": 129280, "num_experts_per_tok": 8,
    "n_group": 8, "topk_group": 4, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048,
    "tie_word_embeddings": False,
}  # fmt: skip


def test_a_deepseek_v32_file_is_counted_with_its_indexer_and_transformers_total(tmp_path):
    pytest.importorskip("transformers")
    from test_families import library_total
    from test_gates_and_norms import preset_of

    p = preset_of(tmp_path, DEEPSEEK_V32)
    indexer = 64 * 128 * 1536 + 128 * 7168 + 2 * 128 + 64 * 7168
    assert scope_count(p, "attention", "v32").unidentified_by_block["indexer"] == indexer
    model = scope_count(p, "model", "v32")
    assert model.total_params == library_total(DEEPSEEK_V32) == 671_877_929_216
    for change, says in [(dict(index_topk=1), "index_topk"),
                         (dict(mlp_layer_types=["sparse", "dense"] + ["sparse"] * 59), "mlp_layer_types")]:  # fmt: skip
        with pytest.raises(ConfigError, match=says):
            preset_of(tmp_path, {**DEEPSEEK_V32, **change})
    dense_first = preset_of(tmp_path, {**DEEPSEEK_V32, "mlp_layer_types": ["dense"] * 3 + ["sparse"] * 58})
    assert scope_count(dense_first, "model", "v32").total_params == model.total_params


def test_the_cli_audits_deepseek_v32_with_an_indexer():
    pytest.importorskip("transformers")
    from test_cli import run

    r = run("audit", "--hf", "deepseek_v32", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr
    assert out["unidentified"] == out["details"]["theory_unidentified"] and out["details"]["terms"]["indexer"] > 0
    r = run("audit", "--hf", "deepseek_v32", "--q-rank", "0")
    assert r.returncode == 2 and "indexer reads the query latent" in r.stderr
