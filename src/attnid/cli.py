"""The ``attnid`` command: ``count``, ``audit``, ``presets``, ``train``, ``experiments``, ``claims`` (``--json``
for machine output)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path

from .attention import AttentionConfig
from .audit import METHODS as AUDIT_METHODS
from .counting import BLOCKS, SCOPES, MLAConfig, count
from .families import HF_TYPES, MLA_TYPES
from .inputs import printable
from .lm.launch import LAUNCHERS, SlurmOptions
from .lm.profiles import CASES, PRECISIONS
from .presets import Preset, layer_type_counts, lookup, scope_count

SLURM = SlurmOptions()  # the defaults of the slurm options
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


def _arch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", help="a published architecture (see `attnid presets`)")
    p.add_argument("--config", help="your model: a transformers config.json, or a folder holding one (read offline)")
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
        choices=("head", "proj"),
        help="RMSNorm on queries and keys: per head, one shared weight (Qwen3, Gemma 3), or per projection (OLMo 2)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def _refuse_preset_flags(a: argparse.Namespace) -> None:
    if a.preset is not None and a.config is not None:
        raise ValueError("config: give --preset or --config, not both")
    given = "--preset" if a.preset is not None else "--config"
    flags = [
        f"--{k.replace('_', '-')}"
        for k in ("embed", "heads", "groups", "head_dim", "value_dim", "rope_dims", "bias", "qk_norm")
        if getattr(a, k) is not None
    ] + (["--rope"] if a.rope else [])
    if flags:
        raise ValueError(f"{given[2:]}: {', '.join(flags)} cannot be combined with {given} (it fixes them)")


def _chosen(a: argparse.Namespace) -> tuple[str, Preset] | None:
    """``(name, preset)`` of ``--preset NAME`` or ``--config PATH`` (a config reads as a preset would);
    ``None`` when the flags give the architecture."""
    if a.preset is None and a.config is None:
        return None
    _refuse_preset_flags(a)
    if a.config is not None:
        from .configs import config_preset

        return a.config, config_preset(a.config)
    return lookup(a.preset)


def _config(a: argparse.Namespace, causal: bool = False) -> AttentionConfig:
    chosen = _chosen(a)
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
        qk_norm="" if a.qk_norm is None else a.qk_norm,
    )


def _arch(cfg: AttentionConfig) -> dict:
    return {
        "embed": cfg.E,
        "heads": cfg.H,
        "groups": cfg.G,
        "head_dim": cfg.D,
        "value_dim": cfg.C,
        "bias": cfg.bias or "none",
        "qk_norm": cfg.qk_norm or "none",
        "rope": cfg.rope,
        "rope_dims": cfg.R,
        "causal": cfg.causal,
    }


def cmd_count(a) -> int:
    chosen = _chosen(a)
    if a.scope != "attention" or (chosen is not None and isinstance(chosen[1].config, MLAConfig)):
        return _count_scope(a, chosen)
    cfg = _config(a)
    c = count(cfg)
    out = {"architecture": _arch(cfg), **c.as_dict()}
    kinds = layer_type_counts(chosen[1]) if chosen is not None else {}
    if kinds:  # a model whose layers differ: each kind of attention layer (this count is the "rope" one)
        out["layer_types"] = {k: {**v.as_dict(), "layers": n} for (k, v), n in zip(kinds.items(), _kind_layers(chosen))}
    _add_reading(out, chosen)
    if a.json:
        print(strict_json(out))
        return 0
    _print_reading(out)
    arch = ", ".join(f"{k}={v}" for k, v in out["architecture"].items())
    print(f"architecture: {arch}")
    print(f"{'block':<12}{'params':>14}{'unidentified':>16}")
    for b in BLOCKS:
        print(f"{b:<12}{c.params_by_block[b]:>14,}{c.unidentified_by_block[b]:>16,}")
    print(f"{'total':<12}{c.total_params:>14,}{c.unidentified:>16,}")
    print(f"identified fraction: {c.identified_fraction:.6f}")
    for kind, row in out.get("layer_types", {}).items():
        print(f"{kind} layers ({row['layers']} of the model's): {row['unidentified']:,} of {row['total_params']:,} "
              "unidentified")  # fmt: skip
    return 0


def _kind_layers(chosen) -> tuple[int, int]:
    """How many RoPE and NoPE layers the chosen model stacks."""
    m = chosen[1].model
    return m.layers - m.nope_layers, m.nope_layers


def _add_reading(out: dict, chosen) -> None:
    """A config file's reading (:func:`attnid.configs.config_reading`) under ``"config_fields"``."""
    if chosen is not None and chosen[1].reading is not None:
        out["config_fields"] = chosen[1].reading


def _print_reading(out: dict) -> None:
    r = out.get("config_fields")
    if r is None:
        return
    print(f"read: {', '.join(r['read']) or 'none'}")
    if r["at_default"]:
        print(f"at the library's default (the value audited): {', '.join(r['at_default'])}")
    for k, why in r["neutral"].items():
        print(f"accepted {k}: {why}")
    for k, v in r["fixed"].items():
        print(f"accepted {k} = {printable(repr(v))}: the one value transformers' code implements")
    if r["defaults"]:
        print(
            "library defaults taken: " + ", ".join(f"{k} = {printable(repr(v), 60)}" for k, v in r["defaults"].items())
        )


