"""``attnid train``, ``attnid data`` and ``attnid experiments``: one training run, the corpus, and a suite of runs
(locally, stacked on one GPU, or through a launcher) (:mod:`attnid.cli`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..inputs import printable
from ..lm.launch import LAUNCHERS, SlurmOptions
from ..lm.profiles import CASES, PRECISIONS, PROFILES
from .commands import add_command
from .common import set_threads, strict_json, threads_arg

SLURM = SlurmOptions()  # the defaults of the slurm options

PROFILE_NAMES = list(PROFILES)


def _run_options(a) -> dict:
    """The execution flags of ``train``/``experiments``; ``--save-model`` only where given (the profile's
    default otherwise: on at smoke and cpu)."""
    save = {} if a.save_model is None else {"save_model": a.save_model}
    return {"precision": a.precision, "compile": a.compile, **save}


def _check_launcher_flags(a) -> None:
    """Refuse launcher options that the chosen launcher would ignore."""
    slurm_only = [
        flag
        for flag, given in (
            ("--partition", a.partition is not None),
            ("--time", a.time != SLURM.time_min),
            ("--gpus-per-job", a.gpus_per_job != SLURM.gpus_per_job),
            ("--cpus-per-job", a.cpus_per_job != SLURM.cpus_per_job),
            ("--mem-gb", a.mem_gb is not None),
            ("--array-parallelism", a.array_parallelism != SLURM.array_parallelism),
            ("--wait", a.wait),
        )
        if given
    ]
    if slurm_only and a.launcher != "slurm":
        raise ValueError(f"launcher: {', '.join(slurm_only)} only apply to --launcher slurm")
    if a.parallel != 1 and a.launcher != "local":
        raise ValueError("parallel: only --launcher local runs several processes at once")
    if a.stacked and a.launcher != "inline":
        raise ValueError("stacked: trains in this process; it cannot be combined with --launcher local|slurm")


def _check_device(a) -> None:
    """The device, and what the execution flags ask of it (``--precision tf32`` and ``--compile`` exist on CUDA
    only), checked before anything trains; the paper profile on the CPU is refused unless asked for by name."""
    from ..lm.profiles import check_compile, resolve_device, resolve_precision

    device = resolve_device(a.device)
    resolve_precision(a.precision, device)
    check_compile(a.compile, device)
    if a.profile == "paper" and device == "cpu":
        if a.device == "auto":
            raise ValueError(
                "device: the paper profile needs a GPU (one run takes about a day on 2 CPU cores); "
                "pass --device cpu to run it on the CPU anyway"
            )
        print("attnid: warning: the paper profile on the CPU takes about a day per run on 2 cores", file=sys.stderr)


def cmd_train(a) -> int:
    from ..lm.profiles import make_config
    from ..lm.train import train

    cfg = make_config(a.profile, a.case, seed=a.seed, device=a.device, **_run_options(a))
    _check_device(a)
    set_threads(a)
    s = train(cfg, force=a.force, progress=not a.json)
    s.pop("rows", None)
    s.pop("heads", None)
    print(
        strict_json(s)
        if a.json
        else f"{a.profile}/{a.case}: final val loss {s['final_val_loss']:.4f}, {s['wall_seconds']:.1f} s, "
        f"{s['tokens_per_second']:,.0f} tokens/s on {printable(s['device'])} ({printable(s['precision'])})"
    )
    return 0


def cmd_data(a) -> int:
    from ..lm.data import corpus_path

    p = corpus_path(a.path)
    if a.json:
        from ..lm.data import sha256

        print(strict_json({"path": str(p), "bytes": p.stat().st_size, "sha256": sha256(p), "verified": True}))
    else:
        print(f"tiny Shakespeare: {p} (sha256 verified)")
    return 0


def cmd_experiments(a) -> int:
    """Every run of a suite, through a launcher (:mod:`attnid.lm.launch`); everything is checked before
    the first run."""
    from ..lm.launch import launch
    from ..lm.profiles import SUITES, check_profile, make_config

    if a.suite not in SUITES:
        raise ValueError(f"suite: unknown {a.suite!r}; choose one of {', '.join(SUITES)}")
    suite = SUITES[a.suite]
    check_profile(a.profile)
    seeds = [a.seed] if a.seed is not None else suite.seeds[a.profile]
    _check_launcher_flags(a)
    cases = suite.cases_at(a.profile)
    cfgs = [make_config(a.profile, c, seed=s, device=a.device, **_run_options(a)) for s in seeds for c in cases]
    slurm = None
    if a.launcher == "slurm":  # the jobs resolve the device on their own nodes
        slurm = SlurmOptions(
            partition=a.partition,
            time_min=a.time,
            gpus_per_job=a.gpus_per_job,
            cpus_per_job=a.cpus_per_job,
            mem_gb=a.mem_gb,
            array_parallelism=a.array_parallelism,
        )
    else:
        _check_device(a)
        set_threads(a)
    out = sys.stderr if a.json else sys.stdout  # --json: the reports go to stderr, the JSON alone to stdout
    summaries: list = []
    if a.stacked:  # (_check_launcher_flags refused it with another launcher)
        from ..lm.batched import stacks, train_stack

        for stack in stacks(cfgs):
            for s in train_stack(stack, force=a.force, progress=True):
                summaries.append(s)
                runs = len(s.get("stacked_with", [0]))
                print(f"{a.profile}/{s['case']} seed {s['seed']}: final val loss {s['final_val_loss']:.4f} "
                      f"({printable(s['precision'])}, stacked with {runs} runs)", file=out, flush=True)  # fmt: skip
    else:
        from ..lm.records import runs_root

        folder = Path(a.log_dir) if a.log_dir else runs_root() / ".submitit"  # make_executor checks it
        summaries = launch(
            cfgs, a.launcher, force=a.force, folder=folder, parallel=a.parallel, slurm=slurm, wait=a.wait,
            report=lambda line: print(line, file=out, flush=True), threads=a.threads,
        )  # fmt: skip
    if a.json:
        done = [s for s in summaries if isinstance(s, dict)]  # (jobs not waited for have no summary yet)
        print(strict_json([{k: v for k, v in s.items() if k not in ("rows", "heads")} for s in done]))
    return 0


def _exec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--precision",
        default="auto",
        choices=PRECISIONS,
        help="auto: bf16 autocast on CUDA, fp32 on the CPU; tf32: CUDA only (the metrics are float64 either way)",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the model (CUDA only; refused elsewhere)")
    p.add_argument(
        "--save-model", action=argparse.BooleanOptionalAction,
        help="write model.pt: the final weights and the attention layers' weights at every evaluation (chapter 10; "
        "default: on at the smoke and cpu profiles)",
    )  # fmt: skip
    threads_arg(p)


def train_parser(sub) -> None:
    """``attnid train``: one run of chapter 6."""
    p = add_command(sub, "train")
    p.add_argument("--profile", default="cpu", choices=PROFILE_NAMES, help="the scale (default: cpu)")
    p.add_argument("--case", default="adamw", help=" | ".join(CASES))
    p.add_argument("--seed", type=int, default=0, help="the run's seed: its init, batches and dropout (default 0)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:n] | mps")
    p.add_argument("--force", action="store_true", help="discard an existing run record and start over")
    _exec_args(p)
    p.add_argument("--json", action="store_true", help="print the run's summary as one JSON object")
    p.set_defaults(func=cmd_train)


def data_parser(sub) -> None:
    """``attnid data``: the corpus."""
    p = add_command(sub, "data")
    p.add_argument("--path", help="a local copy (default: $ATTNID_DATA, else data/tinyshakespeare.txt)")
    p.add_argument("--json", action="store_true", help="print {path, bytes, sha256, verified} as one JSON object")
    p.set_defaults(func=cmd_data)


def experiments_parser(sub) -> None:
    """``attnid experiments``: every run of a suite, inline or through submitit."""
    p = add_command(sub, "experiments")
    p.add_argument("--profile", default="cpu", choices=PROFILE_NAMES, help="the scale (default: cpu)")
    p.add_argument("--suite", default="dynamics", help="dynamics (chapter 6) | heads (chapter 7)")
    p.add_argument("--seed", type=int, default=None, help="one seed (default: the suite's seeds for the profile)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:n] | mps (default auto: cuda if there is one)")
    p.add_argument("--force", action="store_true", help="discard existing run records and train them again")
    p.add_argument(
        "--json", action="store_true", help="print the runs' summaries as one JSON list (reports go to stderr)"
    )
    _exec_args(p)
    g = p.add_argument_group("launcher (submitit: one job per run, each writing its own record)")
    g.add_argument(
        "--launcher",
        default="inline",
        choices=[name for name in LAUNCHERS if name != "debug"],
        help="inline: one run after another in this process (default); local: a process per run on this "
        "machine, with no practical deadline (a week; submitit's own default would kill a job after 2 minutes); "
        "slurm: a SLURM job array (--time per run)",
    )
    g.add_argument("--parallel", type=int, default=1, help="local: runs at once (one GPU gains nothing from more)")
    g.add_argument(
        "--log-dir", help="where submitit keeps job logs and results (default: .submitit in the runs folder)"
    )
    g.add_argument("--partition", help="slurm: partition")
    g.add_argument(
        "--time", type=int, default=SLURM.time_min, help=f"slurm: minutes per run (default {SLURM.time_min})"
    )
    g.add_argument(
        "--gpus-per-job",
        type=int,
        default=SLURM.gpus_per_job,
        help=f"slurm: GPUs per run (default {SLURM.gpus_per_job})",
    )
    g.add_argument(
        "--cpus-per-job",
        type=int,
        default=SLURM.cpus_per_job,
        help=f"slurm: CPU cores per run (default {SLURM.cpus_per_job})",
    )
    g.add_argument("--mem-gb", type=int, help="slurm: memory per run")
    g.add_argument(
        "--array-parallelism", type=int, default=SLURM.array_parallelism, help="slurm: runs of the array at once"
    )
    g.add_argument("--wait", action="store_true", help="slurm: wait for the runs and print their results")
    p.add_argument(
        "--stacked",
        action="store_true",
        help="train the runs of each model shape, seeds and cases, as one stacked model (attnid.lm.batched; pays "
        "on a GPU)",
    )
    p.set_defaults(func=cmd_experiments)
