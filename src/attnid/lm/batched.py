"""Several runs of one model shape trained as one stacked model: the seeds *and* cases of a suite (paper §5 on a GPU).

Every parameter of the ``R`` runs is one tensor ``(R, *shape)`` (:class:`StackedGPT`), and the forward folds the
run dim into the batch of its matrix products (``baddbmm`` with weights ``(R, in, out)``) and of attention
(``scaled_dot_product_attention`` on ``(R·B, H, T, D)``, so that the fused flash kernel applies on a GPU): one
forward, one backward and a few optimizer calls train every run. The runs may differ in what acts elementwise:
seed, optimizer (SGD or AdamW), learning rate, weight decay, betas, gradient clipping and rebalancing
(:data:`PER_RUN`); everything else (the model, the schedule's length, the batches' shape, the intervals) is the
stack's (:func:`stacks` groups a suite by it). The runs are ordered so that those with the same optimizer settings
are adjacent, and each such class is stepped by one torch optimizer over its slice of every stacked tensor
(fused AdamW on CUDA), with its own learning rate from the schedule; gradients are clipped per run.

Each run keeps its own generator of training batches, its probe rows (the probe reads the stacked weights), its
evaluation (all runs' batches in one stacked forward), rebalancing, head analysis, checkpoint and record, all in
the format of a run trained alone (:func:`attnid.lm.train.train`): each run's model is a :class:`~attnid.lm.gpt.GPT`
whose parameters are views of its slice of the stack, and its checkpoint holds the optimizer state of that run
alone, so a record or checkpoint made here is read, resumed (alone or in another stack) and reused exactly like one
of those.

A run's rows equal its rows trained alone to float32 round-off (``tests/test_batched.py``): the stacked products
sum in another order. With dropout each run draws its masks from its own stream, the one it draws from when trained
alone (:func:`attnid.lm.lifecycle.own_rng`), so a stacked run is that run, not another sample of it; the summary
names the runs it was stacked with (``stacked_with``).

Where it pays: on a GPU a small model leaves the device mostly idle, and R runs cost little more than one
(``tools/bench.py --gpu``). On the CPU the cpu profile is compute-bound; there
:func:`attnid.lm.launch.run_suite` runs the runs as parallel one-thread processes instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import records
from .data import CharData
from .gpt import GPT
from .lifecycle import Run, own_rng, rng_state
from .optimizers import build, make_optimizer
from .profiles import RunConfig
from .train import Group, Stepper, train_runs

# what may differ between the runs of one stack (all of it acts elementwise on the parameters, or per run)
PER_RUN = ("profile", "case", "seed", "optimizer", "lr", "weight_decay", "betas", "grad_clip", "rebalance")
# what makes two runs one optimizer class (adjacent in the stack, stepped by one torch optimizer)
OPTIMIZER_FIELDS = ("optimizer", "lr", "weight_decay", "betas")


def stack_key(cfg: RunConfig) -> str:
    """What the runs of one stack share: every field of the config but :data:`PER_RUN` (and the profile's name,
    which only names the folder)."""
    shared = {k: v for k, v in cfg.as_dict().items() if k not in PER_RUN}
    return json.dumps(shared, sort_keys=True)


def stacks(cfgs: list[RunConfig]) -> list[list[RunConfig]]:
    """``cfgs`` split into stacks (:func:`stack_key`), in the order of their first run."""
    out: dict[str, list[RunConfig]] = {}
    for c in cfgs:
        out.setdefault(stack_key(c), []).append(c)
    return list(out.values())


def check_stack(cfgs: list[RunConfig]) -> None:
    """Refuse a stack whose runs differ in more than :data:`PER_RUN` (naming the fields) or repeat a run."""
    ref = json.loads(stack_key(cfgs[0]))
    for c in cfgs[1:]:
        other = json.loads(stack_key(c))
        if other != ref:
            diff = sorted(k for k in ref if other.get(k) != ref[k])
            raise ValueError(
                f"train_stack: the runs differ in {', '.join(diff)}; a stack shares everything but {', '.join(PER_RUN)}"
            )
    names = [(c.profile, records.run_name(c.case, c.seed)) for c in cfgs]
    if len(set(names)) != len(names):
        raise ValueError(f"train_stack: repeated runs {sorted(n for _, n in names)}")


def optimizer_class(cfg: RunConfig) -> str:
    return json.dumps([cfg.as_dict()[k] for k in OPTIMIZER_FIELDS])


class StackedGPT(nn.Module):
    """``R`` :class:`~attnid.lm.gpt.GPT` of one shape as one module: the parameter ``name`` of every run stacked
    into ``(R, *shape)`` (``self.p[name]``; names as in ``GPT.named_parameters()``). ``forward(idx, targets,
    head_mask)`` takes ``(R, B, T)`` token windows and returns each run's mean cross-entropy ``(R,)``; ``head_mask``
    ``(R, n_layer, H)`` removes heads as :func:`attnid.lm.ablation.set_head_mask` does for one model."""

    def __init__(self, models: list[GPT], streams: list[list] | None = None, device: str = "cpu"):
        super().__init__()
        self.cfg, self.R = models[0].cfg, len(models)
        # each run's dropout stream (:func:`attnid.lm.lifecycle.own_rng`), so that its masks are those it would draw
        # alone; None: one stream for the stack (torch's global RNG)
        self.streams, self.device = streams, device
        self.names = [n for n, _ in models[0].named_parameters()]
        each = [dict(m.named_parameters()) for m in models]
        self.stacked = nn.ParameterList(
            nn.Parameter(torch.stack([e[n].detach() for e in each]).contiguous()) for n in self.names
        )
        self.p: dict[str, nn.Parameter] = dict(zip(self.names, self.stacked))

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """``x`` ``(R, N, in)`` through each run's ``nn.Linear`` ``name``: ``(R, N, out)``."""
        W, b = self.p[name + ".weight"], self.p.get(name + ".bias")
        return torch.bmm(x, W.transpose(1, 2)) if b is None else torch.baddbmm(b[:, None], x, W.transpose(1, 2))

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """Each run's ``nn.LayerNorm`` ``name`` over the last dim of ``x`` ``(R, N, E)``."""
        w, b = self.p[name + ".weight"], self.p.get(name + ".bias")
        y = F.layer_norm(x, (x.shape[-1],))
        return y * w[:, None] if b is None else torch.addcmul(b[:, None], y, w[:, None])

    def _per_run(self) -> bool:
        return self.training and self.streams is not None

    def _dropout(self, x: torch.Tensor, drop: float) -> torch.Tensor:
        """Dropout of ``x`` ``(R, B, T, E)``: each run's slice ``(B, T, E)`` from its own stream, as alone."""
        if drop == 0.0 or not self.training:
            return x
        if not self._per_run():
            return F.dropout(x, drop, True)
        assert self.streams is not None
        out = []
        for r in range(self.R):
            with own_rng(self.streams[r], self.device):
                out.append(F.dropout(x[r], drop, True))
        return torch.stack(out)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, drop: float) -> torch.Tensor:
        """Causal attention of ``(R·B, H, T, D)`` queries, keys and values; with dropout, each run's ``(B, H, T, D)``
        on its own stream (the masks it would draw alone)."""
        if drop == 0.0 or not self._per_run():
            return F.scaled_dot_product_attention(q, k, v, dropout_p=drop if self.training else 0.0, is_causal=True)
        assert self.streams is not None
        out = []
        for r, (qr, kr, vr) in enumerate(zip(q.chunk(self.R), k.chunk(self.R), v.chunk(self.R))):
            with own_rng(self.streams[r], self.device):
                out.append(F.scaled_dot_product_attention(qr, kr, vr, dropout_p=drop, is_causal=True))
        return torch.cat(out)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor, head_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Each run's mean loss ``(R,)`` on its own batch: ``idx`` and ``targets`` ``(R, B, T)``, ``head_mask``
        ``(R, L, H)`` (1 keeps a head, 0 removes it)."""
        cfg, p = self.cfg, self.p
        R, B, T = idx.shape
        if cfg.block_size < T:
            raise ValueError(f"sequence length {T} exceeds block_size {cfg.block_size}")
        H, D = cfg.n_head, cfg.head_dim
        assert D is not None  # GPTConfig resolves it
        inner, E = H * D, cfg.n_embd
        drop = cfg.dropout if self.training else 0.0
        wte = p["wte.weight"]  # (R, V, E), tied to the output head as in GPT
        V = wte.shape[1]
        rows = idx + (torch.arange(R, device=idx.device) * V)[:, None, None]  # each run's tokens in its own table
        x = F.embedding(rows, wte.reshape(R * V, E)) + p["wpe.weight"][:, None, :T]  # (R, B, T, E)
        x = self._dropout(x, drop).reshape(R, B * T, E)  # (R, B·T, E)
        for i in range(cfg.n_layer):
            block = f"blocks.{i}."
            qkv = self._linear(self._norm(x, block + "ln_1"), block + "attn.c_attn")  # (R, B·T, 3·H·D)
            q, k, v = (t.reshape(R * B, T, H, D).transpose(1, 2) for t in qkv.split(inner, dim=2))  # (R·B, H, T, D)
            y = self._attend(q, k, v, drop)  # (R·B, H, T, D)
            if head_mask is not None:
                keep = head_mask[:, i].to(y.dtype)  # (R, H)
                y = (y.view(R, B, H, T, D) * keep[:, None, :, None, None]).view(R * B, H, T, D)
            y = y.transpose(1, 2).reshape(R, B * T, inner)  # (R, B·T, H·D)
            x = x + self._dropout(self._linear(y, block + "attn.c_proj").view(R, B, T, E), drop).view(R, B * T, E)
            h = F.gelu(self._linear(self._norm(x, block + "ln_2"), block + "mlp.c_fc"))  # (R, B·T, 4E)
            x = x + self._dropout(self._linear(h, block + "mlp.c_proj").view(R, B, T, E), drop).view(R, B * T, E)
        logits = torch.bmm(self._norm(x, "ln_f"), wte.transpose(1, 2))  # (R, B·T, V)
        losses = F.cross_entropy(logits.reshape(R * B * T, V).float(), targets.reshape(-1), reduction="none")
        return losses.view(R, B * T).mean(1)  # (R,)

    def masked_losses(self, batches: list[tuple[torch.Tensor, torch.Tensor]]):
        """The ``masked_losses`` of :func:`attnid.lm.ablation.analyse_runs` for this stack: ``batches`` of
        ``(R, B, T)`` windows (each run's own fixed batches), mean loss per run over them, in eval mode."""

        @torch.no_grad()
        def losses(mask: np.ndarray | None) -> np.ndarray:
            was = self.training
            self.eval()
            try:
                m = None if mask is None else torch.as_tensor(mask, dtype=torch.float32, device=batches[0][0].device)
                per = torch.stack([self(x, y, m) for x, y in batches])  # (batches, R)
                return per.double().mean(0).cpu().numpy()
            finally:
                self.train(was)

        return losses


def clip_per_run(params: list[torch.Tensor], max_norms: torch.Tensor) -> None:
    """``torch.nn.utils.clip_grad_norm_`` of each run (leading dim) of stacked gradients, to its own ``max_norms``
    ``(R,)`` (0: no clipping for that run)."""
    grads = [p.grad for p in params if p.grad is not None]
    R = grads[0].shape[0]
    norms = torch.stack([g.reshape(R, -1).norm(dim=1) for g in grads]).norm(dim=0)
    coef = torch.where(max_norms > 0, (max_norms / (norms + 1e-6)).clamp(max=1.0), torch.ones_like(norms))
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))


