"""Steps 1 and 2 of a certificate (:mod:`attnid.certify`): the output block (:func:`output_block`), the known
null directions as sparse rows (:func:`direction_rows`), and the parts of the remaining parameters certified
on their own (:func:`certification_blocks`: one per key/value group where ``W_O`` is injective, else the whole
φ), each with its known directions pinned or split off channel by channel (:func:`_split_known`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.linalg
import torch

from ..attention import (
    PARAM_ORDER,
    AttentionConfig,
    AttentionParams,
    attention,
    flatten,
    param_slices,
)
from .activations import GroupActivations, _JacobianBlock
from .linalg import CertificateError, _compact_wy, _householder

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
