"""Step 4 of a certificate (:mod:`attnid.certify`), two strategies: :func:`per_group_certificate` (``W_O``
injective: each group's projected Jacobian as a block-triangular factor, its value channels from a small QR
and its query/key block from a Cholesky of its Gram; extreme singular values by :func:`group_singular_values`)
and :func:`whole_sketch_certificate` (one Gaussian sketch of side ``n_free`` and its condition number)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.linalg
import torch
from torch.func import vjp, vmap

from .activations import _JacobianBlock
from .blocks import _gram_on_complement, _GroupBlock
from .linalg import (
    GRAM_MARGIN,
    INVERSE_ITER,
    StageTimer,
    _buffer,
    _fortran,
    _gram_factor,
    _on_complement,
    smallest_singular_value,
    top_singular_value,
)


def _projector(Qz: torch.Tensor, Bsz: int, L: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """``u`` ``(B, rows, L)`` -> ``u`` with the span of ``Z``'s token rows removed, flattened."""

    def project(u: torch.Tensor) -> torch.Tensor:
        rows = u.shape[1]
        ut = u.permute(0, 2, 1).reshape(Bsz * L, rows)
        ut = ut - Qz @ (Qz.T @ ut)
        return ut.reshape(Bsz, L, rows).permute(0, 2, 1).reshape(-1)

    return project


@dataclass
class Certificate:
    """Steps 4–5: which route certified the free coordinates, the smallest singular value it vouches for
    (``kept``), whether the rest is certified of full rank, and the route's own numbers (the sketch's condition
    number; or ``σ_min(W_O)`` and the weakest group's ``σ_min / σ_max``)."""

    route: str
    kept: float
    certified: bool
    sketch_cond: float | None = None
    wo_min: float | None = None
    group_ratio: float | None = None
    seconds: dict[str, float] = field(default_factory=dict)


def _progress_bar(total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="column")


def _tick(bar, rows: int) -> None:
    if bar is not None:
        bar.update(rows)


def whole_sketch_certificate(
    block: _JacobianBlock, project: Callable, gen: torch.Generator, sigma_max: float, rtol: float, chunk: int, bar=None
) -> Certificate:
    """Step 4, whole route: a Gaussian sketch ``Ωᵀ P J`` of side ``n_free`` (a VJP per row); it is
    nonsingular with a condition number below ``1/rtol`` exactly when ``P J`` has full rank on the free
    coordinates, to that tolerance."""
    t0 = time.perf_counter()
    cols = block.cols[block.free]
    nb = len(cols)
    Bsz, L = block.shape
    m_b = Bsz * block.rows * L
    M = torch.empty(nb, nb, dtype=torch.float64)
    vjp_b = vjp(block.fn, block.theta)[1]
    for j in range(0, nb, chunk):
        rows = min(chunk, nb - j)  # any generic random matrix will do; float32 draws are twice as fast
        omega = torch.randn(rows, Bsz, block.rows, L, generator=gen).double() / math.sqrt(m_b)
        M[j : j + rows] = vmap(vjp_b)(vmap(project)(omega))[0][:, cols]
        _tick(bar, rows)
    t1 = time.perf_counter()
    cond = 1.0
    if nb:  # the condition number need not be exact
        k_min = smallest_singular_value(M, gen)
        k_max = top_singular_value(lambda V: (V @ M.T) @ M, nb, gen)  # (V Mᵀ) M: no transposed-A product
        cond = k_max / k_min if k_min > 0 else math.inf
    seconds = {"block_jacobians": t1 - t0, "block_factors": time.perf_counter() - t1}
    return Certificate("whole sketch", sigma_max / cond, cond < 1 / rtol, sketch_cond=cond, seconds=seconds)