class StackStepper(Stepper):
    """One torch optimizer for the runs ``[start, stop)`` of a stack that share their optimizer settings: its
    parameters are views of their slice of every stacked tensor (and their gradients views of the stacked
    gradients), so that one call steps them all. ``run_state``/``load_run_state`` give and take one run's part
    of its state in the format of that run's own optimizer (:func:`attnid.lm.train.make_optimizer`)."""

    def __init__(self, stack: StackedGPT, runs: list, start: int, stop: int, device: str):
        self.start, self.stop, self.cfg = start, stop, runs[start].cfg
        self.params: dict[str, nn.Parameter] = {}
        for name, P in stack.p.items():
            q = nn.Parameter(torch.empty(0, device=P.device))
            q.data = P.data[start:stop]
            q.grad = P.grad[start:stop]  # type: ignore[index]
            self.params[name] = q
        self.opt = make_optimizer(self.cfg, list(self.params.values()), device, lead=1)
        # each run's own optimizer over its model's parameters (views too), never stepped: the state's format
        self.solo = {
            r: make_optimizer(runs[r].cfg, list(runs[r].model.parameters()), device) for r in range(start, stop)
        }
        self.names = {r: {id(p): n for n, p in runs[r].model.named_parameters()} for r in range(start, stop)}

    def run_state(self, r: int) -> dict:
        """Run ``r``'s optimizer ``state_dict()`` (copies), as its own optimizer would hold it."""
        solo, i = self.solo[r], r - self.start
        for g, group in zip(solo.param_groups, self.opt.param_groups):
            g["lr"] = group["lr"]
        for g in solo.param_groups:
            for p in g["params"]:
                state = self.opt.state.get(self.params[self.names[r][id(p)]], {})
                solo.state[p] = {
                    k: v.clone() if k == "step" or v.dim() == 0 else v[i].clone() for k, v in state.items()
                }
        sd = solo.state_dict()
        solo.state.clear()
        return sd

    def load_run_state(self, r: int, sd: dict) -> None:
        """Put run ``r``'s optimizer ``state_dict()`` (from its checkpoint) into its slice of the stacked state."""
        solo, i = self.solo[r], r - self.start
        solo.load_state_dict(sd)
        for g in solo.param_groups:
            for p in g["params"]:
                q = self.params[self.names[r][id(p)]]
                mine = self.opt.state.setdefault(q, {})
                for k, v in solo.state.get(p, {}).items():
                    if k == "step" or v.dim() == 0:
                        mine[k] = v.clone()
                    else:
                        if k not in mine:
                            mine[k] = torch.zeros_like(q, memory_format=torch.preserve_format)
                        mine[k][i].copy_(v)
        solo.state.clear()


