"""The audit of LFM2's real short convolution (``transformers``' ``Lfm2ShortConv``) against
:func:`attnid.counting.short_conv.count_short_conv` (chapter 9): the Jacobian of the module in float64 with respect
to all its parameters, on hidden states, and its rank."""

from __future__ import annotations

from ..audit import RTOL, AuditResult
from ..counting.short_conv import count_short_conv
from .build import _prepare, _transformers
from .mixers import audit_mixer, mixer_inputs


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
    return audit_mixer(
        module, mixer_inputs(module, embed, 3 * kernel + 4, seed, least=4), theory, name="lfm2 short convolution",
        rtol=rtol, check=check,
        details=dict(hf_type="lfm2", scope="short convolution", module="transformers.models.lfm2.Lfm2ShortConv",
                     config=dict(E=embed, kernel=kernel, bias=bias)),
    )  # fmt: skip
