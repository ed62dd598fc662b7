"""Training loop of chapter 6 (the paper's §5): nanoGPT on tiny Shakespeare, probed every few steps.

Every ``metric_interval`` steps the :class:`attnid.lm.probe.IdentificationProbe` records the
unidentified-step fraction ρ and the β/τ/bias metrics of that step; every ``eval_interval`` steps
the validation loss and the QK singular values are added. At the end the run analyses its heads
(importance, pruning curve, effective ranks; chapter 7) on fixed seeded batches. The run record
(:mod:`attnid.lm.records`) is written atomically; an interrupted run resumes from its checkpoint and
produces the same rows; a finished one is reused.

Precision (``RunConfig.precision``): ``fp32``; ``tf32`` (TF32 matrix products on CUDA); ``bf16``
(autocast, float32 master weights). The metrics are float64 in every case.
"""

from __future__ import annotations

import contextlib
import io
import math
import platform
import sys
import time
from pathlib import Path

import torch

from .. import __version__, dynamics
from . import records
from .ablation import analyse, fixed_batches
from .data import CharData, load
from .gpt import GPT, GPTConfig
from .probe import IdentificationProbe
from .profiles import RunConfig, resolve_device, resolve_precision
from .records import RecordError


def lr_at(cfg: RunConfig, it: int) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio * lr`` at ``max_iters`` (as in nanoGPT)."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / (cfg.warmup_iters + 1)
    ratio = (it - cfg.warmup_iters) / max(1, cfg.max_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio)))
    return cfg.lr * (cfg.min_lr_ratio + coeff * (1 - cfg.min_lr_ratio))


def build(cfg: RunConfig, vocab_size: int, device: str) -> tuple[GPT, torch.optim.Optimizer]:
    """The float32 model and its optimizer (fused AdamW on CUDA), seeded by ``cfg.seed``."""
    torch.manual_seed(cfg.seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # the model trains in float32 whatever the default
    try:
        model = GPT(cfg.gpt_config(vocab_size)).to(device)
    finally:
        torch.set_default_dtype(default)
    opt: torch.optim.Optimizer
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.0, weight_decay=cfg.weight_decay)
    else:
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr,
            betas=cfg.betas,
            fused=device.startswith("cuda"),
        )
    return model, opt


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
def evaluate(model: GPT, data: CharData, cfg: RunConfig, device: str, step: int) -> float:
    """Mean validation loss over ``eval_iters`` batches from a generator seeded by (seed, step); one host sync."""
    was = model.training
    model.eval()
    gen = torch.Generator().manual_seed(1_000_003 * (cfg.seed + 1) + step)
    losses = [
        model(*data.batch("val", cfg.batch_size, cfg.block_size, gen, device))[1].float() for _ in range(cfg.eval_iters)
    ]
    model.train(was)
    return torch.stack(losses).mean().item()


# ------------------------------------------------------------------------------ the loop
class Interrupted(Exception):
    """A run stopped before its end: on Ctrl-C (the message names the step and the last checkpoint)
    or by ``stop_after`` (tests use it to simulate an interruption). Rerunning resumes it."""


def _check_existing(d: Path, cfg: RunConfig) -> None:
    old = records.read_json(d / "config.json")
    try:
        old_identity = RunConfig.from_dict(old).identity()  # fields added since: their defaults
    except TypeError as e:
        raise RecordError(f"{d / 'config.json'}: not a run config ({e}); rerun with --force") from None
    if old_identity != cfg.identity():
        diff = sorted(k for k in cfg.identity() if old_identity.get(k) != cfg.identity()[k])
        raise RecordError(
            f"{d} holds a run with another config (differs in {', '.join(diff)}); rerun with --force to overwrite it"
        )


