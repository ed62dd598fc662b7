"""What chapters 6 and 7 compute from run records (the paper's §5).

Everything here reads finished records (:mod:`attnid.lm.records`) and trains nothing:

* :func:`load_suite`: the records of a suite at one profile, by case and seed (:class:`SuiteRuns`);
* per-run numbers: :func:`rho_key` (how the record measured ρ), :func:`isotropic_rho`, :func:`mean_rho`,
  :func:`late_ratio`, :func:`final_drift`, :func:`tau_spread_growth`, :func:`layer_trend`, :func:`layer_order`,
  :func:`min_sv_ratio`;
* across runs: :func:`drift_slope` (the SGD learning-rate sweep), :func:`over_seeds` (mean and range),
  :func:`band` (a metric over training, mean and range over seeds).

The §5 claims and the weight-decay law that read these numbers are :mod:`attnid.lm.claims`.

Shapes: ``L`` layers, ``H`` heads, ``D`` head dimension (:data:`attnid.lm.metrics.SCHEMA`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..inputs import printable
from . import records
from .ablation import effective_rank
from .metrics import RHO_METHODS, SCHEMA, Key
from .profiles import LR_SWEEP, SUITES, RunConfig
from .records import MissingValues, Record, RecordError

Cases = dict[str, Record]  # case -> record, all of one seed


# ------------------------------------------------------------------------------ loading
@dataclass
class SuiteRuns:
    """The finished records of one suite at one profile: ``runs[case][seed]``; ``requested``: the seeds the caller
    named (``None``: every seed found), so that a named seed without a record can be reported, not skipped."""

    profile: str
    suite: str
    runs: dict[str, dict[int, Record]] = field(default_factory=dict)
    requested: list[int] | None = None

    def seeds(self, cases: tuple[str, ...] | list[str] | None = None) -> list[int]:
        """The seeds for which every case of ``cases`` (default: every case found) has a record."""
        cases = list(cases or self.runs)
        if not cases or any(c not in self.runs for c in cases):
            return []
        return sorted(set.intersection(*(set(self.runs[c]) for c in cases)))

    def by_seed(self, seed: int) -> Cases:
        """Every case's record of one seed."""
        return {c: by[seed] for c, by in self.runs.items() if seed in by}

    def first(self, case: str) -> Record:
        """The record of ``case`` with the lowest seed (for the shape of the model and its provenance)."""
        by = self.runs[case]
        return by[min(by)]

    def __contains__(self, case: str) -> bool:
        return bool(self.runs.get(case))

    def label(self) -> str:
        """E.g. ``"paper scale (6 × 6 × 384, H200)"`` or ``"cpu rerun (2 × 4 × 64, cpu)"``."""
        return scale_label(self.first(next(iter(self.runs))))

    def short_label(self) -> str:
        return scale_name(self.profile)


def found_seeds(profile: str, case: str, roots: list[Path]) -> list[int]:
    """The seeds of ``case`` with a finished record under any of ``roots``."""
    seeds = set()
    for root in roots:
        folder = Path(root) / profile
        if not folder.is_dir():
            continue
        for d in folder.iterdir():
            name, _, s = d.name.partition("-s")
            if name == case and records.is_finished(d) and (not s or s.isdigit()):
                if d.name != records.run_name(case, int(s or 0)):
                    raise RecordError(
                        f"{d}: not a run folder name (seed {int(s)} of {case} is {records.run_name(case, int(s))})"
                    )
                seeds.add(int(s) if s else 0)
    return sorted(seeds)


def load_suite(
    profile: str,
    suite: str = "dynamics",
    seeds: list[int] | None = None,
    base: Path | None = None,
    committed: bool = True,
) -> SuiteRuns:
    """The finished records of ``suite`` at ``profile`` from ``base`` (default: the runs folder), else, for the
    paper and mid profiles and with ``committed``, the committed records (:func:`attnid.lm.records.record_roots`);
    ``seeds=None`` takes every seed found. Missing runs are left out; a damaged one, one whose folder is not the one
    its config names, a folder name that is not a run name, and two seeds with equal rows raise
    :class:`RecordError`."""
    if suite not in SUITES:
        raise ValueError(f"suite: unknown {suite!r}; choose one of {', '.join(SUITES)}")
    roots = records.record_roots(profile, base, committed)
    out = SuiteRuns(profile, suite, requested=None if seeds is None else sorted(seeds))
    for case in SUITES[suite].cases:
        for s in seeds if seeds is not None else found_seeds(profile, case, roots):
            rec = records.find_runs(profile, [case], seed=s, base=base, committed=committed).get(case)
            if rec is not None:
                out.runs.setdefault(case, {})[s] = rec
        check_distinct_seeds(out.runs.get(case, {}))
    return out


