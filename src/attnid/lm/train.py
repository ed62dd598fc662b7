"""Training loop of chapter 6 (the paper's §5): nanoGPT on tiny Shakespeare, probed every few steps.

Every ``metric_interval`` steps the :class:`attnid.lm.probe.IdentificationProbe` records the
unidentified-step fraction ρ and the β/τ/bias metrics of that step; every ``eval_interval`` steps
the validation loss and the QK singular values are added. At the end the run analyses its heads
(importance, pruning curve, effective ranks; chapter 7) on fixed seeded batches. The run record
(:mod:`attnid.lm.records`) is written atomically; an interrupted run resumes from its checkpoint and
produces the same rows; a finished one is reused.

One loop (:func:`train_group`) trains a single run and several seeds stacked into one model
(:mod:`attnid.lm.batched`) alike; :func:`train_runs` is the one place that locks, reuses and prepares run
folders.

Precision (``RunConfig.precision``): ``fp32``; ``tf32`` (TF32 matrix products on CUDA); ``bf16``
(autocast, float32 master weights). The metrics are float64 in every case.
"""

from __future__ import annotations

import contextlib
import io
import platform
import sys
import time
from collections.abc import Callable
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
from .probe import IdentificationProbe, optimizer_update
from .profiles import RunConfig, beta_law_factor, check_compile, lr_at, resolve_device, resolve_precision
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


def eval_generator(cfg: RunConfig, step: int) -> torch.Generator:
    """The generator of the validation batches of ``cfg``'s evaluation after ``step`` steps (alone or stacked)."""
    return torch.Generator().manual_seed(EVAL_SEED * (cfg.seed + 1) + step)


@torch.no_grad()
def evaluate(model: GPT, data: CharData, cfg: RunConfig, device: str, step: int) -> float:
    """Mean validation loss over ``eval_iters`` batches from a generator seeded by (seed, step); one host sync."""
    was = model.training
    model.eval()
    gen = eval_generator(cfg, step)
    losses = [
        model(*data.batch("val", cfg.batch_size, cfg.block_size, gen, device))[1].float() for _ in range(cfg.eval_iters)
    ]
    model.train(was)
    return torch.stack(losses).mean().item()


# ------------------------------------------------------------------------------ the loop
class Interrupted(Exception):
    """A run stopped before its end: on Ctrl-C or SIGTERM (the message names the step and the last checkpoint;
    ``signame`` the signal) or by ``stop_after`` (tests use it to simulate an interruption). Rerunning resumes it."""

    signame = "SIGINT"


def interrupted(step: int, saved: int, signame: str = "SIGINT") -> Interrupted:
    """The error of a Ctrl-C (or SIGTERM) inside a loop: where it stopped, and how to resume."""
    e = Interrupted(
        f"interrupted ({signame}) at step {step} (last checkpoint: step {saved}); rerun the same command to resume"
    )
    e.signame = signame
    return e


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
    return train_runs(
        [cfg],
        single_run,
        out=out,
        data=data,
        progress=progress,
        metrics=metrics,
        force=force,
        stop_after=stop_after,
        save=save,
    )[0]


