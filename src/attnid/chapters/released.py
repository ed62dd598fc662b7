"""Chapter 9, the mechanisms of 2025–2026 models (sinks, NoPE layers, a soft-capped untied head, routed experts)
against the Jacobian of our layer and of the real module, and released config files read as downloaded."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from ..attention import AttentionConfig
from ..audit import audit
from ..configs import CONFIG_DIR, ConfigError, config_preset
from ..counting import count, count_mixer_block
from ..presets import layer_type_counts, scope_count

READS: tuple[str, ...] = ()  # no run records: everything here is computed from the math and the config files
RELEASED_DIR = CONFIG_DIR / "released"
FAMILIES_DIR = CONFIG_DIR / "families"

# the audited layers with the mechanism; each case of mechanism_table sets one beside its twin without it
SINKS = AttentionConfig(16, 4, groups=2, bias="all", rope=True, causal=True, sinks=True)
NOPE = AttentionConfig(16, 4, groups=2, rope=True, causal=True)


def mechanism_table(seed: int = 0, real: bool = True) -> pd.DataFrame:
    """One row per mechanism at a small shape: the closed form with and without it, and the Jacobian counts of our
    layer and (with ``real``) of the real transformers module, with and without it."""
    rows = []
    cases = [
        ("attention sinks (gpt-oss)", SINKS, SINKS.with_(sinks=False), "gpt_oss"),
        ("NoPE layer (SmolLM3)", NOPE.with_(rope=False), NOPE, "smollm3"),
    ]
    for label, cfg, without, hf_type in cases:
        kw: dict[str, Any] = dict(embed=cfg.E, heads=cfg.H, groups=cfg.G)
        row = _our_layer_row(label, cfg, without, seed)
        if real:
            from ..hf import audit_hf

            extra: dict[str, Any] = {"nope": True} if hf_type == "smollm3" else {}
            row["real module"] = audit_hf(hf_type, seed=seed, **kw, **extra).unidentified
            row["real module without"] = (
                audit_hf(hf_type, seed=seed, **kw).unidentified if hf_type == "smollm3" else None
            )
        rows.append(row)
    if real:
        from ..hf import audit_hf

        for label, hf_type in (("softmax router (a Mixtral layer)", "mixtral"),
                               ("biased router, biased gated experts (a gpt-oss layer)", "gpt_oss")):  # fmt: skip
            r = audit_hf(hf_type, scope="block", embed=8, heads=2, groups=2, ffn=4, seed=seed)
            rows.append({
                "mechanism": label, "closed form": r.details["theory_unidentified"], "closed form without": None,
                "our layer": None, "our layer without": None,
                "real module": r.unidentified, "real module without": None,
                "router": r.details["terms"]["router_shift"],
            })  # fmt: skip
        model: dict[str, Any] = dict(embed=8, heads=2, groups=2, scope="model", tied=False, seed=seed)
        capped = audit_hf("gemma2", final_softcap=30.0, **model)
        plain = audit_hf("gemma2", **model)
        rows.append({
            "mechanism": "capped logits, untied head (a Gemma 2 model)",
            "closed form": capped.details["theory_unidentified"],
            "closed form without": plain.details["theory_unidentified"],
            "our layer": None, "our layer without": None,
            "real module": capped.unidentified, "real module without": plain.unidentified,
        })  # fmt: skip
    return pd.DataFrame(rows)


def released_table() -> pd.DataFrame:
    """One row per released config file under ``data/configs/released``: its family, the count of one attention
    layer (and of a NoPE layer where the model has them), of one decoder layer and of the whole model, and how many
    of its fields were accepted as neutral; a file attnid refuses is listed with the reason."""
    sources = json.loads((RELEASED_DIR / "SOURCES.json").read_text())
    rows = []
    for name in sorted(sources):
        try:
            p = config_preset(RELEASED_DIR / f"{name}.json")
        except ConfigError as e:  # refused by name: shown as such
            rows.append({"file": name, "refused": str(e)})
            continue
        rows.append(_count_row(name, p))
    return pd.DataFrame(rows)


def families_table() -> pd.DataFrame:
    """One row per released file of a family that is a known one in new clothes (``data/configs/families``, each
    transcribed field by field, its source named inside), counted as :func:`released_table` counts, with the share of
    the whole model left unidentified."""
    rows = []
    for path in sorted(FAMILIES_DIR.glob("*.json")):
        row = _count_row(path.stem, config_preset(path))
        counted = row["model params"] is not None
        row["model share unidentified"] = row["model unidentified"] / row["model params"] if counted else None
        rows.append(row)
    return pd.DataFrame(rows)


def families_facts(families: pd.DataFrame) -> dict:
    """The numbers the prose beside :func:`families_table` glues."""
    rows = families.set_index("file")
    share = rows["model share unidentified"]
    return {"glm_air_share": float(share["glm-4.5-air"]), "dots_share": float(share["dots.llm1.inst"]),
            "ernie_share": float(share["ernie-4.5-21b-a3b"]),
            "apertus_total": int(rows.loc["apertus-8b", "model params"])}  # fmt: skip


def _count_row(name: str, p) -> dict[str, Any]:
    """A config's row: its family, the count of one attention layer (and of a NoPE layer where the model has them),
    of one decoder layer and of the whole model, and how many of its fields were accepted as neutral."""
    attn, kinds = scope_count(p, "attention", name), layer_type_counts(p)
    row: dict[str, Any] = {"file": name, "family": p.hf_type, "attention unidentified": attn.unidentified,
                           "NoPE layer unidentified": kinds["nope"].unidentified if kinds else None}  # fmt: skip
    for scope in ("block", "model"):
        try:
            c = scope_count(p, scope, name) if p.model is not None else None
        except ValueError:  # a scope refused by name (BLOOM's model: its LayerNorm on the embeddings)
            c = None
        row[f"{scope} params"] = None if c is None else c.total_params
        row[f"{scope} unidentified"] = None if c is None else c.unidentified
    row["fields accepted as neutral"] = len(p.reading["neutral"]) if p.reading else 0
    return row


SMALL_E = 8  # the width of the audited decoder layers


def _router(routers: pd.Series | None, label: str, closed_form: int) -> int:
    """A router's free directions in the table, or (without the real-module rows, at smoke) its closed form."""
    if routers is None or label not in routers.index or pd.isna(routers[label]):
        return closed_form
    return int(routers[label])


