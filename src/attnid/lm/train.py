"""Training loop of chapter 6 (the paper's §5): nanoGPT on tiny Shakespeare, probed every few steps.

Every ``metric_interval`` steps the :class:`attnid.lm.probe.IdentificationProbe` records the
unidentified-step fraction ρ and the β/τ/bias metrics of that step; every ``eval_interval`` steps
the validation loss and the QK singular values are added. At the end the run analyses its heads
(importance, pruning curve, effective ranks; chapter 7) on fixed seeded batches. The run record
(:mod:`attnid.lm.records`) is written atomically; an interrupted run resumes from its checkpoint and
produces the same rows; a finished one is reused.

One loop (:func:`train_group`) trains a single run and several seeds stacked into one model
(:mod:`attnid.lm.batched`) alike; :func:`train_runs` is the one place that locks, reuses and prepares run
folders (with :mod:`attnid.lm.lifecycle`). A run's model and optimizer are :mod:`attnid.lm.optimizers`', its
summary :mod:`attnid.lm.summaries`' and its model file :mod:`attnid.lm.model_files`'.

Precision (``RunConfig.precision``): ``fp32``; ``tf32`` (TF32 matrix products on CUDA); ``bf16``
(autocast, float32 master weights). The metrics are float64 in every case.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import dynamics
from ..inputs import printable
from . import records
from .ablation import analyse, fixed_batches
from .data import CharData, load
from .gpt import GPT
from .lifecycle import (
    Checkpoint,
    Interrupted,
    Run,
    _by_checkpoint_step,
    check_checkpoint,
    check_writable,
    forced_dir,
    interrupted,
    prepare_run,
    run_key,
    run_lock,
)
from .metrics import Key
from .model_files import save_model
from .optimizers import build, precision_context
from .probe import IdentificationProbe, optimizer_update
from .profiles import RunConfig, beta_law_factor, check_compile, lr_at, resolve_device, resolve_precision
from .summaries import summarize

# Seeds of the fixed batches a run draws besides its training batches (all offset by the run's seed).
EVAL_SEED = 1_000_003  # the validation batches of the evaluation after step t: EVAL_SEED * (seed + 1) + t
REBALANCE_SEED = 2_000_033  # the batch that checks a rebalance after step t: REBALANCE_SEED * (seed + 1) + t


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
                    f"attnid: note: reusing {d}, made at precision {printable(reused['precision'])} (this run asked "
                    f"for {precision}); rerun with --force to remake it at {precision}",
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
    start, beta0 = _resume(group, metrics) if save else (0, None)
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


def _resume(group: Group, metrics: bool) -> tuple[int, torch.Tensor | None]:
    """Restore the group's runs and optimizer from their checkpoints, if any: ``(first step, β_0 or None)``. Every
    checkpoint is checked whole against its run (:func:`attnid.lm.lifecycle.check_checkpoint`) before any is
    restored."""
    start, beta0 = 0, None
    if (group.dirs[0] / "checkpoint.pt").exists():
        cks = [Checkpoint.load(d / "checkpoint.pt") for d in group.dirs]
        for run, ck, d in zip(group.runs, cks, group.dirs):
            check_checkpoint(d / "checkpoint.pt", ck, run.cfg, run.model, metrics)
        if len({ck.step for ck in cks}) > 1:
            raise records.Refused(f"{group.dirs[0]}: the stacked runs' checkpoints are at different steps")
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
