"""Launching a suite of training runs with submitit: one job per run, each writing its own record.

* ``inline``: one run after another in the calling process (runs on one GPU time-share it, so
  concurrent processes are no faster there).
* ``local``: every run a submitit job in its own process on this machine, ``parallel`` at a time (the book's
  runs train in worker processes instead, several runs each: :mod:`attnid.lm.workers`).
* ``slurm``: every run a job of one SLURM job array; returns once submitted (``wait=True`` waits).
* ``debug``: submitit's in-process executor (for tests and debugging).

A job calls :func:`run_job`, which trains through :func:`attnid.lm.train.train`, so the per-run lock,
resume and record checks are the same whichever launcher runs it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..interrupts import sigterm_as_interrupt
from .profiles import RunConfig
from .workers import STOP_WAIT_S, LaunchError, Stopped, train_in_workers, trained_line

LAUNCHERS = ("inline", "local", "slurm", "debug")
# A local job's deadline. submitit's local executor kills a job after 2 minutes unless told otherwise (it passes
# the deadline to the job as SUBMITIT_LOCAL_TIMEOUT_S); a cpu run takes half a minute on idle cores and several
# on a busy machine, a paper-scale run hours. A week is no deadline in practice.
LOCAL_TIMEOUT_MIN = 7 * 24 * 60


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux's /proc; none elsewhere)."""
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, children first."""
    out = []
    for child in _children(pid):
        out += [child, *_descendants(child)]
    return out


def stop_jobs(jobs: list) -> list:
    """Stop local submitit jobs (SIGINT: a run saves nothing more and resumes from its last checkpoint), wait for
    them to end (:data:`STOP_WAIT_S`, then SIGKILL) and return those that were still running."""
    running = [j for j in jobs if not j.done()]
    for j in running:
        proc = getattr(j, "_process", None)  # submitit's LocalJob keeps its controller's Popen here
        tasks = _descendants(proc.pid) if proc is not None else []
        if tasks:  # the run itself: its controller then ends on its own, without a traceback on our stderr
            for pid in tasks:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)
        else:
            j.cancel(check=False)
    deadline = time.monotonic() + STOP_WAIT_S
    while any(not j.done() for j in running) and time.monotonic() < deadline:
        time.sleep(0.1)
    for j in running:
        proc = getattr(j, "_process", None)  # submitit's LocalJob keeps its Popen here
        if not j.done() and proc is not None:
            run = _descendants(proc.pid)  # the run too (read while its controller lives): it would outlive it
            proc.kill()  # the controller first: killed after its run, it could end on its own in between
            for pid in run:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
    return running


@dataclass(frozen=True)
class SlurmOptions:
    """What a SLURM user needs to say about each job (the rest of ``sbatch`` goes in ``extra``)."""

    partition: str | None = None
    time_min: int = 120  # wall-clock limit per run
    gpus_per_job: int = 1
    cpus_per_job: int = 8
    mem_gb: int | None = None
    array_parallelism: int = 16  # runs of the array allowed at once
    extra: dict | None = None  # further sbatch options, e.g. {"account": "my-lab", "qos": "high"}

    def __post_init__(self) -> None:
        for k in ("time_min", "cpus_per_job", "array_parallelism"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be a positive integer, got {getattr(self, k)}")
        if self.gpus_per_job < 0:
            raise ValueError(f"gpus_per_job must be non-negative, got {self.gpus_per_job}")


def run_job(config: dict, force: bool = False, threads: int | None = None) -> dict:
    """One run, as a job executes it: train (with ``threads`` CPU threads if given) and return the summary
    (without its rows). Ctrl-C stops it (:func:`stop_jobs` sends SIGINT) even where the suite was started in the
    background, whose children inherit SIGINT ignored."""
    from .data import load
    from .train import train

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    s = train(RunConfig.from_dict(config), data=load(), force=force, progress=False)
    return {k: v for k, v in s.items() if k not in ("rows", "heads")}


def make_executor(launcher: str, folder: str | Path, slurm: SlurmOptions | None = None):
    """A submitit executor for ``launcher`` (``local``, ``slurm`` or ``debug``) logging under ``folder``."""
    try:
        import submitit
    except ImportError as e:  # pragma: no cover - submitit is a dependency
        raise ImportError("the local and slurm launchers need submitit: pip install submitit") from e
    if launcher not in ("local", "slurm", "debug"):
        raise ValueError(f"launcher: expected one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    if launcher == "slurm" and not (shutil.which("srun") and shutil.which("sbatch")):
        raise ValueError("launcher: slurm needs the SLURM commands (srun, sbatch) on this machine's PATH")
    if Path(folder).exists() and not Path(folder).is_dir():
        raise ValueError(f"log-dir: {folder} exists and is not a folder")
    ex = submitit.AutoExecutor(folder=str(folder), cluster=launcher)
    if launcher == "local":
        ex.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN)
    if launcher == "slurm":
        o = slurm or SlurmOptions()
        params = dict(
            timeout_min=o.time_min,
            gpus_per_node=o.gpus_per_job,
            cpus_per_task=o.cpus_per_job,
            tasks_per_node=1,
            nodes=1,
            slurm_array_parallelism=o.array_parallelism,
            name="attnid",
        )
        if o.partition:
            params["slurm_partition"] = o.partition
        if o.mem_gb:
            params["mem_gb"] = o.mem_gb
        if o.extra:
            params["slurm_additional_parameters"] = dict(o.extra)
        ex.update_parameters(**params)
    return ex


def launch(
    configs: Sequence[RunConfig],
    launcher: str = "inline",
    *,
    force: bool = False,
    folder: str | Path | None = None,
    parallel: int = 1,
    slurm: SlurmOptions | None = None,
    wait: bool | None = None,
    report: Callable[[str], None] = print,
    threads: int | None = None,
    progress: bool = True,
) -> list:
    """Run or submit every config. Returns the summaries (``inline``, ``local``, ``debug``, or ``slurm``
    with ``wait``) or the submitted submitit jobs (``slurm``). ``threads``: CPU threads of each local job
    (default: what the job's process picks, :func:`attnid.lm.profiles.default_threads` from the CLI).

    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher: expected one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    if not isinstance(parallel, int) or parallel < 1:
        raise ValueError(f"parallel must be a positive integer, got {parallel!r}")
    n = len(configs)

    def done(i: int, cfg: RunConfig, s: dict) -> dict:
        report(trained_line(i, n, cfg, s))
        return s

    if launcher == "inline":
        from .data import load
        from .train import train

        data = load()
        return [done(i, c, train(c, data=data, force=force, progress=progress)) for i, c in enumerate(configs, 1)]

    if folder is None:
        from .records import runs_root

        folder = runs_root() / ".submitit"
    ex = make_executor(launcher, folder, slurm)
    if launcher == "slurm":
        jobs = _submit_array(ex, configs, force, report, Path(folder))
        return [done(i, c, j.result()) for i, (c, j) in enumerate(zip(configs, jobs), 1)] if wait else jobs

    # local and debug: each run its own job, at most `parallel` at a time
    workers = 1 if launcher == "debug" else parallel
    results = _run_jobs(ex, configs, force, threads, workers, done, report)
    failed = [f"{c.case} seed {c.seed}" for c, r in zip(configs, results) if r is None]
    if failed:
        raise LaunchError(
            f"{len(failed)} of {n} runs did not finish ({', '.join(failed)}; their job logs are in {folder}); "
            "run the same command again: finished runs are reused and stopped ones resume from their checkpoints"
        )
    return results


def _submit_array(ex, configs: Sequence[RunConfig], force: bool, report, folder: Path) -> list:
    """Every config as one job of a SLURM array; ``sbatch``'s refusal is one :class:`LaunchError` line."""
    from submitit.core.utils import FailedJobError

    n = len(configs)
    try:
        jobs = ex.map_array(run_job, [c.as_dict() for c in configs], [force] * n)
    except (FailedJobError, OSError) as e:
        raise LaunchError(f"sbatch refused the array of {n} runs: {str(e).strip().splitlines()[-1]}") from None
    report(f"submitted {n} runs as SLURM array {jobs[0].job_id.split('_')[0]}; logs in {folder.resolve()}")
    return jobs


def _run_jobs(ex, configs: Sequence[RunConfig], force: bool, threads: int | None, workers: int, done, report) -> list:
    """Each config as a submitit job, ``workers`` at a time; a run that did not finish gives ``None`` (and is
    reported). SIGTERM or Ctrl-C stops the running jobs, waits for them and raises :class:`Stopped`."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    n = len(configs)
    submitted: list = []
    lock, stopping = threading.Lock(), threading.Event()

    def one(i: int, cfg: RunConfig) -> dict | None:
        with lock:
            if stopping.is_set():
                return None
            job = ex.submit(run_job, cfg.as_dict(), force, threads)
            submitted.append((cfg, job))
        try:
            return done(i, cfg, job.result())
        except (UncompletedJobError, FailedJobError) as e:
            if stopping.is_set():
                return None
            report(f"[{i}/{n}] {cfg.profile}/{cfg.case} seed {cfg.seed}: did not finish ({job_failure(e)})")
            return None

    pool = ThreadPoolExecutor(max_workers=workers)
    futures = [pool.submit(one, i, c) for i, c in enumerate(configs, 1)]
    try:
        with sigterm_as_interrupt():
            results = [f.result() for f in futures]
    except KeyboardInterrupt as e:
        with lock:
            stopping.set()
            jobs = list(submitted)
        stopped = stop_jobs([j for _, j in jobs])
        pool.shutdown(wait=True, cancel_futures=True)
        names = ", ".join(f"{c.case} seed {c.seed}" for c, j in jobs if j in stopped) or "none"
        raise Stopped(
            f"stopped by {getattr(e, 'signame', 'SIGINT')}: the running jobs ({names}) were stopped and have ended; "
            "run the same command again: finished runs are reused and stopped ones resume from their checkpoints",
            getattr(e, "signame", "SIGINT"),
        ) from None
    pool.shutdown(wait=True)
    return results


def job_failure(e: BaseException) -> str:
    """Why a submitit job did not finish, in one line: submitit's own reason where it gives one (a job killed
    outright "has not produced any output"), not the separator lines of the log it quotes."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    framing = ("Error stream produced", "No error stream produced")  # submitit's words around the log it quotes
    meaningful = [line for line in lines if line.strip("-=_ ") and not line.startswith(framing)]
    reason = next((line for line in meaningful if "has not produced any output" in line), None)
    last = meaningful[-1] if meaningful else "no reason given"
    if reason is None:
        return f"{type(e).__name__}: {last}"
    return f"{type(e).__name__}: {reason}" + (f"; its log ends: {last}" if last != reason else "")


