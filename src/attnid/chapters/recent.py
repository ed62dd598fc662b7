"""Chapter 9, the attention of recent models: QK-norm (Qwen3, Gemma 3, OLMo 2), logit soft-capping (Gemma 2)
and multi-head latent attention (DeepSeek-V3). Each variant's closed form beside the Jacobian rank of our layer
and of the real module, the published models' counts at three scopes (their decoder layers audited through
transformers), and what gradient flow still conserves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from ..attention import AttentionConfig, attention, init_params
from ..audit import audit
from ..counting import SCOPES, MLAConfig, count, count_mla
from ..dynamics import qk_norm_flow_rates
from ..presets import ALL_PRESETS, MLA_PRESETS, PRESETS, preset_count, preset_rows
from . import with_formats

READS: tuple[str, ...] = ()  # no run records: everything here is computed from the math


@dataclass(frozen=True)
class Variant:
    """One attention variant at the chapter's audited shape, and the real module that has it (if any)."""

    label: str
    changes: dict
    hf_type: str | None = None
    hf_kwargs: dict | None = None


SHAPE: dict[str, Any] = dict(embed=16, heads=2, groups=2, causal=True)  # E, H, G (D = 8): small enough for dense audits
VARIANTS = (
    Variant("RoPE (Llama)", dict(rope=True), "llama", dict(bias="none")),
    Variant("RoPE + QK-norm per head, ε = 0 (Qwen3)", dict(rope=True, qk_norm="head"), "qwen3", {}),
    Variant("RoPE + QK-norm per head, ε = 0.05", dict(rope=True, qk_norm="head", qk_norm_eps=0.05), "qwen3",
            dict(norm_eps=0.05)),
    Variant("RoPE + QK-norm over the projection, ε = 0 (OLMo 2)", dict(rope=True, qk_norm="proj"), "olmo2", {}),
    Variant("RoPE + soft-capping, c = 50 (Gemma 2)", dict(rope=True, logit_softcap=50.0), "gemma2", {}),
    Variant("biases, no RoPE", dict(bias="all")),
    Variant("biases, no RoPE, soft-capping c = 1", dict(bias="all", logit_softcap=1.0)),
    Variant("biases, no RoPE, soft-capping c = 50", dict(bias="all", logit_softcap=50.0)),
)  # fmt: skip
# Why a row has no real module: Gemma 2, the one released model with soft-capping, applies RoPE to every dimension,
# where the key bias is identified with or without the cap, so its module cannot show the cap's own effect
OURS_ONLY_REASON = (
    "no released module has soft-capping without RoPE on every dimension (Gemma 2 rotates all of them, which "
    "identifies the key bias with or without the cap)"
)
PUBLISHED: dict[str, dict[str, Any]] = {  # preset -> the change that removes its new feature
    "qwen3-8b": dict(qk_norm="", qk_norm_eps=0.0),
    "gemma-3-12b": dict(qk_norm="", qk_norm_eps=0.0),
    "olmo-2-7b": dict(qk_norm="", qk_norm_eps=0.0),
    "gemma-2-9b": dict(logit_softcap=None),
}


def variant_table(seed: int = 0, real: bool = True) -> pd.DataFrame:
    """Each :data:`VARIANTS` entry: parameters, the closed form's QK and key-bias terms and total, and the
    Jacobian count of our layer and (``real``) of the real ``transformers`` module. Raises if a Jacobian
    count differs from the closed form."""
    from ..hf import audit_hf

    rows = []
    for v in VARIANTS:
        cfg = AttentionConfig(**SHAPE, **v.changes)
        c = count(cfg)
        ours = audit(cfg, seed=seed)
        theirs = audit_hf(v.hf_type, embed=16, heads=2, groups=2, seed=seed, **(v.hf_kwargs or {})) if (
            real and v.hf_type) else None  # fmt: skip
        for who, res in (("our layer", ours), (v.hf_type, theirs)):
            if res is not None and res.unidentified != c.unidentified:
                raise AssertionError(f"{v.label}: {who} gives {res.unidentified}, the closed form {c.unidentified}")
        rows.append(
            {
                "variant": v.label,
                "params": c.total_params,
                "QK block": c.unidentified_by_block["qk"],
                "key bias": c.unidentified_by_block["key_bias"],
                "unidentified": c.unidentified,
                "our layer": ours.unidentified,
                "real module": theirs.unidentified if theirs is not None else None,
                "smallest gap": min(r.sv_gap for r in (ours, theirs) if r is not None),
            }
        )
    df = pd.DataFrame(rows)
    df["real module"] = df["real module"].astype("Int64")
    return with_formats(df, **{"smallest gap": "{:.0e}"})


