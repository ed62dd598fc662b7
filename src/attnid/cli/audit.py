"""``attnid audit``: the Jacobian count of our layer, of a ``transformers`` module (``--hf``), of a released
config's structure (``--config``), of a trained run (``--run``) or checkpoint (``--checkpoint``) (:mod:`attnid.cli`)."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

from ..attention_config import QK_NORM_NAMES
from ..audit import METHODS as AUDIT_METHODS
from ..counting import RESIDUALS, MLAConfig, count
from ..families import HF_TYPES, MLA_TYPES
from ..inputs import printable
from ..presets import mixer_layers_note
from .commands import add_command
from .common import (
    HF_DEFAULTS,
    HF_TYPE_NAMES,
    arch_args,
    arch_dict,
    attention_config,
    chosen_model,
    given_flags,
    human,
    set_threads,
    strict_json,
    threads_arg,
)


def _print_audit(out: dict, as_json: bool) -> None:
    """An audit's result: JSON, or one ``key value`` line each (details flattened in, :func:`human` numbers) and a
    verdict line: the Jacobian's count against the closed form."""
    if as_json:
        print(strict_json(out))
        return
    flat = {**{k: v for k, v in out.items() if k != "details"}, **out.get("details", {})}
    for k, v in flat.items():
        print(f"{k:<22}{human(v)}")
    theory = flat.get("theory_unidentified")
    if theory is not None:
        same = "equals" if out["unidentified"] == theory else "differs from"
        print(f"verdict: the Jacobian's count ({out['unidentified']:,} unidentified of {out['total_params']:,}) "
              f"{same} the closed form ({theory:,}); singular-value gap {human(out['sv_gap'])}")  # fmt: skip


def _audit_hf(a) -> int:
    """``attnid audit --hf TYPE``: the real transformers module, compared with the closed form (the flags that
    ``--hf`` cannot take are refused here; every check on values is the library's)."""
    from ..hf import audit_hf

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
    qk_norm = None if a.qk_norm is None else ("" if a.qk_norm == "none" else a.qk_norm)
    if qk_norm is not None and a.hf in HF_TYPES and qk_norm not in HF_TYPES[a.hf].qk_norms():
        can = " or ".join(QK_NORM_NAMES[q] for q in HF_TYPES[a.hf].qk_norms())
        with_norm = ", ".join(t for t, f in HF_TYPES.items() if qk_norm in f.qk_norms()) or "no type attnid builds"
        raise ValueError(f"qk-norm: {a.hf}'s attention has {can}; --qk-norm {a.qk_norm} is the module of {with_norm}")
    if a.output_gate and a.hf in HF_TYPES and not HF_TYPES[a.hf].output_gate:
        gated = ", ".join(t for t, f in HF_TYPES.items() if f.output_gate)
        raise ValueError(f"output-gate: {a.hf}'s attention has no output gate; it is the module of {gated}")
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
        qk_norm=qk_norm, residual=a.residual,
    )  # fmt: skip
    return _report_hf_audit(r, a.json)


def _report_hf_audit(r, as_json: bool) -> int:
    """Print a real-module audit; exit status 1 (and the library's one line on stderr,
    :func:`attnid.hf.check_hf_audit`) unless its Jacobian count equals the closed form with a clear gap."""
    from ..hf import HFAuditError, check_hf_audit

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


