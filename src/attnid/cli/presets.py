"""``attnid presets``: the published architectures at three scopes, and ``--verify`` through their real modules
(:mod:`attnid.cli`)."""

from __future__ import annotations

from ..extras import require
from .commands import add_command
from .common import check_threads, set_threads, strict_json, threads_arg


def cmd_presets(a) -> int:
    from ..presets import ALL_PRESETS, preset_rows

    verified = verified_block = None
    check_threads(a)  # with or without --verify
    if a.verify:
        require("audit", "attnid presets --verify")
        set_threads(a)
        from ..hf import verify_presets

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


def presets_parser(sub) -> None:
    """``attnid presets``: the published architectures."""
    p = add_command(sub, "presets")
    p.add_argument("--json", action="store_true", help="print one JSON list: an object per preset (and audit)")
    p.add_argument("--verify", action="store_true", help="audit each structure through its transformers module")
    threads_arg(p)
    p.set_defaults(func=cmd_presets)
