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
* QK block with QK-norm (``qk_norm``; Qwen3, Gemma 3, OLMo 2; book chapter 9): an RMSNorm in front of the
  product commutes only with a scale and with orthogonal maps, and with generic norm weights no orthogonal
  map keeps every score. What survives: each normalised projection's scale (``H + G`` for a norm per head,
  2 for a norm over the whole projection; exact at ``ε = 0``; for ``ε > 0`` not a symmetry, only a
  near-null direction, and not counted), and the
  trade of the query-norm weight against the key-norm weight: a factor per rotated pair and per unrotated
  coordinate, ``R/2 + (D − R)``, once for weights shared by all heads (after RoPE, Hunyuan-A13B's
  ``"head_rope"``: only the weights' product per coordinate reaches the scores, ``Rᵀ diag(w_Q w_K) R'``, so a trade
  per coordinate, ``D``), ``G`` times for per-coordinate
  weights (the key weight of a group is shared by its query heads). The key bias sits inside the norm:
  identified.
* QK-norm without a weight (``"l2"``, Llama 4's RoPE layers): a scale of each head's projection (``H + G`` at
  ``ε = 0``) and every orthogonal map that commutes with the rotations, applied to the queries and keys of a group:
  a rotation per rotated pair and ``O(D − R)`` on the unrotated coordinates, ``R/2 + (D − R)(D − R − 1)/2`` per
  group. The key bias sits inside the norm: identified.
* LayerNorm per head without a shift (``"layer"``, StableLM 2, Command R+): the centring removes each projection's
  component along the all-ones vector ``1`` of its head, so ``W ← W + 1 aᵀ`` (``E`` per query head and per key
  head) and ``b ← b + c 1`` (one per biased head; the key bias's in block ``key_bias``) change nothing; at ``ε = 0``
  a scale of each head's projection (``H + G``); and the trade of query-norm against key-norm weights per rotated
  pair and per unrotated coordinate, ``G (R/2 + D − R)`` (the weights are per head, a group's key weight shared by
  its query heads). Without RoPE one more per group when ``n = 1`` or ``D = 3``: a head's scores are bilinear forms
  ``n_qᵀ diag(g_Q ⊙ g_K) n_k`` on the centred hyperplanes (dimension ``D − 1``), kept by orthogonal maps of those
  hyperplanes that move the weight products at the same time; ``(n + 1)(D − 1)(D − 2)/2 + nD`` unknowns against
  ``n (D − 1)²`` conditions leave exactly one free direction in those two cases and none otherwise (for ``n = 1``:
  the ``D`` products fix only the ``D − 1`` singular values of the form). Orthogonal maps keep the norms: exact at
  every ``ε``.
* Logit soft-capping (Gemma 2): ``c tanh(a / c)`` is one-to-one, so every map that keeps the raw scores
  still keeps the capped ones (the QK block is unchanged), but a per-query shift of the raw scores is no
  longer a shift of the capped ones: the key bias is identified.
* Attention sinks (gpt-oss; book chapter 9): a learned logit ``s_h`` per head in the softmax's denominator that
  no value reads. A per-query shift of the scores now moves weight between the keys and the sink, so the key
  bias is identified (its unrotated coordinates too), and a query's weights sum to ``1 − π_h(q)``, which varies
  from query to query and head to head: ``Σ_h (1 − π_h) W_O^h b_V^g`` is no constant, and the value bias is
  identified with or without an output bias. The QK and VO gauges keep the scores and ``V P`` and are unchanged;
  each sink logit is identified.
* VO block: ``W_O^h [W_V^g]`` products, ``r = min(C, E)``: ``n E C + C E − r (n E + E − r)``
  per group, ``C²`` when ``C ≤ E``. With an output gate (Qwen3-Next: ``σ(W_G^h x + b_G^h) ⊙ Z_h`` before ``W_O^h``)
  a map ``S`` of the value channels survives only if ``S⁻¹ diag(σ) S = diag(σ)`` for every gate value: ``S``
  diagonal, ``C`` per group (``C ≤ E``). The gate's own weights are identified (σ is not homogeneous), and the value
  bias reaches the output as ``Σ_h W_O^h (σ_h ⊙ b_V^g)``, which varies with the query: identified.
* Value bias: ``Σ_h W_O^h b_V^g`` is a constant output; with an output bias it is absorbed
  (``G C`` unidentified), without one ``max(0, G C − E)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..attention_config import AttentionConfig

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
    """The parameters and unidentified directions of one attention layer ``cfg`` (paper §4), in total and by block:
    the query–key product, the value–output product, the key and value biases."""
    if not isinstance(cfg, AttentionConfig):
        raise TypeError(f"cfg: expected an AttentionConfig, got {type(cfg).__name__}")
    E, H, G, D, C = cfg.E, cfg.H, cfg.G, cfg.D, cfg.C
    n = H // G
    pc = param_counts(cfg)
    if cfg.rope and D > E:
        raise ValueError(f"head_dim: counting with RoPE assumes D <= E (D={D}, E={E})")
    q_cols = E + (1 if "q" in cfg.bias else 0)
    R = cfg.R  # rotated dimensions (0 without RoPE)
    qk = _qk_norm_fiber(cfg, q_cols) if cfg.qk_norm else G * (R + (_product_fiber(n, D - R, q_cols, E) if D > R else 0))
    if cfg.output_gate and C > E:
        raise ValueError(f"value_dim: counting with an output gate assumes C <= E (C={C}, E={E})")
    vo = G * C if cfg.output_gate else G * _product_fiber(n, C, E, E)
    shift_blind = not cfg.qk_norm and cfg.logit_softcap is None and not cfg.sinks  # the softmax ignores a shift
    key_bias = G * (D - R) if "k" in cfg.bias and shift_blind else 0
    if "k" in cfg.bias and cfg.qk_norm == "layer":  # the centring removes each key bias's component along 1
        key_bias = G
    if "v" not in cfg.bias or cfg.sinks or cfg.output_gate:  # b_V seen: the weights sum to 1 − π, or a gate varies
        value_bias = 0
    elif "o" in cfg.bias:
        value_bias = G * C
    else:
        value_bias = max(0, G * C - E)
    params_by_block = {
        "qk": pc["W_Q"] + pc["W_K"] + pc.get("b_Q", 0) + pc.get("g_Q", 0) + pc.get("g_K", 0) + pc.get("sink", 0),
        "vo": pc["W_V"] + pc["W_O"] + pc.get("W_G", 0) + pc.get("b_G", 0),
        "key_bias": pc.get("b_K", 0),
        "value_bias": pc.get("b_V", 0) + pc.get("b_O", 0),
    }
    return Count(
        total_params(cfg), params_by_block, {"qk": qk, "vo": vo, "key_bias": key_bias, "value_bias": value_bias}
    )


def _qk_norm_fiber(cfg: AttentionConfig, q_cols: int) -> int:
    """The QK block's unidentified dimensions under QK-norm (module docstring): scales at ``ε = 0`` (``ε > 0``: a
    near-null direction, not counted), orthogonal maps for a norm without a weight, weight trades for one with."""
    E, H, G, D, R = cfg.E, cfg.H, cfg.G, cfg.D, cfg.R
    if D > E:
        raise ValueError(f"head_dim: counting with QK-norm assumes D <= E (D={D}, E={E})")
    if cfg.qk_norm == "layer" and D < 3:  # a centred pair is ±(1, −1) up to scale: the norm keeps only a sign
        raise ValueError(f"head_dim: counting a LayerNorm per head assumes D >= 3 (D={D})")
    exact = cfg.qk_norm_eps == 0
    if cfg.qk_norm == "proj":
        return (2 if exact else 0) + G * (R // 2 + D - R)
    scales = H + G if exact else 0
    if cfg.qk_norm == "head":
        return scales + R // 2 + D - R
    if cfg.qk_norm == "head_rope":  # after RoPE only the weights' product per coordinate reaches the scores
        return scales + D
    if cfg.qk_norm == "l2":
        return scales + G * (R // 2 + (D - R) * (D - R - 1) // 2)
    centring = H * q_cols + G * E  # "layer": W + 1 aᵀ per head, b_Q + c 1 per query head
    n = H // G
    # without RoPE, orthogonal maps of the centred hyperplanes against the weight products: free unknowns beyond
    # the conditions (one exactly when n = 1 or D = 3, none otherwise)
    turn = max(0, (n + 1) * (D - 1) * (D - 2) // 2 + n * D - n * (D - 1) ** 2) if R == 0 else 0
    return centring + scales + G * (R // 2 + D - R + turn)


# ------------------------------------------------------------- multi-head latent attention (chapter 9)
@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2/V3): ``embed`` E and ``heads`` H; keys and values come from one
    latent of rank ``kv_rank`` (an RMSNorm on it), queries from a latent of rank ``q_rank`` (``None``: a plain
    projection, as DeepSeek-V2-Lite); per head ``nope_dim`` query/key dimensions without position and
    ``rope_dim`` with RoPE, whose key part is one projection shared by all heads, and ``v_dim`` value
    dimensions; ``norm_eps`` the latents' ε. No biases (DeepSeek's attention has none). ``index_heads`` and
    ``index_dim`` (both 0: none): DeepSeek-V3.2's sparse attention, whose indexer (queries of ``index_heads`` heads of
    ``index_dim`` from the query latent, one key of ``index_dim`` from the input through a LayerNorm, a weight per
    head) scores the keys only to choose which of them each query reads (its ``index_topk`` best)."""

    embed: int
    heads: int
    kv_rank: int
    q_rank: int | None
    nope_dim: int
    rope_dim: int
    v_dim: int
    norm_eps: float = 0.0
    index_heads: int = 0
    index_dim: int = 0

    def __post_init__(self) -> None:
        for name in ("embed", "heads", "kv_rank", "nope_dim", "rope_dim", "v_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        q = self.q_rank
        if q is not None and (not isinstance(q, int) or isinstance(q, bool) or q < 1):
            raise ValueError(f"q_rank must be a positive integer or None, got {q!r}")
        if self.rope_dim % 2:
            raise ValueError(f"rope_dim must be even (RoPE rotates pairs), got {self.rope_dim}")
        eps = self.norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < 1:
            raise ValueError(f"norm_eps must be a number in [0, 1), got {eps!r}")
        self._check_indexer()

    def _check_indexer(self) -> None:
        """Refuse an indexer without its sizes, without the query latent it reads, or narrower than RoPE's part."""
        ih, idim = self.index_heads, self.index_dim
        for name, v in (("index_heads", ih), ("index_dim", idim)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if bool(ih) != bool(idim):
            raise ValueError("index_heads, index_dim: an indexer has both (or neither, 0)")
        if ih and self.q_rank is None:
            raise ValueError("index_heads: the indexer reads the query latent (q_rank)")
        if ih and idim < self.rope_dim:
            raise ValueError(f"index_dim: {idim} < rope_dim {self.rope_dim} (the indexer rotates rope_dim of its dims)")

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The parameter tensors as transformers' ``DeepseekV3Attention`` holds them."""
        E, H, n, r, v = self.embed, self.heads, self.nope_dim, self.rope_dim, self.v_dim
        q = (
            {"q_proj": (H * (n + r), E)}
            if self.q_rank is None
            else {"q_a_proj": (self.q_rank, E), "q_a_layernorm": (self.q_rank,), "q_b_proj": (H * (n + r), self.q_rank)}
        )
        return {
            **q,
            "kv_a_proj_with_mqa": (self.kv_rank + r, E),
            "kv_a_layernorm": (self.kv_rank,),
            "kv_b_proj": (H * (n + v), self.kv_rank),
            "o_proj": (E, H * v),
            **self.indexer_shapes(),
        }

    def indexer_shapes(self) -> dict[str, tuple[int, ...]]:
        """DeepSeek-V3.2's indexer's tensors (none without one)."""
        if not self.index_heads:
            return {}
        ih, d, E = self.index_heads, self.index_dim, self.embed
        assert self.q_rank is not None
        return {"indexer.wq_b": (ih * d, self.q_rank), "indexer.wk": (d, E), "indexer.k_norm.weight": (d,),
                "indexer.k_norm.bias": (d,), "indexer.weights_proj": (ih, E)}  # fmt: skip


def _latent_group(rank: int, exact_scale: bool) -> int:
    """Maps of a normalised latent that its up-projection absorbs: ``diag(γ') O`` with ``O`` orthogonal
    (the norm commutes with ``O``, the up-projection undoes ``diag(γ') O diag(γ)⁻¹``), and at ``ε = 0`` the
    scale of its down-projection: ``r(r − 1)/2 + r (+ 1)``."""
    return rank * (rank - 1) // 2 + rank + (1 if exact_scale else 0)


def count_mla(cfg: MLAConfig) -> Count:
    """Unidentified dimensions of multi-head latent attention by term (chapter 9): per head ``GL(nope_dim)`` on
    the position-free query/key part and ``GL(v_dim)`` on values and outputs, as in the paper; the RoPE
    commutant of the shared rotary key (``rope_dim``, one key for all heads, as multi-query attention); and the
    maps of each latent (:func:`_latent_group`). Assumes the generic ranks this needs: ``nope_dim`` and
    ``v_dim`` at most the latents' ranks and ``E``, and each latent rank at most ``E`` and its up-projection's
    width (DeepSeek-V3 has them). With DeepSeek-V3.2's indexer, ``indexer``: every one of its parameters. Its scores
    reach the output only through the choice of keys (a top-k of them), which is the same near almost every point,
    so no small change of an indexer weight changes the output: the choice's parameters, like a choice bias of a
    mixture's router, are unidentified, and nothing else changes (the layer's other maps see a key mask)."""
    E, H, n, r, v = cfg.embed, cfg.heads, cfg.nope_dim, cfg.rope_dim, cfg.v_dim
    q_in = E if cfg.q_rank is None else cfg.q_rank
    limits = [
        ("nope_dim", n, "q_rank" if cfg.q_rank else "embed", q_in),
        ("nope_dim", n, "kv_rank", cfg.kv_rank),
        ("v_dim", v, "kv_rank", cfg.kv_rank),
        ("v_dim", v, "embed", E),
        ("kv_rank", cfg.kv_rank, "embed", E),
        ("kv_rank", cfg.kv_rank, "heads x (nope_dim + v_dim)", H * (n + v)),
    ]
    if cfg.q_rank is not None:
        limits += [
            ("q_rank", cfg.q_rank, "embed", E),
            ("q_rank", cfg.q_rank, "heads x (nope_dim + rope_dim)", H * (n + r)),
        ]
    problems = [f"{name} = {val} > {lim_name} = {lim}" for name, val, lim_name, lim in limits if val > lim]
    if problems:
        raise ValueError(f"mla: the closed form assumes generic ranks; here {', '.join(problems)}")
    exact = cfg.norm_eps == 0
    terms = {
        "qk_nope": H * n * n,
        "qk_rope": r,
        "vo": H * v * v,
        "q_latent": 0 if cfg.q_rank is None else _latent_group(cfg.q_rank, exact),
        "kv_latent": _latent_group(cfg.kv_rank, exact),
    }
    indexer = sum(math.prod(s) for s in cfg.indexer_shapes().values())
    if indexer:
        terms["indexer"] = indexer
    sizes = {k: math.prod(s) for k, s in cfg.shapes().items()}
    params = {
        "queries": sum(sizes.get(k, 0) for k in ("q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj")),
        "keys_values": sizes["kv_a_proj_with_mqa"] + sizes["kv_a_layernorm"] + sizes["kv_b_proj"],
        "output": sizes["o_proj"],
        **({"indexer": indexer} if indexer else {}),
    }
    return Count(sum(sizes.values()), params, terms)


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
