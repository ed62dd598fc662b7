"""Published architectures verified through their real modules (:mod:`attnid.hf`): each preset (or a released
config) audited at a small structure of its own (its groups, rotary dims, biases and norms), at attention or
block scope."""

from __future__ import annotations

import sys
from collections.abc import Callable

from ..attention import AttentionConfig
from ..audit import (
    AuditResult,
)
from ..counting import MLAConfig
from ..families import (
    HF_TYPES,
)
from ..presets import Preset
from .mla import audit_mla_hf
from .scopes import audit_hf


def small_structure(cfg: AttentionConfig) -> dict:
    """The structure of ``cfg`` at a width a dense audit handles in about a second: the same kind of
    key/value sharing (MHA, GQA or MQA), the same biases, and RoPE on all, part or none of each head;
    4 heads of size 4, or under partial RoPE heads of size 8 (so that the rotated share can be 1/4, 1/2
    or 3/4 of a head), 2 of them for MHA (E = 16 either way). Returns :func:`audit_hf` keyword arguments."""
    partial = 0 < cfg.R < cfg.D
    head_dim = 8 if partial else 4
    n = cfg.H // cfg.G
    if n == 1:  # multi-head: every head its own keys and values
        heads = groups = 2 if partial else 4
    elif cfg.G == 1:  # multi-query
        heads, groups = 4, 1
    else:  # grouped-query
        heads, groups = 4, 2
    kw = dict(embed=heads * head_dim, heads=heads, groups=groups, bias=cfg.bias or "none")
    if cfg.rope:
        share = cfg.R / cfg.D
        kw["rope_dims"] = head_dim if share == 1 else min(head_dim - 2, max(2, 2 * round(share * head_dim / 2)))
    return kw


def small_block_structure(p: Preset) -> dict:
    """The structure of preset ``p`` as a whole decoder layer at ``E = 8``, where a dense audit of the
    layer takes about a second: the same sharing (2 heads for MHA, 4 heads in 1 or 2 groups for MQA/GQA),
    the same biases, RoPE on all, part (one head of 8 dims) or none of each head, and the preset's MLP
    ratio ``F/E``; heads of 4 dims at least under a QK-norm without a weight or a LayerNorm per head (a normalised
    pair keeps only its angle). Returns :func:`audit_hf` keyword arguments."""
    cfg = p.config
    assert isinstance(cfg, AttentionConfig)  # latent attention: small_mla
    kw = small_structure(cfg)
    if 0 < cfg.R < cfg.D:  # partial RoPE: one head of 8 dims keeps the rotated share
        kw.update(embed=8, heads=1, groups=1)
    elif kw["heads"] == kw["groups"]:
        kw.update(embed=8, heads=2, groups=2)
    else:
        kw.update(embed=8)
    if cfg.qk_norm in ("l2", "layer") and kw["embed"] // kw["heads"] < 4:  # a normalised pair is a mere angle
        assert p.hf_type is not None
        if HF_TYPES[p.hf_type].head_dim:
            kw["head_dim"] = 4
        else:
            kw["embed"] = 4 * kw["heads"]
    if cfg.rope and cfg.R == cfg.D:
        kw["rope_dims"] = kw.get("head_dim", kw["embed"] // kw["heads"])
    assert p.model is not None
    kw["ffn"] = max(1, round(p.model.ffn / cfg.E * kw["embed"]))
    if p.model.experts:  # each of the four audited experts half as wide as the stream: seconds, not minutes
        kw["ffn"] = kw["embed"] // 2
    return kw


def small_mla(cfg: MLAConfig) -> MLAConfig:
    """Latent attention of ``cfg``'s structure at ``E = 12`` (two heads, latents of rank 5, a query latent only
    where ``cfg`` has one), where a dense audit of it, or of its layer, takes seconds."""
    return MLAConfig(12, 2, kv_rank=5, q_rank=None if cfg.q_rank is None else 5, nope_dim=3, rope_dim=2, v_dim=3)


def structure_audit(p: Preset, scope: str, name: str) -> tuple[tuple, Callable[[int], AuditResult]]:
    """``(key, run)``: what audits the structure of ``p`` (a preset, or a config read by
    :func:`attnid.configs.config_preset`, called ``name`` in errors) at ``scope``, through its family's real
    module at a small width (presets with equal keys share one audit), and ``run(seed)`` that does it."""
    if p.hf_type is None:
        raise ValueError(f"hf: attnid builds no transformers module for {name} (it counts its attention only)")
    if scope not in ("attention", "block"):
        raise ValueError(f"scope: a structure is audited at scope attention or block, not {scope!r}")
    if scope == "block" and p.model is None:
        raise ValueError(f"scope: {name} has no block structure attnid counts")
    if isinstance(p.config, MLAConfig):
        small = small_mla(p.config)
        experts = 4 if scope == "block" and p.model is not None and p.model.experts else 0
        return (p.hf_type, scope, small, experts), lambda seed: audit_mla_hf(
            small, seed=seed, scope=scope, experts=experts
        )
    kw = small_structure(p.config) if scope == "attention" else small_block_structure(p)
    kw["qk_norm"] = p.config.qk_norm  # where the family's config can switch its QK-norm (StableLM 2, Llama 4)
    if scope == "block" and p.model is not None and p.model.residual is not None:
        kw["residual"] = p.model.residual  # where the family's config chooses its wiring (Falcon)
    if not HF_TYPES[p.hf_type].groups and kw["groups"] != kw["heads"]:
        raise ValueError(f"preset: {name} shares keys across heads, which {p.hf_type} cannot express")
    return (p.hf_type, scope, tuple(sorted(kw.items()))), lambda seed: audit_hf(p.hf_type, seed=seed, scope=scope, **kw)


def verify_preset(name: str, *, seed: int = 0, scope: str = "attention") -> AuditResult:
    """Audit the structure of preset ``name`` through its real ``transformers`` module: its attention
    (:func:`small_structure`, :func:`small_mla`) or, with ``scope="block"``, its whole decoder layer
    (:func:`small_block_structure`; a mixture of four experts for a mixture-of-experts model); raises
    :class:`HFAuditError` unless the Jacobian count equals the closed form."""
    from ..presets import lookup

    name, p = lookup(name)
    return structure_audit(p, scope, name)[1](seed)


def verify_presets(
    names: list[str] | None = None, *, seed: int = 0, progress: bool = False, scope: str = "attention"
) -> dict[str, AuditResult | None]:
    """:func:`verify_preset` for every preset of :data:`attnid.presets.PRESETS` (or ``names``, which may name
    latent-attention presets) at ``scope``; presets without a model type (or, for blocks, without a counted
    block) map to ``None``. Presets that share a structure and a model type share one audit. ``progress``: a
    bar on stderr (which leaves a JSON answer on stdout intact)."""
    from ..presets import ALL_PRESETS, PRESETS

    done: dict[tuple, AuditResult] = {}
    out: dict[str, AuditResult | None] = {}
    todo = names or list(PRESETS)
    if progress:
        from tqdm.auto import tqdm

        todo = tqdm(todo, desc=f"verifying presets ({scope})", unit="preset", file=sys.stderr)
    for name in todo:
        p = ALL_PRESETS[name]
        if p.hf_type is None or (scope == "block" and p.model is None):
            out[name] = None
            continue
        key, run = structure_audit(p, scope, name)
        if key not in done:
            done[key] = run(seed)  # raises HFAuditError on a difference
        out[name] = done[key]
    return out
