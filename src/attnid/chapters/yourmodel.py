"""Chapter 10, your model: the counts of a released ``config.json`` (the shipped ones and one the reader edits),
the trained layers of the optimizer runs audited at their trained weights, and the weights' motion measured
modulo the symmetries (:mod:`attnid.invariants`) against their raw motion.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd
import torch

from ..configs import CONFIG_DIR, config_preset
from ..counting import SCOPES
from ..lm import records
from ..lm.data import CharData
from ..lm.gpt import GPT
from ..lm.model_files import load_model
from ..lm.points import (
    audit_run,
    identified_moves,
    model_distances,
    raw_distance,
    snapshot_distances,
    symmetry_moves,
)
from ..lm.profiles import OPTIMIZER_CASES
from ..presets import scope_count
from . import CASE_LABELS, with_formats

READS = ("dynamics", "points")  # chapter 6's optimizer runs and their narrow twins (the book's cache watches them)
POINTS_PREFIX = "points_"  # the narrow twin of case c is points_c (attnid.lm.profiles.SUITES["points"])
WEAK = 1e-6  # an identified direction weaker than this share of the strongest is called numerically weak


# ------------------------------------------------------------------------------ configs
def config_counts(path: str | Path, name: str) -> dict:
    """One row: the unidentified count and share of the model ``path`` describes at every scope it has."""
    p = config_preset(path)
    row: dict = {"config": name, "model type": p.hf_type or json.loads(Path(path).read_text())["model_type"]}
    for scope in SCOPES:
        if scope != "attention" and p.model is None:  # attention-only families
            row[f"{scope} unidentified"], row[f"{scope} share"] = None, None
            continue
        c = scope_count(p, scope, name)
        row[f"{scope} unidentified"], row[f"{scope} share"] = c.unidentified, c.unidentified / c.total_params
    return row


def table_shipped_configs(folder: Path = CONFIG_DIR) -> pd.DataFrame:
    """:func:`config_counts` of every config shipped in ``data/configs``."""
    rows = [config_counts(f, f.stem) for f in sorted(folder.glob("*.json"))]
    return _formatted(pd.DataFrame(rows))


def table_your_config(fields: dict, name: str = "your config") -> pd.DataFrame:
    """:func:`config_counts` of a config given as a dict (the fields of a ``config.json``), read like a file."""
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "config.json"
        f.write_text(json.dumps(fields))
        return _formatted(pd.DataFrame([config_counts(f, name)]))


def _formatted(df: pd.DataFrame) -> pd.DataFrame:
    return with_formats(
        df,
        **{f"{s} unidentified": "{:,.0f}" for s in SCOPES},
        **{f"{s} share": "{:.3%}" for s in SCOPES},
    )


# ------------------------------------------------------------------------------ symmetry moves
def table_moves(model: GPT, tokens: torch.Tensor) -> pd.DataFrame:
    """Every symmetry move of ``model`` (:func:`attnid.lm.points.symmetry_moves`) and two moves that change its
    function (:func:`attnid.lm.points.identified_moves`): how far each moves the weights (largest
    :func:`~attnid.lm.points.raw_distance` over the layers), the invariants (largest relative
    :func:`~attnid.lm.points.model_distances`) and the logits on ``tokens`` (largest change over the largest
    logit)."""
    model = cast(GPT, model.double().eval())
    with torch.no_grad():
        logits = model(tokens)[0]
    rows = []
    for kind, moves in (("symmetry", symmetry_moves(model)), ("identified", identified_moves(model))):
        for name, m in moves.items():
            with torch.no_grad():
                out = float((m(tokens)[0] - logits).abs().max() / logits.abs().max())
            rows.append(
                {
                    "move": name,
                    "kind": kind,
                    "weights moved": max(raw_distance(model, m, k) for k in range(len(model.blocks))),
                    "invariants moved": max(model_distances(model, m)),
                    "logits moved": out,
                }
            )
    return with_formats(
        pd.DataFrame(rows), **{"weights moved": "{:.1e}", "invariants moved": "{:.1e}", "logits moved": "{:.1e}"}
    )


def moves_facts(t: pd.DataFrame) -> dict:
    sym, ident = t[t["kind"] == "symmetry"], t[t["kind"] == "identified"]
    return {
        "n_symmetry_moves": len(sym),
        "sym_min_weights": float(sym["weights moved"].min()),
        "sym_max_invariants": float(sym["invariants moved"].max()),
        "sym_max_logits": float(sym["logits moved"].max()),
        "ident_min_invariants": float(ident["invariants moved"].min()),
        "ident_min_logits": float(ident["logits moved"].min()),
    }


# ------------------------------------------------------------------------------ trained points
CERTIFIED_BY_DEFAULT = ("adamw",)  # chapter 6's runs certified unless the reader names others (about 15 s a layer)


def certified_cases(profile: str, chosen: object = None) -> tuple[str, ...]:
    """The optimizer cases whose chapter-6 runs the certificate audits: ``chosen``, a list of cases (``True``: all
    four, ``False``: none), or by default AdamW's at every profile but smoke. The four take about two minutes on 2
    cores at the cpu profile (eight layers), AdamW's alone half a minute. Anything else is refused by name."""
    if chosen is None:
        return () if profile == "smoke" else CERTIFIED_BY_DEFAULT
    if chosen is True or chosen is False:
        return OPTIMIZER_CASES if chosen else ()
    if isinstance(chosen, (list, tuple)) and all(isinstance(c, str) for c in chosen):
        unknown = [c for c in chosen if c not in OPTIMIZER_CASES]
        if not unknown:
            return tuple(c for c in OPTIMIZER_CASES if c in chosen)
    raise ValueError(
        f"certify_chapter6: expected None, True, False or a list of {', '.join(OPTIMIZER_CASES)}; got {chosen!r}"
    )