def train_runs(
    cfgs: list[RunConfig],
    build_group: Callable[[list[tuple[RunConfig, Path]], CharData, str, str], Group],
    *,
    out: Path | None,
    data: CharData | None,
    progress: bool,
    metrics: bool,
    force: bool,
    stop_after: int | None,
    save: bool,
    checkpoints: bool = True,
) -> list[dict]:
    """Train (or resume, or reuse) the runs ``cfgs`` with the loop :func:`train_group`; returns their summaries
    (with ``rows`` and ``heads``) in the order of ``cfgs``. The one place that locks the runs' folders, reuses
    finished records, prepares the folders and writes the configs. ``build_group`` makes what one loop trains
    from ``[(config, folder)]``: :func:`single_run` (one run), or the stacked runs of :mod:`attnid.lm.batched`;
    runs that resume do so together only from checkpoints of the same step."""
    device = resolve_device(cfgs[0].device)
    precision = resolve_precision(cfgs[0].precision, device)
    check_compile(cfgs[0].compile, device)
    dirs = [records.run_dir(c.profile, c.case, c.seed, out) for c in cfgs]
    options: dict[str, Any] = dict(
        progress=progress, metrics=metrics, stop_after=stop_after, save=save, checkpoints=checkpoints
    )
    if not save:
        group = build_group(list(zip(cfgs, dirs)), data or load(), device, precision)
        results = train_group(group, **options)
        return [results[run_key(c)] for c in cfgs]
    results = {}
    with contextlib.ExitStack() as locks:
        for d in dirs:
            locks.enter_context(run_lock(d))
        todo = []
        for c, d in zip(cfgs, dirs):
            reused = prepare_run(c, d, force)
            if reused is None:
                todo.append((c, d))
                continue
            if reused.get("precision") not in (None, precision):
                print(
                    f"attnid: note: reusing {d}, made at precision {reused['precision']} (this run asked for "
                    f"{precision}); rerun with --force to remake it at {precision}",
                    file=sys.stderr,
                )
            results[run_key(c)] = reused
        if todo:
            data = data or load()  # checks before any file is written
            todo = [(c, locks.enter_context(forced_dir(d, force))) for c, d in todo]  # --force: beside d
            for c, d in todo:
                check_writable(d)
                if not (d / "config.json").exists():
                    records.write_json(d / "config.json", c.as_dict())
            threads = torch.get_num_threads()
            try:
                for items in _by_checkpoint_step(todo):
                    results.update(train_group(build_group(items, data, device, precision), **options))
            finally:
                torch.set_num_threads(threads)  # a resume may have restored the run's own count
    return [results[run_key(c)] for c in cfgs]


def run_key(cfg: RunConfig) -> str:
    """A run's name in a group (its folder's name: ``case`` or ``case-s<seed>``)."""
    return records.run_name(cfg.case, cfg.seed)


def _by_checkpoint_step(todo: list[tuple[RunConfig, Path]]) -> list[list[tuple[RunConfig, Path]]]:
    """``todo`` in groups whose runs resume from the same step (0: no checkpoint)."""
    if len(todo) == 1:
        return [todo]
    groups: dict[int, list] = {}
    for c, d in todo:
        ck = d / "checkpoint.pt"
        groups.setdefault(Checkpoint.load(ck).step if ck.exists() else 0, []).append((c, d))
    return list(groups.values())


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
    history: list = field(default_factory=list)  # [[first step, end step, runs stacked with or None]]
    snapshots: dict = field(default_factory=dict)  # Run.snapshots

    OPTIONAL = ("history", "snapshots")  # absent from checkpoints written before them

    def save(self, path: Path) -> None:
        buf = io.BytesIO()
        torch.save(vars(self), buf)
        records.atomic_write(path, buf.getvalue())

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        """The checkpoint in ``path``, read without running code (:func:`attnid.lm.records.load_tensors`; RNG
        states stay on the host); :class:`RecordError` naming the file if it is refused or damaged."""
        path = Path(path)
        if path.exists() and not path.is_file():
            raise RecordError(f"{path}: not a regular file; rerun with --force")
        try:
            ck = records.load_tensors(path.read_bytes(), path)
            return cls(**{f.name: ck[f.name] for f in fields(cls) if f.name in ck or f.name not in cls.OPTIONAL})
        except records.Refused as e:
            raise records.Refused(f"{e}; rerun with --force to discard it") from None
        except RecordError as e:
            raise RecordError(f"{e}; rerun with --force to discard it") from None
        except Exception as e:
            raise RecordError(f"{path}: damaged checkpoint ({type(e).__name__}); rerun with --force") from None


SNAPSHOT_PARTS = (".attn.", ".ln_1.")  # what Run.snapshots keeps: the attention layers and the norms they read


