"""``attnid count``: the closed-form counts of an architecture, a preset or a released config (:mod:`attnid.cli`)."""

from __future__ import annotations

import textwrap
from dataclasses import asdict

from ..counting import BLOCKS, SCOPES, MLAConfig, count
from ..inputs import printable
from ..presets import Preset, layer_type_counts, mixer_layers_note, scope_count
from .commands import add_command
from .common import arch_args, arch_dict, attention_config, chosen_model, strict_json, table_lines


def cmd_count(a) -> int:
    chosen = chosen_model(a)
    if a.scope != "attention" or (chosen is not None and isinstance(chosen[1].config, MLAConfig)):
        return _count_scope(a, chosen)
    cfg = _with_norm_eps(attention_config(a), a, chosen)
    c = count(cfg)
    out = {"architecture": arch_dict(cfg), **c.as_dict()}
    kinds = layer_type_counts(chosen[1]) if chosen is not None else {}
    if kinds:  # a model whose layers differ: each kind of attention layer (this count is the "rope" one)
        out["layer_types"] = {k: {**v.as_dict(), "layers": n} for (k, v), n in zip(kinds.items(), _kind_layers(chosen))}
    _add_reading(out, chosen)
    if chosen is not None and chosen[1].attention_only:  # which layers this count is (Qwen3-Next's softmax ones)
        out["attention_only"] = chosen[1].attention_only
    shows = mixer_layers_note(chosen[1]) if chosen is not None else ""  # a hybrid model: which kind of layer
    if shows:
        out["shows"] = shows
    if a.json:
        print(strict_json(out))
        return 0
    rows = [[b, c.params_by_block[b], c.unidentified_by_block[b]] for b in BLOCKS]
    print(
        "\n".join(table_lines(["block", "params", "unidentified"], [*rows, ["total", c.total_params, c.unidentified]]))
    )
    print(f"identified fraction: {c.identified_fraction:.6f}")
    for kind, row in out.get("layer_types", {}).items():
        print(f"{kind} layers ({row['layers']} of the model's): {row['unidentified']:,} of {row['total_params']:,} "
              "unidentified")  # fmt: skip
    if "attention_only" in out:
        print(f"(counted: one attention layer; {out['attention_only']})")
    if "shows" in out:
        print(f"(counted: {out['shows']})")
    if chosen is None and cfg.qk_norm and a.norm_eps is None:
        more = c.unidentified - count(cfg.with_(qk_norm_eps=RELEASED_EPS)).unidentified
        print(f"(QK-norm at ε = 0, the exact symmetric point: {more} directions more than with a released model's "
              f"ε > 0; --norm-eps {RELEASED_EPS:g} counts that)")  # fmt: skip
    arch = ", ".join(f"{k}={v}" for k, v in out["architecture"].items())
    print(f"\narchitecture: {arch}")
    _print_reading(out, chosen)
    return 0


RELEASED_EPS = 1e-6  # a released norm's ε (Qwen3's, Llama 4's), any ε > 0 counts the same


def _with_norm_eps(cfg, a, chosen):
    """``--norm-eps``: the QK-norm's ε of an architecture given by its flags (a preset or a file fixes its own)."""
    if a.norm_eps is None:
        return cfg
    if chosen is not None:
        raise ValueError(f"norm-eps: --{'preset' if a.preset is not None else 'config'} fixes the norms' ε")
    if not cfg.qk_norm:
        raise ValueError("norm-eps: this attention has no norm; add --qk-norm head|proj|l2|layer")
    return cfg.with_(qk_norm_eps=a.norm_eps)


def _kind_layers(chosen) -> tuple[int, int]:
    """How many RoPE and NoPE layers the chosen model stacks."""
    m = chosen[1].model
    return m.layers - m.nope_layers, m.nope_layers


def _add_reading(out: dict, chosen) -> None:
    """A config file's reading (:func:`attnid.configs.config_reading`) under ``"config_fields"``, and where the file
    came from (a path, or a model on the Hub with its revision and commit) under ``"source"``."""
    if chosen is not None and chosen[1].reading is not None:
        out["config_fields"] = chosen[1].reading
    if chosen is not None and chosen[1].origin is not None:
        out["source"] = chosen[1].origin.as_dict()


