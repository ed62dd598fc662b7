"""A claim of §5 as data (:class:`Claim`), its kinds (:data:`KINDS`: a theorem check or a statistic of training),
the error of a number the records cannot give (:class:`Undecidable`), and the side its seeds lie on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..analysis import (
    Cases,
    values,
)
from ..metrics import Key
from ..records import Record

MIN_SEEDS = 3  # seeds a statistic of training needs before it is decided
AGGREGATES: dict[str, Callable[[list[float]], float]] = {  # a row's value over its seeds
    "mean": lambda v: float(np.mean(v)),
    "max": lambda v: float(np.max(v)),
}
KINDS = {"theorem": 1, "training": MIN_SEEDS}  # a claim's kind -> the seeds it needs


class Undecidable(ValueError):
    """A claim's value cannot be computed from these records for a stated reason (the row reads
    ``inconclusive`` and gives it)."""


def need(rec: Record, key: Key) -> np.ndarray:
    """``values(rec, key)``; raises ``KeyError`` naming ``key`` when no row of the record holds it."""
    v = values(rec, key)
    if not len(v):
        raise KeyError(str(key))
    return v


@dataclass(frozen=True)
class Claim:
    """One reading of the paper's §5 and how it is tested.

    ``value`` computes the tested number from one seed's records (``cases``); the claim holds for that seed
    when ``value op threshold``. ``values``, where given, computes every seed's number at once instead (a claim
    whose test reads all seeds, such as the law's tested layers). ``control`` is the number it is compared against
    (same seed), in words in ``control_text``. ``kind`` is ``"theorem"`` (a check of an exact property: one seed
    decides) or ``"training"`` (a statistic of training: :data:`MIN_SEEDS` seeds); a verdict also needs models
    of ``min_layers`` layers. ``setting`` says what the verdict depends on, computed from the first seed's records
    (``setting_of_seeds``, where given: from every seed's); ``rho`` names the ρ measure the value uses;
    ``detail`` adds keys to the row from every seed's records. ``stand_in`` maps a case to the one whose records
    stand in for it at profiles whose suite does not run it (``sgd_deep`` at paper scale, where ``sgd`` has 6
    layers). ``stated_by`` says whose claim it is (the paper's, or a chapter's own), in the side the seeds lie on.
    ``against``, for a claim tested against a null (a p-value), is the same test of the opposite claim: a seed counts
    against the claim only when that test rejects the null (``against(c) op threshold``), and a seed that rejects
    it neither way is no evidence either way (failing to reject is not a refutation). ``aggregate`` is the row's
    value over the seeds: ``"mean"``, or ``"max"`` (the weakest seed of a test every seed must pass). ``undecided``
    reads a decided row (``yes``/``no``, with its detail) and gives the reason it is not decided after all, or ''
    (the matched-loss readings: a side that changes with the reading method).
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
    kind: str = "training"
    min_layers: int = 1
    setting: Callable[[Cases], str] | None = None
    rho: Callable[[Cases], str] | None = None
    detail: Callable[[list[Cases]], dict] | None = None
    stand_in: tuple[tuple[str, str], ...] = ()
    values: Callable[[list[Cases]], list[float]] | None = None
    suite: str = "dynamics"  # the suite whose records it reads
    stated_by: str = "the paper"  # whose claim it is: the seeds lie "with" or "against" it
    setting_of_seeds: Callable[[list[Cases]], str] | None = None  # the setting from every seed's records
    against: Callable[[Cases], float] | None = None  # the opposite claim's test, where a null is tested
    aggregate: str = "mean"
    undecided: Callable[[dict], str] | None = None  # a decided row's reason its records do not decide it after all

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"aggregate: expected one of {', '.join(AGGREGATES)}, got {self.aggregate!r}")

    @property
    def min_seeds(self) -> int:
        """Seeds a verdict needs: one for a theorem check, :data:`MIN_SEEDS` for a statistic of training."""
        return KINDS[self.kind]

    def holds(self, v: float) -> bool:
        return v < self.threshold if self.op == "<" else v > self.threshold


NO_EVIDENCE = "no evidence"  # the side of seeds whose test rejects its null neither way


def seed_side(holds: list[bool], stated_by: str = "the paper", refuted: list[bool] | None = None) -> str:
    """On which side of the threshold the seeds lie: ``"with the paper"``, ``"against the paper"`` (or with and
    against whoever ``stated_by`` names) or ``"split"``. With ``refuted`` (a claim tested against a null, where
    a seed is against it only when the opposite test rejects): :data:`NO_EVIDENCE` when no seed rejects either
    way, ``"split"`` when the seeds that do disagree or some do not."""
    if all(holds):
        return f"with {stated_by}"
    if refuted is None:
        return f"against {stated_by}" if not any(holds) else "split"
    if all(refuted):
        return f"against {stated_by}"
    return NO_EVIDENCE if not any(holds) and not any(refuted) else "split"
