"""Several seeds of one case trained as one batched model (stacked parameters through ``torch.func``).

One process and one optimizer step for all seeds: every parameter is stacked along a leading seed dim
``S``, the loss of every seed is ``torch.func.vmap`` of ``torch.func.functional_call`` of one GPT, and
the optimizer (SGD and AdamW act elementwise) steps all seeds at once; gradient clipping is per seed.
Each seed keeps its own generator of training batches, its probe rows (the probe reads the stacked
weights), evaluation, rebalancing, head analysis, checkpoint and record, all in the format of a run
trained alone (:func:`attnid.lm.train.train`): a record or checkpoint made here is read, resumed and
reused exactly like one of those.

A seed's rows equal its rows trained alone to float32 round-off (``tests/test_batched.py``): the
stacked matrix products sum in another order, and attention under ``vmap`` is written out
(``CausalSelfAttention.math_attention``). With dropout the masks come from one generator for the
whole batch, so a batched run is another (equally valid) sample than the same seed alone; the summary
names the seeds a run was batched with (``batched_seeds``).

Where it pays: on a GPU a small model leaves the device mostly idle, and S seeds cost little more than
one. On the CPU the cpu profile is compute-bound and batching gains nothing (``tools/bench.py --seeds``);
there :func:`attnid.lm.launch.run_suite` runs seeds as parallel one-thread processes instead.
"""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path

import torch

from . import records
from .data import CharData, load
from .metrics import Key
from .probe import IdentificationProbe
from .profiles import RunConfig, beta_law_factor, lr_at, resolve_device, resolve_precision
from .train import (
    Checkpoint,
    Interrupted,
    Progress,
    Run,
    build,
    check_writable,
    evaluation_hook,
    forced_dir,
    head_analysis,
    interrupted,
    make_optimizer,
    precision_context,
    prepare_run,
    rebalance_hook,
    run_lock,
    save_model,
    summarize,
)


