"""Launching a suite of training runs with submitit: one job per run, each writing its own record.

* ``inline``: one run after another in the calling process (runs on one GPU time-share it, so
  concurrent processes are no faster there).
* ``local``: every run a submitit job in its own process on this machine, ``parallel`` at a time.
* ``slurm``: every run a job of one SLURM job array; returns once submitted (``wait=True`` waits).
* ``debug``: submitit's in-process executor (for tests and debugging).

A job calls :func:`run_job`, which trains through :func:`attnid.lm.train.train`, so the per-run lock,
resume and record checks are the same whichever launcher runs it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .profiles import RunConfig

LAUNCHERS = ("inline", "local", "slurm", "debug")
# A local job's deadline. submitit's local executor kills a job after 2 minutes unless told otherwise (it passes
# the deadline to the job as SUBMITIT_LOCAL_TIMEOUT_S); a cpu run takes half a minute on idle cores and several
# on a busy machine, a paper-scale run hours. A week is no deadline in practice.
LOCAL_TIMEOUT_MIN = 7 * 24 * 60


class LaunchError(RuntimeError):
    """Jobs that could not be submitted or did not finish; the message names them and says how to resume."""


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
    (without its rows)."""
    from .data import load
    from .train import train

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

    Long because it checks the launcher's flags, submits, waits and reports in one place, so that no job goes
    unreported.
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher: expected one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    if not isinstance(parallel, int) or parallel < 1:
        raise ValueError(f"parallel must be a positive integer, got {parallel!r}")
    n = len(configs)

    def done(i: int, cfg: RunConfig, s: dict) -> dict:
        report(
            f"[{i}/{n}] {cfg.profile}/{cfg.case} seed {cfg.seed}: final val loss "
            f"{s['final_val_loss']:.4f}, {s['wall_seconds']:.1f} s ({s['precision']})"
        )
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
    from submitit.core.utils import FailedJobError, UncompletedJobError

    if launcher == "slurm":
        try:
            jobs = ex.map_array(run_job, [c.as_dict() for c in configs], [force] * n)
        except (FailedJobError, OSError) as e:
            raise LaunchError(f"sbatch refused the array of {n} runs: {str(e).strip().splitlines()[-1]}") from None
        report(f"submitted {n} runs as SLURM array {jobs[0].job_id.split('_')[0]}; logs in {Path(folder).resolve()}")
        if not wait:
            return jobs
        return [done(i, c, j.result()) for i, (c, j) in enumerate(zip(configs, jobs), 1)]

    # local and debug: each run its own job, at most `parallel` at a time
    def one(i: int, cfg: RunConfig) -> dict | None:
        try:
            return done(i, cfg, ex.submit(run_job, cfg.as_dict(), force, threads).result())
        except (UncompletedJobError, FailedJobError) as e:
            lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
            why = f"{type(e).__name__}: {lines[-1] if lines else 'no reason given'}"
            report(f"[{i}/{n}] {cfg.profile}/{cfg.case} seed {cfg.seed}: did not finish ({why})")
            return None

    with ThreadPoolExecutor(max_workers=1 if launcher == "debug" else parallel) as pool:
        results = list(pool.map(one, range(1, n + 1), configs))
    failed = [f"{c.case} seed {c.seed}" for c, r in zip(configs, results) if r is None]
    if failed:
        raise LaunchError(
            f"{len(failed)} of {n} runs did not finish ({', '.join(failed)}; their job logs are in {folder}); "
            "run the same command again: finished runs are reused and stopped ones resume from their checkpoints"
        )
    return results


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


def run_suite(
    profile: str,
    suite: str,
    *,
    seeds: Sequence[int] | None = None,
    device: str = "auto",
    parallel: int | None = None,
    report: Callable[[str], None] = lambda _: None,
) -> int:
    """Train every run of ``suite`` at ``profile`` (``seeds``, default the suite's) that has no finished record;
    returns how many were trained. What chapters 6 and 7 call.

    On the CPU the runs go ``parallel`` at a time (default: one per core, at most 4) as local processes
    of one thread each: the cpu profile's small models are compute-bound, and two one-thread processes on
    two cores do about 1.5x the work of one two-thread process (``tools/bench.py --only seeds``). On a GPU,
    where processes time-share the device, the seeds of each case train as one batched model
    (:mod:`attnid.lm.batched`) and the cases one after another. The smoke profile's runs train inline, one after
    another: each takes less time than a process takes to start."""
    from .profiles import SUITES, make_config, resolve_device

    if suite not in SUITES:
        raise ValueError(f"suite: unknown {suite!r}; choose one of {', '.join(SUITES)}")
    seeds = list(SUITES[suite].seeds[profile] if seeds is None else seeds)
    cases = SUITES[suite].cases_at(profile)
    cfgs = pending_configs([make_config(profile, c, seed=s, device=device) for s in seeds for c in cases])
    if not cfgs:
        return 0
    import os

    dev = resolve_device(device)
    # one process per core: not the idle cores of the load average, which counts the book's own earlier
    # chapters and would send a suite one run after another
    n = min(4, os.cpu_count() or 1) if parallel is None else parallel
    if dev != "cpu":  # a GPU: the seeds of a case as one batched model, the cases one after another
        from .batched import train_seeds

        for case in dict.fromkeys(c.case for c in cfgs):
            group = [c for c in cfgs if c.case == case]
            for s in train_seeds(group, progress=False):
                report(f"{profile}/{case} seed {s['seed']}: final val loss {s['final_val_loss']:.4f}")
    elif n < 2 or len(cfgs) < 2 or profile == "smoke":
        launch(cfgs, "inline", report=report, progress=False)
    else:
        from . import records

        launch(cfgs, "local", parallel=n, threads=1, folder=records.runs_root() / ".submitit", report=report)
    return len(cfgs)
