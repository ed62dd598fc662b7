"""The Hugging Face model families attnid knows, as plain data: what each ``transformers`` model type can
express (:class:`HFType`, :data:`HF_TYPES`) and the closed-form configs of its attention layer, decoder layer
and tiny model (:func:`equivalent_config`, :func:`block_config`, :func:`model_config`).

It imports neither torch's modules nor transformers: :mod:`attnid.presets` and the ``attnid count`` command
read it without loading them; :mod:`attnid.hf` builds and audits the real modules from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .attention_config import AttentionConfig, parse_bias
from .counting import BIASED_GATED_MLPS, GATED_MLPS, BlockConfig, ModelConfig
from .family_kwargs import (
    ATTENTION_BIAS_TYPES,
    CLASSIC_TYPES,
    classic_kwargs,
    mrope_parameters,
    recent_kwargs,
)


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
    # the other residual wirings its config can choose (Falcon's parallel_attn, new_decoder_architecture)
    other_residuals: tuple[str, ...] = ()
    norm_position: str = "pre"  # counting.NORM_POSITIONS
    ffn_ratio: float = 4.0  # the type's usual MLP inner size over E
    positions: str = "rope"  # counting.POSITIONS
    unused_positions: int = 0  # position rows never read (OPT's offset of 2)
    tied: bool = False  # the type's default for tie_word_embeddings
    head_bias: bool = False  # a bias on the LM head
    qk_norm: str = ""  # attention.QK_NORMS: RMSNorm on queries and keys per head ("head") or per projection
    softcap: float | None = None  # the scores capped to c tanh(a / c) (its released c); its attention runs eager
    sinks: bool = False  # a learned sink logit per head in the softmax (gpt-oss); its attention runs eager
    nope_layers: bool = False  # some layers without RoPE (no_rope_layers: SmolLM3, Llama 4; see rope_in_windows)
    # RoPE in the sliding-window layers only, the others NoPE: "only" (Command R7B: with no window set, in none), or
    # "when_windowed" (EXAONE 4: with no window set, in every layer)
    rope_in_windows: str = ""
    nope_qk_norm: bool = True  # its NoPE layers keep the QK-norm (False: Llama 4 normalises in RoPE layers only)
    # the other QK-norm its config can choose (None: none): StableLM 2's qk_layernorm and Cohere's use_qk_norm switch
    # "layer" on, Llama 4's use_qk_norm switches its "l2" off ("")
    other_qk_norm: str | None = None
    output_gate: bool = False  # each head's output gated by a sigmoid of its query's input (Qwen3-Next)
    router: str = ""  # its decoder layer's mixture of experts: counting.ROUTERS ("": one MLP)
    shared_expert: bool = False  # beside the routed experts, one expert every token passes (Llama 4)
    shared_gate: bool = False  # the shared expert's output times a sigmoid of a linear form of the input (Qwen3-Next)
    choice_bias: bool = False  # a parameter per expert that only chooses the experts (ERNIE 4.5's)
    mrope: bool = False  # M-RoPE: each rotated pair turned by one of three position streams (Qwen2.5-VL)
    interleaved_mrope: bool = False  # M-RoPE's streams dealt to the pairs in turn, not in sections (Qwen3-VL)
    fixed_ffn: bool = False  # its code fixes the MLP's inner size to ffn_ratio x E (BLOOM)
    half_rotary: bool = False  # its code fixes the rotary share at one half of each head (Bamba)
    # a hybrid model: (the name its config gives a layer whose mixer is not attention, that mixer:
    # attnid.counting.hybrid.MIXERS); None: every layer is attention
    hybrid: tuple[str, str] | None = None
    embedding_norm: bool = False  # a LayerNorm on the token embeddings (BLOOM): its whole model is not counted
    no_mlp_bias: bool = False  # its MLP has no biases whatever its attention's (Arcee: mlp_bias, default false)
    dense_allowed: bool = False  # its mixture may be left out, experts = 0 (Granite 4's dense hybrids: a shared MLP)

    @property
    def moe(self) -> bool:
        """Whether its decoder layer is a mixture of experts (Mixtral, Qwen3-MoE, gpt-oss)."""
        return bool(self.router)

    def mixer_layer(self) -> tuple[str, str]:
        """``(name, mixer)`` of a hybrid type's layers that are not attention (:attr:`hybrid`), refused for another."""
        if self.hybrid is None:
            raise ValueError(f"hf: {self.module} is not a hybrid model (every layer is attention)")
        return self.hybrid

    @property
    def eager(self) -> bool:
        """Whether its attention runs transformers' eager path (sdpa can neither cap scores nor add a sink)."""
        return self.softcap is not None or self.sinks

    def mlp_bias(self, bias: str) -> bool:
        """Whether the MLP maps carry biases when the attention has biases ``bias``."""
        if self.no_mlp_bias:
            return False
        if self.mlp in GATED_MLPS:
            return self.mlp in BIASED_GATED_MLPS
        return bool(bias) if self.module in ("opt", "starcoder2", "falcon") else True

    def residual_of(self, residual: str | None) -> str:
        """The residual wiring of a layer: ``residual`` (None: the type's), refused unless the type's config can
        choose it."""
        if residual is None:
            return self.residual
        choices = (self.residual, *self.other_residuals)
        if residual not in choices:
            raise ValueError(f"residual: {self.module}'s layers are wired {' or '.join(map(repr, choices))}, not "
                             f"{residual!r}")  # fmt: skip
        return residual

    def qk_norms(self) -> tuple[str, ...]:
        """The QK-norms this type can have (its default first; "" for none)."""
        return (self.qk_norm,) if self.other_qk_norm is None else (self.qk_norm, self.other_qk_norm)

    def config_kwargs(
        self, cfg: AttentionConfig, attn_implementation: str = "sdpa", residual: str | None = None
    ) -> dict:
        """The keyword arguments of the model's config class for the architecture ``cfg`` (its layers wired
        ``residual``: None, the type's own)."""
        E, H = cfg.E, cfg.H
        common = dict(vocab_size=16, num_hidden_layers=1, attn_implementation=attn_implementation)
        name = self.module
        if name in CLASSIC_TYPES:
            return classic_kwargs(name, cfg, common, self.residual_of(residual))
        kw = dict(common, hidden_size=E, num_attention_heads=H, intermediate_size=4 * E, attention_dropout=0.0)
        if self.groups:
            kw["num_key_value_heads"] = cfg.G
        if self.head_dim:
            kw["head_dim"] = cfg.D
        if name in ATTENTION_BIAS_TYPES:
            kw["attention_bias"] = bool(cfg.bias)
        kw.update(recent_kwargs(name, cfg, self.rope_in_windows))
        if name == "gemma3":  # 1/sqrt(D) as ours, one global (full-attention) layer, no cap
            kw.update(query_pre_attn_scalar=cfg.D, layer_types=["full_attention"], attn_logit_softcapping=None)
        if name == "gemma2":  # its own scale and cap: 1/sqrt(D) as ours, the cap of cfg
            kw.update(
                query_pre_attn_scalar=cfg.D, attn_logit_softcapping=cfg.logit_softcap, final_logit_softcapping=None
            )
        if cfg.qk_norm:
            kw["layer_norm_eps" if cfg.qk_norm == "layer" else "rms_norm_eps"] = cfg.qk_norm_eps
        if name in ("olmo2", "olmo3"):  # its default end-of-text id lies outside the tiny vocabulary
            kw["eos_token_id"] = 0
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
        if self.mrope:
            kw["rope_parameters"] = mrope_parameters(cfg, self.interleaved_mrope, self.partial_rope)
        if name in ("phi", "phi3", "glm4", "glm4_moe", "stablelm", "qwen3_next"):
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
    "phi3": HFType(  # Phi-3 and Phi-4-mini: fused qkv and gate/up maps, rotary on part of each head
        "phi3", "Phi3Config", "Phi3Attention", "Phi3RotaryEmbedding", biases=("",), groups=True, partial_rope=True,
        layer="Phi3DecoderLayer", lm="Phi3ForCausalLM", norm="rms", mlp="swiglu", ffn_ratio=8 / 3,
    ),
    "granite": HFType(  # Llama with fixed multipliers on the embedding, the scores, each branch and the logits
        "granite", "GraniteConfig", "GraniteAttention", "GraniteRotaryEmbedding", biases=("", "qkvo"), groups=True,
        layer="GraniteDecoderLayer", lm="GraniteForCausalLM", norm="rms", mlp="swiglu", ffn_ratio=8 / 3,
    ),
    "starcoder2": HFType(  # GPT-2's block (LayerNorm, GELU, biases on every map or none) with RoPE and GQA
        "starcoder2", "Starcoder2Config", "Starcoder2Attention", "Starcoder2RotaryEmbedding", biases=("qkvo", ""),
        groups=True, layer="Starcoder2DecoderLayer", lm="Starcoder2ForCausalLM", tied=True,
    ),
    "glm4": HFType(  # rotary on half of each head (pairs 2i, 2i + 1), q/k/v biases, norms before and after
        "glm4", "Glm4Config", "Glm4Attention", "Glm4RotaryEmbedding", biases=("qkv", ""), groups=True, head_dim=True,
        partial_rope=True, layer="Glm4DecoderLayer", lm="Glm4ForCausalLM", norm="rms", mlp="swiglu",
        ffn_ratio=8 / 3, norm_position="sandwich",
    ),
    "stablelm": HFType(  # StableLM 2: LayerNorm, rotary on a quarter of each head, q/k/v biases or none, and
        # (qk_layernorm, StableLM 2 12B) a LayerNorm per head on queries and keys
        "stablelm", "StableLmConfig", "StableLmAttention", "StableLmRotaryEmbedding", biases=("", "qkv"), groups=True,
        partial_rope=True, layer="StableLmDecoderLayer", lm="StableLmForCausalLM", mlp="swiglu", ffn_ratio=8 / 3,
        other_qk_norm="layer",
    ),
    "qwen3": HFType(
        "qwen3", "Qwen3Config", "Qwen3Attention", "Qwen3RotaryEmbedding", biases=("", "qkvo"), groups=True,
        head_dim=True, layer="Qwen3DecoderLayer", lm="Qwen3ForCausalLM", norm="rms", mlp="swiglu", ffn_ratio=8 / 3,
        qk_norm="head",
    ),
    "granitemoehybrid": HFType(  # Granite 4's hybrids: NoPE attention layers beside Mamba-2 ones, a mixture of experts
        # (a softmax over the chosen logits) beside a shared MLP in every layer, Granite's fixed multipliers
        "granitemoehybrid", "GraniteMoeHybridConfig", "GraniteMoeHybridAttention", None, biases=("", "qkvo"),
        groups=True, layer="GraniteMoeHybridDecoderLayer", lm="GraniteMoeHybridForCausalLM", norm="rms", mlp="swiglu",
        ffn_ratio=8 / 3, router="softmax", shared_expert=True, hybrid=("linear_attention", "mamba2"),
        dense_allowed=True,
    ),
    "apertus": HFType(  # Apertus: Llama's attention with a QK-norm per head, an MLP of two maps through xIELU (whose
        # two curvatures are parameters), no biases in the MLP
        "apertus", "ApertusConfig", "ApertusAttention", "ApertusRotaryEmbedding", biases=("", "qkvo"), groups=True,
        qk_norm="head", layer="ApertusDecoderLayer", lm="ApertusForCausalLM", norm="rms", mlp="xielu", ffn_ratio=4.0,
        no_mlp_bias=True,
    ),
    "arcee": HFType(  # Arcee's AFM: Llama's attention and norms, an MLP of two maps through ReLU² (no gate, no biases)
        "arcee", "ArceeConfig", "ArceeAttention", "ArceeRotaryEmbedding", biases=("", "qkvo"), groups=True,
        head_dim=True, layer="ArceeDecoderLayer", lm="ArceeForCausalLM", norm="rms", mlp="relu", no_mlp_bias=True,
    ),
    "lfm2": HFType(  # LFM2's attention layers (its short-convolution layers: attnid.counting.short_conv)
        "lfm2", "Lfm2Config", "Lfm2Attention", "Lfm2RotaryEmbedding", biases=("",), groups=True,
        layer="Lfm2DecoderLayer", lm="Lfm2ForCausalLM", norm="rms", mlp="swiglu", ffn_ratio=8 / 3, qk_norm="head",
        tied=True, hybrid=("conv", "short convolution"),
    ),
    "bamba": HFType(  # Bamba's attention layers (its Mamba-2 layers: attnid.counting.mamba); half of each head rotated
        "bamba", "BambaConfig", "BambaAttention", "BambaRotaryEmbedding", biases=("", "qkvo"), groups=True,
        partial_rope=True, half_rotary=True, layer="BambaDecoderLayer", lm="BambaForCausalLM", norm="rms",
        mlp="swiglu", ffn_ratio=8 / 3, hybrid=("linear_attention", "mamba2"),
    ),
    "gemma2": HFType(
        "gemma2", "Gemma2Config", "Gemma2Attention", "Gemma2RotaryEmbedding", biases=("", "qkvo"), groups=True,
        head_dim=True, softcap=50.0, layer="Gemma2DecoderLayer", lm="Gemma2ForCausalLM", norm="rms", mlp="geglu",
        norm_position="sandwich", tied=True,
    ),
    "gemma3": HFType(
        "gemma3", "Gemma3TextConfig", "Gemma3Attention", "Gemma3RotaryEmbedding", biases=("", "qkvo"), groups=True,
        head_dim=True, qk_norm="head", layer="Gemma3DecoderLayer", lm="Gemma3ForCausalLM", norm="rms", mlp="geglu",
        norm_position="sandwich", tied=True,
    ),
    "olmo2": HFType(
        "olmo2", "Olmo2Config", "Olmo2Attention", "Olmo2RotaryEmbedding", biases=("", "qkvo"), groups=True,
        qk_norm="proj", layer="Olmo2DecoderLayer", lm="Olmo2ForCausalLM", norm="rms", mlp="swiglu",
        ffn_ratio=8 / 3, norm_position="post",
    ),
    "olmo3": HFType(  # OLMo 3: OLMo 2's block, three sliding-window layers to one full-attention layer
        "olmo3", "Olmo3Config", "Olmo3Attention", "Olmo3RotaryEmbedding", biases=("", "qkvo"), groups=True,
        qk_norm="proj", layer="Olmo3DecoderLayer", lm="Olmo3ForCausalLM", norm="rms", mlp="swiglu",
        ffn_ratio=8 / 3, norm_position="post",
    ),
    "smollm3": HFType(
        "smollm3", "SmolLM3Config", "SmolLM3Attention", "SmolLM3RotaryEmbedding", biases=("", "qkvo"), groups=True,
        head_dim=True, nope_layers=True, layer="SmolLM3DecoderLayer", lm="SmolLM3ForCausalLM", norm="rms",
        mlp="swiglu", ffn_ratio=8 / 3, tied=True,
    ),
    "gpt_oss": HFType(
        "gpt_oss", "GptOssConfig", "GptOssAttention", "GptOssRotaryEmbedding", biases=("qkvo", ""), groups=True,
        head_dim=True, sinks=True, layer="GptOssDecoderLayer", lm="GptOssForCausalLM", norm="rms",
        mlp="swiglu_biased", ffn_ratio=1.0, router="softmax_biased",
    ),
    "mixtral": HFType(
        "mixtral", "MixtralConfig", "MixtralAttention", "MixtralRotaryEmbedding", biases=("",), groups=True,
        head_dim=True, layer="MixtralDecoderLayer", lm="MixtralForCausalLM", norm="rms", mlp="swiglu",
        ffn_ratio=8 / 3, router="softmax",
    ),
    "qwen3_moe": HFType(
        "qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeAttention", "Qwen3MoeRotaryEmbedding", biases=("", "qkvo"),
        groups=True, head_dim=True, qk_norm="head", layer="Qwen3MoeDecoderLayer", lm="Qwen3MoeForCausalLM",
        norm="rms", mlp="swiglu", ffn_ratio=8 / 3, router="softmax",
    ),
    "llama4": HFType(  # Llama 4's text model: L2 QK-norm in its RoPE layers, NoPE layers with a query temperature,
        # complex (interleaved-pair) rotary, one expert of a sigmoid router beside a shared expert
        "llama4", "Llama4TextConfig", "Llama4TextAttention", "Llama4TextRotaryEmbedding", biases=("", "qkvo"),
        groups=True, head_dim=True, qk_norm="l2", other_qk_norm="", nope_layers=True, nope_qk_norm=False,
        layer="Llama4TextDecoderLayer", lm="Llama4ForCausalLM", norm="rms", mlp="swiglu", ffn_ratio=8 / 3,
        router="sigmoid", shared_expert=True,
    ),
    "qwen2_5_vl": HFType(  # Qwen2.5-VL's text layers: Qwen2's (q/k/v biases, GQA) with M-RoPE, each rotated pair
        # turned by one of three position streams (time, height, width: mrope_section pairs each)
        "qwen2_5_vl", "Qwen2_5_VLTextConfig", "Qwen2_5_VLAttention", "Qwen2_5_VLRotaryEmbedding", biases=("qkv",),
        groups=True, layer="Qwen2_5_VLDecoderLayer", norm="rms", mlp="swiglu", ffn_ratio=8 / 3, mrope=True,
    ),
    "qwen3_vl": HFType(  # Qwen3-VL's text layers: Qwen3's (QK-norm per head, GQA) with M-RoPE whose three streams
        # take the rotated pairs in turn (time, height, width, time, ...), the pairs past 3 x mrope_section on time
        "qwen3_vl", "Qwen3VLTextConfig", "Qwen3VLTextAttention", "Qwen3VLTextRotaryEmbedding", biases=("", "qkvo"),
        groups=True, head_dim=True, qk_norm="head", layer="Qwen3VLTextDecoderLayer", norm="rms", mlp="swiglu",
        ffn_ratio=8 / 3, mrope=True, interleaved_mrope=True,
    ),
    "qwen3_vl_moe": HFType(  # Qwen3-VL's mixtures: Qwen3-MoE's layers with Qwen3-VL's interleaved M-RoPE
        "qwen3_vl_moe", "Qwen3VLMoeTextConfig", "Qwen3VLMoeTextAttention", "Qwen3VLMoeTextRotaryEmbedding",
        biases=("", "qkvo"), groups=True, head_dim=True, qk_norm="head", layer="Qwen3VLMoeTextDecoderLayer", norm="rms",
        mlp="swiglu", ffn_ratio=8 / 3, router="softmax", mrope=True, interleaved_mrope=True,
    ),
    "bloom": HFType(  # BLOOM: GPT-2's block (LayerNorm, GELU, biases on every map) with ALiBi, a fixed bias
        # -m_h (i - j) on head h's scores, instead of position embeddings
        "bloom", "BloomConfig", "BloomAttention", None, biases=("qkvo",), layer="BloomBlock", lm="BloomForCausalLM",
        positions="alibi", fixed_ffn=True, embedding_norm=True, tied=True,
    ),
    "falcon": HFType(  # Falcon: LayerNorm, GELU, biases on every map or none (bias), fused q/k/v, one LayerNorm
        # before attention and MLP side by side (Falcon-7B), a LayerNorm each (the new architecture: Falcon-40B,
        # 180B), or a sequential layer (parallel_attn off)
        "falcon", "FalconConfig", "FalconAttention", "FalconRotaryEmbedding", biases=("", "qkvo"), groups=True,
        layer="FalconDecoderLayer", lm="FalconForCausalLM", residual="shared_norm",
        other_residuals=("parallel", "sequential"), tied=True,
    ),
    "ernie4_5_moe": HFType(  # ERNIE 4.5's mixtures: ERNIE 4.5's attention, a softmax router whose choice (not its
        # weights) adds a bias per expert, shared experts beside, dense layers where moe_layer_* leave them
        "ernie4_5_moe", "Ernie4_5_MoeConfig", "Ernie4_5_MoeAttention", "Ernie4_5_MoeRotaryEmbedding",
        biases=("", "qkvo"), groups=True, head_dim=True, layer="Ernie4_5_MoeDecoderLayer", lm="Ernie4_5_MoeForCausalLM",
        norm="rms", mlp="swiglu", ffn_ratio=8 / 3, tied=True, router="softmax", shared_expert=True, choice_bias=True,
    ),
    "hunyuan_v1_moe": HFType(  # Hunyuan-A13B: a QK-norm per head after RoPE (one weight shared by all heads),
        # a softmax router renormalised over the chosen experts, and one shared MLP as wide as each expert
        "hunyuan_v1_moe", "HunYuanMoEV1Config", "HunYuanMoEV1Attention", "HunYuanMoEV1RotaryEmbedding",
        biases=("", "qkvo"), groups=True, head_dim=True, qk_norm="head_rope", layer="HunYuanMoEV1DecoderLayer",
        lm="HunYuanMoEV1ForCausalLM", norm="rms", mlp="swiglu", ffn_ratio=8 / 3, router="softmax", shared_expert=True,
    ),
    "glm4_moe": HFType(  # GLM-4.5 and 4.6: q/k/v biases, rotary on half of each head, QK-norm per head where
        # use_qk_norm, and DeepSeek-V3's mixture (a sigmoid router over grouped experts, beside shared ones) after
        # its first dense layers
        "glm4_moe", "Glm4MoeConfig", "Glm4MoeAttention", "Glm4MoeRotaryEmbedding", biases=("", "qkv"), groups=True,
        head_dim=True, partial_rope=True, other_qk_norm="head", layer="Glm4MoeDecoderLayer", lm="Glm4MoeForCausalLM",
        norm="rms", mlp="swiglu", ffn_ratio=8 / 3, router="sigmoid", shared_expert=True,
    ),
    "dots1": HFType(  # dots.llm1: Qwen3's attention (QK-norm per head, biases on all four maps or none) and
        # DeepSeek-V3's mixture after its first dense layers
        "dots1", "Dots1Config", "Dots1Attention", "Dots1RotaryEmbedding", biases=("", "qkvo"), groups=True,
        head_dim=True, qk_norm="head", layer="Dots1DecoderLayer", lm="Dots1ForCausalLM", norm="rms", mlp="swiglu",
        ffn_ratio=8 / 3, router="sigmoid", shared_expert=True,
    ),
    "qwen3_next": HFType(  # Qwen3-Next's softmax attention layers: gated heads, (1 + w) QK-norm, a quarter rotated
        "qwen3_next", "Qwen3NextConfig", "Qwen3NextAttention", "Qwen3NextRotaryEmbedding", biases=("", "qkvo"),
        groups=True, head_dim=True, partial_rope=True, qk_norm="head", output_gate=True, norm="rms", mlp="swiglu",
        layer="Qwen3NextDecoderLayer", lm="Qwen3NextForCausalLM", router="softmax", shared_expert=True,
        shared_gate=True, hybrid=("linear_attention", "gated deltanet"),
    ),
    "qwen3_5": HFType(  # Qwen3.5's text model: Qwen3-Next's layers (Gated DeltaNet beside gated softmax attention,
        # (1 + w) QK-norm, a quarter of each head rotated) with one MLP each, and Qwen3-VL's M-RoPE on the rotated pairs
        "qwen3_5", "Qwen3_5TextConfig", "Qwen3_5Attention", "Qwen3_5TextRotaryEmbedding", biases=("", "qkvo"),
        groups=True, head_dim=True, partial_rope=True, qk_norm="head", output_gate=True, norm="rms", mlp="swiglu",
        ffn_ratio=8 / 3, layer="Qwen3_5DecoderLayer", lm="Qwen3_5ForCausalLM", mrope=True, interleaved_mrope=True,
        hybrid=("linear_attention", "gated deltanet"),
    ),
    "qwen3_5_moe": HFType(  # Qwen3.5's mixtures: its layers with Qwen3-Next's mixture and gated shared expert
        "qwen3_5_moe", "Qwen3_5MoeTextConfig", "Qwen3_5MoeAttention", "Qwen3_5MoeTextRotaryEmbedding",
        biases=("", "qkvo"), groups=True, head_dim=True, partial_rope=True, qk_norm="head", output_gate=True,
        norm="rms", mlp="swiglu", layer="Qwen3_5MoeDecoderLayer", lm="Qwen3_5MoeForCausalLM", router="softmax",
        shared_expert=True, shared_gate=True, mrope=True, interleaved_mrope=True,
        hybrid=("linear_attention", "gated deltanet"),
    ),
    "seed_oss": HFType(  # Seed-OSS: Llama's block with q/k/v biases (attention_bias) and an output bias of its own
        # (attention_out_bias)
        "seed_oss", "SeedOssConfig", "SeedOssAttention", "SeedOssRotaryEmbedding", biases=("qkv", "", "qkvo", "o"),
        groups=True, head_dim=True, layer="SeedOssDecoderLayer", lm="SeedOssForCausalLM", norm="rms", mlp="swiglu",
        ffn_ratio=8 / 3,
    ),
    "ernie4_5": HFType(  # ERNIE 4.5 (dense): Llama's block, its rotary pairs interleaved (2i, 2i + 1), tied embeddings;
        # use_bias puts biases on every map, the MLP's too (a block attnid does not model: its attention is counted)
        "ernie4_5", "Ernie4_5Config", "Ernie4_5Attention", "Ernie4_5RotaryEmbedding", biases=("", "qkvo"),
        groups=True, head_dim=True, layer="Ernie4_5DecoderLayer", lm="Ernie4_5ForCausalLM", norm="rms", mlp="swiglu",
        ffn_ratio=8 / 3, tied=True,
    ),
    "cohere": HFType(  # Command R: one LayerNorm without a shift before attention and MLP side by side, interleaved
        # rotary pairs, and (use_qk_norm, Command R+) a LayerNorm per head on queries and keys
        "cohere", "CohereConfig", "CohereAttention", "CohereRotaryEmbedding", biases=("", "qkvo"), groups=True,
        other_qk_norm="layer", layer="CohereDecoderLayer", lm="CohereForCausalLM", norm="layer_noshift",
        mlp="swiglu", ffn_ratio=8 / 3, residual="shared_norm", tied=True,
    ),
    "cohere2": HFType(  # Command R7B and A: Cohere's block without a QK-norm, RoPE in its sliding-window layers only
        # (three to each full-attention layer, which has no position map)
        "cohere2", "Cohere2Config", "Cohere2Attention", "Cohere2RotaryEmbedding", biases=("", "qkvo"), groups=True,
        nope_layers=True, rope_in_windows="only", layer="Cohere2DecoderLayer", lm="Cohere2ForCausalLM",
        norm="layer_noshift", mlp="swiglu", ffn_ratio=8 / 3, residual="shared_norm", tied=True,
    ),
    "exaone4": HFType(  # EXAONE 4: OLMo 2's norms after each sub-layer with Qwen3's QK-norm per head, and (where a
        # window is set) RoPE in the sliding-window layers only
        "exaone4", "Exaone4Config", "Exaone4Attention", "Exaone4RotaryEmbedding", biases=("",), groups=True,
        head_dim=True, qk_norm="head", nope_layers=True, rope_in_windows="when_windowed", layer="Exaone4DecoderLayer",
        lm="Exaone4ForCausalLM", norm="rms", mlp="swiglu", ffn_ratio=8 / 3, norm_position="post",
    ),
}  # fmt: skip


