"""Chapter 8 (beyond one attention layer): the unidentified parameters of whole decoder layers and whole
models, from the closed forms of :mod:`attnid.counting` checked against the Jacobian rank of the real
``transformers`` modules (:mod:`attnid.hf`), and what float32 norms do to that check.

``small`` (the smoke profile) audits a subset of the shapes; every other profile audits them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..attention import AttentionConfig
from ..audit import audit_module, default_seq_len, tolerance_window
from ..counting import count_model, layer_gauge_dims
from ..hf import MIN_GAP, NEAR_NULL_BAND, audit_hf, build_block, build_model, equivalent_config, model_config
from ..hf import verify_presets as _verify_presets
from ..presets import PRESETS, preset_count, preset_rows
from . import with_formats

SMOKE_PRESETS = ["gpt2", "llama-2-70b", "pythia-6.9b"]  # RMSNorm + GQA, LayerNorm, parallel + partial RoPE


def _pct(v) -> str:
    return "–" if pd.isna(v) else f"{v:.3%}"


# ------------------------------------------------------------------------------ three scopes of the presets
def preset_table_rows(small: bool) -> tuple[pd.DataFrame, int]:
    """Every preset's counts at the three scopes (:func:`attnid.presets.preset_rows`) with its whole decoder
    layer verified on the real module (three structures when ``small``), and the number of distinct block
    audits this took. Raises if a verified block's Jacobian rank differs from its closed form."""
    verified = _verify_presets(SMOKE_PRESETS if small else None, scope="block")
    bad = [n for n, r in verified.items() if r is not None and r.unidentified != r.details["theory_unidentified"]]
    if bad:
        raise AssertionError(f"block audit differs from the closed form: {', '.join(bad)}")
    rows = pd.DataFrame(preset_rows(verified_block=verified))
    return rows, len({id(r) for r in verified.values() if r is not None})


def table_presets(rows: pd.DataFrame) -> pd.DataFrame:
    """The three scopes of each preset as the chapter shows them (shares in percent)."""
    shown = pd.DataFrame(
        {
            "model": rows["name"],
            "layers": rows["layers"].astype("Int64"),
            "attention": 1 - rows["identified_fraction"],
            "block": rows["block_unidentified_share"],
            "model ": rows["model_unidentified_share"],
            "params (model)": rows["model_params"].astype("Int64"),
            "unidentified (model)": rows["model_unidentified"].astype("Int64"),
            "verified": rows["verified_block"].map({True: "yes"}).fillna("–"),
        }
    )
    return with_formats(shown, **{c: _pct for c in ("attention", "block", "model ")})


def fig_three_scopes(rows: pd.DataFrame):
    """The unidentified share of each counted preset at the three scopes (log scale, percent)."""
    from ..plotting import dot_rows

    counted = rows[rows["model_unidentified"].notna()]
    shares = {
        "one attention layer": ("o", 100 * (1 - counted["identified_fraction"])),
        "one decoder layer": ("s", 100 * counted["block_unidentified_share"]),
        "whole model": ("D", 100 * counted["model_unidentified_share"]),
    }
    return dot_rows(
        counted["name"], shares, xlabel="unidentified share of the parameters (%, log scale)", title="Three scopes",
        height=4.2,
    )  # fmt: skip


def scopes_sentence(rows: pd.DataFrame) -> str:
    """How the share moves from attention to block (always down) and from block to model, per preset."""
    counted = rows[rows["model_unidentified"].notna()]
    if not (counted["block_unidentified_share"] < 1 - counted["identified_fraction"]).all():
        raise AssertionError("a block's unidentified share is not below its attention layer's")
    rises = counted["model_unidentified_share"] > counted["block_unidentified_share"]
    up, down = list(counted.loc[rises, "name"]), list(counted.loc[~rises, "name"])
    untied = {n for n in up if not getattr(PRESETS[n].model, "tied", True)}
    gpt2 = preset_count("gpt2", "block")
    mlp = gpt2.params_by_block["mlp"] / gpt2.total_params
    return (
        f"An attention layer is a small part of a decoder layer (in GPT-2 the MLP holds {mlp:.0%} of a layer's "
        "weights), so the share always drops from the attention column to the block column. From one decoder "
        f"layer to the whole model it rises for {', '.join(up)} and falls for {', '.join(down)}. {len(untied)} of "
        f"the {len(up)} that rise have an untied head, whose residual stream can be rotated (below): about $E^2/2$ "
        "directions that belong to no single layer. A tied head removes the rotations, and what is left of the "
        "model-wide terms is small beside the embedding's parameters."
    )


