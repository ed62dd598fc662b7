"""What the audits of the sequence mixers that are not attention share (chapter 9: LFM2's short convolution,
Mamba-2, Gated DeltaNet, and the hybrid models that hold them): their scans and gated norms kept in float64, their
data, and the audit of a real module against its closed form."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from ..audit import RTOL, AuditResult, audit_module
from ..counting import Count
from .build import HFAuditError
from .scopes import MIN_GAP, _near_null


@contextmanager
def float64_kept() -> Iterator[None]:
    """The scans of Mamba-2 and Gated DeltaNet cast their inputs, decays and time steps to float32 (``.float()``,
    ``.to(torch.float32)``) whatever they are; inside this block a float64 tensor stays float64 through both, so that
    the scan keeps the audit's float64. Other dtypes are cast as before. Process-wide while it lasts: the audit's
    forward runs inside it alone."""
    original_float, original_to = torch.Tensor.float, torch.Tensor.to

    def keep_float(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else original_float(self, *args, **kwargs)

    def keep_to(self, *args, **kwargs):
        if self.dtype == torch.float64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs = {**kwargs, "dtype": torch.float64}
        return original_to(self, *args, **kwargs)

    torch.Tensor.float, torch.Tensor.to = keep_float, keep_to  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.float, torch.Tensor.to = original_float, original_to  # type: ignore[method-assign]


@contextmanager
def short_chunks(size: int = 4) -> Iterator[None]:
    """Gated DeltaNet's chunked scan (transformers' ``torch_chunk_gated_delta_rule``) in chunks of ``size`` tokens
    while the block lasts: its default of 64 pads an audit's short sequences to 64 tokens and loops over each of their
    rows, for every tangent of the Jacobian (seven times slower on a whole model). Chunks of any size compute the same
    function: the scan carries its state from chunk to chunk."""
    from transformers.models.qwen3_5 import modeling_qwen3_5
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
    from transformers.models.qwen3_next import modeling_qwen3_next

    modules = (modeling_qwen3_next, modeling_qwen3_5, modeling_qwen3_5_moe)  # each with its own copy of the scan
    name = "torch_chunk_gated_delta_rule"
    originals = [getattr(m, name) for m in modules]
    for m, original in zip(modules, originals):
        setattr(m, name, functools.partial(original, chunk_size=size))
    try:
        yield
    finally:
        for m, original in zip(modules, originals):
            setattr(m, name, original)


def _grouped_gated_norm_float64(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
    # Mamba-2's gated norm (MambaRMSNormGated, and Bamba's and Granite 4's copies) in the input's dtype (transformers'
    # computes in float32): the input times SiLU of the gate, normalised over each group of `group_size` channels,
    # times the weight
    h = hidden_states if gate is None else hidden_states * torch.nn.functional.silu(gate)
    *prefix, width = h.shape
    g = h.view(*prefix, width // self.group_size, self.group_size)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * g.view(*prefix, width)


def _head_gated_norm_float64(self, hidden_states: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    # Gated DeltaNet's gated norm (Qwen3NextRMSNormGated, Qwen3.5's copies) in the input's dtype (transformers'
    # computes in float32): an RMSNorm over the last axis (one head's value channels), its weight, then SiLU of the gate
    normed = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * normed * torch.nn.functional.silu(gate)


def gated_norms_in_float64(module: torch.nn.Module) -> torch.nn.Module:
    """Every gated RMSNorm of ``module`` computed in the input's float64: Gated DeltaNet's (normalised, then gated)
    and Mamba-2's, Bamba's and Granite 4's (gated, then normalised by groups); ``module``, changed."""
    for m in module.modules():
        name = type(m).__name__
        if name in ("Qwen3NextRMSNormGated", "Qwen3_5RMSNormGated", "Qwen3_5MoeRMSNormGated"):
            m.forward = types.MethodType(_head_gated_norm_float64, m)
        elif name.endswith("RMSNormGated"):
            m.forward = types.MethodType(_grouped_gated_norm_float64, m)
    return module


def float64_forward(call: Callable, x: torch.Tensor) -> torch.Tensor:
    """The module ``call`` on hidden states ``x``, its scan kept in float64 (:func:`float64_kept`) and Gated DeltaNet's
    in short chunks (:func:`short_chunks`)."""
    with float64_kept(), short_chunks():
        out = call(x)
    return out[0] if isinstance(out, tuple) else out


def mixer_inputs(module: torch.nn.Module, embed: int, seq_len: int, seed: int, least: int = 2) -> torch.Tensor:
    """Hidden states ``(B, seq_len, embed)`` in float64, seeded, enough sequences (at least ``least``) that the
    outputs outnumber ``module``'s parameters three to one (with fewer, the data, not the module, leave directions
    free)."""
    n = sum(p.numel() for p in module.parameters())
    B = max(least, -(-3 * n // (seq_len * embed)))
    return torch.randn(B, seq_len, embed, generator=torch.Generator().manual_seed(10_000 + seed), dtype=torch.float64)


def audit_mixer(
    module: torch.nn.Module, x: torch.Tensor, theory: Count, *, name: str, details: dict,
    forward: Callable | None = None, rtol: float = RTOL, check: bool = True,
) -> AuditResult:  # fmt: skip
    """The Jacobian count of a real mixer ``module`` on ``x`` (through ``forward``) beside its closed form ``theory``
    (``details["theory_unidentified"]``, ``details["terms"]``, and ``details`` added: its type, scope, module and
    config). A module whose parameters are not the closed form's raises :class:`HFAuditError` before the audit; with
    ``check``, so does a difference from it or a singular-value gap under ``MIN_GAP`` (``name`` says which module)."""
    n = sum(p.numel() for p in module.parameters())
    if n != theory.total_params:
        raise HFAuditError(f"{name}: the module has {n} parameters, the closed form {theory.total_params}")
    res = audit_module(module, (x,), forward=forward, rtol=rtol)
    res.details.update(
        details, theory_unidentified=theory.unidentified, terms=theory.unidentified_by_block, near_null=_near_null(res)
    )
    if check and (res.sv_gap < MIN_GAP or res.unidentified != theory.unidentified):
        raise HFAuditError(
            f"{name}: the Jacobian gives {res.unidentified} unidentified parameters (gap {res.sv_gap:.1e}), the "
            f"closed form {theory.unidentified} ({details.get('config')})"
        )
    return res