def _audit_hybrid(a) -> int:
    """``attnid audit --hf TYPE --model --layer-types KIND,KIND...``: a tiny whole hybrid model (LFM2, Bamba, Granite
    4, Qwen3-Next, Qwen3.5), its layers of the kinds its config names, against the closed form counted layer kind by
    layer kind (:func:`attnid.hf.hybrid.audit_hybrid_hf`)."""
    from ..hf.hybrid import audit_hybrid_hf

    hf = a.hf.strip().lower()
    if hf not in HF_TYPES or HF_TYPES[hf].hybrid is None:
        hybrids = ", ".join(t for t, f in HF_TYPES.items() if f.hybrid is not None)
        raise ValueError(f"layer-types: {printable(a.hf, 40)} is not a hybrid model; --layer-types names the layers "
                         f"of one of {hybrids}")  # fmt: skip
    if not a.model:
        raise ValueError("layer-types: the kinds of a whole model's layers; add --model")
    refused = [f for f, v in (("--head-dim", a.head_dim), ("--rope-dims", a.rope_dims), ("--bias", a.bias),
                              ("--qk-norm", a.qk_norm), ("--residual", a.residual), ("--layers", a.layers),
                              ("--preset", a.preset), ("--value-dim", a.value_dim), ("--batch", a.batch),
                              ("--seq-len", a.seq_len), ("--max-memory", a.max_memory)) if v is not None]  # fmt: skip
    refused += [f for f, v in (("--block", a.block), ("--rope", a.rope), ("--causal", a.causal),
                               ("--output-gate", a.output_gate), ("--method", a.method != "auto")) if v]  # fmt: skip
    if refused:
        raise ValueError(f"{', '.join(refused)}: a hybrid model is audited at its family's own attention, sized by "
                         "--embed, --heads, --groups, --ffn, --vocab, --tied/--untied, --experts and --norm-eps; "
                         "--layer-types gives its layers")  # fmt: skip
    kinds = tuple(k.strip() for k in a.layer_types.split(","))
    given = (("embed", a.embed), ("heads", a.heads), ("groups", a.groups), ("ffn", a.ffn), ("vocab", a.vocab),
             ("tied", a.tied), ("experts", a.experts))  # fmt: skip
    sizes = {k: v for k, v in given if v is not None}
    r = audit_hybrid_hf(hf, layer_types=kinds, norm_eps=a.norm_eps, seed=a.seed, check=False, **sizes)
    return _report_hf_audit(r, a.json)