def pending_configs(configs: Sequence[RunConfig], base: Path | None = None) -> list[RunConfig]:
    """The configs without a finished record of the same identity (a record of another config is kept in
    the list, so that training it reports the mismatch)."""
    from . import records

    out = []
    for cfg in configs:
        d = records.run_dir(cfg.profile, cfg.case, cfg.seed, base)
        if records.is_finished(d) and (d / "config.json").is_file():
            try:
                same = RunConfig.from_dict(records.read_json(d / "config.json")).identity() == cfg.identity()
            except (records.RecordError, TypeError):
                same = False
            if same:
                continue
        out.append(cfg)
    return out


def suite_configs(profile: str, suite: str, *, seeds: Sequence[int] | None = None, device: str = "auto") -> list:
    """The configs of ``suite``'s runs at ``profile`` (``seeds``, default the suite's) that have no finished record."""
    from .profiles import SUITES, make_config

    if suite not in SUITES:
        raise ValueError(f"suite: unknown {suite!r}; choose one of {', '.join(SUITES)}")
    seeds = list(SUITES[suite].seeds[profile] if seeds is None else seeds)
    cases = SUITES[suite].cases_at(profile)
    return pending_configs([make_config(profile, c, seed=s, device=device) for s in seeds for c in cases])


def relative_cost(cfg: RunConfig) -> float:
    """A run's training time in arbitrary units, for starting the longest runs first: a step costs each layer its
    width squared and a little per head (small heads run their attention one head at a time), plus a fixed part
    (embedding, head, optimizer), times the tokens of a batch. Fitted to the cpu profile's runs on one core
    (seconds: base 2 x 4 x 64, 2,000 steps, 35; 4 layers 68; heads suite, 1,000 steps, H = 1 17, H = 16 39;
    E = 16 13.7); within 20 % of each."""
    per_layer = cfg.n_embd**2 / 4096 + 0.1 * cfg.n_head
    return cfg.max_iters * cfg.batch_size * cfg.block_size / 1024 * (cfg.n_layer * per_layer + 1.0)


