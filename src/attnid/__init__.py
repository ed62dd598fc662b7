"""attnid: the parameter-identification math of multi-head attention (arXiv 2609.01231).

The names below load their module (and torch) on first use, so that ``attnid --help`` and ``--version`` start in a
fraction of a second and without torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .attention import AttentionConfig, ColumnAttention, attention, init_params, parse_bias
    from .counting import count

__all__ = ["AttentionConfig", "ColumnAttention", "attention", "count", "init_params", "parse_bias"]
__version__ = "0.5.0"

_HOMES = {"count": ".counting", **dict.fromkeys(("AttentionConfig", "ColumnAttention", "attention", "init_params",
                                                 "parse_bias"), ".attention")}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module 'attnid' has no attribute {name!r}")


class _Package(types.ModuleType):
    """The package: its ``attention`` is the layer function (``attnid.attention.attention``), as when every name was
    imported up front, even once the submodule of that name is loaded (the import system sets the package's
    attribute of a submodule's name to the submodule)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "attention" and isinstance(value, types.ModuleType):
            value = value.attention
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
