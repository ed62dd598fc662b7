"""Training loop of chapter 6 with the identification metrics of SPEC §2 items 10–12.

Every ``metric_interval`` steps it records, per layer and head, the unidentified-step fraction ρ of
that step's actual update of the bias-augmented ``[W_Q | b_Q]``, ``[W_K | b_K]``, τ = tr β, the
β drift per layer, the key- and query-bias gradient norms and the train loss; the validation loss
every ``eval_interval`` steps and the QK singular values at every evaluation.

A run lives in ``data/runs/<profile>/<case>/``: ``config.json``, ``metrics.jsonl`` (one row per
recorded step), ``checkpoint.pt`` (resume point) and, once finished, ``summary.json``. Files are
written atomically; an interrupted run resumes from its checkpoint and produces the same rows.
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path

import torch

from . import dynamics
from .data import CharData, load
from .gpt import GPT, GPTConfig
from .profiles import RunConfig, resolve_device

ROOT = Path(__file__).resolve().parents[2]
RUNS = Path(os.environ.get("ATTNID_RUNS", ROOT / "data" / "runs"))


def run_dir(cfg: RunConfig, base: Path | None = None) -> Path:
    """``<runs>/<profile>/<case>`` (seed 0) or ``<runs>/<profile>/<case>-s<seed>``."""
    return Path(base or RUNS) / cfg.profile / run_name(cfg.case, cfg.seed)


def run_name(case: str, seed: int = 0) -> str:
    return case if seed == 0 else f"{case}-s{seed}"


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def lr_at(cfg: RunConfig, it: int) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio * lr`` at ``max_iters`` (as in nanoGPT)."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / (cfg.warmup_iters + 1)
    ratio = (it - cfg.warmup_iters) / max(1, cfg.max_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio)))
    return cfg.lr * (cfg.min_lr_ratio + coeff * (1 - cfg.min_lr_ratio))


def build(cfg: RunConfig, vocab_size: int, device: str) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(cfg.seed)
    model = GPT(GPTConfig(vocab_size=vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer,
                          n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=cfg.dropout, bias=cfg.bias,
                          head_dim=cfg.head_dim)).to(device)
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.0, weight_decay=cfg.weight_decay)
    else:
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas)
    return model, opt


# ------------------------------------------------------------------------------ metrics
def qk_stack(model: GPT) -> tuple[torch.Tensor, torch.Tensor]:
    """Bias-augmented per-head query and key matrices, float64, ``(n_layer, H, D, E+1)``."""
    Qs, Ks = [], []
    for layer in model.attention_layers():
        W_Q, b_Q, W_K, b_K = layer.qk_views()
        Qs.append(dynamics.augment(W_Q, b_Q))
        Ks.append(dynamics.augment(W_K, b_K))
    return torch.stack(Qs), torch.stack(Ks)


def bias_grad_norms(model: GPT) -> tuple[list, list]:
    """Per-layer, per-head norms of the query- and key-bias gradients (before clipping)."""
    gq, gk = [], []
    for layer in model.attention_layers():
        g = layer.c_attn.bias.grad if layer.c_attn.bias is not None else None
        if g is None:
            return [], []
        I, H = layer.inner, layer.n_head
        gq.append(g[:I].view(H, -1).norm(dim=-1).tolist())
        gk.append(g[I:2 * I].view(H, -1).norm(dim=-1).tolist())
    return gq, gk


def rebalance_model(model: GPT) -> None:
    """Rebalance every head in place (:func:`attnid.dynamics.rebalance_qk`); outputs unchanged."""
    with torch.no_grad():
        for layer in model.attention_layers():
            W_Q, b_Q, W_K, b_K = layer.qk_views()
            new = dynamics.rebalance_qk(W_Q, b_Q, W_K, b_K)
            for view, value in zip((W_Q, b_Q, W_K, b_K), new):
                if view is not None:
                    view.copy_(value)


@torch.no_grad()
def evaluate(model: GPT, data: CharData, cfg: RunConfig, device: str, step: int, split: str = "val") -> float:
    """Mean loss over ``eval_iters`` batches drawn from a generator seeded by (seed, step)."""
    was = model.training
    model.eval()
    gen = torch.Generator().manual_seed(1_000_003 * (cfg.seed + 1) + step)
    losses = [model(*data.batch(split, cfg.batch_size, cfg.block_size, gen, device))[1].item()
              for _ in range(cfg.eval_iters)]
    model.train(was)
    return sum(losses) / len(losses)


# ------------------------------------------------------------------------------ the loop
class Interrupted(Exception):
    """Raised by ``stop_after`` (tests use it to simulate an interruption)."""


def train(cfg: RunConfig, *, out: Path | None = None, data: CharData | None = None, progress: bool = True,
          metrics: bool = True, force: bool = False, stop_after: int | None = None, save: bool = True) -> dict:
    """Run (or resume, or reuse) one training run; returns its summary dict.

    ``metrics=False`` turns off the identification metrics (for benchmarks); losses are still recorded.
    """
    device = resolve_device(cfg.device)
    d = run_dir(cfg, out)
    summary_file, config_file = d / "summary.json", d / "config.json"
    metrics_file, ckpt_file = d / "metrics.jsonl", d / "checkpoint.pt"
    if save:
        d.mkdir(parents=True, exist_ok=True)
        if config_file.exists() and not force:
            old = RunConfig.from_dict(json.loads(config_file.read_text())).as_dict()  # new fields: defaults
            mine = {k: v for k, v in cfg.as_dict().items() if k != "device"}
            if {k: v for k, v in old.items() if k != "device"} != mine:
                raise ValueError(f"run folder {d} holds a run with another config; pass force=True (--force) "
                                 "to overwrite it")
            if summary_file.exists():                               # finished: reuse
                summary, rows = load_run(cfg.profile, cfg.case, base=out, seed=cfg.seed)
                return {**summary, "rows": rows}
        if force:
            for f in (summary_file, metrics_file, ckpt_file, d / "model.pt"):
                f.unlink(missing_ok=True)
        _atomic_write(config_file, json.dumps(cfg.as_dict(), indent=2).encode())
    data = data or load()
    model, opt = build(cfg, data.vocab_size, device)
    gen = torch.Generator().manual_seed(cfg.seed)
    rows: list[dict] = []
    rebalances: list[dict] = []
    start, elapsed = 0, 0.0
    if save and ckpt_file.exists():
        ck = torch.load(ckpt_file, map_location="cpu", weights_only=False)  # RNG states must stay on the host
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        torch.set_rng_state(ck["rng"])
        if device.startswith("cuda") and ck.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(ck["cuda_rng"])
        rows, rebalances, start, elapsed = ck["rows"], ck["rebalances"], ck["step"], ck["elapsed"]
        beta0 = ck["beta0"].to(device)
    else:
        beta0 = dynamics.beta(*qk_stack(model))
    tokens_per_step = cfg.batch_size * cfg.block_size
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=cfg.max_iters, initial=start, desc=f"{cfg.profile}/{cfg.case}", unit="step")
    model.train()
    t0 = time.perf_counter()
    t_window, steps_window = t0, 0

    def checkpoint(next_step: int) -> None:
        if not save:
            return
        _atomic_write(metrics_file, "".join(json.dumps(r) + "\n" for r in rows).encode())
        _atomic_save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                      "rng": torch.get_rng_state(),
                      "cuda_rng": torch.cuda.get_rng_state() if device.startswith("cuda") else None,
                      "rows": rows, "rebalances": rebalances, "step": next_step, "beta0": beta0.cpu(),
                      "elapsed": elapsed + time.perf_counter() - t0}, ckpt_file)

    for it in range(start, cfg.max_iters):
        if stop_after is not None and it >= stop_after:
            raise Interrupted(f"stopped before step {it}")
        lr = lr_at(cfg, it)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = data.batch("train", cfg.batch_size, cfg.block_size, gen, device)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        record = metrics and (it % cfg.metric_interval == 0 or it == cfg.max_iters - 1)
        if record:
            Q_old, K_old = qk_stack(model)
            gq, gk = bias_grad_norms(model)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if record:
            Q_new, K_new = qk_stack(model)
            rho = dynamics.unidentified_step_fraction(Q_old, K_old, Q_new - Q_old, K_new - K_old)
            beta_t = dynamics.beta(Q_new, K_new)
            drift = torch.linalg.matrix_norm(beta_t - beta0).norm(dim=-1) / torch.linalg.matrix_norm(beta0).norm(dim=-1)
            row = {"step": it + 1, "lr": lr, "train_loss": loss.item(), "rho": rho.tolist(),
                   "beta_drift": drift.tolist(), "tau": dynamics.tau(Q_new, K_new).tolist(),
                   "grad_bq": gq, "grad_bk": gk, "val_loss": None, "qk_sv": None}
        if cfg.rebalance and (it + 1) % cfg.rebalance_interval == 0:
            xb, yb = data.batch("val", cfg.batch_size, cfg.block_size, torch.Generator().manual_seed(it), device)
            model.eval()
            with torch.no_grad():
                before = model(xb, yb)[1].item()
                rebalance_model(model)
                after = model(xb, yb)[1].item()
            model.train()
            rebalances.append({"step": it + 1, "loss_before": before, "loss_after": after})
        last = it == cfg.max_iters - 1
        if (it + 1) % cfg.eval_interval == 0 or last or it == 0:      # validation loss, with or without metrics
            if not record:
                row = {"step": it + 1, "lr": lr, "train_loss": loss.item()}
            row["val_loss"] = evaluate(model, data, cfg, device, it + 1)
            if metrics:
                Q, K = qk_stack(model)
                row["qk_sv"] = dynamics.qk_singular_values(Q, K).tolist()
            record = True
        if record:
            rows.append(row)
        steps_window += 1
        if bar is not None:
            bar.update(1)
            if steps_window >= 20 or last:
                now = time.perf_counter()
                bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{steps_window * tokens_per_step / (now - t_window):,.0f}")
                t_window, steps_window = now, 0
        if (it + 1) % cfg.ckpt_interval == 0 and not last:
            checkpoint(it + 1)
    if bar is not None:
        bar.close()
    wall = elapsed + time.perf_counter() - t0
    vals = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    summary = {"profile": cfg.profile, "case": cfg.case, "steps": cfg.max_iters, "final_val_loss": vals[-1] if vals else None,
               "final_train_loss": rows[-1]["train_loss"] if rows else loss.item(), "wall_seconds": wall,
               "tokens_per_second": tokens_per_step * (cfg.max_iters - start) / max(time.perf_counter() - t0, 1e-9),
               "device": device if device == "cpu" else torch.cuda.get_device_name(device),
               "torch": torch.__version__, "python": platform.python_version(), "rebalances": rebalances,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if save:
        _atomic_write(metrics_file, "".join(json.dumps(r) + "\n" for r in rows).encode())
        _atomic_write(summary_file, json.dumps(summary, indent=2).encode())
        _atomic_save({"model": model.state_dict(), "gpt_config": vars(model.cfg)}, d / "model.pt")
        ckpt_file.unlink(missing_ok=True)
    summary["rows"] = rows
    return summary


def load_model(profile: str, case: str, base: Path | None = None, seed: int = 0,
               device: str = "cpu") -> GPT:
    """The trained model of a finished run (in eval mode)."""
    f = Path(base or RUNS) / profile / run_name(case, seed) / "model.pt"
    if not f.exists():
        raise FileNotFoundError(f"no trained model at {f}; run `attnid train --profile {profile} --case {case}`")
    ck = torch.load(f, map_location=device, weights_only=False)
    model = GPT(GPTConfig(**ck["gpt_config"])).to(device)
    model.load_state_dict(ck["model"])
    return model.eval()


def load_run(profile: str, case: str, base: Path | None = None, seed: int = 0) -> tuple[dict, list[dict]]:
    """``(summary, rows)`` of a finished run."""
    d = Path(base or RUNS) / profile / run_name(case, seed)
    summary_file = d / "summary.json"
    if not summary_file.exists():
        raise FileNotFoundError(f"no finished run in {d}; run `attnid train --profile {profile} --case {case}`")
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return json.loads(summary_file.read_text()), rows
