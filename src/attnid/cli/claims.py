"""``attnid claims``: the paper's §5 claims evaluated on the records found (:mod:`attnid.cli`)."""

from __future__ import annotations

from pathlib import Path

from ..inputs import printable
from .common import strict_json


def cmd_claims(a) -> int:
    """The §5 claims evaluated on the records found (chapter 6's table); trains nothing."""
    from ..lm.analysis import load_suite
    from ..lm.claims import evaluate_claims, evaluate_point_claims
    from ..lm.profiles import check_profile

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
              + (f" ({printable(r['reason'], 400)})" if r["reason"] else ""))  # fmt: skip
        if r["depends_on"]:
            print(f"{'':<4}{printable(r['depends_on'], 400)}")


def claims_parser(sub) -> None:
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