def _count_scope(a, chosen: tuple[str, Preset] | None) -> int:
    """``attnid count --preset NAME|--config PATH --scope block|model`` (and any scope of latent attention):
    the closed form term by term (chapters 8 and 9)."""
    if chosen is None:
        raise ValueError(f"scope: --scope {a.scope} needs --preset or --config (the MLP, norms and vocabulary "
                         "come from it)")  # fmt: skip
    name, p = chosen
    c = scope_count(p, a.scope, name)
    arch = asdict(p.config) if isinstance(p.config, MLAConfig) else _arch(p.config)
    out = {"architecture": arch, "scope": a.scope, "model": asdict(p.model) if p.model else None, **c.as_dict()}
    _add_reading(out, chosen)
    if a.json:
        print(strict_json(out))
        return 0
    _print_reading(out)
    print(f"{p.description}, scope {a.scope} ({p.model.source if p.model else ''})")
    if a.scope == "block" and p.model is not None and p.model.nope_layers:
        print(f"(a RoPE layer; the model's {p.model.nope_layers} NoPE layers: `--scope attention` shows both kinds, "
              "`--scope model` counts each)")  # fmt: skip
    print(f"{'params':<24}{'':>16}")
    for k, v in c.params_by_block.items():
        print(f"  {k:<22}{v:>16,}")
    print(f"{'unidentified, by term':<24}")
    for k, v in c.unidentified_by_block.items():
        print(f"  {k:<22}{v:>16,}")
    print(f"{'total':<24}{c.total_params:>16,} parameters, {c.unidentified:,} unidentified "
          f"({c.unidentified / c.total_params:.4%})")  # fmt: skip
    return 0


def _print_audit(out: dict, as_json: bool) -> None:
    """An audit's result: JSON, or one ``key value`` line each (details flattened in)."""
    if as_json:
        print(strict_json(out))
        return
    for k, v in {**{k: v for k, v in out.items() if k != "details"}, **out["details"]}.items():
        print(f"{k:<22}{v:.3e}" if isinstance(v, float) else f"{k:<22}{v}")


def _audit_hf(a) -> int:
    """``attnid audit --hf TYPE``: the real transformers module, compared with the closed form (the flags that
    ``--hf`` cannot take are refused here; every check on values is the library's)."""
    from .hf import audit_hf

    extra = [f for f, v in (("--preset", a.preset), ("--value-dim", a.value_dim), ("--batch", a.batch),
                            ("--seq-len", a.seq_len)) if v is not None]  # fmt: skip
    extra += [f for f, v in (("--causal", a.causal), ("--method", a.method != "auto")) if v]
    if extra:
        raise ValueError(f"hf: {', '.join(extra)} cannot be combined with --hf (the module and its data fix them)")
    if not a.hf.strip():
        raise ValueError(f"hf: give a model type ({', '.join(HF_TYPE_NAMES)})")
    a.hf = a.hf.strip().lower()  # as --preset: case does not matter
    scope_flags = [f for f, v in (("--block", a.block), ("--model", a.model)) if v]
    if len(scope_flags) > 1:
        raise ValueError("scope: give --block or --model, not both")
    scope = "model" if a.model else "block" if a.block else "attention"
    if a.qk_norm is not None and a.hf in HF_TYPES and a.qk_norm != HF_TYPES[a.hf].qk_norm:
        has = HF_TYPES[a.hf].qk_norm
        with_norm = ", ".join(t for t, f in HF_TYPES.items() if f.qk_norm == a.qk_norm)
        per = "head" if has == "head" else "projection"
        what = f"normalises queries and keys per {per}" if has else "has no QK-norm"
        raise ValueError(f"qk-norm: {a.hf}'s attention {what}; --qk-norm {a.qk_norm} is the module of {with_norm}")
    E, H = (
        (HF_DEFAULTS[scope]["embed"] if a.embed is None else a.embed),
        (HF_DEFAULTS[scope]["heads"] if a.heads is None else a.heads),
    )
    for flag, v in (("embed", E), ("heads", H)):
        if v < 1:
            raise ValueError(f"{flag} must be a positive integer, got {v}")
    rope_dims = a.rope_dims
    if a.rope and rope_dims is None:
        rope_dims = E // H if a.head_dim is None else a.head_dim
    r = audit_hf(
        a.hf, embed=E, heads=H, groups=a.groups, head_dim=a.head_dim, rope_dims=rope_dims, bias=a.bias,
        seed=a.seed, check=False, max_memory=None if a.max_memory is None else a.max_memory * 2**30,
        scope=scope, ffn=a.ffn, norm_eps=a.norm_eps, progress=True, layers=a.layers, vocab=a.vocab, tied=a.tied,
    )  # fmt: skip
    return _report_hf_audit(r, a.json)


