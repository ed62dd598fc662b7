"""The audit of LFM2's real short convolution (``transformers``' ``Lfm2ShortConv``) against
:func:`attnid.counting.short_conv.count_short_conv` (chapter 9): the Jacobian of the module in float64 with respect
to all its parameters, on hidden states, and its rank."""

from __future__ import annotations

import torch

from ..audit import RTOL, AuditResult, audit_module
from ..counting.short_conv import count_short_conv
from .build import HFAuditError, _prepare, _transformers
from .scopes import MIN_GAP


def audit_short_conv_hf(
    embed: int = 8, kernel: int = 3, bias: bool = False, *, seed: int = 0, rtol: float = RTOL, check: bool = True
) -> AuditResult:
    """Audit ``Lfm2ShortConv`` of width ``embed`` with ``kernel`` taps (``conv_L_cache``) and ``bias``
    (``conv_bias``) at seeded random weights in float64, on sequences of ``L = 3 kernel + 4`` hidden states (each
    channel's filter seen at every lag), enough of them that the outputs outnumber the parameters three to one
    (with fewer, the data, not the module, leave directions free); ``details["theory_unidentified"]`` is the closed
    form. With ``check``, a difference from it or a singular-value gap under ``MIN_GAP`` raises
    :class:`HFAuditError`."""
    tf = _transformers()
    theory = count_short_conv(embed, kernel, bias)
    config = tf.Lfm2Config(hidden_size=embed, num_hidden_layers=1, layer_types=["conv"], conv_L_cache=kernel,
                           conv_bias=bias, num_attention_heads=1, num_key_value_heads=1, vocab_size=16)  # fmt: skip
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    module = _prepare(Lfm2ShortConv(config, layer_idx=0), embed, seed)
    n = sum(p.numel() for p in module.parameters())
    if n != theory.total_params:
        raise HFAuditError(
            f"lfm2 short convolution: the module has {n} parameters, the closed form {theory.total_params}"
        )
    L = 3 * kernel + 4
    B = max(4, -(-3 * n // (L * embed)))
    x = torch.randn(B, L, embed, generator=torch.Generator().manual_seed(10_000 + seed), dtype=torch.float64)
    res = audit_module(module, (x,), rtol=rtol)
    res.details.update(hf_type="lfm2", scope="short convolution", module="transformers.models.lfm2.Lfm2ShortConv",
                       theory_unidentified=theory.unidentified, terms=theory.unidentified_by_block,
                       config=dict(E=embed, kernel=kernel, bias=bias))  # fmt: skip
    if check and (res.sv_gap < MIN_GAP or res.unidentified != theory.unidentified):
        raise HFAuditError(
            f"lfm2 short convolution: the Jacobian gives {res.unidentified} unidentified parameters (gap "
            f"{res.sv_gap:.1e}), the closed form {theory.unidentified} (E = {embed}, kernel = {kernel}, bias = {bias})"
        )
    return res
