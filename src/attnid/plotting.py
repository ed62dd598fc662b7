"""One plotting style for every figure of the book."""
from __future__ import annotations

PALETTE = "colorblind"


def set_style() -> None:
    """Seaborn ``whitegrid`` theme, colour-blind palette, readable sizes, light background."""
    import matplotlib as mpl
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette=PALETTE)
    mpl.rcParams.update({
        "figure.figsize": (7.0, 4.2), "figure.dpi": 110, "savefig.dpi": 110,
        "axes.titlesize": 12, "axes.titleweight": "bold", "axes.labelsize": 11,
        "legend.fontsize": 9, "legend.frameon": True, "figure.facecolor": "white",
        "axes.facecolor": "white",
    })


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when available, else ``"cpu"``; validates the name."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available")
    if not (device == "cpu" or device.startswith("cuda") or device == "mps"):
        raise ValueError(f"device: expected 'auto', 'cpu', 'cuda[:n]' or 'mps', got {device!r}")
    return device


def check_profile(profile: str) -> str:
    if profile not in ("smoke", "cpu", "paper"):
        raise ValueError(f"profile: expected 'smoke', 'cpu' or 'paper', got {profile!r}")
    return profile
