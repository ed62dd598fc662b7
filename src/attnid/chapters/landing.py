"""The landing page's headline (chapter 0): every published architecture attnid counts, one attention layer each,
against the paper's 1/(2H)."""

from __future__ import annotations

import pandas as pd

from ..presets import MLA_PRESETS, preset_rows

KINDS = ("multi-head", "grouped keys (GQA/MQA)", "latent attention (MLA)")


def published_layers() -> pd.DataFrame:
    """One row per preset, latent attention included: ``name``, ``heads``, ``groups``, ``share`` (the unidentified
    share of one attention layer's weights) and ``kind`` (:data:`KINDS`)."""
    rows = pd.DataFrame(preset_rows())
    rows["kind"] = [KINDS[0] if g == h else KINDS[1] for g, h in zip(rows["groups"], rows["heads"])]
    mla = pd.DataFrame(preset_rows(presets=MLA_PRESETS))
    mla["kind"] = KINDS[2]
    out = pd.concat([rows, mla], ignore_index=True)
    out["share"] = 1 - out["identified_fraction"]
    return out[["name", "heads", "groups", "share", "kind"]]


def headline_figure(models: pd.DataFrame):
    """The unidentified share of each published layer against its query heads H (log-log), beside 1/(2H); a label
    per point that the eye sees as one (coinciding layers share it). Glued, not shown: the landing page places it
    with its own caption (so not named ``fig_*``, the chapters' shown figures)."""
    import matplotlib.pyplot as plt
    import numpy as np

    from ..plotting import label_points, merge_coincident

    fig, ax = plt.subplots(figsize=(7.5, 6.0))
    hs = np.geomspace(1, 200, 60)
    ax.plot(hs, 1 / (2 * hs), "k-", lw=1.5, label="1/(2H): multi-head, D = E/H")
    for kind, marker in zip(KINDS, "osD"):
        part = models[models["kind"] == kind]
        if len(part):
            ax.scatter(part["heads"], part["share"], s=60, marker=marker, label=kind, zorder=3)
    ax.set(xscale="log", yscale="log", xlim=(0.6, 400), ylim=(5e-5, 0.3))
    ax.set(xlabel="query heads H per layer", ylabel="unidentified share of attention weights",
           title="Published attention layers")  # fmt: skip
    x, y, labels = merge_coincident(ax, list(models["heads"]), list(models["share"]), list(models["name"]))
    label_points(ax, x, y, labels)
    ax.legend(loc="lower left")
    return fig