def trains_in_processes(profile: str, device: str = "auto") -> bool:
    """Whether :func:`train_configs` trains ``profile``'s runs as processes of their own: on the CPU beyond the smoke
    profile (smoke runs train inline, each quicker than a process starts; a GPU's runs train as stacked models)."""
    from .profiles import resolve_device

    return profile != "smoke" and resolve_device(device) == "cpu"


def train_configs(
    cfgs: Sequence[RunConfig],
    device: str = "auto",
    *,
    parallel: int | None = None,
    report: Callable[[str], None] = lambda _: None,
) -> int:
    """Train ``cfgs`` (runs of one profile); returns how many.

    On the CPU the runs go ``parallel`` at a time (default: one per core, at most 4), in the order given, in worker
    processes of one thread each (:func:`attnid.lm.workers.train_in_workers`): the cpu profile's small models are
    compute-bound, and two one-thread processes on two cores do about 1.5x the work of one two-thread process. On a
    GPU, where processes time-share the device, the runs of each model shape (seeds and cases) train as one stacked
    model (:mod:`attnid.lm.batched`), the shapes one after another. The smoke profile's runs train inline, one after
    another: each takes less time than a process takes to start."""
    from .profiles import resolve_device

    if not cfgs:
        return 0
    dev = resolve_device(device)
    # one process per core: not the idle cores of the load average, which counts the book's own earlier
    # chapters and would send a suite one run after another
    n = min(4, os.cpu_count() or 1) if parallel is None else parallel
    if dev != "cpu":  # a GPU: the runs of each model shape (seeds and cases) as one stacked model
        from .batched import stacks, train_stack

        for stack in stacks(list(cfgs)):
            for s in train_stack(stack, progress=False):
                report(f"{cfgs[0].profile}/{s['case']} seed {s['seed']}: final val loss {s['final_val_loss']:.4f}")
    elif n < 2 or len(cfgs) < 2 or not trains_in_processes(cfgs[0].profile, dev):
        launch(cfgs, "inline", report=report, progress=False)
    else:
        train_in_workers(cfgs, min(n, len(cfgs)), report=report)
    return len(cfgs)