def check_distinct_seeds(by_seed: dict[int, Record]) -> None:
    """Refuse two seeds of a case whose rows are equal (one run copied under two seeds): one line naming both."""
    seen: dict[str, Record] = {}
    for rec in by_seed.values():
        key = repr(rec.rows[-1]) if rec.rows else ""
        if key and key in seen:
            raise RecordError(
                f"{seen[key].path} and {rec.path} hold the same run (equal rows): one seed's record under two names"
            )
        seen[key] = rec


def scale_name(profile: str) -> str:
    """How the book names the records of a profile: ``"paper scale"`` and ``"mid scale"`` (committed records),
    ``"cpu rerun"`` (those this build trains)."""
    return {"paper": "paper scale", "mid": "mid scale"}.get(profile, f"{profile} rerun")


def scale_label(rec: Record) -> str:
    """E.g. ``"paper scale (6 × 6 × 384, H200)"`` or ``"cpu rerun (2 × 4 × 64, cpu)"``."""
    c = rec.config
    device = printable(rec.summary.get("device", "?"), 40).replace("NVIDIA ", "")
    return f"{scale_name(str(c.get('profile')))} ({c['n_layer']} × {c['n_head']} × {c['n_embd']}, {device})"


# ------------------------------------------------------------------------------ one run
def rho_key(rec: Record) -> Key:
    """The row key holding ρ as this record measured it, from its summary's ``rho_method``."""
    method = rec.summary.get("rho_method")
    if method not in RHO_METHODS:
        raise RecordError(f"{rec.path / 'summary.json'}: unknown rho_method {method!r}")
    return RHO_METHODS[method]


def rho_measure(rec: Record) -> str:
    """How ρ was measured, for tables: ``"float64 update"`` or ``"float32 difference"``."""
    return "float64 update" if rho_key(rec) == Key.RHO else "float32 difference"


def isotropic_rho(config: dict) -> float:
    """Mean ρ of an isotropic random step of a head's ``D × E'`` query and key matrices: ``D / (2 E')``,
    with ``E' = E + 1`` when the bias column is part of the symmetry (chapter 6)."""
    cfg = RunConfig.from_dict(config).gpt_config()
    assert cfg.head_dim is not None
    return cfg.head_dim / (2 * (cfg.n_embd + (1 if cfg.bias else 0)))


def schema_steps(config: dict, key: Key, metrics: bool = True) -> list[int]:
    """The steps whose rows hold ``key`` (:data:`attnid.lm.metrics.SCHEMA`): every recorded step, the metric
    steps (every ``metric_interval``-th and the last) or the evaluation steps (every ``eval_interval``-th, the
    first and the last). A record read only up to a step (``config["read_to_step"]``, set by
    :func:`attnid.lm.claims.up_to_loss`) expects the steps of the whole run up to that one."""
    n, mi, ei = config["max_iters"], config["metric_interval"], config["eval_interval"]
    cut = config.get("read_to_step", n)
    rows = SCHEMA[key].rows
    if rows.startswith("evaluation"):
        steps = [it + 1 for it in range(n) if (it + 1) % ei == 0 or it in (0, n - 1)]
    elif rows.startswith("metric"):
        steps = [it + 1 for it in range(n) if it % mi == 0 or it == n - 1]
    else:
        steps = records.expected_steps(config, metrics)
    return [s for s in steps if s <= cut]


def span(values, spec: str) -> str:
    """The range of ``values`` as text, each end formatted by ``spec``: ``"0.12 to 0.16"``, or one number where
    both ends print the same (never ``"0.16 to 0.16"``)."""
    lo, hi = format(float(np.min(values)), spec), format(float(np.max(values)), spec)
    return lo if lo == hi else f"{lo} to {hi}"


