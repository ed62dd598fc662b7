"""Chapter 6's ladder of scales: every §5 claim's verdict at each scale the chapter reads (this build's rerun, the
committed mid and paper-scale records), which verdicts hold at every scale and which change, and the quantities
with a natural dependence on scale drawn against it.

``rows`` is :func:`attnid.chapters.verdicts.claim_rows` (one row per claim and scale); ``scales`` maps a scale's
name to its :class:`~attnid.lm.analysis.SuiteRuns`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..lm import analysis as an
from ..lm import claims as cl
from ..lm.analysis import SuiteRuns

Scales = dict[str, SuiteRuns]


def model_size(runs: SuiteRuns) -> int:
    """Parameters of the blocks of a scale's model (12·L·E², the embeddings left out): the order of the ladder."""
    c = runs.first(next(iter(runs.runs))).config
    return 12 * int(c["n_layer"]) * int(c["n_embd"]) ** 2


def ordered(scales: Scales) -> list[str]:
    """The scales' names from the smallest model to the largest."""
    return sorted(scales, key=lambda name: model_size(scales[name]))


def short(runs: SuiteRuns) -> str:
    """E.g. ``"mid (6 × 6 × 96)"``: a scale's profile and shape, for tables and axes."""
    c = runs.first(next(iter(runs.runs))).config
    return f"{runs.profile} ({c['n_layer']} × {c['n_head']} × {c['n_embd']})"


def verdict_cell(row) -> str:
    """One claim at one scale: ``"yes (3 seeds)"``, ``"inconclusive (1 seed, against the paper)"``, ``"pending"``;
    the law's cell names the measure it was read on (``"yes (3 seeds, on β)"``)."""
    if row["verdict"] == "pending":
        return "pending"
    n = int(row["seeds"])
    seeds = f"{n} seed{'s' * (n != 1)}"
    measure = row.get("law_measure") if hasattr(row, "get") else None
    if isinstance(measure, str):
        seeds += f", on {measure.split(' ')[0]}"
    if row["verdict"] in ("yes", "no"):
        return f"{row['verdict']} ({seeds})"
    side = row["side"] if isinstance(row["side"], str) else "undecided"
    return f"inconclusive ({seeds}, {side})"


def table_ladder(rows: pd.DataFrame, scales: Scales) -> pd.DataFrame:
    """One row per claim, one column per scale (smallest model first): the verdict, its seeds and their side."""
    out = pd.DataFrame({"claim": list(dict.fromkeys(rows["id"]))})
    for name in ordered(scales):
        cells = {r["id"]: verdict_cell(r) for _, r in rows[rows["scale"] == name].iterrows()}
        out[short(scales[name])] = out["claim"].map(cells)
    return out


def side_of(row) -> str | None:
    """Where one claim's seeds lie at one scale (``None`` when pending or undecidable for a stated reason)."""
    if row["verdict"] == "pending":
        return None
    return row["side"] if isinstance(row["side"], str) else None


def side_kind(side: str | None) -> str | None:
    """``"with"``, ``"against"``, ``"split"`` or ``"no"`` (no evidence) of a side (``"with the paper"``, ...)."""
    return None if side is None else side.split(" ")[0]


def ladder_readings(rows: pd.DataFrame, scales: Scales) -> dict[str, list[str]]:
    """The claims sorted by how their verdicts move up the ladder: ``"with"`` (every scale is on the side of whoever
    states the claim: the paper, or the book for its own), ``"against"`` (every scale against it), ``"changes"``
    (one scale with it and another against it), ``"partial"`` (one side where read, but some scale leaves it
    undecided: its seeds split, a test that rejects its null neither way, too few seeds on no side, or records that
    cannot decide it) and ``"unread"`` (no scale has a side). A scale whose seeds split is undecided there, not a
    change with scale. The same-loss
    readings of the optimizer comparisons (:data:`attnid.lm.claims.MATCHED_LOSS`) are readings of those claims, not
    claims of their own: they are left out here and said apart (:func:`matched_loss_sentence`)."""
    out: dict[str, list[str]] = {"with": [], "against": [], "changes": [], "partial": [], "unread": []}
    names = ordered(scales)
    for claim_id in dict.fromkeys(rows["id"]):
        if claim_id.endswith(cl.MATCHED_SUFFIX):
            continue
        part = rows[rows["id"] == claim_id].set_index("scale")
        kinds = [side_kind(side_of(part.loc[n])) for n in names if n in part.index]
        sides = set(kinds) & {"with", "against"}  # split seeds and no evidence are no side
        if not sides:
            out["unread"].append(claim_id)
        elif len(sides) > 1:
            out["changes"].append(claim_id)
        elif any(k not in sides for k in kinds):
            out["partial"].append(claim_id)
        else:
            out["with" if sides == {"with"} else "against"].append(claim_id)
    return out