def _report_hf_audit(r, as_json: bool) -> int:
    """Print a real-module audit; exit status 1 (and the library's one line on stderr,
    :func:`attnid.hf.check_hf_audit`) unless its Jacobian count equals the closed form with a clear gap."""
    from .hf import HFAuditError, check_hf_audit

    d = dict(r.details)
    out = {"hf_type": d.pop("hf_type"), "module": d.pop("module"), **r.as_dict()}
    out["details"] = d
    _print_audit({**out, "theory_unidentified": d["theory_unidentified"]}, as_json)
    try:
        check_hf_audit(r)
    except HFAuditError as e:
        print(f"attnid: error: {e}", file=sys.stderr)
        return 1
    return 0


def _audit_mla(a) -> int:
    """``attnid audit --hf deepseek_v3 [--block [--ffn F] [--experts K]]``: multi-head latent attention, or its
    decoder layer, with its own size flags."""
    from .hf import audit_mla_hf

    refused = [f for f, v in (("--groups", a.groups), ("--bias", a.bias), ("--layers", a.layers),
                              ("--vocab", a.vocab), ("--tied/--untied", a.tied), ("--preset", a.preset),
                              ("--batch", a.batch), ("--seq-len", a.seq_len), ("--qk-norm", a.qk_norm),
                              ("--max-memory", a.max_memory)) if v is not None]  # fmt: skip
    refused += [f for f, v in (("--model", a.model), ("--rope", a.rope), ("--causal", a.causal),
                               ("--method", a.method != "auto")) if v]  # fmt: skip
    if refused:
        raise ValueError(f"{', '.join(refused)}: {a.hf} is audited as one attention layer or one decoder layer "
                         "(--block), sized by --embed, --heads, --kv-rank, --q-rank, --head-dim (position-free), "
                         "--rope-dims, --value-dim, --ffn and --experts")  # fmt: skip
    if not a.block and (a.ffn is not None or a.experts is not None):
        raise ValueError("ffn/experts: the attention module has no MLP; add --block")
    E = 16 if a.embed is None else a.embed
    cfg = MLAConfig(
        E, 2 if a.heads is None else a.heads, kv_rank=6 if a.kv_rank is None else a.kv_rank,
        q_rank=None if a.q_rank == 0 else (6 if a.q_rank is None else a.q_rank),
        nope_dim=4 if a.head_dim is None else a.head_dim, rope_dim=2 if a.rope_dims is None else a.rope_dims,
        v_dim=4 if a.value_dim is None else a.value_dim, norm_eps=a.norm_eps,
    )  # fmt: skip
    r = audit_mla_hf(
        cfg,
        seed=a.seed,
        check=False,
        scope="block" if a.block else "attention",
        ffn=a.ffn,
        experts=0 if a.experts is None else a.experts,
        progress=not a.json,
    )
    return _report_hf_audit(r, a.json)


AUDIT_DEFAULTS = {"method": "auto", "norm_eps": 0.0, "seed": 0}  # `attnid audit`'s flags that have a default


def _given_flags(a, allowed: tuple[str, ...]) -> list[str]:
    """The flags of ``attnid audit`` given (a value other than its default; 0 is a value) outside ``allowed``."""
    return [
        f"--{k.replace('_', '-')}"
        for k, v in vars(a).items()
        if k not in (*allowed, "command", "func")
        and v is not None
        and v is not False
        and not (k in AUDIT_DEFAULTS and v == AUDIT_DEFAULTS[k])
    ]


def _audit_config(a) -> int:
    """``attnid audit --config PATH [--block]``: the config's family, its real module at the config's structure
    and a small width (as ``presets --verify``), compared with the closed form."""
    from .hf import structure_audit

    given = _given_flags(a, ("config", "block", "seed", "json", "threads"))
    if given:
        raise ValueError(f"config: {', '.join(given)} cannot be combined with --config (the config fixes the "
                         "structure; the audit its small width)")  # fmt: skip
    name, p = _chosen(a)  # type: ignore[misc]
    r = structure_audit(p, "block" if a.block else "attention", name)[1](a.seed)
    return _report_hf_audit(r, a.json)


def _audit_run(a) -> int:
    """``attnid audit --run DIR [--layer K]``: the attention layers of a trained run at their trained weights, on
    validation text, against the generic count (:mod:`attnid.lm.points`)."""
    from .lm.data import load
    from .lm.points import audit_run

    given = _given_flags(a, ("run", "layer", "seed", "json", "threads", "method"))
    if given:
        raise ValueError(f"run: {', '.join(given)} cannot be combined with --run (the run's model fixes the "
                         "structure, its validation text the data)")  # fmt: skip
    layers = None if a.layer is None else [a.layer]
    rows = audit_run(a.run, load(), layers=layers, seed=a.seed, method=a.method, progress=not a.json)
    return _print_points({"run": str(a.run)}, rows, a.json)


def _audit_checkpoint(a) -> int:
    """``attnid audit --checkpoint DIR [--layer K]``: a transformers checkpoint's attention layers at their trained
    weights, against the generic count (:mod:`attnid.checkpoints`)."""
    from .checkpoints import audit_checkpoint

    given = _given_flags(a, ("checkpoint", "layer", "seed", "json", "threads", "max_memory"))
    if given:
        raise ValueError(f"checkpoint: {', '.join(given)} cannot be combined with --checkpoint (its config fixes "
                         "the structure, its weights the point)")  # fmt: skip
    layers = None if a.layer is None else [a.layer]
    max_memory = None if a.max_memory is None else a.max_memory * 2**30
    rows = audit_checkpoint(a.checkpoint, layers=layers, seed=a.seed, max_memory=max_memory, progress=not a.json)
    return _print_points({"checkpoint": str(a.checkpoint)}, rows, a.json)


