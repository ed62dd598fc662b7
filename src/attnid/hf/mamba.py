"""The audit of Mamba-2's real mixer and decoder layer (``transformers``' ``Mamba2Mixer``, ``Mamba2Block``) against
:func:`attnid.counting.mamba.count_mamba` (chapter 9): the Jacobian of the module in float64 with respect to all its
parameters, on hidden states, and its rank."""

from __future__ import annotations

import torch

from ..audit import RTOL, AuditResult
from ..counting.mamba import count_mamba
from .build import _prepare, _transformers
from .mixers import audit_mixer, float64_forward, gated_norms_in_float64, mixer_inputs

MAMBA_SCOPES = ("mixer", "block")


def build_mamba2(
    embed: int, expand: int, heads: int, groups: int, state: int, kernel: int, *, bias: bool, conv_bias: bool,
    scope: str, norm_eps: float = 0.0, seed: int = 0,
) -> tuple[torch.nn.Module, torch.Tensor]:  # fmt: skip
    """``(module, x)``: ``Mamba2Mixer`` or ``Mamba2Block`` (:func:`audit_mamba2_hf`'s arguments) in float64 at seeded
    random weights, its gated norm computed in float64, and hidden states ``x`` ``(B, 12, embed)`` enough for the
    outputs to outnumber the parameters three to one. Run it through :func:`attnid.hf.mixers.float64_forward`."""
    if scope not in MAMBA_SCOPES:
        raise ValueError(f"scope: expected one of {', '.join(MAMBA_SCOPES)}, got {scope!r}")
    tf = _transformers()
    from transformers.models.mamba2 import modeling_mamba2 as modeling

    config = tf.Mamba2Config(hidden_size=embed, expand=expand, num_heads=heads, head_dim=expand * embed // heads,
                             n_groups=groups, state_size=state, conv_kernel=kernel, use_bias=bias,
                             use_conv_bias=conv_bias, layer_norm_epsilon=norm_eps, chunk_size=4, num_hidden_layers=1,
                             vocab_size=16)  # fmt: skip
    layer = modeling.Mamba2Block(config, layer_idx=0) if scope == "block" else modeling.Mamba2Mixer(config, 0)
    module = _prepare(layer, embed, seed, norm_eps=norm_eps if scope == "block" else None)
    return gated_norms_in_float64(module), mixer_inputs(module, embed, 12, seed)


def audit_mamba2_hf(
    embed: int = 8, expand: int = 2, heads: int = 4, groups: int = 1, state: int = 4, kernel: int = 4, *,
    bias: bool = False, conv_bias: bool = True, scope: str = "mixer", norm_eps: float = 0.0, seed: int = 0,
    rtol: float = RTOL, check: bool = True,
) -> AuditResult:  # fmt: skip
    """Audit ``Mamba2Mixer`` (``scope="mixer"``) or ``Mamba2Block`` (``"block"``: an RMSNorm before the mixer, a
    residual) of width ``embed``, ``expand x embed`` inner channels in ``heads`` heads, ``groups``
    groups of ``B`` and ``C`` of ``state`` dimensions, filters of ``kernel`` taps, ``bias`` (``use_bias``) and
    ``conv_bias``, at seeded random weights in float64 (:func:`build_mamba2`), on sequences of 12 hidden states
    scanned in chunks of 4 (the scan across chunks is read as well as within them; the chunk size does not change
    the function), every norm at ``ε = norm_eps``. ``details["theory_unidentified"]`` is the closed form; with
    ``check``, a difference from it or a singular-value gap under ``MIN_GAP`` raises :class:`HFAuditError`."""
    if scope not in MAMBA_SCOPES:
        raise ValueError(f"scope: expected one of {', '.join(MAMBA_SCOPES)}, got {scope!r}")
    theory = count_mamba(embed, expand * embed, heads, groups, state, kernel, bias=bias, conv_bias=conv_bias,
                         block=scope == "block", norm_eps_zero=norm_eps == 0)  # fmt: skip
    module, x = build_mamba2(embed, expand, heads, groups, state, kernel, bias=bias, conv_bias=conv_bias, scope=scope,
                             norm_eps=norm_eps, seed=seed)  # fmt: skip
    return audit_mixer(
        module, x, theory, name=f"mamba2 {scope}", forward=float64_forward, rtol=rtol, check=check,
        details=dict(hf_type="mamba2", scope=scope, module=f"transformers.models.mamba2.{type(module).__name__}",
                     config=dict(E=embed, inner=expand * embed, heads=heads, groups=groups, state=state,
                                 kernel=kernel, bias=bias, conv_bias=conv_bias)),
    )  # fmt: skip
