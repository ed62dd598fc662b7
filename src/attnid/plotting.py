"""One plotting style for every figure of the book."""

from __future__ import annotations

PALETTE = "colorblind"


def set_style() -> None:
    """Seaborn ``whitegrid`` theme, colour-blind palette, readable sizes, light background."""
    import matplotlib as mpl
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette=PALETTE)
    mpl.rcParams.update(
        {
            "figure.figsize": (7.0, 4.2),
            "figure.dpi": 110,
            "savefig.dpi": 110,
            "axes.titlesize": 12,
            "axes.titleweight": "bold",
            "axes.labelsize": 11,
            "legend.fontsize": 9,
            "legend.frameon": True,
            "figure.facecolor": "white",
            "axes.facecolor": "white",
        }
    )


def table(df, *, formats: dict | None = None, digits: int = 3):
    """A table as the book shows it: no index, text left-aligned, numbers right-aligned with
    consistent formatting (integers with thousands separators, floats to ``digits`` significant figures,
    booleans as yes/no, missing values as a dash); ``formats`` overrides per column (a format string or
    a function). Returns a pandas ``Styler``."""
    import numbers

    import pandas as pd

    formats = dict(formats or {})
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
    styler = df.style.format(formats, na_rep="–").hide(axis="index")
    styler = styler.set_properties(subset=[c for c in df.columns if c not in numeric], **{"text-align": "left"})
    styler = styler.set_properties(subset=numeric, **{"text-align": "right", "font-variant-numeric": "tabular-nums"})
    return styler.set_table_styles([{"selector": "th", "props": [("text-align", "right"), ("padding", "0 0.8em")]},
                                    {"selector": "td", "props": [("padding", "0.1em 0.8em")]}])  # fmt: skip
