"""Chapter 6, the claims table (:mod:`attnid.lm.claims` at every scale the chapter reads), the settings each verdict
depends on, where the records go against the paper, and the numbers the chapter's summary glues."""

from __future__ import annotations

import pandas as pd

from ..lm import claims as cl
from . import with_formats
from .decay import adamw_key_bias_steps, law_sentence, table_wd_law
from .dynamics import MAIN, Scales, rho_rows


# ------------------------------------------------------------------------------ the claims table
def claim_rows(scales: Scales) -> pd.DataFrame:
    """Every claim at every scale (:func:`attnid.lm.claims.evaluate_claims`), one row each."""
    return pd.DataFrame([{"scale": name, **row} for name, runs in scales.items() for row in cl.evaluate_claims(runs)])


def table_claims(rows: pd.DataFrame) -> pd.DataFrame:
    """The claims table as the chapter shows it (its display formats attached)."""

    def shown(r) -> str:
        if r["value"] is None or pd.isna(r["value"]):
            return "—"
        rng = f" ({r['low']:.3g} to {r['high']:.3g})" if r["seeds"] > 1 else ""
        return f"{r['value']:.3g}{rng}"

    shown = pd.DataFrame(
        {
            "id": rows["id"],
            "scale": rows["scale"],
            "value (range over seeds)": rows.apply(shown, axis=1),
            "test": rows["op"] + " " + rows["threshold"].map("{:g}".format),
            "control": rows["control_value"],
            "seeds": rows["seeds"],
            "verdict": rows["verdict"] + rows["reason"].map(lambda s: f" ({s})" if s else ""),
        }
    )
    return with_formats(shown, seeds="{:.0f}", control="{:.3g}")


def claims_list() -> str:
    """Every claim as a Markdown bullet: its metric, test, threshold and why, and its control."""
    return "\n".join(
        f"- **{c.id}**: {c.claim}. *Metric*: {c.metric}; *test*: {c.op} {c.threshold:g}, because {c.why}."
        + (f" *Control*: {c.control_text}." if c.control_text else "")
        for c in cl.CLAIMS
    )


def depends_sentence(rows: pd.DataFrame) -> str:
    """What each verdict that depends on a setting depends on."""
    settings = rows.dropna(subset=["depends_on"])
    return "**What the verdicts depend on.** " + " ".join(
        f"*{r.id}* ({r.scale}): {r.depends_on}." for r in settings.itertuples()
    )


def facts(scales: Scales) -> dict[str, object]:
    """The numbers the chapter's summary glues, from the rerun (the last scale): its title and seeds, mean ρ of
    plain SGD and of AdamW (and AdamW's against the isotropic share), the law's sentence and AdamW's key-bias
    step share (aligned and independent)."""
    name, runs = list(scales.items())[-1]
    rho = rho_rows({name: runs}).set_index("case")
    coherent, walk = adamw_key_bias_steps(runs)
    return {
        "rerun_label": runs.label(),
        "n_seeds": len(runs.seeds(MAIN)),
        "rho_sgd": float(rho.loc["sgd", "mean_rho"]),
        "rho_adamw": float(rho.loc["adamw", "mean_rho"]),
        "rho_adamw_iso": float(rho.loc["adamw", "mean_rho"] / rho.loc["adamw", "isotropic"]),
        "wd_sentence": law_sentence(table_wd_law({name: runs}), name),
        "kb_coherent": coherent,
        "kb_walk": walk,
    }


def disagreements(rows: pd.DataFrame) -> str:
    """Where the records go against the claims: the decided rows reading ``no``, the undecided rows whose seeds all
    lie against it, the rows whose seeds split, the pending ones, and how many undecided rows lean its way."""
    undecided = rows["verdict"] == "inconclusive"

    def listed(part: pd.DataFrame, seeds: bool = False) -> str:
        return "; ".join(
            f"{r.id} ({r.scale}" + (f", {r.seeds} seed{'s' * (r.seeds > 1)})" if seeds else ")")
            for r in part.itertuples()
        )

    no = rows[rows["verdict"] == "no"]
    parts = [
        "Read **no**: " + ("; ".join(f"{r.claim} ({r.scale})" for r in no.itertuples()) or "none"),
        "Undecided, every seed against the claim's source: "
        + (listed(rows[undecided & rows["side"].astype(str).str.startswith("against ")], True) or "none"),
        "Seeds split: " + (listed(rows[undecided & (rows["side"] == "split")]) or "none"),
        "Pending: " + (listed(rows[rows["verdict"] == "pending"]) or "none"),
    ]
    leaning = int((undecided & rows["side"].astype(str).str.startswith("with ")).sum())
    return ". ".join(parts) + f". The other {leaning} undecided rows have every seed on their source's side."
