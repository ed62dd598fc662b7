"""Trained points (chapter 10): the attention layers of a trained run audited at their trained weights, on the
inputs they really see (the residual stream entering the layer, through its LayerNorm, on validation text).

The closed forms count the unidentified directions at *generic* parameters. A trained layer can sit at a
special point (a head whose query map lost rank, :func:`attnid.counting.collapsed_query_dims`), which adds
directions, or near one, which leaves identified directions numerically weak. :func:`audit_point` measures
both: the Jacobian's rank against the generic count, and the weakest identified direction relative to the
strongest (``σ_kept / σ_max``).

The generic count of a layer behind a LayerNorm is the layer's own (:func:`attnid.counting.count`) plus one
direction per biased query/key/value row (:func:`attnid.counting.biased_reader_rows`): the normalised inputs
lie on a hyperplane, and a reader's weights can move across it while its bias takes back the constant.

:func:`gpt_layer_invariants` and :func:`model_distances` compare trained layers modulo their symmetries
(:mod:`attnid.invariants`), with the block's LayerNorm folded in.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from ..attention import AttentionConfig, AttentionParams, flatten, from_fused
from ..audit import RTOL, _audit_data_size, _certify, _layer_fn, jacobian_rank
from ..certify import CertificateError
from ..counting import biased_reader_rows, count
from ..invariants import Invariants, fold_layernorm, invariant_distance, layer_invariants
from ..symmetry import tangent_basis
from .data import CharData
from .gpt import GPT, Block, CausalSelfAttention

DENSE_MAX_PARAMS = 3000  # above this a trained point is certified (the dense Jacobian grows as n²)
GENERIC_KEYS = ("layer", "params", "rank", "unidentified", "generic", "at_generic", "gap", "weakest", "method")


def layer_inputs(model: GPT, tokens: torch.Tensor, layer: int) -> torch.Tensor:
    """``(B, L, E)``: what attention layer ``layer`` of ``model`` reads for ``tokens`` ``(B, L)``: the residual
    stream entering block ``layer`` through the block's first LayerNorm (eval mode: no dropout)."""
    n = len(model.blocks)
    if not (isinstance(layer, int) and 0 <= layer < n):
        raise ValueError(f"layer must be an integer from 0 to {n - 1}, got {layer!r}")
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            pos = torch.arange(tokens.shape[1], device=tokens.device)
            x = model.wte(tokens) + model.wpe(pos)
            for b in list(model.blocks)[:layer]:
                x = b(x)
            return _block(model, layer).ln_1(x)
    finally:
        model.train(was)


def _block(model: GPT, layer: int) -> Block:
    b = model.blocks[layer]
    assert isinstance(b, Block)
    return b


def layer_params(attn: CausalSelfAttention) -> tuple[AttentionConfig, AttentionParams]:
    """The column-form config (causal) and float64 parameters of a trained attention layer."""
    w = attn.c_attn
    cfg, p = from_fused(w.weight, w.bias, attn.c_proj.weight, attn.c_proj.bias, attn.n_head, causal=True)
    return cfg, {k: v.to(torch.float64) for k, v in p.items()}


def hyperplane_directions(cfg: AttentionConfig, p: AttentionParams, ln: nn.LayerNorm) -> torch.Tensor:
    """``(n_params, k)``: the directions a LayerNorm's hyperplane adds (:func:`attnid.counting.biased_reader_rows`
    of them): row ``r`` of a biased query, key or value map moves by ``w = 1/γ`` and its bias by ``−w·β``, so
    that ``W x + b`` is unchanged for every ``x`` with ``Σ (x_i − β_i)/γ_i = 0``."""
    w = 1.0 / ln.weight.detach().to(torch.float64)
    beta = torch.zeros_like(w) if ln.bias is None else ln.bias.detach().to(torch.float64)
    c = float(w @ beta)
    cols = []
    for W, b in (("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V")):
        if b not in p:
            continue
        heads, rows = p[W].shape[:2]
        for h in range(heads):
            for r in range(rows):
                d = {k: torch.zeros_like(v) for k, v in p.items()}
                d[W][h, r] = w
                d[b][h, r] = -c
                cols.append(flatten(d))
    return torch.stack(cols, dim=1) if cols else torch.zeros(flatten(p).numel(), 0, dtype=torch.float64)


def generic_count(cfg: AttentionConfig) -> int:
    """Unidentified directions of an attention layer behind a LayerNorm at generic parameters."""
    return count(cfg).unidentified + biased_reader_rows(cfg)