def _print_reading(out: dict, chosen) -> None:
    """What a config file gave, after the count: where it came from, the fields read, the neutral ones grouped by
    their reason, the defaults taken (``--json`` has each field's reason and value)."""
    r = out.get("config_fields")
    if r is None:
        return

    def line(text: str) -> None:
        print(textwrap.fill(text, 110, initial_indent="  ", subsequent_indent="      "))

    print(f"read from {chosen[1].origin.describe() if chosen[1].origin else chosen[0]}")
    line(f"counted: {', '.join(r['read']) or 'none'}")
    if r["at_default"]:
        line(f"at the library's default (the value audited): {', '.join(r['at_default'])}")
    by_reason: dict[str, list[str]] = {}
    for k, why in r["neutral"].items():
        by_reason.setdefault(why, []).append(k)
    for why, names in by_reason.items():  # the reason's first clause; --json has it whole
        shown = ", ".join(printable(k, 60) for k in names)  # a name from the file: escaped and cut
        line(f"accepted {shown}: {why.split(':')[0].split(';')[0].split(' (')[0]}")
    for k, v in r["fixed"].items():
        line(f"accepted {k} = {printable(repr(v))}: the one value transformers' code implements")
    for k, how in r["truth_values"].items():
        line(f"{k}: {how}")
    if r["defaults"]:
        line(
            "library defaults taken: " + ", ".join(f"{k} = {printable(repr(v), 40)}" for k, v in r["defaults"].items())
        )


def _count_scope(a, chosen: tuple[str, Preset] | None) -> int:
    """``attnid count --preset NAME|--config PATH --scope block|model`` (and any scope of latent attention):
    the closed form term by term (chapters 8 and 9)."""
    if chosen is None:
        raise ValueError(f"scope: --scope {a.scope} needs --preset or --config (the MLP, norms and vocabulary "
                         "come from it)")  # fmt: skip
    name, p = chosen
    c = scope_count(p, a.scope, name)
    arch = asdict(p.config) if isinstance(p.config, MLAConfig) else arch_dict(p.config)
    out = {"architecture": arch, "scope": a.scope, "model": asdict(p.model) if p.model else None, **c.as_dict()}
    shows = mixer_layers_note(p) if a.scope == "block" else ""
    if shows:
        out["shows"] = shows
    _add_reading(out, chosen)
    if a.json:
        print(strict_json(out))
        return 0
    source = p.model.source if p.model else ""
    named = f" ({source})" if source and source not in p.description else ""  # a config's description names it
    print(f"{p.description}, scope {a.scope}{named}")
    if a.scope == "block" and p.model is not None and p.model.nope_layers:
        print(f"(a RoPE layer; the model's {p.model.nope_layers} NoPE layers: `--scope attention` shows both kinds, "
              "`--scope model` counts each)")  # fmt: skip
    if "shows" in out:
        print(f"(counted: {out['shows']})")
    terms = [*c.params_by_block.items(), *c.unidentified_by_block.items(), ("total", c.total_params)]
    lines = table_lines(["", ""], [[k if k == "total" else f"  {k}", v] for k, v in terms])[1:]
    n = len(c.params_by_block)
    print("\n".join(["params", *lines[:n], "unidentified, by term", *lines[n:-1]]))
    print(f"{lines[-1]} parameters, {c.unidentified:,} unidentified ({c.unidentified / c.total_params:.4%})")
    if "config_fields" in out:
        print()
    _print_reading(out, chosen)
    return 0


def count_parser(sub) -> None:
    """``attnid count``: the closed-form counts of an architecture or preset."""
    p = add_command(sub, "count")
    arch_args(p)
    p.add_argument(
        "--scope", default="attention", choices=SCOPES,
        help="with --preset or --config: one attention layer (default), one whole decoder layer, or the whole model",
    )  # fmt: skip
    p.add_argument(
        "--norm-eps", type=float,
        help="with --qk-norm: the norm's ε (default 0, the exact symmetric point, said in the output; released "
        "models have ε > 0, which identifies each norm's scale)",
    )  # fmt: skip
    p.set_defaults(func=cmd_count)