def ladder_sentence(rows: pd.DataFrame, scales: Scales, middle: str | None = None) -> str:
    """Which verdicts hold at every scale, which go against the paper at every scale and which change, and for the
    last two kinds where the ``middle`` scale (default: the mid records, if read) lies, with its seeds."""
    read = ladder_readings(rows, scales)
    names = ordered(scales)
    middle = middle or next((n for n in names if scales[n].profile == "mid"), None)

    owner = dict(zip(rows["id"], rows["stated_by"])) if "stated_by" in rows else {}

    def named(i: str) -> str:  # a claim the book states itself says so
        return f"*{i}*" + (f" ({owner[i]}'s own)" if owner.get(i, "the paper") != "the paper" else "")

    def listed(ids: list[str]) -> str:
        return ", ".join(named(i) for i in ids) or "none"

    def where(claim_id: str) -> str:
        part = rows[rows["id"] == claim_id].set_index("scale")
        cells = [f"{scales[n].profile} {verdict_cell(part.loc[n])}" for n in names if n in part.index]
        return f"{named(claim_id)} ({'; '.join(cells)})"

    text = (
        f"**The ladder.** On the side of whoever states them (the paper, or this book for its own) at every scale: "
        f"{listed(read['with'])}. Against it at every scale: "
        f"{', '.join(where(i) for i in read['against']) or 'none'}. The scales disagree on: "
        f"{', '.join(where(i) for i in read['changes']) or 'none'}. Decided at some scales only (one side where "
        f"read): {', '.join(where(i) for i in read['partial']) or 'none'}."
    )
    if middle is not None:
        mid = rows[rows["scale"] == middle].set_index("id")
        moved = [i for i in read["changes"] + read["against"] if i in mid.index]
        if moved:
            text += f" Where they disagree or go against their source, the {middle} reads: " + "; ".join(
                f"*{i}* {verdict_cell(mid.loc[i])}" for i in moved
            )
            text += "."
    if read["unread"]:
        no_side = listed(read["unread"])
        text += f" On no side at any scale (not read, its seeds split, or no evidence either way): {no_side}."
    return text + " " + matched_loss_sentence(rows, scales)


def matched_loss_changes(rows: pd.DataFrame, scales: Scales) -> list[tuple[str, str, str, str, bool]]:
    """``(claim, scale, at the same step, at the same loss, decided)`` wherever reading an optimizer comparison at the
    same validation loss (:data:`attnid.lm.claims.MATCHED_LOSS`) gives another verdict or side than at the same
    step; ``decided`` is False where some seed's side changes when the target moves by the reading's tolerance
    (:func:`attnid.lm.claims.within_band`): a change the cut's uncertainty does not decide."""
    out = []
    for name in ordered(scales):
        part = rows[rows["scale"] == name].set_index("id")
        for claim_id in cl.MATCHED_LOSS:
            twin = claim_id + cl.MATCHED_SUFFIX
            if claim_id in part.index and twin in part.index:
                a, b = verdict_cell(part.loc[claim_id]), verdict_cell(part.loc[twin])
                if a != b:
                    sides = part.loc[twin].get("band_sides")
                    decided = not (isinstance(sides, list) and cl.within_band(sides))
                    out.append((claim_id, scales[name].profile, a, b, decided))
    return out


def matched_loss_sentence(rows: pd.DataFrame, scales: Scales) -> str:
    """Whether comparing the optimizers at the same validation loss changes any verdict, and where; a change that
    the cut's uncertainty does not decide is said apart."""
    changes = matched_loss_changes(rows, scales)
    lead = "Read at the same validation loss instead of the same step, the optimizer comparisons"
    if not changes:
        return f"{lead} change no verdict."

    def cells(decided: bool) -> str:
        return "; ".join(f"*{c}* at {s}: {a} at the same step, {b} at the same loss"
                         for c, s, a, b, d in changes if d == decided)  # fmt: skip

    firm, loose = cells(True), cells(False)
    text = f"{lead} change: {firm}." if firm else f"{lead} change no verdict beyond the cut's uncertainty."
    if loose:
        text += (f" Within it (a seed changes side when the loss read at moves by the reading's error, at least "
                 f"{cl.READ_TOLERANCE} nats, or is read from the evaluations alone), the reading does not decide: "
                 f"{loose}.")  # fmt: skip
    return text


