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

The keys, shapes and units are :data:`attnid.lm.metrics.SCHEMA`. All of it is computed on the
model's device in float64 and crosses to the host once per row.
"""

from __future__ import annotations

import math

import torch

from .. import dynamics
from .metrics import Key


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
    out, i = {}, 0
    for k, t in tensors.items():
        n = t.numel()
        part = flat[i : i + n].reshape(t.shape)
        out[k] = part.item() if t.dim() == 0 else part.tolist()
        i += n
    return out


class IdentificationProbe:
    """Records the QK-symmetry metrics of one training step of a :class:`attnid.lm.gpt.GPT`.

    ``beta0``: ``(n_layer, H, D, D)`` initial β (from a checkpoint when resuming); default: now.
    ``qk_params``: the ``c_attn`` weight and bias of each layer (default: the model's own). Several seeds
    trained as one stacked model (:mod:`attnid.lm.batched`) pass tensors with a leading seed dim ``S``;
    every metric then carries it first: ``(S, n_layer, ...)``.
    """

    def __init__(
        self,
        model,
        opt: torch.optim.Optimizer,
        beta0: torch.Tensor | None = None,
        qk_params: list[tuple[torch.Tensor, torch.Tensor | None]] | None = None,
    ):
        self.params = qk_params or [(layer.c_attn.weight, layer.c_attn.bias) for layer in model.attention_layers()]
        self.opt = opt
        self.H = model.attention_layers()[0].n_head
        self._old: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self._grads: dict[str, torch.Tensor] = {}
        if beta0 is None:
            beta0 = dynamics.beta(*self._augmented(*self._stacked()))
        self.beta0 = beta0

    def _stacked(self, attr: str = "") -> tuple[torch.Tensor, torch.Tensor | None]:
        """Fused ``c_attn`` weight ``([S,] L, 3HD, E)`` and bias ``([S,] L, 3HD)`` of every layer, float64
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
    def after_step(self, law_factor: float = 1.0, **scalars: torch.Tensor | float) -> dict:
        """Call after ``opt.step()``; returns the row (``scalars`` such as the loss are added to it).
        ``law_factor``: ``c_t`` of the weight-decay law after this step (:func:`attnid.lm.profiles.beta_law_factor`)."""
        if self._old is None:
            raise RuntimeError("IdentificationProbe.after_step() called without before_step()")
        (w0, b0), (w1, b1) = self._old, self._stacked()
        dw = torch.stack([optimizer_update(self.opt, w, w0.select(-3, i)) for i, (w, _) in enumerate(self.params)], -3)
        db = None
        if b0 is not None:
            db = torch.stack(
                [
                    optimizer_update(self.opt, b, b0.select(-2, i))
                    for i, (_, b) in enumerate(self.params)
                    if b is not None
                ],
                -2,
            )
        Q0, K0 = self._augmented(w0, b0)
        A, B = self._augmented(dw, db)
        Q1, K1 = self._augmented(w1, b1)
        # One batched solve for three ratios: (Q0, K0) with the float64 update and with the float32
        # difference; the weights alone are the same problem with the bias column zeroed (a zero column
        # changes neither the Gram matrices nor A Qᵀ). Leading dims: (point, update).
        nb = torch.ones(Q0.shape[-1], dtype=torch.float64, device=Q0.device)
        nb[w0.shape[-1] :] = 0
        rhos = dynamics.unidentified_step_fraction(
            torch.stack([Q0, Q0 * nb])[:, None],
            torch.stack([K0, K0 * nb])[:, None],
            torch.stack([torch.stack([A, Q1 - Q0]), torch.stack([A * nb, torch.zeros_like(A)])]),
            torch.stack([torch.stack([B, K1 - K0]), torch.stack([B * nb, torch.zeros_like(B)])]),
        )
        rho, rho_diff, rho_w = rhos[0, 0], rhos[0, 1], rhos[1, 0]
        G_Q1, G_K1 = dynamics.gram(Q1), dynamics.gram(K1)
        beta_t = G_Q1 - G_K1

        def per_layer(M: torch.Tensor) -> torch.Tensor:
            return torch.linalg.matrix_norm(M).norm(dim=-1)

        tensors: dict[str, torch.Tensor] = {
            **{k: torch.as_tensor(v, dtype=torch.float64) for k, v in scalars.items()},
            Key.RHO: rho,
            Key.RHO_W: rho_w,
            Key.RHO_DIFF: rho_diff,
            Key.BETA_DRIFT: per_layer(beta_t - self.beta0) / per_layer(self.beta0),
            Key.BETA_LAW: per_layer(beta_t - law_factor * self.beta0) / (law_factor * per_layer(self.beta0)),
            Key.BETA_REL: per_layer(beta_t) / (per_layer(G_Q1) + per_layer(G_K1)),
            Key.TAU: beta_t.diagonal(dim1=-2, dim2=-1).sum(-1),
            **self._grads,
        }
        if b1 is not None:
            _, b_Q1, _, b_K1 = self._split(w1, b1)
            tensors[Key.NORM_BQ], tensors[Key.NORM_BK] = b_Q1.norm(dim=-1), b_K1.norm(dim=-1)
        self._old = None
        return to_host(tensors)

    @torch.no_grad()
    def qk_singular_values(self) -> list:
        """Singular values of every head's augmented QK product, ``(n_layer, H, D)`` as nested lists."""
        return dynamics.qk_singular_values(*self._augmented(*self._stacked())).cpu().tolist()
