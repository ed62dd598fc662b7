"""Numerical identification audit: unidentified dims = #params − rank of the Jacobian of the
outputs with respect to all parameters, at a random point, in float64 (chapters 2–4 compare it with every closed form).

Two exact methods:

* ``dense``: build the Jacobian (forward mode), QR, singular values; rank = #{σ > rtol σ_max}.
  Works on any ``nn.Module`` (:func:`audit_module`). Cost ~ n³ in the parameter count n.
* ``certify`` (our layer): the output is linear in ``(W_O, b_O)`` with the same block for every
  output coordinate, so that block is projected out exactly; on the remaining parameters φ the
  null space is certified to equal the span of the known symmetry directions
  (:func:`attnid.symmetry.tangent_basis`): ``J t ≈ 0`` for every known direction, and the
  Jacobian restricted to a complement (the known directions' LU pivots pinned) has full rank.
  ``rank = E·rank(Z) + n_φ − k``. When ``W_O`` is injective (``H C <= E``) that full rank is
  checked one key/value group at a time, on the group's exact Jacobian (a QR each: G small
  problems instead of one large one); otherwise on one Gaussian sketch of the whole.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from .attention import (
    PARAM_ORDER,
    AttentionConfig,
    AttentionParams,
    attention,
    flatten,
    init_params,
    unflatten,
)
from .certify import (  # noqa: F401 (CertificateError and the singular-value helpers are part of this API)
    POWER_RTOL,
    CertificateError,
    certify,
    smallest_singular_value,
    splits_by_group,
    top_singular_value,
)
from .counting import total_params

RTOL = 1e-9
METHODS = ("auto", "dense", "certify")


@dataclass
class AuditResult:
    total_params: int
    rank: int
    unidentified: int
    sv_gap: float  # smallest kept / largest dropped singular value
    tol: float
    method: str
    seconds: float
    n_outputs: int
    singular_values: list[float] | None = field(repr=False)  # the spectrum (dense); None for certify
    details: dict = field(default_factory=dict)  # certify: sigma_max, sigma_kept, null_residual_max, ...

    def as_dict(self, with_singular_values: bool = False) -> dict:
        d = asdict(self)
        if not with_singular_values:
            d.pop("singular_values")
        return d


SEED_MAX = 2**63 - 1  # torch generators take seeds up to here


def check_seed(seed) -> None:
    """A seed is an integer in ``[0, 2⁶³ − 1]``; anything else raises ``ValueError`` naming it."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= SEED_MAX:
        raise ValueError(f"seed must be an integer from 0 to 2**63 - 1, got {seed!r}")


def check_seq_len(seq_len) -> None:
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 2:
        raise ValueError(
            f"seq_len must be an integer of at least 2 (L = 1 makes the softmax constant), got {seq_len!r}"
        )


def default_seq_len(cfg: AttentionConfig) -> int:
    """The audit's sequence length: 8 tokens, or ``max(16, 2D)`` with RoPE (its minimum there: shorter
    sequences barely turn the slow frequencies, whose rotations then look like the identity)."""
    return max(16, 2 * cfg.D) if cfg.rope else 8


def default_data_size(
    cfg: AttentionConfig, n_params: int, *, ratio: float = 3.0, seq_len: int | None = None
) -> tuple[int, int]:
    """``(batch, seq_len)`` so that the informative outputs exceed ``ratio`` x #params.

    Each token carries at most ``min(E, H C)`` independent outputs (too few outputs fake unidentified directions);
    RoPE needs longer sequences for its slow frequencies to show.
    """
    rope_min = default_seq_len(cfg) if cfg.rope else 2
    if seq_len is not None:
        check_seq_len(seq_len)
    if seq_len is not None and seq_len < rope_min:
        raise ValueError(
            f"seq_len: {seq_len} tokens are too few for RoPE's slow frequencies to show (their rotations would look "
            f"like the identity and fake unidentified directions); use seq_len >= {rope_min} or leave it unset"
        )
    L = seq_len or default_seq_len(cfg)
    per_token = min(cfg.E, cfg.H * cfg.C)
    B = max(2, math.ceil(ratio * n_params / (per_token * L)))
    return B, L