def released_facts(mechanisms: pd.DataFrame, released: pd.DataFrame) -> dict:
    """The numbers the section's prose glues."""
    by = mechanisms.set_index("mechanism")
    sinks, nope = by.loc["attention sinks (gpt-oss)"], by.loc["NoPE layer (SmolLM3)"]
    files = released.set_index("file")
    gpt = config_preset(RELEASED_DIR / "gpt-oss-20b.json").config
    assert isinstance(gpt, AttentionConfig)
    out = {
        "n_released": len(released),
        "n_counted_model": int(released["model params"].notna().sum()),
        "sink_gain": int(sinks["closed form without"] - sinks["closed form"]),
        "sink_gc": SINKS.G * SINKS.C,
        "nope_loss": int(nope["closed form"] - nope["closed form without"]),
        "gpt_oss_value_bias": gpt.G * gpt.C,
        "smollm3_share": float(
            files.loc["smollm3-3b-base", "model unidentified"] / files.loc["smollm3-3b-base", "model params"]
        ),
    }
    routers = mechanisms.set_index("mechanism").get("router")
    out["mixtral_router"] = _router(routers, "softmax router (a Mixtral layer)", SMALL_E)
    out["gpt_oss_router"] = _router(routers, "biased router, biased gated experts (a gpt-oss layer)", SMALL_E + 1)
    out["gpt_oss_share"] = float(
        files.loc["gpt-oss-20b", "model unidentified"] / files.loc["gpt-oss-20b", "model params"]
    )
    out["n_checks"], out["n_agree"] = _agreements(mechanisms)
    return out


def _our_layer_row(label: str, cfg: AttentionConfig, without: AttentionConfig, seed: int) -> dict[str, Any]:
    """A mechanism's row: the closed form of ``cfg`` and of ``without`` (the mechanism taken out), and our layer's
    Jacobian count of each."""
    return {
        "mechanism": label,
        "closed form": count(cfg).unidentified,
        "closed form without": count(without).unidentified,
        "our layer": audit(cfg, method="dense", seed=seed).unidentified,
        "our layer without": audit(without, method="dense", seed=seed).unidentified,
    }


def _agreements(table: pd.DataFrame) -> tuple[int, int]:
    """``(checks, agreements)``: each Jacobian count of ``table`` (our layer's, the real module's) beside its closed
    form, with the mechanism and without it, and how many are equal."""
    checks = [(f, j) for f, j in (("closed form", "our layer"), ("closed form without", "our layer without"),
                                   ("closed form", "real module"), ("closed form without", "real module without"))
              if j in table]  # fmt: skip
    pairs = [(a, b) for f, j in checks for a, b in zip(table[f], table[j]) if pd.notna(a) and pd.notna(b)]
    return len(pairs), sum(int(a) == int(b) for a, b in pairs)


