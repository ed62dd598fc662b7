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
import platform
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from .. import __version__, dynamics
from . import records
from .ablation import analyse, fixed_batches
from .data import CharData, load
from .gpt import GPT, GPTConfig
from .metrics import Key
from .probe import IdentificationProbe
from .profiles import RunConfig, beta_law_factor, lr_at, resolve_device, resolve_precision
from .records import RecordError

# Seeds of the fixed batches a run draws besides its training batches (all offset by the run's seed).
EVAL_SEED = 1_000_003  # the validation batches of the evaluation after step t: EVAL_SEED * (seed + 1) + t
REBALANCE_SEED = 2_000_033  # the batch that checks a rebalance after step t: REBALANCE_SEED * (seed + 1) + t


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
    gen = torch.Generator().manual_seed(EVAL_SEED * (cfg.seed + 1) + step)
    losses = [
        model(*data.batch("val", cfg.batch_size, cfg.block_size, gen, device))[1].float() for _ in range(cfg.eval_iters)
    ]
    model.train(was)
    return torch.stack(losses).mean().item()


# ------------------------------------------------------------------------------ the loop
class Interrupted(Exception):
    """A run stopped before its end: on Ctrl-C (the message names the step and the last checkpoint)
    or by ``stop_after`` (tests use it to simulate an interruption). Rerunning resumes it."""


def interrupted(step: int, saved: int) -> Interrupted:
    """The error of a Ctrl-C inside a loop: where it stopped, and how to resume."""
    return Interrupted(f"interrupted at step {step} (last checkpoint: step {saved}); rerun the same command to resume")


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


@contextlib.contextmanager
def run_lock(d: Path):
    """Hold the lock of run folder ``d`` (another process training it makes this wait, and says so)."""
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
        yield
    finally:
        lock.release()


def prepare_run(cfg: RunConfig, d: Path, force: bool) -> dict | None:
    """With the run's lock held: the finished record of ``cfg`` in ``d`` as :func:`train` returns it, if it
    can be reused; else ``None``, after checking that ``d`` holds no other config (``force``: no check, and
    nothing is reused; the caller trains elsewhere and replaces the record at the end, :func:`forced_dir`)."""
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
    return None


