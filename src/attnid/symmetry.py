"""The invariances of attention (paper §4.1–4.9; chapters 2–4) and their tangent directions.

* QK: ``(S W_Q, S⁻ᵀ W_K)`` with one ``S ∈ R^{D×D}`` per key group (acting on the biases too).
  With RoPE, ``S`` must commute with the rotations (:func:`attnid.rope.commutant_basis`); with
  partial RoPE it is free on the unrotated dimensions.
* VO: ``(W_O S⁻¹, S W_V)`` with one ``S ∈ R^{C×C}`` per value group (and ``b_V -> S b_V``).
* Key bias: any shift of ``b_K`` (no RoPE).
* Value bias: ``b_V`` can be moved into ``b_O`` (``b_O += Σ_h W_O^h b_V^g``).

Every function takes and returns an ``AttentionParams`` dict; nothing is modified in place.
"""

from __future__ import annotations

import scipy.sparse
import torch

from .attention import AttentionConfig, AttentionParams, param_slices
from .rope import commutant_basis


def _per_head(t: torch.Tensor, cfg: AttentionConfig) -> torch.Tensor:
    """Repeat a per-group tensor ``(G, ...)`` to per-head ``(H, ...)``."""
    return t.repeat_interleave(cfg.H // cfg.G, dim=0)


def transform_qk(p: AttentionParams, cfg: AttentionConfig, S: torch.Tensor) -> AttentionParams:
    """``W_Q^h -> S_g W_Q^h``, ``W_K^g -> S_g⁻ᵀ W_K^g`` (biases alike). ``S``: ``(G, D, D)`` or ``(D, D)``."""
    S = S.to(p["W_Q"].dtype).expand(cfg.G, cfg.D, cfg.D)
    S_inv_T = torch.linalg.inv(S).transpose(-1, -2)
    Sh = _per_head(S, cfg)
    out = dict(p)
    out["W_Q"] = Sh @ p["W_Q"]
    out["W_K"] = S_inv_T @ p["W_K"]
    if "b_Q" in p:
        out["b_Q"] = (Sh @ p["b_Q"][..., None])[..., 0]
    if "b_K" in p:
        out["b_K"] = (S_inv_T @ p["b_K"][..., None])[..., 0]
    return out


def transform_vo(p: AttentionParams, cfg: AttentionConfig, S: torch.Tensor) -> AttentionParams:
    """``W_V^g -> S_g W_V^g``, ``b_V^g -> S_g b_V^g``, ``W_O^h -> W_O^h S_g⁻¹``. ``S``: ``(G, C, C)`` or ``(C, C)``."""
    S = S.to(p["W_V"].dtype).expand(cfg.G, cfg.C, cfg.C)
    out = dict(p)
    out["W_V"] = S @ p["W_V"]
    out["W_O"] = p["W_O"] @ _per_head(torch.linalg.inv(S), cfg)
    if "b_V" in p:
        out["b_V"] = (S @ p["b_V"][..., None])[..., 0]
    return out


def shift_key_bias(p: AttentionParams, delta: torch.Tensor) -> AttentionParams:
    """``b_K -> b_K + delta`` (``delta``: ``(G, D)``). Invariant without RoPE, and with partial RoPE
    for a ``delta`` on the unrotated dimensions only."""
    out = dict(p)
    out["b_K"] = p["b_K"] + delta.to(p["b_K"].dtype)
    return out


def absorb_value_bias(p: AttentionParams, cfg: AttentionConfig) -> AttentionParams:
    """Move ``b_V`` into ``b_O``: ``b_O += Σ_h W_O^h b_V^g``, ``b_V -> 0``. Needs ``b_O``."""
    if "b_O" not in p:
        raise ValueError("absorb_value_bias: the layer has no output bias to absorb into")
    out = dict(p)
    out["b_O"] = p["b_O"] + torch.einsum("hec,hc->e", p["W_O"], _per_head(p["b_V"], cfg))
    out["b_V"] = torch.zeros_like(p["b_V"])
    return out


def value_bias_direction(p: AttentionParams, cfg: AttentionConfig, delta: torch.Tensor) -> dict[str, torch.Tensor]:
    """The unidentified direction of the value bias (chapter 3): ``δb_V = delta`` ``(G, C)`` together with
    ``δb_O = −Σ_h W_O^h δb_V^g``; the output is unchanged along it (to first order and exactly)."""
    if "b_O" not in p or "b_V" not in p:
        raise ValueError("value_bias_direction: needs a value bias and an output bias")
    return {"b_V": delta, "b_O": -torch.einsum("hec,hc->e", p["W_O"], _per_head(delta, cfg))}


# ----------------------------------------------------------------- tangent directions
def qk_generators(cfg: AttentionConfig) -> torch.Tensor:
    """Matrices ``S`` whose QK directions span the invariant subspace: ``(k, D, D)``,
    all ``D²`` unit matrices, or the RoPE commutant (``R + (D − R)²``)."""
    if cfg.rope:
        return commutant_basis(cfg.D, cfg.R)
    return torch.eye(cfg.D * cfg.D, dtype=torch.float64).reshape(-1, cfg.D, cfg.D)


def qk_direction(p: AttentionParams, cfg: AttentionConfig, S: torch.Tensor) -> AttentionParams:
    """Tangent ``(S W_Q, −Sᵀ W_K)`` (biases alike) of the QK orbit; ``S``: ``(G, D, D)``.
    Zero entries for all other parameters."""
    d = {k: torch.zeros_like(v) for k, v in p.items()}
    S = S.to(p["W_Q"].dtype)
    Sh, St = _per_head(S, cfg), S.transpose(-1, -2)
    d["W_Q"] = Sh @ p["W_Q"]
    d["W_K"] = -St @ p["W_K"]
    if "b_Q" in p:
        d["b_Q"] = (Sh @ p["b_Q"][..., None])[..., 0]
    if "b_K" in p:
        d["b_K"] = -(St @ p["b_K"][..., None])[..., 0]
    return d


def vo_direction(p: AttentionParams, cfg: AttentionConfig, S: torch.Tensor) -> AttentionParams:
    """Tangent ``(−W_O S, S W_V)`` (``b_V`` alike) of the VO orbit; ``S``: ``(G, C, C)``."""
    d = {k: torch.zeros_like(v) for k, v in p.items()}
    S = S.to(p["W_V"].dtype)
    d["W_V"] = S @ p["W_V"]
    d["W_O"] = -p["W_O"] @ _per_head(S, cfg)
    if "b_V" in p:
        d["b_V"] = (S @ p["b_V"][..., None])[..., 0]
    return d


def tangent_basis(p: AttentionParams, cfg: AttentionConfig) -> dict[str, torch.Tensor]:
    """Known directions of zero first-order change, by block: ``{block: (n_params, k)}``.

    Blocks as in :func:`attnid.counting.count`. Assumes ``D, C <= E`` (where the
    counts are ``D²``/``C²`` per group); for the value bias without an output bias the
    directions are the null space of ``b_V -> Σ_h W_O^h b_V^g``. The blocks are views of the rows of
    :func:`tangent_rows`, made dense.
    """
    rows, blocks = tangent_rows(p, cfg)
    dense = torch.from_numpy(rows.toarray())
    return {k: dense[sl].T for k, sl in blocks.items()}


def _value_bias_moves(p: AttentionParams, cfg: AttentionConfig) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The value-bias directions: their ``δb_V`` rows ``(k, G·C)`` and ``δb_O`` rows ``(k, E)`` (each unit ``δb_V``
    with ``−Σ_h W_O^h δb_V``), or without ``b_O`` the null space of ``b_V -> Σ_h W_O^h b_V^g`` and ``None``."""
    if "b_V" not in p:
        return None
    G, C = cfg.G, cfg.C
    M = p["W_O"].reshape(G, cfg.H // G, cfg.E, C).sum(1).permute(1, 0, 2).reshape(cfg.E, G * C)  # (E, G·C)
    if "b_O" in p:
        return torch.eye(G * C, dtype=p["b_V"].dtype), -M.T
    _, s, Vh = torch.linalg.svd(M.to(torch.float64))
    return Vh[int((s > s.max() * 1e-12).sum()) :].to(p["b_V"].dtype), None


def tangent_rows(p: AttentionParams, cfg: AttentionConfig) -> tuple[scipy.sparse.csr_array, dict[str, slice]]:
    """The directions of :func:`tangent_basis` as the rows of one sparse ``(k, n_params)`` matrix (θ's order), and
    the rows of each block: per group, ``(S W_Q, −Sᵀ W_K)`` for each generator ``S`` of :func:`qk_generators` and
    ``(−W_O S, S W_V)`` for each unit ``S`` of ``R^{C×C}``; a unit shift of each unrotated key-bias coordinate;
    ``(δb_V, −Σ_h W_O^h δb_V)`` for each unit ``δb_V`` (or, without ``b_O``, the null space of that map); the
    entries of :func:`qk_direction` and :func:`vo_direction`. Sparse: at E = 128 the dense matrix holds 2.3 GB for
    a few MB of entries that are not zero."""
    if cfg.D > cfg.E or cfg.C > cfg.E:
        raise ValueError("tangent_basis: needs head_dim <= embed and value_dim <= embed")
    G, n_h, D, C = cfg.G, cfg.H // cfg.G, cfg.D, cfg.C
    dtype = p["W_Q"].dtype
    where = param_slices(p)
    gens = qk_generators(cfg).to(dtype)  # (m, D, D)
    units = torch.eye(C * C, dtype=dtype).reshape(-1, C, C)  # the unit S, row-major
    value_bias = _value_bias_moves(p, cfg)
    counts = {
        "qk": G * len(gens),
        "vo": G * C * C,
        "key_bias": G * (D - cfg.R) if "b_K" in p else 0,
        "value_bias": 0 if value_bias is None else len(value_bias[0]),
    }
    blocks, k = {}, 0
    for name, c in counts.items():
        blocks[name], k = slice(k, k + c), k + c
    entries: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (rows, columns, values)

    def put(name: str, a: int, sel: tuple, values: torch.Tensor) -> None:  # rows a.., the entries p[name][sel]
        cols = torch.arange(where[name].start, where[name].stop).reshape(p[name].shape)[sel].reshape(-1)
        rows = torch.arange(a, a + len(values)).repeat_interleave(len(cols))
        entries.append((rows, cols.repeat(len(values)), values.reshape(-1)))

    for g in range(G):
        heads, a = slice(g * n_h, (g + 1) * n_h), blocks["qk"].start + g * len(gens)
        put("W_Q", a, (heads,), torch.einsum("sij,hje->shie", gens, p["W_Q"][heads]))
        put("W_K", a, (g,), -torch.einsum("sji,je->sie", gens, p["W_K"][g]))
        if "b_Q" in p:
            put("b_Q", a, (heads,), torch.einsum("sij,hj->shi", gens, p["b_Q"][heads]))
        if "b_K" in p:
            put("b_K", a, (g,), -torch.einsum("sji,j->si", gens, p["b_K"][g]))
        a = blocks["vo"].start + g * C * C
        put("W_V", a, (g,), torch.einsum("sab,be->sae", units, p["W_V"][g]))
        put("W_O", a, (heads,), -torch.einsum("hea,sab->sheb", p["W_O"][heads], units))
        if "b_V" in p:
            put("b_V", a, (g,), torch.einsum("sab,b->sa", units, p["b_V"][g]))
    if counts["key_bias"]:  # a unit shift of each unrotated coordinate (all of them without RoPE)
        cols = torch.arange(where["b_K"].start, where["b_K"].stop).reshape(G, D)[:, cfg.R :].reshape(-1)
        entries.append(
            (torch.arange(blocks["key_bias"].start, blocks["key_bias"].stop), cols, torch.ones_like(cols, dtype=dtype))
        )
    if value_bias is not None:
        a = blocks["value_bias"].start
        put("b_V", a, (), value_bias[0])
        if value_bias[1] is not None:
            put("b_O", a, (), value_bias[1])
    n = sum(v.numel() for v in p.values())
    r, c, v = (torch.cat(x).numpy() for x in zip(*entries))
    out = scipy.sparse.csr_array((v, (r, c)), shape=(k, n))
    out.eliminate_zeros()
    return out, blocks


# ----------------------------------------------------------------- probes used by the book
def step_response(
    p: AttentionParams, cfg: AttentionConfig, X: torch.Tensor, direction: AttentionParams, steps
) -> torch.Tensor:
    """``max |Y(θ + t d) − Y(θ)|`` for each step ``t`` (paper §4.2; chapter 2): it grows like ``t``
    along a generic direction and like ``t²`` along a tangent of an invariant orbit."""
    from .attention import attention

    Y0 = attention(X, p, cfg)
    out = []
    for t in steps:
        q = {k: v + t * direction[k] for k, v in p.items()}
        out.append((attention(X, q, cfg) - Y0).abs().max())
    return torch.stack(out)


def bias_gradients(
    p: AttentionParams, cfg: AttentionConfig, X: torch.Tensor, *, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Gradient of every parameter for the loss ``⟨R, Y⟩`` with a random ``R`` (paper §4.6)."""
    from .attention import attention

    q = {k: v.detach().clone().requires_grad_(True) for k, v in p.items()}
    R = torch.randn(X.shape[0], cfg.E, X.shape[-1], generator=torch.Generator().manual_seed(seed), dtype=X.dtype)
    (attention(X, q, cfg) * R).sum().backward()
    return {k: v.grad if v.grad is not None else torch.zeros_like(v) for k, v in q.items()}


def bias_gradient_norms(
    p: AttentionParams, cfg: AttentionConfig, X: torch.Tensor, *, seed: int = 0
) -> dict[str, float]:
    """Norm of the gradient of every bias for the loss ``⟨R, Y⟩`` with a random ``R``
    (paper §4.6: the key bias gets exactly zero without RoPE, up to round-off)."""
    g = bias_gradients(p, cfg, X, seed=seed)
    return {k: float(g[k].norm()) for k in ("b_Q", "b_K", "b_V", "b_O") if k in g}
