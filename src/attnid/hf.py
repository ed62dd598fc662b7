"""Auditing the attention layers of Hugging Face ``transformers`` (optional extra: ``pip install -e ".[hf]"``).

Each supported model type is built from a *small* config of its real class, with random weights and no
download, and run through its own attention module and rotary code in float64. The audit is the dense
Jacobian audit of :func:`attnid.audit.audit_module` (the same code path as our own layer's), with the
data sized by :func:`attnid.audit.default_data_size`; the result is compared with the closed form of the
equivalent :class:`~attnid.attention.AttentionConfig` (groups, biases, RoPE dims), and a difference, or a
rank that the singular values do not decide clearly, raises :class:`HFAuditError`.

Conventions: Hugging Face's ``rotate_half`` pairs dimension ``i`` with ``i + R/2``, our layer pairs ``2i``
with ``2i + 1``; the two differ by a fixed permutation of a head's coordinates, so the counts agree
(tests/test_hf.py checks it on every RoPE model type). Nothing is converted.
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .attention import AttentionConfig
from .audit import (
    RTOL,
    AuditResult,
    audit_module,
    available_memory,
    check_seed,
    default_data_size,
    default_seq_len,
    memory_estimate,
)
from .counting import SCOPES, BlockConfig, Count, MLAConfig, count, count_block, count_mla, count_model
from .families import (
    HF_TYPES,
    block_config,
    default_ffn,
    default_vocab,
    equivalent_config,
    model_config,
)
from .presets import Preset

TESTED = "transformers 5.24"
MIN_GAP = 1e6  # a rank decision with a smaller singular-value gap is not trusted
# a block or model audit reads at least this many informative outputs (E per token) per parameter: two keep every
# gap of the test shapes above MIN_GAP (tests/test_blocks.py) at two thirds of the cost of three
BLOCK_DATA_RATIO = 2


class HFAuditError(RuntimeError):
    """The Jacobian count of a real module differs from the closed form, or its rank is not clear-cut."""


def _transformers():
    try:
        with warnings.catch_warnings():  # its import warns about the environment (tqdm, torch), not the audit
            warnings.simplefilter("ignore")
            import transformers
    except ImportError as e:
        raise ImportError(f'auditing Hugging Face modules needs transformers ({TESTED}): pip install -e ".[hf]"') from e
    return transformers


ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


def implementation_of(hf_type: str) -> str:
    """The attention implementation a block or a whole model of ``hf_type`` is built with: ``"eager"`` for a model
    that soft-caps its scores (sdpa cannot), else ``"sdpa"``; what the audit's details record."""
    return "eager" if HF_TYPES[hf_type].eager else "sdpa"


def _hf_config(hf_type: str, cfg: AttentionConfig, attn_implementation: str = "sdpa", **changes):
    """The ``transformers`` config object of ``hf_type`` for ``cfg``, with ``changes`` on top."""
    tf = _transformers()
    t = HF_TYPES[hf_type]
    return getattr(tf, t.config)(**dict(t.config_kwargs(cfg, attn_implementation), **changes))


def _modeling(hf_type: str):
    _transformers()  # says how to install it when it is missing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = HF_TYPES[hf_type].module
        return importlib.import_module(f"transformers.models.{m}.modeling_{m}")


def _is_norm(m: torch.nn.Module) -> bool:
    return isinstance(m, torch.nn.LayerNorm) or type(m).__name__.endswith("RMSNorm")


