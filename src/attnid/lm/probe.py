"""The identification probe of chapter 6: what one optimizer step does to the QK symmetry (paper §5).

``IdentificationProbe.before_step()`` (after ``backward``, before clipping) snapshots the query and
key weights and the bias gradients; ``after_step()`` (after ``opt.step()``) returns one row:

- ``rho``: the unidentified-step fraction ρ of the step (Eq. of chapter 6) per layer and head, of the
  bias-augmented ``[W_Q | b_Q]``, ``[W_K | b_K]``. The update is the optimizer's own step computed in
  float64 from its state (:func:`optimizer_update`), not the difference of two float32 tensors, so ρ
  of a plain gradient step is zero to float64 round-off of the float32 gradient;
- ``rho_w``: the same for the weights alone (ignoring the biases, on which the symmetry also acts);
- ``rho_diff``: ρ of the float32 weight difference, the measure of the paper, whose rounding floor
  grows as the steps shrink;
- ``beta_drift`` ``‖β_t − β_0‖ / ‖β_0‖``, ``beta_law_residual`` ``‖β_t − c_t β_0‖ / ‖c_t β_0‖`` (the residual of
  the weight-decay law, ``c_t`` passed in by the loop from the schedule) and ``beta_rel``
  ``‖β_t‖ / (‖G_Q‖ + ‖G_K‖)`` per layer (norms over all heads of a layer); ``tau`` ``= tr β`` per head;
- ``grad_bq``, ``grad_bk`` (bias-gradient norms before clipping) and ``norm_bq``, ``norm_bk`` per head.

The keys, shapes and units are :data:`attnid.lm.metrics.SCHEMA`. Everything is float64. The work is split in two:
on the model's device, the Gram matrices ``G_Q = Q Qᵀ``, ``G_K = K Kᵀ`` and the right-hand sides ``C = A Qᵀ − K Bᵀ``
of every head (a few batched matrix products) and the β metrics; on the host, after one copy per row, the
small eigendecompositions that solve each head's Sylvester equation (:func:`attnid.dynamics.step_fractions`),
which a GPU runs one matrix at a time. On a GPU the host part runs in a background thread, spread over the
cores, while the next steps train: :meth:`IdentificationProbe.after_step` returns a :class:`PendingRow`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from .. import dynamics
from .metrics import Key

# the host part of a row, per head: the Gram matrices of the point (with and without the bias column) and the
# right-hand sides of the three updates measured there
HOST_PARTS = ("G_Q", "G_K", "C_update", "C_diff", "q", "k", "a", "b", "den_update", "den_diff")


def optimizer_update(opt: torch.optim.Optimizer, p: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """The update ``Δp`` that ``opt.step()`` just applied to ``p``, in float64, from the optimizer's state.

    ``old`` is ``p`` before the step (float64). Supports SGD without momentum and Adam/AdamW
    (``Δ = −η λ p − η m̂ / (√v̂ + ε)`` with decoupled decay ``λ``, or ``λ`` added to the gradient for Adam).
    """
    group = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
    lr, wd = float(group["lr"]), float(group["weight_decay"])
    if isinstance(opt, torch.optim.Adam) and not group.get("amsgrad") and not group.get("maximize"):
        decoupled = isinstance(opt, torch.optim.AdamW) or group.get("decoupled_weight_decay", False)
        if not decoupled and wd:
            raise TypeError("optimizer_update: Adam with coupled weight decay is not supported")
        state = opt.state[p]
        t = float(state["step"])
        b1, b2 = group["betas"]
        m, v = state["exp_avg"].to(torch.float64), state["exp_avg_sq"].to(torch.float64)
        denom = v.sqrt() / math.sqrt(1.0 - b2**t) + group["eps"]
        return -lr * wd * old - (lr / (1.0 - b1**t)) * m / denom
    if isinstance(opt, torch.optim.SGD) and not group.get("momentum") and not group.get("maximize"):
        if p.grad is None:
            raise ValueError("optimizer_update: the parameter has no gradient")
        return -lr * (p.grad.to(torch.float64) + wd * old)
    raise TypeError(f"optimizer_update: unsupported optimizer {type(opt).__name__} with these settings")


def to_host(tensors: dict[str, torch.Tensor]) -> dict[str, float | list]:
    """One device-to-host copy for a dict of tensors; returns Python numbers and nested lists."""
    flat = torch.cat([t.detach().to(torch.float64).reshape(-1) for t in tensors.values()]).cpu()
    return unpack(flat, {k: t.shape for k, t in tensors.items()}, as_lists=True)


def unpack(flat: torch.Tensor, shapes: dict[str, torch.Size], as_lists: bool = False) -> dict:
    """Split a flat tensor into ``shapes`` (in order): tensors, or Python numbers and nested lists."""
    out, i = {}, 0
    for k, shape in shapes.items():
        n = math.prod(shape)
        part = flat[i : i + n].reshape(shape)
        out[k] = (part.item() if len(shape) == 0 else part.tolist()) if as_lists else part
        i += n
    return out


def host_workers() -> int:
    """Threads for the host part of a row on a GPU machine: the cores but one for the training loop."""
    return max(1, min(16, (os.cpu_count() or 2) - 1))


class PendingRow:
    """A probe row whose host part may still be computing: :meth:`result` waits for it and returns the row."""

    def __init__(self, compute: Callable[[], dict] | None = None, future: Future | None = None):
        self._compute, self._future = compute, future
        self._row: dict | None = None

    def result(self) -> dict:
        if self._row is None:
            if self._future is not None:
                self._row = self._future.result()
            else:
                assert self._compute is not None
                self._row = self._compute()
        return self._row


UpdateFn = Callable[[int, str, torch.Tensor], torch.Tensor]  # (layer, "weight" | "bias", old float64) -> Δ float64


class IdentificationProbe:
    """Records the QK-symmetry metrics of one training step of a :class:`attnid.lm.gpt.GPT`, or of several runs
    trained as one stacked model (:mod:`attnid.lm.batched`).

    ``qk_params``: the ``c_attn`` weight ``([R,] 3HD, E)`` and bias ``([R,] 3HD)`` of each layer, with a leading run
    dim ``R`` when stacked (every metric then carries it first: ``(R, n_layer, ...)``); ``update(layer, which,
    old)``: the float64 update the optimizer just applied to that layer's weight or bias (:func:`optimizer_update`);
    ``beta0``: ``([R,] n_layer, H, D, D)`` initial β (from a checkpoint when resuming); default: now.
    ``background``: compute the host part of each row in a background thread (on a GPU) instead of when the row is
    asked for."""

    def __init__(
        self,
        n_head: int,
        qk_params: list[tuple[torch.Tensor, torch.Tensor | None]],
        update: UpdateFn,
        beta0: torch.Tensor | None = None,
        background: bool = False,
    ):
        self.params, self.update, self.H = qk_params, update, n_head
        self._old: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self._grads: dict[str, torch.Tensor] = {}
        self._rows = ThreadPoolExecutor(1, thread_name_prefix="probe-row") if background else None
        self._workers = ThreadPoolExecutor(host_workers(), thread_name_prefix="probe-solve") if background else None
        if beta0 is None:
            beta0 = dynamics.beta(*self._augmented(*self._stacked()))
        self.beta0 = beta0

    @classmethod
    def for_model(cls, model, opt: torch.optim.Optimizer, beta0: torch.Tensor | None = None) -> IdentificationProbe:
        """The probe of one :class:`attnid.lm.gpt.GPT` trained by ``opt``."""
        params = [(layer.c_attn.weight, layer.c_attn.bias) for layer in model.attention_layers()]

        def update(i: int, which: str, old: torch.Tensor) -> torch.Tensor:
            p = params[i][0] if which == "weight" else params[i][1]
            assert p is not None
            return optimizer_update(opt, p, old)

        return cls(model.attention_layers()[0].n_head, params, update, beta0=beta0)

    def close(self) -> None:
        for pool in (self._rows, self._workers):
            if pool is not None:
                pool.shutdown(wait=True)

    def _stacked(self, attr: str = "") -> tuple[torch.Tensor, torch.Tensor | None]:
        """Fused ``c_attn`` weight ``([R,] L, 3HD, E)`` and bias ``([R,] L, 3HD)`` of every layer, float64
        (``attr="grad"``: their gradients)."""
        ws = [w for w, _ in self.params]
        bs = [b for _, b in self.params]
        if attr:
            ws, bs = [getattr(w, attr) for w in ws], [None if b is None else getattr(b, attr) for b in bs]
        w = torch.stack([t.detach() for t in ws], dim=-3).to(torch.float64)
        b = None if bs[0] is None else torch.stack([t.detach() for t in bs if t is not None], dim=-2).to(torch.float64)
        return w, b

    def _split(self, w: torch.Tensor, b: torch.Tensor | None) -> tuple:
        """Stacked fused ``(w, b)`` -> per-head ``W_Q, b_Q, W_K, b_K`` ``(..., L, H, D, E)``/``(..., L, H, D)``
        (the layout of :func:`attnid.attention.fused_qk_views`)."""
        *lead, rows, E = w.shape
        D = rows // (3 * self.H)
        W_Q = w[..., : rows // 3, :].reshape(*lead, self.H, D, E)
        W_K = w[..., rows // 3 : 2 * rows // 3, :].reshape(*lead, self.H, D, E)
        if b is None:
            return W_Q, None, W_K, None
        b_Q = b[..., : rows // 3].reshape(*lead, self.H, D)
        return W_Q, b_Q, W_K, b[..., rows // 3 : 2 * rows // 3].reshape(*lead, self.H, D)

    def _augmented(self, w: torch.Tensor, b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        W_Q, b_Q, W_K, b_K = self._split(w, b)
        return dynamics.augment(W_Q, b_Q), dynamics.augment(W_K, b_K)

    @torch.no_grad()
    def before_step(self) -> None:
        """Call after ``loss.backward()`` and before clipping and ``opt.step()``."""
        self._old = self._stacked()
        self._grads = {}
        bias = self.params[0][1]
        if self._old[1] is not None and bias is not None and bias.grad is not None:
            _, g_q, _, g_k = self._split(*self._stacked("grad"))
            self._grads = {Key.GRAD_BQ: g_q.norm(dim=-1), Key.GRAD_BK: g_k.norm(dim=-1)}

    @torch.no_grad()
    def after_step(self, law_factor: float | torch.Tensor = 1.0, **scalars: torch.Tensor | float) -> PendingRow:
        """Call after ``opt.step()``; returns the row (``scalars`` such as the loss are added to it), pending while
        its host part computes. ``law_factor``: ``c_t`` of the weight-decay law after this step
        (:func:`attnid.lm.profiles.beta_law_factor`), one per run when stacked."""
        if self._old is None:
            raise RuntimeError("IdentificationProbe.after_step() called without before_step()")
        (w0, b0), (w1, b1) = self._old, self._stacked()
        self._old = None
        L = w0.shape[-3]
        dw = torch.stack([self.update(i, "weight", w0.select(-3, i)) for i in range(L)], -3)
        db = None if b0 is None else torch.stack([self.update(i, "bias", b0.select(-2, i)) for i in range(L)], -2)
        Q1, K1 = self._augmented(w1, b1)
        host = self._host_parts(self._augmented(w0, b0), self._augmented(dw, db), (Q1, K1), bias=b0 is not None)
        G_Q1, G_K1 = dynamics.gram(Q1), dynamics.gram(K1)
        beta_t = G_Q1 - G_K1

        def per_layer(M: torch.Tensor) -> torch.Tensor:
            return torch.linalg.matrix_norm(M).norm(dim=-1)

        c = torch.as_tensor(law_factor, dtype=torch.float64, device=beta_t.device)
        c_layer = c.reshape(*c.shape, *[1] * (beta_t.dim() - 3 - c.dim()))  # against ([R,] L)
        c_matrix = c.reshape(*c.shape, *[1] * (beta_t.dim() - c.dim()))  # against ([R,] L, H, D, D)
        here: dict[str, torch.Tensor] = {
            **{k: torch.as_tensor(v, dtype=torch.float64, device=beta_t.device) for k, v in scalars.items()},
            Key.BETA_DRIFT: per_layer(beta_t - self.beta0) / per_layer(self.beta0),
            Key.BETA_LAW: per_layer(beta_t - c_matrix * self.beta0) / (c_layer * per_layer(self.beta0)),
            Key.BETA_REL: per_layer(beta_t) / (per_layer(G_Q1) + per_layer(G_K1)),
            Key.TAU: beta_t.diagonal(dim1=-2, dim2=-1).sum(-1),
            **self._grads,
        }
        if b1 is not None:
            _, b_Q1, _, b_K1 = self._split(w1, b1)
            here[Key.NORM_BQ], here[Key.NORM_BK] = b_Q1.norm(dim=-1), b_K1.norm(dim=-1)
        flat, shapes, ready = self._to_host({**host, **{f"row:{k}": v for k, v in here.items()}})

        def finish() -> dict:
            if ready is not None:
                ready.synchronize()
            parts = unpack(flat, shapes)
            rho, rho_w, rho_diff = self._fractions({k: parts[k] for k in HOST_PARTS})
            row = {k[4:]: v for k, v in parts.items() if k.startswith("row:")}
            order = [*scalars, Key.RHO, Key.RHO_W, Key.RHO_DIFF]
            row.update({Key.RHO: rho, Key.RHO_W: rho_w, Key.RHO_DIFF: rho_diff})
            return {k: _listed(row[k]) for k in order + [k for k in row if k not in order]}

        return self._pending(finish)

    @staticmethod
    def _host_parts(point: tuple, update: tuple, after: tuple, bias: bool) -> dict[str, torch.Tensor]:
        """Per head, what the Sylvester solves on the host need (:data:`HOST_PARTS`): the Gram matrices of the point
        ``(Q0, K0)``, the right-hand sides of the optimizer's ``update`` ``(A, B)`` and of the float32 difference
        to ``after`` ``(Q1, K1)``, their squared norms, and the bias columns (zero without biases), from which the
        weights-only problem follows."""
        (Q0, K0), (A, B), (Q1, K1) = point, update, after
        dQ, dK = Q1 - Q0, K1 - K0
        zeros = torch.zeros_like(Q0[..., 0])
        col = (lambda M: M[..., -1]) if bias else (lambda M: zeros)
        return {
            "G_Q": dynamics.gram(Q0),
            "G_K": dynamics.gram(K0),
            "C_update": A @ Q0.transpose(-1, -2) - K0 @ B.transpose(-1, -2),
            "C_diff": dQ @ Q0.transpose(-1, -2) - K0 @ dK.transpose(-1, -2),
            "q": col(Q0),
            "k": col(K0),
            "a": col(A),
            "b": col(B),
            "den_update": (A * A).sum((-1, -2)) + (B * B).sum((-1, -2)),
            "den_diff": (dQ * dQ).sum((-1, -2)) + (dK * dK).sum((-1, -2)),
        }

    def _to_host(self, tensors: dict[str, torch.Tensor]):
        """One copy to the host of ``tensors`` (float64): ``(flat, shapes, event)``; on CUDA the copy is queued into
        pinned memory and ``event`` tells when it has landed (``None``: already there)."""
        flat = torch.cat([t.detach().to(torch.float64).reshape(-1) for t in tensors.values()])
        shapes = {k: t.shape for k, t in tensors.items()}
        if flat.device.type != "cuda":
            return flat.cpu(), shapes, None
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, shapes, event

    def _pending(self, finish: Callable[[], dict]) -> PendingRow:
        return PendingRow(future=self._rows.submit(finish)) if self._rows is not None else PendingRow(finish)

    def _map(self, fn: Callable, parts: dict[str, torch.Tensor]) -> tuple:
        """``fn(parts)`` over the heads (flattened leading dims), in chunks on the worker threads when there are any;
        returns ``fn``'s tuple of ``(heads...)`` tensors reshaped to the leading dims."""
        lead = parts["G_Q"].shape[:-2]
        flat = {k: v.reshape(-1, *v.shape[len(lead) :]) for k, v in parts.items()}
        n = next(iter(flat.values())).shape[0]
        if self._workers is None or n < 2:
            outs = fn(flat)
        else:
            chunks = min(n, host_workers())
            pieces = [{k: torch.tensor_split(v, chunks)[i] for k, v in flat.items()} for i in range(chunks)]
            results = list(self._workers.map(fn, pieces))
            outs = tuple(torch.cat(r) for r in zip(*results))
        return tuple(o.reshape(*lead, *o.shape[1:]) for o in outs)

    def _fractions(self, parts: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """ρ of the float64 update, of the update to the weights alone (bias column dropped from the point and the
        update) and of the float32 difference, per head, from the host parts (:data:`HOST_PARTS`)."""

        def solve(p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
            outer = lambda u, v: u[..., :, None] * v[..., None, :]  # noqa: E731
            G_Qw, G_Kw = p["G_Q"] - outer(p["q"], p["q"]), p["G_K"] - outer(p["k"], p["k"])
            C_w = p["C_update"] - outer(p["a"], p["q"]) + outer(p["k"], p["b"])
            den_w = p["den_update"] - (p["a"] * p["a"]).sum(-1) - (p["b"] * p["b"]).sum(-1)
            both = dynamics.step_fractions(
                p["G_Q"],
                p["G_K"],
                torch.stack([p["C_update"], p["C_diff"]]),
                torch.stack([p["den_update"], p["den_diff"]]),
            )
            weights = dynamics.step_fractions(G_Qw, G_Kw, C_w, den_w)
            return both[0], weights, both[1]

        return self._map(solve, parts)

    @torch.no_grad()
    def qk_singular_values(self) -> PendingRow:
        """Singular values of every head's augmented QK product, ``([R,] n_layer, H, D)``; the row's value is
        under the key ``"qk_sv"`` once computed (the Gram matrices go to the host, as for :meth:`after_step`)."""
        Q, K = self._augmented(*self._stacked())
        flat, shapes, ready = self._to_host({"G_Q": dynamics.gram(Q), "G_K": dynamics.gram(K)})

        def finish() -> dict:
            if ready is not None:
                ready.synchronize()
            parts = unpack(flat, shapes)
            (sv,) = self._map(lambda p: (dynamics.qk_singular_values_of_grams(p["G_Q"], p["G_K"]),), parts)
            return {Key.QK_SV: sv.tolist()}

        return self._pending(finish)


def _listed(v: torch.Tensor) -> float | list:
    return v.item() if v.dim() == 0 else v.tolist()
