"""Chapter 7: head importance by ablation, pruning curves, per-head summaries.

A head is masked by zeroing its output before the output projection (``c_proj``), i.e. removing
its term ``W_O^h V_h P_h`` from the sum of Eq. (layer); the output bias stays.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .data import CharData
from .gpt import GPT


def fixed_batches(
    data: CharData, batch_size: int, block_size: int, n_batches: int, seed: int = 0, device: str = "cpu"
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A seeded, fixed set of validation batches (the same for every mask)."""
    gen = torch.Generator().manual_seed(seed)
    return [data.batch("val", batch_size, block_size, gen, device) for _ in range(n_batches)]


def set_head_mask(model: GPT, mask: torch.Tensor | np.ndarray | None) -> None:
    """``mask``: ``(n_layer, H)`` of 1 (keep) / 0 (remove), or ``None`` for all heads."""
    layers = model.attention_layers()
    for i, layer in enumerate(layers):
        layer.head_mask = (
            None
            if mask is None
            else torch.as_tensor(np.asarray(mask)[i], dtype=torch.float32, device=layer.c_attn.weight.device)
        )


@torch.no_grad()
def masked_loss(model: GPT, batches, mask=None) -> float:
    """Mean validation loss over ``batches`` with the heads of ``mask`` removed (eval mode)."""
    was = model.training
    model.eval()
    set_head_mask(model, mask)
    try:
        return torch.stack([model(x, y)[1] for x, y in batches]).double().mean().item()  # one host sync
    finally:
        set_head_mask(model, None)
        model.train(was)


MaskedLosses = Callable[[np.ndarray | None], np.ndarray]  # mask (R, n_layer, H) or None -> (R,) mean losses


def importance_of_runs(masked_losses: MaskedLosses, shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Baseline losses ``(R,)`` and, per run and ``(layer, head)``, the loss increase when that head alone is
    masked ``(R, n_layer, H)``; ``shape`` is ``(R, n_layer, H)``. One call of ``masked_losses`` per head masks that
    head in every run at once."""
    _, L, H = shape
    base = np.asarray(masked_losses(None), dtype=float)
    imp = np.zeros(shape)
    for layer in range(L):
        for h in range(H):
            mask = np.ones(shape)
            mask[:, layer, h] = 0
            imp[:, layer, h] = np.asarray(masked_losses(mask)) - base
    return base, imp


def pruning_curves(masked_losses: MaskedLosses, base: np.ndarray, importance: np.ndarray) -> list[list[dict]]:
    """Per run: mask heads cumulatively in increasing order of that run's importance; loss after each removal
    (all runs remove their k-th head in the same call of ``masked_losses``)."""
    R, L, H = importance.shape
    orders = [np.argsort(importance[r], axis=None, kind="stable") for r in range(R)]
    mask = np.ones((R, L, H))
    curves: list[list[dict]] = [[{"pruned": 0, "fraction": 0.0, "loss": float(b), "head": None}] for b in base]
    for k in range(1, L * H + 1):
        heads = [divmod(int(orders[r][k - 1]), H) for r in range(R)]
        for r, (layer, h) in enumerate(heads):
            mask[r, layer, h] = 0
        losses = np.asarray(masked_losses(mask))
        for r, (layer, h) in enumerate(heads):
            curves[r].append({"pruned": k, "fraction": k / (L * H), "loss": float(losses[r]), "head": [layer, h]})
    return curves


def head_importance(model: GPT, batches) -> tuple[float, np.ndarray]:
    """Baseline loss and, per ``(layer, head)``, the loss increase when that head alone is masked."""
    base, imp = importance_of_runs(_one_model(model, batches), (1, model.cfg.n_layer, model.cfg.n_head))
    return float(base[0]), imp[0]


def pruning_curve(model: GPT, batches, importance: np.ndarray) -> list[dict]:
    """Mask heads cumulatively in increasing order of importance; loss after each removal."""
    losses = _one_model(model, batches)
    return pruning_curves(losses, losses(None), np.asarray(importance)[None])[0]


def _one_model(model: GPT, batches) -> MaskedLosses:
    return lambda mask: np.array([masked_loss(model, batches, None if mask is None else mask[0])])


def max_prunable_fraction(curve: list[dict], tolerance: float) -> float:
    """Largest fraction of heads removed before the loss first exceeds ``(1 + tolerance)`` x baseline."""
    base = curve[0]["loss"]
    best = 0.0
    for point in curve[1:]:
        if point["loss"] > (1.0 + tolerance) * base:
            break
        best = point["fraction"]
    return best


PRUNE_TOLERANCES = (0.01, 0.05)  # loss increases (relative) within which heads count as prunable


def prunable(heads: dict, tolerance: float) -> float:
    """The fraction of heads removable within ``tolerance`` as stored in a record's ``heads.json``."""
    return heads["prunable"][f"{tolerance:g}"]


def analyse(model: GPT, batches, qk_singular_values=None) -> dict:
    """The end-of-run head analysis stored in a run record (``heads.json``, read by chapter 7).

    Keys: ``baseline`` (loss with every head), ``importance`` ``(n_layer, H)``, ``pruning_curve``
    (:func:`pruning_curve`), ``prunable`` (fraction of heads removable within each of ``PRUNE_TOLERANCES``;
    read it with :func:`prunable`), ``n_batches``
    and, given the final QK singular values ``(n_layer, H, D)``, ``effective_rank`` ``(n_layer, H)``.
    """
    shape = (1, model.cfg.n_layer, model.cfg.n_head)
    return analyse_runs(_one_model(model, batches), shape, len(batches), [qk_singular_values])[0]


def analyse_runs(masked_losses: MaskedLosses, shape: tuple[int, int, int], n_batches: int, svs: list) -> list[dict]:
    """:func:`analyse` of ``R`` runs at once (``shape`` ``(R, n_layer, H)``; ``svs``: each run's final QK singular
    values or ``None``), from their masked validation losses: one call of ``masked_losses`` evaluates a mask of
    every run (runs trained as one stacked model, :mod:`attnid.lm.batched`)."""
    base, importance = importance_of_runs(masked_losses, shape)
    curves = pruning_curves(masked_losses, base, importance)
    out = []
    for r, curve in enumerate(curves):
        one = {
            "baseline": float(base[r]),
            "importance": importance[r].tolist(),
            "pruning_curve": curve,
            "prunable": {f"{tol:g}": max_prunable_fraction(curve, tol) for tol in PRUNE_TOLERANCES},
            "n_batches": n_batches,
        }
        if svs[r] is not None:
            one["effective_rank"] = effective_rank(svs[r]).tolist()
        out.append(one)
    return out


def effective_rank(singular_values) -> np.ndarray:
    """``exp`` of the entropy of the normalised singular values (last axis): 1 for rank one, D for a flat spectrum."""
    s = np.asarray(singular_values, dtype=float)
    p = s / s.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=-1)
    return np.exp(ent)
