"""The keyword arguments that the ``transformers`` config classes of attnid's families take for an
:class:`~attnid.attention_config.AttentionConfig` (:meth:`attnid.families.HFType.config_kwargs` gathers them):
the classes that name their fields their own way (GPT-2, OPT, BLOOM, Falcon) and the switches of the families of
2025. Plain data, no torch and no transformers."""

from __future__ import annotations

from .attention_config import AttentionConfig

# the types whose mixture is DeepSeek-V3's: a sigmoid router (its experts chosen within groups, its chosen weights
# renormalised where norm_topk_prob) beside shared experts, after the first first_k_dense_replace dense layers
GROUPED_ROUTER_TYPES = ("glm4_moe", "dots1")
GATED_SHARED_TYPES = ("qwen3_next", "qwen3_5_moe")  # a mixture beside a shared expert behind a sigmoid gate


def ffn_kwargs(module: str, ffn: int, fixed: bool = False) -> dict:
    """The config keywords that make ``module``'s MLPs ``ffn`` wide (its experts and shared MLP or expert too); none
    where its code fixes the width (``fixed``: BLOOM)."""
    if fixed:
        return {}
    if module in ("qwen3_moe", "qwen3_vl_moe", "ernie4_5_moe", *GROUPED_ROUTER_TYPES):
        return {"intermediate_size": ffn, "moe_intermediate_size": ffn}
    if module in GATED_SHARED_TYPES:  # its shared expert as wide as each routed one
        shared = {"moe_intermediate_size": ffn, "shared_expert_intermediate_size": ffn}
        return shared if module == "qwen3_5_moe" else {"intermediate_size": ffn, **shared}
    if module == "granitemoehybrid":  # its shared MLP as wide as each expert
        return {"intermediate_size": ffn, "shared_intermediate_size": ffn}
    named = {"gpt2": "n_inner", "opt": "ffn_dim", "falcon": "ffn_hidden_size"}
    return {named.get(module, "intermediate_size"): ffn}


def expert_kwargs(module: str, experts: int, dense_allowed: bool = False) -> dict:
    """The config keywords of a mixture of ``experts`` experts, two chosen per token, in every layer of ``module``
    (none: ``{}``, or where the type may leave its mixture out, ``dense_allowed``, none asked for)."""
    if dense_allowed and not experts:
        return {"num_local_experts": 0}  # Granite 4's dense hybrids: its shared MLP alone
    if not experts:
        return {}
    if module == "hunyuan_v1_moe":  # its experts and its shared MLP all intermediate_size wide
        return dict(num_experts=experts, moe_topk=2)
    if module == "ernie4_5_moe":  # a mixture in every layer, one shared expert
        return dict(moe_num_experts=experts, moe_k=2, moe_num_shared_experts=1, moe_layer_start_index=0,
                    moe_layer_end_index=-1, moe_layer_interval=1)  # fmt: skip
    if module in GROUPED_ROUTER_TYPES:  # DeepSeek-V3's mixture in every layer, one shared expert, and a routed
        # factor other than 1 (absorbed by the experts' weights)
        return dict(n_routed_experts=experts, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=0,
                    n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5)  # fmt: skip
    if module in ("qwen3_moe", "qwen3_next", "qwen3_vl_moe"):  # a mixture in every layer (Qwen3-VL's code
        # renormalises the chosen weights, reading no field)
        norm = {} if module == "qwen3_vl_moe" else {"norm_topk_prob": True}
        return dict(num_experts=experts, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], **norm)
    if module == "qwen3_5_moe":  # a mixture in every layer, its chosen weights renormalised by its code
        return dict(num_experts=experts, num_experts_per_tok=2)
    if module == "llama4":  # one expert chosen per token, as released: its σ is not renormalised
        return {"num_local_experts": experts, "num_experts_per_tok": 1, "moe_layers": [0]}
    return {"num_local_experts": experts, "num_experts_per_tok": 2}  # Mixtral, gpt-oss, Granite 4


