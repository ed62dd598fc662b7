"""The three audit scopes of a Hugging Face module (:mod:`attnid.hf`): one attention layer, one decoder layer,
a whole causal LM (:func:`audit_hf`), each checked against its closed form (:func:`check_hf_audit`), with the
guards that run before anything is built (memory, sizes) and after (experts and ReLU units excited)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..attention import AttentionConfig
from ..audit import (
    RTOL,
    AuditResult,
    audit_module,
    available_memory,
    check_seed,
    default_data_size,
    default_seq_len,
    memory_estimate,
)
from ..config_fields import MLP_BIAS_SWITCHES
from ..counting import SCOPES, Count, count, count_block, count_model
from ..families import (
    HF_TYPES,
    block_config,
    default_ffn,
    default_vocab,
    equivalent_config,
    model_config,
)
from .build import (
    POSITION_MAPS,
    HFAuditError,
    _is_router,
    _transformers,
    build_attention,
    build_block,
    build_model,
    implementation_of,
)

MIN_GAP = 1e6  # a rank decision with a smaller singular-value gap is not trusted
# an audit of a real module reads at least this many informative outputs (per token: E, or H C for an attention layer)
# per parameter: two keep every gap of the test shapes above MIN_GAP (tests/test_blocks.py, tests/test_hf.py and the
# other real-module tests) at two thirds of the cost of three
BLOCK_DATA_RATIO = 2


def _positive_int(name: str, v) -> None:
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        raise ValueError(f"{name} must be a positive integer, got {v!r}")


NEAR_NULL_BAND = (1e-9, 1e-5)  # singular values this far below the largest are reported as near-null


RELU_MIN_SHARE = 0.01  # a ReLU unit active (or inactive) on fewer of the audit's tokens is barely excited


def _check_relu_units(model: torch.nn.Module, forward: Callable, ids: torch.Tensor) -> None:
    """Refuse a model audit in which a ReLU unit hardly ever switches on the audit's tokens: a unit that is
    always off (or on) makes its weights unidentified (or linear), so the count would describe the data,
    not the architecture. Inside a tiny LM the first layers see few distinct inputs, so it happens."""
    shares = []
    hooks = [m.register_forward_hook(lambda mod, i, o: shares.append((o > 0).double().reshape(-1, o.shape[-1]).mean(0)))
             for name, m in model.named_modules() if name.endswith("fc1")]  # fmt: skip
    with torch.no_grad():
        forward(lambda **kw: model(**kw), ids)
    for h in hooks:
        h.remove()
    for layer, share in enumerate(shares):
        worst = float(torch.minimum(share, 1 - share).min())
        if worst < RELU_MIN_SHARE:
            raise HFAuditError(
                f"relu: a unit of layer {layer} switches on only {worst:.1%} of the audit's tokens, so its weights "
                "are barely excited and the count would describe the data, not the architecture; try another --seed"
            )


def _check_memory(what: str, E: int, n: int, n_out: int, max_memory: float | None, smaller: str) -> None:
    """Refuse an audit of ``what`` whose dense Jacobian (``n`` parameters, ``n_out`` outputs) would need more than
    ``max_memory`` bytes (default: the memory available); read from the closed form, before anything is built."""
    need, free = memory_estimate(n, n_out, "dense"), available_memory()
    limit = free if max_memory is None else max_memory
    if limit is not None and need > limit:
        raise ValueError(
            f"hf: auditing the {what} at E = {E} needs about {need / 2**30:,.3g} GiB ({n:,} parameters, "
            f"{n_out:,} outputs), more than the {limit / 2**30:.3g} GiB available (free memory, ulimit -v and the "
            f"cgroup limit); use a smaller {smaller}"
        )


def _check_built(hf_type: str, module: torch.nn.Module, n: int) -> None:
    built = sum(p.numel() for p in module.parameters())
    if built != n:
        raise HFAuditError(f"{hf_type}: the module has {built} parameters, the closed form counts {n}")


def _near_null(res: AuditResult) -> int:
    """The number of singular values within :data:`NEAR_NULL_BAND` of the largest."""
    sv = torch.tensor(res.singular_values or [1.0])
    rel = sv / sv[0]
    lo, hi = NEAR_NULL_BAND
    return int(((rel > lo) & (rel <= hi)).sum())


@dataclass
class ScopeAudit:
    """One scope's audit before it runs (:data:`SCOPE_AUDITS`): the closed form, the module's name, the data's size,
    how to build the module and draw its input, and the settings the result's details add."""

    theory: Count
    module_name: str
    batch: int
    seq_len: int
    outputs_per_token: int
    smaller: str  # the flags that make the audit smaller (a refusal for memory names them)
    build: Callable[[], tuple[torch.nn.Module, Callable]]
    inputs: Callable[[torch.Generator], torch.Tensor]
    details: dict = field(default_factory=dict)
    check_inputs: Callable[[torch.nn.Module, Callable, torch.Tensor], None] | None = None


