"""Rotary position embeddings (RoPE) in the paper's column orientation (paper §4.8; chapter 4).

Pairs of coordinates ``(2i, 2i+1)`` of a query or key at position ``m`` are rotated by the
angle ``m * theta_i`` with ``theta_i = base ** (-2 i / R)``, for the first ``R`` of the ``D`` coordinates
(``R = D``: full RoPE). Hugging Face's ``rotate_half`` pairs ``i`` with ``i + R/2`` instead: a fixed
permutation of the coordinates, which changes no count (tests/test_hf.py checks it on real modules).
"""

from __future__ import annotations

import torch


def rope_angles(
    seq_len: int, head_dim: int, base: float = 10000.0, *, dtype: torch.dtype = torch.float64, device=None
) -> torch.Tensor:
    """Angles ``m * theta_i``, shape ``(L, D/2)``."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for RoPE, got D={head_dim}")
    i = torch.arange(head_dim // 2, dtype=dtype, device=device)
    theta = base ** (-2.0 * i / head_dim)
    m = torch.arange(seq_len, dtype=dtype, device=device)
    return m[:, None] * theta[None, :]


def apply_rope(Z: torch.Tensor, base: float = 10000.0, dims: int | None = None) -> torch.Tensor:
    """Rotate columns of ``Z`` (shape ``(..., D, L)``, one position per column). With ``dims`` R < D
    only the first R rows rotate (partial RoPE), with frequencies ``base ** (-2 i / R)``."""
    D, L = Z.shape[-2], Z.shape[-1]
    R = D if dims is None else dims
    ang = rope_angles(L, R, base, dtype=Z.dtype, device=Z.device).T  # (R/2, L)
    cos, sin = torch.cos(ang), torch.sin(ang)
    x0, x1 = Z[..., 0:R:2, :], Z[..., 1:R:2, :]
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-2)  # (..., R/2, 2, L)
    return torch.cat([rotated.reshape(*Z.shape[:-2], R, L), Z[..., R:, :]], dim=-2)


def commutant_basis(head_dim: int, rope_dims: int | None = None) -> torch.Tensor:
    """Basis of the matrices commuting with every RoPE rotation: one ``[[a, -b], [b, a]]`` block per
    frequency pair (``R`` matrices), and with partial RoPE (``rope_dims`` R < D) every matrix on the
    ``D − R`` unrotated dimensions, ``(D − R)²`` more; shape ``(R + (D − R)², D, D)`` (paper §4.8; chapter 4).
    No matrix couples the two parts: a rotation by a generic angle has no fixed vector."""
    R = head_dim if rope_dims is None else rope_dims
    P = head_dim - R
    basis = torch.zeros(R + P * P, head_dim, head_dim, dtype=torch.float64)
    for i in range(R // 2):
        a, b = 2 * i, 2 * i + 1
        basis[a, a, a] = basis[a, b, b] = 1.0  # identity on the block
        basis[b, b, a], basis[b, a, b] = 1.0, -1.0  # 90-degree rotation on the block
    for k in range(P * P):
        basis[R + k, R + k // P, R + k % P] = 1.0
    return basis


def random_commutant(
    head_dim: int, generator: torch.Generator | None = None, rope_dims: int | None = None
) -> torch.Tensor:
    """A random nonsingular element of the RoPE commutant (a scaled rotation per pair, any matrix on
    the unrotated dimensions)."""
    basis = commutant_basis(head_dim, rope_dims)
    coef = torch.randn(len(basis), dtype=torch.float64, generator=generator)
    return torch.einsum("k,kij->ij", coef, basis)
