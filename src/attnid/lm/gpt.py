"""A nanoGPT-style character transformer (Karpathy, nanoGPT) with a fused ``c_attn``.

The attention here is PyTorch's fused kernel (the fast training path); its weights are the
column-form parameters of :mod:`attnid.attention` (``from_fused``), and the per-head Q/K views that
the metrics read come from :func:`attnid.attention.fused_qk_views`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import AttentionConfig, fused_qk_views


@dataclass
class ModelShape:
    """The model fields a training run (:class:`attnid.lm.profiles.RunConfig`) and its model share."""

    block_size: int = 32  # context length
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True  # biases in every linear map and layer norm
    head_dim: int | None = None  # default n_embd // n_head


@dataclass
class GPTConfig(ModelShape):
    vocab_size: int = 65

    def __post_init__(self) -> None:
        for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, k) <= 0:
                raise ValueError(f"{k} must be positive, got {getattr(self, k)}")
        if self.head_dim is None:
            if self.n_embd % self.n_head:
                raise ValueError(f"n_head must divide n_embd (n_embd={self.n_embd}, n_head={self.n_head})")
            self.head_dim = self.n_embd // self.n_head
        elif self.head_dim <= 0:
            raise ValueError(f"head_dim must be positive, got {self.head_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    def train_flops(self, batch_size: int) -> float:
        """Floating-point operations of one training step (forward and backward, ``3 x`` the forward's) on
        ``batch_size`` windows of ``block_size`` tokens: the matrix products of every layer and the output head, and
        causal attention's two products (half of the ``T x T`` scores). Elementwise work is not counted: this is the
        arithmetic floor of a step on matrix units."""
        assert self.head_dim is not None
        E, inner, T = self.n_embd, self.n_head * self.head_dim, self.block_size
        per_layer = 2 * (E * 3 * inner + inner * E + 2 * E * 4 * E) + 2 * 2 * (T / 2) * inner
        forward = batch_size * T * (self.n_layer * per_layer + 2 * E * self.vocab_size)
        return 3.0 * forward

    def attention_config(self) -> AttentionConfig:
        """The column-form architecture of every attention layer of this model (causal, fused biases)."""
        return AttentionConfig(
            self.n_embd, self.n_head, head_dim=self.head_dim, bias="all" if self.bias else "none", causal=True
        )


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.head_dim is not None  # GPTConfig resolves it
        self.n_head, self.n_embd, self.dropout = cfg.n_head, cfg.n_embd, cfg.dropout
        self.head_dim, self.inner = cfg.head_dim, cfg.n_head * cfg.head_dim
        self.c_attn = nn.Linear(cfg.n_embd, 3 * self.inner, bias=cfg.bias)
        self.c_proj = nn.Linear(self.inner, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.head_mask: torch.Tensor | None = None  # (H,) multipliers; None = all heads on

    def qk_views(self):
        """Per-head ``W_Q, b_Q, W_K, b_K`` views into ``c_attn`` (no copy)."""
        return fused_qk_views(self.c_attn.weight, self.c_attn.bias, self.n_head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape  # batch size, sequence length, embedding dimensionality (n_embd)
        q, k, v = self.c_attn(x).split(self.inner, dim=2)  # 3 x (B, T, nh * hs)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        p_drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop, is_causal=True)  # (B, nh, T, hs)
        if self.head_mask is not None:
            y = y * self.head_mask.to(y.dtype)[None, :, None, None]
        y = y.transpose(1, 2).contiguous().view(B, T, self.inner)  # re-assemble all head outputs side by side
        return self.resid_dropout(self.c_proj(y))  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as in nanoGPT
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def attention_layers(self) -> list[CausalSelfAttention]:
        return [cast(Block, b).attn for b in self.blocks]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        T = idx.shape[1]
        if self.cfg.block_size < T:
            raise ValueError(f"sequence length {T} exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss
