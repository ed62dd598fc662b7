"""attnid: the parameter-identification math of multi-head attention (arXiv 2609.01231).

The names below load their module on first use. The counts (``count``, ``count_config``, ``load_config``, the
presets) need only the standard library (and ``huggingface_hub`` for a model named on the Hub); the layer
(``attention``) and the audits (``attnid.audit.audit``, ``attnid.hf.audit_hf``) need torch
(``pip install 'attnid[audit]'``).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .attention import ColumnAttention, attention, init_params
    from .attention_config import AttentionConfig, parse_bias
    from .configs import ConfigError, count_config, load_config
    from .counting import count
    from .hub import HubError
    from .presets import Preset, lookup, scope_count

__all__ = ["AttentionConfig", "ColumnAttention", "ConfigError", "HubError", "Preset", "attention", "count",
           "count_config", "init_params", "load_config", "lookup", "parse_bias", "scope_count"]  # fmt: skip
__version__ = "0.6.0"

# each public name's module: the core ones need no torch; the layer (attention, ColumnAttention, init_params) and the
# audits (attnid.audit.audit, attnid.hf.audit_hf) need the audit extra
_HOMES = {"count": ".counting", "AttentionConfig": ".attention_config", "parse_bias": ".attention_config",
          **dict.fromkeys(("ConfigError", "count_config", "load_config"), ".configs"), "HubError": ".hub",
          **dict.fromkeys(("Preset", "lookup", "scope_count"), ".presets"),
          **dict.fromkeys(("ColumnAttention", "attention", "init_params"), ".attention")}  # fmt: skip


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
