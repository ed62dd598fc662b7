"""What chapters 6 and 7 compute from run records (the paper's §5), and the §5 claims as data.

Everything here reads finished records (:mod:`attnid.lm.records`) and trains nothing:

* :func:`load_suite`: the records of a suite at one profile, by case and seed (:class:`SuiteRuns`);
* per-run numbers: :func:`rho_key` (how the record measured ρ), :func:`isotropic_rho`, :func:`mean_rho`,
  :func:`late_ratio`, :func:`final_drift`, :func:`tau_spread_growth`, :func:`layer_trend`, :func:`min_sv_ratio`;
* across runs: :func:`drift_slope` (the SGD learning-rate sweep), :func:`over_seeds` (mean and range),
  :func:`band` (a metric over training, mean and range over seeds);
* :func:`wd_beta_law`: under SGD with weight decay λ the gradient part of a step conserves
  β = Q Qᵀ − K Kᵀ to first order (chapter 6) and the decay scales it by (1 − η_t λ)², so
  ``β_T = Π_t (1 − η_t λ)² β_0`` and the drift ``‖β_T − β_0‖ / ‖β_0‖`` is ``1 − Π_t (1 − η_t λ)²``;
* :data:`CLAIMS` and :func:`evaluate_claims`: each reading of §5 with its metric, threshold and why,
  its control, the cases and the seeds it needs; the verdict is ``yes``, ``no``, ``inconclusive``
  (the seeds disagree, or too few seeds or layers) or ``pending`` (records missing).

Shapes: ``L`` layers, ``H`` heads, ``D`` head dimension (:data:`attnid.lm.metrics.SCHEMA`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import records
from .ablation import effective_rank
from .metrics import RHO_METHODS, Key
from .profiles import LR_SWEEP, SUITES, RunConfig, lr_at
from .records import Record, RecordError, series

Cases = dict[str, Record]  # case -> record, all of one seed
CASE_LABELS = {  # display names, applied only when a table or figure is drawn
    **{case: f"SGD, η = {lr:g}" for lr, case in LR_SWEEP.items()},
    "sgd": "SGD",
    "sgd_wd": "SGD + weight decay",
    "adamw": "AdamW",
    "adamw_rebalance": "AdamW + rebalancing",
}


# ------------------------------------------------------------------------------ loading
@dataclass
class SuiteRuns:
    """The finished records of one suite at one profile: ``runs[case][seed]``."""

    profile: str
    suite: str
    runs: dict[str, dict[int, Record]] = field(default_factory=dict)

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
        return "paper scale" if self.profile == "paper" else f"{self.profile} rerun"


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
                seeds.add(int(s) if s else 0)
    return sorted(seeds)


def load_suite(
    profile: str, suite: str = "dynamics", seeds: list[int] | None = None, base: Path | None = None
) -> SuiteRuns:
    """The finished records of ``suite`` at ``profile`` from ``base`` (default: the runs folder), else the
    committed records; ``seeds=None`` takes every seed found. Missing runs are left out; a damaged one
    raises :class:`RecordError`."""
    if suite not in SUITES:
        raise ValueError(f"suite: unknown {suite!r}; choose one of {', '.join(SUITES)}")
    roots = list(dict.fromkeys([Path(base or records.runs_root()), records.committed_root()]))
    out = SuiteRuns(profile, suite)
    for case in SUITES[suite].cases:
        for s in seeds if seeds is not None else found_seeds(profile, case, roots):
            rec = records.find_runs(profile, [case], seed=s, base=base).get(case)
            if rec is not None:
                out.runs.setdefault(case, {})[s] = rec
    return out


def scale_label(rec: Record) -> str:
    """E.g. ``"paper scale (6 × 6 × 384, H200)"`` or ``"cpu rerun (2 × 4 × 64, cpu)"``."""
    c = rec.config
    device = str(rec.summary.get("device", "?")).replace("NVIDIA ", "")
    name = "paper scale" if c.get("profile") == "paper" else f"{c.get('profile')} rerun"
    return f"{name} ({c['n_layer']} × {c['n_head']} × {c['n_embd']}, {device})"


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


def values(rec: Record, key: Key) -> np.ndarray:
    """The values of ``key`` over the rows that hold it, ``(n_rows, *shape)``."""
    return series(rec.rows, key)[1]


def mean_rho(rec: Record, key: Key | None = None) -> float:
    """Mean ρ over training, layers and heads."""
    return float(np.nanmean(values(rec, key or rho_key(rec))))


def max_rho(rec: Record, key: Key | None = None) -> float:
    """Largest per-head ρ of any recorded step."""
    return float(np.nanmax(values(rec, key or rho_key(rec))))


def head_rho(rec: Record) -> np.ndarray:
    """Mean ρ of each head over training, ``(L, H)``."""
    return np.nanmean(values(rec, rho_key(rec)), axis=0)


def late_ratio(rec: Record, key: Key = Key.RHO_DIFF) -> float:
    """Mean ρ over the last tenth of the recorded steps / over the middle fifth (40–60 %)."""
    r = np.nanmean(values(rec, key), axis=(1, 2))
    n = len(r)
    return float(np.nanmean(r[int(0.9 * n) :]) / np.nanmean(r[int(0.4 * n) : int(0.6 * n)]))


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
    return float(np.polyfit(np.arange(len(d)), np.log(d), 1)[0])


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
    for case in SUITES[runs.suite].cases:
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


def against_seed_noise(gain: float, spread: float, n_seeds: int) -> str:
    """A difference read against the seed-to-seed range: ``"no estimate"`` with one seed, else ``"within"``
    the largest range over seeds or ``"beyond"`` it."""
    if n_seeds < 2:
        return "no estimate"
    return "within" if gain <= spread else "beyond"


# ------------------------------------------------------------------------------ the weight-decay law
def decay_factor(config: dict) -> np.ndarray:
    """``Π_{s < t} (1 − η_s λ)²`` for ``t = 0 .. max_iters`` (the factor by which plain SGD's weight decay
    scales β after t steps)."""
    cfg = RunConfig.from_dict(config)
    a = np.array([(1.0 - lr_at(cfg, t) * cfg.weight_decay) ** 2 for t in range(cfg.max_iters)])
    return np.concatenate([[1.0], np.cumprod(a)])


def wd_beta_law(rec: Record, control: Record | None = None) -> dict:
    """Predicted and measured β drift of an SGD + weight-decay run: ``predicted = 1 − Π_t (1 − η_t λ)²``.

    The law neglects the second-order term ``η² (A Aᵀ − B Bᵀ)`` of each step. Plain SGD (``control``, same
    seed and schedule) shows that term alone: its drift. The law is tested in the layers where the control's
    final drift is below the predicted one (the decay's effect exceeds the remainder); without a control,
    in every layer. Returns ``predicted``, ``measured`` (mean over the tested layers at the last step),
    ``tested_layers`` (0-based), ``per_layer`` ``(L,)`` and ``control_per_layer``, ``relative_error``
    (largest over the tested layers; ``nan`` if none is tested), and the curves over training (``steps``,
    ``predicted_curve``, ``measured_curve`` ``(n_rows, L)``).
    """
    if rec.config.get("optimizer") != "sgd" or not rec.config.get("weight_decay"):
        raise ValueError(f"wd_beta_law: {rec.name} is not an SGD run with weight decay")
    steps, drift = series(rec.rows, Key.BETA_DRIFT)
    predicted_curve = 1.0 - decay_factor(rec.config)[steps]
    predicted, final = float(predicted_curve[-1]), drift[-1]
    control_final = None if control is None else final_drift(control)
    tested = [i for i in range(len(final)) if control_final is None or control_final[i] < predicted]
    errors = np.abs(final[tested] - predicted) / predicted
    return {
        "predicted": predicted,
        "measured": float(final[tested].mean()) if tested else float("nan"),
        "tested_layers": tested,
        "per_layer": final.tolist(),
        "control_per_layer": None if control_final is None else control_final.tolist(),
        "relative_error": float(errors.max()) if tested else float("nan"),
        "steps": steps,
        "predicted_curve": predicted_curve,
        "measured_curve": drift,
    }


# ------------------------------------------------------------------------------ the claims of §5
@dataclass(frozen=True)
class Claim:
    """One reading of the paper's §5 and how it is tested.

    ``value`` computes the tested number from one seed's records (``cases``); the claim holds for that
    seed when ``value op threshold``. ``control`` is the number it is compared against (same seed), in
    words in ``control_text``. A verdict needs ``min_seeds`` seeds and models of ``min_layers`` layers.
    ``setting`` says what the verdict depends on (a hyper-parameter, a loss gap), computed from the records.
    """

    id: str
    claim: str
    metric: str
    value: Callable[[Cases], float]
    op: str
    threshold: float
    why: str
    cases: tuple[str, ...]
    control_text: str = ""
    control: Callable[[Cases], float] | None = None
    min_seeds: int = 3
    min_layers: int = 1
    setting: Callable[[Cases], str] | None = None

    def holds(self, v: float) -> bool:
        return v < self.threshold if self.op == "<" else v > self.threshold


def _iso(c: Cases) -> float:
    return isotropic_rho(c["adamw"].config)


def _sgd_wd_setting(c: Cases) -> str:
    wd = c["sgd_wd"].config["weight_decay"]
    return (
        f"SGD + weight decay with λ = {wd:g} reaches a best validation loss of {best_val_loss(c['sgd_wd']):.3f} "
        f"nats/char, AdamW {best_val_loss(c['adamw']):.3f}: the two are compared at different losses"
    )


SWEEP = tuple(LR_SWEEP.values())
MIN_SEEDS = 3  # seeds a claim about training (not an exact law) needs before it is decided

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="sgd_orthogonal",
        claim="plain SGD steps stay out of the unidentified directions",
        metric="mean ρ of SGD / isotropic share D/(2(E+1))",
        value=lambda c: mean_rho(c["sgd"]) / _iso(c),
        op="<",
        threshold=1e-3,
        why="an exact gradient step has ρ = 0 (a theorem, so one seed decides); 1e-3 of the isotropic share "
        "leaves room for the rounding floor of a float32 weight difference",
        cases=("sgd", "adamw"),
        control_text="AdamW's mean ρ / isotropic share",
        control=lambda c: mean_rho(c["adamw"]) / _iso(c),
        min_seeds=1,
    ),
    Claim(
        id="wd_toward_symmetry",
        claim="weight decay moves SGD's steps into the unidentified directions",
        metric="mean ρ of SGD + weight decay / isotropic share",
        value=lambda c: mean_rho(c["sgd_wd"]) / _iso(c),
        op=">",
        threshold=1e-2,
        why="1 % of the isotropic share is ten times the bound that plain SGD stays under (previous row), "
        "so it cannot be round-off",
        cases=("sgd", "sgd_wd", "adamw"),
        control_text="plain SGD's mean ρ / isotropic share",
        control=lambda c: mean_rho(c["sgd"]) / _iso(c),
        setting=lambda c: f"weight decay λ = {c['sgd_wd'].config['weight_decay']:g}",
    ),
    Claim(
        id="adamw_closest",
        claim="AdamW's steps lie further in the unidentified directions than SGD + weight decay's",
        metric="mean ρ, AdamW / SGD + weight decay",
        value=lambda c: mean_rho(c["adamw"]) / mean_rho(c["sgd_wd"]),
        op=">",
        threshold=1.0,
        why="1 is equality of the two means",
        cases=("sgd_wd", "adamw"),
        control_text="SGD + weight decay's mean ρ / isotropic share",
        control=lambda c: mean_rho(c["sgd_wd"]) / _iso(c),
        setting=_sgd_wd_setting,
    ),
    Claim(
        id="adamw_covers",
        claim="some AdamW steps lie mostly in the unidentified directions",
        metric="largest per-head ρ of any AdamW step",
        value=lambda c: max_rho(c["adamw"]),
        op=">",
        threshold=0.5,
        why="more than half of one head's step energy in the invariant directions",
        cases=("adamw",),
        control_text="the same for SGD + weight decay",
        control=lambda c: max_rho(c["sgd_wd"]),
    ),
    Claim(
        id="late_spike_sgd",
        claim="ρ of plain SGD's float32 weight difference rises at the end of training",
        metric="mean ρ (float32 difference) over the last tenth / over the middle fifth, SGD",
        value=lambda c: late_ratio(c["sgd"]),
        op=">",
        threshold=2.0,
        why="a doubling; the float32 rounding floor grows as the cosine schedule shrinks the steps",
        cases=("sgd", "adamw"),
        control_text="the same ratio for AdamW (whose steps do not shrink with the gradient)",
        control=lambda c: late_ratio(c["adamw"]),
    ),
    Claim(
        id="sgd_conserves_beta",
        claim="plain SGD approximately conserves β = W_Q W_Qᵀ − W_K W_Kᵀ",
        metric="largest final β drift over layers, SGD",
        value=lambda c: float(final_drift(c["sgd"]).max()),
        op="<",
        threshold=0.1,
        why="β moves only at second order in the step; 10 % of its initial size",
        cases=("sgd", "adamw"),
        control_text="the same for AdamW",
        control=lambda c: float(final_drift(c["adamw"]).max()),
    ),
    Claim(
        id="drift_falls_with_lr",
        claim="SGD's β drift falls with the learning rate",
        metric="slope of log(final drift, mean over layers) against log η over the SGD sweep",
        value=drift_slope,
        op=">",
        threshold=0.0,
        why="the paper claims a fall, not a rate (a fixed-gradient step would give slope 2)",
        cases=("sgd", *SWEEP),
    ),
    Claim(
        id="drift_earlier_layers",
        claim="SGD's β drift is larger in earlier layers",
        metric="slope of log(final SGD drift) against the layer index",
        value=lambda c: layer_trend(c["sgd"]),
        op="<",
        threshold=0.0,
        why="a trend over the layers, which needs at least 3 of them (with 2 it is a coin flip)",
        cases=("sgd", "adamw"),
        control_text="the same slope for AdamW",
        control=lambda c: layer_trend(c["adamw"]),
        min_layers=3,
    ),
    Claim(
        id="adamw_changes_beta",
        claim="AdamW changes β far more than SGD",
        metric="final β drift (mean over layers), AdamW / SGD",
        value=lambda c: float(final_drift(c["adamw"]).mean() / final_drift(c["sgd"]).mean()),
        op=">",
        threshold=2.0,
        why="at least twice SGD's drift",
        cases=("sgd", "adamw"),
        control_text="SGD's final drift (mean over layers)",
        control=lambda c: float(final_drift(c["sgd"]).mean()),
    ),
    Claim(
        id="adamw_spreads_tau",
        claim="AdamW spreads τ = tr β across heads more than SGD",
        metric="growth of the spread of τ over heads (end / start), AdamW / SGD",
        value=lambda c: tau_spread_growth(c["adamw"]) / tau_spread_growth(c["sgd"]),
        op=">",
        threshold=2.0,
        why="SGD is the control: training itself spreads τ, so AdamW must spread it at least twice as much",
        cases=("sgd", "adamw"),
        control_text="SGD's growth of the τ spread (end / start)",
        control=lambda c: tau_spread_growth(c["sgd"]),
    ),
    Claim(
        id="qk_full_rank",
        claim="the trained QK products have no rank deficiency",
        metric="smallest σ_min / σ_max of a final QK product (any head; SGD, SGD + wd, AdamW)",
        value=lambda c: min(min_sv_ratio(c[k]) for k in ("sgd", "sgd_wd", "adamw")),
        op=">",
        threshold=1e-4,
        why="below 1e-4 of the largest a direction is lost in float32 training",
        cases=("sgd", "sgd_wd", "adamw"),
    ),
    Claim(
        id="wd_beta_law",
        claim="under SGD + weight decay β decays as Π_t (1 − η_t λ)²",
        metric="largest |measured − predicted| / predicted final β drift over the tested layers",
        value=lambda c: wd_beta_law(c["sgd_wd"], c["sgd"])["relative_error"],
        op="<",
        threshold=1e-2,
        why="the gradient part conserves β to first order (an exact law, so one seed decides); it is tested in "
        "the layers where plain SGD's own drift (the second-order remainder) is below the predicted drift, "
        "and 1 % leaves room for that remainder",
        cases=("sgd", "sgd_wd"),
        control_text="plain SGD's final drift (the law predicts 0 without decay)",
        control=lambda c: float(final_drift(c["sgd"]).mean()),
        min_seeds=1,
    ),
)
CLAIM_IDS = tuple(c.id for c in CLAIMS)


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def evaluate_claim(claim: Claim, runs: SuiteRuns) -> dict:
    """One claim's row: ``id``, ``claim``, ``profile``, ``metric``, ``value`` (mean over seeds), ``low``,
    ``high``, ``values`` (per seed), ``threshold``, ``op``, ``why``, ``control``, ``control_value``,
    ``seeds``, ``verdict`` and ``reason``; ``wd_beta_law`` adds ``predicted``, ``measured`` and ``per_layer``."""
    seeds = runs.seeds(claim.cases)
    row: dict = {
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
        "seeds": len(seeds),
        "seed_list": seeds,
        "verdict": "pending",
        "reason": "",
        "depends_on": None,
    }
    if not seeds:
        missing = [c for c in claim.cases if c not in runs]
        row["reason"] = f"no records of {', '.join(missing)} at this profile"
        return row
    per_seed = [runs.by_seed(s) for s in seeds]
    try:
        vals = [float(claim.value(c)) for c in per_seed]
    except KeyError as e:  # a record without the metric (an older format)
        row["reason"] = f"the records lack {e}"
        return row
    row.update(values=vals, value=float(np.mean(vals)), low=float(np.min(vals)), high=float(np.max(vals)))
    if claim.control is not None:
        try:
            row["control_value"] = float(np.mean([claim.control(c) for c in per_seed]))
        except KeyError:
            pass
    if claim.setting is not None:
        row["depends_on"] = claim.setting(per_seed[0])
    if claim.id == "wd_beta_law":
        laws = [wd_beta_law(c["sgd_wd"], c["sgd"]) for c in per_seed]
        row["predicted"] = float(np.mean([w["predicted"] for w in laws]))
        row["measured"] = float(np.nanmean([w["measured"] for w in laws]))
        row["per_layer"] = np.mean([w["per_layer"] for w in laws], axis=0).tolist()
        row["tested_layers"] = sorted(set.intersection(*(set(w["tested_layers"]) for w in laws)))
        layers_total = len(laws[0]["per_layer"])
        row["depends_on"] = (
            f"tested in layer(s) {', '.join(str(i + 1) for i in row['tested_layers'])} of {layers_total}"
            + ("" if len(row["tested_layers"]) == layers_total else "; in the others plain SGD's own drift exceeds "
               "the predicted one, so the second-order remainder, not the decay, sets the drift there")
        )  # fmt: skip
        if any(not w["tested_layers"] for w in laws):
            row["verdict"], row["reason"] = "inconclusive", "no layer where plain SGD's drift is below the prediction"
            return {k: _finite(v) for k, v in row.items()}
    layers = per_seed[0][claim.cases[0]].config["n_layer"]
    holds = [claim.holds(v) for v in vals]
    if layers < claim.min_layers:
        row["verdict"], row["reason"] = "inconclusive", f"needs ≥ {claim.min_layers} layers, the model has {layers}"
    elif len(seeds) < claim.min_seeds:
        row["verdict"] = "inconclusive"
        row["reason"] = f"{len(seeds)} seed{'s' * (len(seeds) > 1)}; {claim.min_seeds} needed for a spread"
    elif all(holds):
        row["verdict"] = "yes"
    elif not any(holds):
        row["verdict"] = "no"
    else:
        row["verdict"] = "inconclusive"
        row["reason"] = f"the seeds' range {row['low']:.3g} to {row['high']:.3g} crosses the threshold"
    return {k: _finite(v) for k, v in row.items()}


def evaluate_claims(runs: SuiteRuns) -> list[dict]:
    """Every claim of :data:`CLAIMS` on ``runs`` (a dynamics suite)."""
    return [evaluate_claim(c, runs) for c in CLAIMS]
