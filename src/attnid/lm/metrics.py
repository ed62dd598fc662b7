"""The metrics schema: every key of a run record's rows, with its shape, unit and meaning.

The probe (:mod:`attnid.lm.probe`) and the loop (:mod:`attnid.lm.train`) write rows with these keys,
the records (:mod:`attnid.lm.records`) store them, and the chapters and :mod:`attnid.lm.analysis`
read them back through :class:`Key`, never through string literals. ``Key`` members are strings,
so ``row[Key.RHO]`` and ``row["rho"]`` are the same entry and JSON stores the plain name.

Shapes use ``L`` (layers), ``H`` (heads per layer) and ``D`` (head dimension).

When a row is taken: the row of step ``t`` holds the step's own numbers (its loss and the probe's reading of its
update) and the weights' numbers after the update of step ``t`` but *before* any rebalance at that step
(``adamw_rebalance``: the rebalance runs after the probe has read the step, :func:`attnid.lm.train.record_step`).
The final weights in ``model.pt`` and the snapshots are taken after it, so a rebalancing run's last row and its
``model.pt`` differ by the last rebalance where one falls on the last step (the rows' τ, the weights' τ = 0); the
evaluation's values (``val_loss``, ``qk_sv``) are taken after it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Key(StrEnum):
    STEP = "step"
    LR = "lr"
    TRAIN_LOSS = "train_loss"
    VAL_LOSS = "val_loss"
    RHO = "rho"
    RHO_W = "rho_w"
    RHO_DIFF = "rho_diff"
    BETA_DRIFT = "beta_drift"
    BETA_LAW = "beta_law_residual"
    BETA_REL = "beta_rel"
    TAU = "tau"
    GRAD_BQ = "grad_bq"
    GRAD_BK = "grad_bk"
    NORM_BQ = "norm_bq"
    NORM_BK = "norm_bk"
    QK_SV = "qk_sv"


EVERY_ROW = "every recorded step"


@dataclass(frozen=True)
class Metric:
    """One row key: the shape of its value, its unit and what it measures (and which rows hold it)."""

    key: Key
    shape: tuple[str, ...]
    unit: str
    meaning: str
    rows: str = "metric steps"  # or "every recorded step", "evaluation steps" (attnid.lm.analysis.schema_steps)


SCHEMA: dict[Key, Metric] = {
    m.key: m
    for m in (
        Metric(Key.STEP, (), "steps", "optimizer steps taken when the row was recorded (1-based)", EVERY_ROW),
        Metric(Key.LR, (), "1", "learning rate of that step (warmup, then cosine decay)", EVERY_ROW),
        Metric(Key.TRAIN_LOSS, (), "nats/char", "training cross-entropy of that step's batch", EVERY_ROW),
        Metric(Key.VAL_LOSS, (), "nats/char", "mean validation cross-entropy", rows="evaluation steps"),
        Metric(
            Key.RHO,
            ("L", "H"),
            "share of energy",
            "unidentified-step fraction ρ of the bias-augmented [W_Q | b_Q], [W_K | b_K], from the optimizer's "
            "own update in float64 (chapter 6, Eq. eq-rho)",
            rows="metric steps, records made since the float64 probe",
        ),
        Metric(
            Key.RHO_W,
            ("L", "H"),
            "share of energy",
            "ρ of the weights alone (bias column ignored), float64 update",
            rows="metric steps, records made since the float64 probe",
        ),
        Metric(
            Key.RHO_DIFF,
            ("L", "H"),
            "share of energy",
            "ρ of the float32 weight difference W_{t+1} − W_t (the paper's measure; carries a rounding floor)",
            rows="metric steps",
        ),
        Metric(Key.BETA_DRIFT, ("L",), "1", "‖β_t − β_0‖_F / ‖β_0‖_F, norms over all heads of a layer"),
        Metric(
            Key.BETA_LAW,
            ("L",),
            "1",
            "residual of the weight-decay law ‖β_t − c_t β_0‖_F / ‖c_t β_0‖_F, norms over all heads of a layer, "
            "c_t = Π_{s<t}(1 − η_s λ)² for SGD (attnid.lm.profiles.beta_law_factor; 1 without decay and for AdamW, "
            "where it equals beta_drift)",
            rows="metric steps, records made since the law's residual",
        ),
        Metric(Key.BETA_REL, ("L",), "1", "relative imbalance ‖β_t‖_F / (‖G_Q‖_F + ‖G_K‖_F) of a layer"),
        Metric(Key.TAU, ("L", "H"), "weight²", "τ = tr β = ‖Q‖²_F − ‖K‖²_F per head (signed)"),
        Metric(Key.GRAD_BQ, ("L", "H"), "nats/char per unit", "‖∇b_Q‖ per head, before clipping"),
        Metric(Key.GRAD_BK, ("L", "H"), "nats/char per unit", "‖∇b_K‖ per head, before clipping (0 exactly)"),
        Metric(Key.NORM_BQ, ("L", "H"), "weight", "‖b_Q‖ per head"),
        Metric(Key.NORM_BK, ("L", "H"), "weight", "‖b_K‖ per head"),
        Metric(
            Key.QK_SV,
            ("L", "H", "D"),
            "weight²",
            "singular values of each head's augmented QK product Kᵀ Q, largest first",
            rows="evaluation steps",
        ),
    )
}

RHO_METHODS: dict[str, Key] = {
    # summary.json's ``rho_method`` -> the row key that holds ρ measured that way
    "float64 optimizer update": Key.RHO,
    "float32 weight difference": Key.RHO_DIFF,
}


def check_row(row: dict, L: int, H: int, D: int) -> None:
    """Raise ``ValueError`` naming the first key of ``row`` that is not in :data:`SCHEMA` or has the wrong shape."""
    import numpy as np

    sizes = {"L": L, "H": H, "D": D}
    for k, v in row.items():
        if k not in SCHEMA:
            raise ValueError(f"row key {k!r} is not in the metrics schema")
        want = tuple(sizes[s] for s in SCHEMA[Key(k)].shape)
        got = np.shape(v)
        if got != want:
            raise ValueError(f"row key {k!r}: shape {got}, schema says {want} {SCHEMA[Key(k)].shape}")