def train_stack(
    cfgs: list[RunConfig],
    *,
    out: Path | None = None,
    data: CharData | None = None,
    progress: bool = True,
    force: bool = False,
    stop_after: int | None = None,
    metrics: bool = True,
    save: bool = True,
    checkpoints: bool = True,
) -> list[dict]:
    """Train (or resume, or reuse) the runs ``cfgs``, which share everything but :data:`PER_RUN`, as one stacked
    model; returns their summaries (with ``rows`` and ``heads``) in the order of ``cfgs``. ``checkpoints=False``:
    no resume points (:func:`attnid.lm.train.train_group`)."""
    if not cfgs:
        return []
    check_stack(cfgs)
    return train_runs(
        cfgs,
        stacked_runs,
        out=out,
        data=data,
        progress=progress,
        metrics=metrics,
        force=force,
        stop_after=stop_after,
        save=save,
        checkpoints=checkpoints,
    )


def stacked_runs(items: list[tuple[RunConfig, Path]], data: CharData, device: str, precision: str):
    """The group of several runs as one stacked model: each run's model is built (its own init, as when trained
    alone) and becomes a view of its slice of the stack, so that every per-run step of the loop (rebalancing,
    checkpoint) works on it unchanged; the runs are ordered by optimizer class (:class:`StackStepper`)."""
    items = sorted(items, key=lambda item: [optimizer_class(c) for c, _ in items].index(optimizer_class(item[0])))
    cfgs = [c for c, _ in items]
    models, streams = [], []
    for c in cfgs:  # each run's dropout stream starts where the run trained alone would start it: after its init
        models.append(build(c, data.vocab_size, device)[0])
        streams.append(rng_state(device))
    stack = StackedGPT(models, streams, device)
    for P in stack.stacked:
        P.grad = torch.zeros_like(P)  # kept for the whole run: every view below reads it
    for s, m in enumerate(models):
        for name, p in m.named_parameters():
            p.data = stack.p[name].data[s]
            p.grad = stack.p[name].grad[s]  # type: ignore[index]
    runs = [
        Run(c, m, data, device, precision, torch.Generator().manual_seed(c.seed), rng=rng)
        for c, m, rng in zip(cfgs, models, streams)
    ]
    steppers, start = [], 0
    for s in range(1, len(runs) + 1):
        if s == len(runs) or optimizer_class(cfgs[s]) != optimizer_class(cfgs[start]):
            steppers.append(StackStepper(stack, runs, start, s, device))
            start = s
    step_model = torch.compile(stack) if cfgs[0].compile else stack  # CUDA only: refused elsewhere
    norms = torch.tensor([c.grad_clip for c in cfgs], device=device)
    return Group(
        runs,
        [d for _, d in items],
        module=stack,
        stacked=True,
        loss=lambda x, y: step_model(x, y),
        steppers=steppers,
        clip=lambda: clip_per_run(list(stack.parameters()), norms),
    )