def ladder_facts(rows: pd.DataFrame, scales: Scales) -> dict[str, object]:
    """Counts the chapter glues: scales read, claims on the paper's side at every scale, against it at every scale,
    changing with scale, and decided at some scales only (each claim once: its same-loss reading is not counted)."""
    read = ladder_readings(rows, scales)
    return {
        "ladder_scales": len(scales),
        "ladder_with": len(read["with"]),
        "ladder_against": len(read["against"]),
        "ladder_changes": len(read["changes"]),
        "ladder_partial": len(read["partial"]),
    }


# ------------------------------------------------------------------------------ quantities against scale
def scale_quantities(scales: Scales) -> pd.DataFrame:
    """One row per scale (smallest first): ρ's isotropic reference D/(2(E+1)), the mean ρ of SGD + weight decay and
    of AdamW (how each scale measured it), the law's factor c_T, the largest law residual over the tested layers
    (mean over seeds) and plain SGD's remainder / c_T in those layers."""
    out = []
    for name in ordered(scales):
        runs = scales[name]
        row: dict[str, object] = {"scale": short(runs), "size": model_size(runs)}
        rec = runs.first(next(iter(runs.runs)))
        row["isotropic ρ"] = an.isotropic_rho(rec.config)
        for case in ("sgd_wd", "adamw"):
            if case in runs:
                row[f"mean ρ, {case}"] = an.over_seeds(runs, case, an.mean_rho)["mean"]
                row["ρ measured from"] = an.rho_measure(runs.first(case))
        if "sgd" in runs and "sgd_wd" in runs:
            seeds = runs.seeds(("sgd", "sgd_wd"))
            laws = [cl.wd_beta_law(runs.runs["sgd_wd"][s], runs.runs["sgd"][s]) for s in seeds]
            tested = cl.law_tested(laws)
            row["c_T"] = laws[0].factor
            row["law measured on"] = laws[0].measure.split(" ")[0]
            row["law residual, tested layers"] = (
                float(np.mean([w.residual[tested].max() for w in laws])) if tested else np.nan
            )
            on_tau = [cl.law_residual(runs.runs["sgd_wd"][s], on_tau=True)[2][-1] for s in seeds]
            row["τ residual, tested layers"] = float(np.mean([r[tested].max() for r in on_tau])) if tested else np.nan
            row["remainder / c_T, tested layers"] = float(cl.law_remainder(laws)[tested].max()) if tested else np.nan
        out.append(row)
    return pd.DataFrame(out)


def law_measure_sentence(q: pd.DataFrame) -> str:
    """Which measure each scale's law is read on (:func:`scale_quantities`), and, where a scale's records hold β's
    residual, how τ's residual in the same tested layers compares with it: the numbers, not a general claim."""
    if "law measured on" not in q:
        return ""
    read = q.dropna(subset=["law measured on"])
    parts = [f"{r['scale']} on {r['law measured on']}" for _, r in read.iterrows()]
    text = f"The law's residual is read on: {', '.join(parts)}."
    both = read[(read["law measured on"] == "β") & read["τ residual, tested layers"].notna()]
    cells = [
        f"{r['scale']}: τ {r['τ residual, tested layers']:.2g} against β {r['law residual, tested layers']:.2g}"
        for _, r in both.iterrows()
        if np.isfinite(r["law residual, tested layers"])
    ]
    if cells:
        ratios = [
            r["τ residual, tested layers"] / r["law residual, tested layers"]
            for _, r in both.iterrows()
            if np.isfinite(r["law residual, tested layers"]) and r["law residual, tested layers"] > 0
        ]
        side = (
            "smaller"
            if max(ratios) < 1
            else "larger"
            if min(ratios) > 1
            else "smaller at some scales, larger at others"
        )
        text += " Read on τ = tr β per head instead, the largest residual over the tested layers is " + side
        verdict = {
            "larger": ": on these records τ is the stricter reading, not the weaker one.",
            "smaller": ".",
        }.get(side, ": neither reading is the stricter at every scale.")
        text += " (" + "; ".join(cells) + ")" + verdict
    return text