def _rms_norm_float64(self, x: torch.Tensor) -> torch.Tensor:
    # transformers' RMSNorm computes in float32 whatever the input; the audit needs the float64 function
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _gemma_rms_norm_float64(self, x: torch.Tensor) -> torch.Tensor:
    # Gemma's RMSNorm scales by (1 + weight), keeps ε in `eps`, and also computes in float32
    return (1.0 + self.weight) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _prepare(
    module: torch.nn.Module, E: int, seed: int, norm_eps: float | None = None, exact_norms: bool = True
) -> torch.nn.Module:
    """float64, eval mode, seeded random weights: ``N(0, 1/E)`` for every map and bias, ``1 + 0.3 N(0, 1)``
    for norm weights and ``0.3 N(0, 1)`` for norm shifts (generic, not the identity). With ``exact_norms``
    RMSNorm computes in float64 (its float32 cast patched out); ``ε = norm_eps`` when given."""
    module = module.to(torch.float64).eval()
    norm_params = {id(p): name for m in module.modules() if _is_norm(m) for name, p in m.named_parameters()}
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            z = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if id(p) in norm_params:
                p.copy_((1.0 if norm_params[id(p)] == "weight" else 0.0) + 0.3 * z)
            else:
                p.copy_(z / E**0.5)
    return set_norms(module, exact=exact_norms, norm_eps=norm_eps)


def set_norms(module: torch.nn.Module, *, exact: bool = True, norm_eps: float | None = None) -> torch.nn.Module:
    """Every norm of ``module``: with ``exact``, RMSNorm computes in the input's float64 (transformers' float32
    cast patched out); ``ε = norm_eps`` when given. Returns ``module``, changed in place."""
    for m in module.modules():
        if type(m).__name__.endswith("RMSNorm"):
            gemma = type(m).__name__.startswith("Gemma")
            if exact:
                m.forward = types.MethodType(_gemma_rms_norm_float64 if gemma else _rms_norm_float64, m)
            if norm_eps is not None:
                setattr(m, "eps" if gemma else "variance_epsilon", norm_eps)
        elif isinstance(m, torch.nn.LayerNorm) and norm_eps is not None:
            m.eps = norm_eps
    return module


@contextmanager
def _float64_softmax():
    """transformers' eager attention computes its softmax in float32 whatever the input (which blurs the rank);
    inside this block a float64 input keeps float64."""
    softmax = torch.nn.functional.softmax

    def exact(x, dim=None, _stacklevel=3, dtype=None):
        return softmax(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)

    torch.nn.functional.softmax = exact
    try:
        yield
    finally:
        torch.nn.functional.softmax = softmax


def _hidden_forward(rotary, eager: bool = False):
    """``forward(call, x)``: a module on hidden states ``x`` ``(B, L, E)`` through sdpa's math kernel (exact
    float64 and differentiable in forward mode; the fused CPU kernel is not), with the rotary tables. With
    ``eager`` (a module that runs its own attention: soft-capping), a causal mask is passed and its softmax
    kept in float64 (:func:`_float64_softmax`)."""

    def forward(call: Callable, x: torch.Tensor) -> torch.Tensor:
        L = x.shape[1]
        mask = torch.full((L, L), float("-inf"), dtype=x.dtype).triu(1)[None, None] if eager else None
        with sdpa_kernel([SDPBackend.MATH]), _float64_softmax() if eager else nullcontext():
            if rotary is None:
                out = call(x)
            else:
                pos = torch.arange(L)[None].expand(x.shape[0], -1)
                # Gemma 3 keeps a table per layer type; the audited layer is a global (full) one
                cos, sin = rotary(x, pos, "full_attention") if hasattr(rotary, "layer_types") else rotary(x, pos)
                out = call(x, attention_mask=mask, position_embeddings=(cos.to(x.dtype), sin.to(x.dtype)))
        return out[0] if isinstance(out, tuple) else out

    return forward


