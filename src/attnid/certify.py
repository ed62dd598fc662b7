"""The ``certify`` method of :func:`attnid.audit.audit`: the exact rank of our layer's Jacobian without
forming it, in five steps (each a function below).

1. :func:`output_block`: the output is linear in ``(W_O, b_O)`` with the same block ``Z`` for every output
   coordinate, so that block's rank is ``E·rank(Z)`` and its range is projected out exactly.
2. :func:`certification_blocks`: the known null directions (:func:`attnid.symmetry.tangent_basis`, or
   those supplied), and the parts of the remaining parameters φ certified on their own (one per
   key/value group where ``W_O`` is injective, else the whole φ). A group is certified on the orthogonal
   complement of its known directions (a QR); the whole φ on the coordinates left free when the known
   directions pin ``k_b`` of them by LU pivoting (its sketch reads coordinates).
3. :func:`null_residuals` and :func:`largest_singular_value`: ``‖J t‖ / ‖t‖`` of every known direction
   (forward mode; through its own group's mixtures where the groups split, :func:`null_residuals_by_group`)
   and ``‖J‖₂`` (block power iteration), which sets the tolerance's scale.
4. :func:`per_group_certificate` (``W_O`` injective): each group's exact projected Jacobian on the
   complement, its smallest singular value from a QR (exactly the group's weakest identified direction);
   or :func:`whole_sketch_certificate`: one Gaussian sketch of side ``n_free`` and its condition number.
5. :func:`certify`: the known directions must be null and the rest of full rank, or
   :class:`CertificateError`; then ``rank = E·rank(Z) + n_free``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
import torch
from torch.func import jvp, vjp, vmap

from .attention import (
    PARAM_ORDER,
    AttentionConfig,
    AttentionParams,
    attention,
    flatten,
    head_mixtures,
    param_slices,
    unflatten,
)
from .symmetry import tangent_basis


class CertificateError(RuntimeError):
    """The certify method could not certify the count (bad directions, or too little data). ``kept_ratio``:
    where the rest was not of full rank, the certificate's bound on its smallest singular value over σ_max."""

    kept_ratio: float | None = None


