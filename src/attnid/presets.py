"""Published attention architectures (config values from the models' released configs).

Each preset names the Hugging Face ``transformers`` model type whose attention code it describes
(``None`` where attnid cannot build that type); :func:`attnid.hf.verify_preset` audits its structure
through that real module at a small width.
"""

from __future__ import annotations

from dataclasses import dataclass

from .attention import AttentionConfig


@dataclass(frozen=True)
class Preset:
    description: str
    config: AttentionConfig
    hf_type: str | None = None  # transformers model type of its attention code


PRESETS: dict[str, Preset] = {
    "gpt2": Preset("GPT-2 small (124M)", AttentionConfig(768, 12, bias="all"), "gpt2"),
    "gpt2-xl": Preset("GPT-2 XL (1.5B)", AttentionConfig(1600, 25, bias="all"), "gpt2"),
    "bert-base": Preset("BERT-base (bidirectional)", AttentionConfig(768, 12, bias="all")),
    "nanogpt-shakespeare": Preset(
        "nanoGPT shakespeare-char, bias on (the paper's §5 model)",
        AttentionConfig(384, 6, bias="all", causal=True),
        "gpt2",
    ),
    "opt-6.7b": Preset("OPT-6.7B", AttentionConfig(4096, 32, bias="all", causal=True), "opt"),
    "llama-2-7b": Preset("Llama-2-7B", AttentionConfig(4096, 32, rope=True, causal=True), "llama"),
    "llama-2-70b": Preset("Llama-2-70B (GQA)", AttentionConfig(8192, 64, groups=8, rope=True, causal=True), "llama"),
    "llama-3-8b": Preset(
        "Llama-3-8B (GQA)",
        AttentionConfig(4096, 32, groups=8, rope=True, causal=True, rope_base=500000.0),
        "llama",
    ),
    "mistral-7b": Preset(
        "Mistral-7B (GQA)",
        AttentionConfig(4096, 32, groups=8, rope=True, causal=True, rope_base=1000000.0),
        "mistral",
    ),
    "qwen2-7b": Preset(
        "Qwen2-7B (GQA, q/k/v biases)",
        AttentionConfig(3584, 28, groups=4, bias="qkv", rope=True, causal=True, rope_base=1000000.0),
        "qwen2",
    ),
    "pythia-6.9b": Preset(
        "Pythia-6.9B (GPT-NeoX, rotary on 25% of each head)",
        AttentionConfig(4096, 32, bias="all", rope_dims=32, causal=True),
        "gpt_neox",
    ),
    "gpt-neox-20b": Preset(
        "GPT-NeoX-20B (rotary on 25% of each head)",
        AttentionConfig(6144, 64, bias="all", rope_dims=24, causal=True),
        "gpt_neox",
    ),
    "phi-2": Preset(
        "Phi-2 (rotary on 32 of 80 dimensions, biases)",
        AttentionConfig(2560, 32, bias="all", rope_dims=32, causal=True),
        "phi",
    ),
    "falcon-7b": Preset("Falcon-7B (multi-query, G = 1)", AttentionConfig(4544, 71, groups=1, rope=True, causal=True)),
    "gemma-7b": Preset("Gemma-7B (D = 256 > E/H)", AttentionConfig(3072, 16, head_dim=256, rope=True, causal=True)),
}


def preset(name: str) -> AttentionConfig:
    key = name.strip().lower()
    if key not in PRESETS:
        raise ValueError(f"preset: unknown name {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[key].config


def preset_rows(verified: dict | None = None) -> list[dict]:
    """One row per preset: its architecture, closed-form counts, model type, and, given ``verified``
    (:func:`attnid.hf.verify_presets`), whether its structure was audited through the real module
    (``True``), or ``None`` where no module was audited."""
    from .counting import count

    rows = []
    for name, p in PRESETS.items():
        cfg, c = p.config, count(p.config)
        rows.append(
            {
                "name": name,
                "description": p.description,
                "hf_type": p.hf_type,
                "embed": cfg.E,
                "heads": cfg.H,
                "groups": cfg.G,
                "head_dim": cfg.D,
                "rope_dims": cfg.R,
                "bias": cfg.bias or "none",
                "total_params": c.total_params,
                "unidentified": c.unidentified,
                "identified_fraction": c.identified_fraction,
                "verified": None if not verified or verified.get(name) is None else True,
            }
        )
    return rows