def build_attention(hf_type: str, cfg: AttentionConfig, *, seed: int = 0, attn_implementation: str = "sdpa"):
    """``(module, forward)``: the real attention module of ``hf_type`` for ``cfg`` in float64, with
    seeded random weights (every parameter, biases included, ``N(0, 1/E)``), and ``forward(call, x)``
    that runs it as causal self-attention on hidden states ``x`` ``(B, L, E)``. ``attn_implementation``:
    ``"sdpa"`` computes in the input's float64; ``"eager"`` runs some models' softmax in float32."""
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation: expected one of {', '.join(ATTN_IMPLEMENTATIONS)}, got {attn_implementation!r}"
        )
    t = HF_TYPES[hf_type]
    mod = _modeling(hf_type)
    if t.eager:  # sdpa can neither cap the scores nor add a sink
        attn_implementation = "eager"
    config = _hf_config(hf_type, cfg, attn_implementation)
    attn = _prepare(
        getattr(mod, t.attention)(config, layer_idx=0), cfg.E, seed, norm_eps=cfg.qk_norm_eps if t.qk_norm else None
    )
    rotary = getattr(mod, t.rotary)(config=config) if t.rotary else None
    built = getattr(attn, "rotary_ndims", None)
    if built is not None and built != cfg.R:
        raise HFAuditError(f"{hf_type}: the module was built with {built} rotary dims, not the {cfg.R} asked for")
    return attn, _hidden_forward(rotary, eager=t.eager)


def build_block(
    hf_type: str, cfg: AttentionConfig, *, ffn: int, seed: int = 0, norm_eps: float = 0.0, experts: int = 0
):
    """``(module, forward)``: one whole decoder layer of ``hf_type`` (norms, attention, MLP or ``experts`` experts of
    inner size ``ffn``, two chosen per token, residual connections) in float64 with seeded random weights
    (:func:`_prepare`; a softmax router's weights computed in float64), every norm at ``ε = norm_eps``, run on
    hidden states."""
    t = HF_TYPES[hf_type]
    mod = _modeling(hf_type)
    config = _hf_config(hf_type, cfg, implementation_of(hf_type), **t.ffn_kwargs(ffn), **t.expert_kwargs(experts))
    config._experts_implementation = "eager"  # a model sets it; the layer alone runs the experts' own loop
    layer = _prepare(getattr(mod, t.layer)(config, layer_idx=0), cfg.E, seed, norm_eps=norm_eps)
    for m in layer.modules():
        if _is_router(m) and t.router == "softmax":  # gpt-oss's router computes in the input's dtype already
            m.forward = types.MethodType(_softmax_router_float64(m.forward), m)
    attn = next(m for m in layer.modules() if type(m).__name__ == t.attention)
    built = getattr(attn, "rotary_ndims", None)
    if built is not None and built != cfg.R:
        raise HFAuditError(f"{hf_type}: the layer was built with {built} rotary dims, not the {cfg.R} asked for")
    rotary = getattr(mod, t.rotary)(config=config) if t.rotary else None
    return layer, _hidden_forward(rotary, eager=t.eager)


