"""Published architectures (config values from the models' released configs, each :class:`Model` naming
its source).

Each preset names the Hugging Face ``transformers`` model type whose code it describes (``None`` where
attnid cannot build that type); :func:`attnid.hf.verify_preset` audits its attention, or its whole decoder
layer, through that real module at a small width. :func:`preset_count` counts it at three scopes: one
attention layer, one decoder layer, and the whole model (chapter 8).
"""

from __future__ import annotations

from dataclasses import dataclass

from .attention_config import AttentionConfig
from .counting import (
    SCOPES,
    BlockConfig,
    Count,
    MLAConfig,
    ModelConfig,
    count,
    count_block,
    count_mla,
    count_model,
    nope_attention,
)
from .families import HF_TYPES, block_config
from .hub import ConfigSource


@dataclass(frozen=True)
class Model:
    """What a whole published model adds to its attention: ``layers`` decoder layers with MLP inner size
    ``ffn``, a vocabulary, a tied or untied head, the position rows read (learned positions only), and
    the released config it comes from. Its norms have ε > 0 (no exact scale symmetry)."""

    layers: int
    ffn: int
    vocab: int
    tied: bool
    source: str
    context: int = 0  # learned position rows (GPT-2, OPT); 0 with RoPE
    # a mixture of experts (DeepSeek-V3): ``experts`` routed experts of inner size ``ffn`` and shared ones of
    # ``shared_ffn`` in all but the first ``dense_layers``, which have one MLP of inner size ``dense_ffn``
    experts: int = 0
    shared_ffn: int = 0
    dense_layers: int = 0
    dense_ffn: int = 0
    nope_layers: int = 0  # layers without RoPE (SmolLM3, Llama 4)
    nope_qk_norm: bool = True  # its NoPE layers keep the QK-norm (False: Llama 4)
    nope_dense_layers: int = 0  # NoPE layers among the dense ones
    final_softcap: float | None = None  # the logits capped to c tanh(z / c) (Gemma 2)
    residual: str | None = None  # its layers' wiring where the family's config chooses it (Falcon); None: the family's
    # of its layers, those whose mixer is not attention (a hybrid model: LFM2, Bamba, Qwen3-Next, Granite 4), as
    # (MixerBlock, how many) by kind
    mixer_layers: tuple = ()


@dataclass(frozen=True)
class Preset:
    """A published architecture, or a model read from its ``config.json``: its attention layer (``config``), the
    ``transformers`` family of its code, the whole model (layers, MLP, vocabulary; ``None`` where only the
    attention is counted) and, for a config file, what was read (``reading``) and from where (``origin``)."""

    description: str
    config: AttentionConfig | MLAConfig
    hf_type: str | None = None  # transformers model type of its code
    model: Model | None = None  # the whole model (None: its block is not one attnid counts)
    reading: dict | None = None  # a config file's fields as read (attnid.configs.config_reading)
    attention_only: str = ""  # why only its attention is counted (Qwen3-Next's linear attention), where it says
    origin: ConfigSource | None = None  # the config file it was read from (a path, or a model on the Hub)