def _print_points(source: dict, rows: list[dict], as_json: bool) -> int:
    """Trained-point audits (:func:`attnid.lm.points.audit_point`'s rows): JSON, or a table of a column per layer
    and a one-line verdict."""
    from .lm.points import GENERIC_KEYS

    if as_json:
        print(strict_json({**source, "layers": rows}))
        return 0
    print(f"{'':<14}" + "".join(f"{'layer ' + str(r['layer']):>16}" for r in rows))
    for k in [*GENERIC_KEYS[1:], "seconds", "note"]:
        cells = [r.get(k) for r in rows]
        if k == "weakest":  # a certificate gives a lower bound, and says so
            cells = [
                f"≥{c:.3e}" if r["method"] == "certify" and isinstance(c, float) else c for r, c in zip(rows, cells)
            ]
        if k == "note" and not any(cells):
            continue
        print(f"{k:<14}" + "".join(f"{c:>16.3e}" if isinstance(c, float) else f"{c!s:>16}" for c in cells))
    special = [r["layer"] for r in rows if r["at_generic"] is False]
    undecided = [r["layer"] for r in rows if r["at_generic"] is None]
    if special:
        print(f"special point at layer(s) {special}: more unidentified directions than the generic count")
    if undecided:
        print(f"undecided at layer(s) {undecided}: see note (--method dense decides at a small width)")
    if not special and not undecided:
        print("every layer at a generic point")
    print("weakest: the weakest identified direction over the strongest, on the tokens read (more data, a larger "
          "value); ≥: a certificate's lower bound")  # fmt: skip
    return 0


def cmd_audit(a) -> int:
    _set_threads(a)
    if a.run is not None and a.checkpoint is not None:
        raise ValueError("run/checkpoint: give --run DIR or --checkpoint DIR, not both")
    if a.max_memory is not None and not (math.isfinite(a.max_memory) and a.max_memory > 0):
        raise ValueError(f"max-memory must be a positive number of GiB, got {a.max_memory}")
    if a.run is not None:
        return _audit_run(a)
    if a.checkpoint is not None:
        return _audit_checkpoint(a)
    if a.layer is not None:
        raise ValueError("layer: --layer chooses a layer of a trained run or checkpoint; give --run or --checkpoint")
    if a.config is not None:
        return _audit_config(a)
    if a.hf is not None:
        if a.hf.strip().lower() in MLA_TYPES:
            a.hf = a.hf.strip().lower()
            return _audit_mla(a)
        if a.kv_rank is not None or a.q_rank is not None or a.experts is not None:
            raise ValueError(f"kv-rank/q-rank/experts: only {', '.join(MLA_TYPES)} has latents and experts")
        return _audit_hf(a)
    return _audit_layer(a)