# ------------------------------------------------------------------------------ symmetries of a GPT-2 block
def gpt2_block_moves(seed: int = 0, embed: int = 8, heads: int = 2, ffn: int = 32) -> pd.DataFrame:
    """Largest output change of a tiny real GPT-2 block under two LayerNorm symmetries (an output-bias shift
    taken back by the MLP's bias; the q/k/v map's mean direction taken back by its bias) and under one move
    that is not a symmetry (``W_QKV + a 1ᵀ``). Raises unless the symmetries move it by at most 1e-12 and the
    other move by at least 1e-3."""
    import torch

    torch.manual_seed(seed)
    cfg = equivalent_config("gpt2", embed=embed, heads=heads)
    layer, forward = build_block("gpt2", cfg, ffn=ffn, seed=seed)
    x = torch.randn(3, 12, embed, dtype=torch.float64)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    with torch.no_grad():
        y0 = forward(layer, x)

        def moved() -> float:
            d = float((forward(layer, x) - y0).abs().max())
            layer.load_state_dict(state)
            return d

        checks = {}
        layer.attn.c_proj.bias += 0.7  # LayerNorm 2 removes the mean of h: b_O + t·1 against b_MLP − t·1
        layer.mlp.c_proj.bias -= 0.7
        checks["b_O + t·1, b_MLP − t·1"] = moved()
        g, b = layer.ln_1.weight, layer.ln_1.bias  # Conv1D weight, E × 3E
        a = torch.randn(3 * embed, dtype=torch.float64)
        layer.attn.c_attn.weight += torch.outer(1 / g, a)
        layer.attn.c_attn.bias -= a * (b / g).sum()
        checks["W_QKV + a (1/γ)ᵀ, b_QKV − a Σβ/γ"] = moved()
        layer.attn.c_attn.weight += torch.outer(torch.ones(embed, dtype=torch.float64), a)
        checks["W_QKV + a 1ᵀ (not a symmetry)"] = moved()
    moves = list(checks.values())
    if max(moves[:2]) > 1e-12 or moves[2] < 1e-3:
        raise AssertionError(f"the GPT-2 block's symmetries do not behave as derived: {checks}")
    out = pd.DataFrame({"change": list(checks), "max |Δy|": moves})
    return with_formats(out, **{"max |Δy|": "{:.1e}"})


# ------------------------------------------------------------------------------ audits of real modules
BLOCK_CASES: list[tuple[str, dict]] = [
    ("gpt2", dict(heads=2)),
    ("gpt2", dict(heads=1, ffn=12)),
    ("opt", dict(heads=2)),
    ("opt", dict(heads=2, bias="none")),
    ("llama", dict(heads=4, groups=2)),
    ("llama", dict(heads=2, bias="all", ffn=30)),
    ("mistral", dict(heads=4, groups=1)),
    ("qwen2", dict(heads=4, groups=2)),
    ("gpt_neox", dict(heads=1, rope_dims=4)),
    ("gpt_neox", dict(heads=2, bias="none")),
    ("phi", dict(heads=4, groups=2)),
    ("phi", dict(heads=1, rope_dims=6, ffn=20)),
]
MODEL_CASES: list[tuple[str, dict]] = [
    ("gpt2", dict()),
    ("gpt2", dict(tied=False)),
    ("opt", dict(seed=1)),
    ("llama", dict()),
    ("llama", dict(layers=2, tied=True)),
    ("mistral", dict(heads=4, groups=1)),
    ("qwen2", dict(heads=4, groups=2)),
    ("gpt_neox", dict(ffn=16)),
    ("phi", dict(ffn=16)),
]


def _checked(df: pd.DataFrame) -> pd.DataFrame:
    if not (df["closed form"] == df["Jacobian"]).all():
        raise AssertionError(f"an audit differs from its closed form:\n{df[df['closed form'] != df['Jacobian']]}")
    return with_formats(df, gap="{:.0e}")