def check_writable(d: Path) -> None:
    """Refuse a run folder that cannot be written before any training (not at its first checkpoint)."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=d, prefix=".write-check-"):
            pass
    except OSError as e:
        raise RecordError(
            f"{d}: cannot write run records there ({e.strerror or e}); set ATTNID_RUNS to a writable folder"
        ) from None


@contextlib.contextmanager
def forced_dir(d: Path, force: bool):
    """The folder a run trains in: ``d`` itself, or with ``force`` and something already in ``d``, a fresh
    temporary folder beside it whose finished record then replaces the old one (only the files a record
    owns; :func:`attnid.lm.records.replace_record`). If the forced run fails or is interrupted, the old
    record stays as it was and the temporary folder is removed; one left by a killed forced run is removed
    the next time the run is trained (the caller holds the run's lock)."""
    import shutil

    # a forced run killed before it could clean up (SIGKILL, a power cut) left its folder: we hold the run's
    # lock, so no live process owns one
    for stale in d.resolve().parent.glob(f".{d.name}.force-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if not (force and d.exists() and any((d / n).exists() for n in records.OWNED_FILES)):
        d.mkdir(parents=True, exist_ok=True)
        yield d
        return
    import tempfile

    work = Path(tempfile.mkdtemp(dir=d.resolve().parent, prefix=f".{d.name}.force-"))
    try:
        yield work
        records.replace_record(work, d)
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
    options: dict[str, Any] = dict(
        device=device, precision=precision, progress=progress, metrics=metrics, stop_after=stop_after
    )
    if not save:
        return _run(cfg, d, data=data, **options, save=False)
    with run_lock(d):
        reused = prepare_run(cfg, d, force)
        if reused is not None:
            if reused.get("precision") not in (None, precision):
                print(
                    f"attnid: note: reusing {d}, made at precision {reused['precision']} (this run asked for "
                    f"{precision}); rerun with --force to remake it at {precision}",
                    file=sys.stderr,
                )
            return reused
        data = data or load()  # checks before any file is written
        with forced_dir(d, force) as work:
            check_writable(work)
            if not (work / "config.json").exists():
                records.write_json(work / "config.json", cfg.as_dict())
            threads = torch.get_num_threads()
            try:
                return _run(cfg, work, data=data, **options, save=True)
            finally:
                torch.set_num_threads(threads)  # a resume may have restored the run's own count


@dataclass
class Checkpoint:
    """Everything a run needs to resume with identical rows (``checkpoint.pt``)."""

    step: int  # the next step to take
    model: dict
    opt: dict
    gen: torch.Tensor  # the training-batch generator
    rng: torch.Tensor  # torch's global RNG (dropout)
    cuda_rng: torch.Tensor | None
    rows: list[dict]
    rebalances: list[dict]
    beta0: torch.Tensor | None  # the probe's initial β
    threads: int  # CPU reductions depend on the thread count
    elapsed: float  # seconds of training before this checkpoint
    history: list = field(default_factory=list)  # [[first step, end step, seeds batched with or None]]

    def save(self, path: Path) -> None:
        buf = io.BytesIO()
        torch.save(vars(self), buf)
        records.atomic_write(path, buf.getvalue())

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        try:
            ck = torch.load(path, map_location="cpu", weights_only=False)  # RNG states stay on the host
            return cls(**{f.name: ck[f.name] for f in fields(cls) if f.name in ck or f.name != "history"})
        except Exception as e:
            raise RecordError(f"{path}: damaged checkpoint ({type(e).__name__}); rerun with --force") from None


@dataclass
class Run:
    """The state the steps of the loop share."""

    cfg: RunConfig
    model: GPT
    opt: torch.optim.Optimizer
    data: CharData
    device: str
    precision: str
    gen: torch.Generator
    probe: IdentificationProbe | None
    rows: list[dict] = field(default_factory=list)
    rebalances: list[dict] = field(default_factory=list)
    elapsed: float = 0.0
    history: list = field(default_factory=list)  # the segments before this process's (Checkpoint.history)
    segment: tuple[int, list[int] | None] = (0, None)  # this process's: first step, seeds batched with

    def history_to(self, step: int) -> list:
        """The training history up to ``step``: earlier segments, then this process's, merged with the last
        one when it was trained the same way."""
        start, seeds = self.segment
        out = [list(h) for h in self.history]
        if out and out[-1][1] == start and out[-1][2] == seeds:
            out[-1][1] = step
        elif step > start:
            out.append([start, step, seeds])
        return out

    def checkpoint(
        self, step: int, seconds: float, *, opt_state: dict | None = None, beta0: torch.Tensor | None = None
    ) -> Checkpoint:
        """The resume point after ``step`` steps. A seed of a stacked model (:mod:`attnid.lm.batched`) passes its
        own slice of the optimizer state and of β_0; its weights are views of the stack, so they are copied."""
        cuda = self.device.startswith("cuda")
        model = self.model.state_dict()
        if opt_state is not None:
            model = {k: v.clone() for k, v in model.items()}  # the slice, not the whole stack
        return Checkpoint(
            step=step,
            model=model,
            opt=self.opt.state_dict() if opt_state is None else opt_state,
            gen=self.gen.get_state(),
            rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state() if cuda else None,
            rows=self.rows,
            rebalances=self.rebalances,
            beta0=beta0 if beta0 is not None else None if self.probe is None else self.probe.beta0.cpu(),
            threads=torch.get_num_threads(),
            elapsed=self.elapsed + seconds,
            history=self.history_to(step),
        )

    def restore(self, ck: Checkpoint, optimizer: bool = True) -> None:
        self.model.load_state_dict(ck.model)
        if optimizer:
            self.opt.load_state_dict(ck.opt)
        self.gen.set_state(ck.gen)
        torch.set_rng_state(ck.rng)
        if self.device.startswith("cuda") and ck.cuda_rng is not None:
            torch.cuda.set_rng_state(ck.cuda_rng)
        self.rows, self.rebalances, self.elapsed, self.history = ck.rows, ck.rebalances, ck.elapsed, ck.history
        if ck.threads and ck.threads != torch.get_num_threads():
            torch.set_num_threads(ck.threads)  # CPU reductions depend on the thread count: resume exactly


# ------------------------------------------------------------------------------ the steps of the loop
def train_step(run: Run, step_model, it: int, probe: IdentificationProbe | None) -> tuple[torch.Tensor, float]:
    """One optimizer step (learning rate, batch, forward, backward, clipping, step); ``probe`` is told
    before and after. Returns the loss and the learning rate."""
    cfg = run.cfg
    lr = lr_at(cfg, it)
    for group in run.opt.param_groups:
        group["lr"] = lr
    x, y = run.data.batch("train", cfg.batch_size, cfg.block_size, run.gen, run.device)
    with precision_context(run.precision, run.device):
        _, loss = step_model(x, y)
    run.opt.zero_grad(set_to_none=True)
    loss.backward()
    if probe is not None:
        probe.before_step()
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip)
    run.opt.step()
    return loss, lr


def rebalance_hook(run: Run, it: int) -> None:
    """Every ``rebalance_interval`` steps (rebalancing cases): rebalance every head, and record the loss of a
    fixed batch (seeded by the run's seed and the step) before and after."""
    cfg = run.cfg
    if not (cfg.rebalance and (it + 1) % cfg.rebalance_interval == 0):
        return
    gen = torch.Generator().manual_seed(REBALANCE_SEED * (cfg.seed + 1) + it + 1)
    xb, yb = run.data.batch("val", cfg.batch_size, cfg.block_size, gen, run.device)
    run.model.eval()
    with torch.no_grad():
        before = run.model(xb, yb)[1].item()
        rebalance_model(run.model)
        after = run.model(xb, yb)[1].item()
    run.model.train()
    run.rebalances.append({"step": it + 1, "loss_before": before, "loss_after": after})


def evaluation_hook(run: Run, it: int, row: dict | None, loss: torch.Tensor, lr: float) -> dict | None:
    """At the first and last step and every ``eval_interval`` steps: the validation loss and, with the probe,
    the QK singular values, added to the step's row (made here if the probe did not record this step)."""
    cfg = run.cfg
    if not ((it + 1) % cfg.eval_interval == 0 or it == cfg.max_iters - 1 or it == 0):
        return row
    if row is None:
        row = {Key.STEP: it + 1, Key.LR: lr, Key.TRAIN_LOSS: loss.item()}
    with precision_context(run.precision, run.device):
        row[Key.VAL_LOSS] = evaluate(run.model, run.data, cfg, run.device, it + 1)
    if run.probe is not None:
        row[Key.QK_SV] = run.probe.qk_singular_values()
    return row


class Progress:
    """A tqdm bar with the loss and tokens/s every 20 steps (or nothing when ``enabled`` is false)."""

    def __init__(self, cfg: RunConfig, start: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=cfg.max_iters, initial=start, desc=f"{cfg.profile}/{cfg.case}", unit="step")
        self.tokens_per_step = cfg.batch_size * cfg.block_size
        self.t_window, self.steps_window = time.perf_counter(), 0

    def update(self, loss: torch.Tensor, last: bool) -> None:
        if self.bar is None:
            return
        self.bar.update(1)
        self.steps_window += 1
        if self.steps_window >= 20 or last:
            now = time.perf_counter()
            tok_s = self.steps_window * self.tokens_per_step / (now - self.t_window)
            self.bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tok_s:,.0f}")
            self.t_window, self.steps_window = now, 0

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def head_analysis(run: Run) -> dict:
    """The end-of-run head analysis (chapter 7 reads it, never the weights) on fixed seeded batches."""
    cfg = run.cfg
    batches = fixed_batches(
        run.data, cfg.batch_size, cfg.block_size, cfg.head_batches, seed=cfg.seed, device=run.device
    )
    sv = next((r[Key.QK_SV] for r in reversed(run.rows) if r.get(Key.QK_SV) is not None), None)
    with precision_context(run.precision, run.device):
        return analyse(run.model, batches, sv)


