"""What a layer's data can identify (chapter 10): the functions of an attention layer's parameters that every
symmetry of the book leaves unchanged, and a distance between layers modulo those symmetries.

With ``x̃ = [x; 1]`` and the augmented maps ``[W | b]`` (paper §4.5), head ``h`` of key/value group ``g`` reads

* **query–key**: ``M_h = [W_Q^h | b_Q^h]ᵀ [W_K^g | b_K^g] / √D`` ``(E+1, E+1)``, the bilinear form of the scores
  ``x̃_qᵀ M_h x̃_k``. Its last column (query terms times the key bias) is the same for every key, so the softmax
  drops it (paper §4.6), unless a soft-cap or QK-norm bends the scores. With RoPE the rotated pairs give two
  forms each, ``A_i = Q_iᵀ K_i`` and ``B_i = Q_iᵀ J K_i`` (the score of a query at ``m`` and a key at ``n`` is
  ``Σ_i cos((n−m)θ_i) x̃ᵀA_i x̃ + sin((n−m)θ_i) x̃ᵀB_i x̃``, paper §4.8), and the unrotated rows one. QK-norm
  scales the rows by ``g_Q ⊙ g_K`` and divides by the RMS of the projection, which the Gram forms
  ``[W | b]ᵀ[W | b]`` carry; at ``ε = 0`` a scale of the projection cancels, and the forms are normalised by
  their traces.
* **value–output**: ``O_h = W_O^h W_V^g`` ``(E, E)`` (paper §4.4);
* **biases**: the value biases only reach the output through ``b_O + Σ_h W_O^h b_V^g`` (paper §4.7).

The set is complete: :func:`attention_from_invariants` computes the layer's output from them alone, and the
tests check that their Jacobian has exactly the rank of the identified directions
(:func:`attnid.counting.count`). Heads are matched up to their permutation (within a key/value group, and
groups as wholes) by :func:`head_matching`; :func:`invariant_distance` is the distance after the best match.

A GPT block's attention reads its LayerNorm's output; :func:`fold_layernorm` writes the norm's weight and bias
into the layer and projects its input maps onto the norm's hyperplane, so that the trades between the norm and
the layer, and the hyperplane directions (:func:`attnid.lm.points.hyperplane_directions`), leave the
invariants of a trained GPT's layer (:func:`attnid.lm.points.gpt_layer_invariants`) unchanged too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from .attention import AttentionConfig, AttentionParams
from .rope import rope_angles
from .symmetry import _per_head

_J = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)  # RoPE's rotation by 90°: R(φ) = cos φ + J sin φ


@dataclass(frozen=True)
class Invariants:
    """The identified functions of one layer (module docstring). ``heads``: name -> ``(H, ...)``, one entry per
    query head (``"qk"`` ``(H, parts, E+1, E+1)``, ``"vo"`` ``(H, E, E)``, with QK-norm ``"gram_q"``,
    ``"gram_k"`` per head); ``layer``: name -> tensor shared by all heads (``"output_bias"`` ``(E,)``, the
    Gram forms of a QK-norm over the whole projection)."""

    cfg: AttentionConfig
    heads: dict[str, torch.Tensor]
    layer: dict[str, torch.Tensor]

    def vector(self) -> torch.Tensor:
        """All invariants in one float64 vector (heads in their order)."""
        return torch.cat([t.reshape(-1) for t in (*self.heads.values(), *self.layer.values())])


def _qk_forms(Qa: torch.Tensor, Ka: torch.Tensor, cfg: AttentionConfig, drop_key_constant: bool) -> torch.Tensor:
    """``(H, parts, E+1, E+1)``: the score forms of :class:`Invariants` from per-head augmented query and key
    maps ``(H, D, E+1)``: ``A_i``, ``B_i`` per rotated pair, then one form for the unrotated rows."""
    R, D = cfg.R, cfg.D
    forms = []
    for i in range(0, R, 2):
        Qi, Ki = Qa[:, i : i + 2], Ka[:, i : i + 2]
        forms += [Qi.transpose(1, 2) @ Ki, Qi.transpose(1, 2) @ (_J @ Ki)]
    if R < D:
        U = Qa[:, R:].transpose(1, 2) @ Ka[:, R:]
        if drop_key_constant:  # the key bias's column: constant over keys, the softmax removes it
            U = torch.cat([U[..., :-1], torch.zeros_like(U[..., -1:])], -1)
        forms.append(U)
    return torch.stack(forms, 1) / math.sqrt(D)


def layer_invariants(cfg: AttentionConfig, p: AttentionParams) -> Invariants:
    """The identified functions of the column-form layer ``(cfg, p)`` (module docstring), in float64."""
    if not isinstance(cfg, AttentionConfig):
        raise TypeError(f"cfg: expected an AttentionConfig, got {type(cfg).__name__}")
    missing = sorted(set(cfg.shapes()) - set(p))
    if missing:
        raise ValueError(f"params: {missing} missing for this config (bias={cfg.bias or 'none'!r})")
    if cfg.qk_norm in ("l2", "layer") or cfg.output_gate:
        raise ValueError(
            "cfg: the invariants of a QK-norm without a weight, a LayerNorm per head or an output gate are not written "
            "yet (their counts are: attnid.counting.count)"
        )
    E = cfg.E
    p = {k: v.to(torch.float64) for k, v in p.items()}  # differentiable: the tests take its Jacobian
    Qa, Ka = _augmented(p, "W_Q", "b_Q"), _per_head(_augmented(p, "W_K", "b_K"), cfg)  # (H, D, E+1)
    heads: dict[str, torch.Tensor] = {}
    layer: dict[str, torch.Tensor] = {}
    if cfg.qk_norm:
        g_Q = p["g_Q"].expand(cfg.H, cfg.D)
        g_K = _per_head(p["g_K"], cfg) if p["g_K"].dim() == 2 else p["g_K"].expand(cfg.H, cfg.D)
        gq, gk = Qa.transpose(1, 2) @ Qa, Ka.transpose(1, 2) @ Ka  # per-head Gram forms (H, E+1, E+1)
        qk = _qk_forms(g_Q[..., None] * Qa, g_K[..., None] * Ka, cfg, drop_key_constant=False)
        if cfg.qk_norm == "head":
            if cfg.qk_norm_eps == 0:  # a scale of each head's projection cancels: normalise it away
                tq, tk = _trace(gq), _trace(gk)
                qk = qk / (tq * tk).sqrt()[:, None, None, None]
                gq, gk = gq / tq[:, None, None], gk / tk[:, None, None]
            heads.update(qk=qk, gram_q=gq, gram_k=gk)
        else:  # one RMS over the whole projection: the Gram forms of all heads (of all groups) together
            Gq = gq.sum(0)
            Gk = (Ka[:: cfg.H // cfg.G].transpose(1, 2) @ Ka[:: cfg.H // cfg.G]).sum(0)
            if cfg.qk_norm_eps == 0:
                tq, tk = _trace(Gq), _trace(Gk)
                qk, Gq, Gk = qk / (tq * tk).sqrt(), Gq / tq, Gk / tk
            heads["qk"] = qk
            layer.update(gram_q=Gq, gram_k=Gk)
    else:
        heads["qk"] = _qk_forms(Qa, Ka, cfg, drop_key_constant=cfg.logit_softcap is None)
    W_V, W_O = _per_head(p["W_V"], cfg), p["W_O"]
    heads["vo"] = W_O @ W_V
    out_bias = torch.zeros(E, dtype=torch.float64)
    if "b_O" in p:
        out_bias = out_bias + p["b_O"]
    if "b_V" in p:
        out_bias = out_bias + torch.einsum("hec,hc->e", W_O, _per_head(p["b_V"], cfg))
    layer["output_bias"] = out_bias
    return Invariants(cfg, heads, layer)


def _augmented(p: AttentionParams, W: str, b: str) -> torch.Tensor:
    """``[W | b]`` ``(heads, rows, E+1)``, a zero column where the layer has no such bias."""
    bias = p[b] if b in p else torch.zeros(p[W].shape[:2], dtype=torch.float64)
    return torch.cat([p[W], bias[..., None]], -1)


def _trace(M: torch.Tensor) -> torch.Tensor:
    return M.diagonal(dim1=-2, dim2=-1).sum(-1)


def attention_from_invariants(inv: Invariants, X: torch.Tensor) -> torch.Tensor:
    """``Y`` ``(B, E, L)`` of the layer for ``X`` ``(B, E, L)`` computed from its invariants alone: equal to
    :func:`attnid.attention.attention` of the parameters they came from (the proof that the set is complete)."""
    cfg = inv.cfg
    X = X.to(torch.float64)
    Xa = torch.cat([X, torch.ones_like(X[:, :1])], 1)  # (B, E+1, L)
    forms = torch.einsum("bel,hpef,bfm->bhpml", Xa, inv.heads["qk"], Xa)  # (B, H, parts, keys, queries)
    L = X.shape[-1]
    if cfg.R:
        theta = rope_angles(2, cfg.R, cfg.rope_base)[1]  # (R/2,) the pair frequencies
        offset = torch.arange(L, dtype=torch.float64)[:, None] - torch.arange(L, dtype=torch.float64)[None, :]
        ang = offset[None] * theta[:, None, None]  # (R/2, keys, queries): (n − m) θ_i
        weights = torch.stack([ang.cos(), ang.sin()], 1).reshape(cfg.R, L, L)
        if cfg.R < cfg.D:
            weights = torch.cat([weights, torch.ones(1, L, L, dtype=torch.float64)])
        A = (forms * weights).sum(2)
    else:
        A = forms.sum(2)
    if cfg.qk_norm:
        n_q, n_k = (cfg.D, cfg.D) if cfg.qk_norm == "head" else (cfg.H * cfg.D, cfg.G * cfg.D)
        if cfg.qk_norm == "head":
            rq = torch.einsum("bel,hef,bfl->bhl", Xa, inv.heads["gram_q"], Xa)
            rk = torch.einsum("bel,hef,bfl->bhl", Xa, inv.heads["gram_k"], Xa)
        else:
            rq = torch.einsum("bel,ef,bfl->bl", Xa, inv.layer["gram_q"], Xa)[:, None]
            rk = torch.einsum("bel,ef,bfl->bl", Xa, inv.layer["gram_k"], Xa)[:, None]
        eps = cfg.qk_norm_eps
        A = A / ((rk / n_k + eps).sqrt()[..., :, None] * (rq / n_q + eps).sqrt()[..., None, :])
    if cfg.logit_softcap is not None:
        A = cfg.logit_softcap * torch.tanh(A / cfg.logit_softcap)
    if cfg.causal:
        A = A.masked_fill(torch.ones(L, L, dtype=torch.bool).tril(-1), float("-inf"))
    P = torch.softmax(A, dim=-2)
    return torch.einsum("hef,bfk,bhkq->beq", inv.heads["vo"], X, P) + inv.layer["output_bias"][None, :, None]


# ------------------------------------------------------------------------------ distance modulo symmetry
def _check_comparable(a: Invariants, b: Invariants) -> None:
    if a.cfg != b.cfg:
        raise ValueError(f"invariants of different architectures cannot be compared: {a.cfg} vs {b.cfg}")


def _head_costs(a: Invariants, b: Invariants) -> torch.Tensor:
    """``(H, H)``: squared distance of head ``i`` of ``a`` to head ``j`` of ``b`` over all per-head invariants."""
    H = a.cfg.H
    va = torch.cat([t.reshape(H, -1) for t in a.heads.values()], 1)
    vb = torch.cat([t.reshape(H, -1) for t in b.heads.values()], 1)
    return torch.cdist(va, vb).pow(2)


def head_matching(a: Invariants, b: Invariants) -> list[int]:
    """The permutation ``π`` of heads (within key/value groups, groups moving as wholes) that makes ``b``'s
    head ``π[h]`` closest to ``a``'s head ``h``: exact, by an assignment within every pair of groups and then
    one between the groups (the cost of a group pairing is its best within-group assignment)."""
    return _matched(a, b)[0]


def _matched(a: Invariants, b: Invariants) -> tuple[list[int], float]:
    """:func:`head_matching`'s permutation and the squared distance of the matched heads."""
    _check_comparable(a, b)
    cfg = a.cfg
    n = cfg.H // cfg.G
    cost = _head_costs(a, b).numpy()
    inner: dict[tuple[int, int], tuple[float, list[int]]] = {}
    group_cost = np.zeros((cfg.G, cfg.G))
    for g in range(cfg.G):
        for h in range(cfg.G):
            block = cost[g * n : (g + 1) * n, h * n : (h + 1) * n]
            rows, cols = linear_sum_assignment(block)
            inner[g, h] = (float(block[rows, cols].sum()), [h * n + int(c) for c in cols])
            group_cost[g, h] = inner[g, h][0]
    _, partner = linear_sum_assignment(group_cost)
    perm = [j for g in range(cfg.G) for j in inner[g, int(partner[g])][1]]
    return perm, float(cost[np.arange(cfg.H), perm].sum())


