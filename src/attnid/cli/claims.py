"""``attnid claims``: the paper's §5 claims evaluated on the records found (:mod:`attnid.cli`)."""

from __future__ import annotations

from pathlib import Path

from ..inputs import printable
from .commands import add_command
from .common import strict_json
from .runs import PROFILE_NAMES


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
    base = None if a.runs is None else Path(a.runs)
    if base is not None and (not a.runs.strip() or not base.is_dir()):  # "" would name the working folder
        raise ValueError(f"runs: {a.runs!r} is not a folder of run records (<runs>/<profile>/<case>)")
    # a folder named with --runs is read alone unless --with-committed asks for the committed records beside it
    committed = True if base is None else a.with_committed
    runs = load_suite(a.profile, "dynamics", seeds=seeds, base=base, committed=committed)
    points = load_suite(a.profile, "points", seeds=seeds, base=base, committed=committed)
    sources = record_sources([runs, points])
    if len(set(sources.values())) > 1 and not a.with_committed:
        raise ValueError(
            f"the {a.profile} records come from {len(set(sources.values()))} places ({source_text(sources)}); name "
            "one with --runs, or pass --with-committed to read them together"
        )
    rows = evaluate_claims(runs)
    point_rows = evaluate_point_claims({"dynamics": runs, "points": points})
    precisions = record_precisions([runs, points])
    for r in rows + point_rows:
        r["sources"] = {c: sources[c] for c in r.get("cases", {}).values() if c in sources}
        r["precisions"] = {c: precisions[c] for c in r.get("cases", {}).values() if c in precisions}
    if a.json:
        print(strict_json(rows + point_rows))
        return 0
    print(f"profile {a.profile}: the paper's §5 claims on {sum(len(v) for v in runs.runs.values())} records")
    print(f"records: {source_text(sources)}" if sources else "records: none found")
    by_precision: dict[str, list[str]] = {}
    for case, p in precisions.items():
        by_precision.setdefault(p, []).append(case)
    if by_precision:
        print(
            "precision: " + "; ".join(f"{printable(p, 40)} ({', '.join(cases)})" for p, cases in by_precision.items())
        )
    _print_claims(rows)
    print(f"chapter 10, trained points: {sum(len(v) for v in points.runs.values())} more records")
    _print_claims(point_rows)
    return 0


def record_sources(suites) -> dict[str, str]:
    """``case -> the folder its records were read from`` (the runs folder above ``<profile>/<case>``), over the
    suites' records; a case read from two folders names both."""
    return _per_case(suites, lambda rec: str(rec.path.parent.parent))


def record_precisions(suites) -> dict[str, str]:
    """``case -> the precision its records were trained at`` (``summary.json``'s ``precision``), over the suites'
    records; a case whose records differ names each (``tf32 + bf16``), so that a mix read together is said."""
    return _per_case(suites, lambda rec: str(rec.summary.get("precision", "unknown")))


def _per_case(suites, of) -> dict[str, str]:
    """``case -> the values of(record) over its records``, distinct, sorted and joined by `` + ``."""
    out: dict[str, set[str]] = {}
    for suite in suites:
        for case, by_seed in suite.runs.items():
            out.setdefault(case, set()).update(of(rec) for rec in by_seed.values())
    return {case: " + ".join(sorted(v)) for case, v in sorted(out.items())}


def source_text(sources: dict[str, str]) -> str:
    """``sources`` grouped by folder: ``sgd, adamw from data/runs; ...``, escaped for the terminal."""
    by: dict[str, list[str]] = {}
    for case, where in sources.items():
        by.setdefault(where, []).append(case)
    return "; ".join(f"{', '.join(cases)} from {printable(where, 200)}" for where, cases in by.items())


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
    p = add_command(sub, "claims")
    p.add_argument(
        "--profile", default="cpu", choices=PROFILE_NAMES, help="the scale whose records are read (default: cpu)"
    )
    p.add_argument("--seed-set", help="comma-separated seeds to use (default: every seed found)")
    p.add_argument(
        "--runs",
        help="a runs folder, read alone (default: $ATTNID_RUNS, else data/runs, then, for paper and mid, the "
        "committed records)",
    )
    p.add_argument(
        "--with-committed",
        action="store_true",
        help="also read the committed paper and mid records where --runs lacks a case (each row names its sources)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON list: an object per claim, its sources with it")
    p.set_defaults(func=cmd_claims)