def _audit_layer(a) -> int:
    """``attnid audit [architecture flags]``: our column-form layer, compared with the closed form."""
    whole = [f for f, v in (("--block", a.block), ("--model", a.model), ("--ffn", a.ffn), ("--layers", a.layers),
                            ("--vocab", a.vocab), ("--tied/--untied", a.tied), ("--experts", a.experts))
             if v not in (None, False)]  # fmt: skip
    if whole:
        raise ValueError(f"{', '.join(whole)}: whole blocks and models are audited through --hf TYPE")
    latent = [f for f, v in (("--kv-rank", a.kv_rank), ("--q-rank", a.q_rank)) if v is not None]
    if latent:
        raise ValueError(f"{', '.join(latent)}: latents are audited through --hf {' | '.join(MLA_TYPES)}")
    from .audit import audit  # torch.func is only needed here

    cfg = _config(a, causal=a.causal)
    if a.norm_eps != 0:
        if not cfg.qk_norm:
            raise ValueError("norm-eps: this attention has no norm; add --qk-norm head|proj")
        cfg = cfg.with_(qk_norm_eps=a.norm_eps)
    r = audit(
        cfg,
        batch=a.batch,
        seq_len=a.seq_len,
        seed=a.seed,
        method=a.method,
        progress=not a.json,
        max_memory=None if a.max_memory is None else a.max_memory * 2**30,
    )
    theory = count(cfg).unidentified if not (cfg.rope and cfg.D > cfg.E) else None
    status = (
        "measured, no closed form to compare (RoPE with D > E)"
        if theory is None
        else "verified: equals the closed form"
        if r.unidentified == theory
        else "disagrees with the closed form"
    )
    out = {"architecture": _arch(cfg), **r.as_dict(), "theory_unidentified": theory, "status": status}
    _print_audit(out, a.json)
    if theory is not None and r.unidentified != theory:
        print(
            f"attnid: error: the Jacobian shows {r.unidentified} unidentified parameters, the closed form "
            f"{theory} (rerun with a larger --batch or --seq-len before believing it)",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_presets(a) -> int:
    from .presets import ALL_PRESETS, preset_rows

    verified = verified_block = None
    _set_threads(a)  # validates --threads with or without --verify
    if a.verify:
        from .hf import verify_presets

        verified = verify_presets(list(ALL_PRESETS), progress=True)  # raises HFAuditError on any disagreement
        verified_block = verify_presets(list(ALL_PRESETS), progress=True, scope="block")
    rows = preset_rows(verified, verified_block, presets=ALL_PRESETS)
    if a.json:
        print(strict_json(rows))
        return 0

    def share(v) -> str:
        return "-" if v is None else f"{v:.3%}"

    print(
        f"{'name':<21}{'model type':<11}{'E':>6}{'H':>4}{'G':>4}{'D':>5}{'RoPE':>6}{'bias':>6}{'layers':>7}"
        f"{'attention':>11}{'block':>9}{'model':>9}{'unidentified (model)':>22}{'verified':>12}"
    )
    for r in rows:
        checked = "-" if r["verified"] is None else "attn+block" if r["verified_block"] else "attention"
        model_unid = "-" if r["model_unidentified"] is None else f"{r['model_unidentified']:,}"
        print(
            f"{r['name']:<21}{r['hf_type'] or '-':<11}{r['embed']:>6}{r['heads']:>4}{r['groups']:>4}{r['head_dim']:>5}"
            f"{r['rope_dims'] or '-':>6}{r['bias']:>6}{r['layers'] or '-':>7}{share(1 - r['identified_fraction']):>11}"
            f"{share(r['block_unidentified_share']):>9}{share(r['model_unidentified_share']):>9}{model_unid:>22}"
            f"{checked:>12}"
        )
    print("(attention, block, model: the unidentified share at each scope; `attnid count --preset NAME --scope model`")
    print(" gives the terms)")
    if not a.verify:
        print("(--verify audits each structure, attention and whole decoder layer, through its transformers module, "
              "about 45 s on 2 cores)")  # fmt: skip
    return 0


def _run_options(a) -> dict:
    """The execution flags of ``train``/``experiments``; ``--save-model`` only where given (the profile's
    default otherwise: on at smoke and cpu)."""
    save = {} if a.save_model is None else {"save_model": a.save_model}
    return {"precision": a.precision, "compile": a.compile, **save}


def _set_threads(a) -> None:
    """``--threads``, else a default that leaves room for what else the machine is running."""
    import torch

    from .lm.profiles import default_threads

    cores = os.cpu_count() or 1
    if a.threads is not None and not 1 <= a.threads <= cores:
        raise ValueError(f"threads must be from 1 to the {cores} cores of this machine, got {a.threads}")
    torch.set_num_threads(default_threads() if a.threads is None else a.threads)


def _check_launcher_flags(a) -> None:
    """Refuse launcher options that the chosen launcher would ignore."""
    slurm_only = [
        flag
        for flag, given in (
            ("--partition", a.partition is not None),
            ("--time", a.time != SLURM.time_min),
            ("--gpus-per-job", a.gpus_per_job != SLURM.gpus_per_job),
            ("--cpus-per-job", a.cpus_per_job != SLURM.cpus_per_job),
            ("--mem-gb", a.mem_gb is not None),
            ("--array-parallelism", a.array_parallelism != SLURM.array_parallelism),
            ("--wait", a.wait),
        )
        if given
    ]
    if slurm_only and a.launcher != "slurm":
        raise ValueError(f"launcher: {', '.join(slurm_only)} only apply to --launcher slurm")
    if a.parallel != 1 and a.launcher != "local":
        raise ValueError("parallel: only --launcher local runs several processes at once")
    if a.stacked and a.launcher != "inline":
        raise ValueError("stacked: trains in this process; it cannot be combined with --launcher local|slurm")


def _check_device(a) -> None:
    """The device, and what the execution flags ask of it (``--precision tf32`` and ``--compile`` exist on CUDA
    only), checked before anything trains; the paper profile on the CPU is refused unless asked for by name."""
    from .lm.profiles import check_compile, resolve_device, resolve_precision

    device = resolve_device(a.device)
    resolve_precision(a.precision, device)
    check_compile(a.compile, device)
    if a.profile == "paper" and device == "cpu":
        if a.device == "auto":
            raise ValueError(
                "device: the paper profile needs a GPU (one run takes about a day on 2 CPU cores); "
                "pass --device cpu to run it on the CPU anyway"
            )
        print("attnid: warning: the paper profile on the CPU takes about a day per run on 2 cores", file=sys.stderr)


def cmd_train(a) -> int:
    from .lm.profiles import make_config
    from .lm.train import train

    cfg = make_config(a.profile, a.case, seed=a.seed, device=a.device, **_run_options(a))
    _check_device(a)
    _set_threads(a)
    s = train(cfg, force=a.force, progress=not a.json)
    s.pop("rows", None)
    s.pop("heads", None)
    print(
        strict_json(s)
        if a.json
        else f"{a.profile}/{a.case}: final val loss {s['final_val_loss']:.4f}, {s['wall_seconds']:.1f} s, "
        f"{s['tokens_per_second']:,.0f} tokens/s on {s['device']} ({s['precision']})"
    )
    return 0


def cmd_data(a) -> int:
    from .lm.data import corpus_path

    p = corpus_path(a.path)
    print(f"tiny Shakespeare: {p} (sha256 verified)")
    return 0


def cmd_experiments(a) -> int:
    """Every run of a suite, through a launcher (:mod:`attnid.lm.launch`); everything is checked before
    the first run."""
    from .lm.launch import SlurmOptions, launch
    from .lm.profiles import SUITES, check_profile, make_config

    if a.suite not in SUITES:
        raise ValueError(f"suite: unknown {a.suite!r}; choose one of {', '.join(SUITES)}")
    suite = SUITES[a.suite]
    check_profile(a.profile)
    seeds = [a.seed] if a.seed is not None else suite.seeds[a.profile]
    _check_launcher_flags(a)
    cases = suite.cases_at(a.profile)
    cfgs = [make_config(a.profile, c, seed=s, device=a.device, **_run_options(a)) for s in seeds for c in cases]
    slurm = None
    if a.launcher == "slurm":  # the jobs resolve the device on their own nodes
        slurm = SlurmOptions(
            partition=a.partition,
            time_min=a.time,
            gpus_per_job=a.gpus_per_job,
            cpus_per_job=a.cpus_per_job,
            mem_gb=a.mem_gb,
            array_parallelism=a.array_parallelism,
        )
    else:
        _check_device(a)
        _set_threads(a)
    if a.stacked:  # (_check_launcher_flags refused it with another launcher)
        from .lm.batched import stacks, train_stack

        for stack in stacks(cfgs):
            for s in train_stack(stack, force=a.force, progress=True):
                runs = len(s.get("stacked_with", [0]))
                print(f"{a.profile}/{s['case']} seed {s['seed']}: final val loss {s['final_val_loss']:.4f} "
                      f"({s['precision']}, stacked with {runs} runs)", flush=True)  # fmt: skip
        return 0
    from .lm.records import runs_root

    folder = Path(a.log_dir) if a.log_dir else runs_root() / ".submitit"  # make_executor checks it
    launch(
        cfgs, a.launcher, force=a.force, folder=folder, parallel=a.parallel, slurm=slurm, wait=a.wait,
        report=lambda line: print(line, flush=True), threads=a.threads,
    )  # fmt: skip
    return 0


def cmd_claims(a) -> int:
    """The §5 claims evaluated on the records found (chapter 6's table); trains nothing."""
    from .lm.analysis import load_suite
    from .lm.claims import evaluate_claims, evaluate_point_claims
    from .lm.profiles import check_profile

    check_profile(a.profile)
    seeds = None
    if a.seed_set is not None:
        parts = [s.strip() for s in a.seed_set.split(",") if s.strip()]
        if not parts or not all(s.isascii() and s.isdigit() for s in parts):
            raise ValueError(f"seed-set: expected comma-separated non-negative seeds such as 0,1,2, got {a.seed_set!r}")
        seeds = sorted({int(s) for s in parts})
    if a.runs and not Path(a.runs).is_dir():
        raise ValueError(f"runs: {a.runs} is not a folder of run records (<runs>/<profile>/<case>)")
    base = Path(a.runs) if a.runs else None
    runs = load_suite(a.profile, "dynamics", seeds=seeds, base=base)
    points = load_suite(a.profile, "points", seeds=seeds, base=base)
    rows = evaluate_claims(runs)
    point_rows = evaluate_point_claims({"dynamics": runs, "points": points})
    if a.json:
        print(strict_json(rows + point_rows))
        return 0
    print(f"profile {a.profile}: the paper's §5 claims on {sum(len(v) for v in runs.runs.values())} records")
    _print_claims(rows)
    print(f"chapter 10, trained points: {sum(len(v) for v in points.runs.values())} more records")
    _print_claims(point_rows)
    return 0


def _print_claims(rows: list[dict]) -> None:
    print(f"{'id':<25}{'value':>11}{'range':>22}  {'test':<10}{'seeds':>6}  verdict")
    for r in rows:
        v = "-" if r["value"] is None else f"{r['value']:.3g}"
        rng = "" if r["low"] is None or r["seeds"] < 2 else f"{r['low']:.3g} .. {r['high']:.3g}"
        print(f"{r['id']:<25}{v:>11}{rng:>22}  {r['op']} {r['threshold']:<8g}{r['seeds']:>6}  {r['verdict']}"
              + (f" ({r['reason']})" if r["reason"] else ""))  # fmt: skip
        if r["depends_on"]:
            print(f"{'':<4}{r['depends_on']}")


def _threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, help="torch/LAPACK threads (default: the cores not busy with other work)")