MLA_SHAPES = {  # audited through transformers' DeepseekV3Attention
    "small, query latent": MLAConfig(16, 2, kv_rank=6, q_rank=6, nope_dim=4, rope_dim=2, v_dim=4),
    "small, no query latent": MLAConfig(16, 2, kv_rank=6, q_rank=None, nope_dim=4, rope_dim=2, v_dim=4),
    "small, query latent, ε = 0.05": MLAConfig(16, 2, kv_rank=6, q_rank=6, nope_dim=4, rope_dim=2, v_dim=4,
                                              norm_eps=0.05),
}  # fmt: skip
_V3 = MLA_PRESETS["deepseek-v3"].config
assert isinstance(_V3, MLAConfig)
MLA_PUBLISHED = {  # from the released configs (rms_norm_eps 1e-6)
    "DeepSeek-V3": _V3,
    "DeepSeek-V2-Lite": MLAConfig(2048, 16, kv_rank=512, q_rank=None, nope_dim=128, rope_dim=64, v_dim=128,
                                  norm_eps=1e-6),
}  # fmt: skip


def mla_table(seed: int = 0, real: bool = True) -> pd.DataFrame:
    """Multi-head latent attention term by term (:func:`attnid.counting.count_mla`): the small shapes with the
    Jacobian count of the real module (``real``), then one attention layer of each published model. Raises if
    an audit differs from the closed form."""
    from ..hf import audit_mla_hf

    rows = []
    for name, cfg in {**MLA_SHAPES, **MLA_PUBLISHED}.items():
        c = count_mla(cfg)
        res = audit_mla_hf(cfg, seed=seed) if real and name in MLA_SHAPES else None  # raises on a difference
        rows.append(
            {
                "attention layer": name,
                "params": c.total_params,
                **c.unidentified_by_block,
                "unidentified": c.unidentified,
                "share": 1 - c.identified_fraction,
                "real module": None if res is None else res.unidentified,
            }
        )
    df = pd.DataFrame(rows)
    df["real module"] = df["real module"].astype("Int64")
    return with_formats(df, share="{:.3%}")


def published_table() -> pd.DataFrame:
    """The published models of :data:`PUBLISHED`: the QK block's unidentified directions and the attention
    layer's unidentified share as released and without their new feature, and the three scopes where
    attnid counts them."""
    scopes = {r["name"]: r for r in preset_rows()}
    rows = []
    for name, without in PUBLISHED.items():
        cfg = PRESETS[name].config
        assert isinstance(cfg, AttentionConfig)  # PRESETS holds no latent attention (MLA_PRESETS does)
        c, plain = count(cfg), count(cfg.with_(**without))
        r = scopes[name]
        rows.append(
            {
                "model": name,
                "QK block": c.unidentified_by_block["qk"],
                "QK block without": plain.unidentified_by_block["qk"],
                "key bias": c.unidentified_by_block["key_bias"],
                "attention": 1 - c.identified_fraction,
                "attention without": 1 - plain.identified_fraction,
                "block": r["block_unidentified_share"],
                "model ": r["model_unidentified_share"],
            }
        )
    pct = "{:.4%}"
    return with_formats(pd.DataFrame(rows), **{k: pct for k in ("attention", "attention without", "block", "model ")})


def fig_published(df: pd.DataFrame):
    """The QK block's unidentified directions of each published model, as released and without its QK-norm
    or soft-capping (log scale)."""
    from ..plotting import dot_rows

    series = {
        "without its QK-norm or soft-capping": ("s", df["QK block without"]),
        "as released": ("o", df["QK block"]),
    }
    return dot_rows(
        df["model"], series, xlabel="unidentified directions of the QK block, per layer (log scale)",
        title="Published models", height=3.2,
    )  # fmt: skip