def drift_profiles(scales: Scales) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Plain SGD's final β drift per layer at each scale (the deep SGD case where the profile trains one), as
    ``(relative depth (layer − ½) / L, drift per seed (seeds, L))``."""
    from ..lm.profiles import DEEP_SGD

    out = {}
    for name in ordered(scales):
        runs = scales[name]
        case = DEEP_SGD if DEEP_SGD in runs else "sgd"
        if case not in runs:
            continue
        d = np.array([an.final_drift(rec) for _, rec in sorted(runs.runs[case].items())])
        out[short(runs)] = ((np.arange(d.shape[1]) + 0.5) / d.shape[1], d)
    return out


def fig_ladder(scales: Scales):
    """Three panels against scale: mean ρ with the isotropic reference; the law's factor, residual and remainder;
    plain SGD's final drift per layer against relative depth (every seed)."""
    import matplotlib.pyplot as plt

    from ..plotting import panels

    q = scale_quantities(scales)
    fig, axes = panels(3, height=3.4)
    ax = axes.flat[0]
    x = np.arange(len(q))
    ax.plot(x, q["isotropic ρ"], "k--", marker="s", label="isotropic D/(2(E+1))")
    for i, case in enumerate(("sgd_wd", "adamw")):
        col = f"mean ρ, {case}"
        if col in q:
            ax.plot(x, q[col], marker="o", color=f"C{i + 1}", label={"sgd_wd": "SGD + wd", "adamw": "AdamW"}[case])
    ax.set(yscale="log", ylabel="mean ρ (share of step energy)", title="ρ against scale")
    ax.set_xticks(x, q["scale"], rotation=12)
    ax.legend()
    ax = axes.flat[1]
    if "c_T" in q:
        ax.plot(x, q["c_T"], "k--", marker="s", label="c_T (the law's factor)")
        on = ", ".join(sorted(set(q["law measured on"].dropna()))) if "law measured on" in q else "β"
        ax.plot(
            x, q["law residual, tested layers"], marker="o", color="C1", label=f"law residual on {on} (largest tested)"
        )
        ax.plot(x, q["remainder / c_T, tested layers"], marker="^", color="C0", label="SGD remainder / c_T")
        ax.axhline(cl.LAW_TOLERANCE, color="grey", lw=0.8, ls=":", label="1 % tolerance")
    ax.set(yscale="log", ylabel="ratio (1 = equal)", title="The weight-decay law against scale")
    ax.set_xticks(x, q["scale"], rotation=12)
    ax.legend(fontsize=8.5)
    ax = axes.flat[2]
    for i, (label, (depth, d)) in enumerate(drift_profiles(scales).items()):
        for k, seed_drift in enumerate(d):
            ax.plot(depth, seed_drift, marker="o", ms=3, color=f"C{i}", alpha=0.8, label=label if k == 0 else None)
    ax.set(
        yscale="log",
        xlabel="relative depth of the layer ((layer − ½) / L)",
        ylabel="final β drift ‖β_T − β_0‖ / ‖β_0‖",
        title="Plain SGD's drift per layer (every seed)",
    )
    ax.legend()
    plt.show()
    return fig


@dataclass(frozen=True)
class Provenance:
    """How a scale's records were made, as their summaries say (each value once, joined by commas)."""

    records: int
    machine: str
    precision: str
    torch: str
    code: str  # the code commits, "unknown" where no summary names one
    hours: float  # the machine time of all the records (a stack's runs trained together: its time once)


def provenance(runs: SuiteRuns) -> Provenance:
    """What a scale's summaries say of how its records were made: their number, the machines, precisions, torch
    versions and code commits (each once), and the machine time of all of them in hours (:func:`machine_seconds`)."""
    recs = [rec for by in runs.runs.values() for rec in by.values()]

    def each(get) -> str:
        return ", ".join(sorted({str(v) for v in map(get, recs) if v}))

    def prov(rec, key):
        return rec.summary.get(key) or rec.summary.get("provenance", {}).get(key)

    return Provenance(
        records=len(recs),
        machine=each(lambda r: prov(r, "machine") or prov(r, "device")),
        precision=each(lambda r: r.summary.get("precision")),
        torch=each(lambda r: prov(r, "torch")),
        code=each(lambda r: prov(r, "code_commit")) or "unknown",
        hours=machine_seconds(recs) / 3600,
    )


def machine_seconds(recs: list) -> float:
    """The wall time that made ``recs``: each record's ``wall_seconds``, except that the runs of one stack
    (:mod:`attnid.lm.batched`; the same ``stacked_with`` and wall time) trained together and count once."""
    seen, total = set(), 0.0
    for r in recs:
        wall = float(r.summary.get("wall_seconds") or 0.0)
        stack = r.summary.get("stacked_with")
        key = (tuple(stack), round(wall, 3)) if stack else id(r)
        if key not in seen:
            seen.add(key)
            total += wall
    return total


def records_sentence(scales: Scales) -> str:
    """The provenance of every scale's records, one clause per scale, from their summaries."""
    parts = []
    for name in ordered(scales):
        p = provenance(scales[name])
        parts.append(
            f"*{name}*: {p.records} records, trained on {p.machine} ({p.precision}, torch {p.torch}) by "
            f"the code of commit {p.code}, "
            + (f"{p.hours:.1f} hours" if p.hours >= 1 else f"{60 * p.hours:.0f} minutes")
            + " of machine time in all"
        )
    return "**Where the records come from.** " + "; ".join(parts) + "."
