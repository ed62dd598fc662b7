"""Published attention architectures (config values from the models' released configs)."""

from __future__ import annotations

from .attention import AttentionConfig

# name: (description, config)
PRESETS: dict[str, tuple[str, AttentionConfig]] = {
    "gpt2": ("GPT-2 small (124M)", AttentionConfig(768, 12, bias="all")),
    "gpt2-xl": ("GPT-2 XL (1.5B)", AttentionConfig(1600, 25, bias="all")),
    "bert-base": ("BERT-base", AttentionConfig(768, 12, bias="all")),
    "nanogpt-shakespeare": (
        "nanoGPT shakespeare-char, bias on (the paper's §5 model)",
        AttentionConfig(384, 6, bias="all", causal=True),
    ),
    "llama-2-7b": ("Llama-2-7B", AttentionConfig(4096, 32, rope=True, causal=True)),
    "llama-2-70b": ("Llama-2-70B (GQA)", AttentionConfig(8192, 64, groups=8, rope=True, causal=True)),
    "llama-3-8b": ("Llama-3-8B (GQA)", AttentionConfig(4096, 32, groups=8, rope=True, causal=True, rope_base=500000.0)),
    "mistral-7b": (
        "Mistral-7B (GQA)",
        AttentionConfig(4096, 32, groups=8, rope=True, causal=True, rope_base=1000000.0),
    ),
    "qwen2-7b": (
        "Qwen2-7B (GQA, q/k/v biases)",
        AttentionConfig(3584, 28, groups=4, bias="qkv", rope=True, causal=True, rope_base=1000000.0),
    ),
    "falcon-7b": ("Falcon-7B (multi-query, G = 1)", AttentionConfig(4544, 71, groups=1, rope=True, causal=True)),
    "gemma-7b": ("Gemma-7B (D = 256 > E/H)", AttentionConfig(3072, 16, head_dim=256, rope=True, causal=True)),
}


def preset(name: str) -> AttentionConfig:
    key = name.strip().lower()
    if key not in PRESETS:
        raise ValueError(f"preset: unknown name {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[key][1]
