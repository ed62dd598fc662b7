"""The architecture of one attention layer, as plain data (:class:`AttentionConfig`, the paper's E, H, G, D, C and
its options), checked on construction. It needs only the standard library: the closed-form counts, the presets and
a config file's reading use it without torch (:mod:`attnid.attention` holds the layer itself)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

BIAS_LETTERS = "qkvo"
PARAM_ORDER = ("W_Q", "b_Q", "W_K", "b_K", "g_Q", "g_K", "W_V", "b_V", "W_G", "b_G", "W_O", "b_O", "sink")
# no QK-norm; RMSNorm over each head with one shared weight (Qwen3, Gemma 3); RMSNorm over the projection (OLMo 2);
# RMSNorm over each head without a weight, the "L2 norm" (Llama 4); LayerNorm over each head without a shift, a weight
# per head (StableLM 2, Command R+)
QK_NORMS = ("", "head", "proj", "l2", "layer", "head_rope")
QK_NORM_WEIGHTED = ("head", "proj", "layer", "head_rope")  # the norms with a weight (parameters g_Q, g_K)
QK_NORM_NAMES = {"": "no QK-norm", "head": "an RMSNorm per head (one shared weight)",
                 "proj": "an RMSNorm over the projection", "l2": "an RMSNorm per head without a weight (L2)",
                 "layer": "a LayerNorm per head without a shift",
                 "head_rope": "an RMSNorm per head after RoPE (one shared weight)"}  # fmt: skip


def parse_bias(spec: str | None) -> str:
    """``"all"`` -> ``"qkvo"``; ``"none"``/``""`` -> ``""``; ``"q,k"`` or ``"qk"`` -> ``"qk"``."""
    if spec is None:
        return ""
    if not isinstance(spec, str):
        raise TypeError(f"bias: expected a string such as 'none', 'all' or 'q,k,v', got {spec!r}")
    s = spec.strip().lower()
    if s in ("", "none"):
        return ""
    if s == "all":
        return BIAS_LETTERS
    letters = s.replace(",", "").replace(" ", "")
    bad = sorted(set(letters) - set(BIAS_LETTERS))
    if bad:
        raise ValueError(f"bias: unknown letter(s) {','.join(bad)!r}; use 'none', 'all' or letters from q,k,v,o")
    return "".join(c for c in BIAS_LETTERS if c in letters)


@dataclass(frozen=True)
class AttentionConfig:
    """Architecture of one attention layer.

    ``embed`` E, ``heads`` H, ``groups`` G (key/value groups, default H), ``head_dim`` D
    (query/key, default E/H), ``value_dim`` C (default D), ``bias`` letters from ``"qkvo"``.
    ``rope``: rotary position embeddings on all ``D`` query/key dimensions, or, with ``rope_dims`` R
    (even, ``0 < R <= D``; it implies ``rope``), on the first R of them only (partial RoPE, as in
    GPT-NeoX, Pythia and Phi). ``qk_norm``: an RMSNorm on queries and on keys before RoPE and the product,
    over each head's ``D`` coordinates with one weight ``g_Q``/``g_K`` of size ``D`` shared by all heads
    (``"head"``, Qwen3, Gemma 3), or over the whole projection with a weight per coordinate (``"proj"``,
    OLMo 2: ``g_Q`` ``(H, D)``, ``g_K`` ``(G, D)``), over each head without a weight (``"l2"``, Llama 4: it commutes
    with RoPE, so before or after the rotation is one function), or a LayerNorm over each head without a shift and
    with a weight per head (``"layer"``, StableLM 2, Command R+: ``g_Q`` ``(H, D)``, ``g_K`` ``(G, D)``), or
    ``"head"``'s norm after RoPE instead of before (``"head_rope"``, Hunyuan-A13B); ``qk_norm_eps`` its ε (0: the
    exact symmetric point).
    ``logit_softcap`` c: scores capped to ``c tanh(a / c)`` before the softmax (Gemma 2). ``sinks``: one learned
    logit ``s_h`` per head in every softmax's denominator, attended to by no value (gpt-oss: the weights of a
    query sum to ``1 − π_h < 1``; parameter ``sink`` ``(H,)``). ``output_gate``: each head's mixture multiplied,
    channel by channel, by ``σ(W_G^h x + b_G^h)`` of its query's input before ``W_O`` (Qwen3-Next's gated attention;
    ``W_G`` ``(H, C, E)``, ``b_G`` ``(H, C)`` when there is a query bias, as the gate comes out of the query map).
    """

    embed: int
    heads: int
    groups: int | None = None
    head_dim: int | None = None
    value_dim: int | None = None
    bias: str = ""
    rope: bool = False
    causal: bool = False
    rope_base: float = 10000.0
    rope_dims: int | None = None
    qk_norm: str = ""
    qk_norm_eps: float = 0.0
    logit_softcap: float | None = None
    sinks: bool = False
    output_gate: bool = False

    def __post_init__(self) -> None:  # noqa: C901 (reason in the docstring)
        """Refuse a field of the wrong type or range in one line naming it.

        Complex because each field is one check, read top to bottom.
        """

        def positive_int(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v > 0

        for name in ("embed", "heads"):
            v = getattr(self, name)
            if not positive_int(v):
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("groups", "head_dim", "value_dim"):
            v = getattr(self, name)
            if v is not None and not positive_int(v):
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("rope", "causal", "sinks", "output_gate"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        base = self.rope_base
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 0:
            raise ValueError(f"rope_base must be a positive finite number, got {base!r}")
        if self.head_dim is None:
            if self.embed % self.heads:
                raise ValueError(f"heads must divide embed when head_dim is not given (E={self.embed}, H={self.heads})")
            object.__setattr__(self, "head_dim", self.embed // self.heads)
        if self.value_dim is None:
            object.__setattr__(self, "value_dim", self.head_dim)
        if self.groups is None:
            object.__setattr__(self, "groups", self.heads)
        if self.heads % self.G:
            raise ValueError(f"groups must divide heads (H={self.heads}, G={self.groups})")
        if self.rope_dims is not None:
            R = self.rope_dims
            if not isinstance(R, int) or isinstance(R, bool) or R <= 0 or R % 2 or R > self.D:
                raise ValueError(f"rope_dims must be an even integer in (0, head_dim={self.D}], got {R!r}")
            object.__setattr__(self, "rope", True)
            if R == self.D:  # full RoPE has one form: rope=True, rope_dims=None
                object.__setattr__(self, "rope_dims", None)
        if self.rope and self.D % 2:
            raise ValueError(f"head_dim must be even with RoPE (D={self.head_dim})")
        if self.rope and base == 1 and self.R > 2:  # every frequency base^(-2i/D) is 1: the commutant grows
            raise ValueError("rope_base must not be 1 with RoPE (all pairs would share one frequency)")
        object.__setattr__(self, "bias", parse_bias(self.bias))
        if self.qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm: expected one of {', '.join(repr(q) for q in QK_NORMS)}, got {self.qk_norm!r}")
        eps = self.qk_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < 1:
            raise ValueError(f"qk_norm_eps must be a number in [0, 1), got {eps!r}")
        cap = self.logit_softcap
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < math.inf):
            raise ValueError(f"logit_softcap must be a positive finite number or None, got {cap!r}")

    # short names as in the paper
    E = property(lambda self: self.embed)
    H = property(lambda self: self.heads)
    G = property(lambda self: self.groups)
    D = property(lambda self: self.head_dim)
    C = property(lambda self: self.value_dim)
    R = property(lambda self: (self.rope_dims or self.head_dim) if self.rope else 0)  # rotated dims per head

    def with_(self, **changes) -> AttentionConfig:
        """A copy with ``changes``; ``rope=False`` also drops ``rope_dims``."""
        if changes.get("rope") is False:
            changes.setdefault("rope_dims", None)
        return replace(self, **changes)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of every parameter of this architecture, in ``PARAM_ORDER``."""
        E, H, G, D, C = self.E, self.H, self.G, self.D, self.C
        full = {
            "W_Q": (H, D, E),
            "b_Q": (H, D),
            "W_K": (G, D, E),
            "b_K": (G, D),
            "g_Q": (D,) if self.qk_norm in ("head", "head_rope") else (H, D),
            "g_K": (D,) if self.qk_norm in ("head", "head_rope") else (G, D),
            "W_V": (G, C, E),
            "b_V": (G, C),
            "W_G": (H, C, E),
            "b_G": (H, C),
            "W_O": (H, E, C),
            "b_O": (E,),
            "sink": (H,),
        }
        keep = {"b_Q": "q", "b_K": "k", "b_V": "v", "b_O": "o", "b_G": "q"}
        return {
            k: s
            for k, s in full.items()
            if (k not in keep or keep[k] in self.bias)
            and (self.qk_norm in QK_NORM_WEIGHTED or k not in ("g_Q", "g_K"))
            and (self.sinks or k != "sink")
            and (self.output_gate or k not in ("W_G", "b_G"))
        }