def group_singular_values(
    block: _GroupBlock,
    Qz: torch.Tensor,
    gen: torch.Generator,
    timer: StageTimer | None = None,
    work: dict | None = None,
) -> tuple[float, float]:
    """Bounds ``(low, high)`` on the smallest and largest singular values of a group's Jacobian ``P J_g``
    projected off the output block's rows (``Qz``), on the complement of its known directions.

    The rows of ``J_g`` are mixtures ``Z[b, k, c, i]``; ``P`` acts on the tokens ``(b, i)`` of each head ``k`` and
    channel ``c``. Where the value channels mix alone, ``J_g = [I_C ⊗ A | J_rest]`` with ``A`` ``(n·B·L, a)`` the
    value map on the rows of ``value_rows`` (:meth:`GroupActivations.value_map`): its QR ``A = Q_s R_s`` costs
    nothing, and in the token basis ``[Q_s | Q']`` (``Q'`` the tokens neither the output block nor ``A`` reaches)

        P J_g ≅ R = [[I_C ⊗ R_s, B1], [0, B2]],   B1 = (I_C ⊗ Q_s)ᵀ J_rest Q_⊥,  B2 = (I_C ⊗ Q')ᵀ J_rest Q_⊥,

    an upper block-triangular matrix with the same singular values once ``B2`` is factored (``R22``). So only the
    query/key part is factored at full size. ``R22ᵀR22 = B2ᵀB2 = Q_⊥ᵀ (Σ_c J_cᵀJ_c − WᵀW) Q_⊥`` with
    ``W = (I_C ⊗ [heads_Qz Q_s])ᵀ J_rest`` (:func:`_query_key_factor`). Without the split, ``B2`` is formed one
    channel at a time and its Gram factored (:func:`_gram_factor`). ``low`` and ``high`` are the block inverse and
    power iterations on ``R`` (applied block by block, never formed), widened by the Gram's rounding bound; where
    that bound is above ``GRAM_MARGIN σ_min²``, or the Cholesky fails, ``R22`` is the R of a QR of ``B2`` (exact).
    ``work``: arrays reused from group to group."""
    work = {} if work is None else work
    timer = StageTimer() if timer is None else timer
    acts, C, n = block.acts, block.sub.C, block.sub.H
    heads_Qz = torch.block_diag(*[Qz] * n)  # (n·B·L, n·rank_z): the output block's rows, for each head
    Q_s, R_s = heads_Qz.new_zeros(len(heads_Qz), 0), heads_Qz.new_zeros(0, 0)
    if block.value_map is not None and block.value_rows is not None:
        A = block.value_map @ block.value_rows
        A = A - heads_Qz @ (heads_Qz.T @ A)
        Q_s, R_s = torch.linalg.qr(A - heads_Qz @ (heads_Qz.T @ A))  # projected twice: Q_s ⟂ heads_Qz to rounding
    reached = torch.cat([heads_Qz, Q_s], 1)
    n_rest = len(acts.ext_order(block.rest))
    n2 = n_rest - (0 if block.rest_qr is None else block.rest_qr[0].shape[1])
    factor = None
    if block.rest == "QK" and n2 and C * (len(heads_Qz) - reached.shape[1]) >= n2:
        factor = _query_key_factor(block, reached, heads_Qz.shape[1], n2, work)
    timer("block_jacobians")
    low = high = 0.0
    if factor is not None:
        B1, R22, err = factor
        low, high = _block_triangular_singular_values(R_s, C, B1, R22, gen)
    if factor is None or err > GRAM_MARGIN * low**2:  # B2 itself, one channel at a time
        B1, B2 = _row_blocks(block, reached, Q_s, n2, work)
        timer("block_jacobians")
        for exact in (False, True):
            R22_rows, err = _gram_factor(B2, exact, _fortran(work, "gram", n2))
            if R22_rows is None:
                return 0.0, math.inf
            low, high = _block_triangular_singular_values(R_s, C, B1, R22_rows, gen)
            if err <= GRAM_MARGIN * low**2:
                break
    timer("block_factors")
    return math.sqrt(max(low**2 - err, 0.0)), math.sqrt(high**2 + err)