@dataclass
class Run:
    """The state of one run that the steps of the loop share (a seed of a stacked group: its model is a view of its
    slice of the stack)."""

    cfg: RunConfig
    model: GPT
    data: CharData
    device: str
    precision: str
    gen: torch.Generator
    rows: list[dict] = field(default_factory=list)
    rebalances: list[dict] = field(default_factory=list)
    elapsed: float = 0.0
    history: list = field(default_factory=list)  # the segments before this process's (Checkpoint.history)
    segment: tuple[int, list | None] = (0, None)  # this process's: first step, runs stacked with
    # with save_model: step -> the attention layers' weights and their LayerNorms' (SNAPSHOT_PARTS), float32 on
    # the CPU, at step 0 and at every evaluation (chapter 10 measures their motion modulo symmetry)
    snapshots: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)

    def snapshot(self, step: int) -> None:
        """Keep the weights of :data:`SNAPSHOT_PARTS` after ``step`` steps (with ``save_model`` only)."""
        if self.cfg.save_model:
            self.snapshots[step] = {
                k: v.detach().to("cpu", torch.float32, copy=True)
                for k, v in self.model.state_dict().items()
                if any(part in k for part in SNAPSHOT_PARTS)
            }

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
        self, step: int, seconds: float, opt_state: dict, beta0: torch.Tensor | None, copy_weights: bool
    ) -> Checkpoint:
        """The resume point after ``step`` steps, with this run's optimizer state and β_0. ``copy_weights``: the
        weights are views of a stack (a seed of a stacked group), so they are copied."""
        cuda = self.device.startswith("cuda")
        model = self.model.state_dict()
        if copy_weights:
            model = {k: v.clone() for k, v in model.items()}  # the slice, not the whole stack
        return Checkpoint(
            step=step,
            model=model,
            opt=opt_state,
            gen=self.gen.get_state(),
            rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state() if cuda else None,
            rows=self.rows,
            rebalances=self.rebalances,
            snapshots=self.snapshots,
            beta0=beta0,
            threads=torch.get_num_threads(),
            elapsed=self.elapsed + seconds,
            history=self.history_to(step),
        )

    def restore(self, ck: Checkpoint) -> None:
        """Everything of ``ck`` but the optimizer state (the group's optimizer holds it: :func:`train_group`)."""
        self.model.load_state_dict(ck.model)
        self.gen.set_state(ck.gen)
        torch.set_rng_state(ck.rng)
        if self.device.startswith("cuda") and ck.cuda_rng is not None:
            torch.cuda.set_rng_state(ck.cuda_rng)
        self.rows, self.rebalances, self.elapsed, self.history = ck.rows, ck.rebalances, ck.elapsed, ck.history
        self.snapshots = ck.snapshots
        if ck.threads and ck.threads != torch.get_num_threads():
            torch.set_num_threads(ck.threads)  # CPU reductions depend on the thread count: resume exactly


class Stepper:
    """One torch optimizer ``opt`` that steps the runs ``[start, stop)`` of a group (``params``: its parameters by
    name) at the learning rate of ``cfg``'s schedule. Run ``r``'s optimizer state is ``run_state(r)`` in the format
    of that run's own optimizer (:class:`attnid.lm.batched.StackStepper` slices a stack's)."""

    cfg: RunConfig
    opt: torch.optim.Optimizer
    start: int
    stop: int
    params: dict

    def set_lr(self, it: int) -> float:
        lr = lr_at(self.cfg, it)
        for g in self.opt.param_groups:
            g["lr"] = lr
        return lr

    def run_state(self, r: int) -> dict:
        return self.opt.state_dict()

    def load_run_state(self, r: int, sd: dict) -> None:
        self.opt.load_state_dict(sd)


class SoloStepper(Stepper):
    """The optimizer of one run trained alone."""

    def __init__(self, cfg: RunConfig, model: GPT, opt: torch.optim.Optimizer):
        self.cfg, self.opt, self.start, self.stop = cfg, opt, 0, 1
        self.params = dict(model.named_parameters())


