"""A claim evaluated on a suite's records (:mod:`attnid.lm.claims`): one row per claim, with every seed's value
and a verdict (``yes``, ``no``, ``inconclusive``, ``pending``) by :func:`verdict_of`."""

from __future__ import annotations

import contextlib
import math

import numpy as np

from ..analysis import (
    Cases,
    SuiteRuns,
)
from ..profiles import SUITES
from ..records import MissingValues
from .claim import AGGREGATES, Claim, Undecidable, seed_side
from .points import POINT_CLAIMS
from .registry import CLAIMS

EPS32 = float(np.finfo(np.float32).eps)  # 1.2e-7: float32's relative resolution


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def resolve_cases(claim: Claim, runs: SuiteRuns) -> dict[str, str]:
    """Each case of ``claim`` -> the case whose records it reads at this profile (itself, or its stand-in
    where the suite does not run it)."""
    ran = SUITES[runs.suite].cases_at(runs.profile)
    stand = dict(claim.stand_in)
    return {c: (stand[c] if c in stand and c not in ran else c) for c in claim.cases}


def _seed_cases(runs: SuiteRuns, seed: int, cases: dict[str, str]) -> Cases:
    """Every case's record of ``seed``, with each stand-in also under the name of the case it stands in for."""
    c = runs.by_seed(seed)
    return {**c, **{k: c[v] for k, v in cases.items()}}


def _blank_row(claim: Claim, runs: SuiteRuns, cases: dict[str, str], seeds: list[int]) -> dict:
    """A claim's row before anything is read: ``pending``, every key present."""
    return {
        "id": claim.id,
        "claim": claim.claim,
        "profile": runs.profile,
        "metric": claim.metric,
        "value": None,
        "low": None,
        "high": None,
        "values": [],
        "threshold": claim.threshold,
        "op": claim.op,
        "why": claim.why,
        "control": claim.control_text or None,
        "control_value": None,
        "kind": claim.kind,
        "stated_by": claim.stated_by,
        "seeds": len(seeds),
        "seed_list": seeds,
        "side": None,
        "verdict": "pending",
        "reason": "",
        "depends_on": None,
        "rho_measure": None,
        "cases": dict(cases),
        "against_values": None,  # a claim tested against a null: each seed's test of the opposite claim
    }


def _context(claim: Claim, per_seed: list[Cases]) -> dict:
    """What a row says beside its value: the control, the setting, the ρ measure and the claim's detail."""
    out: dict = {}
    if claim.control is not None:
        with contextlib.suppress(KeyError, Undecidable, MissingValues):  # no control where its records lack it
            out["control_value"] = float(np.mean([claim.control(c) for c in per_seed]))
    if claim.setting_of_seeds is not None:
        out["depends_on"] = claim.setting_of_seeds(per_seed)
    elif claim.setting is not None:
        out["depends_on"] = claim.setting(per_seed[0])
    if claim.rho is not None:
        out["rho_measure"] = claim.rho(per_seed[0])
    if claim.detail is not None:
        out.update(claim.detail(per_seed))
    return out


def verdict_of(
    claim: Claim, seeds: list[int], vals: list[float], layers: int, against: list[float] | None = None
) -> tuple[str, str, str | None]:
    """``(verdict, reason, side)`` from every seed's value (and, for a claim tested against a null, every seed's
    test of the opposite claim, ``against``), by the rules of the module docstring, in order: a value that is not
    finite, too few layers, too few seeds, a seed whose test rejects neither way, then every seed on one side or
    not."""
    holds = [claim.holds(v) for v in vals]
    bad = [s for s, v, a in zip(seeds, vals, against or vals) if not (math.isfinite(v) and math.isfinite(a))]
    if bad:
        return (
            "inconclusive",
            f"the value is not finite for seed(s) {', '.join(map(str, bad))} (a zero or missing quantity)",
            None,
        )
    refuted = [claim.holds(a) for a in against] if against is not None else None
    side = seed_side(holds, claim.stated_by, refuted)
    if layers < claim.min_layers:
        return "inconclusive", f"needs ≥ {claim.min_layers} layers, the model has {layers}", side
    if claim.kind == "theorem" and not all(holds):  # one counterexample refutes an exact property
        against = [s for s, h in zip(seeds, holds) if not h]
        return "no", f"fails in seed(s) {', '.join(map(str, against))}", side
    if len(seeds) < claim.min_seeds:
        n = len(seeds)
        return "inconclusive", f"{n} seed{'s' * (n > 1)}, {side}; {claim.min_seeds} needed for a spread", side
    if refuted is not None:
        neither = [s for s, h, r in zip(seeds, holds, refuted) if not h and not r]
        if neither:
            return (
                "inconclusive",
                f"seed(s) {', '.join(map(str, neither))} reject the null neither way (a test that does not reject "
                "is no evidence against the claim)",
                side,
            )
    if side != "split":
        return ("yes" if all(holds) else "no"), "", side
    return "inconclusive", f"the seeds' range {min(vals):.3g} to {max(vals):.3g} crosses the threshold", side


