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
(:mod:`attnid.invariants`), with the block's LayerNorm folded in; :func:`orbit_distance` measures, in the
weights' own units, how far one layer is from the symmetry orbit of another, and :func:`snapshot_distances`
follows a run's layers from initialisation with both. :func:`symmetry_moves` and :func:`identified_moves` move
a whole GPT along each symmetry, and along directions that change its function.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

from ..attention import AttentionConfig, AttentionParams, flatten, from_fused, unflatten
from ..audit import RTOL, _audit_data_size, _certify, _layer_fn, jacobian_rank
from ..certify import CertificateError
from ..counting import biased_reader_rows, count
from ..inputs import check_layers
from ..invariants import Invariants, fold_layernorm, invariant_distance, layer_invariants
from ..symmetry import tangent_basis
from . import records
from .data import CharData
from .gpt import GPT, Block, CausalSelfAttention, GPTConfig

DENSE_MAX_PARAMS = 3000  # above this a trained point is certified (the dense Jacobian grows as n²)
GENERIC_KEYS = (
    "layer", "params", "rank", "unidentified", "generic", "at_generic", "gap", "weakest", "method", "tokens",
)  # fmt: skip


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
    """Audit attention layer ``layer`` (numbered from 1) of ``model`` at its weights on ``tokens`` ``(B, L)`` (see the
    module docstring): ``layer``, ``params``, ``rank``, ``unidentified``, ``generic`` (the count at generic weights),
    ``at_generic`` (equal), ``gap`` (smallest kept over largest dropped singular value), ``weakest``
    (``σ_kept / σ_max``; with ``certify`` its lower bound, :func:`attnid.certify.per_group_certificate`),
    ``method`` (``dense`` or ``certify``), ``tokens`` (the data it read: the weakest direction depends on it).
    ``certify`` raises nothing where it cannot
    certify the count (a special point, or identified directions weaker than its bound can tell from null ones):
    ``rank``, ``unidentified`` and ``at_generic`` are then ``None`` (undecided), ``weakest`` the certificate's
    lower bound, and ``note`` its reason."""
    (index,) = (k - 1 for k in check_layers([layer], len(model.blocks)))
    attn = _block(model, index).attn
    cfg, p = layer_params(attn)
    n = flatten(p).numel()
    if method == "auto":
        method = "dense" if n <= DENSE_MAX_PARAMS else "certify"
    if method not in ("dense", "certify"):
        raise ValueError(f"method must be 'auto', 'dense' or 'certify', got {method!r}")
    X = layer_inputs(model, tokens, index).to(torch.float64).transpose(1, 2)  # (B, E, L), the audit's layout
    _audit_data_size(cfg, n, method, batch=X.shape[0], seq_len=X.shape[2], ratio=None)  # refuses too little data
    generic = generic_count(cfg)
    # the weakest identified direction grows with the data the audit reads: the row says how much it read
    out: dict = {"layer": layer, "params": n, "generic": generic, "method": method, "note": "",
                 "tokens": X.shape[0] * X.shape[2]}  # fmt: skip
    t0 = time.perf_counter()
    if method == "dense":
        r = jacobian_rank(_layer_fn(cfg, p, X), flatten(p), rtol=rtol)
        sv = r.singular_values or [1.0]
        out.update(rank=r.rank, gap=r.sv_gap, weakest=sv[r.rank - 1] / sv[0])
    else:
        known = torch.cat(
            [*tangent_basis(p, cfg).values(), hyperplane_directions(cfg, p, _block(model, index).ln_1)], 1
        )
        try:
            r = _certify(cfg, p, X, rtol=rtol, directions=known)
            out.update(rank=r.rank, gap=r.sv_gap, weakest=r.details["sigma_kept"] / r.details["sigma_max"])
        except CertificateError as e:  # a special point, or one too close to it for the certificate's bound
            out.update(rank=None, gap=None, weakest=e.kept_ratio, note=f"not certified: {e}")
    out["unidentified"] = None if out["rank"] is None else n - out["rank"]
    out["at_generic"] = None if out["rank"] is None else out["unidentified"] == generic
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


POINTS_FILE = "points.json"  # a run folder's cached trained-point audits (keyed by model.pt's digest)
# in the cache keys: rows of an earlier certificate or orbit fit are not reused (v2: per-group factors, 20 pairs of
# L-BFGS history; v3: layers numbered from 1; v4: the group's query/key block factored through its Gram, whose
# estimates of the weakest direction move in the fourth digit)
AUDIT_VERSION = "v4"
FIT_VERSION = "v3"