class StageTimer:
    """Seconds per named stage: ``timer("name")`` closes the stage that ran since the previous call."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now


POWER_BLOCK = 8  # vectors per block power iteration
POWER_RTOL = 1e-3  # stop once the estimate changes by less than this (it only sets the tolerance's scale)
POWER_MAX_ITER = 30


def top_singular_value(
    gram, n: int, gen: torch.Generator, *, max_iter: int = POWER_MAX_ITER, rtol: float = POWER_RTOL
) -> float:
    """Largest singular value of a matrix ``A`` given ``gram(V) = (AᵀA Vᵀ)ᵀ`` for a block ``V`` ``(b, n)``:
    block power (subspace) iteration, stopped when the estimate settles to ``rtol``."""
    V = torch.linalg.qr(torch.randn(n, POWER_BLOCK, generator=gen, dtype=torch.float64)).Q.T
    est = 0.0
    for _ in range(max_iter):
        W = gram(V)  # (b, n): AᵀA applied to each row of V
        new = float(torch.linalg.svdvals(W @ V.T)[0])  # top eigenvalue of AᵀA on the block's span
        V = torch.linalg.qr(W.T).Q.T
        if abs(new - est) <= rtol * new:
            return math.sqrt(new)
        est = new
    return math.sqrt(est)


INVERSE_ITER = 15  # most inverse iterations for the smallest singular value


def smallest_singular_value(K: torch.Tensor, gen: torch.Generator, *, upper_triangular: bool = False) -> float:
    """``σ_min`` of a square float64 ``K``: its LU (or ``K`` itself when ``upper_triangular``), then block
    inverse iteration (``‖K⁻¹‖``); 0 if singular. (A float32 LU, half the cost, is not accurate enough:
    for the sketches of :func:`audit`, ``‖I − X K‖ > 1`` with ``X`` its solve.)"""
    if upper_triangular:
        if not bool(K.diagonal().ne(0).all()):
            return 0.0

        def gram_inverse(V: torch.Tensor) -> torch.Tensor:  # K⁻¹ K⁻ᵀ Vᵀ, transposed
            W = torch.linalg.solve_triangular(K.T, V.T, upper=False)
            return torch.linalg.solve_triangular(K, W, upper=True).T

    else:
        LU, piv, info = torch.linalg.lu_factor_ex(K)
        if int(info) != 0:
            return 0.0

        def gram_inverse(V: torch.Tensor) -> torch.Tensor:  # K⁻ᵀ K⁻¹ Vᵀ, transposed
            return torch.linalg.lu_solve(LU, piv, torch.linalg.lu_solve(LU, piv, V.T), adjoint=True).T

    return 1.0 / top_singular_value(gram_inverse, K.shape[0], gen, max_iter=INVERSE_ITER)


@dataclass
class _JacobianBlock:
    """A part of the projected Jacobian certified on its own: ``fn(theta)`` its outputs ``(B, rows, L)``
    (flattened), ``cols`` the indices of ``theta`` that are φ coordinates (in θ's order), ``T`` the known
    null directions restricted to them ``(len(cols), k_b)``. Where it is certified: ``free``, the coordinates
    left after pinning (the whole sketch), or ``complement`` ``(len(cols), n_free)``, an orthonormal basis of
    the complement of ``T`` (a key/value group)."""

    fn: Callable[[torch.Tensor], torch.Tensor]
    theta: torch.Tensor
    cols: torch.Tensor
    T: torch.Tensor
    rows: int
    free: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    complement: torch.Tensor | None = None
    t_cond: float = 1.0
    shape: tuple[int, int] = (0, 0)  # (batch, tokens) of the audited inputs
    dirs: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))  # columns of T it owns

    @property
    def n_free(self) -> int:
        """The dimension certified of full rank."""
        return len(self.free) if self.complement is None else self.complement.shape[1]


def splits_by_group(cfg: AttentionConfig) -> bool:
    """Whether ``W_O`` (``E x HC``) can be injective, so that certify may check one key/value group at a
    time (it still checks ``W_O``'s own condition at the audited point)."""
    return cfg.H * cfg.C <= cfg.E


def _head_group_blocks(
    cfg: AttentionConfig, p: AttentionParams, X: torch.Tensor, phi_idx: torch.Tensor, T: torch.Tensor, rtol: float
) -> tuple[list[_JacobianBlock], float] | None:
    """The per-group split of the projected Jacobian, or ``None`` where it does not hold.

    ``Y = W_O Z + b_O`` with ``Z`` stacked over heads, and a key/value group's mixtures ``Z_g`` depend on
    that group's query, key and value parameters only. When ``W_O`` (``E x HC``) is injective, the rank of
    the φ-Jacobian of ``Y`` projected off the output block's range is the sum over groups of the ranks of
    ``Z_g``'s Jacobian projected the same way (the projection acts on tokens, ``W_O`` on features). So each
    group is certified on its own, on its exact Jacobian (about ``2n_φ/G x n_φ/G``), instead of one sketch
    of side ``n_φ``. It also needs every known direction to touch one group only. Returns the blocks and
    ``σ_min(W_O)``."""
    E, H, G, C = cfg.E, cfg.H, cfg.G, cfg.C
    if not splits_by_group(cfg):
        return None
    sw = torch.linalg.svdvals(p["W_O"].permute(1, 0, 2).reshape(E, H * C))
    wo_ratio = float(sw[-1] / sw[0])
    if not wo_ratio > rtol:
        return None
    where = param_slices(p)
    phi_names = [k for k in PARAM_ORDER if k in p and k not in ("W_O", "b_O")]
    group_idx = [
        torch.cat([torch.arange(where[k].start, where[k].stop).reshape(G, -1)[g] for k in phi_names]) for g in range(G)
    ]
    pos = torch.full((int(phi_idx.max()) + 1,), -1, dtype=torch.long)  # θ index -> row of T[phi_idx]
    pos[phi_idx] = torch.arange(len(phi_idx))
    T_phi = T[phi_idx]
    owner = torch.full((T.shape[1],), -1, dtype=torch.long)
    for g, idx in enumerate(group_idx):
        inside = T_phi[pos[idx]].ne(0).any(0)
        if (inside & (owner >= 0)).any():
            return None  # a direction touches two groups
        owner[inside] = g
    if (owner < 0).any():
        return None  # a direction without a φ part: the whole sketch reports it
    sub = cfg.with_(heads=H // G, groups=1)
    blocks = []
    for g, idx in enumerate(group_idx):
        pg = {k: p[k].reshape(G, -1)[g].reshape(-1, *p[k].shape[1:]) for k in phi_names}
        fn = (lambda like: lambda v: head_mixtures(X, unflatten(v, like), sub).reshape(-1))(pg)
        mine = owner == g
        blocks.append(
            _JacobianBlock(
                fn,
                flatten(pg),
                torch.arange(len(idx)),
                T_phi[pos[idx]][:, mine],
                (H // G) * C,
                dirs=mine.nonzero()[:, 0],
            )
        )
    return blocks, float(sw[-1])


def _pin_known_directions(block: _JacobianBlock, rtol: float) -> None:
    """Choose a complement of the block's known directions: pin ``k_b`` of its coordinates by LU pivoting
    of ``T`` (so ``T[pinned]`` is nonsingular) and keep the rest as ``block.free``."""
    T_b = block.T.numpy()
    n_b, k = T_b.shape
    if k > n_b:
        raise CertificateError(f"certify: {k} supplied null directions for {n_b} coordinates are not independent")
    if k == 0:
        block.free = np.arange(n_b)
        return
    perm, _, U = scipy.linalg.lu(T_b, p_indices=True)
    order = np.argsort(perm)  # scipy returns p with A = P L U; the rows of A in pivot order
    diagU = np.abs(np.diag(U))
    block.t_cond = float(diagU.min() / diagU.max())
    if block.t_cond < rtol:
        raise CertificateError(
            f"certify: the supplied null directions are not independent (LU pivot ratio "
            f"{block.t_cond:.1e} < rtol {rtol:.0e}); the count would be wrong"
        )
    block.free = np.setdiff1d(np.arange(n_b), np.sort(order[:k]))


def _complement_known_directions(block: _JacobianBlock, rtol: float) -> None:
    """An orthonormal basis of the complement of the block's known directions (a complete QR of ``T``, whose
    pivot ratio ``|R_kk|`` must clear ``rtol``) as ``block.complement``."""
    n_b, k = block.T.shape
    if k > n_b:
        raise CertificateError(f"certify: {k} supplied null directions for {n_b} coordinates are not independent")
    Q, R = torch.linalg.qr(block.T, mode="complete")
    if k:
        diag = R.diagonal().abs()
        block.t_cond = float(diag.min() / diag.max())
        if block.t_cond < rtol:
            raise CertificateError(
                f"certify: the supplied null directions are not independent (QR pivot ratio "
                f"{block.t_cond:.1e} < rtol {rtol:.0e}); the count would be wrong"
            )
    block.complement = Q[:, k:].contiguous()


# ------------------------------------------------------------------------------ the five steps
@dataclass
class OutputBlock:
    """Step 1: ``Qz`` an orthonormal basis of ``Z``'s token rows ``(B·L, rank_z)``, the block's rank
    ``E·rank_z`` and parameter count, and the gap of ``Z``'s singular values at the cut."""

    Qz: torch.Tensor
    rank_z: int
    rank: int
    params: int
    z_gap: float


def output_block(cfg: AttentionConfig, p: AttentionParams, X: torch.Tensor, rtol: float) -> OutputBlock:
    """``dY[b, e, l] / dW_O^h[e, c] = Z[b, h, c, l]`` for every ``e`` (and 1 for ``b_O``): the output block."""
    Bsz, E, L = X.shape
    _, Z = attention(X, p, cfg, return_z=True)
    Zmat = Z.permute(0, 3, 1, 2).reshape(Bsz * L, cfg.H * cfg.C)  # tokens x (h, c)
    if "b_O" in p:
        Zmat = torch.cat([Zmat, torch.ones(Bsz * L, 1, dtype=Zmat.dtype)], dim=1)
    Uz, sz, _ = torch.linalg.svd(Zmat, full_matrices=False)
    rank_z = int((sz > rtol * sz[0]).sum())
    gap = float(sz[rank_z - 1] / sz[rank_z]) if rank_z < len(sz) else float("inf")
    params = sum(p[k].numel() for k in ("W_O", "b_O") if k in p)
    return OutputBlock(Uz[:, :rank_z], rank_z, E * rank_z, params, gap)


def certification_blocks(
    cfg: AttentionConfig,
    p: AttentionParams,
    X: torch.Tensor,
    f: Callable[[torch.Tensor], torch.Tensor],
    T: torch.Tensor,
    rtol: float,
) -> tuple[list[_JacobianBlock], float | None]:
    """Step 2: the parts certified on their own, each with its free coordinates chosen, and ``σ_min(W_O)``
    where the parts are the key/value groups (``None``: one part, the whole φ)."""
    theta = flatten(p)
    where = param_slices(p)
    phi_names = [k for k in PARAM_ORDER if k in p and k not in ("W_O", "b_O")]
    phi_idx = torch.cat([torch.arange(where[name].start, where[name].stop) for name in phi_names])
    split = _head_group_blocks(cfg, p, X, phi_idx, T, rtol)
    blocks, wo_min = split if split is not None else ([_JacobianBlock(f, theta, phi_idx, T[phi_idx], cfg.E)], None)
    for block in blocks:
        if split is None:
            _pin_known_directions(block, rtol)
        else:
            _complement_known_directions(block, rtol)
    return blocks, wo_min


def null_residuals(f: Callable, theta: torch.Tensor, T: torch.Tensor, chunk: int) -> torch.Tensor:
    """Step 3: ``‖J t‖ / ‖t‖`` for every column ``t`` of ``T`` ``(n, k)``, by forward mode."""
    k = T.shape[1]
    if not k:
        return torch.zeros(0)

    def jt(t):
        return jvp(f, (theta,), (t,))[1]

    resid = torch.cat([vmap(jt)(T[:, j : j + chunk].T).norm(dim=1) for j in range(0, k, chunk)])
    return resid / T.norm(dim=0)


def null_residuals_by_group(
    cfg: AttentionConfig,
    p: AttentionParams,
    X: torch.Tensor,
    T: torch.Tensor,
    blocks: list[_JacobianBlock],
    chunk: int,
) -> torch.Tensor:
    """Step 3 where the key/value groups split the Jacobian: the numbers of :func:`null_residuals`, with each
    direction ``t`` differentiated through its own group only. ``Y = Σ_h W_O^h Z_h + b_O``, so
    ``J t = Σ_h dW_O^h Z_h + W_O^{(g)} dZ_g + db_O``, where ``dZ_g`` is the forward-mode derivative of the mixtures
    of the group ``g`` that owns ``t`` (the groups' blocks, :func:`_head_group_blocks`). A group's mixtures cost
    ``1/G`` of the layer's."""
    where = param_slices(p)
    W_O = p["W_O"]  # (H, E, C)
    Z = head_mixtures(X, p, cfg)  # (B, H, C, L)
    resid = torch.empty(T.shape[1], dtype=torch.float64)
    per = cfg.H // cfg.G
    for g, block in enumerate(blocks):
        Bsz, L = block.shape
        W_g = W_O[g * per : (g + 1) * per]
        for j in range(0, len(block.dirs), chunk):
            cols = block.dirs[j : j + chunk]
            t = T[:, cols]  # (n, c)
            dZ = vmap(lambda v, b=block: jvp(b.fn, (b.theta,), (v,))[1])(block.T[:, j : j + chunk].T)
            out = torch.einsum("hec,kbhcl->kbel", W_g, dZ.reshape(len(cols), Bsz, per, -1, L))
            out = out + torch.einsum("khec,bhcl->kbel", t[where["W_O"]].T.reshape(len(cols), *W_O.shape), Z)
            if "b_O" in p:
                out = out + t[where["b_O"]].T[:, None, :, None]
            resid[cols] = out.flatten(1).norm(dim=1)
    return resid / T.norm(dim=0)


def largest_singular_value(f: Callable, theta: torch.Tensor, gen: torch.Generator) -> float:
    """Step 3: ``‖J‖₂`` by block power iteration (a block of vectors through vmap costs little more than one)."""

    def jt(t):
        return jvp(f, (theta,), (t,))[1]

    vjp_full = vjp(f, theta)[1]
    return top_singular_value(lambda V: vmap(vjp_full)(vmap(jt)(V))[0], theta.numel(), gen)


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
        k_max = top_singular_value(lambda V: (M.T @ (M @ V.T)).T, nb, gen)
        cond = k_max / k_min if k_min > 0 else math.inf
    seconds = {"block_jacobians": t1 - t0, "block_factors": time.perf_counter() - t1}
    return Certificate("whole sketch", sigma_max / cond, cond < 1 / rtol, sketch_cond=cond, seconds=seconds)


def per_group_certificate(
    blocks: list[_JacobianBlock],
    project: Callable,
    gen: torch.Generator,
    sigma_max: float,
    wo_min: float,
    rtol: float,
    chunk: int,
    bar=None,
) -> Certificate:
    """Step 4, per-group route: each group's exact projected Jacobian on the complement of its known
    directions (a JVP per basis vector), its smallest and largest singular values from the R of a QR.

    The projected φ-Jacobian is ``(W_O ⊗ I)`` times the groups' Jacobians side by side, so with ``W_O``
    injective its rank is the sum of theirs: each group is certified of full rank at its own scale
    (``σ_min > rtol·σ_max`` of the group), and ``kept = σ_min(W_O) · min_g σ_min(P J_g)``, a lower bound on the
    whole Jacobian's weakest identified direction (``W_O``'s condition number enters it; at a trained point
    it can fall below ``rtol·σ_max`` of the whole while every factor's rank is clear)."""
    build = factor = 0.0
    s_min, ratio = math.inf, math.inf
    for block in blocks:
        t0 = time.perf_counter()
        assert block.complement is not None
        basis = block.complement.T  # (n_free, n_b)
        Bsz, L = block.shape
        M = torch.empty(len(basis), Bsz * block.rows * L, dtype=torch.float64)
        for j in range(0, len(basis), chunk):
            rows = min(chunk, len(basis) - j)
            cols_j = vmap(lambda t, b=block: jvp(b.fn, (b.theta,), (t,))[1])(basis[j : j + rows])
            M[j : j + rows] = vmap(project)(cols_j.reshape(rows, Bsz, block.rows, L))
            _tick(bar, rows)
        t1 = time.perf_counter()
        if len(M):
            R = torch.linalg.qr(M.T, mode="r").R
            low = smallest_singular_value(R, gen, upper_triangular=True)
            high = top_singular_value(lambda V, R=R: (R.T @ (R @ V.T)).T, R.shape[0], gen)
            s_min, ratio = min(s_min, low), min(ratio, low / high if high > 0 else 0.0)
        build, factor = build + t1 - t0, factor + time.perf_counter() - t1
    kept = wo_min * s_min if math.isfinite(s_min) else sigma_max
    seconds = {"block_jacobians": build, "block_factors": factor}
    group_ratio = ratio if math.isfinite(ratio) else 1.0
    return Certificate(
        "per-group QR", kept, group_ratio > rtol, wo_min=wo_min, group_ratio=group_ratio, seconds=seconds
    )


def _checked(resid: torch.Tensor, cert: Certificate, sigma_max: float, rtol: float) -> float:
    """Step 5: every known direction null (``‖J t‖/‖t‖ <= rtol·σ_max``) and the rest certified, else
    :class:`CertificateError`; returns the largest residual."""
    k = len(resid)
    worst = float(resid.max()) if k else 0.0
    if worst > rtol * sigma_max:
        bad = int((resid > rtol * sigma_max).sum())
        raise CertificateError(
            f"certify: {bad} of the {k} supplied directions are not null directions of the "
            f"Jacobian (largest ‖J t‖/‖t‖ = {worst:.2e} > rtol·σ_max = {rtol * sigma_max:.2e})"
        )
    if not cert.certified:
        weakest = (
            f"a key/value group's weakest direction {cert.group_ratio:.1e} of its strongest"
            if cert.group_ratio is not None
            else f"smallest kept singular value {cert.kept / sigma_max:.1e} σ_max"
        )
        err = CertificateError(
            f"certify: the Jacobian has null directions beyond the {k} supplied ones, or the data "
            f"are too few ({weakest}); rerun with a larger --batch, or --method dense at a small width"
        )
        err.kept_ratio = cert.kept / sigma_max  # the certificate's lower bound on σ_min / σ_max
        raise err
    return worst


def _details(
    out: OutputBlock, cert: Certificate, blocks: list[_JacobianBlock], sigma_max: float, k: int, worst: float
) -> dict:
    """What an audit reports of a certificate (``AuditResult.details``)."""
    return {
        "sigma_max": sigma_max,
        "sigma_kept": cert.kept,
        "rank_output_block": out.rank,
        "rank_Z": out.rank_z,
        "params_output_block": out.params,
        "known_null_dirs": k,
        "free_params": sum(b.n_free for b in blocks),
        "certificate": cert.route,
        "jacobian_blocks": len(blocks),  # one per key/value group when W_O is injective, else 1
        "sketch_cond": cert.sketch_cond,  # whole sketch only
        "W_O_sigma_min": cert.wo_min,  # per-group only
        "group_kept_ratio": cert.group_ratio,  # per-group only: the weakest group's σ_min / σ_max
        "null_residual_max": worst,
        "known_pivot_ratio": min(b.t_cond for b in blocks),  # of the known directions' QR (groups) or LU
        "Z_singular_gap": out.z_gap,
    }


@dataclass
class Certified:
    """What :func:`certify` returns: the rank, the gap between the smallest kept singular value and the
    largest residual of a known direction, the tolerance ``rtol·σ_max`` and the details an audit reports."""

    rank: int
    gap: float
    tolerance: float
    details: dict


def certify(
    cfg: AttentionConfig,
    p: AttentionParams,
    X: torch.Tensor,
    f: Callable[[torch.Tensor], torch.Tensor],
    *,
    rtol: float,
    chunk: int = 128,
    progress: bool = False,
    directions: torch.Tensor | None = None,
) -> Certified:
    """The rank of the Jacobian of ``f`` (our layer at inputs ``X`` ``(B, E, L)`` as a function of the flat
    parameters of ``p``), certified: steps 1–5 of the module docstring. ``directions`` ``(n, k)``: the known
    null directions (default: the tangent basis). Raises :class:`CertificateError` when a known direction
    is not null or the rest is not of full rank."""
    timer = StageTimer()
    theta = flatten(p)
    n = theta.numel()
    Bsz, _, L = X.shape
    gen = torch.Generator().manual_seed(12345)
    out = output_block(cfg, p, X, rtol)
    timer("output_block")
    T = torch.cat(list(tangent_basis(p, cfg).values()), dim=1) if directions is None else torch.as_tensor(directions)
    T = T.to(torch.float64)
    if T.dim() != 2 or T.shape[0] != n:
        raise ValueError(f"directions: expected shape ({n}, k), got {tuple(T.shape)}")
    blocks, wo_min = certification_blocks(cfg, p, X, f, T, rtol)
    for block in blocks:
        block.shape = (Bsz, L)
    n_free = sum(b.n_free for b in blocks)
    timer("tangent_lu")
    resid = (
        null_residuals(f, theta, T, chunk) if wo_min is None else null_residuals_by_group(cfg, p, X, T, blocks, chunk)
    )
    timer("null_residuals")
    sigma_max = largest_singular_value(f, theta, gen)
    timer("sigma_max")
    bar = _progress_bar(n_free, "per-group Jacobians" if wo_min else "sketch") if progress else None
    project = _projector(out.Qz, Bsz, L)
    if wo_min is None:
        cert = whole_sketch_certificate(blocks[0], project, gen, sigma_max, rtol, chunk, bar)
    else:
        cert = per_group_certificate(blocks, project, gen, sigma_max, wo_min, rtol, chunk, bar)
    if bar is not None:
        bar.close()
    seconds = {**timer.seconds, **cert.seconds}
    k = T.shape[1]
    worst = _checked(resid, cert, sigma_max, rtol)
    details = _details(out, cert, blocks, sigma_max, k, worst) | {"stage_seconds": seconds}
    gap = cert.kept / max(worst, sigma_max * np.finfo(np.float64).eps)
    return Certified(out.rank + n_free, float(gap), float(rtol * sigma_max), details)
