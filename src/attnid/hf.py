"""Auditing the attention layers of Hugging Face ``transformers`` (optional extra: ``pip install -e ".[hf]"``).

Each supported model type is built from a *small* config of its real class, with random weights and no
download, and run through its own attention module and rotary code in float64. The audit is the dense
Jacobian audit of :func:`attnid.audit.audit_module` (the same code path as our own layer's), with the
data sized by :func:`attnid.audit.default_data_size`; the result is compared with the closed form of the
equivalent :class:`~attnid.attention.AttentionConfig` (groups, biases, RoPE dims), and a difference, or a
rank that the singular values do not decide clearly, raises :class:`HFAuditError`.

Conventions: Hugging Face's ``rotate_half`` pairs dimension ``i`` with ``i + R/2``, our layer pairs ``2i``
with ``2i + 1``; the two differ by a fixed permutation of a head's coordinates, so the counts agree
(tests/test_hf.py checks it on every RoPE model type). Nothing is converted.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .attention import AttentionConfig, parse_bias
from .audit import RTOL, AuditResult, audit_module, available_memory, default_data_size, memory_estimate
from .counting import count

TESTED = "transformers 5.24"
MIN_GAP = 1e6  # a rank decision with a smaller singular-value gap is not trusted


class HFAuditError(RuntimeError):
    """The Jacobian count of a real module differs from the closed form, or its rank is not clear-cut."""


@dataclass(frozen=True)
class HFType:
    """What one ``transformers`` model type can express, and how to build and call its attention."""

    module: str  # transformers.models.<module>
    config: str  # its config class
    attention: str  # its attention class
    rotary: str | None  # its rotary-embedding class (None: no RoPE)
    biases: tuple[str, ...]  # the bias settings it can express (letters of "qkvo"); the first is the default
    groups: bool = False  # grouped-query attention (num_key_value_heads)
    head_dim: bool = False  # a head size other than E/H
    partial_rope: bool = False  # rotary on part of each head

    def config_kwargs(self, cfg: AttentionConfig, attn_implementation: str = "sdpa") -> dict:
        """The keyword arguments of the model's config class for the architecture ``cfg``."""
        E, H = cfg.E, cfg.H
        common = dict(vocab_size=16, num_hidden_layers=1, attn_implementation=attn_implementation)
        name = self.module
        if name == "gpt2":
            return dict(
                common, n_embd=E, n_head=H, n_positions=64, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                bos_token_id=0, eos_token_id=0,
            )  # fmt: skip
        if name == "opt":
            return dict(
                common, hidden_size=E, num_attention_heads=H, ffn_dim=4 * E, enable_bias=bool(cfg.bias), dropout=0.0
            )
        kw = dict(common, hidden_size=E, num_attention_heads=H, intermediate_size=4 * E, attention_dropout=0.0)
        if self.groups:
            kw["num_key_value_heads"] = cfg.G
        if self.head_dim:
            kw["head_dim"] = cfg.D
        if name in ("llama",):
            kw["attention_bias"] = bool(cfg.bias)
        # transformers takes int(D * factor) rotary dims; R/D itself can land just below R (30/44 * 44 =
        # 29.99...), so the factor is aimed at the middle of [R, R + 1)
        factor = (cfg.R + 0.5) / cfg.D
        if name == "gpt_neox":
            kw.update(attention_bias=bool(cfg.bias), rotary_pct=factor, use_parallel_residual=True)
            kw["rope_parameters"] = {
                "rope_type": "default",
                "rope_theta": cfg.rope_base,
                "partial_rotary_factor": factor,
            }
        if name == "phi":
            kw["rope_parameters"] = {
                "rope_type": "default",
                "rope_theta": cfg.rope_base,
                "partial_rotary_factor": factor,
            }
            kw["resid_pdrop"] = 0.0
        return kw


HF_TYPES: dict[str, HFType] = {
    "gpt2": HFType("gpt2", "GPT2Config", "GPT2Attention", None, biases=("qkvo",)),
    "opt": HFType("opt", "OPTConfig", "OPTAttention", None, biases=("qkvo", "")),
    "llama": HFType(
        "llama",
        "LlamaConfig",
        "LlamaAttention",
        "LlamaRotaryEmbedding",
        biases=("", "qkvo"),
        groups=True,
        head_dim=True,
    ),
    "mistral": HFType(
        "mistral",
        "MistralConfig",
        "MistralAttention",
        "MistralRotaryEmbedding",
        biases=("",),
        groups=True,
        head_dim=True,
    ),
    "qwen2": HFType("qwen2", "Qwen2Config", "Qwen2Attention", "Qwen2RotaryEmbedding", biases=("qkv",), groups=True),
    "gpt_neox": HFType(
        "gpt_neox",
        "GPTNeoXConfig",
        "GPTNeoXAttention",
        "GPTNeoXRotaryEmbedding",
        biases=("qkvo", ""),
        partial_rope=True,
    ),
    "phi": HFType(
        "phi", "PhiConfig", "PhiAttention", "PhiRotaryEmbedding", biases=("qkvo",), groups=True, partial_rope=True
    ),
}