@dataclass
class Group:
    """What one training loop trains: one run (its model and optimizer), or several runs of one model shape as one
    stacked model (``stacked``; :mod:`attnid.lm.batched`), whose per-run values (a loss, a probe metric, β_0)
    carry the run as their leading dim. ``steppers`` step the runs ``[start, stop)`` each (one for a single run)."""

    runs: list[Run]
    dirs: list[Path]
    module: torch.nn.Module  # GPT, or StackedGPT: what takes the steps (its train mode is set once)
    stacked: bool
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # batches ``([R,] B, T)`` -> loss ``([R])``
    steppers: list
    clip: Callable[[], object]  # clip the gradients to each run's ``grad_clip`` (0: not clipped)

    def part(self, value, s: int):
        """Run ``s``'s part of a per-run value; of a single run, the value itself."""
        return value[s] if self.stacked else value

    def join(self, values: list):
        """The per-run value made of the runs' own; of a single run, its one value."""
        return torch.stack(values) if self.stacked else values[0]

    def zero_grad(self) -> None:
        if self.stacked:  # the stacked gradients stay (the runs' and the steppers' gradients are views of them)
            for P in self.module.parameters():
                P.grad.zero_()  # type: ignore[union-attr]
        else:
            self.steppers[0].opt.zero_grad(set_to_none=True)

    def step(self, it: int) -> list[float]:
        """Every run's optimizer step ``it`` at its learning rate from the schedule; returns those rates by run."""
        lrs: list[float] = []
        for st in self.steppers:
            lrs += [st.set_lr(it)] * (st.stop - st.start)
        for st in self.steppers:
            st.opt.step()
        return lrs

    def qk_params(self) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Each layer's fused ``c_attn`` weight and bias (stacked: ``(R, ...)``), for the probe."""
        params: dict = self.module.p if self.stacked else dict(self.module.named_parameters())  # type: ignore[assignment]
        n_layer = self.runs[0].cfg.n_layer
        return [
            (params[f"blocks.{i}.attn.c_attn.weight"], params.get(f"blocks.{i}.attn.c_attn.bias"))
            for i in range(n_layer)
        ]

    def qk_update(self, i: int, which: str, old: torch.Tensor) -> torch.Tensor:
        """The float64 update the optimizers just applied to layer ``i``'s ``c_attn`` ``which`` ("weight" or "bias")
        (:func:`attnid.lm.probe.optimizer_update`), ``old`` its value before the step."""
        name = f"blocks.{i}.attn.c_attn.{which}"
        if not self.stacked:
            return optimizer_update(self.steppers[0].opt, self.steppers[0].params[name], old)
        parts = [optimizer_update(st.opt, st.params[name], old[st.start : st.stop]) for st in self.steppers]
        return torch.cat(parts)

    def _stepper(self, s: int):
        return next(st for st in self.steppers if st.start <= s < st.stop)

    def optimizer_state(self, s: int) -> dict:
        """Run ``s``'s optimizer ``state_dict()``, as its own optimizer holds it when trained alone."""
        return self._stepper(s).run_state(s)

    def load_optimizer_state(self, s: int, state: dict) -> None:
        self._stepper(s).load_run_state(s, state)

    def names(self) -> list[str] | None:
        """The runs' names when stacked (the summaries' provenance), else ``None``."""
        return sorted(run_key(r.cfg) for r in self.runs) if self.stacked else None


def single_run(items: list[tuple[RunConfig, Path]], data: CharData, device: str, precision: str) -> Group:
    """The group of one run: its model (compiled where ``cfg.compile`` asks: CUDA only, :func:`train_runs`
    refuses it elsewhere) and its optimizer."""
    ((cfg, d),) = items
    model, opt = build(cfg, data.vocab_size, device)
    step_model = torch.compile(model) if cfg.compile else model
    run = Run(cfg, model, data, device, precision, torch.Generator().manual_seed(cfg.seed))

    def clip() -> None:
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)

    return Group(
        [run],
        [d],
        module=model,
        stacked=False,
        loss=lambda x, y: step_model(x, y)[1],
        steppers=[SoloStepper(cfg, model, opt)],
        clip=clip,
    )


# ------------------------------------------------------------------------------ the steps of the loop
def train_step(group: Group, it: int, probe: IdentificationProbe | None) -> tuple[torch.Tensor, list[float]]:
    """One optimizer step of every run of ``group`` (batches, forward, backward, clipping, learning rate, step);
    ``probe`` is told before the step. Returns the detached loss (``(R,)`` when stacked) and each run's learning
    rate."""
    return step_on(group, *draw_batches(group), it, probe)