PRESETS: dict[str, Preset] = {
    "gpt2": Preset(
        "GPT-2 small (124M)",
        AttentionConfig(768, 12, bias="all", causal=True),
        "gpt2",
        Model(
            12, 3072, 50257, True, "https://huggingface.co/openai-community/gpt2/blob/main/config.json", context=1024
        ),
    ),
    "gpt2-xl": Preset(
        "GPT-2 XL (1.5B)",
        AttentionConfig(1600, 25, bias="all", causal=True),
        "gpt2",
        Model(
            48, 6400, 50257, True, "https://huggingface.co/openai-community/gpt2-xl/blob/main/config.json", context=1024
        ),
    ),
    "bert-base": Preset("BERT-base (bidirectional)", AttentionConfig(768, 12, bias="all")),
    "nanogpt-shakespeare": Preset(
        "nanoGPT shakespeare-char, bias on (the paper's §5 model)",
        AttentionConfig(384, 6, bias="all", causal=True),
        "gpt2",
        Model(
            6,
            1536,
            65,
            True,
            "https://github.com/karpathy/nanoGPT/blob/master/config/train_shakespeare_char.py",
            context=256,
        ),
    ),
    "opt-6.7b": Preset(
        "OPT-6.7B",
        AttentionConfig(4096, 32, bias="all", causal=True),
        "opt",
        Model(32, 16384, 50272, True, "https://huggingface.co/facebook/opt-6.7b/blob/main/config.json", context=2048),
    ),
    "llama-2-7b": Preset(
        "Llama-2-7B",
        AttentionConfig(4096, 32, rope=True, causal=True),
        "llama",
        Model(32, 11008, 32000, False, "https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json"),
    ),
    "llama-2-70b": Preset(
        "Llama-2-70B (GQA)",
        AttentionConfig(8192, 64, groups=8, rope=True, causal=True),
        "llama",
        Model(80, 28672, 32000, False, "https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json"),
    ),
    "llama-3-8b": Preset(
        "Llama-3-8B (GQA)",
        AttentionConfig(4096, 32, groups=8, rope=True, causal=True, rope_base=500000.0),
        "llama",
        Model(32, 14336, 128256, False, "https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json"),
    ),
    "mistral-7b": Preset(
        "Mistral-7B (GQA)",
        AttentionConfig(4096, 32, groups=8, rope=True, causal=True),  # v0.1: RoPE base 10,000
        "mistral",
        Model(32, 14336, 32000, False, "https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json"),
    ),
    "qwen2-7b": Preset(
        "Qwen2-7B (GQA, q/k/v biases)",
        AttentionConfig(3584, 28, groups=4, bias="qkv", rope=True, causal=True, rope_base=1000000.0),
        "qwen2",
        Model(28, 18944, 152064, False, "https://huggingface.co/Qwen/Qwen2-7B/blob/main/config.json"),
    ),
    "pythia-6.9b": Preset(
        "Pythia-6.9B (GPT-NeoX, rotary on 25% of each head)",
        AttentionConfig(4096, 32, bias="all", rope_dims=32, causal=True),
        "gpt_neox",
        Model(32, 16384, 50432, False, "https://huggingface.co/EleutherAI/pythia-6.9b/blob/main/config.json"),
    ),
    "gpt-neox-20b": Preset(
        "GPT-NeoX-20B (rotary on 25% of each head)",
        AttentionConfig(6144, 64, bias="all", rope_dims=24, causal=True),
        "gpt_neox",
        Model(44, 24576, 50432, False, "https://huggingface.co/EleutherAI/gpt-neox-20b/blob/main/config.json"),
    ),
    "phi-2": Preset(
        "Phi-2 (rotary on 32 of 80 dimensions, biases)",
        AttentionConfig(2560, 32, bias="all", rope_dims=32, causal=True),
        "phi",
        Model(32, 10240, 51200, False, "https://huggingface.co/microsoft/phi-2/blob/main/config.json"),
    ),
    "qwen3-8b": Preset(
        "Qwen3-8B (GQA, QK-norm per head)",
        AttentionConfig(
            4096,
            32,
            groups=8,
            head_dim=128,
            rope=True,
            causal=True,
            rope_base=1000000.0,
            qk_norm="head",
            qk_norm_eps=1e-6,
        ),
        "qwen3",
        Model(36, 12288, 151936, False, "https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json"),
    ),
    "olmo-2-7b": Preset(
        "OLMo-2-7B (QK-norm over the projection, norms after attention and MLP)",
        AttentionConfig(4096, 32, rope=True, causal=True, rope_base=500000.0, qk_norm="proj", qk_norm_eps=1e-6),
        "olmo2",
        Model(32, 11008, 100352, False, "https://huggingface.co/allenai/OLMo-2-1124-7B/blob/main/config.json"),
    ),
    "gemma-3-12b": Preset(
        "Gemma-3-12B (GQA, D = 256, QK-norm per head, norms before and after attention and MLP)",
        AttentionConfig(
            3840,
            16,
            groups=8,
            head_dim=256,
            rope=True,
            causal=True,
            rope_base=1000000.0,
            qk_norm="head",
            qk_norm_eps=1e-6,
        ),
        "gemma3",
        Model(48, 15360, 262208, True, "https://huggingface.co/google/gemma-3-12b-pt/blob/main/config.json"),
    ),
    "gemma-2-9b": Preset(
        "Gemma-2-9B (GQA, D = 256, logit soft-capping at 50, norms before and after attention and MLP)",
        AttentionConfig(3584, 16, groups=8, head_dim=256, rope=True, causal=True, logit_softcap=50.0),
        "gemma2",
        Model(
            42,
            14336,
            256000,
            True,
            "https://huggingface.co/google/gemma-2-9b/blob/main/config.json",
            final_softcap=30.0,
        ),
    ),
    "phi-4-mini": Preset(
        "Phi-4-mini (GQA, rotary on 96 of 128 dimensions, tied head)",
        AttentionConfig(3072, 24, groups=8, rope_dims=96, causal=True),
        "phi3",
        Model(32, 8192, 200064, True, "https://huggingface.co/microsoft/Phi-4-mini-instruct/blob/main/config.json"),
    ),
    "smollm3-3b": Preset(
        "SmolLM3-3B (GQA, every fourth layer without RoPE)",
        AttentionConfig(2048, 16, groups=4, rope=True, causal=True, rope_base=5000000.0),
        "smollm3",
        Model(
            36,
            11008,
            128256,
            True,
            "https://huggingface.co/HuggingFaceTB/SmolLM3-3B-Base/blob/main/config.json",
            nope_layers=9,
        ),
    ),
    "mixtral-8x7b": Preset(
        "Mixtral-8x7B (GQA, 8 experts, 2 chosen by a softmax router)",
        AttentionConfig(4096, 32, groups=8, rope=True, causal=True, rope_base=1000000.0),
        "mixtral",
        Model(
            32,
            14336,
            32000,
            False,
            "https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json",
            experts=8,
        ),
    ),
    "qwen3-30b-a3b": Preset(
        "Qwen3-30B-A3B (GQA, QK-norm per head, 128 experts, 8 chosen by a softmax router)",
        AttentionConfig(
            2048,
            32,
            groups=4,
            head_dim=128,
            rope=True,
            causal=True,
            rope_base=1000000.0,
            qk_norm="head",
            qk_norm_eps=1e-6,
        ),
        "qwen3_moe",
        Model(48, 768, 151936, False, "https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json", experts=128),
    ),
    "gpt-oss-20b": Preset(
        "gpt-oss-20b (GQA, attention sinks, all biases, 32 biased experts, 4 chosen)",
        AttentionConfig(
            2880, 64, groups=8, head_dim=64, bias="all", rope=True, causal=True, rope_base=150000.0, sinks=True
        ),
        "gpt_oss",
        Model(24, 2880, 201088, False, "https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json", experts=32),
    ),
    "llama-4-scout": Preset(
        "Llama-4-Scout-17B-16E, its text model (GQA, L2 QK-norm, every fourth layer NoPE, 16 experts, 1 chosen, "
        "a shared expert)",
        AttentionConfig(
            5120, 40, groups=8, head_dim=128, rope=True, causal=True, rope_base=500000.0, qk_norm="l2", qk_norm_eps=1e-5
        ),
        "llama4",
        Model(
            48,
            8192,
            202048,
            False,
            "https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E/blob/main/config.json",
            experts=16,
            shared_ffn=8192,
            nope_layers=12,
            nope_qk_norm=False,
        ),
    ),
    "falcon-7b": Preset(
        "Falcon-7B (multi-query, G = 1; one LayerNorm before attention and MLP side by side)",
        AttentionConfig(4544, 71, groups=1, rope=True, causal=True),
        "falcon",
        Model(
            32,
            18176,
            65024,
            True,
            "https://huggingface.co/tiiuae/falcon-7b/blob/main/config.json",
            residual="shared_norm",
        ),
    ),
    "gemma-7b": Preset("Gemma-7B (D = 256 > E/H)", AttentionConfig(3072, 16, head_dim=256, rope=True, causal=True)),
}