def _exec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--precision",
        default="auto",
        choices=PRECISIONS,
        help="auto: bf16 autocast on CUDA, fp32 on the CPU; tf32: CUDA only (the metrics are float64 either way)",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the model (CUDA only; refused elsewhere)")
    p.add_argument(
        "--save-model", action=argparse.BooleanOptionalAction,
        help="write model.pt: the final weights and the attention layers' weights at every evaluation (chapter 10; "
        "default: on at the smoke and cpu profiles)",
    )  # fmt: skip
    _threads_arg(p)


def build_parser() -> argparse.ArgumentParser:
    """The ``attnid`` argument parser: every subcommand (one function each, below) and its flags."""
    ap = argparse.ArgumentParser(prog="attnid", description="Parameter identification in attention layers.")
    sub = ap.add_subparsers(dest="command", required=True)
    parsers = (_count_parser, _audit_parser, _train_parser, _data_parser, _experiments_parser, _claims_parser)
    for add in (*parsers, _presets_parser):
        add(sub)
    return ap


def _count_parser(sub) -> None:
    """``attnid count``: the closed-form counts of an architecture or preset."""
    p = sub.add_parser("count", help="closed-form parameter and unidentified counts")
    _arch_args(p)
    p.add_argument(
        "--scope", default="attention", choices=SCOPES,
        help="with --preset: one attention layer (default), one whole decoder layer, or the whole model",
    )  # fmt: skip
    p.set_defaults(func=cmd_count)


