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


def run_job(config: dict, force: bool = False) -> dict:
    """One run, as a job executes it: train and return the summary (without its rows)."""
    from .data import load
    from .train import train

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
    if launcher == "slurm" and not shutil.which("srun"):
        raise ValueError("launcher: slurm needs the SLURM commands (srun, sbatch) on this machine's PATH")
    ex = submitit.AutoExecutor(folder=str(folder), cluster=launcher)
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
    folder: str | Path = "runs/submitit",
    parallel: int = 1,
    slurm: SlurmOptions | None = None,
    wait: bool | None = None,
    report: Callable[[str], None] = print,
) -> list:
    """Run or submit every config. Returns the summaries (``inline``, ``local``, ``debug``, or ``slurm``
    with ``wait``) or the submitted submitit jobs (``slurm``)."""
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
        return [done(i, c, train(c, data=data, force=force, progress=True)) for i, c in enumerate(configs, 1)]

    ex = make_executor(launcher, folder, slurm)
    if launcher == "slurm":
        jobs = ex.map_array(run_job, [c.as_dict() for c in configs], [force] * n)
        report(f"submitted {n} runs as SLURM array {jobs[0].job_id.split('_')[0]}; logs in {Path(folder).resolve()}")
        if not wait:
            return jobs
        return [done(i, c, j.result()) for i, (c, j) in enumerate(zip(configs, jobs), 1)]

    # local and debug: each run its own job, at most `parallel` at a time
    def one(i: int, cfg: RunConfig) -> dict:
        return done(i, cfg, ex.submit(run_job, cfg.as_dict(), force).result())

    with ThreadPoolExecutor(max_workers=1 if launcher == "debug" else parallel) as pool:
        return list(pool.map(one, range(1, n + 1), configs))
