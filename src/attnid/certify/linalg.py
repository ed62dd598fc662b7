"""The linear algebra of a certificate (:mod:`attnid.certify`): its error, stage timing, the extreme singular
values of a factor (block power and inverse iteration), Householder QR in compact WY form and the projection
onto a complement, and Gram factors with their rounding bound."""

from __future__ import annotations

import math
import time

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.linalg
import torch


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


def _householder(T: torch.Tensor, rtol: float) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, float]:
    """The QR of known directions ``T`` ``(n_b, k)`` in Householder form (``torch.geqrf``; ``None`` when ``k = 0``)
    and its pivot ratio ``min |R_kk| / max |R_kk|``, which must clear ``rtol`` (else they are not independent)."""
    n_b, k = T.shape
    if k > n_b:
        raise CertificateError(f"certify: {k} supplied null directions for {n_b} coordinates are not independent")
    if not k:
        return None, 1.0
    a, tau = torch.geqrf(T)
    diag = a.diagonal().abs()
    t_cond = float(diag.min() / diag.max())
    if not t_cond >= rtol:
        raise CertificateError(
            f"certify: the supplied null directions are not independent (QR pivot ratio "
            f"{t_cond:.1e} < rtol {rtol:.0e}); the count would be wrong"
        )
    return (a, tau), t_cond


def _on_complement(M: torch.Tensor, qr: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """``M Q_⊥`` ``(m, n_b − k)``: the columns of ``M`` ``(m, n_b)`` on an orthonormal basis ``Q_⊥`` of the complement
    of the known directions whose Householder QR is ``qr`` (the trailing columns of its ``Q``), written over ``M``'s
    last ``n_b − k`` columns and returned as a view of them.

    ``Q = H_1 ⋯ H_k = I − V T Vᵀ`` in compact WY form, ``T⁻¹ = triu(VᵀV, 1) + diag(1/τ)`` (Joffrain et al.,
    *ACM TOMS* 32, 2006; a reflector with ``τ = 0`` is the identity and drops out), so
    ``M Q_⊥ = M_{:,k:} − (M V) T V_{k:}ᵀ``: two matrix products instead of ``k`` reflections (``torch.ormqr``),
    the same flops at the speed of a product."""
    if qr is None:
        return M
    V, T_inv = _compact_wy(qr)
    k = V.shape[1]
    MVT = torch.linalg.solve_triangular(T_inv, M @ V, upper=True, left=False)  # (M V) T
    return M[:, k:].addmm_(MVT, V[k:].T, alpha=-1.0)


def _compact_wy(qr: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``V`` ``(n_b, k)`` and ``T⁻¹`` ``(k, k)`` with ``Q = I − V T Vᵀ`` for the Householder QR ``qr``."""
    a, tau = qr
    V = a.tril(-1)
    V.diagonal().fill_(1.0)
    idle = tau == 0
    V[:, idle] = 0.0
    return V, (V.T @ V).triu(1) + torch.diag(torch.where(idle, torch.ones_like(tau), 1 / tau))


GRAM_MARGIN = 1e-2  # the Gram's rounding bound must stay below this share of σ_min² (else the QR decides)


def _gram_factor(B: torch.Tensor, exact: bool, out: np.ndarray | None = None) -> tuple[torch.Tensor | None, float]:
    """An upper-triangular ``R`` with ``RᵀR = BᵀB + Δ`` for ``B`` ``(m, n)``, and the bound ``err ≥ ‖Δ‖₂``:
    the Cholesky factor of the Gram (``m n²`` flops against a QR's ``2 m n²``), whose rounding is bounded by
    ``(γ_m + γ_{n+1}) ‖B‖_F²`` (the Gram's and the Cholesky's backward errors, Higham, *Accuracy and Stability of
    Numerical Algorithms*, §3.5 and Thm 10.3); with ``exact``, or where the Cholesky fails, the R of a QR of ``B``
    (``err = 0``). ``None`` when ``B`` has fewer rows than columns (it cannot have full column rank). ``out``: an
    ``(n, n)`` Fortran-ordered float64 array the Gram and its factor may overwrite."""
    m, n = B.shape
    if m < n:
        return None, 0.0
    if not exact and n:
        u = np.finfo(np.float64).eps / 2
        err = 1.01 * (m + n + 1) * u / (1 - (m + n + 1) * u) * float(torch.linalg.vector_norm(B)) ** 2
        c = {} if out is None else {"c": out, "overwrite_c": 1}
        gram = scipy.linalg.blas.dsyrk(1.0, B.contiguous().numpy().T, trans=0, **c)  # BᵀB's upper triangle
        try:
            return torch.from_numpy(scipy.linalg.cholesky(gram, lower=False, overwrite_a=True, check_finite=False)), err
        except np.linalg.LinAlgError:
            pass
    return torch.linalg.qr(B, mode="r").R, 0.0


def _buffer(work: dict, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A float64 work array kept in ``work`` from one group to the next (a fresh array of this size costs its page
    faults again each time)."""
    buf = work.get(name)
    if buf is None or tuple(buf.shape) != shape:
        buf = work[name] = torch.empty(shape, dtype=torch.float64)
    return buf


def _fortran(work: dict, name: str, n: int) -> np.ndarray:
    """An ``(n, n)`` Fortran-ordered float64 work array kept in ``work`` (for the BLAS and LAPACK calls)."""
    buf = work.get(name)
    if buf is None or buf.shape != (n, n):
        buf = work[name] = np.empty((n, n), order="F")
    return buf