def _transformers():
    try:
        with warnings.catch_warnings():  # its import warns about the environment (tqdm, torch), not the audit
            warnings.simplefilter("ignore")
            import transformers
    except ImportError as e:
        raise ImportError(f'auditing Hugging Face modules needs transformers ({TESTED}): pip install -e ".[hf]"') from e
    return transformers


def equivalent_config(
    hf_type: str,
    *,
    embed: int,
    heads: int,
    groups: int | None = None,
    head_dim: int | None = None,
    rope_dims: int | None = None,
    bias: str | None = None,
) -> AttentionConfig:
    """The :class:`AttentionConfig` of a ``hf_type`` attention layer (causal self-attention); a setting
    the model type cannot express raises ``ValueError`` naming it."""
    if hf_type not in HF_TYPES:
        raise ValueError(f"hf: unknown model type {hf_type!r}; choose one of {', '.join(HF_TYPES)}")
    t = HF_TYPES[hf_type]
    if groups is not None and groups != heads and not t.groups:
        raise ValueError(f"groups: {hf_type} has no grouped-query attention (groups must equal heads)")
    if head_dim is not None and not t.head_dim and head_dim * heads != embed:
        raise ValueError(f"head_dim: {hf_type} fixes the head size to embed/heads = {embed // heads}")
    b = t.biases[0] if bias is None else parse_bias(bias)
    if b not in t.biases:
        named = " or ".join(repr(x or "none") for x in t.biases)
        raise ValueError(f"bias: {hf_type} can have biases {named}, not {b or 'none'!r}")
    if t.rotary is None and rope_dims is not None:
        raise ValueError(f"rope_dims: {hf_type} has no rotary embeddings")
    cfg = AttentionConfig(embed, heads, groups=groups, head_dim=head_dim, bias=b, causal=True)
    if t.rotary is None:
        return cfg
    if rope_dims is not None and rope_dims != cfg.D and not t.partial_rope:
        raise ValueError(f"rope_dims: {hf_type} rotates all head dimensions (rope_dims = head_dim = {cfg.D})")
    if rope_dims is None:
        rope_dims = max(2, (cfg.D // 2) // 2 * 2) if t.partial_rope else cfg.D
    return cfg.with_(rope=True, rope_dims=rope_dims)


ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


def build_attention(hf_type: str, cfg: AttentionConfig, *, seed: int = 0, attn_implementation: str = "sdpa"):
    """``(module, forward)``: the real attention module of ``hf_type`` for ``cfg`` in float64, with
    seeded random weights (every parameter, biases included, ``N(0, 1/E)``), and ``forward(call, x)``
    that runs it as causal self-attention on hidden states ``x`` ``(B, L, E)``. ``attn_implementation``:
    ``"sdpa"`` computes in the input's float64; ``"eager"`` runs some models' softmax in float32."""
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation: expected one of {', '.join(ATTN_IMPLEMENTATIONS)}, got {attn_implementation!r}"
        )
    tf = _transformers()
    t = HF_TYPES[hf_type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = importlib.import_module(f"transformers.models.{t.module}.modeling_{t.module}")
    config = getattr(tf, t.config)(**t.config_kwargs(cfg, attn_implementation))
    attn = getattr(mod, t.attention)(config, layer_idx=0).to(torch.float64).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / cfg.E**0.5)
    rotary = getattr(mod, t.rotary)(config=config) if t.rotary else None
    built = getattr(attn, "rotary_ndims", None)
    if built is not None and built != cfg.R:
        raise HFAuditError(f"{hf_type}: the module was built with {built} rotary dims, not the {cfg.R} asked for")

    def forward(call: Callable, x: torch.Tensor) -> torch.Tensor:
        # sdpa's math kernel: exact float64 and differentiable in forward mode (the fused CPU kernel is not)
        with sdpa_kernel([SDPBackend.MATH]):
            if rotary is None:
                return call(x)[0]
            pos = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
            cos, sin = rotary(x, pos)
            return call(x, attention_mask=None, position_embeddings=(cos.to(x.dtype), sin.to(x.dtype)))[0]

    return attn, forward


def audit_hf(
    hf_type: str,
    *,
    embed: int = 32,
    heads: int = 4,
    groups: int | None = None,
    head_dim: int | None = None,
    rope_dims: int | None = None,
    bias: str | None = None,
    seed: int = 0,
    rtol: float = RTOL,
    check: bool = True,
    attn_implementation: str = "sdpa",
    max_memory: float | None = None,
) -> AuditResult:
    """Audit the real ``hf_type`` attention module at a small width: ``unidentified`` from the Jacobian
    rank, ``details["theory_unidentified"]`` from :func:`attnid.counting.count` of the equivalent config.

    With ``check`` (default) a difference, or a singular-value gap below ``MIN_GAP`` (float32 arithmetic
    inside the module, for example, blurs the rank), raises :class:`HFAuditError`. An audit estimated to
    need more than ``max_memory`` bytes (default: the machine's available memory) is refused before it starts.
    """
    cfg = equivalent_config(
        hf_type, embed=embed, heads=heads, groups=groups, head_dim=head_dim, rope_dims=rope_dims, bias=bias
    )
    module, forward = build_attention(hf_type, cfg, seed=seed, attn_implementation=attn_implementation)
    n = sum(p.numel() for p in module.parameters())
    theory = count(cfg)
    if n != theory.total_params:
        raise HFAuditError(f"{hf_type}: the module has {n} parameters, the equivalent config {theory.total_params}")
    B, L = default_data_size(cfg, n)
    need, free = memory_estimate(n, B * L * cfg.E, "dense"), available_memory()
    limit = free if max_memory is None else max_memory
    if limit is not None and need > limit:
        raise ValueError(
            f"hf: auditing {hf_type} at E = {cfg.E} needs about {need / 2**30:.1f} GiB ({n:,} parameters, "
            f"{B * L * cfg.E:,} outputs), more than the {limit / 2**30:.1f} GiB available; use a smaller --embed"
        )
    x = torch.randn(B, L, cfg.E, generator=torch.Generator().manual_seed(10_000 + seed), dtype=torch.float64)
    res = audit_module(module, (x,), forward=forward, rtol=rtol)
    res.details.update(
        hf_type=hf_type,
        module=f"transformers.models.{HF_TYPES[hf_type].module}.{HF_TYPES[hf_type].attention}",
        transformers=_transformers().__version__,
        theory_unidentified=theory.unidentified,
        config=dict(E=cfg.E, H=cfg.H, G=cfg.G, D=cfg.D, C=cfg.C, R=cfg.R, bias=cfg.bias or "none"),
        batch=B,
        seq_len=L,
        seed=seed,
        attn_implementation=attn_implementation,
    )
    if check and res.sv_gap < MIN_GAP:
        raise HFAuditError(
            f"{hf_type}: the Jacobian's singular values have no clear gap at rank {res.rank} (gap "
            f"{res.sv_gap:.1e} < {MIN_GAP:.0e}): the module probably computes part of the layer in float32; "
            "its count cannot be read off"
        )
    if check and res.unidentified != theory.unidentified:
        raise HFAuditError(
            f"{hf_type}: the Jacobian gives {res.unidentified} unidentified parameters, the closed form "
            f"{theory.unidentified} (config {res.details['config']})"
        )
    return res


def small_structure(cfg: AttentionConfig) -> dict:
    """The structure of ``cfg`` at a width a dense audit handles in seconds: the same kind of key/value
    sharing (MHA, GQA or MQA), the same biases, and RoPE on all, part or none of each head; heads of size
    4, or 8 under partial RoPE (so that the rotated share can be 1/4, 1/2 or 3/4 of a head).
    Returns :func:`audit_hf` keyword arguments."""
    head_dim = 8 if 0 < cfg.R < cfg.D else 4
    n = cfg.H // cfg.G
    if n == 1:  # multi-head: every head its own keys and values
        heads, groups = 4, 4
    elif cfg.G == 1:  # multi-query
        heads, groups = 4, 1
    else:  # grouped-query
        heads, groups = 4, 2
    kw = dict(embed=heads * head_dim, heads=heads, groups=groups, bias=cfg.bias or "none")
    if cfg.rope:
        share = cfg.R / cfg.D
        kw["rope_dims"] = head_dim if share == 1 else min(head_dim - 2, max(2, 2 * round(share * head_dim / 2)))
    return kw


def verify_preset(name: str, *, seed: int = 0) -> AuditResult:
    """Audit the structure of preset ``name`` (:func:`small_structure`) through its real ``transformers``
    module; raises :class:`HFAuditError` unless the Jacobian count equals the closed form."""
    from .presets import PRESETS

    if name not in PRESETS:
        raise ValueError(f"preset: unknown name {name!r}; choose one of {', '.join(PRESETS)}")
    p = PRESETS[name]
    if p.hf_type is None:
        raise ValueError(f"preset: {name} names no transformers model type that attnid can build")
    kw = small_structure(p.config)
    if not HF_TYPES[p.hf_type].groups and kw["groups"] != kw["heads"]:
        raise ValueError(f"preset: {name} shares keys across heads, which {p.hf_type} cannot express")
    return audit_hf(p.hf_type, seed=seed, **kw)


def verify_presets(
    names: list[str] | None = None, *, seed: int = 0, progress: bool = False
) -> dict[str, AuditResult | None]:
    """:func:`verify_preset` for every preset (or ``names``); presets without a model type map to ``None``.
    Presets that share a structure and a model type share one audit. ``progress``: a bar on stderr (which
    leaves a JSON answer on stdout intact)."""
    from .presets import PRESETS

    done: dict[tuple, AuditResult] = {}
    out: dict[str, AuditResult | None] = {}
    todo = names or list(PRESETS)
    if progress:
        from tqdm.auto import tqdm

        todo = tqdm(todo, desc="verifying presets", unit="preset", file=sys.stderr)
    for name in todo:
        p = PRESETS[name]
        if p.hf_type is None:
            out[name] = None
            continue
        key = (p.hf_type, tuple(sorted(small_structure(p.config).items())))
        if key not in done:
            done[key] = verify_preset(name, seed=seed)
        out[name] = done[key]
    return out
