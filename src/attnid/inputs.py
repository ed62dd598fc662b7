"""What a user hands attnid, checked before it is used: layer numbers, and strings from a user's file shown safely.

Every check raises ``ValueError`` naming the argument and the range it must lie in (the command line prints it in
one line and exits 2).
"""

from __future__ import annotations


def check_layers(layers: list[int] | None, n_layer: int) -> list[int]:
    """The layers a reader chose, numbered from 1 as every table, row and flag numbers them (``None``: all of
    them); ``ValueError`` naming the range for anything else."""
    chosen = list(range(1, n_layer + 1)) if layers is None else list(layers)
    bad = [k for k in chosen if not (isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= n_layer)]
    if bad or not chosen:
        raise ValueError(f"layer must be an integer from 1 to {n_layer}, got {bad or chosen}")
    return chosen


def printable(text: object, limit: int = 120) -> str:
    """``text`` as a reader's terminal may show it: control characters (escape sequences) escaped as ``repr``
    does, and cut to ``limit`` characters with the length said."""
    s = str(text)
    cut = s[:limit]
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return shown + (f"... ({len(s):,} characters)" if len(s) > limit else "")


def check_sizes(**sizes: object) -> None:
    """Refuse, naming it, a size that is not an integer ≥ 1 (a bool is not a size)."""
    for name, v in sizes.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