def draw_batches(group: Group) -> tuple[torch.Tensor, torch.Tensor]:
    """The next training batches ``([R,] B, T)`` of every run, each from its own generator, on the device."""
    run = group.runs[0]
    cfg = run.cfg
    xs, ys = zip(*(r.data.batch("train", cfg.batch_size, cfg.block_size, r.gen) for r in group.runs))
    x, y = (group.join(list(t)).to(run.device, non_blocking=True) for t in (xs, ys))  # one copy for every run
    return x, y


def step_on(
    group: Group, x: torch.Tensor, y: torch.Tensor, it: int, probe: IdentificationProbe | None
) -> tuple[torch.Tensor, list[float]]:
    """:func:`train_step` on the batches ``x, y``."""
    run = group.runs[0]
    with precision_context(run.precision, run.device):
        losses = group.loss(x, y)
    group.zero_grad()
    losses.sum().backward()
    if probe is not None:
        probe.before_step()
    group.clip()
    lrs = group.step(it)
    return losses.detach(), lrs


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


def evaluates_at(cfg: RunConfig, it: int) -> bool:
    """Whether step ``it`` (0-based) is followed by an evaluation: the first, the last and every ``eval_interval``."""
    return (it + 1) % cfg.eval_interval == 0 or it == cfg.max_iters - 1 or it == 0


@torch.no_grad()
def evaluate_group(group: Group, step: int) -> list[float]:
    """Each run's :func:`evaluate` after ``step`` steps; stacked, every run's batches (drawn from its own generator)
    go through one stacked forward."""
    run = group.runs[0]
    with precision_context(run.precision, run.device):
        if not group.stacked:
            return [evaluate(run.model, run.data, run.cfg, run.device, step)]
        cfg, stack = run.cfg, group.module
        gens = [eval_generator(r.cfg, step) for r in group.runs]
        was = stack.training
        stack.eval()
        losses = []
        for _ in range(cfg.eval_iters):
            xs, ys = zip(*(r.data.batch("val", cfg.batch_size, cfg.block_size, g) for r, g in zip(group.runs, gens)))
            losses.append(stack(torch.stack(xs).to(run.device), torch.stack(ys).to(run.device)).float())
        stack.train(was)
        return torch.stack(losses).mean(0).tolist()


class Progress:
    """A tqdm bar with the loss and tokens/s every 20 steps (or nothing when ``enabled`` is false)."""

    def __init__(self, cfg: RunConfig, start: int, enabled: bool, runs: int = 1):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            desc = f"{cfg.profile}/{cfg.case}" if runs == 1 else f"{cfg.profile}: {runs} runs stacked"
            self.bar = tqdm(total=cfg.max_iters, initial=start, desc=desc, unit="step")
        self.tokens_per_step = cfg.batch_size * cfg.block_size * runs
        self.t_window, self.steps_window = time.perf_counter(), 0

    def update(self, loss: torch.Tensor, last: bool) -> None:
        if self.bar is None:
            return
        self.bar.update(1)
        self.steps_window += 1
        if self.steps_window >= 20 or last:
            now = time.perf_counter()
            tok_s = self.steps_window * self.tokens_per_step / (now - self.t_window)
            self.bar.set_postfix(loss=f"{loss.float().mean().item():.3f}", tok_s=f"{tok_s:,.0f}")
            self.t_window, self.steps_window = now, 0

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def head_analyses(group: Group, svs: list) -> list[dict]:
    """Each run's end-of-run head analysis (chapter 7 reads it, never the weights) on fixed batches seeded by its
    seed; stacked, every run's masked losses come from one stacked forward per mask. ``svs``: each run's last QK
    singular values (or ``None``)."""
    from .ablation import analyse_runs

    run = group.runs[0]
    cfg = run.cfg
    per_run = [
        fixed_batches(r.data, cfg.batch_size, cfg.block_size, cfg.head_batches, seed=r.cfg.seed) for r in group.runs
    ]
    with precision_context(run.precision, run.device):
        if not group.stacked:
            batches = [(x.to(run.device), y.to(run.device)) for x, y in per_run[0]]
            return [analyse(run.model, batches, svs[0])]
        batches = [
            (
                torch.stack([b[i][0] for b in per_run]).to(run.device),
                torch.stack([b[i][1] for b in per_run]).to(run.device),
            )
            for i in range(cfg.head_batches)
        ]
        shape = (len(group.runs), cfg.n_layer, cfg.n_head)
        return analyse_runs(group.module.masked_losses(batches), shape, cfg.head_batches, svs)  # type: ignore[operator]


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
        "compile": cfg.compile,
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
    """What a summary says of how a run was trained: ``history`` (``[first step, end step, runs stacked with
    or None]`` per segment) and ``stacked_with``, every run it was ever stacked with, itself included (absent if
    never; records made before cases were stacked name seeds under ``batched_seeds``)."""
    stacked = sorted({str(s) for _, _, names in history if names for s in names})
    return {"history": history, **({"stacked_with": stacked} if stacked else {})}