def series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of one metric over the rows that hold it; values ``(n_rows, *shape)`` float."""
    have = [r for r in rows if r.get(key) is not None and r.get(key) != []]
    return (np.array([r["step"] for r in have], dtype=int), np.array([r[key] for r in have], dtype=float))


def values(rec: Record, key: Key) -> np.ndarray:
    """The values of ``key`` over the rows that hold it, ``(n_rows, *shape)``. A record that holds ``key`` but
    not at every step the schema says it does (a null where a value belongs) raises
    :class:`~attnid.lm.records.MissingValues` naming the record, the key and the first such step: a mean over
    the values left would silently be another number."""
    steps, v = series(rec.rows, key)
    if len(steps):
        want = schema_steps(rec.config, key, bool(rec.summary.get("metrics", True)))
        have = set(steps.tolist())
        missing = [s for s in want if s not in have]
        if missing:
            raise MissingValues(
                f"{rec.name}: {key} is missing (null) at {len(missing)} of the {len(want)} steps that record it, "
                f"first at step {missing[0]}"
            )
    return v


def mean_rho(rec: Record, key: Key | None = None) -> float:
    """Mean ρ over training, layers and heads (``nan`` if any value is not finite)."""
    return float(np.mean(values(rec, key or rho_key(rec))))


def max_rho(rec: Record, key: Key | None = None) -> float:
    """Largest per-head ρ of any recorded step (``nan`` if any value is not finite)."""
    return float(np.max(values(rec, key or rho_key(rec))))


def head_rho(rec: Record) -> np.ndarray:
    """Mean ρ of each head over training, ``(L, H)``."""
    return np.mean(values(rec, rho_key(rec)), axis=0)


def late_ratio(rec: Record, key: Key = Key.RHO_DIFF) -> float:
    """Mean ρ over the last tenth of the recorded steps / over the middle fifth (40–60 %)."""
    r = np.mean(values(rec, key), axis=(1, 2))
    n = len(r)
    return float(np.mean(r[int(0.9 * n) :]) / np.mean(r[int(0.4 * n) : int(0.6 * n)]))


def final_drift(rec: Record) -> np.ndarray:
    """``‖β_T − β_0‖ / ‖β_0‖`` of each layer at the last step, ``(L,)``."""
    return values(rec, Key.BETA_DRIFT)[-1]


def tau_spread_growth(rec: Record) -> float:
    """Spread (standard deviation) of τ over all heads at the end / at the first recorded step."""
    tau = values(rec, Key.TAU)
    return float(np.std(tau[-1]) / np.std(tau[0]))


def layer_trend(rec: Record) -> float:
    """Slope of log(final β drift) against the layer index (negative: larger in earlier layers)."""
    d = final_drift(rec)
    if not (d > 0).all():
        return float("nan")  # a layer whose β did not move: no logarithm
    return float(np.polyfit(np.arange(len(d)), np.log(d), 1)[0])


def layer_order(rec: Record) -> float:
    """Kendall's τ of the final β drift over the layers, signed so that 1 means every earlier layer drifts more
    than every later one and −1 the reverse: (pairs ordered that way − pairs ordered the other) / all pairs."""
    d = final_drift(rec)
    if not np.isfinite(d).all():
        return float("nan")
    pairs = [(i, j) for i in range(len(d)) for j in range(i + 1, len(d))]
    return float(sum(np.sign(d[i] - d[j]) for i, j in pairs) / len(pairs))


def layers_out_of_order(rec: Record) -> float:
    """How many pairs of layers break "earlier layers drift more": pairs (earlier, later) whose final β drift is
    smaller in the earlier layer (``nan`` if a drift is not finite). A count, not a share of the pairs, so that it
    means the same at every depth (a share of 6 layers' 15 pairs tolerates a disorder that 4 layers' 6 do not)."""
    d = final_drift(rec)
    if not np.isfinite(d).all():
        return float("nan")
    return float(sum(d[i] < d[j] for i in range(len(d)) for j in range(i + 1, len(d))))


def inversion_cdf(n: int, k: int) -> float:
    """The share of the ``n!`` orders of ``n`` items with at most ``k`` pairs out of order (the Mahonian numbers,
    by the recurrence ``M(n, k) = Σ_{i=0}^{min(k, n-1)} M(n-1, k-i)``): the null of a random order."""
    counts = [1]  # M(1, ·)
    for m in range(2, n + 1):
        nxt = [0] * (len(counts) + m - 1)
        for j, c in enumerate(counts):
            for i in range(m):
                nxt[j + i] += c
        counts = nxt
    return sum(counts[: k + 1]) / math.factorial(n)


def drift_order_p(rec: Record) -> float:
    """How often a random order of the layers has at most as many pairs out of order as the final β drift
    (:func:`layers_out_of_order`, :func:`inversion_cdf`): small when earlier layers drift more by more than chance
    (``nan`` if a drift is not finite)."""
    k = layers_out_of_order(rec)
    return float("nan") if math.isnan(k) else inversion_cdf(len(final_drift(rec)), int(k))


def drift_reversal_p(rec: Record) -> float:
    """:func:`drift_order_p` of the opposite order: how often a random order has at most as many pairs in order
    (an earlier layer drifting more) as the final β drift; small when later layers drift more by more than chance."""
    k = layers_out_of_order(rec)
    n = len(final_drift(rec))
    return float("nan") if math.isnan(k) else inversion_cdf(n, n * (n - 1) // 2 - int(k))


def min_sv_ratio(rec: Record) -> float:
    """Smallest σ_min / σ_max of the final QK product over every head."""
    sv = values(rec, Key.QK_SV)[-1]
    return float((sv[..., -1] / sv[..., 0]).min())


def final_effective_rank(rec: Record) -> np.ndarray:
    """Effective rank of every head's final QK product, ``(L, H)`` (:func:`attnid.lm.ablation.effective_rank`)."""
    return effective_rank(values(rec, Key.QK_SV)[-1])


