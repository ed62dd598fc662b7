"""Rotary position embeddings (RoPE) in the paper's column orientation (paper §4.8; chapter 4).

Pairs of coordinates ``(2i, 2i+1)`` of a query or key at position ``m`` are rotated by the
angle ``m * theta_i`` with ``theta_i = base ** (-2 i / D)``.
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


def apply_rope(Z: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate columns of ``Z`` (shape ``(..., D, L)``, one position per column)."""
    D, L = Z.shape[-2], Z.shape[-1]
    ang = rope_angles(L, D, base, dtype=Z.dtype, device=Z.device).T  # (D/2, L)
    cos, sin = torch.cos(ang), torch.sin(ang)
    x0, x1 = Z[..., 0::2, :], Z[..., 1::2, :]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-2)  # (..., D/2, 2, L)
    return out.reshape(Z.shape)


def commutant_basis(head_dim: int) -> torch.Tensor:
    """Basis of the matrices commuting with every RoPE rotation: one ``[[a, -b], [b, a]]``
    block per frequency pair, so ``D`` matrices of shape ``(D, D)`` (paper §4.8)."""
    basis = torch.zeros(head_dim, head_dim, head_dim, dtype=torch.float64)
    for i in range(head_dim // 2):
        a, b = 2 * i, 2 * i + 1
        basis[a, a, a] = basis[a, b, b] = 1.0  # identity on the block
        basis[b, b, a], basis[b, a, b] = 1.0, -1.0  # 90-degree rotation on the block
    return basis


def random_commutant(head_dim: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A random nonsingular element of the RoPE commutant (a scaled rotation per pair)."""
    coef = torch.randn(head_dim, dtype=torch.float64, generator=generator)
    return torch.einsum("k,kij->ij", coef, commutant_basis(head_dim))