def random_inputs(cfg: AttentionConfig, batch: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randn(batch, cfg.E, seq_len, generator=g, dtype=torch.float64)


def _gap(sv: np.ndarray, rank: int) -> float:
    eps_floor = sv[0] * np.finfo(np.float64).eps * len(sv)
    dropped = sv[rank] if rank < len(sv) else eps_floor
    kept = sv[rank - 1] if rank > 0 else sv[0]
    return float(kept / max(dropped, eps_floor))


def tolerance_window(singular_values, rank: int) -> tuple[float, float]:
    """The relative tolerances ``t`` that give ``rank`` (a singular value ``σ ≤ t·σ_max`` counted as null):
    ``lo ≤ t < hi`` with ``lo = σ_rank / σ_max`` (0 when fewer singular values than ``rank + 1``) and
    ``hi = σ_{rank−1} / σ_max`` (singular values descending, 0-based). ``hi / lo`` is the gap."""
    sv = np.asarray(singular_values, float)
    if not 0 < rank <= len(sv):
        raise ValueError(f"rank must be between 1 and {len(sv)}, got {rank}")
    lo = float(sv[rank] / sv[0]) if rank < len(sv) else 0.0
    return lo, float(sv[rank - 1] / sv[0])


RTOL_RANGE = (1e-13, 1e-5)  # a float64 rank cut between round-off (~1e-15) and real small singular values


def check_rtol(rtol: float) -> None:
    """Refuse a rank tolerance outside :data:`RTOL_RANGE`, where a singular-value gap cannot be trusted."""
    lo, hi = RTOL_RANGE
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not lo <= rtol <= hi:
        raise ValueError(
            f"rtol must be in [{lo:g}, {hi:g}] (below, round-off counts as rank; above, real directions are cut), "
            f"got {rtol!r}"
        )


JVP_CHUNK_BYTES = 2**28  # forward-mode tangents pushed through at once hold about this much output
PROGRESS_ENTRIES = 2 * 10**7  # a dense audit whose Jacobian has more entries than this shows its progress


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation failure (torch's CUDA error, or the CPU allocator's RuntimeError)."""
    text = str(e).lower()
    return (
        isinstance(e, (MemoryError, torch.OutOfMemoryError))
        or "can't allocate memory" in text
        or ("out of memory" in text)
    )


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def chunked_jacobian(fn, theta: torch.Tensor, *, progress: bool = False) -> torch.Tensor:
    """``(m, n)`` Jacobian of ``fn`` at ``theta`` by forward mode, a chunk of basis tangents at a time, so
    that a module's intermediates (held once per tangent) stay bounded whatever ``n``. ``progress``: a bar
    on stderr when the Jacobian is large (:data:`PROGRESS_ENTRIES`)."""
    from tqdm import tqdm

    n = theta.numel()
    m = fn(theta).numel()
    chunk = max(1, min(n, JVP_CHUNK_BYTES // (8 * 16 * max(m, 1))))  # ~16 output-sized intermediates each

    def column(v: torch.Tensor) -> torch.Tensor:
        return torch.func.jvp(fn, (theta,), (v,))[1].reshape(-1)

    cols = []
    show = progress and m * n > PROGRESS_ENTRIES
    for start in tqdm(
        range(0, n, chunk), desc=f"Jacobian {m:,} x {n:,}", unit="chunk", file=sys.stderr, disable=not show
    ):
        k = min(chunk, n - start)
        V = torch.zeros(k, n, dtype=theta.dtype, device=theta.device)
        V[torch.arange(k), start + torch.arange(k)] = 1
        cols.append(torch.func.vmap(column)(V))
    return torch.cat(cols).T


def jacobian_rank(fn, theta: torch.Tensor, *, rtol: float = RTOL, progress: bool = False) -> AuditResult:
    """Rank of the Jacobian of ``fn: R^n -> R^m`` at ``theta`` (float64, dense); ``progress``: say on stderr
    what a large audit is doing."""
    check_rtol(rtol)
    t0 = time.perf_counter()
    theta = theta.detach().to(torch.float64)
    try:
        J = chunked_jacobian(fn, theta, progress=progress)
    except (NotImplementedError, RuntimeError) as e:
        if out_of_memory(e):  # not a missing forward mode: reverse mode would need the same memory and fail again
            raise MemoryError(
                f"audit: the {theta.numel():,}-parameter Jacobian ran out of memory ({first_line(e)}); audit a "
                "smaller shape, or pass a --max-memory the machine can hold so that the audit is refused before it "
                "starts"
            ) from None
        J = torch.autograd.functional.jacobian(fn, theta, vectorize=False)  # a kernel without forward-mode AD
    J = J.detach().reshape(-1, theta.numel())  # a module's own parameters may carry autograd history into it
    m, n = J.shape
    if progress and m * n > PROGRESS_ENTRIES:
        print(f"factoring the {m:,} x {n:,} Jacobian (QR, then SVD) ...", file=sys.stderr, flush=True)
    if m > n:
        J = torch.linalg.qr(J, mode="r").R
    sv = torch.linalg.svdvals(J).numpy()
    tol = rtol * sv[0]
    rank = int((sv > tol).sum())
    return AuditResult(n, rank, n - rank, _gap(sv, rank), float(tol), "dense", time.perf_counter() - t0, m, sv.tolist())


def audit_module(
    module: nn.Module, inputs: tuple, *, forward=None, rtol: float = RTOL, progress: bool = False
) -> AuditResult:
    """Dense audit of any module: ``forward(module, *inputs)`` (default ``module(*inputs)``,
    first element if it returns a tuple) differentiated with respect to all its parameters. The caller's
    module is not changed (a float64 copy is audited). Inputs that are constant (all zeros, say) are
    refused: they cannot excite the parameters and would fake unidentified directions."""
    import copy

    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    for i, x in enumerate(inputs):
        if torch.is_tensor(x) and x.is_floating_point():
            if not torch.isfinite(x).all():
                raise ValueError(f"inputs[{i}]: holds NaN or infinite values")
            if x.numel() > 1 and bool((x == x.reshape(-1)[0]).all()):
                raise ValueError(f"inputs[{i}]: constant input (every entry {x.reshape(-1)[0].item():g}) cannot "
                                 "excite the parameters; use random inputs")  # fmt: skip
    module = copy.deepcopy(module).to(torch.float64)
    like = {k: p.detach() for k, p in module.named_parameters()}
    theta = flatten(like)
    inputs = tuple(x.to(torch.float64) if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs)

    def fn(v):
        params = unflatten(v, like)
        call = (
            (lambda *a: functional_call(module, params, a))
            if forward is None
            else (lambda *a: forward(lambda *b, **kw: functional_call(module, params, b, kw), *a))
        )
        out = call(*inputs)
        return (out[0] if isinstance(out, tuple) else out).reshape(-1)

    return jacobian_rank(fn, theta, rtol=rtol, progress=progress)


def audit_torch_mha(
    mha: nn.MultiheadAttention, *, batch: int | None = None, seq_len: int = 8, causal: bool = False, seed: int = 0
) -> AuditResult:
    """Dense audit of a ``torch.nn.MultiheadAttention`` used as causal or full self-attention (on a copy).
    Data too small to identify the parameters (fewer informative outputs than parameters, or ``seq_len``
    below 2) are refused, as in :func:`audit`."""
    if not isinstance(mha, nn.MultiheadAttention):
        raise TypeError(f"mha: expected a torch.nn.MultiheadAttention, got {type(mha).__name__}")
    if not mha._qkv_same_embed_dim:
        raise ValueError("mha: kdim/vdim different from embed_dim is not self-attention; audit_module takes any module")
    check_seq_len(seq_len)
    if batch is not None and (not isinstance(batch, int) or isinstance(batch, bool) or batch < 1):
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    check_seed(seed)
    n = sum(p.numel() for p in mha.parameters())
    E = mha.embed_dim
    B = batch or max(2, math.ceil(3 * n / (E * seq_len)))
    if B * seq_len * E < n:
        raise ValueError(
            f"batch: {B} sequences of {seq_len} tokens carry at most {B * seq_len * E:,} outputs for {n:,} "
            "parameters, too few to identify them (the count would be too high); leave batch unset"
        )
    g = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(B, seq_len, E, generator=g, dtype=torch.float64)
    mask = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1) if causal else None
    if not mha.batch_first:
        x = x.transpose(0, 1)

    def forward(call, x):
        return call(x, x, x, need_weights=False, attn_mask=mask)[0]

    return audit_module(mha, (x,), forward=forward)


def _layer_fn(cfg: AttentionConfig, like: AttentionParams, X: torch.Tensor):
    return lambda v: attention(X, unflatten(v, like), cfg).reshape(-1)


def audit_block(
    cfg: AttentionConfig, names: tuple[str, ...], *, seed: int = 0, seq_len: int | None = None, rtol: float = RTOL
) -> AuditResult:
    """Dense audit over a subset of the parameters (the others held at their random values),
    e.g. ``("W_Q", "W_K")`` for the QK block or ``("W_V", "W_O")`` for the VO block."""
    p = init_params(cfg, seed=seed)
    missing = [k for k in names if k not in p]
    if missing:
        raise ValueError(f"names: {missing} are not parameters of this layer ({list(p)})")
    sub = {k: p[k] for k in PARAM_ORDER if k in names}
    B, L = default_data_size(cfg, sum(v.numel() for v in sub.values()), seq_len=seq_len)
    X = random_inputs(cfg, B, L, seed)

    def fn(v):
        return attention(X, {**p, **unflatten(v, sub)}, cfg).reshape(-1)

    res = jacobian_rank(fn, flatten(sub), rtol=rtol)
    res.details.update(batch=B, seq_len=L, seed=seed, block=list(names))
    return res


def qk_product_rank(E: int, D: int, *, orthonormal: bool = False, seed: int = 0) -> AuditResult:
    """Jacobian rank of ``(W_Q, W_K) -> W_Kᵀ W_Q`` (``D x E`` factors), optionally with
    ``W_Q`` restricted to orthonormal rows (parameterised by the QR factor of a free matrix).
    Both give ``2DE − D²`` (paper §4.3)."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(2 * D * E, generator=g, dtype=torch.float64)

    def fn(v):
        WQ, WK = v[: D * E].reshape(D, E), v[D * E :].reshape(D, E)
        if orthonormal:
            WQ = torch.linalg.qr(WQ.T).Q.T  # D orthonormal rows
        return (WK.T @ WQ).reshape(-1)

    return jacobian_rank(fn, theta)


def memory_estimate(n_params: int, n_outputs: int, method: str, *, groups: int | None = None) -> int:
    """Bytes an audit needs, roughly: dense holds the ``n_outputs x n_params`` float64 Jacobian three times at
    its peak (its chunks as they are joined, and the copy its QR factors; measured under ``ulimit -v``);
    certify holds a chunk of 128 output-sized vectors and either an ``n x n`` sketch or, split by ``groups``
    key/value groups, the work arrays of one group's query/key block (its Gram, that Gram on the complement of the
    known directions, the rows that project the output block out, and the rows themselves where the Gram does
    not decide: about ``2 (n/G)²`` numbers; at E = 128, H = 8, all biases 1.4 GB against 1.9 GB measured for the
    whole process, torch included). The known directions are sparse."""
    if method == "dense":
        return 24 * n_outputs * n_params
    block = n_params * n_params if groups is None else (n_params // groups) ** 2
    return 8 * (2 * block + 3 * 128 * n_outputs)


def available_memory() -> int | None:
    """Bytes this process can still allocate, as far as the machine says: the smallest of the host's
    ``MemAvailable``, the room left under ``RLIMIT_AS`` (``ulimit -v``) and the room left under the
    container's cgroup memory limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``); ``None`` where none
    is known."""
    import resource

    known: list[int] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    known.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        used = 0
        try:
            with open("/proc/self/status") as f:
                used = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:")), 0)
        except OSError:
            pass
        known.append(max(0, soft - used))
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:  # "max" or a huge number: no limit
            known.append(max(0, int(limit) - usage))
        break
    return min(known) if known else None


def svd_construction_rank(E: int, D: int, *, seed: int = 0) -> dict:
    """The paper's count of the QK block through its SVD construction (§4.3), checked on the tangent space.

    ``W_Kᵀ W_Q = U Σ Vᵀ`` with ``U, V ∈ R^{E×D}`` orthonormal columns and ``Σ`` diagonal: ``2DE + D``
    parameters under ``D(D+1)`` constraints (``UᵀU = VᵀV = I``, each symmetric). At a random point the
    constraints' Jacobian has full rank ``D(D+1)``, its null space (the tangent space) has dimension
    ``2DE + D − D(D+1) = 2DE − D²``, and the product map restricted to it has that same rank, so the
    construction is a local chart of the rank-``D`` matrices. Returns the three numbers.
    """
    g = torch.Generator().manual_seed(seed)
    U = torch.linalg.qr(torch.randn(E, D, generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(E, D, generator=g, dtype=torch.float64)).Q
    s = torch.rand(D, generator=g, dtype=torch.float64) + 0.5
    theta = torch.cat([U.reshape(-1), s, V.reshape(-1)])
    iu = torch.triu_indices(D, D)

    def parts(v):
        return v[: E * D].reshape(E, D), v[E * D : E * D + D], v[E * D + D :].reshape(E, D)

    def constraints(v):
        U_, _, V_ = parts(v)
        eye = torch.eye(D, dtype=v.dtype)
        return torch.cat([(U_.T @ U_ - eye)[iu[0], iu[1]], (V_.T @ V_ - eye)[iu[0], iu[1]]])

    def product(v):
        U_, s_, V_ = parts(v)
        return (U_ * s_) @ V_.T

    Jc = torch.func.jacfwd(constraints)(theta)  # (D(D+1), 2DE + D)
    Jp = torch.func.jacfwd(product)(theta).reshape(E * E, -1)  # (E², 2DE + D)
    sc = torch.linalg.svdvals(Jc)
    n_constraints = int((sc > RTOL * sc[0]).sum())
    _, _, Vh = torch.linalg.svd(Jc, full_matrices=True)
    tangent = Vh[n_constraints:].T  # basis of the constraints' null space
    sp = torch.linalg.svdvals(Jp @ tangent)
    return {
        "parameters": theta.numel(),
        "constraints": n_constraints,
        "tangent_dim": tangent.shape[1],
        "rank_on_tangent": int((sp > RTOL * sp[0]).sum()),
    }


def _audit_data_size(
    cfg: AttentionConfig, n: int, method: str, *, batch: int | None, seq_len: int | None, ratio: float | None
) -> tuple[int, int]:
    """Batch and length of an audit's data (:func:`default_data_size`, ``ratio`` informative outputs per parameter:
    default 3 dense, 1.5 certify; ``batch`` as given); refused if it carries fewer informative outputs than ``n``."""
    bad = isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < math.inf
    if ratio is not None and bad:
        raise ValueError(f"ratio must be a positive number, got {ratio!r}")
    default_ratio = 1.5 if method == "certify" else 3.0
    B, L = default_data_size(cfg, n, ratio=default_ratio if ratio is None else ratio, seq_len=seq_len)
    B = B if batch is None else batch
    informative = B * L * min(cfg.E, cfg.H * cfg.C)
    if informative < n:
        raise ValueError(
            f"batch: {B} sequences of {L} tokens carry at most {informative:,} informative outputs for "
            f"{n:,} parameters, too few to identify them (the count would be too high); use a batch "
            f"of at least {math.ceil(n / (L * min(cfg.E, cfg.H * cfg.C)))} or leave it to the default"
        )
    return B, L


def _check_audit_memory(method: str, n: int, need: float, max_memory: float | None) -> None:
    """Refuse an audit estimated to need ``need`` bytes, more than ``max_memory`` (default: the memory available)."""
    limit = max_memory if max_memory is not None else available_memory()
    if limit is not None and need > limit:
        raise ValueError(
            f"audit: the {method} method needs about {need / 2**30:,.3g} GiB for {n:,} parameters, more "
            f"than the {limit / 2**30:.3g} GiB available (free memory, ulimit -v and the cgroup limit); audit a "
            "smaller width (the counts depend on the shape, not the size: try --embed 64) or use `attnid count` "
            "(the closed form)"
        )


def audit(
    cfg: AttentionConfig,
    *,
    batch: int | None = None,
    seq_len: int | None = None,
    seed: int = 0,
    method: str = "auto",
    rtol: float = RTOL,
    ratio: float | None = None,
    progress: bool = False,
    directions: torch.Tensor | None = None,
    max_memory: float | None = None,
) -> AuditResult:
    """Audit our column-form layer with architecture ``cfg`` at a random point.

    ``method``: ``"dense"``, ``"certify"`` or ``"auto"`` (certify above 3,000 parameters when
    ``D, C <= E``). ``ratio``: informative outputs per parameter (default 3 dense, 1.5 certify).
    ``rtol``: the rank tolerance relative to the largest singular value, for both methods.
    ``directions``: ``(n_params, k)`` null directions for certify (default: the known symmetries,
    :func:`attnid.symmetry.tangent_basis`); certify raises :class:`CertificateError` if any of them
    is not in the null space to ``rtol`` or if they are not independent, so it cannot overcount.
    Data too small to identify the parameters (fewer informative outputs than parameters) is refused
    with a ``ValueError`` rather than undercounted; so is an audit whose memory estimate
    (:func:`memory_estimate`) exceeds ``max_memory`` bytes (default: the machine's available memory).
    """
    if not isinstance(cfg, AttentionConfig):
        raise TypeError(f"cfg: expected an AttentionConfig, got {type(cfg).__name__}")
    check_seed(seed)
    if batch is not None and (not isinstance(batch, int) or batch < 1):
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    check_rtol(rtol)
    n = total_params(cfg)  # from the shapes: nothing is allocated before the memory check
    # chapter 9: symmetries certify's basis does not hold (sinks identify the biases the basis takes as null)
    beyond = cfg.qk_norm or cfg.logit_softcap is not None or cfg.sinks or cfg.output_gate
    if method == "auto":
        method = "certify" if (n > 3000 and cfg.D <= cfg.E and cfg.C <= cfg.E and not beyond) else "dense"
    if method == "certify" and beyond and directions is None:
        raise ValueError(
            "method: certify checks the paper's symmetries, which QK-norm, soft-capping, sinks and output gates "
            "change; audit this layer with method 'dense' (--method dense) or give its null directions"
        )
    B, L = _audit_data_size(cfg, n, method, batch=batch, seq_len=seq_len, ratio=ratio)
    split = directions is None and splits_by_group(cfg)  # the per-group route of certify (see _certify)
    need = memory_estimate(n, B * cfg.E * L, method, groups=cfg.G if split else None)
    _check_audit_memory(method, n, need, max_memory)
    p = init_params(cfg, seed=seed)
    theta = flatten(p)
    assert theta.numel() == n
    X = random_inputs(cfg, B, L, seed)
    if method == "dense":
        res = jacobian_rank(_layer_fn(cfg, p, X), theta, rtol=rtol, progress=progress)
    elif method == "certify":
        res = _certify(cfg, p, X, progress=progress, rtol=rtol, directions=directions)
    else:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    res.details.update(batch=B, seq_len=L, seed=seed)
    return res


def _certify(
    cfg: AttentionConfig,
    p: AttentionParams,
    X: torch.Tensor,
    *,
    chunk: int = 128,
    progress: bool = False,
    rtol: float = RTOL,
    directions: torch.Tensor | None = None,
) -> AuditResult:
    """The ``certify`` method (:func:`attnid.certify.certify`) as an :class:`AuditResult`."""
    t0 = time.perf_counter()
    c = certify(cfg, p, X, _layer_fn(cfg, p, X), rtol=rtol, chunk=chunk, progress=progress, directions=directions)
    n = flatten(p).numel()
    return AuditResult(
        n, c.rank, n - c.rank, c.gap, c.tolerance, "certify", time.perf_counter() - t0, X.numel(), None, c.details
    )
