"""One plotting style for every figure of the book."""

from __future__ import annotations

from typing import Any

PALETTE = "colorblind"  # seaborn's name of COLORS
# seaborn's "colorblind" palette and what ``sns.set_theme(context="notebook", style="whitegrid")`` sets that
# set_style does not set again below, written out: importing seaborn costs about 2 CPU-s in every chapter's kernel.
# tests/test_plotting.py checks them against seaborn itself. Left out: its default colour map ("rocket", which
# exists only once seaborn is imported); every image in the book names its own.
COLORS = ["#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#fbafe4", "#949494", "#ece133", "#56b4e9"]
WHITEGRID = {
    "axes.axisbelow": True,
    "axes.edgecolor": ".8",
    "axes.grid": True,
    "axes.labelcolor": ".15",
    "axes.linewidth": 1.25,
    "font.sans-serif": ["Arial", "DejaVu Sans", "Liberation Sans", "Bitstream Vera Sans", "sans-serif"],
    "grid.color": ".8",
    "grid.linewidth": 1.0,
    "lines.solid_capstyle": "round",
    "patch.edgecolor": "w",
    "patch.force_edgecolor": True,
    "text.color": ".15",
    "xtick.bottom": False,
    "xtick.color": ".15",
    "xtick.major.size": 6.0,
    "xtick.major.width": 1.25,
    "xtick.minor.size": 4.0,
    "xtick.minor.width": 1.0,
    "ytick.color": ".15",
    "ytick.left": False,
    "ytick.major.size": 6.0,
    "ytick.major.width": 1.25,
    "ytick.minor.size": 4.0,
    "ytick.minor.width": 1.0,
}
DPI = 110  # every figure's pixels per inch
MIN_FONT_PT = 9.5  # the smallest text drawn (legends); the book shows figures at ≥ 0.85 scale, so ≥ 8 pt
PAGE_WIDTH_IN = 8.0  # the widest figure: at the book's column width its text stays ≥ 8 pt


BOOK_RC = {  # the book's own settings over the theme: sizes readable at the book's width
    "figure.figsize": (7.0, 4.2),
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "axes.titlesize": 11.5,
    "axes.titleweight": "bold",
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": MIN_FONT_PT,
    "legend.title_fontsize": MIN_FONT_PT,
    "font.size": 10,
    "legend.frameon": True,
    "figure.facecolor": "white",
    "axes.facecolor": "white",
}


def set_style() -> None:
    """Seaborn's ``whitegrid`` theme and colour-blind palette (``WHITEGRID``, ``COLORS``) with the book's sizes
    (``BOOK_RC``)."""
    import matplotlib as mpl
    from cycler import cycler

    rc: Any = {**WHITEGRID, "axes.prop_cycle": cycler(color=COLORS), **BOOK_RC}  # matplotlib types keys as literals
    mpl.rcParams.update(rc)


