"""Training-dynamics metrics of the QK symmetry (paper §5; chapter 6).

All functions take per-head matrices with any leading batch dims (layers, heads):
``W_Q, W_K`` of shape ``(..., D, E)`` and optional biases ``b_Q, b_K`` of shape ``(..., D)``.
With biases the symmetry acts on the augmented ``[W | b]`` (``D x (E+1)``), so every metric
uses those. Computation is float64 on the inputs' device; results come back in float64.
"""

from __future__ import annotations

import torch


def augment(W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``[W | b]`` in float64: ``(..., D, E)`` -> ``(..., D, E+1)`` (or ``W`` itself if no bias)."""
    W = W.detach().to(torch.float64)
    return W if b is None else torch.cat([W, b.detach().to(torch.float64)[..., None]], dim=-1)


def split_augmented(Q: torch.Tensor, K: torch.Tensor, W_Q, b_Q, W_K, b_K):
    """Inverse of :func:`augment` for a pair: ``(W_Q, b_Q, W_K, b_K)`` in the dtypes of the originals."""
    E = W_Q.shape[-1]
    return (
        Q[..., :E].to(W_Q.dtype),
        None if b_Q is None else Q[..., E].to(b_Q.dtype),
        K[..., :E].to(W_K.dtype),
        None if b_K is None else K[..., E].to(b_K.dtype),
    )


def gram(M: torch.Tensor) -> torch.Tensor:
    return M @ M.transpose(-1, -2)


def beta(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Conserved quantity of gradient flow: ``β = Q Qᵀ − K Kᵀ`` (``(..., D, D)``)."""
    return gram(Q) - gram(K)


def tau(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """``τ = tr β = ‖Q‖² − ‖K‖²`` (signed)."""
    return (Q * Q).sum((-1, -2)) - (K * K).sum((-1, -2))


def head_beta_drift(beta_t: torch.Tensor, beta_0: torch.Tensor) -> torch.Tensor:
    """``‖β_t − β_0‖_F / ‖β_0‖_F`` of each head (``(..., D, D)`` -> ``(...)``); the training records'
    ``beta_drift`` takes the norms over all heads of a layer instead."""
    return torch.linalg.matrix_norm(beta_t - beta_0) / torch.linalg.matrix_norm(beta_0)


def solve_sylvester(GQ: torch.Tensor, GK: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """Solve ``S G_Q + G_K S = C`` for symmetric PSD ``G_Q, G_K`` by two eigendecompositions: with
    ``G_Q = U Λ Uᵀ``, ``G_K = V M Vᵀ``, ``(Vᵀ S U)_ij = (Vᵀ C U)_ij / (μ_i + λ_j)``. The solution is unique
    exactly when no ``μ_i + λ_j`` is zero, i.e. when ``G_Q`` and ``G_K`` are not both singular (both are PSD)."""
    lam, U = torch.linalg.eigh(GQ)
    mu, V = torch.linalg.eigh(GK)
    Ct = V.transpose(-1, -2) @ C @ U
    denom = mu[..., :, None] + lam[..., None, :]
    return V @ (Ct / denom) @ U.transpose(-1, -2)


def project_update(Q: torch.Tensor, K: torch.Tensor, A: torch.Tensor, B: torch.Tensor):
    """Orthogonal projection of the update ``(A, B)`` of ``(Q, K)`` onto the invariant
    directions ``{(S Q, −Sᵀ K)}``: returns ``S`` and the projected ``(S Q, −Sᵀ K)``.

    ``S`` solves ``S G_Q + G_K S = A Qᵀ − K Bᵀ`` (the normal equations of
    ``min_S ‖A − S Q‖² + ‖B + Sᵀ K‖²``).
    """
    S = solve_sylvester(gram(Q), gram(K), A @ Q.transpose(-1, -2) - K @ B.transpose(-1, -2))
    return S, S @ Q, -S.transpose(-1, -2) @ K


def _refuse_rope(rope: bool, what: str) -> None:
    if rope:
        raise ValueError(
            f"{what}: under RoPE only the commutant of the rotations is a symmetry, not every S "
            "(chapter 4); use rebalance_qk_rope / rebalance_params for rebalancing"
        )


def unidentified_step_fraction(
    Q: torch.Tensor, K: torch.Tensor, A: torch.Tensor, B: torch.Tensor, *, min_norm: float = 1e-30, rope: bool = False
) -> torch.Tensor:
    """``ρ = ‖(S Q, −Sᵀ K)‖² / ‖(A, B)‖²`` ∈ [0, 1], the share of the update ``(A, B)`` that
    lies in the invariant subspace. ``nan`` where ``‖(A, B)‖² < min_norm`` (no update).
    ``A, B`` may carry extra leading dims (several updates at the same point share one solve).
    Refused for a RoPE layer (``rope=True``), whose invariant subspace is only the commutant's."""
    _refuse_rope(rope, "unidentified_step_fraction")
    Q, K, A, B = (t.detach().to(torch.float64) for t in (Q, K, A, B))
    C = A @ Q.transpose(-1, -2) - K @ B.transpose(-1, -2)
    return step_fractions(gram(Q), gram(K), C, (A * A).sum((-1, -2)) + (B * B).sum((-1, -2)), min_norm=min_norm)


def step_fractions(
    G_Q: torch.Tensor, G_K: torch.Tensor, C: torch.Tensor, den: torch.Tensor, *, min_norm: float = 1e-30
) -> torch.Tensor:
    """:func:`unidentified_step_fraction` from what it needs of the point and the update: the Gram matrices
    ``G_Q = Q Qᵀ``, ``G_K = K Kᵀ`` ``(..., D, D)``, the right-hand side ``C = A Qᵀ − K Bᵀ`` (with any extra leading
    dims: several updates at one point) and ``den = ‖(A, B)‖²``. The projection's energy is ``⟨S, C⟩`` for the
    solution ``S`` of ``S G_Q + G_K S = C``; in the eigenbases ``G_Q = U Λ Uᵀ``, ``G_K = V M Vᵀ`` it is
    ``Σ_ij (Vᵀ C U)_ij² / (μ_i + λ_j)``, a sum of non-negative terms. ``nan`` where ``den < min_norm``."""
    lam, U = torch.linalg.eigh(G_Q)
    mu, V = torch.linalg.eigh(G_K)
    Ct = V.transpose(-1, -2) @ C @ U
    num = (Ct * Ct / (mu[..., :, None] + lam[..., None, :])).sum((-1, -2))
    return torch.where(den > min_norm, num / den.clamp_min(min_norm), torch.full_like(num, float("nan")))


def _sym_sqrt(G: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    w, U = torch.linalg.eigh(G)
    w = w.clamp_min(0).sqrt()
    if inverse:
        w = 1.0 / w
    return (U * w[..., None, :]) @ U.transpose(-1, -2)


def balancing_transform(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Symmetric ``S`` with ``S G_Q S = S⁻¹ G_K S⁻¹`` (so ``β = 0`` after
    ``(S Q, S⁻ᵀ K)``): ``P = G_Q^{-1/2} (G_Q^{1/2} G_K G_Q^{1/2})^{1/2} G_Q^{-1/2}``, ``S = P^{1/2}``."""
    GQ, GK = gram(Q), gram(K)
    rq, rq_inv = _sym_sqrt(GQ), _sym_sqrt(GQ, inverse=True)
    P = rq_inv @ _sym_sqrt(rq @ GK @ rq) @ rq_inv
    return _sym_sqrt((P + P.transpose(-1, -2)) / 2)


def rebalance_qk(
    W_Q: torch.Tensor, b_Q: torch.Tensor | None, W_K: torch.Tensor, b_K: torch.Tensor | None, *, rope: bool = False
):
    """Rebalanced ``(W_Q, b_Q, W_K, b_K)`` (same dtype/device as the inputs): outputs unchanged,
    ``β`` of the augmented matrices zero, and ``‖Q‖² + ‖K‖²`` minimal on the orbit.
    Refused for a RoPE layer (``rope=True``): it would change its outputs; see :func:`rebalance_qk_rope`."""
    _refuse_rope(rope, "rebalance_qk")
    Q, K = augment(W_Q, b_Q), augment(W_K, b_K)
    S = balancing_transform(Q, K)
    Q2, K2 = S @ Q, torch.linalg.solve(S, K)  # S symmetric: S^{-T} K = S^{-1} K
    return split_augmented(Q2, K2, W_Q, b_Q, W_K, b_K)


def qk_singular_values(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Singular values of the QK product ``Kᵀ Q`` per head, ``(..., D)`` (its rank is ≤ D).

    ``K = G_K^{1/2} O_K`` with orthonormal rows ``O_K``, so ``σ(Kᵀ Q) = σ(G_K^{1/2} G_Q^{1/2})``.
    """
    return qk_singular_values_of_grams(gram(Q), gram(K))


def qk_singular_values_of_grams(G_Q: torch.Tensor, G_K: torch.Tensor) -> torch.Tensor:
    """:func:`qk_singular_values` from the Gram matrices ``G_Q = Q Qᵀ``, ``G_K = K Kᵀ``: ``σ(G_K^{1/2} G_Q^{1/2})``."""
    return torch.linalg.svdvals(_sym_sqrt(G_K) @ _sym_sqrt(G_Q))


ROPE_LAYOUTS = ("interleaved", "half")


def rebalance_qk_rope(
    W_Q: torch.Tensor,
    b_Q: torch.Tensor | None,
    W_K: torch.Tensor,
    b_K: torch.Tensor | None,
    *,
    layout: str = "interleaved",
):
    """Rebalancing restricted to the RoPE commutant (chapter 4), for full RoPE (every coordinate rotated):
    only one scaled rotation per frequency pair is allowed, and rotations do not change norms, so the
    minimum-norm point scales pair ``i`` by ``a_i = (‖K_i‖² / ‖Q_i‖²)^{1/4}``. Afterwards each pair has
    ``‖Q_i‖ = ‖K_i‖`` (the trace of every 2×2 diagonal block of β is zero), but β itself is not zero.

    ``layout`` says which rows form a pair: ``"interleaved"`` (rows ``2i, 2i+1``, this package's RoPE,
    :mod:`attnid.rope`) or ``"half"`` (rows ``i, i + D/2``, the ``rotate_half`` of Hugging Face models)."""
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(ROPE_LAYOUTS)}, got {layout!r}")
    Q, K = augment(W_Q, b_Q), augment(W_K, b_K)
    D = Q.shape[-2]
    if D % 2:
        raise ValueError(f"rebalance_qk_rope: RoPE pairs need an even head dimension, got D = {D}")

    def pair_energy(M: torch.Tensor) -> torch.Tensor:  # (..., D, n) -> (..., D/2)
        e = (M * M).sum(-1)
        if layout == "interleaved":
            return e.reshape(*e.shape[:-1], D // 2, 2).sum(-1)
        return e[..., : D // 2] + e[..., D // 2 :]

    ratio = (pair_energy(K) / pair_energy(Q)).pow(0.25)
    a = (ratio.repeat_interleave(2, dim=-1) if layout == "interleaved" else torch.cat([ratio, ratio], -1))[..., None]
    Q2, K2 = a * Q, K / a
    return split_augmented(Q2, K2, W_Q, b_Q, W_K, b_K)


def rebalance_params(p: dict, cfg) -> dict:
    """Rebalance the QK block of a column-form layer (:mod:`attnid.attention`): the full rebalance without
    RoPE, the commutant-only one with it. Outputs unchanged either way. Not for GQA (``G < H``), where one
    ``S`` is shared by the query heads of a group."""
    if cfg.G != cfg.H:
        raise ValueError(f"rebalance_params: GQA (G = {cfg.G} < H = {cfg.H}) shares one S per group; not supported")
    new = (rebalance_qk_rope if cfg.rope else rebalance_qk)(p["W_Q"], p.get("b_Q"), p["W_K"], p.get("b_K"))
    out = dict(p)
    for name, value in zip(("W_Q", "b_Q", "W_K", "b_K"), new):
        if value is not None:
            out[name] = value
    return out


# ------------------------------------------------------------- QK-norm (chapter 9)
def trade_groups(cfg) -> list[list[int]]:
    """The coordinates of a head whose query-norm and key-norm weights trade one common factor under
    QK-norm: each rotated pair ``(2i, 2i + 1)`` (our layer's pairing) and each unrotated coordinate alone."""
    return [[i, i + 1] for i in range(0, cfg.R, 2)] + [[i] for i in range(cfg.R, cfg.D)]


def qk_norm_quantities(p: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """What gradient flow conserves in an attention layer with QK-norm (``cfg.qk_norm``, chapter 9), one value
    per symmetry, float64: ``"scale_Q"``, ``"scale_K"``: ``‖[W | b]‖²`` of each normalised projection (per head
    or group, or the whole projection for ``"proj"``): conserved at ``ε = 0`` only; ``"trade"``: per trade
    group (:func:`trade_groups`, and per key/value group for ``"proj"``) ``Σ g_Q² − Σ g_K²`` over the query
    heads sharing the key weight. Noether: a symmetry ``θ -> θ + s δ(θ)`` of the loss makes ``<∇L, δ(θ)> = 0``,
    so under ``dθ/dt = −∇L`` the quantity whose gradient is ``2 δ(θ)`` stays constant."""
    return {k: v.detach() for k, v in _qk_norm_quantities(p, cfg).items()}


def _qk_norm_quantities(p: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """:func:`qk_norm_quantities`, differentiable."""
    if cfg.qk_norm not in ("head", "proj"):
        raise ValueError(f"qk_norm_quantities: written for RMSNorm with a weight ('head', 'proj'), not {cfg.qk_norm!r}")
    squares = {
        s: p[f"W_{s}"].double().pow(2).sum(-1) + (p[f"b_{s}"].double().pow(2) if f"b_{s}" in p else 0.0) for s in "QK"
    }  # (heads, D): each row's ‖[w | b]‖²
    if cfg.qk_norm == "head":
        scale_Q, scale_K = squares["Q"].sum(-1), squares["K"].sum(-1)
        gQ, gK = p["g_Q"].double()[None, None], p["g_K"].double()[None]  # (1, 1, D), (1, D)
    else:
        scale_Q, scale_K = squares["Q"].sum()[None], squares["K"].sum()[None]
        gQ = p["g_Q"].double().reshape(cfg.G, cfg.H // cfg.G, cfg.D)  # the query heads of a group together
        gK = p["g_K"].double()
    trade = torch.stack(
        [gQ[..., idx].pow(2).sum((-1, -2)) - gK[..., idx].pow(2).sum(-1) for idx in trade_groups(cfg)], dim=-1
    )
    return {"scale_Q": scale_Q, "scale_K": scale_K, "trade": trade.reshape(-1)}


def qk_norm_flow_rates(p: dict[str, torch.Tensor], cfg, loss) -> dict[str, torch.Tensor]:
    """``d/dt`` of each :func:`qk_norm_quantities` value under gradient flow on ``loss(p)`` (a scalar):
    zero where the quantity is conserved. Computed from the gradient, float64."""
    leaves = {k: v.detach().double().requires_grad_(True) for k, v in p.items()}
    grads = dict(zip(leaves, torch.autograd.grad(loss(leaves), list(leaves.values())), strict=True))
    qs = _qk_norm_quantities(leaves, cfg)
    flat = torch.cat([qs[k] for k in ("scale_Q", "scale_K", "trade")])
    rate = torch.zeros_like(flat)
    for i in range(flat.numel()):  # d q / dt = −<∇q, ∇L>, one quantity at a time (a few dozen)
        dq = torch.autograd.grad(flat[i], list(leaves.values()), retain_graph=True, allow_unused=True)
        rate[i] = -sum((a * grads[k]).sum() for a, k in zip(dq, leaves, strict=True) if a is not None)
    sizes = [qs[k].numel() for k in ("scale_Q", "scale_K", "trade")]
    return dict(zip(("scale_Q", "scale_K", "trade"), rate.detach().split(sizes), strict=True))
