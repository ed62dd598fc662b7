"""Multi-head attention in the paper's column form (the paper's notation; chapter 1).

Tokens are columns: ``X`` has shape ``(B, E, L)``. For head ``h`` in group ``g`` (GQA),

    Q_h = W_Q^h X + b_Q^h 1ᵀ,   K_g = W_K^g X + b_K^g 1ᵀ,   V_g = W_V^g X + b_V^g 1ᵀ,
    P_h = softmax over keys of K_gᵀ Q_h / sqrt(D)   (optionally causal, optionally RoPE),
    Y   = Σ_h W_O^h V_g P_h + b_O 1ᵀ.

Parameters live in a plain dict (``AttentionParams``) so that ``torch.func`` can differentiate
through them:  ``W_Q (H, D, E)``, ``W_K (G, D, E)``, ``W_V (G, C, E)``, ``W_O (H, E, C)``,
``b_Q (H, D)``, ``b_K (G, D)``, ``b_V (G, C)``, ``b_O (E,)`` (biases optional).
Heads ``h`` belong to group ``h // (H / G)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention_config import (  # noqa: F401 (re-exported: the layer's config needs no torch, so it has its own module)
    BIAS_LETTERS,
    PARAM_ORDER,
    QK_NORM_NAMES,
    QK_NORM_WEIGHTED,
    QK_NORMS,
    AttentionConfig,
    parse_bias,
)
from .rope import apply_rope

AttentionParams = dict[str, torch.Tensor]


# ----------------------------------------------------- the parameter vector θ (one walk, used everywhere)
def param_slices(like: dict[str, torch.Tensor]) -> dict[str, slice]:
    """Where each tensor of ``like`` sits in the flat vector θ: the layer's parameters in ``PARAM_ORDER``,
    any other names (a module's ``named_parameters``) after them in their own order."""
    names = [k for k in PARAM_ORDER if k in like] + [k for k in like if k not in PARAM_ORDER]
    out, i = {}, 0
    for k in names:
        out[k] = slice(i, i + like[k].numel())
        i += like[k].numel()
    return out


def flatten(p: dict[str, torch.Tensor]) -> torch.Tensor:
    """θ: the tensors of ``p`` concatenated in the order of :func:`param_slices`."""
    return torch.cat([p[k].reshape(-1) for k in param_slices(p)])


def unflatten(v: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`flatten`: views of ``v`` shaped like the tensors of ``like``."""
    return {k: v[s].reshape(like[k].shape) for k, s in param_slices(like).items()}


def init_params(cfg: AttentionConfig, *, seed: int = 0, dtype: torch.dtype = torch.float64) -> AttentionParams:
    """Random parameters with weights ~ N(0, 1/fan_in) (scores of order one)."""
    g = torch.Generator().manual_seed(seed)
    out: AttentionParams = {}
    for name, shape in cfg.shapes().items():
        fan_in = shape[-1] if name.startswith("W") else 1
        scale = 1.0 / math.sqrt(fan_in) if name.startswith("W") else 0.5  # biases and sink logits: N(0, 1/4)
        z = torch.randn(shape, generator=g, dtype=torch.float64)
        # norm weights: generic, around one (all equal would be a special point with more symmetry)
        out[name] = (1.0 + 0.3 * z if name.startswith("g") else z * scale).to(dtype)
    return out


def qk_normed(Y: torch.Tensor, g: torch.Tensor | None, cfg: AttentionConfig) -> torch.Tensor:
    """QK-norm of queries or keys ``Y`` ``(B, heads, D, L)`` with weight ``g`` at ``ε = cfg.qk_norm_eps``: RMSNorm
    over each head's ``D`` coordinates (``cfg.qk_norm == "head"``, ``g`` ``(D,)``; ``"l2"``, no weight) or over all
    heads together (``"proj"``, ``g`` ``(heads, D)``), or LayerNorm over each head without a shift (``"layer"``, ``g``
    ``(heads, D)``)."""
    if cfg.qk_norm == "layer":
        Y = Y - Y.mean(dim=2, keepdim=True)
    dims = (1, 2) if cfg.qk_norm == "proj" else (2,)
    Y = Y * torch.rsqrt(Y.pow(2).mean(dim=dims, keepdim=True) + cfg.qk_norm_eps)
    if g is None:
        return Y
    return Y * (g[None, None, :, None] if g.dim() == 1 else g[None, :, :, None])


def check_inputs(X: torch.Tensor, p: AttentionParams, cfg: AttentionConfig) -> None:
    """Raise ``ValueError`` naming the tensor when ``X`` or a parameter does not fit ``cfg``."""
    if not isinstance(cfg, AttentionConfig):
        raise TypeError(f"cfg: expected an AttentionConfig, got {type(cfg).__name__}")
    if not torch.is_tensor(X) or X.dim() != 3 or X.shape[1] != cfg.E:
        got = tuple(X.shape) if torch.is_tensor(X) else type(X).__name__
        raise ValueError(f"X: expected shape (batch, E={cfg.E}, L), got {got}")
    expected = cfg.shapes()
    extra = sorted(set(p) - set(expected))
    missing = sorted(set(expected) - set(p))
    if extra:
        raise ValueError(f"params: {extra} given but not in this config (bias={cfg.bias or 'none'!r})")
    if missing:
        raise ValueError(f"params: {missing} missing for this config (bias={cfg.bias or 'none'!r})")
    for name, shape in expected.items():
        t = p[name]
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape} for this config, got {tuple(t.shape)}")
        if t.dtype != X.dtype:
            raise ValueError(f"{name}: dtype {t.dtype} differs from X's {X.dtype}")


def attention_steps(
    X: torch.Tensor, p: AttentionParams, cfg: AttentionConfig, *, per_head_outputs: bool = True
) -> dict[str, torch.Tensor]:
    """Every intermediate of the column-form layer for ``X`` of shape ``(B, E, L)``:

    ``Q (B, H, D, L)``, ``K, V`` per head (``(B, H, D|C, L)``, groups repeated), ``A`` scores and
    ``P`` probabilities ``(B, H, L_keys, L_queries)``, ``Z = V P`` ``(B, H, C, L)`` (times ``gate``, the
    output gate ``(B, H, C, L)``, when ``cfg.output_gate``),
    ``head_out`` = ``W_O^h Z_h`` ``(B, H, E, L)`` and ``Y`` ``(B, E, L)``.
    """
    check_inputs(X, p, cfg)
    steps = _mixing_steps(X, p, cfg)
    Z = steps["Z"]
    if per_head_outputs:
        steps["head_out"] = torch.einsum("hec,bhcl->bhel", p["W_O"], Z)
        Y = steps["head_out"].sum(1)
    else:
        Y = torch.einsum("hec,bhcl->bel", p["W_O"], Z)
    if "b_O" in p:
        Y = Y + p["b_O"][None, :, None]
    steps["Y"] = Y
    return steps


def head_mixtures(X: torch.Tensor, p: AttentionParams, cfg: AttentionConfig) -> torch.Tensor:
    """``Z`` ``(B, H, C, L)``, the value mixtures ``V_g P_h`` of every head, from the query, key and value
    parameters only (``W_O``, ``b_O`` are neither needed nor read; no shape checks)."""
    return _mixing_steps(X, p, cfg)["Z"]


def _mixing_steps(X: torch.Tensor, p: AttentionParams, cfg: AttentionConfig) -> dict[str, torch.Tensor]:
    steps = mix_heads(*projections(X, p, cfg), p, cfg)
    if cfg.output_gate:  # σ(W_G^h x + b_G^h) per query token, channel by channel: (B, H, C, L)
        gate = torch.einsum("hce,bel->bhcl", p["W_G"], X)
        if "b_G" in p:
            gate = gate + p["b_G"][None, :, :, None]
        steps["gate"] = torch.sigmoid(gate)
        steps["Z"] = steps["gate"] * steps["Z"]
    return steps


def projections(
    X: torch.Tensor, p: AttentionParams, cfg: AttentionConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The activations ``Q`` ``(B, H, D, L)``, ``K`` ``(B, G, D, L)``, ``V`` ``(B, G, C, L)``: linear in the query,
    key and value parameters, token by token (``W X + b 1ᵀ``)."""
    Q = torch.einsum("hde,bel->bhdl", p["W_Q"], X)
    K = torch.einsum("gde,bel->bgdl", p["W_K"], X)
    V = torch.einsum("gce,bel->bgcl", p["W_V"], X)
    if "b_Q" in p:
        Q = Q + p["b_Q"][None, :, :, None]
    if "b_K" in p:
        K = K + p["b_K"][None, :, :, None]
    if "b_V" in p:
        V = V + p["b_V"][None, :, :, None]
    return Q, K, V


def mix_heads(
    Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, p: AttentionParams, cfg: AttentionConfig
) -> dict[str, torch.Tensor]:
    """From the activations of :func:`projections` to the mixtures ``Z`` (QK-norm with ``p``'s ``g_Q``/``g_K``,
    RoPE, scores, soft-cap, mask, softmax; the intermediates of :func:`attention_steps`). A query's mixtures depend
    on that query alone; a key or value moves the mixtures of its own sequence only."""
    n, L = cfg.H // cfg.G, Q.shape[-1]
    if cfg.qk_norm and cfg.qk_norm != "head_rope":
        Q, K = qk_normed(Q, p.get("g_Q"), cfg), qk_normed(K, p.get("g_K"), cfg)
    if cfg.rope:
        Q, K = apply_rope(Q, cfg.rope_base, cfg.R), apply_rope(K, cfg.rope_base, cfg.R)
    if cfg.qk_norm == "head_rope":  # HunYuan's: the RMSNorm per head after the rotation
        Q, K = qk_normed(Q, p.get("g_Q"), cfg), qk_normed(K, p.get("g_K"), cfg)
    if n > 1:
        K, V = K.repeat_interleave(n, dim=1), V.repeat_interleave(n, dim=1)
    A = torch.einsum("bhdk,bhdq->bhkq", K, Q)  # scores: keys x queries
    A = A / math.sqrt(cfg.D)  # the usual 1/sqrt(D); the theory absorbs it into the weights
    if cfg.logit_softcap is not None:
        A = cfg.logit_softcap * torch.tanh(A / cfg.logit_softcap)
    if cfg.causal:
        future = torch.ones(L, L, dtype=torch.bool, device=Q.device).tril(-1)  # key > query
        A = A.masked_fill(future, float("-inf"))
    P = sink_softmax(A, p["sink"]) if cfg.sinks else torch.softmax(A, dim=-2)  # each column sums to one (or 1 − π)
    Z = torch.einsum("bhck,bhkq->bhcq", V, P)
    return {"Q": Q, "K": K, "V": V, "A": A, "P": P, "Z": Z}


def sink_softmax(A: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """Softmax over keys of scores ``A`` ``(B, H, L_keys, L_queries)`` with one more logit ``sink[h]`` per head in the
    denominator, which no value reads: ``P_kq = exp(A_kq) / (Σ_k' exp(A_k'q) + exp(s_h))`` (gpt-oss)."""
    B, H, _, Lq = A.shape
    extended = torch.cat([A, sink.reshape(1, H, 1, 1).expand(B, H, 1, Lq).to(A.dtype)], dim=-2)
    return torch.softmax(extended, dim=-2)[:, :, :-1, :]


def attention(X: torch.Tensor, p: AttentionParams, cfg: AttentionConfig, *, return_z: bool = False):
    """Column-form multi-head attention. ``X``: ``(B, E, L)`` -> ``Y``: ``(B, E, L)``.

    With ``return_z=True`` also returns ``Z`` of shape ``(B, H, C, L)``, the per-head
    value mixtures ``V_g P_h`` (so ``Y = Σ_h W_O^h Z_h + b_O``).
    """
    s = attention_steps(X, p, cfg, per_head_outputs=False)
    return (s["Y"], s["Z"]) if return_z else s["Y"]


def _row_normed(y: torch.Tensor, g: torch.Tensor | None, cfg: AttentionConfig) -> torch.Tensor:
    """:func:`qk_normed` written apart, for :func:`concat_project_attention`'s ``(B, heads, L, D)`` rows: over the
    last axis, or over heads and ``D`` together."""
    if cfg.qk_norm == "layer":
        assert g is not None
        return F.layer_norm(y, (cfg.D,), eps=cfg.qk_norm_eps) * g[None, :, None, :]
    dims = (1, -1) if cfg.qk_norm == "proj" else (-1,)
    y = y / (y.pow(2).mean(dim=dims, keepdim=True) + cfg.qk_norm_eps).sqrt()
    return y if g is None else (g if g.dim() == 1 else g[None, :, None, :]) * y


def concat_project_attention(x: torch.Tensor, p: AttentionParams, cfg: AttentionConfig) -> torch.Tensor:
    """The usual row-form layer: project, split heads, attend, concatenate, project.

    ``x``: ``(B, L, E)`` -> ``(B, L, E)``. An independent implementation (PyTorch's
    ``scaled_dot_product_attention``) used to check :func:`attention`.
    """
    B, L, E = x.shape
    H, G, D, C = cfg.H, cfg.G, cfg.D, cfg.C

    def proj(W, b, heads, dim):
        y = x @ W.reshape(heads * dim, E).T
        if b is not None:
            y = y + b.reshape(-1)
        return y.view(B, L, heads, dim).transpose(1, 2)  # (B, heads, L, dim)

    q = proj(p["W_Q"], p.get("b_Q"), H, D)
    k = proj(p["W_K"], p.get("b_K"), G, D)
    v = proj(p["W_V"], p.get("b_V"), G, C)
    if cfg.qk_norm and cfg.qk_norm != "head_rope":
        q, k = _row_normed(q, p.get("g_Q"), cfg), _row_normed(k, p.get("g_K"), cfg)
    if cfg.rope:  # apply_rope expects (..., D, L)
        q = apply_rope(q.transpose(-1, -2), cfg.rope_base, cfg.R).transpose(-1, -2)
        k = apply_rope(k.transpose(-1, -2), cfg.rope_base, cfg.R).transpose(-1, -2)
    if cfg.qk_norm == "head_rope":  # HunYuan's: after the rotation
        q, k = _row_normed(q, p.get("g_Q"), cfg), _row_normed(k, p.get("g_K"), cfg)
    k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
    if cfg.logit_softcap is None and not cfg.sinks:
        z = F.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal)  # (B, H, L, C)
    else:  # sdpa has no cap and no sink: the scores by hand, as Gemma 2's and gpt-oss's eager paths compute them
        a = q @ k.transpose(-1, -2) / math.sqrt(D)
        if cfg.logit_softcap is not None:
            a = cfg.logit_softcap * torch.tanh(a / cfg.logit_softcap)
        if cfg.causal:
            a = a.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        if cfg.sinks:  # the sink as one more column of the scores, dropped after the softmax
            a = torch.cat([a, p["sink"].reshape(1, H, 1, 1).expand(B, H, L, 1)], dim=-1)
            z = torch.softmax(a, dim=-1)[..., :-1] @ v
        else:
            z = torch.softmax(a, dim=-1) @ v
    if cfg.output_gate:  # the gate from each query's own input, as Qwen3-Next's query map gives it
        gate = proj(p["W_G"], p.get("b_G"), H, C)  # (B, H, L, C)
        z = z * torch.sigmoid(gate)
    concat = z.transpose(1, 2).reshape(B, L, H * C)
    W_O = p["W_O"].permute(1, 0, 2).reshape(E, H * C)  # [W_O^1 | ... | W_O^H]
    y = concat @ W_O.T
    return y + p["b_O"] if "b_O" in p else y


class ColumnAttention(nn.Module):
    """``nn.Module`` wrapper of :func:`attention`; parameters named as in ``PARAM_ORDER``."""

    def __init__(
        self,
        cfg: AttentionConfig,
        params: AttentionParams | None = None,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ):
        super().__init__()
        self.cfg = cfg
        params = init_params(cfg, seed=seed, dtype=dtype) if params is None else params
        for name, t in params.items():
            self.register_parameter(name, nn.Parameter(t.clone()))

    def params(self) -> AttentionParams:
        return dict(self.named_parameters())

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return attention(X, self.params(), self.cfg)


# ---------------------------------------------------------------- converters
def from_torch_mha(mha: nn.MultiheadAttention, *, causal: bool = False) -> tuple[AttentionConfig, AttentionParams]:
    """Column-form config and parameters of a ``torch.nn.MultiheadAttention`` (self-attention)."""
    if not mha._qkv_same_embed_dim:
        raise ValueError("from_torch_mha: kdim/vdim different from embed_dim is not supported")
    if mha.bias_k is not None:
        raise ValueError("from_torch_mha: add_bias_kv is not supported")
    E, H = mha.embed_dim, mha.num_heads
    has_bias = mha.in_proj_bias is not None
    cfg = AttentionConfig(E, H, bias="all" if has_bias else "none", causal=causal)
    D = cfg.D
    Wq, Wk, Wv = mha.in_proj_weight.detach().chunk(3, dim=0)
    p = {
        "W_Q": Wq.reshape(H, D, E),
        "W_K": Wk.reshape(H, D, E),
        "W_V": Wv.reshape(H, D, E),
        "W_O": mha.out_proj.weight.detach().reshape(E, H, D).permute(1, 0, 2),
    }
    if has_bias:
        bq, bk, bv = mha.in_proj_bias.detach().chunk(3)
        p.update(
            b_Q=bq.reshape(H, D), b_K=bk.reshape(H, D), b_V=bv.reshape(H, D), b_O=mha.out_proj.bias.detach().clone()
        )
    return cfg, {k: v.clone() for k, v in p.items()}


def to_torch_mha(cfg: AttentionConfig, p: AttentionParams) -> nn.MultiheadAttention:
    """A ``batch_first`` ``torch.nn.MultiheadAttention`` with the same weights."""
    if cfg.G != cfg.H or cfg.D != cfg.C or cfg.D * cfg.H != cfg.E or cfg.rope:
        raise ValueError("to_torch_mha: needs G = H, D = C = E/H and no RoPE")
    if cfg.bias not in ("", BIAS_LETTERS):
        raise ValueError("to_torch_mha: torch's layer has either all biases or none")
    E, H = cfg.E, cfg.H
    dtype = p["W_Q"].dtype
    mha = nn.MultiheadAttention(E, H, bias=bool(cfg.bias), batch_first=True, dtype=dtype)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([p["W_Q"].reshape(E, E), p["W_K"].reshape(E, E), p["W_V"].reshape(E, E)]))
        mha.out_proj.weight.copy_(p["W_O"].permute(1, 0, 2).reshape(E, E))
        if cfg.bias:
            mha.in_proj_bias.copy_(torch.cat([p["b_Q"].reshape(-1), p["b_K"].reshape(-1), p["b_V"].reshape(-1)]))
            mha.out_proj.bias.copy_(p["b_O"])
    return mha


def fused_qk_views(c_attn_weight: torch.Tensor, c_attn_bias: torch.Tensor | None, n_head: int):
    """Per-head views (no copy) of a nanoGPT fused ``c_attn`` (weight ``(3 H D, E)``, usually
    ``D = E/H``): ``W_Q, W_K`` of shape ``(H, D, E)`` and ``b_Q, b_K`` of shape ``(H, D)`` (or ``None``)."""
    E = c_attn_weight.shape[1]
    inner = c_attn_weight.shape[0] // 3
    D = inner // n_head
    W_Q = c_attn_weight[:inner].view(n_head, D, E)
    W_K = c_attn_weight[inner : 2 * inner].view(n_head, D, E)
    if c_attn_bias is None:
        return W_Q, None, W_K, None
    return W_Q, c_attn_bias[:inner].view(n_head, D), W_K, c_attn_bias[inner : 2 * inner].view(n_head, D)


def from_fused(
    c_attn_weight, c_attn_bias, c_proj_weight, c_proj_bias, n_head: int, *, causal: bool = True
) -> tuple[AttentionConfig, AttentionParams]:
    """Column-form config and parameters of a nanoGPT ``c_attn``/``c_proj`` pair."""
    E = c_attn_weight.shape[1]
    if c_attn_weight.shape != (3 * E, E) or c_proj_weight.shape != (E, E):
        raise ValueError(
            f"from_fused: expected c_attn (3E, E) and c_proj (E, E), got "
            f"{tuple(c_attn_weight.shape)} and {tuple(c_proj_weight.shape)}"
        )
    bias = ("qkv" if c_attn_bias is not None else "") + ("o" if c_proj_bias is not None else "")
    cfg = AttentionConfig(E, n_head, bias=bias, causal=causal)
    H, D = n_head, cfg.D
    w = c_attn_weight.detach()
    p = {
        "W_Q": w[:E].reshape(H, D, E),
        "W_K": w[E : 2 * E].reshape(H, D, E),
        "W_V": w[2 * E :].reshape(H, D, E),
        "W_O": c_proj_weight.detach().reshape(E, H, D).permute(1, 0, 2),
    }
    if c_attn_bias is not None:
        b = c_attn_bias.detach()
        p.update(b_Q=b[:E].reshape(H, D), b_K=b[E : 2 * E].reshape(H, D), b_V=b[2 * E :].reshape(H, D))
    if c_proj_bias is not None:
        p["b_O"] = c_proj_bias.detach()
    return cfg, {k: v.clone() for k, v in p.items()}


def to_fused(cfg: AttentionConfig, p: AttentionParams):
    """Inverse of :func:`from_fused`: ``(c_attn_weight, c_attn_bias, c_proj_weight, c_proj_bias)``."""
    if cfg.G != cfg.H or cfg.D != cfg.C or cfg.D * cfg.H != cfg.E or cfg.rope:
        raise ValueError("to_fused: needs G = H, D = C = E/H and no RoPE")
    if cfg.bias not in ("", "qkv", "o", BIAS_LETTERS):
        raise ValueError("to_fused: c_attn has q, k and v biases together or none")
    E = cfg.E
    w = torch.cat([p["W_Q"].reshape(E, E), p["W_K"].reshape(E, E), p["W_V"].reshape(E, E)])
    b = torch.cat([p["b_Q"].reshape(-1), p["b_K"].reshape(-1), p["b_V"].reshape(-1)]) if "b_Q" in p else None
    return w, b, p["W_O"].permute(1, 0, 2).reshape(E, E), p.get("b_O")