def _in_words(items: list[str]) -> str:
    """``"a"``, ``"a and b"``, ``"a, b and c"``."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def cases_named(cases: tuple[str, ...]) -> str:
    """The runs of ``cases`` in words: ``"AdamW run"``, ``"SGD and AdamW runs"``."""
    return _in_words([CASE_LABELS[c] for c in cases]) + (" runs" if len(cases) > 1 else " run")


def table_points(
    profile: str,
    data: CharData,
    *,
    seed: int = 0,
    prefix: str = POINTS_PREFIX,
    base: Path | None = None,
    cases: tuple[str, ...] = OPTIMIZER_CASES,
) -> pd.DataFrame:
    """The trained-point audit (:func:`attnid.lm.points.audit_run`, kept in each run's ``points.json``) of every
    layer of the final weights of the optimizer ``cases`` (``prefix`` + case: the narrow twins by default, ``""``:
    chapter 6's runs). A case without kept weights (``model.pt``) gets one row saying so."""
    rows = []
    for case in cases:
        d = records.run_dir(profile, prefix + case, seed, base)
        if not (d / "model.pt").exists():
            rows.append({"case": case, "layer": None, "note": "no weights kept (model.pt)"})
            continue
        for r in audit_run(d, data, seed=seed, cache=True):
            rows.append({"case": case, **{k: r[k] for k in POINT_COLUMNS}, "note": r["note"]})
    df = pd.DataFrame(rows)
    for k in POINT_COLUMNS:
        if k not in df:
            df[k] = None
    return with_formats(df, params="{:,.0f}", gap="{:.1e}", weakest="{:.1e}", seconds="{:.1f}")


POINT_COLUMNS = (
    "layer", "params", "rank", "unidentified", "generic", "at_generic", "gap", "weakest", "tokens", "method",
    "seconds",
)  # fmt: skip


def table_checkpoint(path: str | Path, *, seed: int = 0) -> pd.DataFrame:
    """:func:`attnid.checkpoints.audit_checkpoint` of every attention layer of a ``transformers`` checkpoint
    folder, with the columns of :func:`table_points` and whether the inputs lie on a hyperplane."""
    from ..checkpoints import audit_checkpoint

    rows = audit_checkpoint(path, seed=seed)
    df = pd.DataFrame([{**{k: r[k] for k in POINT_COLUMNS}, "hyperplane": r["hyperplane"]} for r in rows])
    return with_formats(df, params="{:,.0f}", gap="{:.1e}", weakest="{:.1e}", seconds="{:.1f}")


def points_facts(t: pd.DataFrame, key: str) -> dict:
    """Glue values of a :func:`table_points` table, prefixed ``key``: layers audited, at the generic count, special,
    undecided, without weights; the weakest identified direction over the decided layers (``weakest_min``,
    ``weakest_max``, and how many are below :data:`WEAK`), and the certificate's lower bounds over the undecided
    ones (``bound_min``, ``bound_max``)."""
    audited = t[t["layer"].notna()]
    decided = audited[audited["at_generic"].notna()]
    undecided = audited[audited["at_generic"].isna()]
    weakest = decided["weakest"].dropna().astype(float)
    bound = undecided["weakest"].dropna().astype(float)

    def span(v: pd.Series) -> tuple[float, float]:
        return (float(v.min()), float(v.max())) if len(v) else (float("nan"), float("nan"))

    return {
        f"{key}_layers": len(audited),
        f"{key}_generic": int((decided["at_generic"] == True).sum()),  # noqa: E712 (a column of objects)
        f"{key}_special": int((decided["at_generic"] == False).sum()),  # noqa: E712
        f"{key}_undecided": len(undecided),
        f"{key}_missing": int(t["layer"].isna().sum()),
        **dict(zip((f"{key}_weakest_min", f"{key}_weakest_max"), span(weakest))),
        f"{key}_weak": int((weakest < WEAK).sum()),
        **dict(zip((f"{key}_bound_min", f"{key}_bound_max"), span(bound))),
        f"{key}_tokens": int(audited["tokens"].max()) if "tokens" in audited and len(audited) else 0,
    }


def points_sentence(t: pd.DataFrame, what: str) -> str:
    """What a :func:`table_points` table shows, in words computed from it."""
    f = points_facts(t, "x")
    if not f["x_layers"]:
        return f"No layer of {what} could be audited: their runs kept no weights (`model.pt`)."
    parts = [f"{f['x_generic']} sit at the generic count"]
    if f["x_special"]:
        parts.append(f"{f['x_special']} have more unidentified directions than it (a special point)")
    if f["x_undecided"]:
        parts.append(f"{f['x_undecided']} are undecided")
    text = f"Of the {f['x_layers']} layers of {what}, {_in_words(parts)}."
    decided = f["x_layers"] - f["x_undecided"]
    certified = "method" in t and bool((t["method"] == "certify").any())
    if decided and np.isfinite(f["x_weakest_min"]) and certified:
        text += (
            f" Where decided, the certificate bounds the weakest identified direction from below by "
            f"{f['x_weakest_min']:.1e} to {f['x_weakest_max']:.1e} of the strongest: the weakest direction of W_O "
            "times that of the weakest key/value group, each of them certified clear of zero at its own scale."
        )
    elif decided and np.isfinite(f["x_weakest_min"]):
        text += (
            f" Where decided, the weakest identified direction is {f['x_weakest_min']:.1e} to "
            f"{f['x_weakest_max']:.1e} of the strongest, on the {f['x_tokens']:,} validation tokens each audit read "
            "(it grows with the data, so it is a measure of these windows, not of the layer alone); in "
            f"{f['x_weak']} of those {decided} layers it is below "
            f"{WEAK:.0e}: a step along it moves the output less than a millionth as much as the same step along the "
            "strongest."
        )
    if f["x_undecided"] and np.isfinite(f["x_bound_min"]):
        text += (
            f" Where undecided, the certificate bounds the weakest identified direction from below only, by "
            f"{f['x_bound_min']:.1e} to {f['x_bound_max']:.1e} of the strongest, and could not show every factor "
            "of the Jacobian of full rank: the point may be special, or the validation windows too few."
        )
    return text


# ------------------------------------------------------------------------------ motion over training
MOTION_POINTS = 4  # snapshots after initialisation whose orbit distance is fitted (a few seconds each)


def motion_frame(profile: str, *, seed: int = 0, points: int = MOTION_POINTS, base: Path | None = None) -> pd.DataFrame:
    """:func:`attnid.lm.points.snapshot_distances` of chapter 6's optimizer cases (``points`` snapshots after step
    0), with a ``case`` column; cases whose runs kept no snapshots are left out."""
    frames = []
    for case in OPTIMIZER_CASES:
        d = records.run_dir(profile, case, seed, base)
        try:
            frames.append(pd.DataFrame(snapshot_distances(d, points=points, cache=True)).assign(case=case))
        except FileNotFoundError:
            continue
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def table_motion(frame: pd.DataFrame) -> pd.DataFrame:
    """Per case and layer, at the last step: the weights' distance from initialisation, the distance from
    initialisation to the final weights' symmetry orbit, and the share of the squared distance that the symmetry
    undoes, ``1 − (orbit / raw)²``."""
    last = frame[frame["step"] == frame.groupby("case")["step"].transform("max")].copy()
    last["along the symmetry"] = 1 - (last["orbit"] / last["raw"]) ** 2
    t = last[["case", "layer", "raw", "orbit", "along the symmetry"]].reset_index(drop=True)
    return with_formats(t, raw="{:.3f}", orbit="{:.3f}", **{"along the symmetry": "{:.1%}"})


def fig_motion(frame: pd.DataFrame):
    """Distance from initialisation over training, of the weights and to their symmetry orbit, one panel per
    optimizer case (mean over layers)."""
    import matplotlib.pyplot as plt

    from ..plotting import panels

    cases = [c for c in OPTIMIZER_CASES if not frame.empty and c in set(frame["case"])]
    if not cases:  # runs without snapshots (the paper-scale records): say so where the figure would be
        fig, ax = plt.subplots(figsize=(7.0, 1.5))
        ax.text(0.5, 0.5, "no run of chapter 6 kept its snapshots (model.pt)", ha="center", va="center")
        ax.set_axis_off()
        return fig
    fig, axes = panels(len(cases), height=3.0, sharey=True)
    for ax, case in zip(axes.flat, cases):
        f = frame[frame["case"] == case].groupby("step")[["raw", "orbit"]].mean()
        ax.plot(f.index, f["raw"], marker="o", label="weights")
        ax.plot(f.index, f["orbit"], marker="s", label="to the symmetry orbit")
        ax.set_title(CASE_LABELS[case])
        ax.set_xlabel("training step")
    for ax in axes[:, 0]:
        ax.set_ylabel("distance from init\n(mean over layers)")
    axes[0][0].legend()
    return fig


def motion_sentence(t: pd.DataFrame) -> str:
    """Which optimizer moves its weights most along the symmetry, in words computed from :func:`table_motion`."""
    if t.empty:
        return "No run of chapter 6 kept its snapshots (`model.pt`), so its motion cannot be measured here."
    by_case = t.groupby("case", sort=False)["along the symmetry"].agg(["min", "max", "mean"])
    top, low = by_case["mean"].idxmax(), by_case["mean"].idxmin()
    return (
        f"By the end of training the symmetry undoes {t['along the symmetry'].min():.0%} to "
        f"{t['along the symmetry'].max():.0%} of the squared distance the attention layers moved from "
        f"initialisation: most under {CASE_LABELS[top]} ({by_case.loc[top, 'min']:.0%} to "
        f"{by_case.loc[top, 'max']:.0%} over the layers), least under {CASE_LABELS[low]} "
        f"({by_case.loc[low, 'min']:.0%} to {by_case.loc[low, 'max']:.0%})."
    )


def motion_facts(t: pd.DataFrame) -> dict:
    if t.empty:
        return {"along_min": float("nan"), "along_max": float("nan")}
    return {"along_min": float(t["along the symmetry"].min()), "along_max": float(t["along the symmetry"].max())}


# ------------------------------------------------------------------------------ verdicts
def table_claims(profile: str, *, base: Path | None = None) -> pd.DataFrame:
    """Chapter 10's claims (:data:`attnid.lm.claims.POINT_CLAIMS`) on this profile's records, as ``attnid claims``
    prints them after the paper's."""
    from ..lm.analysis import load_suite
    from ..lm.claims import evaluate_point_claims

    suites = {s: load_suite(profile, s, base=base) for s in READS}
    rows = evaluate_point_claims(suites)
    t = pd.DataFrame(rows)[["id", "claim", "value", "op", "threshold", "seeds", "verdict", "reason"]]
    return with_formats(t, value="{:.3g}", threshold="{:g}")


def load_trained(profile: str, case: str, *, seed: int = 0, base: Path | None = None) -> GPT | None:
    """The final model of a run (``model.pt``), or ``None`` if it kept none."""
    d = records.run_dir(profile, case, seed, base)
    return load_model(d) if (d / "model.pt").exists() else None
