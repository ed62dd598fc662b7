"""The ``certify`` method of :func:`attnid.audit.audit`: the exact rank of our layer's Jacobian without
forming it, in five steps (each a function below).

1. :func:`output_block`: the output is linear in ``(W_O, b_O)`` with the same block ``Z`` for every output
   coordinate, so that block's rank is ``E·rank(Z)`` and its range is projected out exactly.
2. :func:`certification_blocks`: the known null directions (:func:`attnid.symmetry.tangent_rows`, or
   those supplied; held as sparse rows, :func:`direction_rows`), and the parts of the remaining parameters φ
   certified on their own (one per key/value group where ``W_O`` is injective, else the whole φ). A group's
   mixtures are differentiated once with respect to its activations ``Q, K, V`` (:class:`GroupActivations`);
   its value part splits off channel by channel where the value directions allow (:func:`_split_known`), and
   the rest is certified on the orthogonal complement of its known directions (a Householder QR in compact WY
   form). The whole φ is certified on the coordinates left free when the known directions pin ``k_b`` of them
   by LU pivoting (its sketch reads coordinates).
3. :func:`null_residuals` and :func:`largest_singular_value`: ``‖J t‖ / ‖t‖`` of every known direction
   (forward mode; through its own group's activations where the groups split, :func:`null_residuals_by_group`)
   and ``‖J‖₂`` (block power iteration), which sets the tolerance's scale.
4. :func:`per_group_certificate` (``W_O`` injective): each group's exact projected Jacobian on the
   complement as a block-triangular factor, its value channels' blocks from a small QR and its query/key block
   from a Cholesky of its Gram (formed from the activations; its rounding bound widens the result, and a QR
   decides where the bound is not small), its extreme singular values by block inverse and power iteration
   (:func:`group_singular_values`); or :func:`whole_sketch_certificate`: one Gaussian sketch of side
   ``n_free`` and its condition number.
5. :func:`certify`: the known directions must be null and the rest of full rank, or
   :class:`CertificateError`; then ``rank = E·rank(Z) + n_free``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias, cast

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.linalg
import torch
from torch.func import jvp, vjp, vmap

from .attention import (
    PARAM_ORDER,
    AttentionConfig,
    AttentionParams,
    attention,
    flatten,
    head_mixtures,
    mix_heads,
    param_slices,
    projections,
    unflatten,
)
from .symmetry import tangent_rows


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
    """The whole φ certified at once (the whole sketch): ``fn(theta)`` the layer's outputs ``(B, E, L)``
    (flattened), ``cols`` the indices of ``theta`` that are φ coordinates (in θ's order), ``T`` the known
    null directions restricted to them ``(len(cols), k)``, ``free`` the coordinates left after pinning."""

    fn: Callable[[torch.Tensor], torch.Tensor]
    theta: torch.Tensor
    cols: torch.Tensor
    T: torch.Tensor
    rows: int
    free: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    t_cond: float = 1.0
    shape: tuple[int, int] = (0, 0)  # (batch, tokens) of the audited inputs

    @property
    def n_free(self) -> int:
        """The dimension certified of full rank."""
        return len(self.free)


ACTIVATION_RTOL = 1e-10  # the chain rule through the activations must agree with forward mode to this


@dataclass
class GroupActivations:
    """The Jacobian of one key/value group's mixtures ``Z`` ``(B, n, C, L)`` (``n`` heads) with respect to its
    activations ``Q, K, V`` (:func:`attnid.attention.projections`), from ``n·D + D·L + C·L`` forward-mode products:
    a query moves its own token's mixtures only, and a key or value those of its own sequence, so one product per
    activation coordinate serves every token (or sequence) at once. The activations are linear in the group's
    parameters, so the chain rule gives the group's whole Jacobian (:meth:`columns`) and its product with any
    direction (:meth:`tangent`) from a few large products instead of one forward pass per direction.

    ``jq[h, d, b, k, c, i] = ∂Z[b, k, c, i] / ∂Q[b, h, d, i]``,
    ``jk[d, j, b, k, c, i] = ∂Z[b, k, c, i] / ∂K[b, 0, d, j]``,
    ``jv[f, j, b, k, c, i] = ∂Z[b, k, c, i] / ∂V[b, 0, f, j]``; ``X`` ``(B, E, L)`` the inputs and ``params`` the
    group's parameters (one group: ``W_Q (n, D, E)``, ``W_K (1, D, E)``, ``W_V (1, C, E)``, biases as present)."""

    jq: torch.Tensor
    jk: torch.Tensor
    jv: torch.Tensor
    X: torch.Tensor
    params: AttentionParams
    _batched: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def at(cls, X: torch.Tensor, params: AttentionParams, sub: AttentionConfig, chunk: int) -> GroupActivations:
        """Differentiate :func:`attnid.attention.mix_heads` at the group's activations, then check the chain rule on
        two random directions against forward mode through the whole group (:class:`CertificateError` if not)."""
        acts = projections(X, params, sub)
        B, n, D, L = acts[0].shape
        C = acts[2].shape[2]

        def mixtures(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return mix_heads(q, k, v, params, sub)["Z"]

        def pushed(slot: int, basis: torch.Tensor) -> torch.Tensor:  # basis (m, *shape of acts[slot])
            def one(t: torch.Tensor) -> torch.Tensor:
                tangents = tuple(t if s == slot else torch.zeros_like(a) for s, a in enumerate(acts))
                return jvp(mixtures, acts, tangents)[1]

            return torch.cat([vmap(one)(basis[j : j + chunk]) for j in range(0, len(basis), chunk)])

        def unit(m: int, shape: tuple[int, ...]) -> torch.Tensor:  # m one-hot directions, broadcast over the rest
            return torch.eye(m, dtype=X.dtype).reshape(m, *shape)

        jq = pushed(0, unit(n * D, (1, n, D, 1)).expand(-1, B, n, D, L)).reshape(n, D, B, n, C, L)
        jk = pushed(1, unit(D * L, (1, 1, D, L)).expand(-1, B, 1, D, L)).reshape(D, L, B, n, C, L)
        jv = pushed(2, unit(C * L, (1, 1, C, L)).expand(-1, B, 1, C, L)).reshape(C, L, B, n, C, L)
        out = cls(jq, jk, jv, X, params)
        out._check(sub)
        return out

    def _check(self, sub: AttentionConfig) -> None:
        theta = flatten(self.params)
        t = torch.randn(theta.numel(), 2, generator=torch.Generator().manual_seed(7), dtype=theta.dtype)
        fn = lambda v: head_mixtures(self.X, unflatten(v, self.params), sub)  # noqa: E731
        direct = vmap(lambda v: jvp(fn, (theta,), (v,))[1])(t.T)
        err = float((self.tangent(t) - direct).norm() / direct.norm())
        if not err <= ACTIVATION_RTOL:
            raise CertificateError(
                f"certify: the group's Jacobian through its activations differs from forward mode by {err:.1e} "
                f"(> {ACTIVATION_RTOL:.0e}); this layer's mixing is not what attnid.attention.mix_heads assumes"
            )

    def _inputs(self, bias: bool) -> torch.Tensor:
        """``X`` with a row of ones below it where the projection has a bias: ``W X + b 1ᵀ = [W b] [X; 1ᵀ]``."""
        return torch.cat([self.X, torch.ones_like(self.X[:, :1])], 1) if bias else self.X

    def tangent(self, t: torch.Tensor) -> torch.Tensor:
        """``J t`` ``(k, B, n, C, L)`` for directions ``t`` ``(n_g, k)`` of the group's flat parameters: each
        projection's move ``d[W b]`` taken to its activations (``d[W b] [X; 1ᵀ]``), then through the activations'
        Jacobians as batched products per sequence (a projection no direction moves is skipped)."""
        n, D, B, _, C, L = self.jq.shape
        m = t.shape[1]
        moves = {}
        for x in "QKV":
            w = t[self.ext_order(x)].T.reshape(m, -1, self._inputs(f"b_{x}" in self.params).shape[1])
            if bool(w.any()):
                moves[x] = w  # (m, rows, E')
        if not self._batched:  # the Jacobians laid out for batched products, once
            self._batched["Q"] = self.jq.permute(2, 5, 3, 4, 0, 1).reshape(B, L, n * C, n * D).contiguous()
            for x, jac in (("K", self.jk), ("V", self.jv)):
                self._batched[x] = jac.permute(2, 3, 4, 5, 0, 1).reshape(B, n * C * L, -1).contiguous()
        out = torch.zeros(B, n, C, L, m, dtype=t.dtype)
        if "Q" in moves:  # a query moves its own token: per (b, i), (n·C, n·D) @ (n·D, m)
            dq = torch.einsum("mre,bei->birm", moves["Q"], self._inputs("b_Q" in self.params))
            out += (self._batched["Q"] @ dq).reshape(B, L, n, C, m).permute(0, 2, 3, 1, 4)
        for x in "KV":  # a key or value moves its sequence: per b, (n·C·L, rows·L) @ (rows·L, m)
            if x in moves:
                da = torch.einsum("mre,bej->brjm", moves[x], self._inputs(f"b_{x}" in self.params))
                out += torch.bmm(self._batched[x], da.reshape(B, -1, m)).reshape(B, n, C, L, m)
        return out.permute(4, 0, 1, 2, 3)

    def ext_order(self, projections: str) -> torch.Tensor:
        """The group's coordinates (indices into its flat parameters) in the order of :meth:`columns`: for each of
        ``projections`` (``"QK"`` or ``"QKV"``) the matrix ``[W b]`` (``W`` ``(rows, E)``, its bias as a last column
        where present), row by row."""
        where, E = param_slices(self.params), self.X.shape[1]
        parts = []
        for x in projections:
            w = where[f"W_{x}"]
            idx = torch.arange(w.start, w.stop).reshape(-1, E)
            if f"b_{x}" in where:
                b = where[f"b_{x}"]
                idx = torch.cat([idx, torch.arange(b.start, b.stop)[:, None]], 1)
            parts.append(idx.reshape(-1))
        return torch.cat(parts)

    def columns(self, projections: str, c: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """The Jacobian's columns for ``projections`` (the coordinates of :meth:`ext_order`) at the mixtures of value
        channel ``c``: ``(n·B·L, columns)``, a row ``(k, b, i)`` the mixture ``Z[b, k, c, i]``; into ``out`` if given.
        ``∂Z/∂[W b] = ∂Z/∂(activation) ⊗ [X; 1ᵀ]``: a query moves its own token, a key or value its sequence."""
        parts = []
        for x in projections:
            X = self._inputs(f"b_{x}" in self.params)
            if x == "Q":
                part = torch.einsum("hdbki,bei->kbihde", self.jq[:, :, :, :, c], X)
            elif x == "K":
                part = torch.einsum("djbki,bej->kbide", self.jk[:, :, :, :, c], X)
            elif x == "V":
                part = torch.einsum("fjbki,bej->kbife", self.jv[:, :, :, :, c], X)
            else:
                raise ValueError(f"columns: {x!r} is not a projection (Q, K or V)")
            parts.append(part.reshape(part.shape[0] * part.shape[1] * part.shape[2], -1))
        width = sum(q.shape[1] for q in parts)
        J = torch.empty(len(parts[0]), width, dtype=self.X.dtype) if out is None else out
        i = 0
        for q in parts:
            J[:, i : i + q.shape[1]] = q
            i += q.shape[1]
        return J

    def query_key_gram(self, cache: dict | None = None, out: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
        """``Σ_c J_cᵀ J_c`` over every channel for the query and key columns of :meth:`columns` (``"QK"``), from the
        activations' Jacobians and the inputs without forming ``J``: a query column is ``jq ⊗ x_t`` at one token, a key
        column a sum over its sequence, so every entry is a short sum over tokens (``(n·D)² + n·D·D + D²`` products of
        ``(E'·B·L)`` by ``(B·L·E')``, about ``3 (n·D·E')² B·L`` flops against ``C n B L (n·D·E')²`` for ``JᵀJ``).
        Also ``‖Ĵ‖_F²``, the squared Frobenius norm of ``J`` with every product and sum in absolute value, the scale of
        the rounding bound. ``cache``: the inputs' products, shared by the groups; ``out``: the array to fill."""
        cache = {} if cache is None else cache
        n, D, B, _, _, L = self.jq.shape
        Xq, Xk = self._inputs("b_Q" in self.params), self._inputs("b_K" in self.params)
        Eq, Ek = Xq.shape[1], Xk.shape[1]
        nq, nk = n * D * Eq, D * Ek
        G = torch.empty(nq + nk, nq + nk, dtype=Xq.dtype) if out is None else out
        key = ("XX", Eq)
        if key not in cache:  # x_t x_tᵀ for each token t, flattened: (B·L, Eq²)
            cache[key] = torch.einsum("bei,bfi->bief", Xq, Xq).reshape(B * L, Eq * Eq)
        A = torch.einsum("hdbkci,gfbkci->hdgfbi", self.jq, self.jq).reshape((n * D) ** 2, B * L)
        QQ = (A @ cache[key]).reshape(n * D, n * D, Eq, Eq)
        G[:nq, :nq] = QQ.permute(0, 2, 1, 3).reshape(nq, nq)
        Xq_t, Xk_t = Xq.permute(1, 0, 2).reshape(Eq, B * L), Xk.permute(1, 0, 2).reshape(Ek, B * L)
        NQK = torch.einsum("hdbkci,gjbkci->hdgbij", self.jq, self.jk)  # (n, D, D, B, L, L)
        for h in range(n):
            for d in range(D):
                Y = torch.einsum("gbij,bfj->bigf", NQK[h, d], Xk).reshape(B * L, nk)
                G[(h * D + d) * Eq : (h * D + d + 1) * Eq, nq:] = Xq_t @ Y
        G[nq:, :nq] = G[:nq, nq:].T
        NK = torch.einsum("djbkci,gmbkci->dgbjm", self.jk, self.jk)  # (D, D, B, L, L)
        for d in range(D):
            Y = torch.einsum("gbjm,bfm->bjgf", NK[d], Xk).reshape(B * L, nk)
            G[nq + d * Ek : nq + (d + 1) * Ek, nq:] = Xk_t @ Y
        jk_abs, Xk_abs = self.jk.abs(), Xk.abs()
        nk_abs = torch.einsum("djbkci,dmbkci->bjm", jk_abs, jk_abs)
        scale = float(QQ.diagonal(0, 0, 1).diagonal(0, 0, 1).sum())  # ‖J_Q‖_F²: its entries are single products
        scale += float(torch.einsum("bjm,bej,bem->", nk_abs, Xk_abs, Xk_abs))
        return G, scale

    def value_map(self) -> torch.Tensor | None:
        """Where each value channel mixes alone (``∂Z[·, c, ·] / ∂V[·, f, ·]`` zero for ``f ≠ c`` and equal for all
        ``c``, as ``Z = V P``): the matrix ``(n·B·L, E')`` that maps a row of ``[W_V b_V]`` to that channel's
        mixtures, rows ``(k, b, i)``; else ``None``."""
        C = self.jv.shape[0]
        one = self.jv[0, :, :, :, 0]  # (j, b, k, i)
        same = torch.einsum("fc,jbki->fjbkci", torch.eye(C, dtype=one.dtype), one)
        if not float((self.jv - same).abs().max()) <= ACTIVATION_RTOL * float(one.abs().max()):
            return None
        Xv = self._inputs("b_V" in self.params)
        return torch.einsum("jbki,bej->kbie", one, Xv).reshape(-1, Xv.shape[1])


VALUE_PARAMS = ("W_V", "b_V")


@dataclass
class _GroupBlock:
    """A key/value group certified on its own (``W_O`` injective; :func:`_head_group_blocks`): its parameters
    ``params`` under ``sub`` (the layer's config with this group alone), its known directions ``T`` ``(n_g, k_g)``
    (the columns ``dirs`` of the whole ``T``) and the Jacobian through its activations. From step 2
    (:func:`_split_known`): ``value_rows`` ``(E', a)``, an orthonormal basis of the rows of ``[W_V b_V]`` that the
    known value directions leave (``None``: no split; every coordinate goes with the query/key ones) and
    ``value_map`` the map of :meth:`GroupActivations.value_map` they act on, ``rest``
    the projections certified at full size (``"QK"`` or ``"QKV"``, in the order of
    :meth:`GroupActivations.ext_order`) and ``rest_qr`` the Householder QR of their known directions."""

    params: AttentionParams
    sub: AttentionConfig
    T: torch.Tensor
    dirs: torch.Tensor
    acts: GroupActivations
    value_map: torch.Tensor | None = None
    value_rows: torch.Tensor | None = None
    rest: str = "QKV"
    rest_qr: tuple[torch.Tensor, torch.Tensor] | None = None
    n_free: int = 0
    t_cond: float = 1.0


Directions: TypeAlias = "torch.Tensor | scipy.sparse.csr_array"


def direction_rows(T: Directions) -> scipy.sparse.csr_array:
    """Known directions as the rows of a sparse float64 matrix ``(k, n)``: ``T`` given as a dense ``(n, k)`` tensor
    (one direction per column, as :func:`certify` takes them) or already as such rows
    (:func:`attnid.symmetry.tangent_rows`; float64 rows are returned as they are, their stored zeros dropped in
    place, so the steps pass one object along). Entries that are zero are not stored; NaN is."""
    if isinstance(T, torch.Tensor):
        rows = scipy.sparse.csr_array(T.detach().to(torch.float64).T.numpy())
    elif isinstance(T, scipy.sparse.csr_array) and T.dtype == np.float64:
        rows = T
    else:
        rows = scipy.sparse.csr_array(T, dtype=np.float64)
    rows.eliminate_zeros()
    return rows


def _dense(rows: scipy.sparse.csr_array) -> torch.Tensor:
    return torch.from_numpy(rows.toarray())


def splits_by_group(cfg: AttentionConfig) -> bool:
    """Whether certify may check one key/value group at a time: ``W_O`` (``E x HC``) can be injective (certify
    still checks its condition at the audited point) and no QK-norm ties the heads together (its weight or, over
    the whole projection, its scale is shared across groups)."""
    return cfg.H * cfg.C <= cfg.E and not cfg.qk_norm


def _head_group_blocks(
    cfg: AttentionConfig,
    p: AttentionParams,
    X: torch.Tensor,
    phi_idx: torch.Tensor,
    T: Directions,
    rtol: float,
    chunk: int,
) -> tuple[list[_GroupBlock], float] | None:
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
    rows = direction_rows(T)
    k = rows.shape[0]
    group_of = np.full(rows.shape[1], -1)  # each coordinate's group (-1: W_O, b_O)
    for g, idx in enumerate(group_idx):
        group_of[idx.numpy()] = g
    owners = np.full(k, -1)
    seen = group_of[rows.indices]  # the group of each stored entry, row by row
    for j in range(k):  # one pass over the stored entries; a direction touching two groups ends the split
        groups = seen[rows.indptr[j] : rows.indptr[j + 1]]
        groups = groups[groups >= 0]
        if len(groups):
            if groups.min() != groups.max():
                return None  # a direction touches two groups
            owners[j] = groups[0]
    if (owners < 0).any():
        return None  # a direction without a φ part: the whole sketch reports it
    owner = torch.from_numpy(owners)
    sub = cfg.with_(heads=H // G, groups=1)
    blocks = []
    for g, idx in enumerate(group_idx):
        pg = {k: p[k].reshape(G, -1)[g].reshape(-1, *p[k].shape[1:]) for k in phi_names}
        mine = (owner == g).nonzero()[:, 0]
        acts = GroupActivations.at(X, pg, sub, chunk)
        blocks.append(_GroupBlock(pg, sub, _dense(rows[mine.numpy()][:, idx.numpy()]).T.contiguous(), mine, acts))
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


def _gram_on_complement(
    gram: np.ndarray, qr: tuple[torch.Tensor, torch.Tensor] | None, out: np.ndarray | None = None
) -> np.ndarray:
    """``Q_⊥ᵀ G Q_⊥`` (upper triangle, Fortran order) for a symmetric ``G`` given by the upper triangle of ``gram``
    (Fortran order), ``Q_⊥`` as in :func:`_on_complement`. With ``Y = G V`` and ``K = Tᵀ VᵀY T``,
    ``QᵀGQ = G − V Zᵀ − Z Vᵀ`` for ``Z = Y T − V K / 2``: one symmetric product and one symmetric rank-2k update
    (half the flops of applying ``Q_⊥`` on both sides). ``out``: an ``(n_b − k, n_b − k)`` Fortran array for the
    result."""
    if qr is None:
        return gram
    V, T_inv = _compact_wy(qr)
    k = V.shape[1]
    Y = torch.from_numpy(scipy.linalg.blas.dsymm(1.0, gram, V.numpy(), side=0, lower=0))  # G V
    YT = torch.linalg.solve_triangular(T_inv, Y, upper=True, left=False)  # Y T
    K = torch.linalg.solve_triangular(T_inv.T, V.T @ YT, upper=False)  # Tᵀ Vᵀ Y T
    Z = YT - 0.5 * (V @ K)
    tail = gram[k:, k:]
    if out is not None:  # the trailing block into a kept array: a fresh one costs its page faults
        np.copyto(out, tail)
        tail = out
    tail = np.asfortranarray(tail)
    return scipy.linalg.blas.dsyr2k(
        -1.0, V[k:].numpy(), Z[k:].numpy(), beta=1.0, c=tail, trans=0, lower=0, overwrite_c=1
    )


def _value_rows(Tv: torch.Tensor, C: int, bias: bool, rtol: float) -> torch.Tensor | None:
    """The value directions ``Tv`` ``(C·E', k_v)`` (coordinates of ``W_V`` then ``b_V``) as ``[W_V b_V]``-shaped
    moves ``(C, E')``: where they span every move whose rows lie in one subspace ``K`` of ``R^E'`` (``k_v = C·dim K``;
    so for the symmetries ``S [W_V b_V]`` and the value bias), an orthonormal basis ``(E', E' − dim K)`` of ``K``'s
    complement, on which each value channel is certified alike; else ``None``."""
    k, Ep = Tv.shape[1], Tv.shape[0] // C
    if not k:
        return torch.eye(Ep, dtype=Tv.dtype)
    moves = Tv.T.reshape(k, C, Ep)
    if bias:  # W_V's coordinates (C·E, row by row), then b_V's (C)
        moves = torch.cat([Tv[:-C].T.reshape(k, C, Ep - 1), Tv[-C:].T[:, :, None]], 2)
    _, sv, Vh = torch.linalg.svd(torch.linalg.qr(moves.reshape(k * C, Ep), mode="r").R)  # (≤ E', E'): small
    dim = int((sv > rtol * sv[0]).sum())
    return Vh[dim:].T.contiguous() if C * dim == k else None


def _split_known(block: _GroupBlock, rtol: float) -> None:
    """Step 2 for a group: its known directions split into those on the value parameters and the rest; where the value
    channels mix alone (:meth:`GroupActivations.value_map`) and the value directions have the row form of
    :func:`_value_rows`, the value part is certified channel by channel (``block.value_rows``)."""
    T, where = block.T, param_slices(block.params)
    v_idx = torch.cat([torch.arange(where[k].start, where[k].stop) for k in VALUE_PARAMS if k in where])
    r_idx = torch.arange(int(v_idx.min()))  # the value parameters come last in θ's order
    n_b, k = T.shape
    if k > n_b:
        raise CertificateError(f"certify: {k} supplied null directions for {n_b} coordinates are not independent")
    on_v, on_r = T[v_idx].ne(0).any(0), T[r_idx].ne(0).any(0)
    rows = None
    block.value_map = block.acts.value_map() if not bool((on_v & on_r).any()) else None
    if block.value_map is not None:
        rows = _value_rows(T[v_idx][:, on_v], block.sub.C, "b_V" in where, rtol)
    if rows is None:  # every coordinate, in the order of GroupActivations.columns
        block.rest, T_rest, t_v = "QKV", T[block.acts.ext_order("QKV")], 1.0
    else:
        block.value_rows, block.rest = rows, "QK"
        T_rest = T[block.acts.ext_order("QK")][:, on_r]
        t_v = _householder(T[v_idx][:, on_v], rtol)[1]
    block.rest_qr, t_r = _householder(T_rest, rtol)
    block.t_cond = min(t_v, t_r)
    a = 0 if rows is None else rows.shape[1]
    block.n_free = block.sub.C * a + T_rest.shape[0] - T_rest.shape[1]


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
    T: Directions,
    rtol: float,
    chunk: int = 128,
) -> tuple[list[_JacobianBlock] | list[_GroupBlock], float | None]:
    """Step 2: the parts certified on their own, each with its known directions split or pinned, and ``σ_min(W_O)``
    where the parts are the key/value groups (``None``: one part, the whole φ)."""
    theta = flatten(p)
    where = param_slices(p)
    phi_names = [k for k in PARAM_ORDER if k in p and k not in ("W_O", "b_O")]
    phi_idx = torch.cat([torch.arange(where[name].start, where[name].stop) for name in phi_names])
    rows = direction_rows(T)
    split = _head_group_blocks(cfg, p, X, phi_idx, rows, rtol, chunk)
    if split is None:
        whole = _JacobianBlock(f, theta, phi_idx, _dense(rows[:, phi_idx.numpy()]).T, cfg.E)
        _pin_known_directions(whole, rtol)
        return [whole], None
    for block in split[0]:
        _split_known(block, rtol)
    return split


def null_residuals(f: Callable, theta: torch.Tensor, T: Directions, chunk: int) -> torch.Tensor:
    """Step 3: ``‖J t‖ / ‖t‖`` for every column ``t`` of ``T`` ``(n, k)``, by forward mode."""
    rows = direction_rows(T)
    k = rows.shape[0]
    if not k:
        return torch.zeros(0)

    def jt(t):
        return jvp(f, (theta,), (t,))[1]

    resid = torch.cat([vmap(jt)(_dense(rows[j : j + chunk])).norm(dim=1) for j in range(0, k, chunk)])
    return resid / torch.from_numpy(scipy.sparse.linalg.norm(rows, axis=1))


RESIDUAL_ENTRIES = 2**21  # the outputs of the directions pushed at once (16 MB): small enough to reuse the memory


def null_residuals_by_group(
    cfg: AttentionConfig,
    p: AttentionParams,
    X: torch.Tensor,
    T: Directions,
    blocks: list[_GroupBlock],
    chunk: int,
) -> torch.Tensor:
    """Step 3 where the key/value groups split the Jacobian: the numbers of :func:`null_residuals`, with each
    direction ``t`` differentiated through its own group only. ``Y = Σ_h W_O^h Z_h + b_O``, so
    ``J t = Σ_h dW_O^h Z_h + W_O^{(g)} dZ_g + db_O``, where ``dZ_g`` is the derivative of the mixtures of the group
    ``g`` that owns ``t``, through its activations (:meth:`GroupActivations.tangent`)."""
    where = param_slices(p)
    W_O = p["W_O"]  # (H, E, C)
    Z = head_mixtures(X, p, cfg)  # (B, H, C, L)
    rows_all = direction_rows(T)
    t_W_O, t_b_O = rows_all[:, where["W_O"]], (rows_all[:, where["b_O"]] if "b_O" in p else None)
    resid = torch.empty(rows_all.shape[0], dtype=torch.float64)
    per = cfg.H // cfg.G
    rows = max(1, min(chunk, RESIDUAL_ENTRIES // X.numel()))  # directions per product: outputs of ≤ 16 MB
    Z_t = Z.permute(1, 2, 0, 3).reshape(cfg.H, cfg.C, -1)  # (H, C, B·L)
    for g, block in enumerate(blocks):
        W_g = W_O[g * per : (g + 1) * per].permute(1, 0, 2).reshape(cfg.E, per * cfg.C)  # (E, n·C)
        for j0 in range(0, len(block.dirs), chunk):
            dZ = block.acts.tangent(block.T[:, j0 : j0 + chunk])  # (k, B, n, C, L)
            dZ = dZ.permute(0, 2, 3, 1, 4).reshape(len(dZ), per * cfg.C, -1)  # (k, n·C, B·L)
            for j in range(j0, min(j0 + chunk, len(block.dirs)), rows):
                cols = block.dirs[j : min(j + rows, j0 + chunk)]
                out = W_g @ dZ[j - j0 : j - j0 + len(cols)]  # (k, E, B·L)
                dW_O = _dense(t_W_O[cols.numpy()]).reshape(len(cols), *W_O.shape)  # the W_O part of each direction
                heads = dW_O.ne(0).flatten(2).any(2).any(0)  # the heads whose W_O some direction here moves
                if heads.any():
                    moved = dW_O[:, heads].permute(0, 2, 1, 3).reshape(len(cols), cfg.E, -1)  # (k, E, h·C)
                    out += moved @ Z_t[heads].reshape(-1, Z_t.shape[-1])
                if t_b_O is not None:
                    out += _dense(t_b_O[cols.numpy()])[:, :, None]
                resid[cols] = torch.linalg.vector_norm(out, dim=(1, 2))
    return resid / torch.from_numpy(scipy.sparse.linalg.norm(rows_all, axis=1))


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
        k_max = top_singular_value(lambda V: (V @ M.T) @ M, nb, gen)  # (V Mᵀ) M: no transposed-A product
        cond = k_max / k_min if k_min > 0 else math.inf
    seconds = {"block_jacobians": t1 - t0, "block_factors": time.perf_counter() - t1}
    return Certificate("whole sketch", sigma_max / cond, cond < 1 / rtol, sketch_cond=cond, seconds=seconds)


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
    out: OutputBlock,
    cert: Certificate,
    blocks: Sequence[_JacobianBlock] | Sequence[_GroupBlock],
    sigma_max: float,
    k: int,
    worst: float,
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
    if directions is None:
        T = direction_rows(tangent_rows(p, cfg)[0])
    else:
        given = torch.as_tensor(directions)
        if given.dim() != 2 or given.shape[0] != n:
            raise ValueError(f"directions: expected shape ({n}, k), got {tuple(given.shape)}")
        T = direction_rows(given)  # (k, n), one direction per row, its zeros not stored
    blocks, wo_min = certification_blocks(cfg, p, X, f, T, rtol, chunk)
    whole = cast(_JacobianBlock, blocks[0]) if wo_min is None else None
    groups = cast(list[_GroupBlock], blocks)
    if whole is not None:
        whole.shape = (Bsz, L)
    n_free = sum(b.n_free for b in blocks)
    timer("known_directions")
    resid = (
        null_residuals(f, theta, T, chunk)
        if whole is not None
        else null_residuals_by_group(cfg, p, X, T, groups, chunk)
    )
    timer("null_residuals")
    sigma_max = largest_singular_value(f, theta, gen)
    timer("sigma_max")
    bar = _progress_bar(n_free, "per-group factors" if wo_min else "sketch") if progress else None
    if whole is not None:
        cert = whole_sketch_certificate(whole, _projector(out.Qz, Bsz, L), gen, sigma_max, rtol, chunk, bar)
    else:
        assert wo_min is not None
        cert = per_group_certificate(groups, out.Qz, gen, sigma_max, wo_min, rtol, bar)
    if bar is not None:
        bar.close()
    seconds = {**timer.seconds, **cert.seconds}
    k = T.shape[0]
    worst = _checked(resid, cert, sigma_max, rtol)
    details = _details(out, cert, blocks, sigma_max, k, worst) | {"stage_seconds": seconds}
    gap = cert.kept / max(worst, sigma_max * np.finfo(np.float64).eps)
    return Certified(out.rank + n_free, float(gap), float(rtol * sigma_max), details)