def _audit_mla(a) -> int:
    """``attnid audit --hf deepseek_v3|deepseek_v32 [--block [--ffn F] [--experts K]]``: multi-head latent
    attention, or its decoder layer, with its own size flags (DeepSeek-V3.2's with an indexer of two heads as wide as
    a query head, choosing four of the eight keys per query)."""
    from ..hf import audit_mla_hf

    refused = [f for f, v in (("--groups", a.groups), ("--bias", a.bias), ("--layers", a.layers),
                              ("--vocab", a.vocab), ("--tied/--untied", a.tied), ("--preset", a.preset),
                              ("--batch", a.batch), ("--seq-len", a.seq_len), ("--qk-norm", a.qk_norm),
                              ("--max-memory", a.max_memory), ("--residual", a.residual)) if v is not None]  # fmt: skip
    refused += [f for f, v in (("--model", a.model), ("--rope", a.rope), ("--causal", a.causal),
                               ("--output-gate", a.output_gate),
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
    if a.hf == "deepseek_v32":
        if cfg.q_rank is None:
            raise ValueError("q-rank: DeepSeek-V3.2's indexer reads the query latent; give --q-rank 1 or more")
        cfg = replace(cfg, index_heads=2, index_dim=cfg.nope_dim + cfg.rope_dim)
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


def _audit_config(a) -> int:
    """``attnid audit --config PATH [--block]``: the config's family, its real module at the config's structure
    and a small width (as ``presets --verify``), compared with the closed form."""
    from ..hf import structure_audit

    given = given_flags(a, ("config", "block", "seed", "json", "threads"))
    if given:
        raise ValueError(f"config: {', '.join(given)} cannot be combined with --config (the config fixes the "
                         "structure; the audit its small width)")  # fmt: skip
    name, p = chosen_model(a)  # type: ignore[misc]
    r = structure_audit(p, "block" if a.block else "attention", name)[1](a.seed)
    shows = mixer_layers_note(p)  # a hybrid model: the audit is of an attention layer
    if shows:
        r.details["shows"] = shows
    return _report_hf_audit(r, a.json)


def _audit_run(a) -> int:
    """``attnid audit --run DIR [--layer K]``: the attention layers of a trained run at their trained weights, on
    validation text, against the generic count (:mod:`attnid.lm.points`)."""
    from ..lm.data import load
    from ..lm.points import audit_run

    given = given_flags(a, ("run", "layer", "seed", "json", "threads", "method"))
    if given:
        raise ValueError(f"run: {', '.join(given)} cannot be combined with --run (the run's model fixes the "
                         "structure, its validation text the data)")  # fmt: skip
    if not Path(a.run).is_dir():
        raise ValueError(
            f"run: {printable(a.run, 200)} is not a folder; give a finished run's folder (<runs>/<profile>/<case>, "
            "e.g. data/runs/cpu/adamw after `attnid train --profile cpu --case adamw`)"
        )
    layers = None if a.layer is None else [a.layer]
    rows = audit_run(a.run, load(), layers=layers, seed=a.seed, method=a.method, progress=not a.json)
    return _print_points({"run": str(a.run)}, rows, a.json)


def _audit_checkpoint(a) -> int:
    """``attnid audit --checkpoint DIR [--layer K]``: a transformers checkpoint's attention layers at their trained
    weights, against the generic count (:mod:`attnid.checkpoints`)."""
    from ..checkpoints import audit_checkpoint

    if not Path(a.checkpoint).is_dir():
        raise ValueError(
            f"checkpoint: {printable(a.checkpoint, 200)} is not a folder; give a transformers save_pretrained folder "
            "(config.json and its weights)"
        )

    given = given_flags(a, ("checkpoint", "layer", "seed", "json", "threads", "max_memory"))
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
    from ..lm.points import GENERIC_KEYS

    if as_json:
        print(strict_json({**source, "layers": rows}))
        return 0
    print(f"{'':<14}" + "".join(f"{'layer ' + str(r['layer']):>16}" for r in rows))
    for k in [*GENERIC_KEYS[1:], "seconds", "note"]:
        cells = [r.get(k) for r in rows]
        if k == "weakest":  # a certificate gives a lower bound, and says so
            cells = [
                f"≥{c:.4g}" if r["method"] == "certify" and isinstance(c, float) else c for r, c in zip(rows, cells)
            ]
        if k == "note" and not any(cells):
            continue
        print(f"{k:<14}" + "".join(f"{c if isinstance(c, str) else human(c):>16}" for c in cells))
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
    set_threads(a)
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
    if a.layer_types is not None:
        if a.hf is None:
            raise ValueError("layer-types: the layers of a real hybrid model; give --hf TYPE --model")
        return _audit_hybrid(a)
    if a.hf is not None:
        if a.hf.strip().lower() in MLA_TYPES:
            a.hf = a.hf.strip().lower()
            return _audit_mla(a)
        if a.kv_rank is not None or a.q_rank is not None or a.experts is not None:
            raise ValueError(f"kv-rank/q-rank/experts: only {' and '.join(MLA_TYPES)} take latents and experts as "
                             "flags (a mixture-of-experts type's --block is audited with four experts)")  # fmt: skip
        return _audit_hf(a)
    return _audit_layer(a)


def _audit_layer(a) -> int:
    """``attnid audit [architecture flags]``: our column-form layer, compared with the closed form."""
    whole = [f for f, v in (("--block", a.block), ("--model", a.model), ("--ffn", a.ffn), ("--layers", a.layers),
                            ("--vocab", a.vocab), ("--tied/--untied", a.tied), ("--experts", a.experts),
                            ("--residual", a.residual))
             if v not in (None, False)]  # fmt: skip
    if whole:
        raise ValueError(f"{', '.join(whole)}: whole blocks and models are audited through --hf TYPE")
    latent = [f for f, v in (("--kv-rank", a.kv_rank), ("--q-rank", a.q_rank)) if v is not None]
    if latent:
        raise ValueError(f"{', '.join(latent)}: latents are audited through --hf {' | '.join(MLA_TYPES)}")
    from ..audit import audit  # torch.func is only needed here

    cfg = attention_config(a, causal=a.causal)
    if a.norm_eps != 0:
        if not cfg.qk_norm:
            raise ValueError("norm-eps: this attention has no norm; add --qk-norm head|proj|l2|layer")
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
    out = {"architecture": arch_dict(cfg), **r.as_dict(), "theory_unidentified": theory, "status": status}
    _print_audit(out, a.json)
    if theory is not None and r.unidentified != theory:
        print(
            f"attnid: error: the Jacobian shows {r.unidentified} unidentified parameters, the closed form "
            f"{theory} (rerun with a larger --batch or --seq-len before believing it)",
            file=sys.stderr,
        )
        return 1
    return 0


def audit_parser(sub) -> None:
    """``attnid audit``: the Jacobian count of our layer, or of a transformers module (``--hf``)."""
    p = add_command(sub, "audit")
    arch_args(p)
    p.add_argument("--causal", action="store_true", help="causal mask")
    p.add_argument("--seq-len", type=int, help="sequence length L (default 8; with RoPE max(16, 2D), also its minimum)")
    p.add_argument("--batch", type=int, help="number of random sequences (default: sized from #params)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random parameters and inputs (default 0)")
    p.add_argument(
        "--method", default="auto", choices=AUDIT_METHODS,
        help="dense: the Jacobian's singular values; certify: the exact rank without forming it (large layers); "
        "auto (default): dense while it fits, else certify",
    )  # fmt: skip
    p.add_argument(
        "--hf",
        metavar="TYPE",
        help=f"audit the attention module of a Hugging Face transformers model type ({', '.join(HF_TYPE_NAMES)}) "
        "at --embed and --heads (defaults: "
        + "; ".join(f"{k} {v['embed']} and {v['heads']}" for k, v in HF_DEFAULTS.items())
        + "); needs the audit extra",
    )
    _whole_model_args(p)
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
    threads_arg(p)
    p.add_argument("--max-memory", type=float, help="refuse audits estimated to need more GiB (default: free memory)")
    p.set_defaults(func=cmd_audit)


def _whole_model_args(p) -> None:
    """``attnid audit``'s flags for whole decoder layers and models of a transformers type (``--hf``; chapter 8)."""
    g = p.add_argument_group("whole blocks and models (with --hf; chapter 8)")
    g.add_argument("--block", action="store_true", help="audit one whole decoder layer: norms, attention, MLP")
    g.add_argument("--model", action="store_true", help="audit a tiny whole causal LM (log-probabilities)")
    g.add_argument("--ffn", type=int, help="MLP inner size F (default: the type's usual ratio to E)")
    g.add_argument("--layers", type=int, help="--model: decoder layers (default 1)")
    g.add_argument("--vocab", type=int, help="--model: vocabulary size (default: large enough to excite every layer)")
    g.add_argument("--tied", dest="tied", action="store_const", const=True, help="--model: tie the LM head")
    g.add_argument("--untied", dest="tied", action="store_const", const=False, help="--model: untie the LM head")
    g.add_argument(
        "--residual", choices=RESIDUALS,
        help="--block or --model of a type whose config chooses its wiring (falcon): sequential, parallel (a norm "
        "each for attention and MLP) or shared_norm (one norm for both; default: the type's own)",
    )  # fmt: skip
    g.add_argument(
        "--layer-types", metavar="KIND,...",
        help="--model of a hybrid type: its layers' kinds in order, as its config names them (lfm2: conv, "
        "full_attention; bamba, granitemoehybrid, qwen3_next, qwen3_5, qwen3_5_moe: linear_attention, full_attention)",
    )  # fmt: skip
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