def _query_key_factor(
    block: _GroupBlock, reached: torch.Tensor, rz: int, n2: int, work: dict
) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """``B1``, ``R22`` and the rounding bound ``err`` of :func:`group_singular_values` from the query/key Gram:
    ``R22ᵀR22 = Q_⊥ᵀ (Σ_c J_cᵀJ_c − WᵀW) Q_⊥``, ``W = (I_C ⊗ reached)ᵀ J_rest`` (``reached = [heads_Qz Q_s]``, the
    first ``rz`` columns the output block's): ``Σ_c J_cᵀJ_c`` from the activations without forming ``J``
    (:meth:`GroupActivations.query_key_gram`), ``WᵀW`` from ``C·(n·rank_z + a)`` rows where ``B2`` has
    ``C·(n·B·L − n·rank_z − a)``; ``None`` where the Cholesky fails."""
    acts, C = block.acts, block.sub.C
    tokens, r = reached.shape
    a, n_rest = r - rz, n2 + (0 if block.rest_qr is None else block.rest_qr[0].shape[1])
    gram, scale = acts.query_key_gram(work, _buffer(work, "G", (n_rest, n_rest)))
    W = _buffer(work, "W", (C, r, n_rest))
    J_c = _buffer(work, "J_c", (tokens, n_rest))
    for c in range(C):
        torch.matmul(reached.T, acts.columns("QK", c, out=J_c), out=W[c])
    B1_rows = _buffer(work, "B1_rows", (C * a, n_rest))
    B1_rows.view(C, a, n_rest).copy_(W[:, rz:])
    B1 = _on_complement(B1_rows, block.rest_qr)
    W2 = W.view(C * r, n_rest)
    upper = scipy.linalg.blas.dsyrk(  # G − WᵀW, upper triangle, over G in Fortran order (it is symmetric)
        -1.0, W2.numpy().T, beta=1.0, c=gram.numpy().T, trans=0, overwrite_c=1
    )
    G2 = _gram_on_complement(upper, block.rest_qr, _fortran(work, "gram", n2))  # Q_⊥ᵀ G Q_⊥, upper triangle
    # rounding: each entry of the Gram a sum of C·n·B·L·L products (W's of n·B·L, WᵀW's of C·r), then the two
    # sides' reflections and the Cholesky (Higham, §3.5, Thm 10.3 and §19.3); ‖Ĵ‖_F² bounds the sums' absolute
    # terms and ‖W‖_F ≤ √r ‖J‖_F
    terms = C * tokens * acts.X.shape[2] + tokens + C * r + 2 * n_rest + n2 + 1
    u = np.finfo(np.float64).eps / 2
    w2 = float(torch.linalg.vector_norm(W2)) ** 2
    err = 1.01 * terms * u / (1 - terms * u) * (2 * scale + w2 + 2 * math.sqrt(r * scale * w2))
    try:
        R22 = torch.from_numpy(scipy.linalg.cholesky(G2, lower=False, overwrite_a=True, check_finite=False))
    except np.linalg.LinAlgError:
        return None
    return B1, R22, err


