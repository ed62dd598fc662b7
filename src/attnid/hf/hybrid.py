"""The audit of a real hybrid model, attention layers beside layers whose sequence mixer is not attention (LFM2's
short convolutions, Bamba's Mamba-2 mixers, Qwen3-Next's Gated DeltaNet), against :func:`attnid.counting.count_model`
with its ``mixer_layers`` (chapter 9): the Jacobian of the whole causal LM's log-probabilities in float64 with respect
to all its parameters, and its rank."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..audit import RTOL, AuditResult
from ..config_hybrid import GATED_DELTANET_TYPES
from ..counting import ModelConfig, count_model
from ..counting.hybrid import mixer_block
from ..families import HF_TYPES, block_config, equivalent_config
from ..family_kwargs import expert_kwargs
from .build import build_model
from .mixers import audit_mixer, float64_kept, gated_norms_in_float64, short_chunks
from .scopes import AUDIT_EXPERTS, _block_size

# the mixer's sizes a hybrid model's audit takes by default, by the kind of mixer (attnid.counting.hybrid.MIXERS)
MIXER_DEFAULTS: dict[str, dict] = {
    "short convolution": dict(kernel=3, bias=False),  # LFM2
    "mamba2": dict(expand=2, heads=4, groups=1, state=4, kernel=4, bias=False, conv_bias=True),  # Bamba, Granite 4
    "gated deltanet": dict(key_heads=1, value_heads=2, key_dim=4, value_dim=4, kernel=4),  # Qwen3-Next, Qwen3.5
}
HYBRID_TYPES = tuple(t for t, spec in HF_TYPES.items() if spec.hybrid is not None)


def _audit_mixer_sizes(hf_type: str, mixer: dict | None) -> dict:
    """The mixer's sizes of a ``hf_type`` hybrid model: its kind's defaults with ``mixer`` on top, a name it lacks
    refused."""
    if hf_type not in HYBRID_TYPES:
        raise ValueError(f"hf: expected one of {', '.join(HYBRID_TYPES)} for a hybrid model, got {hf_type!r}")
    defaults = MIXER_DEFAULTS[HF_TYPES[hf_type].mixer_layer()[1]]
    given = {} if mixer is None else mixer
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(f"mixer: {hf_type}'s mixer has sizes {', '.join(defaults)}, not {', '.join(unknown)}")
    return {**defaults, **given}


def hybrid_model_config(
    hf_type: str, cfg, *, layer_types: tuple[str, ...], ffn: int, vocab: int, tied: bool, mixer: dict | None = None,
    norm_eps_zero: bool = False, experts: int = 0,
) -> ModelConfig:  # fmt: skip
    """The :class:`~attnid.counting.ModelConfig` of a ``hf_type`` hybrid model whose layers are ``layer_types`` (its
    config's names), its attention ``cfg``, its mixers of sizes ``mixer`` (:data:`MIXER_DEFAULTS` by default), its
    MLPs mixtures of ``experts`` experts where the type has them (Qwen3-Next)."""
    sizes = _audit_mixer_sizes(hf_type, mixer)
    name, kind = HF_TYPES[hf_type].mixer_layer()
    if not layer_types or any(t not in ("full_attention", name) for t in layer_types):
        raise ValueError(f"layer_types: each of a {hf_type} model's layers is 'full_attention' or {name!r}, got "
                         f"{list(layer_types)!r}")  # fmt: skip
    mixers = sum(t == name for t in layer_types)
    block = block_config(hf_type, cfg, ffn, norm_eps_zero=norm_eps_zero, experts=experts)
    layer = mixer_block(kind, block, sizes, norm_eps_zero=norm_eps_zero)
    return ModelConfig(block, len(layer_types), vocab, tied=tied, norm_eps_zero=norm_eps_zero,
                       mixer_layers=((layer, mixers),) if mixers else ())  # fmt: skip


def _config_changes(hf_type: str, layer_types: tuple[str, ...], sizes: dict) -> dict:
    """The fields of a ``hf_type`` config that make its layers ``layer_types`` with mixers of ``sizes``."""
    if hf_type == "lfm2":
        return dict(layer_types=list(layer_types), conv_L_cache=sizes["kernel"], conv_bias=sizes["bias"])
    if hf_type in GATED_DELTANET_TYPES:
        return dict(layer_types=list(layer_types), linear_num_key_heads=sizes["key_heads"],
                    linear_num_value_heads=sizes["value_heads"], linear_key_head_dim=sizes["key_dim"],
                    linear_value_head_dim=sizes["value_dim"], linear_conv_kernel_dim=sizes["kernel"])  # fmt: skip
    attention = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    kinds = dict(layer_types=list(layer_types)) if hf_type == "granitemoehybrid" else dict(attn_layer_indices=attention)
    return dict(**kinds, mamba_expand=sizes["expand"], mamba_n_heads=sizes["heads"], mamba_d_head="auto",
                mamba_n_groups=sizes["groups"], mamba_d_state=sizes["state"], mamba_d_conv=sizes["kernel"],
                mamba_proj_bias=sizes["bias"], mamba_conv_bias=sizes["conv_bias"], mamba_chunk_size=4)  # fmt: skip


def _scan_in_float64(module: torch.nn.Module, forward: Callable) -> Callable:
    """``forward`` with every scan of ``module`` (Mamba-2's, Gated DeltaNet's) in float64
    (:func:`attnid.hf.mixers.float64_kept`; Gated DeltaNet's in short chunks, :func:`attnid.hf.mixers.short_chunks`),
    its gated norms computed in float64."""
    gated_norms_in_float64(module)

    def scanned(call: Callable, ids: torch.Tensor) -> torch.Tensor:
        with float64_kept(), short_chunks():
            return forward(call, ids)

    return scanned


def audit_hybrid_hf(
    hf_type: str = "lfm2", *, embed: int = 8, heads: int = 2, groups: int = 1,
    layer_types: tuple[str, ...] = ("conv", "full_attention"), ffn: int = 8, vocab: int | None = None,
    tied: bool = True, mixer: dict | None = None, experts: int | None = None, norm_eps: float = 0.0, seed: int = 0,
    rtol: float = RTOL, check: bool = True,
) -> AuditResult:  # fmt: skip
    """Audit a whole ``hf_type`` causal LM whose layers are ``layer_types`` (its config's names: LFM2's ``"conv"``
    and ``"full_attention"``, Bamba's ``"linear_attention"`` and ``"full_attention"``), its attention of ``heads``
    heads in ``groups`` groups, its MLPs of inner size ``ffn`` (with a mixture, ``experts`` experts of that size, 4 by
    default, two chosen per token, and a shared one), its mixers of sizes ``mixer`` (:data:`MIXER_DEFAULTS`),
    a vocabulary of ``vocab`` (default ``max(16, 3 embed)``), every norm at ``ε = norm_eps``, at seeded random
    weights in float64, read through ``log_softmax``. ``details["theory_unidentified"]`` is the closed form; with
    ``check``, a difference from it or a singular-value gap under ``MIN_GAP`` raises :class:`HFAuditError`."""
    sizes = _audit_mixer_sizes(hf_type, mixer)
    t = HF_TYPES[hf_type]
    k = (AUDIT_EXPERTS if experts is None else experts) if t.moe else 0
    if experts is not None and not t.moe:
        raise ValueError(f"experts: {hf_type} has one MLP in each layer, no experts")
    if k == 0 and t.moe and not t.dense_allowed:
        raise ValueError(f"experts: {hf_type} has a mixture of experts in every layer; give 2 or more")
    cfg = equivalent_config(hf_type, embed=embed, heads=heads, groups=groups, norm_eps=norm_eps)
    V = max(16, 3 * embed) if vocab is None else vocab
    shape: dict[str, Any] = dict(layer_types=tuple(layer_types), ffn=ffn, vocab=V, tied=tied, mixer=sizes, experts=k)
    theory = count_model(hybrid_model_config(hf_type, cfg, **shape, norm_eps_zero=norm_eps == 0))
    module, forward = build_model(
        hf_type, cfg, ffn=ffn, layers=len(layer_types), vocab=V, tied=tied, seq_len=0, norm_eps=norm_eps, seed=seed,
        config_changes={**_config_changes(hf_type, tuple(layer_types), sizes),
                        **expert_kwargs(t.module, k, t.dense_allowed)},
    )  # fmt: skip
    B, L = _block_size(cfg, theory.total_params, words=V)
    ids = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(20_000 + seed))
    return audit_mixer(
        module, ids, theory, name=f"{hf_type} hybrid model", forward=_scan_in_float64(module, forward), rtol=rtol,
        check=check,
        details=dict(hf_type=hf_type, scope="model", module=f"transformers.{type(module).__name__}", norm_eps=norm_eps,
                     config=dict(E=embed, H=heads, G=groups, layer_types=list(layer_types), ffn=ffn, vocab=V,
                                 tied=tied, mixer=sizes, experts=k, norm_eps=norm_eps)),
    )  # fmt: skip
