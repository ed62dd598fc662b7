"""Step 2 of a certificate (:mod:`attnid.certify`): one key/value group's mixtures differentiated once with
respect to its activations ``Q, K, V`` (:class:`GroupActivations`), checked against forward mode through the
whole group."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.func import jvp, vmap

from ..attention import (
    AttentionConfig,
    AttentionParams,
    flatten,
    head_mixtures,
    mix_heads,
    param_slices,
    projections,
    unflatten,
)
from .linalg import CertificateError


@dataclass
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