def _row_blocks(
    block: _GroupBlock, reached: torch.Tensor, Q_s: torch.Tensor, n2: int, work: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """``B1`` ``(C·a, n2)`` and ``B2`` ``(C·q, n2)`` of :func:`group_singular_values` themselves, one channel's
    columns at a time: ``(n·B·L, n_rest)``, on the complement of the known directions, then to the rows."""
    acts, C = block.acts, block.sub.C
    Q_rest = torch.linalg.qr(reached, mode="complete").Q[:, reached.shape[1] :]
    a, q = Q_s.shape[1], Q_rest.shape[1]
    J_c = _buffer(work, "J_c", (len(reached), len(acts.ext_order(block.rest))))
    B1, B2 = _buffer(work, "B1", (C * a, n2)), _buffer(work, "B2", (C * q, n2))
    for c in range(C):
        JQ = _on_complement(acts.columns(block.rest, c, out=J_c), block.rest_qr)
        torch.matmul(Q_s.T, JQ, out=B1[c * a : (c + 1) * a])
        torch.matmul(Q_rest.T, JQ, out=B2[c * q : (c + 1) * q])
    return B1, B2


def _block_triangular_singular_values(
    R_s: torch.Tensor, C: int, B1: torch.Tensor, R22: torch.Tensor, gen: torch.Generator
) -> tuple[float, float]:
    """Estimates of the smallest and largest singular values of ``R = [[I_C ⊗ R_s, B1], [0, R22]]`` (``R_s``,
    ``R22`` upper triangular): block inverse iteration (two triangular solves per step) and block power
    iteration, applied block by block (:func:`smallest_singular_value`, :func:`top_singular_value`)."""
    a, n1 = R_s.shape[0], B1.shape[0]

    def times_Rt(V: torch.Tensor) -> torch.Tensor:  # V Rᵀ for rows V (b, n1 + n2)
        V1, V2 = V[:, :n1], V[:, n1:]
        U1 = (V1.reshape(len(V), C, a) @ R_s.T).reshape(len(V), n1) + V2 @ B1.T
        return torch.cat([U1, V2 @ R22.T], 1)

    def times_R(U: torch.Tensor) -> torch.Tensor:  # U R
        U1, U2 = U[:, :n1], U[:, n1:]
        return torch.cat([(U1.reshape(len(U), C, a) @ R_s).reshape(len(U), n1), U1 @ B1 + U2 @ R22], 1)

    def per_channel(M: torch.Tensor) -> torch.Tensor:  # rows (b, C·a) -> (C, a, b)
        return M.reshape(len(M), C, a).permute(1, 2, 0)

    def from_channels(M: torch.Tensor) -> torch.Tensor:  # (C, a, b) -> rows (b, C·a)
        return M.permute(2, 0, 1).reshape(M.shape[2], n1)

    def gram_inverse(V: torch.Tensor) -> torch.Tensor:  # V R⁻¹ R⁻ᵀ, row by row (no transposed-A products)
        Y1 = from_channels(torch.linalg.solve_triangular(R_s.T, per_channel(V[:, :n1]), upper=False))  # V₁ R₁₁⁻¹
        Y2 = torch.linalg.solve_triangular(R22.T, (V[:, n1:] - Y1 @ B1).T, upper=False).T  # (V₂ − Y₁ B1) R22⁻¹
        Z2 = torch.linalg.solve_triangular(R22, Y2.T, upper=True).T  # Y₂ R22⁻ᵀ
        Z1 = from_channels(torch.linalg.solve_triangular(R_s, per_channel(Y1 - Z2 @ B1.T), upper=True))
        return torch.cat([Z1, Z2], 1)

    size = n1 + R22.shape[0]
    if not (bool(R_s.diagonal().ne(0).all()) and bool(R22.diagonal().ne(0).all())):
        low = 0.0
    else:
        low = 1.0 / top_singular_value(gram_inverse, size, gen, max_iter=INVERSE_ITER)
    return low, top_singular_value(lambda V: times_R(times_Rt(V)), size, gen)


def per_group_certificate(
    blocks: list[_GroupBlock],
    Qz: torch.Tensor,
    gen: torch.Generator,
    sigma_max: float,
    wo_min: float,
    rtol: float,
    bar=None,
) -> Certificate:
    """Step 4, per-group route: each group's exact projected Jacobian on the complement of its known
    directions, its smallest and largest singular values (:func:`group_singular_values`).

    The projected φ-Jacobian is ``(W_O ⊗ I)`` times the groups' Jacobians side by side, so with ``W_O``
    injective its rank is the sum of theirs: each group is certified of full rank at its own scale
    (``σ_min > rtol·σ_max`` of the group), and ``kept = σ_min(W_O) · min_g σ_min(P J_g)``, a lower bound on the
    whole Jacobian's weakest identified direction (``W_O``'s condition number enters it; at a trained point
    it can fall below ``rtol·σ_max`` of the whole while every factor's rank is clear)."""
    timer = StageTimer()
    s_min, ratio = math.inf, math.inf
    work: dict = {}
    for block in blocks:
        if block.n_free:
            low, high = group_singular_values(block, Qz, gen, timer, work)
            s_min, ratio = min(s_min, low), min(ratio, low / high if high > 0 else 0.0)
        _tick(bar, block.n_free)
    kept = wo_min * s_min if math.isfinite(s_min) else sigma_max
    group_ratio = ratio if math.isfinite(ratio) else 1.0
    return Certificate(
        "per-group QR",
        kept,
        group_ratio > rtol,
        wo_min=wo_min,
        group_ratio=group_ratio,
        seconds=timer.seconds,
    )