def conservation_table(seed: int = 0) -> pd.DataFrame:
    """The largest |d/dt| under gradient flow of the quantities QK-norm's symmetries conserve (the scale of
    each normalised projection, the norm-weight trade), for a regression loss on a random layer, at ε = 0
    and ε = 0.05, for both kinds of QK-norm."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(4, 16, 6, dtype=torch.float64, generator=g)
    T = torch.randn(4, 16, 6, dtype=torch.float64, generator=g)
    rows = []
    for qk_norm in ("head", "proj"):
        for eps in (0.0, 0.05):
            cfg = AttentionConfig(**SHAPE, rope=True, bias="all", qk_norm=qk_norm, qk_norm_eps=eps)
            rates = qk_norm_flow_rates(
                init_params(cfg, seed=seed), cfg, lambda q, cfg=cfg: ((attention(X, q, cfg) - T) ** 2).mean()
            )
            rows.append(
                {
                    "QK-norm": qk_norm,
                    "ε": eps,
                    "scales": float(torch.cat([rates["scale_Q"], rates["scale_K"]]).abs().max()),
                    "norm-weight trade": float(rates["trade"].abs().max()),
                }
            )
    df = pd.DataFrame(rows)
    return with_formats(df, **{"scales": "{:.1e}", "norm-weight trade": "{:.1e}", "ε": "{:g}"})


SCOPE_MODELS = ("qwen3-8b", "olmo-2-7b", "gemma-3-12b", "gemma-2-9b", "deepseek-v3")
NORM_PLACES = {"pre": "before", "post": "after", "sandwich": "before and after"}


def scopes_table(seed: int = 0, real: bool = True) -> pd.DataFrame:
    """Each of :data:`SCOPE_MODELS` at the three scopes (:func:`attnid.presets.preset_count`): the unidentified
    share of one attention layer, one decoder layer and the whole model, the model's unidentified count, its
    stream rotations and the decoder-layer terms that norms after a sub-layer or a mixture of experts bring;
    with ``real``, the Jacobian count of a small decoder layer of the same structure through its transformers
    class (:func:`attnid.hf.verify_presets`, which raises on a difference)."""
    from ..hf import verify_presets

    audits = verify_presets(list(SCOPE_MODELS), seed=seed, scope="block") if real else {}
    rows = []
    for name in SCOPE_MODELS:
        c = {scope: preset_count(name, scope) for scope in SCOPES}
        block = c["block"].unidentified_by_block
        p = ALL_PRESETS[name]
        assert p.model is not None
        r = audits.get(name)
        rows.append(
            {
                "model": name,
                "norms": NORM_PLACES[_norm_position(p.hf_type)],
                "experts": p.model.experts or None,
                "attention": c["attention"].unidentified / c["attention"].total_params,
                "block": c["block"].unidentified / c["block"].total_params,
                "model ": c["model"].unidentified / c["model"].total_params,
                "model unidentified": c["model"].unidentified,
                "beyond the layers": c["model"].unidentified - c["model"].unidentified_by_block["blocks"],
                "stream rotations": c["model"].unidentified_by_block["stream_rotation"],
                "norm weights": block["norm_scale"],
                "MLP rescaling": block["mlp_rescaling"],
                "small layer audit": None if r is None else r.unidentified,
                "its closed form": None if r is None else r.details["theory_unidentified"],
                "gap": None if r is None else r.sv_gap,
            }
        )
    pct = "{:.4%}"
    return with_formats(
        pd.DataFrame(rows),
        **{k: pct for k in ("attention", "block", "model ")},
        **{
            k: "{:,.0f}"
            for k in ("model unidentified", "beyond the layers", "stream rotations", "norm weights", "MLP rescaling")
        },
        gap="{:.1e}",
    )


def _norm_position(hf_type: str | None) -> str:
    """Where a model type's block norms sit (latent-attention models: before each sub-layer)."""
    from ..families import HF_TYPES

    return HF_TYPES[hf_type].norm_position if hf_type in HF_TYPES else "pre"


def fig_scopes(df: pd.DataFrame):
    """The unidentified share of each model of :func:`scopes_table` at the three scopes (log scale)."""
    from ..plotting import dot_rows

    series = {
        "one attention layer": ("o", 100 * df["attention"]),
        "one decoder layer": ("s", 100 * df["block"]),
        "whole model": ("^", 100 * df["model "]),
    }
    return dot_rows(
        df["model"], series, xlabel="unidentified share of the parameters (%, log scale)",
        title="Published models at three scopes", height=3.2,
    )  # fmt: skip


def facts(
    variants: pd.DataFrame, published: pd.DataFrame, conservation: pd.DataFrame, mla: pd.DataFrame,
    scopes: pd.DataFrame,
) -> dict:  # fmt: skip
    """The numbers the chapter's prose glues."""
    v3 = mla.set_index("attention layer").loc["DeepSeek-V3"]
    by_model = scopes.set_index("model")
    audited = scopes["small layer audit"].notna()
    qwen = published.set_index("model").loc["qwen3-8b"]
    exact = conservation[conservation["ε"] == 0]
    moved = conservation[conservation["ε"] > 0]
    real = variants["real module"].notna()
    return {
        "n_variants": len(variants),
        "n_real": int(real.sum()),
        "ours_only": ", ".join(f"“{v}”" for v in variants.loc[~real, "variant"]) or "none",
        "ours_only_reason": OURS_ONLY_REASON,
        "min_gap": float(variants["smallest gap"].min()),
        "qwen_qk": int(qwen["QK block"]),
        "qwen_qk_without": int(qwen["QK block without"]),
        "max_exact_rate": float(exact[["scales", "norm-weight trade"]].to_numpy().max()),
        "min_moved_scale_rate": float(moved["scales"].min()),
        "n_mla_real": int(mla["real module"].notna().sum()),
        "v3_unidentified": int(v3["unidentified"]),
        "v3_latents": int(v3["q_latent"] + v3["kv_latent"]),
        "v3_share": float(v3["share"]),
        "n_layer_audits": int(audited.sum()),
        "min_layer_gap": float(scopes.loc[audited, "gap"].min()) if audited.any() else float("nan"),
        "qwen_rotations": int(by_model.loc["qwen3-8b", "stream rotations"]),
        "qwen_rotation_share": float(
            by_model.loc["qwen3-8b", "stream rotations"] / by_model.loc["qwen3-8b", "model unidentified"]
        ),
        "olmo_beyond_layers": int(by_model.loc["olmo-2-7b", "beyond the layers"]),
        "gemma_beyond_layers": int(by_model.loc["gemma-3-12b", "beyond the layers"]),
        "v3_model_unidentified": int(by_model.loc["deepseek-v3", "model unidentified"]),
        "v3_model_share": float(by_model.loc["deepseek-v3", "model "]),
        "v3_experts_rescaling": int(by_model.loc["deepseek-v3", "MLP rescaling"]),
    }
