"""Building Hugging Face ``transformers`` modules for an audit (:mod:`attnid.hf`): a small config of the real
class with random weights and no download, at float64 throughout (its norms, softmax and routers patched out of
their float32 casts), and the forward of one attention layer, one decoder layer or a whole causal LM."""

from __future__ import annotations

import importlib
import types
import warnings
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..attention import AttentionConfig
from ..extras import MissingExtra
from ..families import HF_TYPES
from ..family_kwargs import GROUPED_ROUTER_TYPES, expert_kwargs, ffn_kwargs

TESTED = "transformers 5.24"


class HFAuditError(RuntimeError):
    """The Jacobian count of a real module differs from the closed form, or its rank is not clear-cut."""


def _transformers():
    try:
        with warnings.catch_warnings():  # its import warns about the environment (tqdm, torch), not the audit
            warnings.simplefilter("ignore")
            import transformers
    except ImportError as e:
        raise MissingExtra(
            f"auditing Hugging Face modules needs the audit extra (transformers {TESTED}): pip install 'attnid[audit]'"
        ) from e
    return transformers


ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


def implementation_of(hf_type: str) -> str:
    """The attention implementation a block or a whole model of ``hf_type`` is built with: ``"eager"`` for a model
    that soft-caps its scores (sdpa cannot), else ``"sdpa"``; what the audit's details record."""
    return "eager" if HF_TYPES[hf_type].eager else "sdpa"


def _hf_config(
    hf_type: str, cfg: AttentionConfig, attn_implementation: str = "sdpa", residual: str | None = None, **changes
):
    """The ``transformers`` config object of ``hf_type`` for ``cfg``, its layers wired ``residual`` (None: the
    type's own), with ``changes`` on top."""
    tf = _transformers()
    t = HF_TYPES[hf_type]
    return getattr(tf, t.config)(**dict(t.config_kwargs(cfg, attn_implementation, residual), **changes))


def _modeling(hf_type: str):
    _transformers()  # says how to install it when it is missing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = HF_TYPES[hf_type].module
        return importlib.import_module(f"transformers.models.{m}.modeling_{m}")


def _is_norm(m: torch.nn.Module) -> bool:
    return isinstance(m, torch.nn.LayerNorm) or type(m).__name__.endswith(("RMSNorm", "LayerNorm"))


ZERO_CENTRED_NORMS = ("Gemma", "Qwen3Next", "Qwen3_5")  # RMSNorms that scale by (1 + weight) and keep ε in `eps`


def _rms_norm_float64(self, x: torch.Tensor) -> torch.Tensor:
    # transformers' RMSNorm computes in float32 whatever the input; the audit needs the float64 function (its ε is
    # `variance_epsilon`, or `eps` in Llama 4's)
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _eps_of(self)))


def _eps_of(norm: torch.nn.Module) -> float:
    eps: Any = norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps
    return float(eps)


def _gemma_rms_norm_float64(self, x: torch.Tensor) -> torch.Tensor:
    # Gemma's RMSNorm scales by (1 + weight), keeps ε in `eps`, and also computes in float32
    return (1.0 + self.weight) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _l2_norm_float64(self, x: torch.Tensor) -> torch.Tensor:
    # Llama 4's QK-norm: RMSNorm without a weight, also computed in float32
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def _shiftless_layer_norm_float64(self, x: torch.Tensor) -> torch.Tensor:
    # Cohere's and Command R7B's LayerNorm (a weight, no shift; over the last axis, per head for Cohere's QK-norm),
    # also in float32
    centred = x - x.mean(-1, keepdim=True)
    return self.weight * centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


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
        name = type(m).__name__
        if name.endswith("RMSNorm"):
            gemma = name.startswith(ZERO_CENTRED_NORMS)
            if exact:
                m.forward = types.MethodType(_gemma_rms_norm_float64 if gemma else _rms_norm_float64, m)
            if norm_eps is not None:
                setattr(m, "eps" if gemma or not hasattr(m, "variance_epsilon") else "variance_epsilon", norm_eps)
        elif name.endswith("L2Norm") or name in ("CohereLayerNorm", "Cohere2LayerNorm"):
            if exact:
                m.forward = types.MethodType(_l2_norm_float64 if name.endswith("L2Norm") else
                                             _shiftless_layer_norm_float64, m)  # fmt: skip
            if norm_eps is not None:
                setattr(m, "eps" if name.endswith("L2Norm") else "variance_epsilon", norm_eps)
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


