"""Experiment profiles and the training cases of chapters 6 and 7.

``smoke``: seconds, for the tests; ``cpu``: the book on 2 cores; ``paper``: the setting of the paper's §5.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

PROFILES: dict[str, dict] = {
    # seconds: tests and CI
    "smoke": dict(
        n_layer=2,
        n_head=4,
        n_embd=64,
        block_size=32,
        batch_size=16,
        dropout=0.0,
        max_iters=50,
        warmup_iters=5,
        eval_interval=25,
        eval_iters=4,
        ckpt_interval=20,
        rebalance_interval=20,
        head_batches=3,
    ),
    # about a minute per run on 2 CPU cores
    "cpu": dict(
        n_layer=2,
        n_head=4,
        n_embd=64,
        block_size=32,
        batch_size=32,
        dropout=0.0,
        max_iters=2000,
        warmup_iters=100,
        eval_interval=200,
        eval_iters=20,
        ckpt_interval=500,
        rebalance_interval=250,
    ),
    # the paper's setting: nanoGPT shakespeare-char with biases, on a GPU
    "paper": dict(
        n_layer=6,
        n_head=6,
        n_embd=384,
        block_size=256,
        batch_size=64,
        dropout=0.2,
        max_iters=5000,
        warmup_iters=100,
        eval_interval=250,
        eval_iters=200,
        ckpt_interval=500,
        rebalance_interval=250,
    ),
}

CASES: dict[str, dict] = {
    "sgd": dict(optimizer="sgd", lr=0.5, weight_decay=0.0),
    "sgd_wd": dict(optimizer="sgd", lr=0.5, weight_decay=1e-3),
    "adamw": dict(optimizer="adamw", lr=1e-3, weight_decay=0.1),
    "adamw_rebalance": dict(optimizer="adamw", lr=1e-3, weight_decay=0.1, rebalance=True),
    "sgd_lr0.25": dict(optimizer="sgd", lr=0.25, weight_decay=0.0),
    "sgd_lr0.125": dict(optimizer="sgd", lr=0.125, weight_decay=0.0),
    "sgd_lr0.0625": dict(optimizer="sgd", lr=0.0625, weight_decay=0.0),
    # chapter 7: head-count sweep at fixed E (D = E/H), AdamW, and a control with fewer parameters
    **{f"heads_H{h}": dict(optimizer="adamw", lr=1e-3, weight_decay=0.1, n_head=h) for h in (1, 2, 4, 8, 16)},
    "heads_H4_D8": dict(optimizer="adamw", lr=1e-3, weight_decay=0.1, n_head=4, head_dim=8),
}
HEAD_COUNTS = (1, 2, 4, 8, 16)
OPTIMIZER_CASES = ["sgd", "sgd_wd", "adamw", "adamw_rebalance"]
LR_SWEEP = {0.5: "sgd", 0.25: "sgd_lr0.25", 0.125: "sgd_lr0.125", 0.0625: "sgd_lr0.0625"}
SUITES = {
    "dynamics": OPTIMIZER_CASES + [c for c in LR_SWEEP.values() if c not in OPTIMIZER_CASES],
    "heads": [f"heads_H{h}" for h in HEAD_COUNTS] + ["heads_H4_D8"],
}
# seeds and per-profile changes of a suite (the head sweep is shorter on the CPU to fit the book's budget)
SUITE_SEEDS = {
    "dynamics": {"smoke": [0], "cpu": [0], "paper": [0]},
    "heads": {"smoke": [0], "cpu": [0, 1], "paper": [0, 1, 2]},
}
SUITE_OVERRIDES = {"heads": {"cpu": dict(max_iters=1000, eval_interval=250, ckpt_interval=250)}}


def suite_of(case: str) -> str:
    return next((s for s, cases in SUITES.items() if case in cases), "dynamics")


OPTIMIZERS = ("sgd", "adamw")
PRECISIONS = ("auto", "fp32", "tf32", "bf16")


def default_threads() -> int:
    """CPU threads for one process: the cores not already busy (1-minute load average), at least one,
    so that several processes on a shared machine do not oversubscribe it."""
    import os

    cores = os.cpu_count() or 1
    try:
        busy = int(os.getloadavg()[0] + 0.5)
    except OSError:
        busy = 0
    return max(1, min(cores, cores - busy))


def resolve_precision(precision: str, device: str) -> str:
    """``"auto"`` -> ``"bf16"`` on CUDA, ``"fp32"`` elsewhere; ``"tf32"`` only means something on CUDA."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: unknown {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        return "bf16" if device.startswith("cuda") else "fp32"
    return precision


@dataclass
class RunConfig:
    profile: str
    case: str
    seed: int = 0
    device: str = "auto"
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    block_size: int = 32
    batch_size: int = 32
    dropout: float = 0.0
    bias: bool = True
    head_dim: int | None = None
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
    compile: bool = False  # torch.compile the model (CUDA only)
    save_model: bool = False  # also write model.pt (the book never needs it)

    EXECUTION_FIELDS = ("device", "precision", "compile", "save_model")

    def gpt_config(self, vocab_size: int = 65):
        """The model of this run (:class:`attnid.lm.gpt.GPTConfig`; it resolves ``head_dim``)."""
        from .gpt import GPTConfig

        return GPTConfig(
            vocab_size=vocab_size,
            block_size=self.block_size,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_embd=self.n_embd,
            dropout=self.dropout,
            bias=self.bias,
            head_dim=self.head_dim,
        )

    def identity(self) -> dict:
        """The fields that define what a run computes: two runs with equal identities share a record."""
        return {k: v for k, v in self.as_dict().items() if k not in self.EXECUTION_FIELDS}

    def as_dict(self) -> dict:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        names = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)


def make_config(profile: str, case: str, *, seed: int = 0, device: str = "auto", **overrides) -> RunConfig:
    """The config of one run; raises ``ValueError`` naming the bad parameter before any training."""

    if profile not in PROFILES:
        raise ValueError(f"profile: unknown {profile!r}; choose one of {', '.join(PROFILES)}")
    if case not in CASES:
        raise ValueError(f"case: unknown {case!r}; choose one of {', '.join(CASES)}")
    unknown = set(overrides) - {f.name for f in fields(RunConfig)}
    if unknown:
        raise ValueError(f"overrides: unknown parameter(s) {sorted(unknown)}")
    suite_changes = SUITE_OVERRIDES.get(suite_of(case), {}).get(profile, {})
    cfg = RunConfig(
        profile=profile,
        case=case,
        seed=seed,
        device=device,
        **{**PROFILES[profile], **suite_changes, **CASES[case], **overrides},
    )
    if not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {cfg.seed!r}")
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