def save_model(run: Run, d: Path) -> None:
    """``model.pt``: the trained weights, the model's config and the run's snapshots (``RunConfig.save_model``)."""
    buf = io.BytesIO()
    torch.save({"model": run.model.state_dict(), "gpt_config": vars(run.model.cfg), "snapshots": run.snapshots}, buf)
    records.atomic_write(d / "model.pt", buf.getvalue())


# ------------------------------------------------------------------------------ the loop
# the order of a row's keys in a record (the probe's values come in later on a GPU: they are put in place)
ROW_ORDER = (
    Key.STEP, Key.LR, Key.TRAIN_LOSS, Key.RHO, Key.RHO_W, Key.RHO_DIFF, Key.BETA_DRIFT, Key.BETA_LAW, Key.BETA_REL,
    Key.TAU, Key.GRAD_BQ, Key.GRAD_BK, Key.NORM_BQ, Key.NORM_BK, Key.VAL_LOSS, Key.QK_SV,
)  # fmt: skip


class Fills:
    """Rows waiting for values that a :class:`attnid.lm.probe.PendingRow` is computing: each run's row (already in
    its list of rows) gets its part of them, in :data:`ROW_ORDER`."""

    def __init__(self, group: Group):
        self.group = group
        self.waiting: list[tuple] = []

    def add(self, pending, rows: list[dict]) -> None:
        self.waiting.append((pending, rows))

    def drain(self, keep: int = 0) -> None:
        """Fill every waiting row but the ``keep`` newest."""
        while len(self.waiting) > keep:
            pending, rows = self.waiting.pop(0)
            values = pending.result()
            for s, row in enumerate(rows):
                row.update({k: self.group.part(v, s) for k, v in values.items()})
                ordered = sorted(
                    row.items(), key=lambda kv: ROW_ORDER.index(kv[0]) if kv[0] in ROW_ORDER else len(ROW_ORDER)
                )
                row.clear()
                row.update(ordered)


def train_group(
    group: Group, *, progress: bool, metrics: bool, stop_after: int | None, save: bool, checkpoints: bool = True
) -> dict[str, dict]:
    """The training loop (a single run and stacked runs alike): resume, steps (:func:`record_step`), checkpoints,
    interrupt; then each run's head analysis and record in its folder. Returns the summaries (with ``rows`` and
    ``heads``) by run name (:func:`run_key`). ``checkpoints=False`` writes none (a machine that will not see the
    run again: what it computes is the same)."""
    runs = group.runs
    cfg = runs[0].cfg
    start, beta0 = _resume(group) if save else (0, None)
    probe = None
    if metrics:
        background = runs[0].device.startswith("cuda")  # the host part of each row beside the next steps
        probe = IdentificationProbe(cfg.n_head, group.qk_params(), group.qk_update, beta0=beta0, background=background)
    if start == 0:
        for run in runs:
            run.snapshot(0)
    bar = Progress(cfg, start, progress, len(runs))
    group.module.train()
    fills = Fills(group)
    laws = [beta_law_factor(run.cfg) for run in runs]
    t0 = time.perf_counter()
    it, saved = start, start
    try:
        for it in range(start, cfg.max_iters):
            if stop_after is not None and it >= stop_after:
                raise Interrupted(f"stopped before step {it}")
            losses = record_step(group, it, probe, fills, laws)
            last = it == cfg.max_iters - 1
            bar.update(losses, last)
            if save and checkpoints and (it + 1) % cfg.ckpt_interval == 0 and not last:
                fills.drain()
                _save_checkpoints(group, probe, it + 1, time.perf_counter() - t0)
                saved = it + 1
        fills.drain()
    except KeyboardInterrupt as e:
        raise interrupted(it, saved, getattr(e, "signame", "SIGINT")) from None
    finally:
        bar.close()
        if probe is not None:
            probe.close()
    return _finish(group, metrics=metrics, save=save, start=start, train_seconds=time.perf_counter() - t0)