def clip_per_seed(params: list[torch.Tensor], max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_`` applied to each seed (leading dim) of stacked gradients."""
    grads = [p.grad for p in params if p.grad is not None]
    S = grads[0].shape[0]
    norms = torch.stack([g.reshape(S, -1).norm(dim=1) for g in grads]).norm(dim=0)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))


def seed_optimizer_state(state: dict, s: int) -> dict:
    """Seed ``s``'s part of a stacked optimizer's ``state_dict()``: the ``state_dict`` of that seed alone."""
    per = {
        i: {k: v if k == "step" or v.dim() == 0 else v[s].clone() for k, v in st.items()}
        for i, st in state["state"].items()
    }
    return {"state": per, "param_groups": copy.deepcopy(state["param_groups"])}


def stack_optimizer_states(states: list[dict]) -> dict:
    """Inverse of :func:`seed_optimizer_state`: the stacked optimizer's ``state_dict`` from the seeds' own."""
    first = states[0]
    per = {
        i: {
            k: v if k == "step" or v.dim() == 0 else torch.stack([sd["state"][i][k] for sd in states])
            for k, v in st.items()
        }
        for i, st in first["state"].items()
    }
    return {"state": per, "param_groups": copy.deepcopy(first["param_groups"])}


def _same_run_but_seed(cfgs: list[RunConfig]) -> None:
    ref = {k: v for k, v in cfgs[0].as_dict().items() if k != "seed"}
    for c in cfgs[1:]:
        other = {k: v for k, v in c.as_dict().items() if k != "seed"}
        if other != ref:
            diff = sorted(k for k in ref if other.get(k) != ref[k])
            raise ValueError(f"train_seeds: the configs differ in more than the seed ({', '.join(diff)})")
    seeds = [c.seed for c in cfgs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"train_seeds: repeated seeds {seeds}")


def train_seeds(
    cfgs: list[RunConfig],
    *,
    out: Path | None = None,
    data: CharData | None = None,
    progress: bool = True,
    force: bool = False,
    stop_after: int | None = None,
) -> list[dict]:
    """Train (or resume, or reuse) the runs ``cfgs``, which differ only in their seed, as one batched
    model; returns their summaries (with ``rows`` and ``heads``) in the order of ``cfgs``."""
    if not cfgs:
        return []
    _same_run_but_seed(cfgs)
    device = resolve_device(cfgs[0].device)
    precision = resolve_precision(cfgs[0].precision, device)
    dirs = [records.run_dir(c.profile, c.case, c.seed, out) for c in cfgs]
    results: dict[int, dict] = {}
    with contextlib.ExitStack() as locks:
        for d in dirs:
            locks.enter_context(run_lock(d))
        todo = []
        for c, d in zip(cfgs, dirs):
            reused = prepare_run(c, d, force)
            if reused is None:
                todo.append((c, d))
            else:
                results[c.seed] = reused
        if todo:
            data = data or load()  # checks before any file is written
            todo = [(c, locks.enter_context(forced_dir(d, force))) for c, d in todo]  # --force: beside d
            for c, d in todo:
                check_writable(d)
                if not (d / "config.json").exists():
                    records.write_json(d / "config.json", c.as_dict())
            groups: dict[int, list] = {}  # seeds resume together only from checkpoints of the same step
            for c, d in todo:
                ck = d / "checkpoint.pt"
                groups.setdefault(Checkpoint.load(ck).step if ck.exists() else 0, []).append((c, d))
            threads = torch.get_num_threads()
            try:
                for group in groups.values():
                    results.update(_run_batched(group, data, device, precision, progress, stop_after))
            finally:
                torch.set_num_threads(threads)
    return [results[c.seed] for c in cfgs]


def _run_batched(  # noqa: C901, PLR0915 (reason in the docstring)
    group: list[tuple[RunConfig, Path]],
    data: CharData,
    device: str,
    precision: str,
    progress: bool,
    stop_after: int | None,
) -> dict[int, dict]:
    """Train a group of seeds of one config as one stacked model, every hook of :func:`attnid.lm.train._run` per
    seed.

    Long because it is the stacked-seeds copy of the training loop; one loop shared with
    :func:`attnid.lm.train._run` is open work (issue 27).
    """
    cfgs, dirs = [c for c, _ in group], [d for _, d in group]
    cfg, S = cfgs[0], len(cfgs)
    models = [build(c, data.vocab_size, device)[0] for c in cfgs]  # each seed's init, as when trained alone
    names = [n for n, _ in models[0].named_parameters()]
    stacked = {
        n: torch.stack([dict(m.named_parameters())[n].detach() for m in models]).requires_grad_(True) for n in names
    }
    for s, m in enumerate(models):  # each seed's model becomes a view of its slice: hooks work on it unchanged
        for n, p in m.named_parameters():
            p.data = stacked[n].data[s]
    opt = make_optimizer(cfg, list(stacked.values()), device, lead=1)
    template = copy.deepcopy(models[0])
    for layer in template.attention_layers():
        layer.math_attention = True
    runs = [
        Run(c, m, opt, data, device, precision, torch.Generator().manual_seed(c.seed), probe=None)
        for c, m in zip(cfgs, models)
    ]
    for run in runs:
        run.segment = (0, [c.seed for c in cfgs])
    start, beta0 = 0, None
    if (dirs[0] / "checkpoint.pt").exists():
        cks = [Checkpoint.load(d / "checkpoint.pt") for d in dirs]
        for run, ck in zip(runs, cks):
            run.restore(ck, optimizer=False)
        opt.load_state_dict(stack_optimizer_states([ck.opt for ck in cks]))
        start = cks[0].step
        for run in runs:
            run.segment = (start, [c.seed for c in cfgs])
        if all(ck.beta0 is not None for ck in cks):
            beta0 = torch.stack([ck.beta0 for ck in cks]).to(device)  # type: ignore[misc]
    qk = [
        (stacked[f"blocks.{i}.attn.c_attn.weight"], stacked.get(f"blocks.{i}.attn.c_attn.bias"))
        for i in range(cfg.n_layer)
    ]
    probe = IdentificationProbe(models[0], opt, beta0=beta0, qk_params=qk)

    def losses_of(p, x, y):
        return torch.func.functional_call(template, p, (x, y))[1]

    batched_loss = torch.func.vmap(losses_of, randomness="different")
    law = beta_law_factor(cfg)
    bar = Progress(cfg, start, progress)
    template.train()
    t0 = time.perf_counter()
    losses = torch.zeros(S)
    it, saved = start, start
    try:
        for it in range(start, cfg.max_iters):
            if stop_after is not None and it >= stop_after:
                raise Interrupted(f"stopped before step {it}")
            last = it == cfg.max_iters - 1
            probing = it % cfg.metric_interval == 0 or last
            lr = lr_at(cfg, it)
            for g in opt.param_groups:
                g["lr"] = lr
            xs, ys = zip(*(data.batch("train", cfg.batch_size, cfg.block_size, run.gen, device) for run in runs))
            with precision_context(precision, device):
                losses = batched_loss(stacked, torch.stack(xs), torch.stack(ys))
            opt.zero_grad(set_to_none=True)
            losses.sum().backward()
            if probing:
                probe.before_step()
            if cfg.grad_clip > 0:
                clip_per_seed(list(stacked.values()), cfg.grad_clip)
            opt.step()
            losses = losses.detach()
            rows: list[dict | None] = [None] * S
            if probing:
                r = probe.after_step(law[it + 1], **{Key.TRAIN_LOSS: losses})
                rows = [{Key.STEP: it + 1, Key.LR: lr, **{k: v[s] for k, v in r.items()}} for s in range(S)]
            sv = None
            for s, run in enumerate(runs):
                rebalance_hook(run, it)
                row = evaluation_hook(run, it, rows[s], losses[s], lr)
                if row is not None:
                    if Key.VAL_LOSS in row:
                        sv = probe.qk_singular_values() if sv is None else sv
                        row[Key.QK_SV] = sv[s]
                    run.rows.append(row)
            bar.update(losses.mean(), last)
            if (it + 1) % cfg.ckpt_interval == 0 and not last:
                state = opt.state_dict()
                for s, (run, d) in enumerate(zip(runs, dirs)):
                    records.write_rows(d, run.rows)
                    run.checkpoint(
                        it + 1,
                        time.perf_counter() - t0,
                        opt_state=seed_optimizer_state(state, s),
                        beta0=probe.beta0[s].cpu(),
                    ).save(d / "checkpoint.pt")
                saved = it + 1
    except KeyboardInterrupt:
        raise interrupted(it, saved) from None
    finally:
        bar.close()
    train_seconds = time.perf_counter() - t0
    out = {}
    for run, d in zip(runs, dirs):
        t_heads = time.perf_counter()
        heads = head_analysis(run)
        t_heads = time.perf_counter() - t_heads
        summary = summarize(run, metrics=True, train_seconds=train_seconds, heads_seconds=t_heads, start=start)
        if run.cfg.save_model:
            save_model(run, d)
        summary = records.finish(d, run.rows, summary, heads)
        out[run.cfg.seed] = {**summary, "rows": records.round_floats(run.rows), "heads": records.round_floats(heads)}
    return out
