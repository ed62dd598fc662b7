"""The paper's §5 claims as data, each tested where it can fail (chapter 6's table, ``attnid claims``).

A :class:`Claim` is a reading of §5 (or of chapter 6's weight-decay law) with the number that tests it, the
threshold and why, the control it is read against, the cases and seeds it needs. :func:`evaluate_claim`
turns it into one row with a verdict:

* ``yes`` / ``no``: every seed agrees that the claim holds / fails; a theorem check reads ``no`` as soon as one
  seed fails it (one counterexample refutes an exact property) and ``yes`` only when every seed passes;
* ``inconclusive``: the seeds' range crosses the threshold, there are too few seeds or layers (the reason
  then says on which side the seeds lie: "1 seed, against the paper"), a value is not finite, or a value the
  records should hold is missing (null);
* ``pending``: records are missing, or a seed the caller named has no record.

A claim is of one of two kinds (:data:`KINDS`): a *theorem check* (an exact property of the model, such as a
zero gradient: one seed decides) or a *statistic of training* (a number that varies from seed to seed: three
seeds, :data:`MIN_SEEDS`). A claim is the paper's unless ``stated_by`` names the chapter whose own reading it is
(the weight-decay law: chapter 6's).

Every claim has a test that plants a violation in synthetic records and watches its verdict turn to
``no`` (``tests/test_claims.py``, ``pytest -k planted``).

The package: :mod:`.claim` (a claim, its kinds and the side its seeds
lie on), :mod:`.law` (chapter 6's weight-decay law), :mod:`.readings` (the numbers the dynamics claims read,
the bias theorems among them), :mod:`.matched` (optimizers compared at the same loss), :mod:`.registry` (the
claims of §5), :mod:`.points` (chapter 10's trained points) and :mod:`.verdicts` (a claim's row and verdict).

Shapes: ``L`` layers, ``H`` heads (:data:`attnid.lm.metrics.SCHEMA`).
"""

from .claim import KINDS, MIN_SEEDS, Claim, Undecidable, need, seed_side
from .law import (
    LAW_CUT,
    LAW_TOLERANCE,
    WdLaw,
    law_cut_changes,
    law_remainder,
    law_residual,
    law_tested,
    law_values,
    law_verdict,
    wd_beta_law,
)
from .matched import (
    MATCHED_LOSS,
    MATCHED_SUFFIX,
    READ_TOLERANCE,
    Reading,
    at_matched_loss,
    band_sides,
    evaluation_reading,
    held_out_coverage,
    matched_loss,
    matched_loss_twin,
    prediction_error,
    reading_at,
    readings,
    up_to_loss,
    val_loss_estimate,
    within_band,
)
from .points import POINT_CASES, POINT_CLAIM_IDS, POINT_CLAIMS, along_symmetry, off_generic, weakest_point
from .readings import (
    BIAS_CASES,
    BIAS_FLOOR,
    BIAS_PRECISIONS,
    bias_scale,
    key_bias_ratio,
    mean_imbalance,
    query_bias_margin,
    rebalance_loss_change,
)
from .registry import CLAIM_IDS, CLAIMS, SWEEP
from .verdicts import (
    evaluate_claim,
    evaluate_claims,
    evaluate_point_claims,
    missing_named_seeds,
    resolve_cases,
    verdict_of,
)

__all__ = [
    "BIAS_CASES",
    "BIAS_FLOOR",
    "BIAS_PRECISIONS",
    "CLAIMS",
    "CLAIM_IDS",
    "KINDS",
    "LAW_CUT",
    "LAW_TOLERANCE",
    "MATCHED_LOSS",
    "MATCHED_SUFFIX",
    "MIN_SEEDS",
    "POINT_CASES",
    "POINT_CLAIMS",
    "POINT_CLAIM_IDS",
    "READ_TOLERANCE",
    "SWEEP",
    "Claim",
    "Reading",
    "Undecidable",
    "WdLaw",
    "along_symmetry",
    "at_matched_loss",
    "band_sides",
    "bias_scale",
    "evaluate_claim",
    "evaluate_claims",
    "evaluate_point_claims",
    "evaluation_reading",
    "held_out_coverage",
    "key_bias_ratio",
    "law_cut_changes",
    "law_remainder",
    "law_residual",
    "law_tested",
    "law_values",
    "law_verdict",
    "matched_loss",
    "matched_loss_twin",
    "mean_imbalance",
    "missing_named_seeds",
    "need",
    "off_generic",
    "prediction_error",
    "query_bias_margin",
    "reading_at",
    "readings",
    "rebalance_loss_change",
    "resolve_cases",
    "seed_side",
    "up_to_loss",
    "val_loss_estimate",
    "verdict_of",
    "wd_beta_law",
    "weakest_point",
    "within_band",
]
