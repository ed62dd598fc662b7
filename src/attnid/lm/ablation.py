"""Chapter 7: head importance by ablation, pruning curves, per-head summaries.

A head is masked by zeroing its output before the output projection (``c_proj``), i.e. removing
its term ``W_O^h V_h P_h`` from the sum of Eq. (layer); the output bias stays.
"""

from __future__ import annotations

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


def head_importance(model: GPT, batches) -> tuple[float, np.ndarray]:
    """Baseline loss and, per ``(layer, head)``, the loss increase when that head alone is masked."""
    L, H = model.cfg.n_layer, model.cfg.n_head
    base = masked_loss(model, batches)
    imp = np.zeros((L, H))
    for layer in range(L):
        for h in range(H):
            mask = np.ones((L, H))
            mask[layer, h] = 0
            imp[layer, h] = masked_loss(model, batches, mask) - base
    return base, imp


def pruning_curve(model: GPT, batches, importance: np.ndarray) -> list[dict]:
    """Mask heads cumulatively in increasing order of importance; loss after each removal."""
    L, H = importance.shape
    order = np.argsort(importance, axis=None, kind="stable")
    mask = np.ones((L, H))
    curve: list[dict] = [{"pruned": 0, "fraction": 0.0, "loss": masked_loss(model, batches), "head": None}]
    for k, flat in enumerate(order, start=1):
        layer, h = divmod(int(flat), H)
        mask[layer, h] = 0
        curve.append(
            {"pruned": k, "fraction": k / (L * H), "loss": masked_loss(model, batches, mask), "head": [layer, h]}
        )
    return curve


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
    baseline, importance = head_importance(model, batches)
    curve = pruning_curve(model, batches, importance)
    out = {
        "baseline": baseline,
        "importance": importance.tolist(),
        "pruning_curve": curve,
        "prunable": {f"{tol:g}": max_prunable_fraction(curve, tol) for tol in PRUNE_TOLERANCES},
        "n_batches": len(batches),
    }
    if qk_singular_values is not None:
        out["effective_rank"] = effective_rank(qk_singular_values).tolist()
    return out


def effective_rank(singular_values) -> np.ndarray:
    """``exp`` of the entropy of the normalised singular values (last axis): 1 for rank one, D for a flat spectrum."""
    s = np.asarray(singular_values, dtype=float)
    p = s / s.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=-1)
    return np.exp(ent)