# ------------------------------------------------------------- the norms and gates of 2025-2026 (chapter 9)
# each mechanism at a small shape, beside the plant that takes it out: (label, the layer, the layer without it, the
# real module's type and the audit_hf keywords with and without it; None where the module cannot drop it)
L2 = AttentionConfig(16, 4, groups=2, rope=True, causal=True, qk_norm="l2")
LAYER_HEAD = AttentionConfig(16, 4, groups=2, rope_dims=2, causal=True, qk_norm="layer")
GATED = AttentionConfig(16, 4, groups=2, head_dim=4, rope_dims=2, causal=True, qk_norm="head", output_gate=True)
NORMS_AND_GATES: list[tuple[str, AttentionConfig, AttentionConfig, str, dict, dict | None]] = [
    ("L2 QK-norm, no weight (Llama 4)", L2, L2.with_(qk_norm=""), "llama4", {}, {"qk_norm": ""}),
    ("NoPE layer, query temperature (Llama 4)", L2.with_(rope=False, qk_norm=""), L2, "llama4", {"nope": True}, {}),
    ("LayerNorm per head (StableLM 2 12B)", LAYER_HEAD, LAYER_HEAD.with_(qk_norm=""), "stablelm",
     {"qk_norm": "layer", "rope_dims": 2}, {"rope_dims": 2}),
    ("output gate per head and channel (Qwen3-Next)", GATED, GATED.with_(output_gate=False), "qwen3_next",
     {"head_dim": 4, "rope_dims": 2}, None),
]  # fmt: skip


def norms_and_gates_table(seed: int = 0, real: bool = True) -> pd.DataFrame:
    """One row per mechanism of Llama 4, StableLM 2 and Qwen3-Next at a small shape: the closed form with it and with
    its plant taken out, our layer's Jacobian count of each, and (with ``real``) the real module's; then, with
    ``real``, the decoder layers of Llama 4 (one expert of a sigmoid router beside a shared one) and Command R (a
    LayerNorm without a shift before attention and MLP side by side), audited whole."""
    rows = []
    for label, cfg, without, hf_type, kw, kw_without in NORMS_AND_GATES:
        row = _our_layer_row(label, cfg, without, seed)
        if real:
            from ..hf import audit_hf

            shape = dict(embed=cfg.E, heads=cfg.H, groups=cfg.G, seed=seed)
            row["real module"] = audit_hf(hf_type, **shape, **kw).unidentified
            row["real module without"] = (
                None if kw_without is None else audit_hf(hf_type, **shape, **kw_without).unidentified
            )
        rows.append(row)
    if real:
        rows += _whole_layers(seed)
    return pd.DataFrame(rows)


# (label, type, audit_hf keywords): the decoder layers audited whole at E = SMALL_E
WHOLE_LAYERS: tuple[tuple[str, str, dict], ...] = (
    ("sigmoid router, one expert, shared expert (a Llama 4 layer)", "llama4", {"ffn": 4}),
    ("LayerNorm without a shift, parallel block (a Command R layer)", "cohere", {}),
)


def _whole_layers(seed: int) -> list[dict]:
    """Rows of :func:`norms_and_gates_table` for the decoder layers of :data:`WHOLE_LAYERS`."""
    from ..hf import audit_hf

    rows = []
    for label, hf_type, kw in WHOLE_LAYERS:
        r = audit_hf(hf_type, scope="block", embed=SMALL_E, heads=2, groups=2, seed=seed, **kw)
        rows.append({"mechanism": label, "closed form": r.details["theory_unidentified"],
                     "real module": r.unidentified, "norm_mean": r.details["terms"]["norm_mean"]})  # fmt: skip
    return rows


# released models with these mechanisms: the architecture of one attention layer as their files give it
NORMS_AND_GATES_MODELS: dict[str, tuple[str, AttentionConfig]] = {
    "Llama-4-Scout-17B-16E (RoPE layers)": ("L2 QK-norm", AttentionConfig(
        5120, 40, groups=8, head_dim=128, rope=True, causal=True, rope_base=500000.0, qk_norm="l2", qk_norm_eps=1e-5)),
    "Llama-4-Scout-17B-16E (NoPE layers)": ("no RoPE, no QK-norm", AttentionConfig(
        5120, 40, groups=8, head_dim=128, causal=True)),
    "StableLM 2 12B": ("LayerNorm per head", AttentionConfig(
        5120, 32, groups=8, rope_dims=40, causal=True, qk_norm="layer", qk_norm_eps=1e-5)),
    "Command R+": ("LayerNorm per head", AttentionConfig(
        12288, 96, groups=8, rope=True, causal=True, qk_norm="layer", qk_norm_eps=1e-5)),
    "Qwen3-Next-80B-A3B (full-attention layers)": ("output gate", AttentionConfig(
        2048, 16, groups=2, head_dim=256, rope_dims=64, causal=True, qk_norm="head", qk_norm_eps=1e-6,
        output_gate=True)),
}  # fmt: skip