def train(
    cfg: RunConfig,
    *,
    out: Path | None = None,
    data: CharData | None = None,
    progress: bool = True,
    metrics: bool = True,
    force: bool = False,
    stop_after: int | None = None,
    save: bool = True,
) -> dict:
    """Run (or resume, or reuse) one training run; returns its summary dict with ``rows`` and ``heads``.

    ``metrics=False`` turns off the probe and the head analysis (for benchmarks); losses are still
    recorded. ``save=False`` writes nothing.
    """
    device = resolve_device(cfg.device)
    precision = resolve_precision(cfg.precision, device)
    d = records.run_dir(cfg.profile, cfg.case, cfg.seed, out)
    if not save:
        return _run(cfg, d, device, precision, data, progress, metrics, stop_after, save=False)
    from filelock import FileLock, Timeout

    lock = FileLock(str(d.parent / f".{d.name}.lock"))
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=0)
    except Timeout:  # (a TimeoutError, so before OSError)
        print(f"attnid: waiting for another process that is training {d} ...", file=sys.stderr, flush=True)
        lock.acquire()
    except OSError as e:
        raise RecordError(
            f"{d.parent}: cannot write run records there ({e.strerror or e}); set ATTNID_RUNS to a writable folder"
        ) from None
    try:
        if not force and ((d / "config.json").exists() or records.is_finished(d)):
            _check_existing(d, cfg)
            if records.is_finished(d):  # finished: reuse
                rec = records.load(d)
                if rec.summary.get("format", 1) < records.FORMAT and "provenance" not in rec.summary:
                    raise RecordError(
                        f"{d / 'summary.json'}: made by an older attnid (record format "
                        f"{rec.summary.get('format', 1)}, now {records.FORMAT}); rerun with --force to redo the run"
                    )
                return {**rec.summary, "rows": rec.rows, "heads": rec.heads}
        if force and d.exists():
            for f in d.iterdir():
                if f.is_file():
                    f.unlink()
        data = data or load()  # checks before any file is written
        d.mkdir(parents=True, exist_ok=True)
        if not (d / "config.json").exists():
            records.write_json(d / "config.json", cfg.as_dict())
        threads = torch.get_num_threads()
        try:
            return _run(cfg, d, device, precision, data, progress, metrics, stop_after, save=True)
        finally:
            torch.set_num_threads(threads)  # a resume may have restored the run's own count
    finally:
        lock.release()


