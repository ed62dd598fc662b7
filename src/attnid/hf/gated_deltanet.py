"""The audit of a real Gated DeltaNet (``transformers``' ``Qwen3NextGatedDeltaNet``, ``Qwen3_5GatedDeltaNet``) against
:func:`attnid.counting.gated_deltanet.count_gated_deltanet` (chapter 9): the Jacobian of the module in float64 with
respect to all its parameters, on hidden states, and its rank."""

from __future__ import annotations

import importlib

from ..audit import RTOL, AuditResult
from ..counting.gated_deltanet import count_gated_deltanet
from .build import _prepare, _transformers
from .mixers import audit_mixer, float64_forward, gated_norms_in_float64, mixer_inputs

# the real Gated DeltaNets: Qwen3-Next's (in_proj_qkvz and in_proj_ba, each head's maps side by side) and Qwen3.5's
# (in_proj_qkv, in_proj_z, in_proj_b and in_proj_a apart; its mixtures' layer is the same code)
MODULES = {
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextGatedDeltaNet"),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5GatedDeltaNet"),
}


def audit_gated_deltanet_hf(
    embed: int = 8, key_heads: int = 2, value_heads: int = 2, key_dim: int = 4, value_dim: int = 4, kernel: int = 4,
    *, hf_type: str = "qwen3_next", norm_eps: float = 0.0, seed: int = 0, rtol: float = RTOL, check: bool = True,
) -> AuditResult:  # fmt: skip
    """Audit ``hf_type``'s Gated DeltaNet (:data:`MODULES`) of width ``embed`` with ``key_heads`` and ``value_heads``
    heads of ``key_dim`` and ``value_dim`` channels, filters of ``kernel`` taps and its norm at ``ε = norm_eps``, at
    seeded random weights in float64 (its scan kept in float64: :func:`attnid.hf.mixers.float64_kept`), on sequences
    of 12 hidden states, enough of them that the outputs outnumber the parameters three to one.
    ``details["theory_unidentified"]`` is the closed form; with ``check``, a difference from it or a singular-value
    gap under ``MIN_GAP`` raises :class:`HFAuditError`."""
    if hf_type not in MODULES:
        raise ValueError(f"hf_type: Gated DeltaNet is audited in {', '.join(MODULES)}, not {hf_type!r}")
    theory = count_gated_deltanet(embed, key_heads, value_heads, key_dim, value_dim, kernel)
    tf = _transformers()
    config_class, layer_class = MODULES[hf_type]
    modeling = importlib.import_module(f"transformers.models.{hf_type}.modeling_{hf_type}")
    config = getattr(tf, config_class)(
        hidden_size=embed, linear_num_key_heads=key_heads, linear_num_value_heads=value_heads,
        linear_key_head_dim=key_dim, linear_value_head_dim=value_dim, linear_conv_kernel_dim=kernel,
        rms_norm_eps=norm_eps, num_hidden_layers=1, layer_types=["linear_attention"], vocab_size=16,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    module = gated_norms_in_float64(_prepare(getattr(modeling, layer_class)(config, layer_idx=0), embed, seed))
    return audit_mixer(
        module, mixer_inputs(module, embed, 12, seed), theory, name="gated deltanet", forward=float64_forward,
        rtol=rtol, check=check,
        details=dict(hf_type=hf_type, scope="gated deltanet", module=f"transformers.models.{hf_type}.{layer_class}",
                     config=dict(E=embed, key_heads=key_heads, value_heads=value_heads, key_dim=key_dim,
                                 value_dim=value_dim, kernel=kernel)),
    )  # fmt: skip
