"""Closed-form parameter and identification counts for one attention layer (paper §4; chapters 2–5).

Per key/value group (``n = H/G`` query heads share one key and one value map):

* QK block, no RoPE: the scores depend on ``W_K^gᵀ [W_Q^h | b_Q^h]`` only. With
  ``r = min(D, E)`` and ``q = E + 1`` if there is a query bias (else ``E``), the map from
  ``n D q + D E`` parameters to ``n`` such products has image dimension ``r (n q + E − r)``:
  ``D²`` unidentified per group when ``D ≤ E`` (the ``S / S⁻ᵀ`` invariance).
* QK block with RoPE (``D ≤ E``): only the commutant of the rotations survives: ``D`` per group
  (one ``[[a, −b], [b, a]]`` block per frequency), and it acts on ``[W_K | b_K]`` too. With partial
  RoPE on ``R < D`` dimensions: ``R`` for the rotated part plus the no-RoPE fibre of the other
  ``D − R`` dimensions (``(D − R)²`` when ``D − R ≤ E``); no symmetry couples the two parts.
* Key bias without RoPE: ``b_Kᵀ q`` is constant over keys, so all ``G D`` key-bias entries are
  unidentified. With RoPE the key bias is identified (``b_Kᵀ R_{n−m} q`` varies with the key); with
  partial RoPE its ``D − R`` unrotated coordinates are not (``G (D − R)``).
* VO block: ``W_O^h [W_V^g]`` products, ``r = min(C, E)``: ``n E C + C E − r (n E + E − r)``
  per group, ``C²`` when ``C ≤ E``.
* Value bias: ``Σ_h W_O^h b_V^g`` is a constant output; with an output bias it is absorbed
  (``G C`` unidentified), without one ``max(0, G C − E)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .attention import AttentionConfig

BLOCKS = ("qk", "vo", "key_bias", "value_bias")


@dataclass(frozen=True)
class Count:
    total_params: int
    params_by_block: dict[str, int]
    unidentified_by_block: dict[str, int]

    @property
    def unidentified(self) -> int:
        return sum(self.unidentified_by_block.values())

    @property
    def identified(self) -> int:
        return self.total_params - self.unidentified

    @property
    def identified_fraction(self) -> float:
        return self.identified / self.total_params

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(
            unidentified=self.unidentified, identified=self.identified, identified_fraction=self.identified_fraction
        )
        return d


def param_counts(cfg: AttentionConfig) -> dict[str, int]:
    """Number of entries of every parameter tensor."""
    out = {}
    for name, shape in cfg.shapes().items():
        k = 1
        for s in shape:
            k *= s
        out[name] = k
    return out


def total_params(cfg: AttentionConfig) -> int:
    return sum(param_counts(cfg).values())


def _product_fiber(n: int, inner: int, left: int, right: int) -> int:
    """Dimension of the fibre of ``(A_1..A_n, B) -> (Bᵀ A_h)_h`` at a generic point, where
    ``A_h`` is ``inner x left``, ``B`` is ``inner x right`` and ``left >= right``.

    With ``r = min(inner, right)`` the image has dimension ``r (n left + right − r)``, so the
    fibre is ``inner²`` when ``inner <= right`` and ``n inner left + inner right − n right left``
    otherwise.
    """
    r = min(inner, right)
    return n * inner * left + inner * right - r * (n * left + right - r)


def count(cfg: AttentionConfig) -> Count:
    """Unidentified dimensions by block for the architecture ``cfg``."""
    if not isinstance(cfg, AttentionConfig):
        raise TypeError(f"cfg: expected an AttentionConfig, got {type(cfg).__name__}")
    E, H, G, D, C = cfg.E, cfg.H, cfg.G, cfg.D, cfg.C
    n = H // G
    pc = param_counts(cfg)
    if cfg.rope and D > E:
        raise ValueError(f"head_dim: counting with RoPE assumes D <= E (D={D}, E={E})")
    q_cols = E + (1 if "q" in cfg.bias else 0)
    R = cfg.R  # rotated dimensions (0 without RoPE)
    qk = G * (R + (_product_fiber(n, D - R, q_cols, E) if D > R else 0))
    vo = G * _product_fiber(n, C, E, E)
    key_bias = G * (D - R) if "k" in cfg.bias else 0
    if "v" not in cfg.bias:
        value_bias = 0
    elif "o" in cfg.bias:
        value_bias = G * C
    else:
        value_bias = max(0, G * C - E)
    params_by_block = {
        "qk": pc["W_Q"] + pc["W_K"] + pc.get("b_Q", 0),
        "vo": pc["W_V"] + pc["W_O"],
        "key_bias": pc.get("b_K", 0),
        "value_bias": pc.get("b_V", 0) + pc.get("b_O", 0),
    }
    return Count(
        total_params(cfg), params_by_block, {"qk": qk, "vo": vo, "key_bias": key_bias, "value_bias": value_bias}
    )


# ------------------------------------------------------------- textbook formulas
def single_head_params(E: int, D: int) -> int:
    """Weights of one head with ``W_Q, W_K ∈ R^{D×E}`` and a square ``W_V ∈ R^{E×E}``: ``2DE + E²``."""
    return 2 * D * E + E * E


def multi_head_params(E: int, H: int, D: int, C: int) -> int:
    """Weights of ``H`` heads with ``W_O``: ``2HE(D + C)`` (``4E²`` when ``D = C = E/H``)."""
    return 2 * H * E * (D + C)


def qk_identified_fraction(E: int, D: int) -> float:
    """Identified share of one head's QK weights: ``1 − D/(2E)``."""
    return 1.0 - D / (2.0 * E)


def orthonormal_qk_dof(E: int, D: int) -> int:
    """Degrees of freedom of the QK block with orthonormal factors (paper §4.3; chapter 2): ``2DE − D²``."""
    return 2 * D * E - D * D


# ------------------------------------------------------------- §4.10: equivalent single head
@dataclass(frozen=True)
class Convention:
    """How one head of width ``E'`` is counted: its weights and identified weights, in units of ``E'²``."""

    description: str
    total: float
    identified: float


CONVENTIONS: dict[str, Convention] = {
    "qk_square_v": Convention(
        "single head: Q, K (D = E') and a square V, no output map; only the QK block is unidentified (E'² of 3E'²)",
        total=3.0,
        identified=2.0,
    ),
    "full_head": Convention(
        "single head with Q, K, V, O all E' x E'; QK and VO each lose E'² (2E'² of 4E'²)", total=4.0, identified=2.0
    ),
    "half_of_all": Convention(
        "single head Q, K, square V, counting half of all 3E'² weights as unidentified (the paper's 60%)",
        total=3.0,
        identified=1.5,
    ),
}


def _convention(name: str) -> Convention:
    if name not in CONVENTIONS:
        raise ValueError(f"convention: expected one of {', '.join(CONVENTIONS)}, got {name!r}")
    return CONVENTIONS[name]


def equivalent_single_head_width(H: int, convention: str = "qk_square_v") -> float:
    """``E'/E`` for a single head whose identified-parameter count equals that of an ``H``-head
    layer of width ``E`` (``D = C = E/H``; identified ``4E²(1 − 1/(2H))``)."""
    target = 4.0 * (1.0 - 1.0 / (2.0 * H))  # identified weights of the multi-head layer / E²
    return (target / _convention(convention).identified) ** 0.5


def single_head_total_over_multi(H: int, convention: str = "qk_square_v") -> float:
    """Total weights of the equivalent single head over the multi-head layer's ``4E²``."""
    r = equivalent_single_head_width(H, convention)
    return _convention(convention).total * r * r / 4.0