def _run(
    cfg: RunConfig,
    d: Path,
    device: str,
    precision: str,
    data: CharData | None,
    progress: bool,
    metrics: bool,
    stop_after: int | None,
    save: bool,
) -> dict:
    data = data or load()
    model, opt = build(cfg, data.vocab_size, device)
    step_model = torch.compile(model) if cfg.compile and device.startswith("cuda") else model
    gen = torch.Generator().manual_seed(cfg.seed)
    rows: list[dict] = []
    rebalances: list[dict] = []
    start, elapsed, beta0 = 0, 0.0, None
    ckpt_file = d / "checkpoint.pt"
    if save and ckpt_file.exists():
        try:
            ck = torch.load(ckpt_file, map_location="cpu", weights_only=False)  # RNG states stay on the host
        except Exception as e:  # noqa: BLE001  (a damaged pickle raises many types)
            raise RecordError(f"{ckpt_file}: damaged checkpoint ({type(e).__name__}); rerun with --force") from None
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        torch.set_rng_state(ck["rng"])
        if device.startswith("cuda") and ck.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(ck["cuda_rng"])
        rows, rebalances, start, elapsed = ck["rows"], ck["rebalances"], ck["step"], ck["elapsed"]
        beta0 = ck["beta0"].to(device)
        if ck.get("threads") and ck["threads"] != torch.get_num_threads():
            torch.set_num_threads(ck["threads"])  # CPU reductions depend on the thread count: resume exactly
    probe = IdentificationProbe(model, opt, beta0=beta0) if metrics else None
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
        records.write_rows(d, rows)  # readable progress; the checkpoint is what resume uses
        buf = io.BytesIO()
        torch.save(
            {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "gen": gen.get_state(),
                "rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state() if device.startswith("cuda") else None,
                "rows": rows,
                "rebalances": rebalances,
                "step": next_step,
                "beta0": None if probe is None else probe.beta0.cpu(),
                "threads": torch.get_num_threads(),
                "elapsed": elapsed + time.perf_counter() - t0,
            },
            buf,
        )
        records.atomic_write(ckpt_file, buf.getvalue())

    loss = torch.zeros(())
    it, saved = start, start
    try:
        for it in range(start, cfg.max_iters):
            if stop_after is not None and it >= stop_after:
                raise Interrupted(f"stopped before step {it}")
            lr = lr_at(cfg, it)
            for group in opt.param_groups:
                group["lr"] = lr
            x, y = data.batch("train", cfg.batch_size, cfg.block_size, gen, device)
            with precision_context(precision, device):
                _, loss = step_model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            last = it == cfg.max_iters - 1
            step_probe = probe if (it % cfg.metric_interval == 0 or last) else None
            if step_probe is not None:
                step_probe.before_step()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            row: dict | None = None
            if step_probe is not None:
                row = {"step": it + 1, "lr": lr, **step_probe.after_step(train_loss=loss.detach())}
            if cfg.rebalance and (it + 1) % cfg.rebalance_interval == 0:
                xb, yb = data.batch("val", cfg.batch_size, cfg.block_size, torch.Generator().manual_seed(it), device)
                model.eval()
                with torch.no_grad():
                    before = model(xb, yb)[1].item()
                    rebalance_model(model)
                    after = model(xb, yb)[1].item()
                model.train()
                rebalances.append({"step": it + 1, "loss_before": before, "loss_after": after})
            if (it + 1) % cfg.eval_interval == 0 or last or it == 0:  # validation loss, with or without metrics
                if row is None:
                    row = {"step": it + 1, "lr": lr, "train_loss": loss.item()}
                with precision_context(precision, device):
                    row["val_loss"] = evaluate(model, data, cfg, device, it + 1)
                if probe is not None:
                    row["qk_sv"] = probe.qk_singular_values()
            if row is not None:
                rows.append(row)
            steps_window += 1
            if bar is not None:
                bar.update(1)
                if steps_window >= 20 or last:
                    now = time.perf_counter()
                    bar.set_postfix(
                        loss=f"{loss.item():.3f}", tok_s=f"{steps_window * tokens_per_step / (now - t_window):,.0f}"
                    )
                    t_window, steps_window = now, 0
            if (it + 1) % cfg.ckpt_interval == 0 and not last:
                checkpoint(it + 1)
                saved = it + 1
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted at step {it} (last checkpoint: step {saved}); rerun the same command to resume"
        ) from None
    finally:
        if bar is not None:
            bar.close()
    train_seconds = time.perf_counter() - t0
    heads, t_heads = None, time.perf_counter()
    if metrics:  # chapter 7 reads this, never the weights
        batches = fixed_batches(data, cfg.batch_size, cfg.block_size, cfg.head_batches, seed=cfg.seed, device=device)
        sv = next((r["qk_sv"] for r in reversed(rows) if r.get("qk_sv") is not None), None)
        with precision_context(precision, device):
            heads = analyse(model, batches, sv)
    t_heads = time.perf_counter() - t_heads
    wall = elapsed + time.perf_counter() - t0
    vals = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    summary = {
        "profile": cfg.profile,
        "case": cfg.case,
        "seed": cfg.seed,
        "steps": cfg.max_iters,
        "final_val_loss": vals[-1] if vals else None,
        "best_val_loss": min(vals) if vals else None,
        "final_train_loss": rows[-1]["train_loss"] if rows else loss.item(),
        "wall_seconds": wall,
        "head_analysis_seconds": t_heads,
        "tokens_per_second": tokens_per_step * (cfg.max_iters - start) / max(train_seconds, 1e-9),
        "device": device if not device.startswith("cuda") else torch.cuda.get_device_name(device),
        "precision": precision,
        "compile": bool(cfg.compile and device.startswith("cuda")),
        "metrics": metrics,
        "rho_method": "float64 optimizer update",
        "threads": torch.get_num_threads(),
        "attnid": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "rebalances": rebalances,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if save:
        if cfg.save_model:
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "gpt_config": vars(model.cfg)}, buf)
            records.atomic_write(d / "model.pt", buf.getvalue())
        summary = records.finish(d, rows, summary, heads)
    # returned exactly as a reused record reads back (float32-precision numbers)
    return {**summary, "rows": records.round_floats(rows), "heads": records.round_floats(heads)}


def load_model(d: Path, device: str = "cpu") -> GPT:
    """The trained model of a finished run saved with ``save_model=True`` (in eval mode)."""
    f = Path(d) / "model.pt"
    if not f.exists():
        raise FileNotFoundError(f"no trained model at {f}; rerun with save_model=True (`attnid train --save-model`)")
    ck = torch.load(f, map_location=device, weights_only=False)
    model = GPT(GPTConfig(**ck["gpt_config"])).to(device)
    model.load_state_dict(ck["model"])
    return model.eval()