def final_val_loss(rec: Record) -> float:
    return float(values(rec, Key.VAL_LOSS)[-1])


def best_val_loss(rec: Record) -> float:
    return float(values(rec, Key.VAL_LOSS).min())


# ------------------------------------------------------------------------------ across runs
def sweep_runs(cases: Cases) -> dict[float, Record]:
    """The SGD learning-rate sweep among ``cases``: learning rate -> record, ascending."""
    return {lr: cases[c] for lr, c in sorted(LR_SWEEP.items()) if c in cases}


def drift_slope(cases: Cases) -> float:
    """Slope of log(final β drift, mean over layers) against log η over the SGD sweep (one seed)."""
    sweep = sweep_runs(cases)
    lrs = list(sweep)
    if len(lrs) < 2:
        raise KeyError("the SGD sweep needs at least two learning rates")
    d = [final_drift(sweep[lr]).mean() for lr in lrs]
    if min(d) <= 0:
        return float("nan")
    return float(np.polyfit(np.log(lrs), np.log(d), 1)[0])


def over_seeds(runs: SuiteRuns, case: str, f: Callable[[Record], float]) -> dict:
    """``f`` of every seed's record of ``case``: ``{"mean", "min", "max", "n", "values"}``."""
    v = [f(rec) for _, rec in sorted(runs.runs.get(case, {}).items())]
    if not v:
        return {"mean": None, "min": None, "max": None, "n": 0, "values": []}
    return {"mean": float(np.mean(v)), "min": float(np.min(v)), "max": float(np.max(v)), "n": len(v), "values": v}


