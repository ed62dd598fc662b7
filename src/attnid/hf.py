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
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .attention import AttentionConfig, parse_bias
from .audit import (
    RTOL,
    AuditResult,
    audit_module,
    available_memory,
    check_seed,
    default_data_size,
    default_seq_len,
    memory_estimate,
)
from .counting import SCOPES, BlockConfig, ModelConfig, count, count_block, count_model

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
    # the whole decoder layer and model (chapter 8)
    layer: str = ""  # its decoder-layer class
    lm: str = ""  # its causal-LM class
    norm: str = "layer"  # counting.NORMS
    mlp: str = "gelu"  # counting.MLPS
    residual: str = "sequential"  # counting.RESIDUALS
    ffn_ratio: float = 4.0  # the type's usual MLP inner size over E
    positions: str = "rope"  # counting.POSITIONS
    unused_positions: int = 0  # position rows never read (OPT's offset of 2)
    tied: bool = False  # the type's default for tie_word_embeddings
    head_bias: bool = False  # a bias on the LM head

    def mlp_bias(self, bias: str) -> bool:
        """Whether the MLP maps carry biases when the attention has biases ``bias``."""
        if self.mlp == "swiglu":
            return False
        return bool(bias) if self.module == "opt" else True

    def ffn_kwargs(self, ffn: int) -> dict:
        return {"gpt2": {"n_inner": ffn}, "opt": {"ffn_dim": ffn}}.get(self.module, {"intermediate_size": ffn})

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
    "gpt2": HFType(
        "gpt2", "GPT2Config", "GPT2Attention", None, biases=("qkvo",),
        layer="GPT2Block", lm="GPT2LMHeadModel", positions="learned", tied=True,
    ),
    "opt": HFType(
        "opt", "OPTConfig", "OPTAttention", None, biases=("qkvo", ""),
        layer="OPTDecoderLayer", lm="OPTForCausalLM", mlp="relu", positions="learned", unused_positions=2,
        tied=True,
    ),
    "llama": HFType(
        "llama", "LlamaConfig", "LlamaAttention", "LlamaRotaryEmbedding", biases=("", "qkvo"), groups=True,
        head_dim=True, layer="LlamaDecoderLayer", lm="LlamaForCausalLM", norm="rms", mlp="swiglu", ffn_ratio=8 / 3,
    ),
    "mistral": HFType(
        "mistral", "MistralConfig", "MistralAttention", "MistralRotaryEmbedding", biases=("",), groups=True,
        head_dim=True, layer="MistralDecoderLayer", lm="MistralForCausalLM", norm="rms", mlp="swiglu", ffn_ratio=8 / 3,
    ),
    "qwen2": HFType(
        "qwen2", "Qwen2Config", "Qwen2Attention", "Qwen2RotaryEmbedding", biases=("qkv",), groups=True,
        layer="Qwen2DecoderLayer", lm="Qwen2ForCausalLM", norm="rms", mlp="swiglu", ffn_ratio=8 / 3,
    ),
    "gpt_neox": HFType(
        "gpt_neox", "GPTNeoXConfig", "GPTNeoXAttention", "GPTNeoXRotaryEmbedding", biases=("qkvo", ""),
        partial_rope=True, layer="GPTNeoXLayer", lm="GPTNeoXForCausalLM", residual="parallel",
    ),
    "phi": HFType(
        "phi", "PhiConfig", "PhiAttention", "PhiRotaryEmbedding", biases=("qkvo",), groups=True, partial_rope=True,
        layer="PhiDecoderLayer", lm="PhiForCausalLM", residual="shared_norm", head_bias=True,
    ),
}  # fmt: skip


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
        raise ValueError(f"rope/rope_dims: {hf_type} has no rotary embeddings (drop --rope and --rope-dims)")
    cfg = AttentionConfig(embed, heads, groups=groups, head_dim=head_dim, bias=b, causal=True)
    if t.rotary is None:
        return cfg
    if rope_dims is not None and rope_dims != cfg.D and not t.partial_rope:
        raise ValueError(f"rope_dims: {hf_type} rotates all head dimensions (rope_dims = head_dim = {cfg.D})")
    if rope_dims is None and not t.partial_rope:
        return cfg.with_(rope=True)  # an odd head_dim is refused as such, not as a rope_dims nobody gave
    if rope_dims is None:
        rope_dims = max(2, (cfg.D // 2) // 2 * 2)
    return cfg.with_(rope=True, rope_dims=rope_dims)


ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


def _hf_config(hf_type: str, cfg: AttentionConfig, attn_implementation: str = "sdpa", **changes):
    """The ``transformers`` config object of ``hf_type`` for ``cfg``, with ``changes`` on top."""
    tf = _transformers()
    t = HF_TYPES[hf_type]
    return getattr(tf, t.config)(**dict(t.config_kwargs(cfg, attn_implementation), **changes))


def _modeling(hf_type: str):
    _transformers()  # says how to install it when it is missing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = HF_TYPES[hf_type].module
        return importlib.import_module(f"transformers.models.{m}.modeling_{m}")


def _is_norm(m: torch.nn.Module) -> bool:
    return isinstance(m, torch.nn.LayerNorm) or type(m).__name__.endswith("RMSNorm")


def _rms_norm_float64(self, x: torch.Tensor) -> torch.Tensor:
    # transformers' RMSNorm computes in float32 whatever the input; the audit needs the float64 function
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _prepare(
    module: torch.nn.Module, E: int, seed: int, norm_eps: float | None = None, exact_norms: bool = True
) -> torch.nn.Module:
    """float64, eval mode, seeded random weights: ``N(0, 1/E)`` for every map and bias, ``1 + 0.3 N(0, 1)``
    for norm weights and ``0.3 N(0, 1)`` for norm shifts (generic, not the identity). With ``exact_norms``
    RMSNorm computes in float64 (its float32 cast patched out); ``ε = norm_eps`` when given."""
    module = module.to(torch.float64).eval()
    norm_params = {id(p): name for m in module.modules() if _is_norm(m) for name, p in m.named_parameters()}
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            z = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if id(p) in norm_params:
                p.copy_((1.0 if norm_params[id(p)] == "weight" else 0.0) + 0.3 * z)
            else:
                p.copy_(z / E**0.5)
    for m in module.modules():
        if type(m).__name__.endswith("RMSNorm"):
            if exact_norms:
                m.forward = types.MethodType(_rms_norm_float64, m)
            if norm_eps is not None:
                setattr(m, "variance_epsilon", norm_eps)
        elif isinstance(m, torch.nn.LayerNorm) and norm_eps is not None:
            m.eps = norm_eps
    return module


def _hidden_forward(rotary):
    """``forward(call, x)``: a module on hidden states ``x`` ``(B, L, E)`` through sdpa's math kernel (exact
    float64 and differentiable in forward mode; the fused CPU kernel is not), with the rotary tables."""

    def forward(call: Callable, x: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel([SDPBackend.MATH]):
            if rotary is None:
                out = call(x)
            else:
                pos = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
                cos, sin = rotary(x, pos)
                out = call(x, attention_mask=None, position_embeddings=(cos.to(x.dtype), sin.to(x.dtype)))
        return out[0] if isinstance(out, tuple) else out

    return forward


def build_attention(hf_type: str, cfg: AttentionConfig, *, seed: int = 0, attn_implementation: str = "sdpa"):
    """``(module, forward)``: the real attention module of ``hf_type`` for ``cfg`` in float64, with
    seeded random weights (every parameter, biases included, ``N(0, 1/E)``), and ``forward(call, x)``
    that runs it as causal self-attention on hidden states ``x`` ``(B, L, E)``. ``attn_implementation``:
    ``"sdpa"`` computes in the input's float64; ``"eager"`` runs some models' softmax in float32."""
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation: expected one of {', '.join(ATTN_IMPLEMENTATIONS)}, got {attn_implementation!r}"
        )
    t = HF_TYPES[hf_type]
    mod = _modeling(hf_type)
    config = _hf_config(hf_type, cfg, attn_implementation)
    attn = _prepare(getattr(mod, t.attention)(config, layer_idx=0), cfg.E, seed)
    rotary = getattr(mod, t.rotary)(config=config) if t.rotary else None
    built = getattr(attn, "rotary_ndims", None)
    if built is not None and built != cfg.R:
        raise HFAuditError(f"{hf_type}: the module was built with {built} rotary dims, not the {cfg.R} asked for")
    return attn, _hidden_forward(rotary)


def default_ffn(hf_type: str, embed: int) -> int:
    """The MLP inner size of ``hf_type`` at width ``embed``: its usual ratio (4, or 8/3 for SwiGLU), rounded."""
    return max(1, round(HF_TYPES[hf_type].ffn_ratio * embed))


def block_config(hf_type: str, cfg: AttentionConfig, ffn: int) -> BlockConfig:
    """The :class:`~attnid.counting.BlockConfig` of one ``hf_type`` decoder layer around ``cfg``."""
    t = HF_TYPES[hf_type]
    return BlockConfig(cfg, ffn, norm=t.norm, mlp=t.mlp, mlp_bias=t.mlp_bias(cfg.bias), residual=t.residual)


def build_block(hf_type: str, cfg: AttentionConfig, *, ffn: int, seed: int = 0):
    """``(module, forward)``: one whole decoder layer of ``hf_type`` (norms, attention, MLP, residual
    connections) in float64 with seeded random weights (:func:`_prepare`), run on hidden states."""
    t = HF_TYPES[hf_type]
    mod = _modeling(hf_type)
    config = _hf_config(hf_type, cfg, **t.ffn_kwargs(ffn))
    layer = _prepare(getattr(mod, t.layer)(config, layer_idx=0), cfg.E, seed)
    attn = next(m for m in layer.modules() if type(m).__name__ == t.attention)
    built = getattr(attn, "rotary_ndims", None)
    if built is not None and built != cfg.R:
        raise HFAuditError(f"{hf_type}: the layer was built with {built} rotary dims, not the {cfg.R} asked for")
    return layer, _hidden_forward(getattr(mod, t.rotary)(config=config) if t.rotary else None)


def default_vocab(hf_type: str, embed: int, ffn: int) -> int:
    """A vocabulary for a tiny whole-model audit. In a parallel block the first layer's MLP reads the token
    embedding alone, so it is seen at ``V`` points only: ``V = 3F`` keeps it identified; ``3E`` elsewhere."""
    return 3 * ffn if HF_TYPES[hf_type].residual != "sequential" else max(16, 3 * embed)


def model_config(
    hf_type: str, cfg: AttentionConfig, *, ffn: int, layers: int, vocab: int, tied: bool, seq_len: int, norm_eps: float
) -> ModelConfig:
    """The :class:`~attnid.counting.ModelConfig` of a tiny ``hf_type`` causal LM read on ``seq_len`` tokens."""
    t = HF_TYPES[hf_type]
    return ModelConfig(
        block_config(hf_type, cfg, ffn), layers, vocab, tied=tied, positions=t.positions,
        context=seq_len if t.positions == "learned" else 0, unused_positions=t.unused_positions,
        head_bias=t.head_bias, norm_eps_zero=norm_eps == 0,
    )  # fmt: skip


def build_model(
    hf_type: str, cfg: AttentionConfig, *, ffn: int, layers: int, vocab: int, tied: bool, seq_len: int,
    norm_eps: float = 0.0, seed: int = 0, exact_norms: bool = True,
):  # fmt: skip
    """``(module, forward)``: a whole ``hf_type`` causal LM (embeddings, ``layers`` decoder layers, final
    norm, LM head) with ``seq_len`` positions, norms at ``ε = norm_eps`` (``exact_norms=False`` keeps
    transformers' float32 RMSNorm); ``forward(call, ids)`` gives the next-token log-probabilities
    ``(B, L, vocab)``."""
    t = HF_TYPES[hf_type]
    tf = _transformers()
    changes = dict(t.ffn_kwargs(ffn), vocab_size=vocab, num_hidden_layers=layers, tie_word_embeddings=tied)
    if hf_type == "gpt2":
        changes["n_positions"] = seq_len
    if hf_type == "opt":
        changes.update(max_position_embeddings=seq_len, word_embed_proj_dim=cfg.E)
    config = _hf_config(hf_type, cfg, **changes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _prepare(getattr(tf, t.lm)(config), cfg.E, seed, norm_eps=norm_eps, exact_norms=exact_norms)

    def forward(call: Callable, ids: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel([SDPBackend.MATH]):
            return torch.log_softmax(call(input_ids=ids, use_cache=False).logits, dim=-1)

    return model, forward


def _positive_int(name: str, v) -> None:
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        raise ValueError(f"{name} must be a positive integer, got {v!r}")


NEAR_NULL_BAND = (1e-9, 1e-5)  # singular values this far below the largest are reported as near-null


RELU_MIN_SHARE = 0.01  # a ReLU unit active (or inactive) on fewer of the audit's tokens is barely excited


def _check_relu_units(model: torch.nn.Module, forward: Callable, ids: torch.Tensor) -> None:
    """Refuse a model audit in which a ReLU unit hardly ever switches on the audit's tokens: a unit that is
    always off (or on) makes its weights unidentified (or linear), so the count would describe the data,
    not the architecture. Inside a tiny LM the first layers see few distinct inputs, so it happens."""
    shares = []
    hooks = [m.register_forward_hook(lambda mod, i, o: shares.append((o > 0).double().reshape(-1, o.shape[-1]).mean(0)))
             for name, m in model.named_modules() if name.endswith("fc1")]  # fmt: skip
    with torch.no_grad():
        forward(lambda **kw: model(**kw), ids)
    for h in hooks:
        h.remove()
    for layer, share in enumerate(shares):
        worst = float(torch.minimum(share, 1 - share).min())
        if worst < RELU_MIN_SHARE:
            raise HFAuditError(
                f"relu: a unit of layer {layer} switches on only {worst:.1%} of the audit's tokens, so its weights "
                "are barely excited and the count would describe the data, not the architecture; try another --seed"
            )


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
    scope: str = "attention",
    ffn: int | None = None,
    layers: int = 1,
    vocab: int | None = None,
    tied: bool | None = None,
    norm_eps: float = 0.0,
    progress: bool = False,
) -> AuditResult:
    """Audit a real ``hf_type`` module at a small width: ``unidentified`` from the Jacobian rank,
    ``details["theory_unidentified"]`` from the closed form.

    ``scope``: ``"attention"`` (the attention module; :func:`attnid.counting.count` of the equivalent
    config), ``"block"`` (one whole decoder layer with MLP inner size ``ffn``, default
    :func:`default_ffn`; :func:`attnid.counting.count_block`) or ``"model"`` (a causal LM of ``layers``
    layers, ``vocab`` tokens (default :func:`default_vocab`), the type's head tying unless ``tied`` is
    given, norms at ``ε = norm_eps``, read through ``log_softmax``; :func:`attnid.counting.count_model`).
    ``details["terms"]`` holds the closed form term by term, ``details["near_null"]`` the number of
    singular values in :data:`NEAR_NULL_BAND` below the largest (with ``ε > 0`` the stream's scale
    direction lands there).

    With ``check`` (default) a difference, or a singular-value gap below ``MIN_GAP`` (float32 arithmetic
    inside the module, for example, blurs the rank), raises :class:`HFAuditError`. An audit estimated to
    need more than ``max_memory`` bytes (default: the machine's available memory) is refused before it starts.
    ``progress``: a large audit says on stderr what it is doing (stdout stays free for JSON).
    """
    check_seed(seed)
    if scope not in SCOPES:
        raise ValueError(f"scope: expected one of {', '.join(SCOPES)}, got {scope!r}")
    for name, v in (("ffn", ffn), ("layers", layers), ("vocab", vocab)):
        _positive_int(name, v)
    if isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)) or not 0 <= norm_eps < 1:
        raise ValueError(f"norm_eps must be a number in [0, 1), got {norm_eps!r}")
    if scope != "model" and (vocab is not None or tied is not None or layers != 1):
        raise ValueError("layers/vocab/tied: only a whole-model audit (scope 'model') has them")
    if scope == "attention" and ffn is not None:
        raise ValueError("ffn: the attention module has no MLP; audit a block or a model")
    if scope != "attention" and attn_implementation != "sdpa":
        raise ValueError("attn_implementation: blocks and models are audited through sdpa only")
    cfg = equivalent_config(
        hf_type, embed=embed, heads=heads, groups=groups, head_dim=head_dim, rope_dims=rope_dims, bias=bias
    )
    t = HF_TYPES[hf_type]
    gen = torch.Generator().manual_seed(10_000 + seed)
    seq_len = default_seq_len(cfg)
    # the closed form first: the memory check reads the shapes alone, before anything is allocated
    if scope == "attention":
        theory = count(cfg)
        described = f"transformers.models.{t.module}.{t.attention}"
    else:
        if t.norm == "layer" and cfg.E < 4:
            raise ValueError(
                f"embed: a LayerNorm over {cfg.E} feature(s) leaves too little to tell directions apart (E = 1 is "
                "constant, E = 2 a sign, E = 3 gives no clear gap); use --embed 4 or more"
            )
        ffn = ffn or default_ffn(hf_type, cfg.E)
        if scope == "block":
            theory = count_block(block_config(hf_type, cfg, ffn))
            described = f"transformers.models.{t.module}.{t.layer}"
        else:
            vocab = vocab or default_vocab(hf_type, cfg.E, ffn)
            if vocab <= cfg.E:
                raise ValueError(
                    f"vocab: {vocab} tokens show the {cfg.E}-dimensional stream through only {vocab - 1} "
                    f"log-probabilities, too few to identify it (the count would describe the data); use more "
                    f"than {cfg.E} (default {default_vocab(hf_type, cfg.E, ffn)})"
                )
            if tied and t.head_bias:
                raise ValueError(f"tied: the {hf_type} LM head has a bias, so it cannot be tied to the embedding")
            if t.residual != "sequential" and vocab < default_vocab(hf_type, cfg.E, ffn):
                raise ValueError(
                    f"vocab: in a {hf_type} model the first layer's MLP reads the token embedding alone, so a "
                    f"vocabulary of {vocab} leaves it under-determined and the count would describe the data; "
                    f"use at least {default_vocab(hf_type, cfg.E, ffn)} (3 x ffn, the default)"
                )
            tied = t.tied if tied is None else tied
            mc = model_config(
                hf_type, cfg, ffn=ffn, layers=layers, vocab=vocab, tied=tied, seq_len=seq_len, norm_eps=norm_eps
            )
            theory = count_model(mc)
            described = f"transformers.{t.lm}"
    n = theory.total_params
    if scope == "attention":
        B, L = default_data_size(cfg, n)
    else:  # each token carries at most E informative outputs (the final norm's width, for a model)
        L = seq_len
        B = max(2, -(-3 * n // (cfg.E * L)))
    n_out = B * L * (vocab if scope == "model" and vocab else cfg.E)
    need, free = memory_estimate(n, n_out, "dense"), available_memory()
    limit = free if max_memory is None else max_memory
    if limit is not None and need > limit:
        raise ValueError(
            f"hf: auditing the {hf_type} {scope} at E = {cfg.E} needs about {need / 2**30:,.3g} GiB ({n:,} "
            f"parameters, {n_out:,} outputs), more than the {limit / 2**30:.3g} GiB available (free memory, "
            "ulimit -v and the cgroup limit); use a smaller --embed"
            + ("" if scope == "attention" else ", --ffn")
            + (", --vocab or --layers" if scope == "model" else "")
        )
    if scope == "attention":
        module, forward = build_attention(hf_type, cfg, seed=seed, attn_implementation=attn_implementation)
    elif scope == "block":
        assert ffn is not None
        module, forward = build_block(hf_type, cfg, ffn=ffn, seed=seed)
    else:
        assert ffn is not None and vocab is not None and tied is not None
        module, forward = build_model(
            hf_type, cfg, ffn=ffn, layers=layers, vocab=vocab, tied=tied, seq_len=seq_len, norm_eps=norm_eps,
            seed=seed,
        )  # fmt: skip
    built = sum(p.numel() for p in module.parameters())
    if built != n:
        raise HFAuditError(f"{hf_type}: the module has {built} parameters, the closed form counts {n}")
    if scope == "model":
        assert vocab is not None
        x = torch.randint(0, vocab, (B, L), generator=gen)
    else:
        x = torch.randn(B, L, cfg.E, generator=gen, dtype=torch.float64)
    if scope == "model" and t.mlp == "relu":
        _check_relu_units(module, forward, x)
    res = audit_module(module, (x,), forward=forward, rtol=rtol, progress=progress)
    sv = torch.tensor(res.singular_values or [1.0])
    rel = sv / sv[0]
    lo, hi = NEAR_NULL_BAND
    res.details.update(
        hf_type=hf_type,
        scope=scope,
        module=described,
        transformers=_transformers().__version__,
        theory_unidentified=theory.unidentified,
        terms=theory.unidentified_by_block,
        config=dict(E=cfg.E, H=cfg.H, G=cfg.G, D=cfg.D, C=cfg.C, R=cfg.R, bias=cfg.bias or "none"),
        batch=B,
        seq_len=L,
        seed=seed,
        attn_implementation=attn_implementation,
        near_null=int(((rel > lo) & (rel <= hi)).sum()),
    )
    if scope != "attention":
        res.details.update(ffn=ffn, norms="float64 (transformers' RMSNorm float32 cast patched out)")
    if scope == "model":
        res.details.update(layers=layers, vocab=vocab, tied=tied, norm_eps=norm_eps)
    if check and res.sv_gap < MIN_GAP:
        raise HFAuditError(
            f"{hf_type}: the Jacobian's singular values have no clear gap at rank {res.rank} (gap "
            f"{res.sv_gap:.1e} < {MIN_GAP:.0e}, {res.details['near_null']} near-null): "
            + (
                "the module probably computes part of the layer in float32; its count cannot be read off"
                if scope == "attention" or norm_eps == 0
                else f"with ε = {norm_eps:g} the stream's scale is only nearly a symmetry; audit with ε = 0"
            )
        )
    if check and res.unidentified != theory.unidentified:
        raise HFAuditError(
            f"{hf_type}: the Jacobian gives {res.unidentified} unidentified parameters, the closed form "
            f"{theory.unidentified} (scope {scope}, config {res.details['config']})"
        )
    return res


def small_structure(cfg: AttentionConfig) -> dict:
    """The structure of ``cfg`` at a width a dense audit handles in about a second: the same kind of
    key/value sharing (MHA, GQA or MQA), the same biases, and RoPE on all, part or none of each head;
    4 heads of size 4, or under partial RoPE heads of size 8 (so that the rotated share can be 1/4, 1/2
    or 3/4 of a head), 2 of them for MHA (E = 16 either way). Returns :func:`audit_hf` keyword arguments."""
    partial = 0 < cfg.R < cfg.D
    head_dim = 8 if partial else 4
    n = cfg.H // cfg.G
    if n == 1:  # multi-head: every head its own keys and values
        heads = groups = 2 if partial else 4
    elif cfg.G == 1:  # multi-query
        heads, groups = 4, 1
    else:  # grouped-query
        heads, groups = 4, 2
    kw = dict(embed=heads * head_dim, heads=heads, groups=groups, bias=cfg.bias or "none")
    if cfg.rope:
        share = cfg.R / cfg.D
        kw["rope_dims"] = head_dim if share == 1 else min(head_dim - 2, max(2, 2 * round(share * head_dim / 2)))
    return kw


def small_block_structure(name: str) -> dict:
    """The structure of preset ``name`` as a whole decoder layer at ``E = 8``, where a dense audit of the
    layer takes about a second: the same sharing (2 heads for MHA, 4 heads in 1 or 2 groups for MQA/GQA),
    the same biases, RoPE on all, part (one head of 8 dims) or none of each head, and the preset's MLP
    ratio ``F/E``. Returns :func:`audit_hf` keyword arguments."""
    from .presets import PRESETS

    p = PRESETS[name]
    cfg = p.config
    kw = small_structure(cfg)
    if 0 < cfg.R < cfg.D:  # partial RoPE: one head of 8 dims keeps the rotated share
        kw.update(embed=8, heads=1, groups=1)
    elif kw["heads"] == kw["groups"]:
        kw.update(embed=8, heads=2, groups=2)
    else:
        kw.update(embed=8)
    if cfg.rope and cfg.R == cfg.D:
        kw["rope_dims"] = kw["embed"] // kw["heads"]
    assert p.model is not None
    kw["ffn"] = max(1, round(p.model.ffn / cfg.E * kw["embed"]))
    return kw


def verify_preset(name: str, *, seed: int = 0, scope: str = "attention") -> AuditResult:
    """Audit the structure of preset ``name`` through its real ``transformers`` module: its attention
    (:func:`small_structure`) or, with ``scope="block"``, its whole decoder layer
    (:func:`small_block_structure`); raises :class:`HFAuditError` unless the Jacobian count equals the
    closed form."""
    from .presets import PRESETS

    if name not in PRESETS:
        raise ValueError(f"preset: unknown name {name!r}; choose one of {', '.join(PRESETS)}")
    if scope not in ("attention", "block"):
        raise ValueError(f"scope: presets are verified at scope attention or block, not {scope!r}")
    p = PRESETS[name]
    if p.hf_type is None:
        raise ValueError(f"preset: {name} names no transformers model type that attnid can build")
    if scope == "block" and p.model is None:
        raise ValueError(f"preset: {name} has no block structure attnid counts")
    kw = small_structure(p.config) if scope == "attention" else small_block_structure(name)
    if not HF_TYPES[p.hf_type].groups and kw["groups"] != kw["heads"]:
        raise ValueError(f"preset: {name} shares keys across heads, which {p.hf_type} cannot express")
    return audit_hf(p.hf_type, seed=seed, scope=scope, **kw)


def verify_presets(
    names: list[str] | None = None, *, seed: int = 0, progress: bool = False, scope: str = "attention"
) -> dict[str, AuditResult | None]:
    """:func:`verify_preset` for every preset (or ``names``) at ``scope``; presets without a model type
    (or, for blocks, without a counted block) map to ``None``. Presets that share a structure and a model
    type share one audit. ``progress``: a bar on stderr (which leaves a JSON answer on stdout intact)."""
    from .presets import PRESETS

    done: dict[tuple, AuditResult] = {}
    out: dict[str, AuditResult | None] = {}
    todo = names or list(PRESETS)
    if progress:
        from tqdm.auto import tqdm

        todo = tqdm(todo, desc=f"verifying presets ({scope})", unit="preset", file=sys.stderr)
    for name in todo:
        p = PRESETS[name]
        if p.hf_type is None or (scope == "block" and p.model is None):
            out[name] = None
            continue
        kw = small_structure(p.config) if scope == "attention" else small_block_structure(name)
        key = (p.hf_type, tuple(sorted(kw.items())))
        if key not in done:
            done[key] = verify_preset(name, seed=seed, scope=scope)
        out[name] = done[key]
    return out