def audit_run(
    d: str | Path,
    data: CharData,
    *,
    layers: list[int] | None = None,
    seed: int = 0,
    method: str = "auto",
    progress: bool = False,
    cache: bool = False,
) -> list[dict]:
    """:func:`audit_point` of every attention layer (or ``layers``) of the trained run in folder ``d``
    (``model.pt``: a run trained with ``save_model``), on validation windows drawn with ``seed``; ``method`` as
    :func:`audit_point`'s. ``cache``: reuse and extend the audits kept in the folder's ``points.json`` for this
    ``model.pt`` (its sha256), ``seed`` and ``method`` (a certified audit of a cpu-profile layer takes 15 s
    on 2 cores)."""
    from tqdm import tqdm  # not tqdm.auto: in a notebook without ipywidgets it warns on import

    from ..audit import check_seed
    from .model_files import model_from_file, read_model_file

    check_seed(seed)
    d = Path(d)
    contents, digest = read_model_file(d)  # the key names the bytes audited: model.pt is read once
    model = model_from_file(contents, d / "model.pt").to(torch.float64)
    n_layer = len(model.blocks)
    chosen = check_layers(layers, n_layer)
    key = f"{digest}/seed {seed}/{method}/{AUDIT_VERSION}"
    kept = _read_points(d).get(key, {}) if cache else {}
    todo = [k for k in chosen if str(k) not in kept]
    if todo:
        n = flatten(layer_params(_block(model, 0).attn)[1]).numel()
        tokens = validation_tokens(data, model, n, seed=seed)
        for k in tqdm(todo, desc="layers", disable=not progress):
            kept[str(k)] = audit_point(model, tokens, k, method=method)
            if cache:  # after every layer: an interrupted audit keeps what it finished
                _keep_points(d, key, kept)
    return [kept[str(k)] for k in chosen]