def summarize(run: Run, *, metrics: bool, train_seconds: float, heads_seconds: float, start: int) -> dict:
    """The summary of a finished run (``summary.json`` without its file list); ``wall_seconds`` is the
    training time of this process plus what the run's checkpoint says came before."""
    cfg, rows, device = run.cfg, run.rows, run.device
    vals = [r[Key.VAL_LOSS] for r in rows if r.get(Key.VAL_LOSS) is not None]
    return {
        "profile": cfg.profile,
        "case": cfg.case,
        "seed": cfg.seed,
        "steps": cfg.max_iters,
        "final_val_loss": vals[-1] if vals else None,
        "best_val_loss": min(vals) if vals else None,
        "final_train_loss": rows[-1][Key.TRAIN_LOSS] if rows else None,
        "wall_seconds": run.elapsed + train_seconds + heads_seconds,
        "head_analysis_seconds": heads_seconds,
        "tokens_per_second": cfg.batch_size * cfg.block_size * (cfg.max_iters - start) / max(train_seconds, 1e-9),
        "device": device if not device.startswith("cuda") else torch.cuda.get_device_name(device),
        "precision": run.precision,
        "compile": bool(cfg.compile and device.startswith("cuda")),
        "metrics": metrics,
        "rho_method": "float64 optimizer update",
        "threads": torch.get_num_threads(),
        "attnid": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "rebalances": run.rebalances,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_description(device),
        "code_commit": records.code_commit(),
        **provenance_of(run.history_to(cfg.max_iters)),
    }