def table_block_audits(cases: list[tuple[str, dict]], seed: int = 0) -> pd.DataFrame:
    """Each case's whole decoder layer at E = 8, audited (:func:`attnid.hf.audit_hf`, scope ``block``): its
    shape, the closed form's terms, the closed form, the Jacobian's count and the singular-value gap. Raises
    if a count differs from its closed form."""
    out = []
    for hf_type, kw in cases:
        r = audit_hf(hf_type, scope="block", embed=8, seed=seed, **kw)
        c = r.details["config"]
        out.append(
            {
                "type": hf_type,
                **{k: c[k] for k in ("H", "G", "R", "bias")},
                "F": r.details["ffn"],
                "params": r.total_params,
                **r.details["terms"],
                "closed form": r.details["theory_unidentified"],
                "Jacobian": r.unidentified,
                "gap": r.sv_gap,
            }
        )
    return _checked(pd.DataFrame(out))


def table_model_audits(cases: list[tuple[str, dict]], seed: int = 0) -> pd.DataFrame:
    """Each case's whole model (E = 8, 2 heads unless the case says otherwise), audited at scope ``model``:
    layers, vocabulary, tying, the nonzero terms, the closed form, the Jacobian's count and the gap. Raises if
    a count differs from its closed form."""
    out = []
    for hf_type, kw in cases:
        r = audit_hf(hf_type, scope="model", **(dict(embed=8, heads=2, seed=seed) | kw))
        d = r.details
        out.append(
            {
                "type": hf_type,
                **{k: d[k] for k in ("layers", "vocab", "tied")},
                "params": r.total_params,
                "terms (nonzero)": ", ".join(f"{k} {v}" for k, v in d["terms"].items() if v),
                "closed form": d["theory_unidentified"],
                "Jacobian": r.unidentified,
                "gap": r.sv_gap,
            }
        )
    return _checked(pd.DataFrame(out))


# ------------------------------------------------------------------------------ float32 norms and ε
E0, E6, F32 = "float64 norms, ε = 0", "float64 norms, ε = 1e-6", "transformers' float32 RMSNorm, ε = 0"


@dataclass
class Spectra:
    """Per norm variant of a tiny whole Llama: the Jacobian's singular values over the largest, the closed
    form's count, and the window of relative tolerances that read the closed form."""

    layers: int
    spectrum: dict[str, np.ndarray] = field(default_factory=dict)
    closed: dict[str, int] = field(default_factory=dict)
    window: dict[str, tuple[float, float]] = field(default_factory=dict)

    def null(self, k: str) -> int:
        """Singular values below the near-null band (exact null directions)."""
        return int((self.spectrum[k] <= NEAR_NULL_BAND[0]).sum())

    def band(self, k: str) -> int:
        """Singular values inside the near-null band."""
        lo, hi = NEAR_NULL_BAND
        return int(((self.spectrum[k] > lo) & (self.spectrum[k] <= hi)).sum())

    def gap(self, k: str) -> float:
        return self.window[k][1] / self.window[k][0]


def llama_spectra(small: bool, seed: int = 0) -> Spectra:
    """A tiny whole Llama (E = 8, 2 heads, 1 layer when ``small`` else 2) audited with float64 norms at ε = 0
    and ε = 1e-6 and with transformers' float32 RMSNorm; raises unless the float64 ε = 0 spectrum has exactly
    the closed form's null directions and ε > 0 loses exactly the stream-scale term."""
    import torch

    cfg = equivalent_config("llama", embed=8, heads=2)
    L_seq = default_seq_len(cfg)
    ids = torch.randint(0, 24, (30 if small else 40, L_seq), generator=torch.Generator().manual_seed(seed))
    shape: dict[str, Any] = dict(ffn=21, layers=1 if small else 2, vocab=24, tied=False, seq_len=L_seq)
    out = Spectra(layers=shape["layers"])
    variants: dict[str, dict[str, Any]] = {
        E0: dict(norm_eps=0.0),
        E6: dict(norm_eps=1e-6),
        F32: dict(norm_eps=0.0, exact_norms=False),
    }
    for label, kw in variants.items():
        model, fwd = build_model("llama", cfg, **shape, seed=seed, **kw)
        r = audit_module(model, (ids,), forward=fwd)
        sv = np.array(r.singular_values)
        out.spectrum[label] = sv / sv[0]
        out.closed[label] = count_model(model_config("llama", cfg, **shape, norm_eps=kw["norm_eps"])).unidentified
        out.window[label] = tolerance_window(sv, r.total_params - out.closed[label])
    if out.null(E0) != out.closed[E0] or out.band(E0) != 0:
        raise AssertionError("float64 norms at ε = 0: the null directions are not the closed form's")
    if out.closed[E0] - out.closed[E6] != out.null(E0) - out.null(E6):  # ε > 0 drops exactly the stream's scale
        raise AssertionError("ε > 0 does not lose exactly the closed form's stream-scale term")
    return out


def fig_llama_spectrum(sp: Spectra, last: int = 260):
    """The ``last`` smallest singular values of each variant (over the largest) with the near-null band."""
    import matplotlib.pyplot as plt

    from ..plotting import panels

    fig, axes = panels(1, height=3.6)
    ax = axes[0, 0]
    for label, s in sp.spectrum.items():
        ax.semilogy(np.arange(len(s))[-last:], s[-last:], label=label)
    ax.axhspan(*NEAR_NULL_BAND, color="0.9", zorder=0, label="near-null band")
    ax.set(xlabel=f"singular value index (the last {last})", ylabel="σ / σ_max")
    ax.set_title(f"Jacobian spectrum of a {sp.layers}-layer Llama")
    ax.legend(loc="lower left")
    plt.show()
    return fig


def table_spectra(sp: Spectra) -> pd.DataFrame:
    """Per variant: the closed form, the null and near-null counts, the tolerance window and its gap."""
    lo, hi = (f"{v:.0e}".replace("e-0", "e-") for v in NEAR_NULL_BAND)  # 1e-9
    df = pd.DataFrame(
        {
            "norms": list(sp.spectrum),
            "closed form": [sp.closed[k] for k in sp.spectrum],
            f"below {lo} (null)": [sp.null(k) for k in sp.spectrum],
            f"in the band {lo} to {hi}": [sp.band(k) for k in sp.spectrum],
            "tolerances giving the closed form": [f"{w[0]:.1e} to {w[1]:.1e}" for w in sp.window.values()],
            "gap": [sp.gap(k) for k in sp.spectrum],
        }
    )
    return with_formats(df, gap="{:.1e}")


def spectrum_sentence(sp: Spectra) -> str:
    """What ε > 0 and float32 norms do to the null directions and to the gap the audit needs."""
    left = sp.null(E0) - sp.null(E6)
    cut = "but keeps them apart from the rest. " if sp.gap(F32) > 100 else "and leaves almost no cut. "
    trust = "below" if sp.gap(F32) < MIN_GAP else "still above"
    return (
        f"With float64 norms at ε = 0 there are {sp.null(E0)} exact null directions, the closed form's count, and "
        f"{sp.band(E0)} in the band. At ε = 1e-6 the closed form loses its stream-scale term ({sp.closed[E0]} → "
        f"{sp.closed[E6]}) and the spectrum loses {left} null direction{'s' * (left != 1)} ({sp.null(E6)} null, "
        f"{sp.band(E6)} in the band): the scale is only nearly a symmetry there, and the tolerances that give the "
        f"closed form span {sp.window[E6][0]:.1e} to {sp.window[E6][1]:.1e} (`attnid audit --model --norm-eps` "
        "refuses to read a count without a clear gap). Transformers' float32 RMSNorm puts "
        f"{sp.band(F32)} directions in the band and leaves {sp.null(F32)} below it, yet any relative tolerance "
        f"from {sp.window[F32][0]:.1e} to {sp.window[F32][1]:.1e} still gives {sp.closed[F32]}, the closed form: "
        f"float32 round-off lifts the null directions off zero {cut}What it costs is the gap, {sp.gap(F32):.0e} "
        f"against {sp.gap(E0):.0e} with float64 norms, {trust} the {MIN_GAP:.0e} that attnid requires before it "
        "trusts a rank; attnid audits with the norm computed in float64 (and says so in the audit's details)."
    )


# ------------------------------------------------------------------------------ the whole model against products
COMPARED = ("gpt2", "llama-2-7b", "pythia-6.9b")