def _attention_scope(
    hf_type: str, cfg: AttentionConfig, *, seed: int, attn_implementation: str, positions: str = "text", **_
) -> ScopeAudit:
    """The attention module alone: :func:`attnid.counting.count` of the equivalent config, data of
    :func:`attnid.audit.default_data_size` at :data:`BLOCK_DATA_RATIO` outputs per parameter."""
    t = HF_TYPES[hf_type]
    theory = count(cfg)
    B, L = default_data_size(cfg, theory.total_params, ratio=BLOCK_DATA_RATIO)
    return ScopeAudit(
        theory,
        f"transformers.models.{t.module}.{t.attention}",
        B,
        L,
        cfg.E,
        "--embed",
        build=lambda: build_attention(
            hf_type, cfg, seed=seed, attn_implementation=attn_implementation, positions=positions
        ),
        inputs=lambda gen: torch.randn(B, L, cfg.E, generator=gen, dtype=torch.float64),
        # the implementation that ran: a soft-capping type runs eager whatever was asked (sdpa cannot cap)
        details=dict(attn_implementation="eager" if t.eager else attn_implementation),
    )


def _block_batch(E: int, L: int, n: int) -> int:
    """Sequences of length ``L`` in a block's or a model's data (latent attention's too): each token carries at most
    ``E`` informative outputs (the final norm's width, for a model), and the audit reads ``BLOCK_DATA_RATIO`` of
    them per parameter."""
    return max(2, -(-BLOCK_DATA_RATIO * n // (E * L)))


def _block_size(cfg: AttentionConfig, n: int, words: int = 0) -> tuple[int, int]:
    """Batch and length of a block's or a model's data (:func:`_block_batch` at the audit's sequence length), with
    :data:`TOKENS_PER_WORD` tokens for each of a model's ``words``."""
    L = default_seq_len(cfg)
    return max(_block_batch(cfg.E, L, n), -(-TOKENS_PER_WORD * words // L)), L


def _check_layer_norm_width(hf_type: str, cfg: AttentionConfig) -> None:
    if HF_TYPES[hf_type].norm in ("layer", "layer_noshift") and cfg.E < 4:
        raise ValueError(
            f"embed: a LayerNorm over {cfg.E} feature(s) leaves too little to tell directions apart (E = 1 is "
            "constant, E = 2 a sign, E = 3 gives no clear gap); use --embed 4 or more"
        )


# a model audit's data holds at least this many tokens per word of its vocabulary: with fewer, a word's embedding row
# (seen only where the word occurs) can be under-excited and the count describe the data (Command R at seed 1)
TOKENS_PER_WORD = 8

AUDIT_EXPERTS = 4  # a mixture-of-experts layer is audited with four experts, two chosen per token


def _block_scope(
    hf_type: str, cfg: AttentionConfig, *, seed: int, ffn: int | None, norm_eps: float, positions: str = "text",
    residual: str | None = None, **_,
) -> ScopeAudit:  # fmt: skip
    """One whole decoder layer (wired ``residual``; None: the type's own): :func:`attnid.counting.count_block`."""
    _check_layer_norm_width(hf_type, cfg)
    t = HF_TYPES[hf_type]
    F = default_ffn(hf_type, cfg.E) if ffn is None else ffn
    if t.fixed_ffn and default_ffn(hf_type, cfg.E) != F:
        raise ValueError(f"ffn: {hf_type}'s code fixes the MLP's inner size to {default_ffn(hf_type, cfg.E)} "
                         f"({t.ffn_ratio:g} x embed); drop --ffn")  # fmt: skip
    if hf_type in MLP_BIAS_SWITCHES and cfg.bias:
        raise ValueError(f"bias: {hf_type}'s {MLP_BIAS_SWITCHES[hf_type]} puts biases on its gated MLP too, a decoder "
                         "layer attnid does not count; audit its attention")  # fmt: skip
    k = AUDIT_EXPERTS if t.moe else 0
    theory = count_block(block_config(hf_type, cfg, F, norm_eps_zero=norm_eps == 0, experts=k, residual=residual))
    B, L = _block_size(cfg, theory.total_params)
    return ScopeAudit(
        theory,
        f"transformers.models.{t.module}.{t.layer}",
        B,
        L,
        cfg.E,
        "--embed, --ffn",
        build=lambda: build_block(
            hf_type, cfg, ffn=F, seed=seed, norm_eps=norm_eps, experts=k, positions=positions, residual=residual
        ),
        inputs=lambda gen: torch.randn(B, L, cfg.E, generator=gen, dtype=torch.float64),
        details=dict(
            attn_implementation=implementation_of(hf_type), ffn=F, norms=FLOAT64_NORMS, **({"experts": k} if k else {})
        ),
        check_inputs=(lambda m, f, x: _check_experts(m, f, x, k)) if k else None,
    )


def _model_scope(
    hf_type: str,
    cfg: AttentionConfig,
    *,
    seed: int,
    ffn: int | None,
    layers: int | None,
    vocab: int | None,
    tied: bool | None,
    norm_eps: float,
    final_softcap: float | None = None,
    residual: str | None = None,
    **_,
) -> ScopeAudit:
    """A causal LM read through ``log_softmax``: :func:`attnid.counting.count_model`; its vocabulary must show the
    stream (and, with a parallel residual, the first MLP), and a ReLU unit must switch on the audit's tokens."""
    _check_layer_norm_width(hf_type, cfg)
    t = HF_TYPES[hf_type]
    F = default_ffn(hf_type, cfg.E) if ffn is None else ffn
    least = default_vocab(hf_type, cfg.E, F, residual)
    V = least if vocab is None else vocab
    if V <= cfg.E:
        raise ValueError(
            f"vocab: {V} tokens show the {cfg.E}-dimensional stream through only {V - 1} log-probabilities, too few "
            f"to identify it (the count would describe the data); use more than {cfg.E} (default {least})"
        )
    if tied and t.head_bias:
        raise ValueError(f"tied: the {hf_type} LM head has a bias, so it cannot be tied to the embedding")
    if t.residual_of(residual) != "sequential" and least > V:
        raise ValueError(
            f"vocab: in a {hf_type} model the first layer's MLP reads the token embedding alone, so a vocabulary of "
            f"{V} leaves it under-determined and the count would describe the data; use at least {least} "
            "(the default)"
        )
    tie, layers = t.tied if tied is None else tied, 1 if layers is None else layers
    shape: dict[str, Any] = dict(ffn=F, layers=layers, vocab=V, tied=tie, seq_len=default_seq_len(cfg),
                                 norm_eps=norm_eps, final_softcap=final_softcap, residual=residual)  # fmt: skip
    theory = count_model(model_config(hf_type, cfg, **shape))
    B, L = _block_size(cfg, theory.total_params, words=V)
    return ScopeAudit(
        theory,
        f"transformers.{t.lm}",
        B,
        L,
        V,
        "--embed, --ffn, --vocab or --layers",
        build=lambda: build_model(hf_type, cfg, **shape, seed=seed),
        inputs=lambda gen: torch.randint(0, V, (B, L), generator=gen),
        details=dict(
            attn_implementation=implementation_of(hf_type),
            ffn=F,
            norms=FLOAT64_NORMS,
            layers=layers,
            vocab=V,
            tied=tie,
            final_softcap=final_softcap,
        ),
        check_inputs=_check_relu_units if t.mlp == "relu" else None,
    )


SCOPE_AUDITS: dict[str, Callable[..., ScopeAudit]] = {
    "attention": _attention_scope,
    "block": _block_scope,
    "model": _model_scope,
}
FLOAT64_NORMS = "float64 (transformers' RMSNorm float32 cast patched out)"


def _check_hf_arguments(
    hf_type: str, scope: str, *, seed, ffn, layers, vocab, tied, norm_eps, attn_implementation, normed: bool
) -> None:
    """Refuse, naming it, an argument that is out of range or that the asked scope does not have."""
    check_seed(seed)
    if scope not in SCOPES:
        raise ValueError(f"scope: expected one of {', '.join(SCOPES)}, got {scope!r}")
    for name, v in (("ffn", ffn), ("layers", layers), ("vocab", vocab)):
        _positive_int(name, v)
    if isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)) or not 0 <= norm_eps < 1:
        raise ValueError(f"norm_eps must be a number in [0, 1), got {norm_eps!r}")
    given = [name for name, v in (("layers", layers), ("vocab", vocab), ("tied", tied)) if v is not None]
    if scope != "model" and given:
        raise ValueError(f"{'/'.join(given)}: only a whole-model audit (scope 'model', --model) has them")
    if scope == "attention" and ffn is not None:
        raise ValueError("ffn: the attention module has no MLP; audit a block or a model (--block, --model)")
    if scope == "attention" and norm_eps != 0 and not normed:
        raise ValueError(f"norm_eps: {hf_type}'s attention has no norm; audit a block or a model (--block, --model)")
    if scope != "attention" and attn_implementation != "sdpa":
        raise ValueError("attn_implementation: blocks and models are audited through sdpa only")
    if scope != "attention" and not HF_TYPES[hf_type].layer:
        raise ValueError(f"scope: attnid has no closed form for {hf_type}'s decoder layer; audit its attention")
    if scope == "model":
        _check_whole_model(hf_type)


def _check_whole_model(hf_type: str) -> None:
    """Refuse, with the reason, a whole-model audit of a type whose model is not built or not counted here."""
    t = HF_TYPES[hf_type]
    if t.mrope and not t.lm:
        raise ValueError(f"scope: transformers builds a whole {hf_type} model with its vision tower, and its text "
                         "model has no causal-LM class of its own to audit; audit a layer (--block)")  # fmt: skip
    if not t.lm:
        raise ValueError(f"scope: attnid has no closed form for a whole {hf_type} model; audit a layer (--block)")
    if t.embedding_norm:
        raise ValueError(f"scope: a {hf_type} model has a LayerNorm on its token embeddings, which attnid does not "
                         "count; audit a layer (--block)")  # fmt: skip
    if t.moe:
        raise ValueError(f"scope: a {hf_type} model is audited layer by layer (--block: its mixture of experts); its "
                         "model count adds the terms of chapter 8")  # fmt: skip


def _position_map(hf_type: str, scope: str, positions: str) -> dict:
    """The positions an audit feeds (:data:`POSITION_MAPS`): a multimodal map only to an M-RoPE layer (Qwen2.5-VL's,
    Qwen3-VL's) at scope attention or block, refused by name elsewhere."""
    if positions not in POSITION_MAPS:
        raise ValueError(f"positions: expected one of {', '.join(POSITION_MAPS)}, got {positions!r}")
    if positions != "text" and not (HF_TYPES[hf_type].mrope and scope != "model"):
        raise ValueError(f"positions: a {positions} position map is read by an M-RoPE layer only (qwen2_5_vl, "
                         f"qwen3_vl, at scope attention or block), not by {hf_type} at scope {scope}")  # fmt: skip
    return {} if positions == "text" else {"positions": positions}


def _scope_extras(scope: str, nope: bool, final_softcap: float | None, hf_type: str, residual: str | None) -> dict:
    """The settings only some scopes have, refused by name elsewhere: the logits' cap (a model's), a NoPE layer (an
    attention layer's or a block's), the residual wiring (a block's or a model's, where the type's config chooses
    it: :meth:`attnid.families.HFType.residual_of`)."""
    if residual is not None and scope == "attention":
        raise ValueError("residual: the attention module has no residual wiring; audit a block or a model")
    if residual is not None:
        HF_TYPES[hf_type].residual_of(residual)
    if final_softcap is not None and scope != "model":
        raise ValueError("final_softcap: the logits' cap belongs to a whole model (scope 'model')")
    if nope and scope == "model":
        raise ValueError("nope: a model audit builds the type's own layers (audit one NoPE layer at scope attention "
                         "or block)")  # fmt: skip
    return ({"final_softcap": final_softcap} if scope == "model" else {}) | (
        {"residual": residual} if residual is not None else {}
    )


def audit_hf(
    hf_type: str, *, embed: int = 32, heads: int = 4, groups: int | None = None, head_dim: int | None = None,
    rope_dims: int | None = None, bias: str | None = None, seed: int = 0, rtol: float = RTOL, check: bool = True,
    attn_implementation: str = "sdpa", max_memory: float | None = None, scope: str = "attention",
    ffn: int | None = None, layers: int | None = None, vocab: int | None = None, tied: bool | None = None,
    norm_eps: float = 0.0, progress: bool = False, nope: bool = False, final_softcap: float | None = None,
    qk_norm: str | None = None, positions: str = "text", residual: str | None = None,
) -> AuditResult:  # fmt: skip
    """Audit a real ``hf_type`` module at a small width: ``unidentified`` from the Jacobian rank,
    ``details["theory_unidentified"]`` from the closed form.

    ``scope``: ``"attention"`` (the attention module; :func:`attnid.counting.count` of the equivalent
    config), ``"block"`` (one whole decoder layer with MLP inner size ``ffn``, default
    :func:`default_ffn`; :func:`attnid.counting.count_block`) or ``"model"`` (a causal LM of ``layers``
    layers (default 1), ``vocab`` tokens (default :func:`default_vocab`), the type's head tying unless ``tied`` is
    given, read through ``log_softmax``; :func:`attnid.counting.count_model`). Every norm of the module (QK-norm,
    the block's and the model's) computes at ``ε = norm_eps``.
    ``details["terms"]`` holds the closed form term by term, ``details["near_null"]`` the number of singular values
    in :data:`NEAR_NULL_BAND` below the largest (with ``ε > 0`` the stream's scale direction lands there).

    The way of an audit: checked arguments; the scope's :class:`ScopeAudit` (closed form, data size: an audit needing
    over ``max_memory`` bytes, default the memory available, is refused before anything is allocated); the module;
    its Jacobian; with ``check``, :func:`check_hf_audit` (a difference or a gap under ``MIN_GAP`` raises
    :class:`HFAuditError`). ``progress``: a large audit says on stderr what it is doing (stdout stays free for JSON).
    ``nope``: the audited layer is one without RoPE (SmolLM3's NoPE layers). ``final_softcap``: a model audit's
    logits capped at that value (Gemma 2's ``final_logit_softcapping``). ``qk_norm``: a QK-norm the type's config can
    switch on (StableLM 2's ``qk_layernorm``, Cohere's ``use_qk_norm``: ``"layer"``); None: the type's default.
    ``positions``: ``"text"``, or for an M-RoPE type (Qwen2.5-VL) ``"grid"``, a multimodal position map
    (:func:`attnid.hf.build.grid_positions`), at scope attention or block. ``residual``: a block's or a model's
    wiring where the type's config chooses it (Falcon: ``"shared_norm"``, ``"parallel"``, ``"sequential"``); None:
    the type's own.
    """
    cfg = equivalent_config(  # refuses an unknown type and a shape the type cannot express
        hf_type, embed=embed, heads=heads, groups=groups, head_dim=head_dim, rope_dims=rope_dims, bias=bias,
        norm_eps=norm_eps, nope=nope, qk_norm=qk_norm,
    )  # fmt: skip
    sizes = dict(ffn=ffn, layers=layers, vocab=vocab, tied=tied, norm_eps=norm_eps)
    _check_hf_arguments(hf_type, scope, seed=seed, attn_implementation=attn_implementation, normed=bool(cfg.qk_norm),
                        **sizes)  # fmt: skip
    extra = {**_scope_extras(scope, nope, final_softcap, hf_type, residual), **_position_map(hf_type, scope, positions)}
    plan = SCOPE_AUDITS[scope](hf_type, cfg, seed=seed, attn_implementation=attn_implementation, **sizes, **extra)
    n = plan.theory.total_params
    _check_memory(
        f"{hf_type} {scope}", cfg.E, n, plan.batch * plan.seq_len * plan.outputs_per_token, max_memory, plan.smaller
    )
    module, forward = plan.build()
    _check_built(hf_type, module, n)
    x = plan.inputs(torch.Generator().manual_seed(10_000 + seed))
    if plan.check_inputs is not None:
        plan.check_inputs(module, forward, x)
    res = audit_module(module, (x,), forward=forward, rtol=rtol, progress=progress)
    res.details.update(_details(hf_type, scope, cfg, plan, seed=seed, near_null=_near_null(res), norm_eps=norm_eps,
                                **({"positions": positions} if HF_TYPES[hf_type].mrope else {}),
                                **({"residual": HF_TYPES[hf_type].residual_of(residual)} if scope != "attention"
                                   and HF_TYPES[hf_type].other_residuals else {})))  # fmt: skip
    if check:
        check_hf_audit(res)
    return res


def _details(hf_type: str, scope: str, cfg: AttentionConfig, plan: ScopeAudit, **settings) -> dict:
    """What an audit of a real module adds to its result's details: the module, the closed form term by term, the
    structure and data it was audited at, ``settings``, and the scope's own settings."""
    return dict(
        hf_type=hf_type,
        scope=scope,
        module=plan.module_name,
        transformers=_transformers().__version__,
        theory_unidentified=plan.theory.unidentified,
        terms=plan.theory.unidentified_by_block,
        config=dict(E=cfg.E, H=cfg.H, G=cfg.G, D=cfg.D, C=cfg.C, R=cfg.R, bias=cfg.bias or "none"),
        batch=plan.batch,
        seq_len=plan.seq_len,
        **settings,
        **plan.details,
    )


def check_hf_audit(res: AuditResult) -> None:
    """Raise :class:`HFAuditError` unless the audit of a real module (:func:`audit_hf`, :func:`audit_mla_hf`) shows a
    clear gap and its Jacobian count equals the closed form in ``res.details``."""
    d = res.details
    norm_eps = d["norm_eps"]
    if res.sv_gap < MIN_GAP:
        raise HFAuditError(
            f"{d['hf_type']}: the Jacobian's singular values have no clear gap at rank {res.rank} (gap "
            f"{res.sv_gap:.1e} < {MIN_GAP:.0e}, {d['near_null']} near-null): "
            + (
                "the module computes part of the layer in float32, or these weights leave an identified direction "
                "nearly flat (try another --seed); its count cannot be read off"
                if norm_eps == 0
                else f"with ε = {norm_eps:g} a norm's scale is only nearly a symmetry; audit with ε = 0"
            )
        )
    if res.unidentified != d["theory_unidentified"]:
        raise HFAuditError(
            f"{d['hf_type']}: the Jacobian gives {res.unidentified} unidentified parameters, the closed form "
            f"{d['theory_unidentified']} (scope {d['scope']}, config {d['config']})"
        )


MIN_EXPERT_SHARE = 0.05  # an expert chosen for fewer of the audit's tokens is refused as under-excited


def _check_experts(layer: torch.nn.Module, forward: Callable, x: torch.Tensor, experts: int) -> None:
    """Refuse an audit whose tokens ``x`` choose some expert too rarely to identify its weights (the count would
    then describe the data, not the layer): the router's choices are read off one forward pass of the layer."""
    router = next(m for m in layer.modules() if _is_router(m))
    seen: list[torch.Tensor] = []
    # the chosen experts: returned by most routers; Llama 4's returns its logits, of which it takes the top ones
    hook = router.register_forward_hook(
        lambda module, args, out: seen.append(out[2] if len(out) > 2 else out[1].topk(module.top_k, dim=1).indices)
    )
    try:
        with torch.no_grad():
            forward(layer, x)
    finally:
        hook.remove()
    chosen = seen[0]
    share = torch.bincount(chosen.reshape(-1), minlength=experts).double() / chosen.shape[0]
    if share.min() < MIN_EXPERT_SHARE:
        raise ValueError(
            f"experts: expert {int(share.argmin())} is chosen for only {share.min():.1%} of the audit's tokens, too "
            f"few to identify it; use fewer --experts"
        )
