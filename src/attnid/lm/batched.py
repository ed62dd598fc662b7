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

import copy
from pathlib import Path

import torch

from .data import CharData
from .profiles import RunConfig
from .train import Group, Run, build, make_optimizer, train_runs


def clip_per_seed(params: list[torch.Tensor], max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_`` applied to each seed (leading dim) of stacked gradients."""
    grads = [p.grad for p in params if p.grad is not None]
    S = grads[0].shape[0]
    norms = torch.stack([g.reshape(S, -1).norm(dim=1) for g in grads]).norm(dim=0)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))


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
    return train_runs(
        cfgs,
        stacked_seeds,
        out=out,
        data=data,
        progress=progress,
        metrics=True,
        force=force,
        stop_after=stop_after,
        save=True,
    )


def stacked_seeds(items: list[tuple[RunConfig, Path]], data: CharData, device: str, precision: str) -> Group:
    """The group of several seeds of one config as one stacked model: each seed's model is built (its own init,
    as when trained alone) and becomes a view of its slice of the stack, so that every per-run step of the loop
    (rebalancing, evaluation, head analysis, checkpoint) works on it unchanged; the loss of every seed is
    ``vmap`` of one GPT called with the stacked parameters."""
    cfgs, dirs = [c for c, _ in items], [d for _, d in items]
    cfg = cfgs[0]
    models = [build(c, data.vocab_size, device)[0] for c in cfgs]
    names = [n for n, _ in models[0].named_parameters()]
    stacked = {
        n: torch.stack([dict(m.named_parameters())[n].detach() for m in models]).requires_grad_(True) for n in names
    }
    for s, m in enumerate(models):
        for n, p in m.named_parameters():
            p.data = stacked[n].data[s]
    template = copy.deepcopy(models[0])
    for layer in template.attention_layers():
        layer.math_attention = True

    def loss(p, x, y):
        return torch.func.functional_call(template, p, (x, y))[1]

    batched_loss = torch.func.vmap(loss, randomness="different")
    return Group(
        [Run(c, m, data, device, precision, torch.Generator().manual_seed(c.seed)) for c, m in zip(cfgs, models)],
        dirs,
        make_optimizer(cfg, list(stacked.values()), device, lead=1),
        loss=lambda x, y: batched_loss(stacked, x, y),
        clip=lambda norm: clip_per_seed(list(stacked.values()), norm),
        module=template,
        qk_params=[
            (stacked[f"blocks.{i}.attn.c_attn.weight"], stacked.get(f"blocks.{i}.attn.c_attn.bias"))
            for i in range(cfg.n_layer)
        ],
        stacked=True,
    )