def audit_point(model: GPT, tokens: torch.Tensor, layer: int, *, method: str = "auto", rtol: float = RTOL) -> dict:
    """Audit attention layer ``layer`` of ``model`` at its weights on ``tokens`` ``(B, L)`` (see the module
    docstring): ``layer``, ``params``, ``rank``, ``unidentified``, ``generic`` (the count at generic weights),
    ``at_generic`` (equal), ``gap`` (smallest kept over largest dropped singular value), ``weakest``
    (``σ_kept / σ_max``), ``method`` (``dense`` or ``certify``; ``certify`` raises nothing at a special point:
    it reports ``at_generic = False`` with the certificate's reason in ``note``)."""
    attn = _block(model, layer).attn
    cfg, p = layer_params(attn)
    n = flatten(p).numel()
    if method == "auto":
        method = "dense" if n <= DENSE_MAX_PARAMS else "certify"
    if method not in ("dense", "certify"):
        raise ValueError(f"method must be 'auto', 'dense' or 'certify', got {method!r}")
    X = layer_inputs(model, tokens, layer).to(torch.float64).transpose(1, 2)  # (B, E, L), the audit's layout
    _audit_data_size(cfg, n, method, batch=X.shape[0], seq_len=X.shape[2], ratio=None)  # refuses too little data
    generic = generic_count(cfg)
    out: dict = {"layer": layer, "params": n, "generic": generic, "method": method, "note": ""}
    t0 = time.perf_counter()
    if method == "dense":
        r = jacobian_rank(_layer_fn(cfg, p, X), flatten(p), rtol=rtol)
        sv = r.singular_values or [1.0]
        out.update(rank=r.rank, gap=r.sv_gap, weakest=sv[r.rank - 1] / sv[0])
    else:
        known = torch.cat(
            [*tangent_basis(p, cfg).values(), hyperplane_directions(cfg, p, _block(model, layer).ln_1)], 1
        )
        try:
            r = _certify(cfg, p, X, rtol=rtol, directions=known)
            out.update(rank=r.rank, gap=r.sv_gap, weakest=r.details["sigma_kept"] / r.details["sigma_max"])
        except CertificateError as e:  # a special point: the known directions are not the whole null space
            out.update(rank=None, gap=None, weakest=None, note=f"not certified: {e}")
    out["unidentified"] = None if out["rank"] is None else n - out["rank"]
    out["at_generic"] = out["unidentified"] == generic
    out["seconds"] = time.perf_counter() - t0
    return out


def validation_tokens(data: CharData, model: GPT, n_params: int, *, seed: int = 0) -> torch.Tensor:
    """``(B, L)`` windows of the validation text at the model's context ``L``, ``B`` as many as a certified
    audit of ``n_params`` parameters needs (:func:`attnid.audit.default_data_size`, ratio 1.5), at least 2."""
    cfg = model.cfg.attention_config()
    L = model.cfg.block_size
    B, _ = _audit_data_size(cfg, n_params, "certify", batch=None, seq_len=L, ratio=None)
    x, _ = data.batch("val", B, L, torch.Generator().manual_seed(20_000 + seed))
    return x


def audit_run(
    d: str | Path,
    data: CharData,
    *,
    layers: list[int] | None = None,
    seed: int = 0,
    method: str = "auto",
    progress: bool = False,
) -> list[dict]:
    """:func:`audit_point` of every attention layer (or ``layers``) of the trained run in folder ``d``
    (``model.pt``: a run trained with ``save_model``), on validation windows drawn with ``seed``; ``method`` as
    :func:`audit_point`'s."""
    from tqdm.auto import tqdm

    from .train import load_model

    model = load_model(Path(d)).to(torch.float64)
    n_layer = len(model.blocks)
    chosen = list(range(n_layer)) if layers is None else layers
    bad = [k for k in chosen if not (isinstance(k, int) and not isinstance(k, bool) and 0 <= k < n_layer)]
    if bad or not chosen:
        raise ValueError(f"layer must be an integer from 0 to {n_layer - 1}, got {bad or chosen}")
    n = flatten(layer_params(_block(model, 0).attn)[1]).numel()
    tokens = validation_tokens(data, model, n, seed=seed)
    return [audit_point(model, tokens, k, method=method) for k in tqdm(chosen, desc="layers", disable=not progress)]


def gpt_layer_invariants(model: GPT, layer: int) -> Invariants:
    """The invariants (:func:`attnid.invariants.layer_invariants`) of attention layer ``layer`` of ``model``, with
    its block's first LayerNorm folded in (:func:`attnid.invariants.fold_layernorm`)."""
    block = _block(model, layer)
    with torch.no_grad():
        cfg, p = layer_params(block.attn)
        return layer_invariants(*fold_layernorm(cfg, p, block.ln_1.weight, block.ln_1.bias))


def model_distances(a: GPT, b: GPT, *, relative: bool = True) -> list[float]:
    """The distance modulo symmetry (:func:`attnid.invariants.invariant_distance`) of every attention layer of two
    GPTs of one shape, layer by layer."""
    if len(a.blocks) != len(b.blocks):
        raise ValueError(f"models of different depth: {len(a.blocks)} vs {len(b.blocks)} layers")
    return [
        invariant_distance(gpt_layer_invariants(a, k), gpt_layer_invariants(b, k), relative=relative)
        for k in range(len(a.blocks))
    ]