def band(
    runs: SuiteRuns, case: str, key: Key, reduce: Callable[[np.ndarray], np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(steps, mean, low, high)`` of ``reduce(values)`` over the seeds of ``case`` (the seeds share
    their recorded steps). ``reduce`` maps ``(n_rows, *shape)`` to ``(n_rows,)``."""
    curves = []
    steps = None
    for _, rec in sorted(runs.runs[case].items()):
        s, v = series(rec.rows, key)
        steps = s if steps is None else steps
        if len(s) != len(steps) or (s != steps).any():
            raise RecordError(f"{rec.path}: its recorded steps differ from the other seeds' of {case}")
        curves.append(reduce(v))
    c = np.array(curves)
    assert steps is not None
    return steps, np.nanmean(c, 0), np.nanmin(c, 0), np.nanmax(c, 0)


def run_summary(runs: SuiteRuns) -> list[dict]:
    """One row per case of ``runs``: seeds, steps, best validation loss over seeds, how ρ was measured,
    precision and the code that made the records."""
    out = []
    for case in SUITES[runs.suite].cases_at(runs.profile):
        if case not in runs:
            out.append({"case": case, "status": "pending", "seeds": 0})
            continue
        rec = runs.first(case)
        best = over_seeds(runs, case, best_val_loss)
        out.append(
            {
                "case": case,
                "status": "finished",
                "seeds": best["n"],
                "steps": rec.config["max_iters"],
                "best_val_loss": best["mean"],
                "best_val_loss_low": best["min"],
                "best_val_loss_high": best["max"],
                "precision": rec.summary.get("precision", "?"),
                "rho_measure": rho_measure(rec),
                "code": rec.summary.get("provenance", {}).get("code_commit", "this build"),
            }
        )
    return out


def rho_summary(runs: SuiteRuns, cases: tuple[str, ...]) -> list[dict]:
    """Per case: mean ρ over training (mean, min and max over seeds), largest per-head ρ, the isotropic
    share and, where recorded, the mean ρ of the float32 difference and of the weights alone."""
    out = []
    for case in cases:
        if case not in runs:
            continue
        rec = runs.first(case)
        m = over_seeds(runs, case, mean_rho)
        row = {
            "case": case,
            "seeds": m["n"],
            "rho_measure": rho_measure(rec),
            "mean_rho": m["mean"],
            "mean_rho_low": m["min"],
            "mean_rho_high": m["max"],
            "max_rho": max(over_seeds(runs, case, max_rho)["values"]),
            "isotropic": isotropic_rho(rec.config),
        }
        if rho_key(rec) == Key.RHO:
            row["mean_rho_diff"] = over_seeds(runs, case, lambda r: mean_rho(r, Key.RHO_DIFF))["mean"]
            row["mean_rho_w"] = over_seeds(runs, case, lambda r: mean_rho(r, Key.RHO_W))["mean"]
        out.append(row)
    return out


def wd_transient(runs: SuiteRuns, cut: int) -> dict:
    """The early steps of SGD + weight decay (mean over seeds, steps ≤ ``cut``): ρ, the relative imbalance
    and the median query-bias gradient at the first and last of them, and whether the numbers attribute the
    fall of ρ to the gradient growing beside the decay (``gradient_explains``): ρ at least halves while the
    imbalance, to which the decay's symmetry component is proportional, changes by less than a quarter and
    the gradient at least doubles."""
    s_rho, rho, _, _ = band(runs, "sgd_wd", Key.RHO, lambda v: np.nanmean(v, axis=(1, 2)))
    s_rel, rel, _, _ = band(runs, "sgd_wd", Key.BETA_REL, lambda v: v.mean(1))
    s_g, g, _, _ = band(runs, "sgd_wd", Key.GRAD_BQ, lambda v: np.median(v.reshape(len(v), -1), 1))
    e_rho, e_rel, e_g = s_rho <= cut, s_rel <= cut, s_g <= cut
    out = {
        "rho_first": float(rho[e_rho][0]),
        "rho_last": float(rho[e_rho][-1]),
        "rho_end": float(rho[-1]),
        "last_step": int(s_rho[e_rho][-1]),
        "imbalance_first": float(rel[e_rel][0]),
        "imbalance_last": float(rel[e_rel][-1]),
        "grad_first": float(g[e_g][0]),
        "grad_last": float(g[e_g][-1]),
    }
    out["imbalance_change"] = abs(out["imbalance_last"] / out["imbalance_first"] - 1)
    out["gradient_explains"] = bool(
        out["rho_last"] < 0.5 * out["rho_first"]
        and out["imbalance_change"] < 0.25
        and out["grad_last"] > 2 * out["grad_first"]
    )
    return out


def corr_within_layers(importance: np.ndarray, rho: np.ndarray) -> float:
    """Correlation across heads of two ``(L, H)`` grids after removing each layer's mean from both: what is
    left once the layers' systematic differences (depth) are taken out."""
    a = importance - importance.mean(1, keepdims=True)
    b = rho - rho.mean(1, keepdims=True)
    den = np.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / den) if den > 0 else float("nan")


def rho_slope_reading(slope: float, tolerance: float = 0.1) -> str:
    """How a log–log slope of mean ρ against H compares with the isotropic share's −1: ``"slower"``,
    ``"as fast"`` (within ``tolerance``) or ``"faster"``."""
    if slope > -1 + tolerance:
        return "slower"
    return "as fast" if slope > -1 - tolerance else "faster"


def sign_reading(values) -> str:
    """Whether a set of correlations (one per run) agree in sign: ``"positive in every run"``, ``"negative in every
    run"`` or ``"of mixed sign (k of n positive)"``."""
    v = np.asarray(values, float)
    pos = int((v > 0).sum())
    if pos == len(v):
        return "positive in every run"
    if pos == 0:
        return "negative in every run"
    return f"of mixed sign ({pos} of {len(v)} positive)"


def against_seed_noise(gain: float, spread: float, n_seeds: int) -> str:
    """A difference read against the seed-to-seed range: ``"no estimate"`` with one seed, else ``"within"``
    the largest range over seeds or ``"beyond"`` it."""
    if n_seeds < 2:
        return "no estimate"
    return "within" if gain <= spread else "beyond"
