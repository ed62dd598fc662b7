"""The optional parts of attnid and what each needs. The core (counting, presets, families, a config's reading) needs
only the standard library; a model named on the Hub needs ``huggingface_hub`` (the ``hub`` extra), and the Jacobian
audits and the training need torch (``pip install 'attnid[audit]'``; ``pyproject.toml`` lists the extras). A command
whose extra is missing stops with one line naming it (:class:`MissingExtra`, exit 2), found without importing
anything heavy."""

from __future__ import annotations

import importlib.util
import sys

# each extra: the modules it brings that the commands import (pyproject.toml's extras install their packages)
EXTRAS: dict[str, tuple[str, ...]] = {
    "hub": ("huggingface_hub",),
    "audit": ("torch", "numpy", "scipy", "tqdm", "filelock", "transformers"),
    "train": ("torch", "numpy", "scipy", "tqdm", "filelock", "submitit"),
}


class MissingExtra(ImportError):
    """A command needs an extra that is not installed; the message names the extra and the install command."""


def missing(modules: tuple[str, ...]) -> list[str]:
    """The ``modules`` that cannot be imported here, found without importing them (a name set to None in
    ``sys.modules`` is missing, as the import system treats it)."""
    out = []
    for m in modules:
        if m in sys.modules:
            if sys.modules[m] is None:
                out.append(m)
        elif importlib.util.find_spec(m) is None:
            out.append(m)
    return out


def require(extra: str, what: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise :class:`MissingExtra` when ``what`` (a command, in words) cannot run: the first of ``modules`` (default:
    all of the extra's) that is not installed, and ``pip install 'attnid[extra]'``."""
    if extra not in EXTRAS:
        raise ValueError(f"extra: {extra!r} is not one of {', '.join(EXTRAS)}")
    gone = missing(EXTRAS[extra] if modules is None else modules)
    if gone:
        raise MissingExtra(f"{what} needs the {extra} extra ({gone[0]} is not installed): "
                           f"pip install 'attnid[{extra}]'")  # fmt: skip
