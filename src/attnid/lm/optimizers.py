"""A run's model and optimizer (:func:`build`: SGD or AdamW, with or without weight decay, as the run's config
says) and the precision its steps run at (:func:`precision_context`: fp32, TF32 or bf16 autocast)."""

from __future__ import annotations

import contextlib

import torch

from .gpt import GPT
from .profiles import RunConfig


def build(cfg: RunConfig, vocab_size: int, device: str) -> tuple[GPT, torch.optim.Optimizer]:
    """The float32 model and its optimizer (fused AdamW on CUDA), seeded by ``cfg.seed``."""
    torch.manual_seed(cfg.seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # the model trains in float32 whatever the default
    try:
        model = GPT(cfg.gpt_config(vocab_size)).to(device)
    finally:
        torch.set_default_dtype(default)
    return model, make_optimizer(cfg, list(model.parameters()), device)


def make_optimizer(cfg: RunConfig, params: list[torch.Tensor], device: str, lead: int = 0) -> torch.optim.Optimizer:
    """SGD (no momentum) or AdamW for ``params``; AdamW decays the matrices only (biases, norms: no decay).
    ``lead``: leading dims of every tensor that are not the parameter's own (stacked seeds: 1)."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.0, weight_decay=cfg.weight_decay)
    decay = [p for p in params if p.dim() - lead >= 2]
    no_decay = [p for p in params if p.dim() - lead < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=cfg.betas,
        fused=device.startswith("cuda"),
    )


@contextlib.contextmanager
def precision_context(precision: str, device: str):
    """Autocast for ``bf16``; TF32 matrix products for ``tf32`` (restored afterwards); nothing for ``fp32``."""
    if precision == "bf16":
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16):
            yield
    elif precision == "tf32" and device.startswith("cuda"):
        old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
    else:
        yield
