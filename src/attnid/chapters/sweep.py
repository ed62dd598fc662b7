"""Chapter 6, the QK spectra per optimizer and the SGD learning-rate sweep (the paper's §5), from run records."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..lm import analysis as an
from ..lm.analysis import SuiteRuns
from ..lm.metrics import Key
from ..lm.profiles import LR_SWEEP
from . import CASE_LABELS, with_formats
from .dynamics import MAIN, Scales


# ------------------------------------------------------------------------------ QK spectra
def fig_spectra(scales: Scales, titles: dict[str, str]):
    """Singular values of every head's QK product, layer 1, at the last evaluation, over the largest; one line
    per head, one colour per optimizer case (seed 0), a panel per scale."""
    import matplotlib.pyplot as plt

    from ..plotting import panels

    fig, axes = panels(len(scales), height=3.6, sharey=True)
    for ax, (name, runs) in zip(axes[0], scales.items()):
        for i, case in enumerate(MAIN):
            sv = an.values(runs.first(case), Key.QK_SV)[-1]  # (L, H, D)
            for h in range(sv.shape[1]):
                ax.semilogy(
                    np.arange(1, sv.shape[-1] + 1),
                    sv[0, h] / sv[0, h, 0],
                    color=f"C{i}",
                    lw=0.8,
                    label=CASE_LABELS[case] if h == 0 else None,
                )
        ax.set(title=titles[name], xlabel="index", ylabel="σ / σ_max")
        ax.legend()
    plt.show()
    return fig


def table_spectra(scales: Scales) -> pd.DataFrame:
    """Per scale and case: the smallest σ_min / σ_max of any final QK product (any head and seed) and the mean
    effective rank (case names, for display)."""
    df = pd.DataFrame(
        [
            {
                "scale": name,
                "case": case,
                "smallest σ / largest (any head, any seed)": an.over_seeds(runs, case, an.min_sv_ratio)["min"],
                "effective rank (mean over heads and seeds)": an.over_seeds(
                    runs, case, lambda r: float(an.final_effective_rank(r).mean())
                )["mean"],
                "D": an.values(runs.first(case), Key.QK_SV).shape[-1],
            }
            for name, runs in scales.items()
            for case in MAIN
        ]
    )
    df["case"] = df["case"].map(CASE_LABELS)
    return with_formats(
        df,
        **{
            "smallest σ / largest (any head, any seed)": "{:.2e}",
            "effective rank (mean over heads and seeds)": "{:.1f}",
        },
    )


# ------------------------------------------------------------------------------ the SGD learning-rate sweep
def sweep_finals(runs: SuiteRuns) -> dict[float, np.ndarray]:
    """Final β drift of the plain-SGD sweep: learning rate -> ``(seeds, L)``, ascending in η."""
    return {
        lr: np.array([an.final_drift(r) for _, r in sorted(runs.runs[case].items())])
        for lr, case in sorted(LR_SWEEP.items())
        if case in runs
    }


def fig_sweep(runs: SuiteRuns, title: str):
    """Final β drift per layer against the SGD learning rate (log–log; mean over seeds, bars: range)."""
    import matplotlib.pyplot as plt

    finals = sweep_finals(runs)
    lrs = list(finals)
    fig, ax = plt.subplots()
    for layer in range(next(iter(finals.values())).shape[1]):
        mean = np.array([finals[lr][:, layer].mean() for lr in lrs])
        lo = np.array([finals[lr][:, layer].min() for lr in lrs])
        hi = np.array([finals[lr][:, layer].max() for lr in lrs])
        ax.errorbar(lrs, mean, yerr=[mean - lo, hi - mean], fmt="o-", capsize=3, label=f"layer {layer + 1}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set(
        xlabel="SGD learning rate η",
        ylabel="final ‖β_T − β_0‖ / ‖β_0‖",
        title=f"β drift against the step size, {title}",
    )
    ax.set_xticks(lrs, [str(lr) for lr in lrs])
    ax.minorticks_off()
    ax.legend()
    plt.show()
    return fig


def table_sweep(runs: SuiteRuns) -> pd.DataFrame:
    """Per layer: the slope of log(final drift) against log η (mean, min and max over seeds) and the drift at each
    learning rate (mean over seeds)."""
    finals = sweep_finals(runs)
    lrs = list(finals)
    n_seeds, n_layers = finals[lrs[0]].shape
    slopes = np.array(
        [
            [np.polyfit(np.log(lrs), np.log([finals[lr][i, layer] for lr in lrs]), 1)[0] for layer in range(n_layers)]
            for i in range(n_seeds)
        ]
    )  # (seeds, layers)
    df = pd.DataFrame(
        {
            "layer": np.arange(1, n_layers + 1),
            "slope of log drift vs log η (mean over seeds)": slopes.mean(0),
            "min": slopes.min(0),
            "max": slopes.max(0),
            **{f"drift at η = {lr}": finals[lr].mean(0) for lr in lrs},
        }
    )
    return with_formats(df, min="{:.2f}", max="{:.2f}", **{f"drift at η = {lr}": "{:.2e}" for lr in lrs})


def sweep_sentence(sweep: pd.DataFrame) -> str:
    """The slope of log drift against log η per layer (:func:`table_sweep`)."""
    col = "slope of log drift vs log η (mean over seeds)"
    slopes = ", ".join(f"layer {layer}: {v:.2f}" for layer, v in zip(sweep["layer"], sweep[col]))
    return (
        f"Slopes per layer (mean over seeds): {slopes}. The drift falls with the learning rate wherever the slope "
        "is positive; a fixed gradient would give slope 2."
    )