def mrope_sections(pairs: int) -> list[int]:
    """The rotated pairs of a head shared out among M-RoPE's three position streams (time, height, width), the
    first streams taking one more where they do not divide evenly (Qwen2.5-VL's released [16, 24, 24] gives the time
    stream fewer; any split of the pairs has the same count)."""
    return [pairs // 3 + (1 if i < pairs % 3 else 0) for i in range(3)]


def mrope_parameters(cfg: AttentionConfig, interleaved: bool, partial: bool) -> dict:
    """The ``rope_parameters`` of an M-RoPE layer for ``cfg``: its rotated pairs (``cfg.R / 2``, a share of the head
    where the family rotates part of it, ``partial``: Qwen3.5) shared out among the three streams as evenly as the
    head allows (:func:`mrope_sections`), dealt in turn where the family interleaves them (Qwen3-VL, Qwen3.5)."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_base, "mrope_section": mrope_sections(cfg.R // 2)}
    if partial:  # given even where R = D (the class's default share is a quarter); transformers takes
        # int(D * factor) rotary dims: the factor aimed at the middle of [R, R + 1)
        rope["partial_rotary_factor"] = (cfg.R + 0.5) / cfg.D
    return {**rope, "mrope_interleaved": True} if interleaved else rope


def falcon_kwargs(cfg: AttentionConfig, common: dict, residual: str) -> dict:
    """Falcon's config keywords for ``cfg`` wired ``residual``. Its code chooses the layer from three switches:
    ``parallel_attn`` off, a sequential block (Falcon RW); on, one LayerNorm before attention and MLP side by side
    (``"shared_norm"``: Falcon-7B); ``new_decoder_architecture`` (Falcon-40B and 180B) with
    ``num_ln_in_parallel_attn`` 2 (its default), a LayerNorm for each (``"parallel"``), or 1 (Falcon 2). Keys and
    values are shared by every head (``multi_query``) or none outside the new architecture, by ``num_kv_heads``
    groups in it."""
    E, H, G = cfg.E, cfg.H, cfg.G
    kw = dict(common, hidden_size=E, num_attention_heads=H, bias=bool(cfg.bias), alibi=False, hidden_dropout=0.0,
              attention_dropout=0.0, ffn_hidden_size=4 * E, activation="gelu", bos_token_id=0, eos_token_id=0,
              rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base})  # fmt: skip
    if residual == "parallel" or G not in (1, H):
        if residual == "sequential":
            raise ValueError(f"groups: Falcon's sequential layer shares keys and values across every head "
                             f"(multi_query) or none: groups 1 or {H}, not {G}")  # fmt: skip
        return dict(kw, new_decoder_architecture=True, parallel_attn=True, num_kv_heads=G,
                    num_ln_in_parallel_attn=2 if residual == "parallel" else 1)  # fmt: skip
    return dict(kw, new_decoder_architecture=False, parallel_attn=residual == "shared_norm", multi_query=G < H,
                num_kv_heads=G)  # fmt: skip


CLASSIC_TYPES = ("gpt2", "opt", "bloom", "falcon")  # classes that name their fields their own way


def classic_kwargs(name: str, cfg: AttentionConfig, common: dict, residual: str) -> dict:
    """The config keywords of GPT-2, OPT, BLOOM and Falcon (its layers wired ``residual``: :func:`falcon_kwargs`),
    whose classes name their fields their own way."""
    if name == "falcon":
        return falcon_kwargs(cfg, common, residual)
    E, H = cfg.E, cfg.H
    if name == "gpt2":
        return dict(
            common, n_embd=E, n_head=H, n_positions=64, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
    if name == "opt":
        return dict(
            common, hidden_size=E, num_attention_heads=H, ffn_dim=4 * E, enable_bias=bool(cfg.bias), dropout=0.0
        )
    # BLOOM: its MLP is 4E wide by its code
    return dict(common, hidden_size=E, n_head=H, hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=0,
                eos_token_id=0, pad_token_id=0)  # fmt: skip


# the types whose config switches their attention biases with attention_bias
ATTENTION_BIAS_TYPES = (
    "llama",
    "qwen3",
    "olmo2",
    "olmo3",
    "gemma2",
    "gemma3",
    "gpt_oss",
    "qwen3_moe",
    "smollm3",
    "granite",
    "glm4",
    "glm4_moe",
    "dots1",
    "hunyuan_v1_moe",
    "llama4",
    "qwen3_next",
    "bamba",
    "granitemoehybrid",
    "arcee",
    "cohere",
    "cohere2",
    "apertus",
    "qwen3_vl",
    "qwen3_vl_moe",
    "qwen3_5",
    "qwen3_5_moe",
)


def recent_kwargs(name: str, cfg: AttentionConfig, rope_in_windows: str = "") -> dict:
    """What the config classes of the 2025 families need beyond the common keywords (``rope_in_windows``: the
    family's :attr:`attnid.families.HFType.rope_in_windows`)."""
    no_ids: dict = dict(pad_token_id=None, bos_token_id=None, eos_token_id=None)  # outside a tiny vocabulary
    if name == "smollm3":  # the audited layer may be a NoPE one
        return no_ids if cfg.rope else {**no_ids, "no_rope_layers": [0]}
    switches = {  # the family's own switches of biases and QK-norm
        "phi3": {}, "glm4": {}, "starcoder2": dict(use_bias=bool(cfg.bias)), "ernie4_5": dict(use_bias=bool(cfg.bias)),
        "ernie4_5_moe": dict(use_bias=bool(cfg.bias)),
        "stablelm": dict(use_qkv_bias=bool(cfg.bias), qk_layernorm=cfg.qk_norm == "layer"),
        "cohere": dict(use_qk_norm=cfg.qk_norm == "layer"), "glm4_moe": dict(use_qk_norm=cfg.qk_norm == "head"),
        "dots1": {}, "qwen2_5_vl": {}, "qwen3_vl": {}, "qwen3_vl_moe": {}, "hunyuan_v1_moe": {}, "arcee": {},
        "apertus": {},
    }  # fmt: skip
    if name in switches:
        return dict(no_ids, **switches[name])
    if name == "seed_oss":  # its q/k/v biases and its output bias switched apart
        return dict(no_ids, attention_bias="q" in cfg.bias, attention_out_bias="o" in cfg.bias, residual_dropout=0.0)
    if rope_in_windows:  # RoPE in the sliding-window layers only: the audited layer one of them or
        # a full-attention (NoPE) one; the window longer than any audit's input
        kind = "sliding_attention" if cfg.rope else "full_attention"
        return dict(no_ids, layer_types=[kind], sliding_window=4096)
    if name == "olmo3":  # one full-attention layer (its sliding-window layers differ only in the mask)
        return {"layer_types": ["full_attention"]}
    if name == "granitemoehybrid":  # one NoPE attention layer; Mamba-2's sizes small enough for a tiny width
        return dict(no_ids, layer_types=["full_attention"], position_embedding_type=None, mamba_n_heads=2,
                    mamba_d_state=4, mamba_chunk_size=4)  # fmt: skip
    if name == "bamba":  # one attention layer (its code rotates half of each head whatever it is given)
        return dict(
            no_ids, attn_layer_indices=[0], mlp_bias=False, mamba_n_heads=2, mamba_d_state=4, mamba_chunk_size=4
        )
    if name == "lfm2":  # one attention layer, its MLP as wide as asked, its norms' ε under one name
        return dict(no_ids, layer_types=["full_attention"], block_auto_adjust_ff_dim=False, norm_eps=cfg.qk_norm_eps)
    if name in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):  # one full (softmax) attention layer
        return dict(no_ids, layer_types=["full_attention"])
    if name == "llama4":  # the audited layer a RoPE one (L2 QK-norm) or a NoPE one with a temperature that varies
        # over the audit's positions (floor_scale 2: the scale changes every second token); no chunking at this length
        return dict(no_ids, no_rope_layers=[1 if cfg.rope else 0], use_qk_norm=cfg.qk_norm == "l2",
                    attn_temperature_tuning=True, floor_scale=2, attn_scale=0.1, moe_layers=[],
                    intermediate_size_mlp=4 * cfg.E,
                    rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base})  # fmt: skip
    if name == "gpt_oss":  # one full-attention layer, plain RoPE at cfg's base
        return dict(
            layer_types=["full_attention"], rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base}
        )
    return {}