def record_step(
    group: Group, it: int, probe: IdentificationProbe | None, fills: Fills, laws: list[list[float]]
) -> torch.Tensor:
    """Step ``it`` of every run and what it records, in this order: the step (told to the probe on metric steps),
    the probe's row, rebalancing, the evaluation (its row, the snapshot, the QK singular values); the rows go into
    each run's list at once, the probe's values as they come (``fills``). Returns the step's losses."""
    runs, cfg = group.runs, group.runs[0].cfg
    probing = probe is not None and (it % cfg.metric_interval == 0 or it == cfg.max_iters - 1)
    losses, lrs = train_step(group, it, probe if probing else None)
    rows: list[dict] = []
    if probe is not None and probing:
        law = group.join([torch.tensor(law[it + 1], dtype=torch.float64) for law in laws])
        rows = [{Key.STEP: it + 1, Key.LR: lr} for lr in lrs]
        fills.add(probe.after_step(law, **{Key.TRAIN_LOSS: losses}), rows)
        fills.drain(keep=1)
    for run in runs:
        rebalance_hook(run, it)
    if evaluates_at(cfg, it):
        vals = evaluate_group(group, it + 1)
        host_losses = losses.float().cpu().reshape(-1).tolist()
        rows = rows or [{Key.STEP: it + 1, Key.LR: lr, Key.TRAIN_LOSS: x} for lr, x in zip(lrs, host_losses)]
        for row, run, val in zip(rows, runs, vals):
            row[Key.VAL_LOSS] = val
            run.snapshot(it + 1)
        if probe is not None:
            fills.add(probe.qk_singular_values(), rows)
    for run, row in zip(runs, rows):
        run.rows.append(row)
    if not runs[0].device.startswith("cuda"):
        fills.drain()
    return losses


def _resume(group: Group) -> tuple[int, torch.Tensor | None]:
    """Restore the group's runs and optimizer from their checkpoints, if any: ``(first step, β_0 or None)``."""
    start, beta0 = 0, None
    if (group.dirs[0] / "checkpoint.pt").exists():
        cks = [Checkpoint.load(d / "checkpoint.pt") for d in group.dirs]
        for s, (run, ck) in enumerate(zip(group.runs, cks)):
            run.restore(ck)
            group.load_optimizer_state(s, ck.opt)
        start = cks[0].step
        if all(ck.beta0 is not None for ck in cks):
            beta0 = group.join([ck.beta0 for ck in cks]).to(group.runs[0].device)
    for run in group.runs:
        run.segment = (start, group.names())
    return start, beta0


def _save_checkpoints(group: Group, probe: IdentificationProbe | None, step: int, seconds: float) -> None:
    """Each run's rows so far (readable progress) and its checkpoint (what resume uses)."""
    for s, (run, d) in enumerate(zip(group.runs, group.dirs)):
        records.write_rows(d, run.rows)
        beta0 = None if probe is None else group.part(probe.beta0, s).cpu()
        ck = run.checkpoint(step, seconds, group.optimizer_state(s), beta0, copy_weights=group.stacked)
        ck.save(d / "checkpoint.pt")