def run_suite(
    profile: str,
    suite: str,
    *,
    seeds: Sequence[int] | None = None,
    device: str = "auto",
    parallel: int | None = None,
    report: Callable[[str], None] = lambda _: None,
) -> int:
    """Train every run of ``suite`` at ``profile`` (``seeds``, default the suite's) that has no finished record,
    longest first (:func:`relative_cost`: no long run is left alone at the end; :func:`train_configs`); returns how
    many were trained."""
    cfgs = sorted(suite_configs(profile, suite, seeds=seeds, device=device), key=relative_cost, reverse=True)
    return train_configs(cfgs, device, parallel=parallel, report=report)


def trains_here(profile: str, device: str = "auto") -> bool:
    """Whether the runs a chapter reads are trained on this machine at ``profile`` on ``device``: always, except at
    the paper profile without a GPU, where the committed records alone are read."""
    from .profiles import resolve_device

    return profile != "paper" or resolve_device(device).startswith("cuda")


def train_suites(
    profile: str, suites: Sequence[str], device: str = "auto", report: Callable[[str], None] = lambda _: None
) -> int:
    """Train the runs of ``suites`` at ``profile`` that have no finished record (none at the paper profile without a
    GPU), as one launch: suite after suite in the order given (the order in which the book's chapters need them),
    the longest runs of each first (:func:`relative_cost`); returns how many. One launch keeps the cores busy from
    one suite to the next, and a chapter that waits for the first suites executes while the last ones train. The
    book tool calls it before it executes a chapter, so that the chapter reads records that do not change while it
    runs; a chapter run by hand calls it in its first cell."""
    if not trains_here(profile, device):
        return 0
    cfgs = [
        cfg
        for suite in dict.fromkeys(suites)
        for cfg in sorted(suite_configs(profile, suite, device=device), key=relative_cost, reverse=True)
    ]
    return train_configs(cfgs, device, report=report)


def train_in_background(profile: str, suites: Sequence[str], device: str = "auto") -> None:
    """:func:`train_suites` as the book tool's child process runs it while chapters that read none of these runs
    execute: each finished run printed on one line, a stop (SIGTERM, Ctrl-C) ends it with status 143 once its jobs
    have stopped, a failure with its one line on stderr and status 1 (the chapters that read the runs then train
    what is missing themselves, and report it)."""
    import sys

    from .lifecycle import Interrupted

    signal.signal(signal.SIGINT, signal.default_int_handler)

    def report(message: str) -> None:
        print(f"    trained {message}  (in the background)", flush=True)

    try:
        with sigterm_as_interrupt():
            train_suites(profile, suites, device, report=report)
    except (KeyboardInterrupt, Stopped, Interrupted):
        sys.exit(143)
    except Exception as e:  # one line: the chapters that read the runs name it again
        print(f"training in the background failed: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
