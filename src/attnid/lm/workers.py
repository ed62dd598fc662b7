"""The book's runs on the CPU in worker processes of one thread each (:func:`train_in_workers`): each worker imports
torch and reads the corpus once, then takes one run after another; :func:`attnid.lm.launch.train_configs` uses them
beyond the smoke profile."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence

from ..inputs import printable
from ..interrupts import sigterm_as_interrupt
from .profiles import RunConfig


class LaunchError(RuntimeError):
    """Jobs that could not be submitted or did not finish; the message names them and says how to resume."""


class Stopped(LaunchError):
    """A local suite stopped by SIGTERM or Ctrl-C: its running jobs were stopped too and waited for (the message
    says which); ``signame`` is the signal's name."""

    def __init__(self, message: str, signame: str):
        super().__init__(message)
        self.signame = signame


STOP_WAIT_S = 120  # how long a stopped suite waits for its jobs to end before it kills them


def train_in_workers(cfgs: Sequence[RunConfig], workers: int, report: Callable[[str], None] = print) -> list[dict]:
    """Train ``cfgs`` in ``workers`` processes of one CPU thread each, each taking the next run when its last one
    ends (in the order given), torch imported and the corpus read once per process: a process per run (a
    submitit job) cost 3.3 CPU-s more per run on this project's 2-core machine, 130 CPU-s over the cpu book's 40
    runs. Returns the summaries (without their rows), in order. A run that fails is reported in one line and the
    others go on; then :class:`LaunchError` names them. SIGTERM or Ctrl-C stops the running runs (SIGINT: they save
    nothing more and resume from their last checkpoint), waits for them (:data:`STOP_WAIT_S`, then SIGKILL) and
    raises :class:`Stopped`."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # not fork: the caller may hold threads and torch's state
    tasks, results = ctx.Queue(), ctx.Queue()
    for i, cfg in enumerate(cfgs):
        tasks.put((i, cfg.as_dict()))
    stopping = ctx.Event()
    procs = [
        ctx.Process(target=_worker, args=(tasks, results, stopping), name=f"attnid-run-{k}") for k in range(workers)
    ]
    for _ in procs:
        tasks.put(None)  # one end mark per process
    runs = _WorkerRuns(cfgs, report)
    try:
        with sigterm_as_interrupt():
            with _sigint_ignored():  # inherited: a stop while a process starts (imports) ends it, not a traceback
                for p in procs:
                    p.start()
            while any(p.is_alive() for p in procs):
                runs.collect(results, wait_s=1.0)
            runs.collect(results, wait_s=0.0)
    except KeyboardInterrupt as e:
        names = ", ".join(runs.named(sorted(runs.running))) or "none"
        tasks.cancel_join_thread()  # the runs no process took: dropped, so that this process can exit
        _stop_workers(procs, stopping)
        signame = getattr(e, "signame", "SIGINT")
        raise Stopped(
            f"stopped by {signame}: the running jobs ({names}) were stopped and have ended; run the same command "
            "again: finished runs are reused and stopped ones resume from their checkpoints",
            signame,
        ) from None
    for i in list(runs.running):  # its process ended during the run (killed, out of memory)
        runs.take("failed", i, "its process ended during the run")
    missing = [i for i, s in enumerate(runs.out) if s is None]
    if missing:
        raise LaunchError(
            f"{len(missing)} of {len(cfgs)} runs did not finish ({', '.join(runs.named(missing))}); run the same "
            "command again: finished runs are reused and stopped ones resume from their checkpoints"
        )
    return runs.out  # type: ignore[return-value]


class _WorkerRuns:
    """What :func:`train_in_workers` has heard from its processes: the summaries, the runs in training (index ->
    pid), each run reported once as it ends."""

    def __init__(self, cfgs: Sequence[RunConfig], report: Callable[[str], None]):
        self.cfgs, self.report = cfgs, report
        self.out: list[dict | None] = [None] * len(cfgs)
        self.running: dict[int, int] = {}

    def named(self, indices) -> list[str]:
        return [f"{self.cfgs[i].case} seed {self.cfgs[i].seed}" for i in indices]

    def take(self, kind: str, i: int, value) -> None:
        cfg, n = self.cfgs[i], len(self.cfgs)
        if kind == "started":
            self.running[i] = value
            return
        self.running.pop(i, None)
        if kind == "done":
            self.out[i] = value
            self.report(trained_line(i + 1, n, cfg, value))
        else:
            self.report(f"[{i + 1}/{n}] {cfg.profile}/{cfg.case} seed {cfg.seed}: did not finish ({value})")

    def collect(self, results, wait_s: float) -> None:
        """Take every message waiting on ``results``, waiting up to ``wait_s`` for the first."""
        import queue

        try:
            self.take(*results.get(timeout=wait_s) if wait_s else results.get_nowait())
            while True:
                self.take(*results.get_nowait())
        except queue.Empty:
            return


def trained_line(i: int, n: int, cfg: RunConfig, s: dict) -> str:
    return (
        f"[{i}/{n}] {cfg.profile}/{cfg.case} seed {cfg.seed}: final val loss {s['final_val_loss']:.4f}, "
        f"{s['wall_seconds']:.1f} s ({printable(s['precision'])})"
    )


@contextlib.contextmanager
def _sigint_ignored():
    """SIGINT ignored in this block (in the main thread; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _worker(tasks, results, stopping) -> None:
    """One process of :func:`train_in_workers`: runs from ``tasks`` until its end mark or ``stopping`` is set, each
    reported on ``results`` as ``("started", i, pid)``, then ``("done", i, summary)`` or ``("failed", i, reason)``.
    It starts with SIGINT ignored; from here SIGINT (a stop) ends it quietly, the run it was training resumable from
    its last checkpoint."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        import torch

        from ..audit import first_line
        from .data import load
        from .lifecycle import Interrupted
        from .train import train

        torch.set_num_threads(1)
        data = load()
        while not stopping.is_set() and (task := tasks.get()) is not None:
            i, config = task
            results.put(("started", i, os.getpid()))
            try:
                s = train(RunConfig.from_dict(config), data=data, progress=False)
            except Interrupted:  # the stop, turned by the training loop into where to resume
                return
            except Exception as e:  # one line; the other runs go on
                results.put(("failed", i, f"{type(e).__name__}: {printable(first_line(e), 300)}"))
                continue
            results.put(("done", i, {k: v for k, v in s.items() if k not in ("rows", "heads")}))
    except KeyboardInterrupt:
        pass


def _stop_workers(procs: list, stopping) -> None:
    """Stop the processes of :func:`train_in_workers`: ``stopping`` set (one still starting takes no run), SIGINT
    to each live one, then wait (:data:`STOP_WAIT_S`) and kill what is left."""
    stopping.set()
    for p in procs:
        if p.is_alive() and p.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGINT)
    deadline = time.monotonic() + STOP_WAIT_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