# multi-head latent attention (DeepSeek-V3.2's with its sparse attention's indexer): counting.count_mla, audited by
# hf.audit_mla_hf
MLA_TYPES = ("deepseek_v3", "deepseek_v32")


def equivalent_config(
    hf_type: str,
    *,
    embed: int,
    heads: int,
    groups: int | None = None,
    head_dim: int | None = None,
    rope_dims: int | None = None,
    bias: str | None = None,
    norm_eps: float = 0.0,
    nope: bool = False,
    qk_norm: str | None = None,
) -> AttentionConfig:
    """The :class:`AttentionConfig` of a ``hf_type`` attention layer (causal self-attention), its QK-norm at
    ``ε = norm_eps``; with ``nope``, one of its layers without RoPE (a type with ``nope_layers``: SmolLM3, Llama 4);
    ``qk_norm`` one of the type's QK-norms (:meth:`HFType.qk_norms`; None: its default). A setting the model type
    cannot express raises ``ValueError`` naming it."""
    if hf_type not in HF_TYPES:
        raise ValueError(f"hf: unknown model type {hf_type!r}; choose one of {', '.join(HF_TYPES)}")
    t = HF_TYPES[hf_type]
    _check_nope(hf_type, nope, rope_dims)
    norm = _qk_norm_choice(hf_type, qk_norm, nope)
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
    cfg = AttentionConfig(
        embed, heads, groups=groups, head_dim=head_dim, bias=b, causal=True, qk_norm=norm,
        qk_norm_eps=norm_eps if norm else 0.0, logit_softcap=t.softcap, sinks=t.sinks, output_gate=t.output_gate,
    )  # fmt: skip
    if t.rotary is None:
        return cfg
    if nope:
        return cfg
    if rope_dims is not None and rope_dims != cfg.D and not t.partial_rope:
        raise ValueError(f"rope_dims: {hf_type} rotates all head dimensions (rope_dims = head_dim = {cfg.D})")
    if rope_dims is None and not t.partial_rope:
        return cfg.with_(rope=True)  # an odd head_dim is refused as such, not as a rope_dims nobody gave
    if t.half_rotary and (cfg.D % 4 or rope_dims not in (None, cfg.D // 2)):
        raise ValueError(f"rope_dims: {hf_type}'s code rotates half of each head, a head_dim divisible by 4 "
                         f"(head_dim {cfg.D}, rope_dims {rope_dims})")  # fmt: skip
    if rope_dims is None:
        rope_dims = max(2, (cfg.D // 2) // 2 * 2)
    return cfg.with_(rope=True, rope_dims=rope_dims)


def _qk_norm_choice(hf_type: str, qk_norm: str | None, nope: bool) -> str:
    """The QK-norm of a ``hf_type`` layer: ``qk_norm`` (None: the type's), refused unless the type can have it; none in
    a NoPE layer of a type that normalises in its RoPE layers only (Llama 4)."""
    t = HF_TYPES[hf_type]
    norm = t.qk_norm if qk_norm is None else qk_norm
    if norm not in t.qk_norms():
        named = " or ".join(repr(q or "none") for q in t.qk_norms())
        raise ValueError(f"qk_norm: {hf_type} can have QK-norm {named}, not {norm or 'none'!r}")
    return "" if nope and not t.nope_qk_norm else norm


def nope_layer_flags(hf_type: str, config) -> list[bool]:
    """Which layers of a ``hf_type`` model have no RoPE, from its config (transformers' own or
    :mod:`attnid.library_configs`' reading): SmolLM3's and Llama 4's ``no_rope_layers`` (0 marks one; a layer past the
    list has RoPE), or the layers that are not sliding-window ones where the type rotates in those only
    (:attr:`HFType.rope_in_windows`)."""
    t, layers = HF_TYPES[hf_type], config.num_hidden_layers
    if not t.nope_layers:
        return [False] * layers
    if t.rope_in_windows:
        if getattr(config, "sliding_window", None) is None:
            return [t.rope_in_windows == "only"] * layers
        return [kind != "sliding_attention" for kind in config.layer_types[:layers]]
    flags = list(getattr(config, "no_rope_layers", None) or [])[:layers]
    return [not u for u in flags] + [False] * (layers - len(flags))


def _check_nope(hf_type: str, nope: bool, rope_dims: int | None) -> None:
    """Refuse a NoPE layer of a type without one, or with rotated dimensions."""
    if nope and not HF_TYPES[hf_type].nope_layers:
        raise ValueError(f"nope: {hf_type} has RoPE in every layer (no layer without it)")
    if nope and rope_dims is not None:
        raise ValueError("rope_dims: a NoPE layer rotates no dimension (drop --rope-dims)")


def default_ffn(hf_type: str, embed: int) -> int:
    """The MLP inner size of ``hf_type`` at width ``embed``: its usual ratio (4, or 8/3 for SwiGLU), rounded."""
    return max(1, round(HF_TYPES[hf_type].ffn_ratio * embed))


def block_config(
    hf_type: str,
    cfg: AttentionConfig,
    ffn: int,
    norm_eps_zero: bool = False,
    experts: int = 0,
    shared_ffn: int | None = None,
    residual: str | None = None,
) -> BlockConfig:
    """The :class:`~attnid.counting.BlockConfig` of one ``hf_type`` decoder layer around ``cfg``, its norms at
    ``ε = 0`` if ``norm_eps_zero`` (released models have ``ε > 0``), with a mixture of ``experts`` experts of inner
    size ``ffn`` for a mixture-of-experts type (its router, and where the type has them shared experts of total inner
    size ``shared_ffn``, default ``ffn``: one), its sub-layers wired ``residual`` (None: the type's own;
    :meth:`HFType.residual_of`)."""
    t = HF_TYPES[hf_type]
    if bool(experts) != t.moe and not (t.dense_allowed and not experts):
        raise ValueError(f"experts: {hf_type} " + ("has a mixture of experts: give their number (2 or more)"
                                                   if t.moe else "has one MLP, no experts"))  # fmt: skip
    return BlockConfig(
        cfg, ffn, norm=t.norm, mlp=t.mlp, mlp_bias=t.mlp_bias(cfg.bias), residual=t.residual_of(residual),
        norm_position=t.norm_position, norm_eps_zero=norm_eps_zero, experts=experts,
        shared_ffn=(ffn if shared_ffn is None else shared_ffn) if t.shared_expert and experts else 0,
        router=t.router or "sigmoid", choice_bias=t.choice_bias and bool(experts),
        shared_gate=t.shared_gate and bool(experts),
    )  # fmt: skip


def default_vocab(hf_type: str, embed: int, ffn: int, residual: str | None = None) -> int:
    """A vocabulary for a tiny whole-model audit. In a parallel block the first layer's MLP reads the token
    embedding alone, so it is seen at ``V`` points only: ``V = 3F`` keeps it identified, ``4F`` for a gated MLP
    (three maps: Command R's model at 3F leaves its count to the data); ``3E`` elsewhere."""
    t = HF_TYPES[hf_type]
    if t.residual_of(residual) == "sequential":
        return max(16, 3 * embed)
    return (4 if t.mlp in GATED_MLPS else 3) * ffn


def model_config(
    hf_type: str,
    cfg: AttentionConfig,
    *,
    ffn: int,
    layers: int,
    vocab: int,
    tied: bool,
    seq_len: int,
    norm_eps: float,
    final_softcap: float | None = None,
    residual: str | None = None,
) -> ModelConfig:
    """The :class:`~attnid.counting.ModelConfig` of a tiny ``hf_type`` causal LM read on ``seq_len`` tokens, its
    logits capped at ``final_softcap`` (None: no cap), its layers wired ``residual`` (None: the type's own)."""
    t = HF_TYPES[hf_type]
    return ModelConfig(
        block_config(hf_type, cfg, ffn, norm_eps_zero=norm_eps == 0, residual=residual), layers, vocab, tied=tied,
        positions=t.positions, context=seq_len if t.positions == "learned" else 0, unused_positions=t.unused_positions,
        head_bias=t.head_bias, norm_eps_zero=norm_eps == 0, final_softcap=final_softcap,
    )  # fmt: skip