# multi-head latent attention (chapter 9): counted by counting.count_mla, audited by hf.audit_mla_hf
MLA_PRESETS: dict[str, Preset] = {
    "deepseek-v3": Preset(
        "DeepSeek-V3 (latent attention, 256 routed experts + 1 shared, 8 chosen)",
        MLAConfig(7168, 128, kv_rank=512, q_rank=1536, nope_dim=128, rope_dim=64, v_dim=128, norm_eps=1e-6),
        "deepseek_v3",
        Model(
            61, 2048, 129280, False, "https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json",
            experts=256, shared_ffn=2048, dense_layers=3, dense_ffn=18432,
        ),
    ),
}  # fmt: skip
ALL_PRESETS: dict[str, Preset] = {**PRESETS, **MLA_PRESETS}


def lookup(name: str) -> tuple[str, Preset]:
    """``(key, preset)`` of a preset name (case and spaces do not matter); ``ValueError`` listing the names."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in ALL_PRESETS:
        raise ValueError(f"preset: unknown name {name!r}; choose one of {', '.join(ALL_PRESETS)}")
    return key, ALL_PRESETS[key]


def preset(name: str) -> AttentionConfig:
    """The attention config of preset ``name`` (latent-attention presets have an :class:`MLAConfig`: see
    :data:`MLA_PRESETS` and :func:`preset_count`)."""
    key, p = lookup(name)
    if isinstance(p.config, MLAConfig):
        raise ValueError(f"preset: {key} has latent attention, which no AttentionConfig describes; count it by scope")
    return p.config


def architecture(cfg: AttentionConfig | MLAConfig) -> dict:
    """A preset's attention in the columns of :func:`preset_rows`: for latent attention every head has its
    own position-free key (``groups = heads``), ``head_dim`` counts both query/key parts, ``rope_dims`` the
    rotary one."""
    if isinstance(cfg, MLAConfig):
        return {"embed": cfg.embed, "heads": cfg.heads, "groups": cfg.heads, "head_dim": cfg.nope_dim + cfg.rope_dim,
                "rope_dims": cfg.rope_dim, "bias": "none"}  # fmt: skip
    return {"embed": cfg.E, "heads": cfg.H, "groups": cfg.G, "head_dim": cfg.D, "rope_dims": cfg.R,
            "bias": cfg.bias or "none"}  # fmt: skip


def preset_rows(
    verified: dict | None = None, verified_block: dict | None = None, presets: dict[str, Preset] = PRESETS
) -> list[dict]:
    """One row per preset of ``presets`` (default :data:`PRESETS`; :data:`MLA_PRESETS` for latent attention):
    its architecture, closed-form counts at the three scopes (``block_*`` and ``model_*`` are ``None`` where
    attnid counts no block), model type, and, given ``verified`` / ``verified_block``
    (:func:`attnid.hf.verify_presets` at scope attention / block), whether that structure was audited through
    the real module (``True``), or ``None`` where none was."""
    rows = []
    for name, p in presets.items():
        c = preset_count(name)
        row = {
            "name": name,
            "description": p.description,
            "hf_type": p.hf_type,
            **architecture(p.config),
            "total_params": c.total_params,
            "unidentified": c.unidentified,
            "identified_fraction": c.identified_fraction,
            "verified": None if not verified or verified.get(name) is None else True,
        }
        for scope in ("block", "model"):
            sc = preset_count(name, scope) if p.model is not None and p.hf_type is not None else None
            row[f"{scope}_params"] = None if sc is None else sc.total_params
            row[f"{scope}_unidentified"] = None if sc is None else sc.unidentified
            row[f"{scope}_unidentified_share"] = None if sc is None else sc.unidentified / sc.total_params
        row["layers"] = p.model.layers if p.model else None
        row["source"] = p.model.source if p.model else None
        row["verified_block"] = None if not verified_block or verified_block.get(name) is None else True
        rows.append(row)
    return rows


def preset_block(name: str) -> BlockConfig:
    """The :class:`~attnid.counting.BlockConfig` of one decoder layer of preset ``name`` (a mixture-of-experts
    layer where the model has them)."""
    key, p = lookup(name)
    return block_of(p, key)


def block_of(p: Preset, name: str) -> BlockConfig:
    """The decoder layer of ``p`` (a preset, or a config read by :func:`attnid.configs.config_preset`, called
    ``name`` in errors)."""
    if p.model is None or p.hf_type is None:
        why = f": {p.attention_only}" if p.attention_only else " (only its attention)"
        raise ValueError(f"scope: {name} has no block structure attnid counts{why}; use scope attention")
    if isinstance(p.config, MLAConfig):
        m = p.model
        return BlockConfig(
            p.config, m.ffn, norm="rms", mlp="swiglu", mlp_bias=False, experts=m.experts, shared_ffn=m.shared_ffn
        )
    m = p.model
    return block_config(p.hf_type, p.config.with_(causal=True), m.ffn, experts=m.experts,
                        shared_ffn=m.shared_ffn if m.experts else None, residual=m.residual)  # fmt: skip


def preset_count(name: str, scope: str = "attention") -> Count:
    """:class:`~attnid.counting.Count` of preset ``name``: one attention layer (``"attention"``), one whole
    decoder layer (``"block"``), or the whole model (``"model"``: every layer, embeddings, final norm and
    head; chapters 8 and 9). Presets without a counted block structure raise ``ValueError`` at the last two."""
    key, p = lookup(name)
    return scope_count(p, scope, key)


def scope_count(p: Preset, scope: str, name: str) -> Count:
    """The closed-form count of ``p`` (a preset, or a model read from its config) at ``scope``: ``"attention"`` (one
    attention layer, §4), ``"block"`` (one decoder layer) or ``"model"`` (the whole model; chapters 8–9); ``name``
    is the model's name in messages."""
    if scope not in SCOPES:
        raise ValueError(f"scope: expected one of {', '.join(SCOPES)}, got {scope!r}")
    if scope == "attention":
        return count_mla(p.config) if isinstance(p.config, MLAConfig) else count(p.config)
    block = block_of(p, name)
    if scope == "block":
        return count_block(block)
    assert p.hf_type is not None and p.model is not None
    t = HF_TYPES.get(p.hf_type)
    if t is not None and t.embedding_norm:
        raise ValueError(
            f"scope: {name} ({p.hf_type}) has a LayerNorm on its token embeddings "
            "(word_embeddings_layernorm), which attnid does not count; use scope block or attention"
        )
    m = p.model
    return count_model(
        ModelConfig(
            block, m.layers, m.vocab, tied=m.tied, positions=t.positions if t else "rope", context=m.context,
            unused_positions=t.unused_positions if t else 0, head_bias=t.head_bias if t else False,
            dense_layers=m.dense_layers, dense_ffn=m.dense_ffn, nope_layers=m.nope_layers,
            nope_qk_norm=m.nope_qk_norm, nope_dense_layers=m.nope_dense_layers, final_softcap=m.final_softcap,
            mixer_layers=m.mixer_layers,
        )
    )  # fmt: skip


def mixer_layers_note(p: Preset) -> str:
    """Which layers the attention and block scopes of a hybrid model show (its attention ones), and how many of the
    other kinds it has; empty for a model whose every layer is attention."""
    m = p.model
    if m is None or not m.mixer_layers:
        return ""
    others = ", ".join(f"{n} {block.mixer} layers" for block, n in m.mixer_layers)
    attention = m.layers - sum(n for _, n in m.mixer_layers)
    return (f"one of its {attention} attention layers; its {others} are counted at scope model (chapter 9), not as "
            "attention")  # fmt: skip


def layer_type_counts(p: Preset) -> dict[str, Count]:
    """One attention layer of each kind a model stacks, by kind (``"rope"``, ``"nope"``), where its layers differ
    (SmolLM3's NoPE layers); empty where every layer is :func:`scope_count` at scope attention."""
    if p.model is None or not p.model.nope_layers or not isinstance(p.config, AttentionConfig):
        return {}
    return {"rope": count(p.config), "nope": count(nope_attention(p.config, p.model.nope_qk_norm))}