def _finish(group: Group, *, metrics: bool, save: bool, start: int, train_seconds: float) -> dict[str, dict]:
    """Each run's head analysis, summary and record (``save``), by run name, as a reused record reads back
    (float32-precision numbers)."""
    t_heads = time.perf_counter()
    heads: list[dict | None] = [None] * len(group.runs)
    if metrics:
        svs = [
            next((r[Key.QK_SV] for r in reversed(run.rows) if r.get(Key.QK_SV) is not None), None) for run in group.runs
        ]
        heads = list(head_analyses(group, svs))
    t_heads = (time.perf_counter() - t_heads) / len(group.runs)  # each run's share
    out = {}
    for run, d, h in zip(group.runs, group.dirs, heads):
        summary = summarize(run, metrics=metrics, train_seconds=train_seconds, heads_seconds=t_heads, start=start)
        if save:
            if run.cfg.save_model:
                save_model(run, d)
            summary = records.finish(d, run.rows, summary, h)
        out[run_key(run.cfg)] = {**summary, "rows": records.round_floats(run.rows), "heads": records.round_floats(h)}
    return out


def read_model_file(d: Path) -> tuple[dict, str]:
    """The contents of a finished run's ``model.pt`` and the sha256 of the bytes they were parsed from (what a
    cache of results on this model is keyed by): the file is read once, checked against its record's seal before
    it is parsed and read without running code (:func:`attnid.lm.records.sealed_bytes`,
    :func:`attnid.lm.records.load_tensors`)."""
    f = Path(d) / "model.pt"
    try:
        data, digest = records.sealed_bytes(Path(d), "model.pt")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no trained model at {f}; rerun with save_model=True (`attnid train --save-model`)"
        ) from None
    ck = records.load_tensors(data, f)
    if not (isinstance(ck, dict) and isinstance(ck.get("model"), dict) and isinstance(ck.get("gpt_config"), dict)):
        raise RecordError(f"{f}: not a trained model of attnid (a dict with 'model' and 'gpt_config')")
    return ck, digest


def load_model(d: Path, device: str = "cpu") -> GPT:
    """The trained model of a finished run saved with ``save_model=True`` (in eval mode)."""
    return model_from_file(read_model_file(d)[0], Path(d) / "model.pt", device)


def model_from_file(ck: dict, f: Path, device: str = "cpu") -> GPT:
    """The model (in eval mode) of the contents ``ck`` of ``model.pt`` file ``f`` (:func:`read_model_file`), its
    weights checked against its ``gpt_config`` on the meta device before anything is built."""
    try:
        cfg = GPTConfig(**ck["gpt_config"])
        with torch.device("meta"):  # the shapes its config declares, before anything is allocated
            want = {k: tuple(v.shape) for k, v in GPT(cfg).state_dict().items()}
    except (TypeError, ValueError) as e:  # an unknown config key, a bad value
        raise RecordError(f"{f}: its gpt_config is not a model's ({records.printable(e)})") from None
    got = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else None for k, v in ck["model"].items()}
    if got != want:
        diff = sorted(set(got) ^ set(want)) or sorted(k for k in want if got[k] != want[k])
        raise RecordError(f"{f}: its weights do not fit its gpt_config (first: {records.printable(diff[0])})")
    bad = [k for k, v in ck["model"].items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise RecordError(f"{f}: weights that are not finite in {records.printable(', '.join(bad[:3]))}")
    model = GPT(cfg).to(device)
    model.load_state_dict(ck["model"])
    return model.eval()


def load_snapshots(d: Path) -> tuple[GPTConfig, dict[int, dict[str, torch.Tensor]], str]:
    """The model config and the snapshots (:attr:`Run.snapshots`) kept in a finished run's ``model.pt``, and the
    file's sha256 (:func:`read_model_file`)."""
    f = Path(d) / "model.pt"
    ck, digest = read_model_file(d)
    if not ck.get("snapshots"):
        raise FileNotFoundError(f"{f} keeps no snapshots (written before they were kept); rerun with --force")
    return GPTConfig(**ck["gpt_config"]), ck["snapshots"], digest
