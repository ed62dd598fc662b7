"""A training run's lifecycle (:mod:`attnid.lm.train`): its folder (checked against the run's config, written
only when writable, locked while it trains, moved aside by ``--force``), its state (:class:`Run`) and its resume
point (:class:`Checkpoint`: everything a run needs to resume with identical rows), and the interruption that
stops it. It ends in a run record (:mod:`attnid.lm.records`)."""

from __future__ import annotations

import contextlib
import io
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from . import records
from .data import CharData
from .gpt import GPT
from .profiles import RunConfig
from .records import RecordError


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
    the next time the run is trained (the caller holds the run's lock), as are the temporary files of a write
    killed before its rename (:func:`attnid.lm.records.atomic_write`)."""
    import shutil

    # a forced run killed before it could clean up (SIGKILL, a power cut) left its folder: we hold the run's
    # lock, so no live process owns one
    for stale in d.resolve().parent.glob(f".{d.name}.force-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in d.glob(".*.tmp") if d.is_dir() else ():  # an atomic write killed before its rename
        stale.unlink(missing_ok=True)
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
        step = Checkpoint.load(ck).step if ck.exists() else 0
        groups.setdefault(step if isinstance(step, int) else -1, []).append((c, d))  # -1: refused on resume
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
            records.check_size(path, records.MAX_TENSOR_BYTES)
            ck = records.load_tensors(path.read_bytes(), path)
            return cls(**{f.name: ck[f.name] for f in fields(cls) if f.name in ck or f.name not in cls.OPTIONAL})
        except records.Refused as e:
            raise records.Refused(f"{e}; rerun with --force to discard it") from None
        except RecordError as e:
            raise RecordError(f"{e}; rerun with --force to discard it") from None
        except Exception as e:
            raise RecordError(f"{path}: damaged checkpoint ({type(e).__name__}); rerun with --force") from None


SNAPSHOT_PARTS = (".attn.", ".ln_1.")  # what Run.snapshots keeps: the attention layers and the norms they read
MAX_THREADS = 1024  # a checkpoint's thread count above this is refused (torch crashes on absurd counts)


def _refuse(path: Path, name: str, why: str) -> records.Refused:
    return records.Refused(f"{path}: field {name!r} {why}; rerun with --force to discard the checkpoint")


def _check_tensors(path: Path, name: str, got, want: dict[str, torch.Tensor]) -> None:
    """``got`` a dict of finite floating tensors with ``want``'s names and shapes
    (:func:`attnid.lm.records.tensors_problem`)."""
    problem = records.tensors_problem(got, {k: tuple(v.shape) for k, v in want.items()})
    if problem is not None:
        kind, key = problem
        why = {"dict": "is not a dict of tensors", "fit": f"does not hold this run's tensors (first: {key})"}
        raise _refuse(path, name, why.get(kind, f"holds {key} that is not a finite float tensor"))


def _check_generator_state(path: Path, name: str, state) -> None:
    """A CPU generator state torch accepts (a uint8 tensor of the right length)."""
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
        raise _refuse(path, name, "is not a generator state (a uint8 tensor)")
    try:
        torch.Generator().set_state(state)
    except (RuntimeError, ValueError, TypeError):
        raise _refuse(path, name, "is not a generator state torch accepts") from None


# the hyperparameters of a parameter group that change the update (SGD's and AdamW's): each must be this run's
OPTIMIZER_MATH = ("weight_decay", "betas", "eps", "momentum", "dampening", "nesterov", "amsgrad", "maximize",
                  "decoupled_weight_decay")  # fmt: skip


def _check_optimizer_state(path: Path, opt, cfg: RunConfig, params: list[torch.Tensor]) -> None:
    """``opt`` in the format of this run's own optimizer (:func:`attnid.lm.optimizers.make_optimizer`): the same
    parameter groups with the config's hyperparameters, and each parameter's state finite and of its shape."""
    from .optimizers import make_optimizer

    fresh = make_optimizer(cfg, params, "cpu")
    want = fresh.state_dict()["param_groups"]
    params = [q for g in fresh.param_groups for q in g["params"]]  # the order the state's indices count in
    groups = opt.get("param_groups") if isinstance(opt, dict) else None
    if not isinstance(groups, list) or len(groups) != len(want) or not isinstance(opt.get("state"), dict):
        raise _refuse(path, "opt", f"is not the state of this run's {cfg.optimizer} optimizer")
    for g, w in zip(groups, want):
        if not isinstance(g, dict) or g.get("params") != w["params"]:
            raise _refuse(path, "opt", "has parameter groups other than this run's")
        for key in OPTIMIZER_MATH:  # what changes the update, not how it is computed (fused, foreach)
            if key in w and g.get(key) != w[key]:
                raise _refuse(path, "opt", f"has {key} {g.get(key)!r}, this run's config {w[key]!r}")
        if not (isinstance(g.get("lr"), (int, float)) and math.isfinite(g["lr"]) and g["lr"] >= 0):
            raise _refuse(path, "opt", "has a learning rate that is not a finite number >= 0")
    for i, state in opt["state"].items():
        if not isinstance(i, int) or not 0 <= i < len(params) or not isinstance(state, dict):
            raise _refuse(path, "opt", f"holds state for a parameter {i!r} this run does not have")
        for k, v in state.items():
            if not isinstance(v, torch.Tensor) or not bool(torch.isfinite(v.double()).all()):
                raise _refuse(path, "opt", f"holds a {k} that is not a finite tensor")
            if v.dim() and v.shape != params[i].shape:
                shapes = f"{tuple(v.shape)} for a parameter of {tuple(params[i].shape)}"
                raise _refuse(path, "opt", f"holds a {k} of shape {shapes}")


def _check_rows(path: Path, ck: Checkpoint, cfg: RunConfig, metrics: bool) -> None:
    """The rows the run had recorded by ``ck.step``: the steps :func:`attnid.lm.records.expected_steps` names, each
    row of JSON numbers (so that the record these rows end in passes the record checks)."""
    intervals = {"max_iters": cfg.max_iters, "metric_interval": cfg.metric_interval, "eval_interval": cfg.eval_interval}
    expected = [s for s in records.expected_steps(intervals, metrics) if s <= ck.step]
    if not isinstance(ck.rows, list) or not all(isinstance(r, dict) for r in ck.rows):
        raise _refuse(path, "rows", "is not a list of rows")
    steps = [r.get("step") for r in ck.rows]
    if steps != expected:
        raise _refuse(path, "rows", f"holds {len(steps)} rows, not the {len(expected)} of steps 1 to {ck.step}")
    try:
        records.encode_rows(ck.rows)
    except (TypeError, ValueError):
        raise _refuse(path, "rows", "holds a value that is not a JSON number or list") from None


def check_checkpoint(path: Path, ck: Checkpoint, cfg: RunConfig, model: GPT, metrics: bool) -> None:
    """Every field of ``ck`` (read from ``path``) checked against the run it would resume (``cfg``, its ``model``)
    before anything is restored: type, range, shape, finiteness, agreement with the config and with the rows.
    :class:`attnid.lm.records.Refused` names the file and the field. Long because it checks fifteen fields."""
    step = ck.step
    if not isinstance(step, int) or isinstance(step, bool) or not 0 < step < cfg.max_iters:
        raise _refuse(path, "step", f"is {step!r}, not a step between 1 and {cfg.max_iters - 1}")
    if step % cfg.ckpt_interval:
        raise _refuse(path, "step", f"is {step}, not a multiple of ckpt_interval={cfg.ckpt_interval}")
    threads = ck.threads
    if not isinstance(threads, int) or isinstance(threads, bool) or not 0 <= threads <= MAX_THREADS:
        raise _refuse(path, "threads", f"is {threads!r}, not a thread count from 0 to {MAX_THREADS}")
    if not isinstance(ck.elapsed, (int, float)) or not math.isfinite(ck.elapsed) or ck.elapsed < 0:
        raise _refuse(path, "elapsed", f"is {ck.elapsed!r}, not a finite number of seconds >= 0")
    weights = model.state_dict()
    _check_tensors(path, "model", ck.model, weights)
    _check_optimizer_state(path, ck.opt, cfg, list(model.parameters()))
    _check_generator_state(path, "gen", ck.gen)
    _check_generator_state(path, "rng", ck.rng)
    if ck.cuda_rng is not None and not (isinstance(ck.cuda_rng, torch.Tensor) and ck.cuda_rng.dtype == torch.uint8):
        raise _refuse(path, "cuda_rng", "is not a generator state (a uint8 tensor)")
    _check_rows(path, ck, cfg, metrics)
    if not isinstance(ck.rebalances, list) or not all(isinstance(r, dict) for r in ck.rebalances):
        raise _refuse(path, "rebalances", "is not a list of objects")
    gc = cfg.gpt_config()
    shape = (gc.n_layer, gc.n_head, gc.head_dim, gc.head_dim)
    beta0 = ck.beta0
    if beta0 is not None and not (
        isinstance(beta0, torch.Tensor) and tuple(beta0.shape) == shape and bool(torch.isfinite(beta0).all())
    ):
        raise _refuse(path, "beta0", f"is not a finite tensor of shape {shape}")
    hist = ck.history
    ok = isinstance(hist, list) and all(
        isinstance(h, list) and len(h) == 3 and all(isinstance(x, int) for x in h[:2]) and 0 <= h[0] <= h[1] <= step
        for h in hist
    )
    if not ok:
        raise _refuse(path, "history", f"is not a list of [first step, end step, runs] within steps 0 to {step}")
    snaps = ck.snapshots
    parts = {k: v for k, v in weights.items() if any(part in k for part in SNAPSHOT_PARTS)}
    if not isinstance(snaps, dict) or not all(isinstance(s, int) and 0 <= s <= step for s in snaps):
        raise _refuse(path, "snapshots", f"is not a dict of steps 0 to {step}")
    for s, snap in snaps.items():
        _check_tensors(path, f"snapshots[{s}]", snap, parts)


def rng_state(device: str) -> list:
    """torch's global RNG where it stands now: ``[CPU state, CUDA state of the device or None]``."""
    return [torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.startswith("cuda") else None]


@contextlib.contextmanager
def own_rng(stream: list, device: str):
    """Run the block on ``stream`` (:func:`rng_state`) in place of torch's global RNG, and keep in ``stream`` where the
    block left it: a stacked run draws its dropout masks as it would alone, from its own stream."""
    saved = rng_state(device)
    torch.set_rng_state(stream[0])
    if stream[1] is not None:
        torch.cuda.set_rng_state(stream[1], device)
    try:
        yield
    finally:
        stream[:] = rng_state(device)
        torch.set_rng_state(saved[0])
        if saved[1] is not None:
            torch.cuda.set_rng_state(saved[1], device)


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
    # a stacked run's own dropout stream, [CPU state, CUDA state or None] (:func:`own_rng`): where torch's global RNG
    # would stand in the run trained alone; None: the run is alone and uses the global RNG itself
    rng: list | None = None

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
            rng=torch.get_rng_state() if self.rng is None else self.rng[0].clone(),
            cuda_rng=(torch.cuda.get_rng_state() if self.rng is None else self.rng[1]) if cuda else None,
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
        cuda_rng = ck.cuda_rng if self.device.startswith("cuda") else None
        if self.rng is not None:  # a stacked run: its own stream resumes where the checkpoint left it
            self.rng[0], self.rng[1] = ck.rng, (self.rng[1] if cuda_rng is None else cuda_rng)
        else:
            torch.set_rng_state(ck.rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state(cuda_rng)
        self.rows, self.rebalances, self.elapsed, self.history = ck.rows, ck.rebalances, ck.elapsed, ck.history
        self.snapshots = ck.snapshots
        if ck.threads and ck.threads != torch.get_num_threads():
            torch.set_num_threads(ck.threads)  # CPU reductions depend on the thread count: resume exactly
