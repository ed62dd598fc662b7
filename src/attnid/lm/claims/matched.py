"""Optimizers compared at the same loss (:mod:`attnid.lm.claims`): the claims that compare optimizers read a second
time where each run first reaches the best validation loss all of them reach (:func:`matched_loss_twin`), since at
the same step a run that learns faster is at a later stage of training."""

from __future__ import annotations

import dataclasses

from ..analysis import (
    Cases,
    best_val_loss,
)
from ..metrics import Key
from ..records import Record
from .claim import Claim, Undecidable

# the claims that compare optimizers, read a second time where each run first reaches the same validation loss: at
# the same step, a run that learns faster is at a later stage of training than the run it is compared with
MATCHED_LOSS = ("adamw_closest", "adamw_changes_beta", "adamw_spreads_tau")


MATCHED_SUFFIX = "_at_loss"


def matched_loss(recs: list[Record]) -> float:
    """The best validation loss that every run of ``recs`` reaches: the largest of their best losses."""
    return max(best_val_loss(r) for r in recs)


def up_to_loss(rec: Record, target: float) -> Record:
    """``rec`` cut after the first evaluation whose validation loss is at or below ``target`` (float32 rounding
    of the records allowed): the run as it stood when it first reached that loss."""
    for i, row in enumerate(rec.rows):
        v = row.get(Key.VAL_LOSS)
        if v is not None and v <= target * (1 + 1e-6):
            config = {**rec.config, "read_to_step": row[Key.STEP]}
            return Record(rec.path, config, rec.summary, rec.rows[: i + 1], rec.heads)
    raise Undecidable(f"{rec.name} never reaches a validation loss of {target:.4g}")


def at_matched_loss(c: Cases, cases: tuple[str, ...]) -> Cases:
    """``c`` with each of ``cases`` cut where it first reaches :func:`matched_loss` of them."""
    target = matched_loss([c[k] for k in cases])
    return {**c, **{k: up_to_loss(c[k], target) for k in cases}}


def _matched_setting(c: Cases, cases: tuple[str, ...]) -> str:
    target = matched_loss([c[k] for k in cases])
    steps = ", ".join(f"{k} at step {up_to_loss(c[k], target).rows[-1][Key.STEP]}" for k in cases)
    return f"read where each run first reaches a validation loss of {target:.3f} nats/char ({steps})"


def matched_loss_twin(claim: Claim) -> Claim:
    """``claim`` read where each of its runs first reaches the best validation loss that all of them reach, instead
    of at the same (last) step: the same test on the runs cut there (:func:`at_matched_loss`)."""
    cases = claim.cases

    def value(c: Cases) -> float:
        return claim.value(at_matched_loss(c, cases))

    control = None if claim.control is None else (lambda c: claim.control(at_matched_loss(c, cases)))  # type: ignore[misc]
    return dataclasses.replace(
        claim,
        id=claim.id + MATCHED_SUFFIX,
        claim=claim.claim + " (the runs compared at the same validation loss)",
        metric=claim.metric + ", each run read where it first reaches the best validation loss all of them reach",
        value=value,
        control=control,
        setting=lambda c: _matched_setting(c, cases),
        why=claim.why + "; compared at the same loss, not the same step, so that a run that learns faster is not "
        "read at a later stage of training",
    )