def evaluate_claim(claim: Claim, runs: SuiteRuns) -> dict:
    """One claim's row: ``id``, ``claim``, ``profile``, ``metric``, ``value`` (mean over seeds), ``low``,
    ``high``, ``values`` (per seed), ``threshold``, ``op``, ``why``, ``control``, ``control_value``, ``kind``,
    ``seeds``, ``seed_list``, ``side`` (where the seeds lie: with or against the paper, or split), ``verdict``,
    ``reason``, ``depends_on``, ``rho_measure``, ``cases`` (the records read, after stand-ins) and the keys of the
    claim's ``detail``."""
    cases = resolve_cases(claim, runs)
    seeds = runs.seeds(tuple(cases.values()))
    named_missing = missing_named_seeds(runs, list(cases.values()))
    row = _blank_row(claim, runs, cases, seeds)
    if not seeds:
        missing = [v for v in cases.values() if v not in runs]
        row["reason"] = named_missing or f"no records of {', '.join(missing)} at this profile"
        return row
    per_seed = [_seed_cases(runs, s, cases) for s in seeds]
    try:
        vals = [float(v) for v in claim.values(per_seed)] if claim.values else [float(claim.value(c)) for c in per_seed]
    except KeyError as e:  # a record without the metric (an older format)
        row["verdict"], row["reason"] = "inconclusive", f"the records lack {e}"
        return row
    except (Undecidable, MissingValues) as e:
        row["verdict"], row["reason"] = "inconclusive", str(e)
        return row
    value = float(AGGREGATES[claim.aggregate](vals))
    row.update(values=vals, value=value, low=float(np.min(vals)), high=float(np.max(vals)))
    row.update(_context(claim, per_seed))
    against = None
    if claim.against is not None:
        against = [float(claim.against(c)) for c in per_seed]
        row["against_values"] = against
    layers = per_seed[0][claim.cases[0]].config["n_layer"]
    row["verdict"], row["reason"], row["side"] = verdict_of(claim, seeds, vals, layers, against)
    if claim.undecided is not None and row["verdict"] in ("yes", "no"):
        why = claim.undecided(row)
        if why:
            row["verdict"], row["reason"] = "inconclusive", why
    if named_missing:  # what the seeds found say, but no verdict without the seeds the caller named
        found = row["verdict"] + (f" ({row['reason']})" if row["reason"] else "")
        row["verdict"], row["reason"] = "pending", f"{named_missing}; seed(s) {', '.join(map(str, seeds))} read {found}"
    return {k: _finite(v) for k, v in row.items()}


def missing_named_seeds(runs: SuiteRuns, cases: list[str]) -> str:
    """The seeds the caller named (``runs.requested``) that some case lacks, in words (``""`` if none)."""
    if runs.requested is None:
        return ""
    missing = {c: [s for s in runs.requested if s not in runs.runs.get(c, {})] for c in dict.fromkeys(cases)}
    parts = [f"{c} (seed {', '.join(map(str, m))})" for c, m in missing.items() if m]
    return "named seed(s) without a record: " + "; ".join(parts) if parts else ""


def evaluate_claims(runs: SuiteRuns) -> list[dict]:
    """Every claim of :data:`CLAIMS` on ``runs`` (a dynamics suite)."""
    return [evaluate_claim(c, runs) for c in CLAIMS]


def evaluate_point_claims(suites: dict[str, SuiteRuns]) -> list[dict]:
    """Every claim of :data:`POINT_CLAIMS` (chapter 10) on the runs of its suite (``suites[claim.suite]``)."""
    return [evaluate_claim(c, suites[c.suite]) for c in POINT_CLAIMS]