def _audit_parser(sub) -> None:
    """``attnid audit``: the Jacobian count of our layer, or of a transformers module (``--hf``)."""
    p = sub.add_parser("audit", help="numerical count: #params − rank of the Jacobian")
    _arch_args(p)
    p.add_argument("--causal", action="store_true", help="causal mask")
    p.add_argument("--seq-len", type=int, help="sequence length L (default 8; with RoPE max(16, 2D), also its minimum)")
    p.add_argument("--batch", type=int, help="number of random sequences (default: sized from #params)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--method", default="auto", choices=AUDIT_METHODS)
    p.add_argument(
        "--hf",
        metavar="TYPE",
        help=f"audit the attention module of a Hugging Face transformers model type ({', '.join(HF_TYPE_NAMES)}) "
        "at --embed and --heads (defaults: "
        + "; ".join(f"{k} {v['embed']} and {v['heads']}" for k, v in HF_DEFAULTS.items())
        + "); needs the [hf] extra",
    )
    g = p.add_argument_group("whole blocks and models (with --hf; chapter 8)")
    g.add_argument("--block", action="store_true", help="audit one whole decoder layer: norms, attention, MLP")
    g.add_argument("--model", action="store_true", help="audit a tiny whole causal LM (log-probabilities)")
    g.add_argument("--ffn", type=int, help="MLP inner size F (default: the type's usual ratio to E)")
    g.add_argument("--layers", type=int, help="--model: decoder layers (default 1)")
    g.add_argument("--vocab", type=int, help="--model: vocabulary size (default: large enough to excite every layer)")
    g.add_argument("--tied", dest="tied", action="store_const", const=True, help="--model: tie the LM head")
    g.add_argument("--untied", dest="tied", action="store_const", const=False, help="--model: untie the LM head")
    g.add_argument("--kv-rank", type=int, help="deepseek_v3: rank of the key/value latent (default 6)")
    g.add_argument("--q-rank", type=int, help="deepseek_v3: rank of the query latent (default 6; 0: no query latent)")
    g.add_argument(
        "--experts", type=int,
        help="deepseek_v3 --block: a mixture of K routed experts of inner size --ffn (two chosen per token) and one "
        "shared expert, in place of one MLP (default: one MLP, as DeepSeek-V3's first layers)",
    )  # fmt: skip
    g.add_argument(
        "--norm-eps",
        type=float,
        default=0.0,
        help="--block, --model, or the attention of a type with QK-norm: every norm's epsilon (default 0: exact scale "
        "symmetry)",
    )
    g = p.add_argument_group("trained points (chapter 10)")
    g.add_argument(
        "--run", metavar="DIR",
        help="a trained run's folder (with model.pt: `attnid train --save-model`): audit its attention layers at "
        "their trained weights on validation text ($ATTNID_DATA or the downloaded corpus)",
    )  # fmt: skip
    g.add_argument(
        "--checkpoint", metavar="DIR",
        help="a transformers save_pretrained folder of a family attnid knows (read offline): audit its attention "
        "layers at their trained weights on the hidden states its own model makes from random tokens",
    )  # fmt: skip
    g.add_argument(
        "--layer", type=int, help="--run or --checkpoint: only this layer, numbered from 1 (default: every layer)"
    )
    _threads_arg(p)
    p.add_argument("--max-memory", type=float, help="refuse audits estimated to need more GiB (default: free memory)")
    p.set_defaults(func=cmd_audit)


def _train_parser(sub) -> None:
    """``attnid train``: one run of chapter 6."""
    p = sub.add_parser("train", help="train one case of chapter 6 (resumes or reuses its run record)")
    p.add_argument("--profile", default="cpu", help="smoke | cpu | mid | paper")
    p.add_argument("--case", default="adamw", help=" | ".join(CASES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:n]")
    p.add_argument("--force", action="store_true", help="discard an existing run record and start over")
    _exec_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_train)


def _data_parser(sub) -> None:
    """``attnid data``: the corpus."""
    p = sub.add_parser("data", help="locate (or download) and verify the tiny Shakespeare corpus")
    p.add_argument("--path", help="a local copy (default: $ATTNID_DATA, else data/tinyshakespeare.txt)")
    p.set_defaults(func=cmd_data)