def _points_seal(key: str, rows: dict) -> str:
    """The seal of one cache entry: the sha256 of its key and rows (canonical JSON). A hand edit of a kept audit
    (its count, its verdict) breaks it, and the entry is recomputed instead of read."""
    import hashlib

    text = json.dumps({"key": key, "rows": rows}, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


_CACHE_NOTED: set[Path] = set()


def _keep_points(d: Path, key: str, entry: dict) -> None:
    """Merge ``entry`` (rows by layer, or by step and layer) under ``key`` into the folder's ``points.json``, sealed,
    holding the folder's cache lock: two audits of one run (two layers) each keep their rows. A folder that cannot
    be written (a read-only copy of the records) keeps nothing, and says so once."""
    from filelock import FileLock

    try:
        with FileLock(str(d / f".{POINTS_FILE}.lock")):
            kept = _read_points(d)
            rows = {**kept.get(key, {}), **entry}
            others = {k: {"seal": _points_seal(k, v), "rows": v} for k, v in kept.items() if k != key}
            body = {**others, key: {"seal": _points_seal(key, rows), "rows": rows}}
            records.atomic_write(d / POINTS_FILE, json.dumps(body, indent=1).encode())
    except OSError as e:
        if d not in _CACHE_NOTED:
            _CACHE_NOTED.add(d)
            print(f"attnid: note: cannot keep audits in {d / POINTS_FILE} ({e.strerror or e}); they are recomputed "
                  "next time", file=sys.stderr)  # fmt: skip


def _read_points(d: Path) -> dict:
    """The sealed entries of the folder's ``points.json`` (key -> rows); an entry whose seal does not match, a
    damaged file or anything but a regular file (a FIFO would block the read) reads as nothing: recomputed."""
    f = d / POINTS_FILE
    if not f.is_file():
        return {}
    try:
        raw = json.loads(f.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {
        k: v["rows"]
        for k, v in raw.items()
        if isinstance(v, dict) and isinstance(v.get("rows"), dict) and v.get("seal") == _points_seal(k, v["rows"])
    }


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


def model_from_snapshot(cfg: GPTConfig, weights: dict[str, torch.Tensor]) -> GPT:
    """A float64 :class:`GPT` carrying a snapshot's attention layers and norms (:attr:`attnid.lm.train.Run.snapshots`);
    its other weights are those of a fresh model, which no attention invariant reads."""
    model = GPT(cfg).double()
    missing = [k for k in weights if k not in model.state_dict()]
    if missing:
        raise ValueError(f"snapshot: {missing[:3]} are not weights of this model")
    model.load_state_dict({k: v.double() for k, v in weights.items()}, strict=False)
    return model


def raw_distance(a: GPT, b: GPT, layer: int) -> float:
    """``‖θ_a − θ_b‖ / max(‖θ_a‖, ‖θ_b‖)`` over attention layer ``layer`` and its LayerNorm: the weights' own
    distance, symmetry moves included."""
    va, vb = (torch.cat([p.detach().reshape(-1).double() for p in _layer_weights(m, layer)]) for m in (a, b))
    return float((va - vb).norm() / max(va.norm(), vb.norm()))


def _layer_weights(model: GPT, layer: int) -> list[torch.Tensor]:
    block = _block(model, layer)
    return [*block.attn.parameters(), *block.ln_1.parameters()]


def snapshot_distances(d: str | Path, *, points: int | None = None, cache: bool = False) -> list[dict]:
    """Over training, from the snapshots of the run in folder ``d``: per snapshot step and layer, the weights'
    distance from initialisation and the distance from initialisation to the step's symmetry orbit
    (:func:`orbit_distance`), and whether the two layers are the same function (the relative distance of their
    invariants, :func:`model_distances`). ``points``: at most this many steps after step 0, evenly spaced, the
    last included (every step: ``None``). ``cache``: reuse and extend the rows kept in the folder's
    ``points.json`` for this ``model.pt`` (an orbit fit takes seconds). Rows ``{"step", "layer", "raw", "orbit",
    "invariant"}``."""
    from .model_files import load_snapshots

    d = Path(d)
    cfg, snaps, digest = load_snapshots(d)  # the key names the bytes read: model.pt is read once
    key = f"{digest}/motion/{FIT_VERSION}"
    kept = _read_points(d).get(key, {}) if cache else {}
    steps = sorted(snaps)
    if points is not None:
        if not (isinstance(points, int) and points > 0):
            raise ValueError(f"points must be a positive integer or None, got {points!r}")
        later, n = steps[1:], min(points, len(steps) - 1)
        steps = [steps[0], *sorted({later[round((i + 1) * len(later) / n) - 1] for i in range(n)})]
    init = model_from_snapshot(cfg, snaps[steps[0]])
    rows = []
    for step in steps:
        if all(f"{step}/{k}" in kept for k in range(cfg.n_layer)):
            rows += [kept[f"{step}/{k}"] for k in range(cfg.n_layer)]
            continue
        m = model_from_snapshot(cfg, snaps[step])
        invariant = model_distances(init, m)
        for k in range(len(m.blocks)):
            raw, orbit = orbit_distance(init, m, k) if step != steps[0] else (0.0, 0.0)
            rows.append({"step": step, "layer": k + 1, "raw": raw, "orbit": orbit, "invariant": invariant[k]})
            kept[f"{step}/{k}"] = rows[-1]
        if cache:
            _keep_points(d, key, kept)
    return rows


# ------------------------------------------------------------------------------ moves of a whole GPT
def _copy(model: GPT) -> GPT:
    twin = GPT(model.cfg).to(next(model.parameters()).dtype)
    twin.load_state_dict(model.state_dict())
    return twin.eval()


def symmetry_moves(model: GPT, *, seed: int = 0) -> dict[str, GPT]:
    """Copies of ``model`` moved along the symmetries of its attention layers (chapters 2–4 and 10), each
    leaving its outputs unchanged: ``"rebalancing"`` (every head, :func:`attnid.lm.train.rebalance_model`),
    ``"value–output map"`` (an invertible ``S`` per head of the first layer: ``W_V -> S W_V``, ``W_O -> W_O S⁻¹``),
    ``"norm-weight trade"`` (the first layer's LayerNorm scaled by ``d``, the maps that read it by ``1/d``),
    ``"LayerNorm hyperplane"`` (the last layer's biased reader rows moved across the norm's hyperplane,
    :func:`hyperplane_directions`; with biases) and ``"head permutation"`` (the first layer's first two heads swapped;
    with two heads or more)."""
    from .train import rebalance_model

    g = torch.Generator().manual_seed(seed)
    moves = {
        "rebalancing": rebalance_model,
        "value–output map": lambda m: _move_value_output(m, g),
        "norm-weight trade": lambda m: _trade_norm_weight(m, g),
    }
    if model.cfg.bias:
        moves["LayerNorm hyperplane"] = _cross_hyperplane
    if model.cfg.n_head > 1:
        moves["head permutation"] = _swap_heads
    out = {}
    for name, move in moves.items():
        m = _copy(model)
        with torch.no_grad():
            move(m)
        out[name] = m
    return out


def _move_value_output(m: GPT, g: torch.Generator) -> None:
    attn = _block(m, 0).attn
    E, H, D = m.cfg.n_embd, m.cfg.n_head, attn.head_dim
    dtype = attn.c_attn.weight.dtype
    for h in range(H):
        S = (torch.randn(D, D, generator=g, dtype=torch.float64) / D**0.5 + 2 * torch.eye(D)).to(dtype)
        rows, cols = slice(2 * E + h * D, 2 * E + (h + 1) * D), slice(h * D, (h + 1) * D)
        attn.c_attn.weight[rows] = S @ attn.c_attn.weight[rows]
        if attn.c_attn.bias is not None:
            attn.c_attn.bias[rows] = S @ attn.c_attn.bias[rows]
        attn.c_proj.weight[:, cols] = attn.c_proj.weight[:, cols] @ torch.linalg.inv(S)


def _trade_norm_weight(m: GPT, g: torch.Generator) -> None:
    block = _block(m, 0)
    d = (torch.rand(m.cfg.n_embd, generator=g, dtype=torch.float64) + 0.5).to(block.ln_1.weight.dtype)
    block.ln_1.weight.mul_(d)
    if block.ln_1.bias is not None:
        block.ln_1.bias.mul_(d)
    block.attn.c_attn.weight.div_(d)


def _cross_hyperplane(m: GPT) -> None:
    last = _block(m, len(m.blocks) - 1)
    cfg, p = layer_params(last.attn)
    q = unflatten(flatten(p) + 0.5 * hyperplane_directions(cfg, p, last.ln_1).sum(1), p)
    last.attn.c_attn.weight.copy_(torch.cat([q[k].reshape(-1, cfg.E) for k in ("W_Q", "W_K", "W_V")]))
    last.attn.c_attn.bias.copy_(torch.cat([q[k].reshape(-1) for k in ("b_Q", "b_K", "b_V")]))


def _swap_heads(m: GPT) -> None:
    attn = _block(m, 0).attn
    H, D = attn.n_head, attn.head_dim
    order = torch.arange(H)
    order[[0, 1]] = order[[1, 0]]
    rows = torch.arange(3 * H * D).reshape(3, H, D)[:, order].reshape(-1)
    attn.c_attn.weight.copy_(attn.c_attn.weight[rows])
    if attn.c_attn.bias is not None:
        attn.c_attn.bias.copy_(attn.c_attn.bias[rows])
    attn.c_proj.weight.copy_(attn.c_proj.weight[:, torch.arange(H * D).reshape(H, D)[order].reshape(-1)])


def identified_moves(model: GPT, *, size: float = 1e-2, seed: int = 0) -> dict[str, GPT]:
    """Copies of ``model`` moved by a relative ``size`` along directions that change its function: ``"output
    map"`` (the first layer's ``c_proj`` scaled by ``1 + size``) and ``"random direction"`` (every attention weight
    of the first layer plus ``size`` times Gaussian noise of its own scale)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    m = _copy(model)
    with torch.no_grad():
        _block(m, 0).attn.c_proj.weight.mul_(1 + size)
    out["output map"] = m
    m = _copy(model)
    with torch.no_grad():
        for p in _block(m, 0).attn.parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            p.add_(size * p.detach().abs().mean() * noise)
    out["random direction"] = m
    return out


# ------------------------------------------------------------------------------ distance to a symmetry orbit
def orbit_distance(a: GPT, b: GPT, layer: int, *, max_iter: int = 400) -> tuple[float, float]:
    """``(raw, orbit)``: the distance ``‖θ_b − θ_a‖`` between attention layer ``layer`` of two GPTs (its weights
    and its LayerNorm's), and the distance from ``θ_a`` to the nearest point of ``θ_b``'s symmetry orbit,
    ``min_g ‖g·θ_b − θ_a‖``, fitted over the symmetries of :func:`symmetry_moves` (the heads matched first, then
    per head an invertible query–key map ``S`` and value–output map ``T``, the key-bias shift, the value bias moved
    into the output bias, the LayerNorm's scale traded with the maps that read it, and every biased reader row
    moved across the norm's hyperplane) by L-BFGS in float64, from ``b``'s norm scale traded to ``a``'s and the
    least-squares ``S`` and ``T`` that then map ``b``'s augmented query and value maps onto ``a``'s.
    ``orbit / raw``: the share of the distance that no symmetry can undo (an upper bound: a local fit)."""
    from ..invariants import head_matching

    p0, ln0 = _orbit_point(a, layer)
    p1, ln1 = _orbit_point(b, layer)
    target = torch.cat([flatten(p0), *ln0])
    raw = float((torch.cat([flatten(p1), *ln1]) - target).norm())  # before the heads are matched
    perm = head_matching(gpt_layer_invariants(a, layer), gpt_layer_invariants(b, layer))
    p1 = {k: v if k == "b_O" else v[perm] for k, v in p1.items()}  # every other tensor is per head (G = H)
    H, D, E = p1["W_Q"].shape

    # the start: the LayerNorm's scale traded to a's (d = γ_a / γ_b where the signs agree), then the least-squares
    # S and T with S b ≈ a on the augmented columns that the norm's hyperplane leaves (a biased reader row moves
    # along u = [1/γ; −β·(1/γ)], so the columns are compared modulo u)
    ratio = ln0[0] / ln1[0]
    zeros = {"c": torch.zeros(H, D, dtype=torch.float64), "delta": torch.zeros(H, D, dtype=torch.float64),
             "alpha": torch.zeros(3, H, D, dtype=torch.float64)}  # fmt: skip
    eye = torch.eye(D, dtype=torch.float64).expand(H, D, D).clone()
    logd = torch.where(ratio > 0, ratio.abs().log(), torch.zeros_like(ratio))
    traded, ln_t = _act(p1, ln1, {"S": eye, "T": eye, "logd": logd, **zeros})
    u = torch.cat([1.0 / ln_t[0], -(ln_t[1] / ln_t[0]).sum()[None]])
    off_u = torch.eye(E + 1, dtype=torch.float64) - torch.outer(u, u) / (u @ u)

    def start(k: str) -> torch.Tensor:
        a0, a1 = (torch.cat([p[f"W_{k}"], p[f"b_{k}"][..., None]], -1) @ off_u for p in (p0, traded))
        return a0 @ torch.linalg.pinv(a1)

    vars_ = {"S": start("Q"), "T": start("V"), "logd": logd, **zeros}
    for v in vars_.values():
        v.requires_grad_(True)
    # 20 pairs of history, not torch's 100: its two-loop recursion, thousands of tiny products per iteration, was
    # two thirds of the fit's time. Measured on chapter 6's cpu AdamW run (10 fits): 1.1 s a fit against 1.5 s, and
    # 3-4 times nearer the optimum (1e-5 of the distance against 1e-4; 1,500 iterations as the reference)
    opt = torch.optim.LBFGS(list(vars_.values()), max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-14, tolerance_change=1e-16)  # fmt: skip

    def loss() -> torch.Tensor:
        opt.zero_grad()
        p, ln = _act(p1, ln1, vars_)
        out = (torch.cat([flatten(p), *ln]) - target).pow(2).sum()
        out.backward()
        return out

    opt.step(loss)
    with torch.no_grad():
        p, ln = _act(p1, ln1, vars_)
        orbit = float((torch.cat([flatten(p), *ln]) - target).norm())
    return raw, min(orbit, raw)


def _orbit_point(model: GPT, layer: int) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    block = _block(model, layer)
    with torch.no_grad():
        _, p = layer_params(block.attn)
        ln = [block.ln_1.weight.detach().double().clone()]
        ln.append(torch.zeros_like(ln[0]) if block.ln_1.bias is None else block.ln_1.bias.detach().double().clone())
    if "b_Q" not in p:
        raise ValueError("orbit_distance: needs a layer with biases (the GPT of this book has them)")
    return {k: v.detach().clone() for k, v in p.items()}, ln


def _act(p: dict, ln: list, v: dict) -> tuple[dict, list]:
    """The symmetry element ``v`` applied to layer ``p`` and its LayerNorm ``ln`` (``[γ, β]``)."""
    d = v["logd"].exp()
    g, beta = ln[0] * d, ln[1] * d
    w = 1.0 / g
    out = {}
    for i, (W, b) in enumerate((("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V"))):
        Wd = p[W] / d + v["alpha"][i][..., None] * w  # the scale trade, then across the hyperplane
        out[W], out[b] = Wd, p[b] - v["alpha"][i] * (w @ beta)
    Q = v["S"] @ torch.cat([out["W_Q"], out["b_Q"][..., None]], -1)
    K = torch.linalg.solve(v["S"].transpose(-1, -2), torch.cat([out["W_K"], out["b_K"][..., None]], -1))
    E = p["W_Q"].shape[-1]
    out["W_Q"], out["b_Q"], out["W_K"] = Q[..., :E], Q[..., E], K[..., :E]
    out["b_K"] = K[..., E] + v["c"]
    out["W_V"] = v["T"] @ out["W_V"]
    b_V = (v["T"] @ out["b_V"][..., None])[..., 0]
    out["W_O"] = torch.linalg.solve(v["T"].transpose(-1, -2), p["W_O"].transpose(-1, -2)).transpose(-1, -2)
    out["b_V"] = b_V + v["delta"]
    out["b_O"] = p["b_O"] - torch.einsum("hec,hc->e", out["W_O"], v["delta"])
    return out, [g, beta]
