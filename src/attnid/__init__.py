"""attnid: the parameter-identification math of multi-head attention (arXiv 2609.01231)."""

from .attention import AttentionConfig, ColumnAttention, attention, init_params, parse_bias
from .counting import count

__all__ = ["AttentionConfig", "ColumnAttention", "attention", "count", "init_params", "parse_bias"]
__version__ = "0.5.0"
