"""What the ``attnid`` subcommands share (:mod:`attnid.cli`): strict JSON, the architecture flags and the attention
config or preset they name, the flags a user gave, and the thread count."""

from __future__ import annotations

import argparse
import json
import math
import os

from ..attention_config import AttentionConfig
from ..counting import MLAConfig
from ..families import HF_TYPES, MLA_TYPES
from ..presets import Preset, lookup

HF_TYPE_NAMES = (*HF_TYPES, *MLA_TYPES)

HF_DEFAULTS = {  # the size `attnid audit --hf TYPE [--block | --model]` builds the module at
    "attention": {"embed": 32, "heads": 4},
    "block": {"embed": 16, "heads": 4},
    "model": {"embed": 8, "heads": 2},
}


def strict_json(obj) -> str:
    """JSON that strict parsers (JavaScript, jq) accept: a non-finite float (an infinite singular-value gap,
    a missing number) is written as ``null``."""

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(obj), indent=2, allow_nan=False)


def arch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", help="a published architecture (see `attnid presets`)")
    p.add_argument("--config", metavar="PATH|ORG/NAME[@REV]",
                   help="your model: a transformers config.json, a folder holding one, or a model's name on the "
                   "Hugging Face Hub (only its config.json is fetched; the hub extra)")  # fmt: skip
    p.add_argument("--embed", "-E", type=int, help="embedding dimension E")
    p.add_argument("--heads", "-H", type=int, help="number of query heads H")
    p.add_argument("--groups", "-G", type=int, help="key/value groups G (default H; 1 = MQA)")
    p.add_argument("--head-dim", "-D", type=int, help="query/key head dimension D (default E/H)")
    p.add_argument("--value-dim", "-C", type=int, help="value head dimension C (default D)")
    p.add_argument("--bias", help="none (default) | all | letters from q,k,v,o (e.g. q,k,v)")
    p.add_argument("--rope", action="store_true", help="rotary position embeddings on every head dimension")
    p.add_argument("--rope-dims", "-R", type=int, help="partial RoPE: rotate the first R dimensions of each head")
    p.add_argument(
        "--qk-norm",
        choices=("none", "head", "proj", "l2", "layer", "head_rope"),
        help="a norm on queries and keys: RMSNorm per head with one shared weight (Qwen3, Gemma 3), the same after "
        "RoPE (head_rope: Hunyuan-A13B), per projection (OLMo 2), per head without a weight (l2: Llama 4), LayerNorm "
        "per head without a shift (layer: StableLM 2, Command R+), or none (with --hf: a type whose config can "
        "switch its norm off, as Llama 4 Maverick)",
    )
    p.add_argument(
        "--output-gate",
        action="store_true",
        help="a sigmoid gate per head and channel on each head's output before W_O (Qwen3-Next)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def refuse_preset_flags(a: argparse.Namespace) -> None:
    if a.preset is not None and a.config is not None:
        raise ValueError("config: give --preset or --config, not both")
    given = "--preset" if a.preset is not None else "--config"
    flags = [
        f"--{k.replace('_', '-')}"
        for k in ("embed", "heads", "groups", "head_dim", "value_dim", "rope_dims", "bias", "qk_norm")
        if getattr(a, k) is not None
    ] + [f for f, on in (("--rope", a.rope), ("--output-gate", a.output_gate)) if on]
    if flags:
        raise ValueError(f"{given[2:]}: {', '.join(flags)} cannot be combined with {given} (it fixes them)")


def chosen_model(a: argparse.Namespace) -> tuple[str, Preset] | None:
    """``(name, preset)`` of ``--preset NAME`` or ``--config PATH`` (a config reads as a preset would);
    ``None`` when the flags give the architecture."""
    if a.preset is None and a.config is None:
        return None
    refuse_preset_flags(a)
    if a.config is not None:
        from ..configs import load_config

        return a.config, load_config(a.config)
    return lookup(a.preset)


def attention_config(a: argparse.Namespace, causal: bool = False) -> AttentionConfig:
    chosen = chosen_model(a)
    if chosen is not None:
        cfg = chosen[1].config
        if isinstance(cfg, MLAConfig):
            raise ValueError(f"{chosen[0]} has latent attention: audit it with --hf deepseek_v3")
        return cfg.with_(causal=causal) if causal else cfg
    if a.embed is None or a.heads is None:
        raise ValueError("embed/heads: give --embed and --heads, or --preset, or --config")
    return AttentionConfig(
        a.embed,
        a.heads,
        groups=a.groups,
        head_dim=a.head_dim,
        value_dim=a.value_dim,
        bias=a.bias,
        rope=a.rope,
        rope_dims=a.rope_dims,
        causal=causal,
        qk_norm="" if a.qk_norm in (None, "none") else a.qk_norm,
        output_gate=a.output_gate,
    )


def arch_dict(cfg: AttentionConfig) -> dict:
    return {
        "embed": cfg.E,
        "heads": cfg.H,
        "groups": cfg.G,
        "head_dim": cfg.D,
        "value_dim": cfg.C,
        "bias": cfg.bias or "none",
        "qk_norm": cfg.qk_norm or "none",
        "qk_norm_eps": cfg.qk_norm_eps,
        "output_gate": cfg.output_gate,
        "rope": cfg.rope,
        "rope_dims": cfg.R,
        "causal": cfg.causal,
    }


def given_flags(a, allowed: tuple[str, ...]) -> list[str]:
    """The flags of ``attnid audit`` given (a value other than its default; 0 is a value) outside ``allowed``."""
    return [
        f"--{k.replace('_', '-')}"
        for k, v in vars(a).items()
        if k not in (*allowed, "command", "func")
        and v is not None
        and v is not False
        and not (k in AUDIT_DEFAULTS and v == AUDIT_DEFAULTS[k])
    ]


def threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, help="torch/LAPACK threads (default: the cores not busy with other work)")


AUDIT_DEFAULTS = {"method": "auto", "norm_eps": 0.0, "seed": 0}  # `attnid audit`'s flags that have a default


def check_threads(a) -> None:
    """Refuse a ``--threads`` outside 1 to the machine's cores (without importing torch)."""
    cores = os.cpu_count() or 1
    if a.threads is not None and not 1 <= a.threads <= cores:
        raise ValueError(f"threads must be from 1 to the {cores} cores of this machine, got {a.threads}")


def set_threads(a) -> None:
    """``--threads``, else a default that leaves room for what else the machine is running."""
    check_threads(a)
    import torch

    from ..lm.profiles import default_threads

    torch.set_num_threads(default_threads() if a.threads is None else a.threads)


def table_lines(header: list[str], rows: list[list]) -> list[str]:
    """``header`` and ``rows`` as aligned text: the first column left-aligned, the others right-aligned with
    thousands separators for integers, each column as wide as its widest cell and two spaces between columns (so
    that no width of number runs two columns together)."""
    cells = [[str(c) for c in header]] + [[f"{c:,}" if isinstance(c, int) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        for r in cells
    ]


def human(v) -> str:
    """One human format for what the commands print: integers with thousands separators, floats to 4 significant
    digits, booleans as yes/no, dicts as ``key=value`` pairs and lists comma-separated."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={human(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(human(x) for x in v)
    return str(v)
