"""Experiment profiles and the training cases of chapters 6 and 7.

``smoke``: seconds, for the tests; ``cpu``: the book on 2 cores; ``mid``: the paper's depth, heads and dropout at
a width a CPU can afford (trained here once, committed); ``paper``: the setting of the paper's §5.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from .gpt import GPTConfig, ModelShape

# Each profile lists what it changes from the defaults of :class:`RunConfig`, which are the ``cpu`` profile.
# fmt: off
PROFILES: dict[str, dict] = {
    # seconds: tests and CI
    "smoke": dict(batch_size=16, max_iters=50, warmup_iters=5, eval_interval=25, eval_iters=4, ckpt_interval=20,
                  rebalance_interval=20, head_batches=3, save_model=True),
    # about 20 s per run on 2 CPU cores
    "cpu": dict(save_model=True),  # model.pt: a few MB a run, read by chapter 10
    # the paper's depth, heads and dropout (6 x 6, 0.2) at a width and context one CPU core trains in about 7 min
    # per run (0.19-0.20 s per step with the probe, one thread, measured on 2 shared cores): E = 96 keeps the
    # paper's head size small but above the cpu profile's (D = 16), context 64 twice the cpu profile's, and batch 16
    # with 2,000 steps the cpu profile's token budget (2.0M tokens, about two passes over the corpus). The
    # alternatives measured: batch 32 at context 64 costs 0.30-0.34 s per step, E = 72 0.29 s. The paper's learning
    # rates, warmup and cosine schedule; metrics every 10 steps (200 rows, about 0.25 MB a record)
    "mid": dict(n_layer=6, n_head=6, n_embd=96, block_size=64, batch_size=16, dropout=0.2, max_iters=2000,
                eval_interval=200, eval_iters=20, ckpt_interval=100, head_batches=10),
    # the paper's setting (§5): nanoGPT shakespeare-char with biases, on a GPU
    "paper": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, dropout=0.2, max_iters=5000,
                  eval_interval=250, eval_iters=200),
}
# fmt: on


@dataclass(frozen=True)
class Suite:
    """Training cases run together: each case's changes to its profile, the seeds each profile runs,
    changes a profile makes for this suite only, and cases run at some profiles only (``only_at``)."""

    cases: dict[str, dict]
    seeds: dict[str, tuple[int, ...]]
    profile_changes: dict[str, dict] = field(default_factory=dict)
    only_at: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def cases_at(self, profile: str) -> list[str]:
        """The cases this suite runs at ``profile``."""
        return [c for c in self.cases if profile in self.only_at.get(c, (profile,))]


SGD_LR = 0.5  # the paper's SGD learning rate (§5); the sweep halves it
ADAMW = dict(optimizer="adamw", lr=1e-3, weight_decay=0.1)
OPTIMIZERS_OF_THE_PAPER = {  # §5's four optimizer cases
    "sgd": dict(optimizer="sgd", lr=SGD_LR, weight_decay=0.0),
    "sgd_wd": dict(optimizer="sgd", lr=SGD_LR, weight_decay=1e-3),
    "adamw": ADAMW,
    "adamw_rebalance": dict(ADAMW, rebalance=True),
}
POINTS_WIDTH = dict(n_embd=16, n_head=2)  # 1,088 parameters per attention layer: its Jacobian is formed whole
SUITES: dict[str, Suite] = {
    # chapter 6: the paper's four optimizer cases, then the SGD learning-rate sweep
    "dynamics": Suite(
        cases={
            **OPTIMIZERS_OF_THE_PAPER,
            **{
                f"sgd_lr{lr:g}": dict(optimizer="sgd", lr=lr, weight_decay=0.0)
                for lr in (SGD_LR / 2, SGD_LR / 4, SGD_LR / 8)
            },
            # plain SGD deep enough for a trend over layers (the claim drift_earlier_layers: 4 layers, since with
            # 3 even the full order is 1 in 6), where the profile's own model has fewer; at mid and paper `sgd` has 6
            "sgd_deep": dict(optimizer="sgd", lr=SGD_LR, weight_decay=0.0, n_layer=4),
        },
        seeds={"smoke": (0,), "cpu": (0, 1, 2), "mid": (0, 1, 2), "paper": (0,)},  # 3 seeds: a verdict needs a spread
        only_at={"sgd_deep": ("smoke", "cpu")},  # mid and paper: `sgd` itself has 6 layers
    ),
    # chapter 7: head-count sweep at fixed E (D = E/H), AdamW, and a control with fewer parameters
    "heads": Suite(
        cases={
            **{f"heads_H{h}": dict(ADAMW, n_head=h) for h in (1, 2, 4, 8, 16)},
            "heads_H4_D8": dict(ADAMW, n_head=4, head_dim=8),
        },
        seeds={"smoke": (0,), "cpu": (0, 1), "mid": (0,), "paper": (0, 1, 2)},  # mid: not committed, made by its book
        profile_changes={  # the book's budget
            "cpu": dict(max_iters=1000, eval_interval=250, ckpt_interval=250),
            "mid": dict(max_iters=1000, eval_interval=250, ckpt_interval=250),
        },
    ),
    # chapter 10: the four optimizer cases at a width whose trained layers are audited exactly (dense Jacobians)
    "points": Suite(
        cases={f"points_{case}": dict(changes, **POINTS_WIDTH) for case, changes in OPTIMIZERS_OF_THE_PAPER.items()},
        seeds={"smoke": (0,), "cpu": (0,), "mid": (0,), "paper": (0,)},
    ),
}
CASES: dict[str, dict] = {case: changes for suite in SUITES.values() for case, changes in suite.cases.items()}
OPTIMIZER_CASES = ("sgd", "sgd_wd", "adamw", "adamw_rebalance")  # the panels of chapter 6's figures
LR_SWEEP: dict[float, str] = {  # SGD learning rate -> case, for every SGD case without weight decay
    c["lr"]: name
    for name, c in SUITES["dynamics"].cases.items()
    if c["optimizer"] == "sgd" and not c["weight_decay"] and "n_layer" not in c
}
DEEP_SGD = "sgd_deep"  # plain SGD with at least 4 layers at the profiles whose model is shallower
HEAD_CASES: dict[int, str] = {  # H -> case of chapter 7's head-count sweep at D = E/H
    c["n_head"]: name for name, c in SUITES["heads"].cases.items() if "head_dim" not in c
}
HEAD_COUNTS = tuple(sorted(HEAD_CASES))
HEADS_CONTROL = next(name for name, c in SUITES["heads"].cases.items() if "head_dim" in c)  # H = 4, D = 8


def suite_of(case: str) -> str:
    return next(name for name, suite in SUITES.items() if case in suite.cases)


OPTIMIZERS = ("sgd", "adamw")
PRECISIONS = ("auto", "fp32", "tf32", "bf16")


def default_threads(busy: float | None = None) -> int:
    """CPU threads for one process: the cores not already busy, at least one, so that several processes on a
    shared machine do not oversubscribe it. ``busy``: the cores other work keeps busy, as measured by the caller
    (the book tool reads ``/proc/stat``); by default the 1-minute load average."""
    import os

    cores = os.cpu_count() or 1
    if busy is None:
        try:
            busy = os.getloadavg()[0]
        except OSError:
            busy = 0.0
    return max(1, min(cores, cores - int(busy + 0.5)))


def resolve_precision(precision: str, device: str) -> str:
    """``"auto"`` -> ``"bf16"`` on CUDA, ``"fp32"`` elsewhere. ``"tf32"`` (TensorFloat-32 matrix products) exists
    on CUDA only and is refused on another device: there it would compute in float32 and label the record TF32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: unknown {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        return "bf16" if device.startswith("cuda") else "fp32"
    if precision == "tf32" and not device.startswith("cuda"):
        raise ValueError(f"precision: tf32 exists on CUDA only, and the device is {device}; choose fp32 or bf16")
    return precision


def check_compile(compile: bool, device: str) -> None:
    """``compile`` (``torch.compile`` of the model) is offered on CUDA only: refused by name on another device,
    where a compiled smoke stack was measured at 44 s against 7 s eager on 2 busy cores (16 s against 5 s with
    inductor's cache warm)."""
    if compile and not device.startswith("cuda"):
        raise ValueError(f"compile: torch.compile is used on CUDA only, and the device is {device}; drop --compile")


@dataclass(kw_only=True)
class RunConfig(ModelShape):
    """One training run: the model (:class:`ModelShape`), the optimization, the metrics and how it executes."""

    profile: str
    case: str
    seed: int = 0
    device: str = "auto"
    batch_size: int = 32
    max_iters: int = 2000
    optimizer: str = "adamw"
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_iters: int = 100
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    rebalance: bool = False
    rebalance_interval: int = 250
    metric_interval: int = 10
    eval_interval: int = 200
    eval_iters: int = 20
    ckpt_interval: int = 500
    head_batches: int = 20  # fixed validation batches of the end-of-run head analysis (chapter 7)
    # execution: how the run is computed, not what it computes (not part of a record's identity)
    precision: str = "auto"  # "fp32" | "tf32" | "bf16" (autocast) | "auto": bf16 on CUDA, fp32 elsewhere
    compile: bool = False  # torch.compile the model (CUDA only: refused elsewhere, check_compile)
    save_model: bool = False  # also write model.pt: final weights, attention weights at each evaluation (chapter 10)

    EXECUTION_FIELDS = ("device", "precision", "compile", "save_model")

    def gpt_config(self, vocab_size: int = 65) -> GPTConfig:
        """The model of this run (:class:`attnid.lm.gpt.GPTConfig`; it resolves ``head_dim``)."""
        return GPTConfig(vocab_size=vocab_size, **{f.name: getattr(self, f.name) for f in fields(ModelShape)})

    def identity(self) -> dict:
        """The fields that define what a run computes: two runs with equal identities share a record."""
        return {k: v for k, v in self.as_dict().items() if k not in self.EXECUTION_FIELDS}

    def as_dict(self) -> dict:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        names = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)


