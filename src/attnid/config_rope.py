"""A config's RoPE fields checked as transformers uses them (:mod:`attnid.configs` reads the rest): the variants
whose frequencies stay distinct, LongRoPE's factor lists, the share of each head that rotates, and a rotary share that
a full-RoPE family's code does not read."""

from __future__ import annotations

import itertools
import math

from .config_fields import DISTINCT_FREQUENCY_ROPE, ConfigError
from .families import HF_TYPES
from .inputs import printable
from .library_configs import supported_version

LAYER_TYPES = ("full_attention", "sliding_attention")  # Gemma 3's rope_parameters, one entry per layer type


def rope_of(c, partial: bool) -> tuple[float, float]:
    """``(base, rotated share)`` of a config's RoPE (full-attention layers' for Gemma 3); refuses a variant whose
    frequencies could coincide, in every layer type's RoPE (Gemma 3's sliding layers have their own base): a type
    not modelled, a factor that is not positive, a base of 1 (every pair at one frequency) or not positive."""
    rp = c.rope_parameters or {}
    per_type = {t: rp[t] for t in LAYER_TYPES if isinstance(rp.get(t), dict)} or {"": rp}
    for layer_type, params in per_type.items():
        where = f"rope_parameters[{layer_type!r}]" if layer_type else "rope_parameters"
        kind = params.get("rope_type", "default")
        if kind == "longrope":
            check_longrope(params, where, c, partial)
        elif kind not in DISTINCT_FREQUENCY_ROPE:
            raise ConfigError(f"{where}: rope_type {printable(repr(kind))} is not modelled (attnid counts RoPE "
                              f"whose frequencies stay distinct: {', '.join(DISTINCT_FREQUENCY_ROPE)})")  # fmt: skip
        factor = params.get("factor")
        if kind != "default" and factor is not None and not (isinstance(factor, (int, float)) and factor > 0):
            raise ConfigError(f"{where}: factor {printable(repr(factor))} of {kind} RoPE must be positive (it "
                              "divides the frequencies)")  # fmt: skip
        theta = params.get("rope_theta", 10000.0)
        if not (isinstance(theta, (int, float)) and math.isfinite(theta) and theta > 0 and theta != 1):
            raise ConfigError(f"{where}: rope_theta {printable(repr(theta))} must be a positive number other than 1 "
                              "(at 1 every pair rotates at one frequency: more are unidentified)")  # fmt: skip
    for layer_type, params in per_type.items():
        check_rotary_share(params, partial, layer_type)
    main = per_type.get("full_attention", per_type.get("", {}))
    share = main.get("partial_rotary_factor", 1.0) if partial else 1.0
    return float(main.get("rope_theta", 10000.0)), float(share)


def check_rotary_share(params: dict, partial: bool, layer_type: str) -> None:
    """``partial_rotary_factor``, which transformers' rotary initialisers read for every family: a number in (0, 1]
    (``int(D * share)`` dimensions rotate). A family whose attention rotates every dimension of a head (``partial``
    false) ignores it with the default RoPE (its own initialiser rotates all of them), and cannot run with a scaled
    RoPE below 1 (its frequencies then cover part of a head, which the attention multiplies whole): refused."""
    where = f"rope_parameters[{layer_type!r}]" if layer_type else "rope_parameters"
    share = params.get("partial_rotary_factor")
    if share is None:
        return
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not (math.isfinite(share) and 0 < share <= 1):
        raise ConfigError(f"partial_rotary_factor: {printable(repr(share))} must be a number in (0, 1] (the share of "
                          "each head's dimensions that rotate)")  # fmt: skip
    kind = params.get("rope_type", "default")
    if not partial and share < 1 and kind != "default":
        raise ConfigError(f"partial_rotary_factor: {share!r} with {kind} RoPE ({where}): this family's attention "
                          f"rotates every dimension of a head while transformers {supported_version()}'s {kind} "
                          "initialiser gives frequencies for part of it; the model does not run, and attnid refuses "
                          "to count it")  # fmt: skip


def check_longrope(params: dict, where: str, c, partial: bool) -> None:
    """LongRoPE (Phi-3, Phi-4-mini) divides pair ``i``'s frequency ``base^(-2i/R)`` by a factor of its own, one list
    for short inputs and one for long: the count of plain RoPE holds while every list is ``R/2`` positive factors
    that keep the frequencies distinct. Refused otherwise, naming the list (two equal frequencies give a larger
    commutant)."""
    D = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    R = int(D * (params.get("partial_rotary_factor", 1.0) if partial else 1.0))
    theta = params.get("rope_theta", 10000.0)
    for key in ("short_factor", "long_factor"):
        f = params.get(key)
        if not (isinstance(f, list) and len(f) == R // 2 and all(positive_number(x) for x in f)):
            raise ConfigError(f"{where}: {key} of longrope RoPE must be {R // 2} positive numbers (one a rotated pair)")
        periods = sorted(x * float(theta) ** (2 * i / R) for i, x in enumerate(f))  # 1 / frequency, pair by pair
        if any(b - a <= 1e-9 * b for a, b in itertools.pairwise(periods)):
            raise ConfigError(
                f"{where}: {key} of longrope RoPE makes two pairs rotate at one frequency (their commutant is larger: "
                "more are unidentified); attnid counts distinct frequencies"
            )


def positive_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def unread_rotary_share(reading: dict, hf_type: str) -> None:
    """A full-RoPE family's ``partial_rotary_factor`` (accepted by :func:`_check_rotary_share` with the default RoPE)
    moved from the fields read to the neutral ones, with its reason."""
    t = HF_TYPES.get(hf_type)
    if t is not None and t.rotary and not t.partial_rope and "partial_rotary_factor" in reading["read"]:
        reading["read"].remove("partial_rotary_factor")
        reading["neutral"]["partial_rotary_factor"] = (
            f"not read by {hf_type}'s default RoPE, which rotates every "
            "dimension of a head (its attention multiplies it whole)"
        )