def build_model(
    hf_type: str, cfg: AttentionConfig, *, ffn: int, layers: int, vocab: int, tied: bool, seq_len: int,
    norm_eps: float = 0.0, seed: int = 0, exact_norms: bool = True, final_softcap: float | None = None,
):  # fmt: skip
    """``(module, forward)``: a whole ``hf_type`` causal LM (embeddings, ``layers`` decoder layers, final
    norm, LM head) with ``seq_len`` positions, norms at ``ε = norm_eps`` (``exact_norms=False`` keeps
    transformers' float32 RMSNorm), its logits capped at ``final_softcap`` (Gemma 2's
    ``final_logit_softcapping``; None: no cap); ``forward(call, ids)`` gives the next-token log-probabilities
    ``(B, L, vocab)``."""
    t = HF_TYPES[hf_type]
    tf = _transformers()
    if final_softcap is not None and hf_type != "gemma2":
        raise ValueError(f"final_softcap: {hf_type} does not cap its logits (gemma2 does)")
    changes = dict(t.ffn_kwargs(ffn), vocab_size=vocab, num_hidden_layers=layers, tie_word_embeddings=tied)
    if hf_type == "gemma2":
        changes["final_logit_softcapping"] = final_softcap
    if hf_type == "gpt2":
        changes["n_positions"] = seq_len
    if hf_type == "opt":
        changes.update(max_position_embeddings=seq_len, word_embed_proj_dim=cfg.E)
    if hf_type == "gemma3":  # every layer a global one, as in the block audit
        changes["layer_types"] = ["full_attention"] * layers
    eager = t.eager
    config = _hf_config(hf_type, cfg, implementation_of(hf_type), **changes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _prepare(getattr(tf, t.lm)(config), cfg.E, seed, norm_eps=norm_eps, exact_norms=exact_norms)

    def forward(call: Callable, ids: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel([SDPBackend.MATH]), _float64_softmax() if eager else nullcontext():
            return torch.log_softmax(call(input_ids=ids, use_cache=False).logits, dim=-1)

    return model, forward


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


def _attention_scope(hf_type: str, cfg: AttentionConfig, *, seed: int, attn_implementation: str, **_) -> ScopeAudit:
    """The attention module alone: :func:`attnid.counting.count` of the equivalent config, data of
    :func:`attnid.audit.default_data_size`."""
    t = HF_TYPES[hf_type]
    theory = count(cfg)
    B, L = default_data_size(cfg, theory.total_params)
    return ScopeAudit(
        theory,
        f"transformers.models.{t.module}.{t.attention}",
        B,
        L,
        cfg.E,
        "--embed",
        build=lambda: build_attention(hf_type, cfg, seed=seed, attn_implementation=attn_implementation),
        inputs=lambda gen: torch.randn(B, L, cfg.E, generator=gen, dtype=torch.float64),
        # the implementation that ran: a soft-capping type runs eager whatever was asked (sdpa cannot cap)
        details=dict(attn_implementation="eager" if t.eager else attn_implementation),
    )


def _block_batch(E: int, L: int, n: int) -> int:
    """Sequences of length ``L`` in a block's or a model's data (latent attention's too): each token carries at most
    ``E`` informative outputs (the final norm's width, for a model), and the audit reads ``BLOCK_DATA_RATIO`` of
    them per parameter."""
    return max(2, -(-BLOCK_DATA_RATIO * n // (E * L)))


def _block_size(cfg: AttentionConfig, n: int) -> tuple[int, int]:
    """Batch and length of a block's or a model's data (:func:`_block_batch` at the audit's sequence length)."""
    L = default_seq_len(cfg)
    return _block_batch(cfg.E, L, n), L


def _check_layer_norm_width(hf_type: str, cfg: AttentionConfig) -> None:
    if HF_TYPES[hf_type].norm == "layer" and cfg.E < 4:
        raise ValueError(
            f"embed: a LayerNorm over {cfg.E} feature(s) leaves too little to tell directions apart (E = 1 is "
            "constant, E = 2 a sign, E = 3 gives no clear gap); use --embed 4 or more"
        )


AUDIT_EXPERTS = 4  # a mixture-of-experts layer is audited with four experts, two chosen per token


def _block_scope(hf_type: str, cfg: AttentionConfig, *, seed: int, ffn: int | None, norm_eps: float, **_) -> ScopeAudit:
    """One whole decoder layer: :func:`attnid.counting.count_block`."""
    _check_layer_norm_width(hf_type, cfg)
    t = HF_TYPES[hf_type]
    F = default_ffn(hf_type, cfg.E) if ffn is None else ffn
    k = AUDIT_EXPERTS if t.moe else 0
    theory = count_block(block_config(hf_type, cfg, F, norm_eps_zero=norm_eps == 0, experts=k))
    B, L = _block_size(cfg, theory.total_params)
    return ScopeAudit(
        theory,
        f"transformers.models.{t.module}.{t.layer}",
        B,
        L,
        cfg.E,
        "--embed, --ffn",
        build=lambda: build_block(hf_type, cfg, ffn=F, seed=seed, norm_eps=norm_eps, experts=k),
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
    **_,
) -> ScopeAudit:
    """A causal LM read through ``log_softmax``: :func:`attnid.counting.count_model`; its vocabulary must show the
    stream (and, with a parallel residual, the first MLP), and a ReLU unit must switch on the audit's tokens."""
    _check_layer_norm_width(hf_type, cfg)
    t = HF_TYPES[hf_type]
    F = default_ffn(hf_type, cfg.E) if ffn is None else ffn
    least = default_vocab(hf_type, cfg.E, F)
    V = least if vocab is None else vocab
    if V <= cfg.E:
        raise ValueError(
            f"vocab: {V} tokens show the {cfg.E}-dimensional stream through only {V - 1} log-probabilities, too few "
            f"to identify it (the count would describe the data); use more than {cfg.E} (default {least})"
        )
    if tied and t.head_bias:
        raise ValueError(f"tied: the {hf_type} LM head has a bias, so it cannot be tied to the embedding")
    if t.residual != "sequential" and least > V:
        raise ValueError(
            f"vocab: in a {hf_type} model the first layer's MLP reads the token embedding alone, so a vocabulary of "
            f"{V} leaves it under-determined and the count would describe the data; use at least {least} "
            "(3 x ffn, the default)"
        )
    tie = t.tied if tied is None else tied
    layers = 1 if layers is None else layers
    seq_len = default_seq_len(cfg)
    shape: dict[str, Any] = dict(ffn=F, layers=layers, vocab=V, tied=tie, seq_len=seq_len, norm_eps=norm_eps)
    shape["final_softcap"] = final_softcap
    theory = count_model(model_config(hf_type, cfg, **shape))
    B, L = _block_size(cfg, theory.total_params)
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
    hf_type: str, scope: str, *, seed, ffn, layers, vocab, tied, norm_eps, attn_implementation
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
    if scope == "attention" and norm_eps != 0 and not HF_TYPES[hf_type].qk_norm:
        raise ValueError(f"norm_eps: {hf_type}'s attention has no norm; audit a block or a model (--block, --model)")
    if scope != "attention" and attn_implementation != "sdpa":
        raise ValueError("attn_implementation: blocks and models are audited through sdpa only")
    if scope != "attention" and not HF_TYPES[hf_type].layer:
        raise ValueError(f"scope: attnid has no closed form for {hf_type}'s decoder layer; audit its attention")
    if scope == "model" and HF_TYPES[hf_type].moe:
        raise ValueError(f"scope: a {hf_type} model is audited layer by layer (--block: its mixture of experts); its "
                         "model count adds the terms of chapter 8")  # fmt: skip


def _scope_extras(scope: str, nope: bool, final_softcap: float | None) -> dict:
    """The settings only some scopes have, refused by name elsewhere: the logits' cap (a model's), a NoPE layer (an
    attention layer's or a block's)."""
    if final_softcap is not None and scope != "model":
        raise ValueError("final_softcap: the logits' cap belongs to a whole model (scope 'model')")
    if nope and scope == "model":
        raise ValueError("nope: a model audit builds the type's own layers (audit one NoPE layer at scope attention "
                         "or block)")  # fmt: skip
    return {"final_softcap": final_softcap} if scope == "model" else {}


def audit_hf(
    hf_type: str, *, embed: int = 32, heads: int = 4, groups: int | None = None, head_dim: int | None = None,
    rope_dims: int | None = None, bias: str | None = None, seed: int = 0, rtol: float = RTOL, check: bool = True,
    attn_implementation: str = "sdpa", max_memory: float | None = None, scope: str = "attention",
    ffn: int | None = None, layers: int | None = None, vocab: int | None = None, tied: bool | None = None,
    norm_eps: float = 0.0, progress: bool = False, nope: bool = False, final_softcap: float | None = None,
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
    logits capped at that value (Gemma 2's ``final_logit_softcapping``).
    """
    cfg = equivalent_config(  # refuses an unknown type and a shape the type cannot express
        hf_type, embed=embed, heads=heads, groups=groups, head_dim=head_dim, rope_dims=rope_dims, bias=bias,
        norm_eps=norm_eps, nope=nope,
    )  # fmt: skip
    sizes = dict(ffn=ffn, layers=layers, vocab=vocab, tied=tied, norm_eps=norm_eps)
    _check_hf_arguments(hf_type, scope, seed=seed, attn_implementation=attn_implementation, **sizes)
    extra = _scope_extras(scope, nope, final_softcap)
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
    res.details.update(_details(hf_type, scope, cfg, plan, seed=seed, near_null=_near_null(res), norm_eps=norm_eps))
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
                "the module probably computes part of the layer in float32; its count cannot be read off"
                if norm_eps == 0
                else f"with ε = {norm_eps:g} a norm's scale is only nearly a symmetry; audit with ε = 0"
            )
        )
    if res.unidentified != d["theory_unidentified"]:
        raise HFAuditError(
            f"{d['hf_type']}: the Jacobian gives {res.unidentified} unidentified parameters, the closed form "
            f"{d['theory_unidentified']} (scope {d['scope']}, config {d['config']})"
        )


def _is_router(m: torch.nn.Module) -> bool:
    """A mixture's router (DeepSeek-V3's ``TopkRouter``, Mixtral's and Qwen3-MoE's ``TopKRouter``)."""
    return type(m).__name__.lower().endswith("topkrouter")


def _softmax_router_float64(original: Callable):
    """Mixtral's and Qwen3-MoE's routers compute their softmax in float32; this forward keeps their choice of
    experts (a discrete one, made as transformers makes it) and recomputes the chosen experts' weights in the input's
    float64: the softmax over every logit, at the chosen ones, renormalised where the router renormalises."""

    def forward(self, hidden_states: torch.Tensor):
        _, _, chosen = original(hidden_states)
        logits = torch.nn.functional.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
        weights = logits.softmax(dim=-1).gather(1, chosen)
        if getattr(self, "norm_topk_prob", True):  # Mixtral always renormalises
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights, chosen

    return forward


def _router_float64(original: Callable):
    """transformers' DeepSeek-V3 router computes its scores in float32; this forward keeps its choice of experts
    (a discrete one, made as transformers makes it) and recomputes the chosen experts' weights in the input's
    float64."""

    def forward(self, hidden_states: torch.Tensor):
        _, _, chosen = original(hidden_states)
        logits = torch.nn.functional.linear(hidden_states.view(-1, self.hidden_dim), self.weight)
        weights = logits.sigmoid().gather(1, chosen)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return logits, weights * self.routed_scaling_factor, chosen

    return forward


MIN_EXPERT_SHARE = 0.05  # an expert chosen for fewer of the audit's tokens is refused as under-excited


def _check_experts(layer: torch.nn.Module, forward: Callable, x: torch.Tensor, experts: int) -> None:
    """Refuse an audit whose tokens ``x`` choose some expert too rarely to identify its weights (the count would
    then describe the data, not the layer): the router's choices are read off one forward pass of the layer."""
    router = next(m for m in layer.modules() if _is_router(m))
    seen: list[torch.Tensor] = []
    hook = router.register_forward_hook(lambda module, args, out: seen.append(out[2]))
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


def build_mla(cfg: MLAConfig, *, scope: str, ffn: int, experts: int, seed: int = 0):
    """``(module, forward)``: transformers' ``DeepseekV3Attention`` (``scope="attention"``) or
    ``DeepseekV3DecoderLayer`` (one MLP of inner size ``ffn``, or ``experts`` routed experts of that size, two
    chosen per token, and one shared) for ``cfg``, float64 with seeded random weights (:func:`_prepare`; the
    router's weights in float64), run on hidden states."""
    tf = _transformers()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = importlib.import_module("transformers.models.deepseek_v3.modeling_deepseek_v3")
    config = tf.DeepseekV3Config(
        vocab_size=16, hidden_size=cfg.embed, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
        q_lora_rank=cfg.q_rank, kv_lora_rank=cfg.kv_rank, qk_nope_head_dim=cfg.nope_dim,
        qk_rope_head_dim=cfg.rope_dim, v_head_dim=cfg.v_dim, rms_norm_eps=cfg.norm_eps, attention_bias=False,
        num_hidden_layers=1, attention_dropout=0.0, attn_implementation="sdpa", intermediate_size=ffn,
        moe_intermediate_size=ffn, n_routed_experts=max(experts, 1), num_experts_per_tok=min(2, max(experts, 1)),
        n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=0 if experts else 1,
    )  # fmt: skip
    config._experts_implementation = "eager"  # a model sets it; the layer alone runs the experts' own loop
    built = (mod.DeepseekV3Attention if scope == "attention" else mod.DeepseekV3DecoderLayer)(config, 0)
    module = _prepare(built, cfg.embed, seed, norm_eps=cfg.norm_eps)
    for m in module.modules():
        if type(m).__name__ == "DeepseekV3TopkRouter":
            m.forward = types.MethodType(_router_float64(m.forward), m)
    return module, _hidden_forward(mod.DeepseekV3RotaryEmbedding(config=config))


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
    _check_memory("deepseek_v3 " + scope, cfg.embed, n, B * L * cfg.embed, None, "--embed, --heads, ranks or --ffn")
    module, forward = build_mla(cfg, scope=scope, ffn=ffn, experts=experts, seed=seed)
    _check_built("deepseek_v3", module, n)
    x = torch.randn(B, L, cfg.embed, generator=torch.Generator().manual_seed(10_000 + seed), dtype=torch.float64)
    if experts:
        _check_experts(module, forward, x, experts)
    res = audit_module(module, (x,), forward=forward, rtol=rtol, progress=progress)
    layer = "DeepseekV3Attention" if scope == "attention" else "DeepseekV3DecoderLayer"
    res.details.update(
        hf_type="deepseek_v3", scope=scope, module=f"transformers.models.deepseek_v3.{layer}",
        transformers=_transformers().__version__, theory_unidentified=theory.unidentified,
        terms=theory.unidentified_by_block, config=asdict(cfg), batch=B, seq_len=L, seed=seed,
        near_null=_near_null(res), norm_eps=cfg.norm_eps,
    )  # fmt: skip
    if scope == "block":
        res.details.update(ffn=ffn, experts=experts, norms=FLOAT64_NORMS)
    if check:
        check_hf_audit(res)
    return res


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
    ratio ``F/E``. Returns :func:`audit_hf` keyword arguments."""
    cfg = p.config
    assert isinstance(cfg, AttentionConfig)  # latent attention: small_mla
    kw = small_structure(cfg)
    if 0 < cfg.R < cfg.D:  # partial RoPE: one head of 8 dims keeps the rotated share
        kw.update(embed=8, heads=1, groups=1)
    elif kw["heads"] == kw["groups"]:
        kw.update(embed=8, heads=2, groups=2)
    else:
        kw.update(embed=8)
    if cfg.rope and cfg.R == cfg.D:
        kw["rope_dims"] = kw["embed"] // kw["heads"]
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
    if not HF_TYPES[p.hf_type].groups and kw["groups"] != kw["heads"]:
        raise ValueError(f"preset: {name} shares keys across heads, which {p.hf_type} cannot express")
    return (p.hf_type, scope, tuple(sorted(kw.items()))), lambda seed: audit_hf(p.hf_type, seed=seed, scope=scope, **kw)


def verify_preset(name: str, *, seed: int = 0, scope: str = "attention") -> AuditResult:
    """Audit the structure of preset ``name`` through its real ``transformers`` module: its attention
    (:func:`small_structure`, :func:`small_mla`) or, with ``scope="block"``, its whole decoder layer
    (:func:`small_block_structure`; a mixture of four experts for a mixture-of-experts model); raises
    :class:`HFAuditError` unless the Jacobian count equals the closed form."""
    from .presets import lookup

    name, p = lookup(name)
    return structure_audit(p, scope, name)[1](seed)


def verify_presets(
    names: list[str] | None = None, *, seed: int = 0, progress: bool = False, scope: str = "attention"
) -> dict[str, AuditResult | None]:
    """:func:`verify_preset` for every preset of :data:`attnid.presets.PRESETS` (or ``names``, which may name
    latent-attention presets) at ``scope``; presets without a model type (or, for blocks, without a counted
    block) map to ``None``. Presets that share a structure and a model type share one audit. ``progress``: a
    bar on stderr (which leaves a JSON answer on stdout intact)."""
    from .presets import ALL_PRESETS, PRESETS

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