POSITION_MAPS = ("text", "grid")  # the positions an audit feeds: a text's, or (M-RoPE) a multimodal map


def grid_positions(B: int, L: int) -> torch.Tensor:
    """``(3, B, L)`` positions of M-RoPE's three streams (time, height, width) for a multimodal input: token ``n``
    lies in frame ``n // 4`` of 2 x 2 patches, at row ``(n // 2) % 2`` and column ``n % 2``, each stream counted from
    its frame's time as Qwen2.5-VL counts an image's (so every stream moves, and no two streams move alike)."""
    n = torch.arange(L)
    t = n // 4
    streams = torch.stack([t, t + (n // 2) % 2, t + n % 2])
    return streams[:, None, :].expand(3, B, L)


def _hidden_forward(
    rotary, eager: bool = False, module=None, positions: str = "text", no_alibi: bool = False, no_rope: bool = False
):
    """``forward(call, x)``: a module on hidden states ``x`` ``(B, L, E)`` through sdpa's math kernel (exact
    float64 and differentiable in forward mode; the fused CPU kernel is not), with the rotary tables. With
    ``eager`` (a module that runs its own attention: soft-capping), a causal mask is passed and its softmax
    kept in float64 (:func:`_float64_softmax`). The rotation of a modeling ``module`` that computes it in float32 is
    kept in float64 (:func:`_exact_rotary`: Llama 4's complex ``freqs_cis``, Cohere's interleaved pairs).
    ``positions``: ``"text"`` (0, 1, 2, ...) or, for M-RoPE, ``"grid"`` (:func:`grid_positions`). ``no_alibi``: the
    module takes an ALiBi table as an argument, None under RoPE (Falcon's). ``no_rope``: a layer without rotary tables
    that still takes the arguments of one (Granite 4's NoPE layers), given as None."""
    alibi = {"alibi": None} if no_alibi else {}

    def forward(call: Callable, x: torch.Tensor) -> torch.Tensor:
        L = x.shape[1]
        mask = torch.full((L, L), float("-inf"), dtype=x.dtype).triu(1)[None, None] if eager else None
        with sdpa_kernel([SDPBackend.MATH]), _float64_softmax() if eager else nullcontext():
            if rotary is None:
                return _first(call(x, attention_mask=None, position_embeddings=None) if no_rope else call(x))
            pos = grid_positions(x.shape[0], L) if positions == "grid" else torch.arange(L)[None].expand(x.shape[0], -1)
            # Gemma 3 keeps a table per layer type; the audited layer is a global (full) one
            table = rotary(x, pos, "full_attention") if hasattr(rotary, "layer_types") else rotary(x, pos)
            if torch.is_tensor(table) and table.is_complex():
                table = table.to(torch.complex128)
            else:
                table = (table[0].to(x.dtype), table[1].to(x.dtype))
            with _exact_rotary(module):
                return _first(call(x, attention_mask=mask, position_embeddings=table, **alibi))

    return forward


def _alibi_forward(heads: int, module, residual: bool):
    """``forward(call, x)`` for BLOOM's layers, which take their position map as arguments: the ALiBi table
    (:func:`build_alibi_tensor` of the modeling ``module``: ``m_h`` times each key's position, for ``heads`` heads),
    an additive causal mask, and (``residual``, the attention alone) a residual to add, zeros here. The softmax, which
    BLOOM computes in float32, is kept in float64 (:func:`_float64_softmax`)."""

    def forward(call: Callable, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        alibi = module.build_alibi_tensor(torch.ones(B, L, dtype=torch.long), heads, x.dtype)
        mask = torch.full((L, L), float("-inf"), dtype=x.dtype).triu(1)[None, None]
        extra = {"residual": torch.zeros_like(x)} if residual else {}
        with _float64_softmax():
            return _first(call(x, alibi=alibi, attention_mask=mask, **extra))

    return forward


def _forward_of(hf_type: str, cfg: AttentionConfig, rotary, module, residual: bool, positions: str = "text"):
    """The forward of a ``hf_type`` layer (:func:`_alibi_forward` for ALiBi, else :func:`_hidden_forward` at
    ``positions``)."""
    t = HF_TYPES[hf_type]
    if t.positions == "alibi":
        return _alibi_forward(cfg.H, module, residual)
    return _hidden_forward(rotary, eager=t.eager, module=module, positions=positions, no_alibi=hf_type == "falcon",
                           no_rope=hf_type == "granitemoehybrid")  # fmt: skip


def _first(out):
    return out[0] if isinstance(out, tuple) else out


# the modeling modules whose rotation computes in float32 whatever the input, and the function that does it
FLOAT32_ROTARY = {"llama4": "apply_rotary_emb", "cohere": "apply_rotary_pos_emb", "cohere2": "apply_rotary_pos_emb",
                  "ernie4_5": "apply_rotary_pos_emb", "ernie4_5_moe": "apply_rotary_pos_emb"}  # fmt: skip


@contextmanager
def _exact_rotary(module):
    """Llama 4 rotates queries and keys as complex numbers in complex64, and Cohere and ERNIE 4.5 their interleaved
    pairs in float32, whatever the input; inside this block the modeling ``module``'s rotation keeps a float64 input
    in float64 (the library's own pairing). Other modules rotate in the input's dtype already: nothing is changed."""
    family = module.__name__.rsplit(".modeling_", 1)[-1] if module is not None else ""
    name = FLOAT32_ROTARY.get(family)
    if name is None:
        yield
        return
    original = getattr(module, name)

    def complex_pairs(xq, xk, freqs_cis):  # Llama 4: pairs (2i, 2i + 1) as complex numbers
        def turn(x):
            z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
            return torch.view_as_real(z * freqs_cis[:, :, None, :]).flatten(3)

        return turn(xq), turn(xk)

    def interleaved(q, k, cos, sin, unsqueeze_dim=1):  # Cohere: its rotate_half pairs (2i, 2i + 1)
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        if family.startswith("ernie4_5"):  # its table is (freqs, freqs): each frequency taken twice, for its pair
            cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
            sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
        return q * cos + module.rotate_half(q) * sin, k * cos + module.rotate_half(k) * sin

    setattr(module, name, complex_pairs if name == "apply_rotary_emb" else interleaved)
    try:
        yield
    finally:
        setattr(module, name, original)


def build_attention(
    hf_type: str, cfg: AttentionConfig, *, seed: int = 0, attn_implementation: str = "sdpa", positions: str = "text"
):
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
        getattr(mod, t.attention)(config, layer_idx=0), cfg.E, seed, norm_eps=cfg.qk_norm_eps if cfg.qk_norm else None
    )
    rotary = getattr(mod, t.rotary)(config=config) if t.rotary else None
    built = getattr(attn, "rotary_ndims", None)
    if built is not None and built != cfg.R:
        raise HFAuditError(f"{hf_type}: the module was built with {built} rotary dims, not the {cfg.R} asked for")
    return attn, _forward_of(hf_type, cfg, rotary, mod, residual=True, positions=positions)


def build_block(
    hf_type: str,
    cfg: AttentionConfig,
    *,
    ffn: int,
    seed: int = 0,
    norm_eps: float = 0.0,
    experts: int = 0,
    positions: str = "text",
    residual: str | None = None,
):
    """``(module, forward)``: one whole decoder layer of ``hf_type`` (norms, attention, MLP or ``experts`` experts of
    inner size ``ffn``, two chosen per token, residual connections wired ``residual``, None: the type's own) in
    float64 with seeded random weights (:func:`_prepare`; a softmax router's weights computed in float64), every norm
    at ``ε = norm_eps``, run on hidden states."""
    t = HF_TYPES[hf_type]
    mod = _modeling(hf_type)
    config = _hf_config(
        hf_type,
        cfg,
        implementation_of(hf_type),
        residual,
        **ffn_kwargs(t.module, ffn, t.fixed_ffn),
        **expert_kwargs(t.module, experts, t.dense_allowed),
    )
    config._experts_implementation = "eager"  # a model sets it; the layer alone runs the experts' own loop
    kind = {"layer_type": "full_attention"} if hf_type == "bamba" else {}  # its layer is a Mamba-2 one by default
    layer = _routers_in_float64(
        _prepare(getattr(mod, t.layer)(config, layer_idx=0, **kind), cfg.E, seed, norm_eps=norm_eps), hf_type
    )
    attn = next(m for m in layer.modules() if type(m).__name__ == t.attention)
    built = getattr(attn, "rotary_ndims", None)
    if built is not None and built != cfg.R:
        raise HFAuditError(f"{hf_type}: the layer was built with {built} rotary dims, not the {cfg.R} asked for")
    rotary = getattr(mod, t.rotary)(config=config) if t.rotary else None
    return layer, _forward_of(hf_type, cfg, rotary, mod, residual=False, positions=positions)


# the types whose config names each layer's kind (layer_types), where a model audit makes every layer attention
LAYER_TYPED = ("gemma3", "lfm2", "qwen3_next", "qwen3_5", "qwen3_5_moe", "granitemoehybrid")


def build_model(
    hf_type: str, cfg: AttentionConfig, *, ffn: int, layers: int, vocab: int, tied: bool, seq_len: int,
    norm_eps: float = 0.0, seed: int = 0, exact_norms: bool = True, final_softcap: float | None = None,
    residual: str | None = None, config_changes: dict | None = None,
):  # fmt: skip
    """``(module, forward)``: a whole ``hf_type`` causal LM (embeddings, ``layers`` decoder layers, final
    norm, LM head) with ``seq_len`` positions, norms at ``ε = norm_eps`` (``exact_norms=False`` keeps
    transformers' float32 RMSNorm), its logits capped at ``final_softcap`` (Gemma 2's
    ``final_logit_softcapping``; None: no cap), its layers wired ``residual`` (None: the type's own), its config's
    fields ``config_changes`` set last (a hybrid model's layer kinds and mixers: :mod:`attnid.hf.hybrid`);
    ``forward(call, ids)`` gives the next-token log-probabilities ``(B, L, vocab)``."""
    t = HF_TYPES[hf_type]
    tf = _transformers()
    if final_softcap is not None and hf_type != "gemma2":
        raise ValueError(f"final_softcap: {hf_type} does not cap its logits (gemma2 does)")
    changes = dict(
        ffn_kwargs(t.module, ffn, t.fixed_ffn), vocab_size=vocab, num_hidden_layers=layers, tie_word_embeddings=tied
    )
    if hf_type == "gemma2":
        changes["final_logit_softcapping"] = final_softcap
    if hf_type == "gpt2":
        changes["n_positions"] = seq_len
    if hf_type == "opt":
        changes.update(max_position_embeddings=seq_len, word_embed_proj_dim=cfg.E)
    if hf_type in LAYER_TYPED:  # every layer a global (attention) one, as in the block audit
        changes["layer_types"] = ["full_attention"] * layers
    if hf_type == "bamba":
        changes["attn_layer_indices"] = list(range(layers))
    eager = t.eager
    if t.moe:  # the experts' own loop (the grouped kernel takes no float64)
        changes["experts_implementation"] = "eager"
    if config_changes is not None:
        changes.update(config_changes)
    config = _hf_config(hf_type, cfg, implementation_of(hf_type), residual, **changes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _prepare(getattr(tf, t.lm)(config), cfg.E, seed, norm_eps=norm_eps, exact_norms=exact_norms)
    model = _routers_in_float64(model, hf_type)

    modeling = _modeling(hf_type)

    def forward(call: Callable, ids: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel([SDPBackend.MATH]), _float64_softmax() if eager else nullcontext(), _exact_rotary(modeling):
            return torch.log_softmax(call(input_ids=ids, use_cache=False).logits, dim=-1)

    return model, forward


def _routers_in_float64(module: torch.nn.Module, hf_type: str) -> torch.nn.Module:
    """Every router of ``module`` (a decoder layer or a model of ``hf_type``) computing its weights in the input's
    float64 (transformers' compute them in float32), and ERNIE 4.5's choice bias made small; ``module``, changed."""
    t = HF_TYPES[hf_type]
    for m in module.modules():
        if _is_router(m) and t.router == "softmax":  # gpt-oss's router computes in the input's dtype already
            m.forward = types.MethodType(_softmax_router_float64(m.forward), m)
        if _is_router(m) and hf_type in GROUPED_ROUTER_TYPES:  # DeepSeek-V3's router, computed in float32
            m.forward = types.MethodType(_router_float64(m.forward), m)
        if hasattr(m, "e_score_correction_bias") and isinstance(m.e_score_correction_bias, torch.nn.Parameter):
            with torch.no_grad():  # ERNIE 4.5's choice bias, a parameter: small beside the softmax scores it adds
                m.e_score_correction_bias.mul_(0.01)  # to (1/experts), so that every expert is chosen often
        if type(m).__name__ == "Llama4Router":
            m.forward = types.MethodType(_llama4_router_float64, m)
    return module


def _is_router(m: torch.nn.Module) -> bool:
    """A mixture's router (DeepSeek-V3's ``TopkRouter``, Mixtral's and Qwen3-MoE's ``TopKRouter``, Llama 4's
    ``Llama4Router``)."""
    return type(m).__name__.lower().endswith(("topkrouter", "llama4router", "hunyuanmoev1gate"))


def _llama4_router_float64(self, hidden_states: torch.Tensor):
    """Llama 4's router with its sigmoid in the input's float64 (transformers computes it in float32): the top
    logits kept, every other score ``σ(−∞) = 0``."""
    logits = torch.nn.functional.linear(hidden_states, self.weight)
    top, chosen = torch.topk(logits, self.top_k, dim=1)
    return torch.full_like(logits, float("-inf")).scatter_(1, chosen, top).sigmoid(), logits


def _softmax_router_float64(original: Callable):
    """Mixtral's, Qwen3-MoE's and ERNIE 4.5's routers compute their softmax in float32; this forward keeps their
    choice of experts (a discrete one, made as transformers makes it) and recomputes the chosen experts' weights in
    the input's float64: the softmax over every logit, at the chosen ones, renormalised where the router
    renormalises."""

    def forward(self, hidden_states: torch.Tensor):
        _, _, chosen = original(hidden_states)  # ERNIE 4.5's adds its choice bias here, and nowhere else
        weight = self.wg.weight if hasattr(self, "wg") else self.weight  # HunYuan's router is a Linear, `wg`
        logits = torch.nn.functional.linear(hidden_states.reshape(-1, weight.shape[-1]), weight)
        weights = logits.softmax(dim=-1).gather(1, chosen)
        if getattr(self, "norm_topk_prob", True):  # Mixtral always renormalises
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights, chosen

    return forward


def _router_float64(original: Callable):
    """transformers' DeepSeek-V3 router (and GLM-4.5's and dots.llm1's, the same) computes its scores in float32;
    this forward keeps its choice of experts (a discrete one, made as transformers makes it) and recomputes the chosen
    experts' weights in the input's float64."""

    def forward(self, hidden_states: torch.Tensor):
        _, _, chosen = original(hidden_states)
        logits = torch.nn.functional.linear(hidden_states.view(-1, self.hidden_dim), self.weight)
        weights = logits.sigmoid().gather(1, chosen)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return logits, weights * self.routed_scaling_factor, chosen

    return forward
