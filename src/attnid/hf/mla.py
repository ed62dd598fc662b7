"""Multi-head latent attention (DeepSeek-V3's family) audited through its real module (:mod:`attnid.hf`): one
attention layer or one decoder layer, dense or a mixture of experts, against :func:`attnid.counting.count_mla`."""

from __future__ import annotations

import importlib
import types
import warnings
from dataclasses import asdict

import torch

from ..audit import (
    RTOL,
    AuditResult,
    audit_module,
    check_seed,
)
from ..counting import BlockConfig, MLAConfig, count_block, count_mla
from .build import _hidden_forward, _prepare, _router_float64, _transformers
from .scopes import (
    FLOAT64_NORMS,
    _block_batch,
    _check_built,
    _check_experts,
    _check_memory,
    _near_null,
    _positive_int,
    check_hf_audit,
)

# the index_topk of an audit with DeepSeek-V3.2's indexer: each query reads at most this many of the 8 keys
AUDIT_INDEX_TOPK = 4


def mla_family(cfg: MLAConfig) -> str:
    """The transformers family of ``cfg``: DeepSeek-V3.2 with an indexer, DeepSeek-V3 without."""
    return "deepseek_v32" if cfg.index_heads else "deepseek_v3"


def build_mla(cfg: MLAConfig, *, scope: str, ffn: int, experts: int, seed: int = 0):
    """``(module, forward)``: transformers' ``DeepseekV3Attention`` (``scope="attention"``) or
    ``DeepseekV3DecoderLayer`` (one MLP of inner size ``ffn``, or ``experts`` routed experts of that size, two
    chosen per token, and one shared) for ``cfg``, float64 with seeded random weights (:func:`_prepare`; the
    router's weights in float64), run on hidden states; DeepSeek-V3.2's, its indexer choosing
    :data:`AUDIT_INDEX_TOPK` keys per query, where ``cfg`` has an indexer (run with a causal mask, which its code
    needs)."""
    tf = _transformers()
    family = mla_family(cfg)
    prefix = "DeepseekV32" if cfg.index_heads else "DeepseekV3"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    indexer = (dict(index_n_heads=cfg.index_heads, index_head_dim=cfg.index_dim, index_topk=AUDIT_INDEX_TOPK)
               if cfg.index_heads else {})  # fmt: skip
    config = getattr(tf, f"{prefix}Config")(**indexer, **dict(
        vocab_size=16, hidden_size=cfg.embed, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
        q_lora_rank=cfg.q_rank, kv_lora_rank=cfg.kv_rank, qk_nope_head_dim=cfg.nope_dim,
        qk_rope_head_dim=cfg.rope_dim, v_head_dim=cfg.v_dim, rms_norm_eps=cfg.norm_eps, attention_bias=False,
        num_hidden_layers=1, attention_dropout=0.0, attn_implementation="sdpa", intermediate_size=ffn,
        moe_intermediate_size=ffn, n_routed_experts=max(experts, 1), num_experts_per_tok=min(2, max(experts, 1)),
        n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=0 if experts else 1,
    ))  # fmt: skip
    config._experts_implementation = "eager"  # a model sets it; the layer alone runs the experts' own loop
    layer = getattr(mod, f"{prefix}Attention" if scope == "attention" else f"{prefix}DecoderLayer")
    module = _prepare(layer(config, 0), cfg.embed, seed, norm_eps=cfg.norm_eps)
    for m in module.modules():
        if type(m).__name__ == f"{prefix}TopkRouter":
            m.forward = types.MethodType(_router_float64(m.forward), m)
    return module, _hidden_forward(getattr(mod, f"{prefix}RotaryEmbedding")(config=config), eager=bool(cfg.index_heads))


def _mla_block_size(cfg: MLAConfig, scope: str, ffn: int | None, experts: int) -> int:
    """Check the scope and MLP arguments of :func:`audit_mla_hf`; the MLP (or each expert's) inner size."""
    if scope not in ("attention", "block"):
        raise ValueError(f"scope: latent attention is audited at scope attention or block, not {scope!r}")
    if scope == "attention" and (ffn is not None or experts):
        raise ValueError("ffn/experts: the attention module has no MLP; audit a block")
    if isinstance(experts, bool) or not isinstance(experts, int) or experts < 0 or experts == 1:
        raise ValueError(f"experts: 0 (one MLP) or at least 2 (two chosen per token), got {experts!r}")
    ffn = (cfg.embed // 2 if experts else 2 * cfg.embed) if ffn is None else ffn
    _positive_int("ffn", ffn)
    return ffn


def audit_mla_hf(
    cfg: MLAConfig, *, seed: int = 0, rtol: float = RTOL, check: bool = True, scope: str = "attention",
    ffn: int | None = None, experts: int = 0, progress: bool = False,
) -> AuditResult:  # fmt: skip
    """Audit transformers' DeepSeek-V3 multi-head latent attention (``scope="attention"``, chapter 9) or its
    whole decoder layer (``scope="block"``: one MLP of inner size ``ffn``, or with ``experts >= 2`` a mixture of
    that many routed experts of inner size ``ffn``, two chosen per token, and one shared expert) built for
    ``cfg`` in float64 (its RMSNorms at ``ε = cfg.norm_eps``, its router's weights in float64), with seeded
    random weights, on causal self-attention: ``unidentified`` from the Jacobian rank,
    ``details["theory_unidentified"]`` and ``details["terms"]`` from :func:`attnid.counting.count_mla` or
    :func:`attnid.counting.count_block`. With ``check`` a difference or a gap under ``MIN_GAP`` raises
    :class:`HFAuditError`. ``progress``: a progress bar on stderr while the Jacobian is built."""
    check_seed(seed)
    ffn = _mla_block_size(cfg, scope, ffn, experts)
    block = BlockConfig(
        cfg, ffn, norm="rms", mlp="swiglu", mlp_bias=False, experts=experts, shared_ffn=ffn if experts else 0
    )
    # the closed form first: it refuses shapes outside its assumptions before anything is built
    theory = count_mla(cfg) if scope == "attention" else count_block(block)
    n = theory.total_params
    L = 8
    B = _block_batch(cfg.embed, L, n)
    family = mla_family(cfg)
    _check_memory(f"{family} {scope}", cfg.embed, n, B * L * cfg.embed, None, "--embed, --heads, ranks or --ffn")
    module, forward = build_mla(cfg, scope=scope, ffn=ffn, experts=experts, seed=seed)
    _check_built(family, module, n)
    x = torch.randn(B, L, cfg.embed, generator=torch.Generator().manual_seed(10_000 + seed), dtype=torch.float64)
    if experts:
        _check_experts(module, forward, x, experts)
    res = audit_module(module, (x,), forward=forward, rtol=rtol, progress=progress)
    prefix = "DeepseekV32" if cfg.index_heads else "DeepseekV3"
    layer = f"{prefix}Attention" if scope == "attention" else f"{prefix}DecoderLayer"
    res.details.update(
        hf_type=family, scope=scope, module=f"transformers.models.{family}.{layer}",
        transformers=_transformers().__version__, theory_unidentified=theory.unidentified,
        terms=theory.unidentified_by_block, config=asdict(cfg), batch=B, seq_len=L, seed=seed,
        near_null=_near_null(res), norm_eps=cfg.norm_eps,
    )  # fmt: skip
    if scope == "block":
        res.details.update(ffn=ffn, experts=experts, norms=FLOAT64_NORMS)
    if check:
        check_hf_audit(res)
    return res