def panels(n: int, *, height: float = 3.6, **subplots_kw):
    """``fig, axes`` for ``n`` panels, at most two per row, ``PAGE_WIDTH_IN`` wide (one panel: 7 in);
    ``axes`` has shape ``(rows, min(n, 2))``. Extra cells of an odd last row are removed."""
    import matplotlib.pyplot as plt

    cols = 1 if n == 1 else 2
    rows = -(-n // cols)
    width = 7.0 if n == 1 else PAGE_WIDTH_IN
    fig, axes = plt.subplots(
        rows, cols, figsize=(width, height * rows), squeeze=False, layout="constrained", **subplots_kw
    )
    for ax in axes.flat[n:]:
        ax.remove()
    return fig, axes


def dot_rows(names, series: dict, *, xlabel: str, title: str, height: float = 3.6):
    """One row per name, a marker per series on a log x axis (chapters 8 and 9): ``series`` maps a legend label
    to ``(marker, values)``, values aligned with ``names``. Shows and returns the figure."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import FormatStrFormatter

    fig, axes = panels(1, height=height)
    ax = axes[0, 0]
    y = np.arange(len(names))
    for label, (marker, values) in series.items():
        ax.scatter(values, y, marker=marker, label=label, s=36)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.set_yticks(y, list(names))
    ax.invert_yaxis()
    ax.set(xlabel=xlabel, title=title)
    fig.legend(loc="outside lower center", ncol=len(series))
    plt.show()
    return fig


def merge_coincident(
    ax, x, y, labels, *, fontsize: float = MIN_FONT_PT, within: float = 0.6
) -> tuple[list, list, list]:
    """The points ``(x[i], y[i])`` whose markers overlap on ``ax`` (closer than ``within`` of a label's height, in
    display pixels: about a marker's width) merged into one, at the first of them, with their labels joined by
    commas: one label for what the eye sees as one point. Set the axes' scales and limits first. Returns
    ``(x, y, labels)``."""
    import numpy as np

    fig = ax.figure
    px = within * fontsize * fig.dpi / 72
    xy = ax.transData.transform(np.column_stack([np.asarray(x, float), np.asarray(y, float)]))
    groups: list[list[int]] = []
    for i in range(len(xy)):
        near = next((g for g in groups if np.hypot(*(xy[g[0]] - xy[i])) < px), None)
        if near is None:
            groups.append([i])
        else:
            near.append(i)
    return [x[g[0]] for g in groups], [y[g[0]] for g in groups], [_lines([str(labels[i]) for i in g]) for g in groups]


def _lines(names: list[str], width: int = 30) -> str:
    """``names`` joined by commas, a new line before a name that would take a line past ``width`` characters."""
    lines = [names[0]]
    for n in names[1:]:
        if len(lines[-1]) + 2 + len(n) > width:
            lines[-1] += ","
            lines.append(n)
        else:
            lines[-1] += f", {n}"
    return "\n".join(lines)


def label_points(ax, x, y, labels, *, fontsize: float = MIN_FONT_PT) -> list:
    """Label each point ``(x[i], y[i])`` beside it: to its right, else to its left, else nudged up or down
    (with a thin leader line), whichever first overlaps no marker and no label placed before it (points
    are labelled from the top down; each label's width is its text's, measured; a label stays inside the axes). Set
    the axes' scales and limits first; merge points that coincide first (:func:`merge_coincident`). Returns the
    annotations."""
    import numpy as np
    from matplotlib.textpath import TextPath

    fig = ax.figure
    fig.canvas.draw()
    px = fontsize * fig.dpi / 72  # the height of a label in display pixels
    xs, ys = np.asarray(x, float), np.asarray(y, float)
    xy = ax.transData.transform(np.column_stack([xs, ys]))
    boxes = [(u - 0.5 * px, u + 0.5 * px, v - 0.5 * px, v + 0.5 * px) for u, v in xy]  # the markers
    frame = ax.bbox  # a label stays inside the axes (else it runs off the figure or over the axis labels)
    gap = 0.8 * px
    out = []
    for i in np.argsort(-xy[:, 1], kind="stable"):
        u, v = xy[i]
        text_lines = str(labels[i]).split("\n")
        width = max(TextPath((0, 0), t, size=fontsize).get_extents().width for t in text_lines) * 1.05 * fig.dpi / 72
        half = 0.5 * px * (1.2 * len(text_lines) - 0.2)  # half the label's height: its lines at 1.2 line spacing
        choice = None
        for k in range(24):
            dv = (k + 1) // 2 * px / 2 * (1 if k % 2 else -1)  # 0, +, −, ++, −−, ...
            for side in (1, -1):
                x0 = u + gap if side > 0 else u - gap - width
                box = (x0, x0 + width, v + dv - half, v + dv + half)
                inside = frame.x0 <= box[0] and box[1] <= frame.x1 and frame.y0 <= box[2] and box[3] <= frame.y1
                if inside and not any(a < box[1] and box[0] < b and c < box[3] and box[2] < d for a, b, c, d in boxes):
                    choice = (side, dv, box)
                    break
            if choice:
                break
        side, dv, box = choice or (1, 0.0, (u + gap, u + gap + width, v - half, v + half))
        boxes.append(box)
        out.append(
            ax.annotate(
                str(labels[i]),
                (xs[i], ys[i]),
                xytext=(side * gap * 72 / fig.dpi, dv * 72 / fig.dpi),
                textcoords="offset points",
                ha="left" if side > 0 else "right",
                va="center",
                fontsize=fontsize,
                arrowprops=dict(arrowstyle="-", color="0.6", lw=0.6) if abs(dv) > px / 4 else None,
            )
        )
    return out


def table(df, *, formats: dict | None = None, digits: int = 3):
    """A table as the book shows it: no index, text left-aligned, numbers right-aligned with
    consistent formatting (integers with thousands separators, floats to ``digits`` significant figures,
    booleans as yes/no, missing values as a dash); ``formats`` overrides per column (a format string or
    a function; ``df.attrs["formats"]`` gives defaults, as the chapter modules' tables carry them). Returns a
    pandas ``Styler``."""
    import numbers

    import pandas as pd

    formats = {**df.attrs.get("formats", {}), **(formats or {})}
    numeric = []
    for col in df.columns:
        s = df[col]
        if pd.api.types.is_bool_dtype(s):
            formats.setdefault(col, lambda v: "yes" if v else "no")
        elif pd.api.types.is_integer_dtype(s):
            formats.setdefault(col, "{:,}")
            numeric.append(col)
        elif pd.api.types.is_float_dtype(s):
            formats.setdefault(col, lambda v: "–" if pd.isna(v) else f"{v:.{digits}g}")
            numeric.append(col)
        elif all(isinstance(v, numbers.Number) or v is None for v in s):
            numeric.append(col)
    styler = df.style.format(formats, na_rep="–", escape="html").hide(axis="index")
    styler = styler.set_table_styles(
        [
            {"selector": "th", "props": "padding: 0.2em 0.8em; vertical-align: bottom"},
            {"selector": "td", "props": "padding: 0.15em 0.8em; white-space: nowrap"},
        ]
    )
    align = {c: "right" if c in numeric else "left" for c in df.columns}  # a header sits over its column
    return styler.set_table_styles(
        {c: [{"selector": "th, td", "props": f"text-align: {a}"}] for c, a in align.items()}, overwrite=False
    )


def band(ax, x, mean, low, high, *, color, label: str | None = None, **line_kw):
    """A line at ``mean`` with the range ``[low, high]`` shaded (over seeds); returns the line."""
    (line,) = ax.plot(x, mean, color=color, label=label, **line_kw)
    if (low != high).any():
        ax.fill_between(x, low, high, color=color, alpha=0.2, lw=0)
    return line
