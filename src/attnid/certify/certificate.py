"""Steps 3 and 5 of a certificate (:mod:`attnid.certify`): the residual ``‖J t‖ / ‖t‖`` of every known
direction (:func:`null_residuals`, :func:`null_residuals_by_group`) and ``‖J‖₂``
(:func:`largest_singular_value`), then :func:`certify`: the known directions must be null and the rest of full
rank, or :class:`CertificateError`; ``rank = E·rank(Z) + n_free``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.linalg
import torch
from torch.func import jvp, vjp, vmap

from ..attention import (
    AttentionConfig,
    AttentionParams,
    flatten,
    head_mixtures,
    param_slices,
)
from ..symmetry import tangent_rows
from .activations import _JacobianBlock
from .blocks import Directions, OutputBlock, _dense, _GroupBlock, certification_blocks, direction_rows, output_block
from .linalg import CertificateError, StageTimer, top_singular_value
from .strategies import Certificate, _progress_bar, _projector, per_group_certificate, whole_sketch_certificate


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