def _experiments_parser(sub) -> None:
    """``attnid experiments``: every run of a suite, inline or through submitit."""
    p = sub.add_parser("experiments", help="run every case of a suite")
    p.add_argument("--profile", default="cpu")
    p.add_argument("--suite", default="dynamics", help="dynamics (chapter 6) | heads (chapter 7)")
    p.add_argument("--seed", type=int, default=None, help="one seed (default: the suite's seeds for the profile)")
    p.add_argument("--device", default="auto")
    p.add_argument("--force", action="store_true")
    _exec_args(p)
    g = p.add_argument_group("launcher (submitit: one job per run, each writing its own record)")
    g.add_argument(
        "--launcher",
        default="inline",
        choices=[name for name in LAUNCHERS if name != "debug"],
        help="inline: one run after another in this process (default); local: a process per run on this "
        "machine, with no practical deadline (a week; submitit's own default would kill a job after 2 minutes); "
        "slurm: a SLURM job array (--time per run)",
    )
    g.add_argument("--parallel", type=int, default=1, help="local: runs at once (one GPU gains nothing from more)")
    g.add_argument(
        "--log-dir", help="where submitit keeps job logs and results (default: .submitit in the runs folder)"
    )
    g.add_argument("--partition", help="slurm: partition")
    g.add_argument(
        "--time", type=int, default=SLURM.time_min, help=f"slurm: minutes per run (default {SLURM.time_min})"
    )
    g.add_argument(
        "--gpus-per-job",
        type=int,
        default=SLURM.gpus_per_job,
        help=f"slurm: GPUs per run (default {SLURM.gpus_per_job})",
    )
    g.add_argument(
        "--cpus-per-job",
        type=int,
        default=SLURM.cpus_per_job,
        help=f"slurm: CPU cores per run (default {SLURM.cpus_per_job})",
    )
    g.add_argument("--mem-gb", type=int, help="slurm: memory per run")
    g.add_argument(
        "--array-parallelism", type=int, default=SLURM.array_parallelism, help="slurm: runs of the array at once"
    )
    g.add_argument("--wait", action="store_true", help="slurm: wait for the runs and print their results")
    p.add_argument(
        "--stacked",
        action="store_true",
        help="train the runs of each model shape, seeds and cases, as one stacked model (attnid.lm.batched; pays "
        "on a GPU)",
    )
    p.set_defaults(func=cmd_experiments)


def _claims_parser(sub) -> None:
    """``attnid claims``: the §5 claims on the records."""
    p = sub.add_parser("claims", help="the paper's §5 claims, evaluated on the run records found")
    p.add_argument("--profile", default="cpu", help="smoke | cpu | mid | paper")
    p.add_argument("--seed-set", help="comma-separated seeds to use (default: every seed found)")
    p.add_argument(
        "--runs",
        help="a runs folder (default: $ATTNID_RUNS, else data/runs); then, for paper and mid, the committed records",
    )
    p.add_argument("--json", action="store_true", help="a JSON list, one object per claim")
    p.set_defaults(func=cmd_claims)


def _presets_parser(sub) -> None:
    """``attnid presets``: the published architectures."""
    p = sub.add_parser("presets", help="list the published architectures")
    p.add_argument("--json", action="store_true")
    p.add_argument("--verify", action="store_true", help="audit each structure through its transformers module")
    _threads_arg(p)
    p.set_defaults(func=cmd_presets)


def main(argv: list[str] | None = None) -> int:
    """Expected failures print one line ``attnid: error: ...`` (2: bad input, 1: a check failed,
    130: interrupted); anything else is a bug and keeps its traceback."""
    from .audit import CertificateError
    from .hf import HFAuditError
    from .lm.data import DataError
    from .lm.launch import LaunchError, Stopped, sigterm_as_interrupt
    from .lm.records import RecordError, Refused
    from .lm.train import Interrupted

    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        with sigterm_as_interrupt():  # SIGTERM stops a command as Ctrl-C does, with its one line
            return a.func(a)
    except (ValueError, DataError, Refused) as e:
        print(f"attnid: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # an allocation the machine refused (the guards estimate; they can be overridden)
        print(f"attnid: error: {e or 'out of memory'}", file=sys.stderr)
        return 1
    except Stopped as e:  # a local suite stopped, its jobs with it
        print(f"attnid: {e}", file=sys.stderr)
        return 143 if e.signame == "SIGTERM" else 130
    except (RecordError, CertificateError, LaunchError, HFAuditError) as e:
        print(f"attnid: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of stdout went away (`| head`): what it read is what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # the machine said no: a read-only folder, a full disk, a missing program
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(f"attnid: error: {e.strerror or e}{where}; a run that stopped resumes when rerun", file=sys.stderr)
        return 1
    except Interrupted as e:
        print(f"attnid: {e}", file=sys.stderr)
        return 143 if e.signame == "SIGTERM" else 130
    except KeyboardInterrupt as e:  # outside a training loop (a loop reports its step itself)
        signame = getattr(e, "signame", "SIGINT")
        print(
            f"attnid: interrupted ({signame}, attnid {a.command}); finished runs and records are kept and reused: "
            "run the same command again",
            file=sys.stderr,
        )
        return 143 if signame == "SIGTERM" else 130


if __name__ == "__main__":
    sys.exit(main())
