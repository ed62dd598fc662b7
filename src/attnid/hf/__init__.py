"""Auditing the attention layers of Hugging Face ``transformers`` (optional extra: ``pip install 'attnid[audit]'``).

Each supported model type is built from a *small* config of its real class, with random weights and no
download, and run through its own attention module and rotary code in float64. The audit is the dense
Jacobian audit of :func:`attnid.audit.audit_module` (the same code path as our own layer's), with the
data sized by :func:`attnid.audit.default_data_size`; the result is compared with the closed form of the
equivalent :class:`~attnid.attention.AttentionConfig` (groups, biases, RoPE dims), and a difference, or a
rank that the singular values do not decide clearly, raises :class:`HFAuditError`.

Conventions: Hugging Face's ``rotate_half`` pairs dimension ``i`` with ``i + R/2``, our layer pairs ``2i``
with ``2i + 1``; the two differ by a fixed permutation of a head's coordinates, so the counts agree
(tests/test_hf.py checks it on every RoPE model type). Nothing is converted.

Four modules: :mod:`.build` (the modules at float64), :mod:`.scopes` (the attention, block and model audits),
:mod:`.mla` (multi-head latent attention) and :mod:`.verify` (presets and released configs at a small structure).
"""

from ..audit import default_seq_len
from ..families import HF_TYPES, MLA_TYPES, equivalent_config, model_config
from .build import (
    ATTN_IMPLEMENTATIONS,
    TESTED,
    HFAuditError,
    build_attention,
    build_block,
    build_model,
    implementation_of,
    set_norms,
)
from .mla import audit_mla_hf, build_mla
from .scopes import (
    AUDIT_EXPERTS,
    BLOCK_DATA_RATIO,
    MIN_EXPERT_SHARE,
    MIN_GAP,
    NEAR_NULL_BAND,
    RELU_MIN_SHARE,
    SCOPE_AUDITS,
    ScopeAudit,
    audit_hf,
    check_hf_audit,
)
from .verify import small_block_structure, small_mla, small_structure, structure_audit, verify_preset, verify_presets

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "AUDIT_EXPERTS",
    "BLOCK_DATA_RATIO",
    "HF_TYPES",
    "MIN_EXPERT_SHARE",
    "MIN_GAP",
    "MLA_TYPES",
    "NEAR_NULL_BAND",
    "RELU_MIN_SHARE",
    "SCOPE_AUDITS",
    "TESTED",
    "HFAuditError",
    "ScopeAudit",
    "audit_hf",
    "audit_mla_hf",
    "build_attention",
    "build_block",
    "build_mla",
    "build_model",
    "check_hf_audit",
    "default_seq_len",
    "equivalent_config",
    "implementation_of",
    "model_config",
    "set_norms",
    "small_block_structure",
    "small_mla",
    "small_structure",
    "structure_audit",
    "verify_preset",
    "verify_presets",
]