def invariant_distance(a: Invariants, b: Invariants, *, relative: bool = False) -> float:
    """Frobenius distance between the invariants of ``a`` and of ``b`` after :func:`head_matching` (zero iff
    the two layers are the same function, up to the rounding of float64); ``relative``: over the larger of
    ``‖a‖`` and ``‖b‖``."""
    _, sq = _matched(a, b)
    sq += sum(float((a.layer[k] - b.layer[k]).pow(2).sum()) for k in a.layer)
    d = math.sqrt(max(sq, 0.0))
    return d / max(float(a.vector().norm()), float(b.vector().norm())) if relative else d


# ------------------------------------------------------------------------------ behind a LayerNorm
def fold_layernorm(
    cfg: AttentionConfig, p: AttentionParams, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[AttentionConfig, AttentionParams]:
    """The layer as a function of the standardised input ``z`` (mean 0, variance 1) of a LayerNorm
    ``γ ⊙ z + β``: ``W -> W diag(γ) Π`` and ``b -> b + W β`` for the query, key and value maps, with
    ``Π = I − 11ᵀ/E`` the projection onto the hyperplane ``Σ z = 0`` (float64; biases added where ``β`` needs
    them)."""
    g = weight.detach().to(torch.float64)
    beta = None if bias is None else bias.detach().to(torch.float64)
    E = cfg.E
    Pi = torch.eye(E, dtype=torch.float64) - 1.0 / E
    out = {k: v.detach().to(torch.float64) for k, v in p.items()}
    letters = set(cfg.bias)
    for W, b, letter in (("W_Q", "b_Q", "q"), ("W_K", "b_K", "k"), ("W_V", "b_V", "v")):
        Wp = out[W]
        if beta is not None:
            out[b] = out.get(b, torch.zeros(Wp.shape[:2], dtype=torch.float64)) + Wp @ beta
            letters.add(letter)
        out[W] = (Wp * g) @ Pi
    return cfg.with_(bias="".join(c for c in "qkvo" if c in letters)), out