def norms_and_gates_models() -> pd.DataFrame:
    """One attention layer of each released model in :data:`NORMS_AND_GATES_MODELS`: its parameters and unidentified
    directions, and those of the same layer without its mechanism (plain softmax attention with its RoPE)."""
    rows = []
    for model, (mechanism, cfg) in NORMS_AND_GATES_MODELS.items():
        plain = cfg.with_(qk_norm="", qk_norm_eps=0.0, output_gate=False)
        c, p = count(cfg), count(plain)
        rows.append({"model": model, "mechanism": mechanism, "params": c.total_params, "unidentified": c.unidentified,
                     "without the mechanism": p.unidentified, "query-key": c.unidentified_by_block["qk"],
                     "value-output": c.unidentified_by_block["vo"],
                     "value-output without": p.unidentified_by_block["vo"]})  # fmt: skip
    return pd.DataFrame(rows)


def norms_and_gates_facts(table: pd.DataFrame, models: pd.DataFrame) -> dict:
    """The numbers the section's prose glues: agreements of the table's Jacobian counts with their closed forms, and
    the released layers' counts."""
    n_checks, n_agree = _agreements(table)
    by = models.set_index("model")
    scout, nope = by.loc["Llama-4-Scout-17B-16E (RoPE layers)"], by.loc["Llama-4-Scout-17B-16E (NoPE layers)"]
    gated = by.loc["Qwen3-Next-80B-A3B (full-attention layers)"]
    stablelm = by.loc["StableLM 2 12B"]
    return {
        "ng_checks": n_checks,
        "ng_agree": n_agree,
        "scout_rope": int(scout["unidentified"]),
        "scout_nope": int(nope["unidentified"]),
        "qwen_next_vo": int(gated["value-output"]),
        "qwen_next_vo_without": int(gated["value-output without"]),
        "stablelm_qk": int(stablelm["query-key"]),
        "stablelm_centring": _centring(NORMS_AND_GATES_MODELS["StableLM 2 12B"][1]),
        "stablelm_share": float(stablelm["unidentified"] / stablelm["params"]),
    }


def _centring(cfg: AttentionConfig) -> int:
    """The directions a LayerNorm per head frees by its centring alone: ``E`` per query head and per key head, one
    more per biased query head (:func:`attnid.counting.count`)."""
    return cfg.H * (cfg.E + ("q" in cfg.bias)) + cfg.G * cfg.E


def hybrid_table() -> pd.DataFrame:
    """One row per hybrid model among the family files (LFM2, Bamba, Qwen3-Next, Qwen3.5): its layers by kind, what
    one layer of each kind and the model-wide terms leave unidentified, and the whole model's count (chapter 9, layer
    kind by layer kind)."""
    rows = []
    for path in sorted(FAMILIES_DIR.glob("*.json")):
        p = config_preset(path)
        if p.model is None or not p.model.mixer_layers:
            continue
        ((mixer, n),) = p.model.mixer_layers  # one kind of layer beside attention in each family read
        block, model = scope_count(p, "block", path.stem), scope_count(p, "model", path.stem)
        per_mixer = count_mixer_block(mixer).unidentified
        rows.append({
            "file": path.stem, "family": p.hf_type, "attention layers": p.model.layers - n, "other layers": n,
            "other kind": mixer.mixer, "attention layer unidentified": block.unidentified,
            "other layer unidentified": per_mixer,
            "model-wide terms": model.unidentified - model.unidentified_by_block["blocks"] - n * per_mixer,
            "model params": model.total_params, "model unidentified": model.unidentified,
            "model share unidentified": model.unidentified / model.total_params,
        })  # fmt: skip
    return pd.DataFrame(rows)


QWEN3_NEXT = "qwen3-next-80b-a3b-instruct"


def hybrid_facts(hybrids: pd.DataFrame) -> dict:
    """The numbers the prose beside :func:`hybrid_table` glues."""
    row = hybrids.set_index("file")
    return {"lfm2_share": float(row.loc["lfm2-1.2b", "model share unidentified"]),
            "lfm2_conv_layer": int(row.loc["lfm2-1.2b", "other layer unidentified"]),
            "lfm2_attention_layer": int(row.loc["lfm2-1.2b", "attention layer unidentified"]),
            "bamba_share": float(row.loc["bamba-9b", "model share unidentified"]),
            "qwen_next_share": float(row.loc[QWEN3_NEXT, "model share unidentified"]),
            "qwen_next_deltanet_layer": int(row.loc[QWEN3_NEXT, "other layer unidentified"]),
            "qwen_next_attention_layer": int(row.loc[QWEN3_NEXT, "attention layer unidentified"]),
            "qwen3_5_share": float(row.loc["qwen3.5-4b", "model share unidentified"]),
            "qwen3_5_deltanet_layer": int(row.loc["qwen3.5-4b", "other layer unidentified"]),
            "qwen3_5_attention_layer": int(row.loc["qwen3.5-4b", "attention layer unidentified"]),
            "qwen3_5_moe_share": float(row.loc["qwen3.5-35b-a3b", "model share unidentified"])}  # fmt: skip