def lr_at(cfg: RunConfig, it: int) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio * lr`` at ``max_iters`` (as in nanoGPT)."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / (cfg.warmup_iters + 1)
    ratio = (it - cfg.warmup_iters) / max(1, cfg.max_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio)))
    return cfg.lr * (cfg.min_lr_ratio + coeff * (1 - cfg.min_lr_ratio))


def beta_law_factor(cfg: RunConfig) -> list[float]:
    """``c_t = Π_{s < t} (1 − η_s λ)²`` for ``t = 0 .. max_iters``: the factor by which plain SGD's weight decay
    alone scales β = [W_Q | b_Q][W_Q | b_Q]ᵀ − [W_K | b_K][W_K | b_K]ᵀ after ``t`` steps (chapter 6). Known from
    the schedule before training. All ones without decay, and for AdamW, whose decay skips the biases (so it is
    no uniform scaling of the augmented matrices)."""
    c, out = 1.0, [1.0]
    for t in range(cfg.max_iters):
        if cfg.optimizer == "sgd":
            c *= (1.0 - lr_at(cfg, t) * cfg.weight_decay) ** 2
        out.append(c)
    return out


def make_config(profile: str, case: str, *, seed: int = 0, device: str = "auto", **overrides) -> RunConfig:
    """The config of one run; raises ``ValueError`` naming the bad parameter before any training."""

    if profile not in PROFILES:
        raise ValueError(f"profile: unknown {profile!r}; choose one of {', '.join(PROFILES)}")
    if case not in CASES:
        raise ValueError(f"case: unknown {case!r}; choose one of {', '.join(CASES)}")
    unknown = set(overrides) - {f.name for f in fields(RunConfig)}
    if unknown:
        raise ValueError(f"overrides: unknown parameter(s) {sorted(unknown)}")
    suite_changes = SUITES[suite_of(case)].profile_changes.get(profile, {})
    cfg = RunConfig(
        profile=profile,
        case=case,
        seed=seed,
        device=device,
        **{**PROFILES[profile], **suite_changes, **CASES[case], **overrides},
    )
    from ..audit import check_seed

    check_seed(cfg.seed)
    if cfg.optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer: unknown {cfg.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    if not cfg.lr > 0:
        raise ValueError(f"lr must be positive, got {cfg.lr}")
    for k in (
        "max_iters",
        "metric_interval",
        "eval_interval",
        "eval_iters",
        "ckpt_interval",
        "batch_size",
        "rebalance_interval",
    ):
        if getattr(cfg, k) <= 0:
            raise ValueError(f"{k} must be positive, got {getattr(cfg, k)}")
    if cfg.precision not in PRECISIONS:
        raise ValueError(f"precision: unknown {cfg.precision!r}; choose one of {', '.join(PRECISIONS)}")
    if cfg.head_batches <= 0:
        raise ValueError(f"head_batches must be positive, got {cfg.head_batches}")
    if cfg.weight_decay < 0 or cfg.grad_clip < 0:
        raise ValueError("weight_decay and grad_clip must be non-negative")
    cfg.gpt_config()  # validates the architecture
    return cfg


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when available, else ``"cpu"``; validates the name."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available (use --device cpu)")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device: 'mps' requested but this machine has no Apple GPU (use --device cpu)")
    if not (device == "cpu" or device.startswith("cuda") or device == "mps"):
        raise ValueError(f"device: expected 'auto', 'cpu', 'cuda[:n]' or 'mps', got {device!r}")
    return device


def check_profile(profile: str) -> str:
    """Validate a notebook's ``profile`` parameter."""
    if profile not in PROFILES:
        raise ValueError(f"profile: expected one of {', '.join(PROFILES)}, got {profile!r}")
    return profile