def table_compare(names: tuple[str, ...] = COMPARED) -> pd.DataFrame:
    """Per preset: the whole model's closed form split into the product of per-layer attention groups, the
    attention biases, the rest of the blocks, the stream's rotations and its other terms."""
    rows = []
    for name in names:
        p = PRESETS[name]
        assert p.model is not None and isinstance(p.config, AttentionConfig)  # decoder models, no latent attention
        m, block, attn = (preset_count(name, scope) for scope in ("model", "block", "attention"))
        L, groups = p.model.layers, layer_gauge_dims(p.config)
        rotations = m.unidentified_by_block["stream_rotation"]
        rows.append(
            {
                "model": p.description,
                "product of layer groups": L * groups,
                "attention biases": L * (attn.unidentified - groups),
                "rest of the blocks": L * (block.unidentified - attn.unidentified),
                "stream rotations": rotations,
                "other stream terms": m.unidentified - m.unidentified_by_block["blocks"] - rotations,
                "whole model (closed form)": m.unidentified,
                "params": m.total_params,
            }
        )
    return pd.DataFrame(rows, index=list(names))


def compare_facts(compare: pd.DataFrame) -> dict[str, object]:
    """The numbers the chapter glues from :func:`table_compare`: GPT-2 small's count and its product of
    layer groups, Llama-2-7B's count, its stream rotations and their share."""
    g2, ll = compare.loc["gpt2"], compare.loc["llama-2-7b"]
    return {
        "gpt2_model": int(g2["whole model (closed form)"]),
        "gpt2_product": int(g2["product of layer groups"]),
        "llama_model": int(ll["whole model (closed form)"]),
        "llama_rotation": int(ll["stream rotations"]),
        "llama_rotation_share": float(ll["stream rotations"] / ll["whole model (closed form)"]),
    }


def compare_points(compare: pd.DataFrame) -> str:
    """The comparison with a product of per-layer groups, point by point, as Markdown bullets."""
    g2, ll = compare.loc["gpt2"], compare.loc["llama-2-7b"]
    stream = ", ".join(
        f"{k.replace('_', ' ')} {v:,}"
        for k, v in preset_count("gpt2", "model").unidentified_by_block.items()
        if v and k != "blocks"
    )
    per_layer = preset_count("llama-2-7b", "block").unidentified - preset_count("llama-2-7b").unidentified
    whole, product = int(g2["whole model (closed form)"]), int(g2["product of layer groups"])
    return (
        "Point by point:\n\n"
        f"- **The product of per-layer groups** gives {product:,} for GPT-2 small (12 layers × 12 heads × "
        '(64² + 64²), the same shape as the Transformer Base of the first paper, hence its "over 1.1 '
        f"million\"). The real model has {whole:,}: {int(g2['attention biases']):,} from the attention's key and "
        f"value biases, {int(g2['rest of the blocks']):,} from the norms and output biases of its layers, and "
        f"{int(g2['stream rotations'] + g2['other stream terms']):,} from the residual stream ({stream}).\n"
        "- **LayerNorm does not leave the groups as they are**: behind it every reader gains a mean direction "
        "and a free effective bias, so even a model without key biases loses its whole key bias (OPT without "
        "biases, above).\n"
        "- **The whole model is not the product of its layers.** In Llama-2-7B the stream's rotations add "
        f"{int(ll['stream rotations']):,} directions, {ll['stream rotations'] / ll['whole model (closed form)']:.0%}"
        f" of its {int(ll['whole model (closed form)']):,}; each layer adds {per_layer:,} (its two RMSNorm scales "
        f"and the SwiGLU rescaling) to the attention's {preset_count('llama-2-7b').unidentified:,}. The rotations "
        "are what SliceGPT and QuaRot use to compress and quantize; a count that multiplies layer groups misses "
        "them.\n"
        "- **Functional dimension.** The second paper's formula is the attention layer's (chapter 2's count, "
        "which the Jacobian confirms: no hidden symmetries). The functional dimension of a whole model is its "
        f"parameter count less the whole-model count: for GPT-2 small {int(g2['params']) - whole:,} of "
        f"{int(g2['params']):,}. Normalising a memorisation capacity by the product of per-layer groups would "
        f"leave out {whole - product:,} directions for GPT-2 small: {int(g2['attention biases']):,} from the "
        f"attention's key and value biases and {whole - product - int(g2['attention biases']):,} from the norms, "
        "the output biases and the residual stream.\n"
        "- **Neither paper measures the rank of a real block**; here every term was checked against the Jacobian "
        "of the `transformers` classes, at every shape in the tables above."
    )