def machine_description(device: str) -> str:
    """E.g. ``"x86_64, 2 cores, AMD EPYC 7B13"``: the machine a run trained on (a summary's provenance)."""
    import os

    name = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    text = f"{platform.machine()}, {os.cpu_count()} cores" + (f", {name}" if name else "")
    if device.startswith("cuda"):
        text += f"; {torch.cuda.get_device_name(device)}"
    return text


def provenance_of(history: list) -> dict:
    """What a summary says of how a run was trained: ``history`` (``[first step, end step, seeds batched with
    or None]`` per segment) and ``batched_seeds``, every seed it was ever batched with (absent if never)."""
    batched = sorted({s for _, _, seeds in history if seeds for s in seeds})
    return {"history": history, **({"batched_seeds": batched} if batched else {})}


def save_model(run: Run, d: Path) -> None:
    """``model.pt``: the trained weights and the model's config (``RunConfig.save_model``)."""
    buf = io.BytesIO()
    torch.save({"model": run.model.state_dict(), "gpt_config": vars(run.model.cfg)}, buf)
    records.atomic_write(d / "model.pt", buf.getvalue())


# ------------------------------------------------------------------------------ the loop
def _run(  # noqa: PLR0915 (reason in the docstring)
    cfg: RunConfig,
    d: Path,
    *,
    device: str,
    precision: str,
    data: CharData | None,
    progress: bool,
    metrics: bool,
    stop_after: int | None,
    save: bool,
) -> dict:
    """The training loop of one run in folder ``d``: steps, evaluation, probe, rebalancing, checkpoints, interrupt.

    Long because the loop's hooks read in their order in one body; one loop shared with the batched seeds is
    open work (issue 27).
    """
    data = data or load()
    model, opt = build(cfg, data.vocab_size, device)
    step_model = torch.compile(model) if cfg.compile and device.startswith("cuda") else model
    run = Run(cfg, model, opt, data, device, precision, torch.Generator().manual_seed(cfg.seed), probe=None)
    ckpt_file = d / "checkpoint.pt"
    start, beta0 = 0, None
    if save and ckpt_file.exists():
        ck = Checkpoint.load(ckpt_file)
        run.restore(ck)
        start, beta0 = ck.step, None if ck.beta0 is None else ck.beta0.to(device)
        run.segment = (start, None)
    run.probe = IdentificationProbe(model, opt, beta0=beta0) if metrics else None
    law = beta_law_factor(cfg)
    bar = Progress(cfg, start, progress)
    model.train()
    t0 = time.perf_counter()
    loss = torch.zeros(())
    it, saved = start, start
    try:
        for it in range(start, cfg.max_iters):
            if stop_after is not None and it >= stop_after:
                raise Interrupted(f"stopped before step {it}")
            last = it == cfg.max_iters - 1
            probe = run.probe if (it % cfg.metric_interval == 0 or last) else None
            loss, lr = train_step(run, step_model, it, probe)
            row = None
            if probe is not None:
                row = {Key.STEP: it + 1, Key.LR: lr, **probe.after_step(law[it + 1], **{Key.TRAIN_LOSS: loss.detach()})}
            rebalance_hook(run, it)
            row = evaluation_hook(run, it, row, loss, lr)
            if row is not None:
                run.rows.append(row)
            bar.update(loss, last)
            if save and (it + 1) % cfg.ckpt_interval == 0 and not last:
                records.write_rows(d, run.rows)  # readable progress; the checkpoint is what resume uses
                run.checkpoint(it + 1, time.perf_counter() - t0).save(ckpt_file)
                saved = it + 1
    except KeyboardInterrupt:
        raise interrupted(it, saved) from None
    finally:
        bar.close()
    train_seconds = time.perf_counter() - t0
    t_heads = time.perf_counter()
    heads = head_analysis(run) if metrics else None
    t_heads = time.perf_counter() - t_heads
    summary = summarize(run, metrics=metrics, train_seconds=train_seconds, heads_seconds=t_heads, start=start)
    rows = run.rows
    if save:
        if cfg.save_model:
            save_model(run, d)
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
