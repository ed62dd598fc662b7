"""Chapter 9, the mechanisms of 2025–2026 models (sinks, NoPE layers, a soft-capped untied head, routed experts)
against the Jacobian of our layer and of the real module, and released config files read as downloaded."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from ..attention import AttentionConfig
from ..audit import audit
from ..configs import CONFIG_DIR, ConfigError, config_preset
from ..counting import count
from ..presets import layer_type_counts, scope_count

READS: tuple[str, ...] = ()  # no run records: everything here is computed from the math and the config files
RELEASED_DIR = CONFIG_DIR / "released"

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
        row = {
            "mechanism": label,
            "closed form": count(cfg).unidentified,
            "closed form without": count(without).unidentified,
            "our layer": audit(cfg, method="dense", seed=seed).unidentified,
            "our layer without": audit(without, method="dense", seed=seed).unidentified,
        }
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
        attn, kinds = scope_count(p, "attention", name), layer_type_counts(p)
        row: dict[str, Any] = {"file": name, "family": p.hf_type, "attention unidentified": attn.unidentified,
                               "NoPE layer unidentified": kinds["nope"].unidentified if kinds else None}  # fmt: skip
        for scope in ("block", "model"):
            c = scope_count(p, scope, name) if p.model is not None else None
            row[f"{scope} params"] = None if c is None else c.total_params
            row[f"{scope} unidentified"] = None if c is None else c.unidentified
        row["fields accepted as neutral"] = len(p.reading["neutral"]) if p.reading else 0
        rows.append(row)
    return pd.DataFrame(rows)


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
    checks = [(f, j) for f, j in (("closed form", "our layer"), ("closed form without", "our layer without"),
                                   ("closed form", "real module"), ("closed form without", "real module without"))
              if j in mechanisms]  # fmt: skip
    pairs = [(a, b) for f, j in checks for a, b in zip(mechanisms[f], mechanisms[j]) if pd.notna(a) and pd.notna(b)]
    out["n_checks"] = len(pairs)
    out["n_agree"] = sum(int(a) == int(b) for a, b in pairs)
    return out
