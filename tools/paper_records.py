"""Train as much of the paper-scale suites as fits before a deadline on one GPU, then pack the records.

    python tools/paper_records.py --minutes 8 --pack records.tar.gz        # make paper-records

The plan is a list of ``suite[:seeds]`` items, trained in order (default: chapter 6's seven cases seed by seed,
then chapter 7's head counts with their seeds); each item's runs train as one stacked model per model shape
(:mod:`attnid.lm.batched`), and every record is written as soon as its stack finishes. Before a stack starts,
its wall time is projected from the rate of the stacks already trained in this call (``--rate-ms`` gives one to
start with, e.g. from ``tools/bench.py --gpu``); a stack that would end after the deadline is skipped, not
started, and a stopped stack resumes from its checkpoints when this is run again. Finished records are reused.
``--pack`` writes every finished record of the profile (its JSON and rows, never weights) into one tar.gz, after
every stack and at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tarfile
import time
from pathlib import Path

from bench import project_stack_seconds

from attnid.lm import records
from attnid.lm.batched import stacks, train_stack
from attnid.lm.launch import pending_configs
from attnid.lm.profiles import SUITES, check_compile, make_config, resolve_device

DEFAULT_PLAN = ("dynamics:0", "dynamics:1", "dynamics:2", "heads")
MARGIN_S = 20.0  # kept free before the deadline: packing, a slower stack than projected


class Refused(SystemExit):
    """Bad input to the script (a flag, a bench file): its one line, printed by :func:`main`, and exit status 2."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def plan_configs(item: str, profile: str, device: str, compile: bool = False) -> list:
    """The runs of one plan item ``suite`` (the suite's seeds at ``profile``) or ``suite:s1,s2``."""
    suite, _, seeds = item.partition(":")
    if suite not in SUITES:
        raise Refused(f"paper_records: unknown suite {suite!r} in the plan; choose from {', '.join(SUITES)}")
    if seeds and not all(s.isdigit() for s in seeds.split(",")):
        raise Refused(f"paper_records: plan item {records.printable(item, 60)!r}: seeds are whole numbers >= 0 "
                      "separated by commas (dynamics:0,1)")  # fmt: skip
    chosen = [int(s) for s in seeds.split(",")] if seeds else list(SUITES[suite].seeds[profile])
    cases = SUITES[suite].cases_at(profile)
    return [make_config(profile, c, seed=s, device=device, compile=compile) for s in chosen for c in cases]


BENCH_MAX_BYTES = 2**20  # a bench's JSON is a few KB
# the seconds a stack size's measurements hold: key -> must be > 0 (else >= 0); `ops`, beside them, counts operators
TIMES = {"step_s": True, "plain_step_s": True, "eval_s": False, "heads_s": False, "compile_s": False}


def _refuse_bench(path: Path, why: str) -> Refused:
    return Refused(
        f"paper_records: {records.printable(path, 200)}: {why}; give the JSON of `tools/bench.py --gpu --json`"
    )


def _checked_times(path: Path, R: str, m) -> dict:
    """One stack size's measurements: every time a finite number of seconds, the step's above zero (a zero, negative
    or NaN time would project a stack that cannot finish as one that fits)."""
    if not isinstance(m, dict) or not {"step_s", "eval_s", "heads_s"} <= set(m):
        raise _refuse_bench(path, f"measured[{R!r}] is not {{step_s, eval_s, heads_s[, compile_s]}}")
    ops = m.get("ops")
    if "ops" in m and not (isinstance(ops, int) and not isinstance(ops, bool) and ops > 0):
        raise _refuse_bench(path, f"measured[{R!r}]['ops'] is {records.printable(ops, 40)}, not a count of operators")
    for k, v in m.items():
        if k == "ops":
            continue
        ok = k in TIMES and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < 0 or (TIMES[k] and v == 0):
            bound = "above 0" if TIMES.get(k) else ">= 0"
            key, value = records.printable(k, 40), records.printable(v, 40)
            raise _refuse_bench(path, f"measured[{R!r}][{key!r}] is {value}, not a finite number of seconds {bound}")
    return m


def bench_rates(path: Path, compile: bool) -> dict:
    """The per-stack-size measurements of ``tools/bench.py --gpu --json`` (``{R: {...}}``), checked whole (a regular
    file of at most :data:`BENCH_MAX_BYTES`, JSON, stack sizes >= 1, finite times, the step's above zero), and
    refused when they were measured with another ``--compile`` than this call's (the projection would be off by the
    compilation). Every refusal is one line naming the file."""
    if not path.is_file():
        raise _refuse_bench(path, "not a regular file")
    if path.stat().st_size > BENCH_MAX_BYTES:
        raise _refuse_bench(path, f"more than {BENCH_MAX_BYTES:,} bytes")
    try:
        bench = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _refuse_bench(path, f"not JSON ({records.printable(e, 80)})") from None
    if not isinstance(bench, dict) or not isinstance(bench.get("measured"), dict) or not bench["measured"]:
        raise _refuse_bench(path, "holds no 'measured' object of stack sizes")
    if not isinstance(bench.get("compiled", False), bool):
        raise _refuse_bench(path, "its 'compiled' is not true or false")
    if bench.get("compiled", False) != compile:
        raise Refused(
            f"paper_records: {path} was measured {'without' if compile else 'with'} --compile; give the same here, "
            "or bench again"
        )
    out = {}
    for R, m in bench["measured"].items():
        if not (isinstance(R, str) and R.isdigit() and 1 <= int(R) <= 10_000):
            raise _refuse_bench(path, f"stack size {records.printable(R, 40)!r} is not a whole number from 1 to 10000")
        out[int(R)] = _checked_times(path, R, m)
    return out


def pack(profile: str, out: Path) -> int:
    """Every finished record of ``profile`` under the runs folder into ``out`` (tar.gz): the files its summary
    lists but weights; returns how many records."""
    root = records.runs_root() / profile
    n = 0
    if not root.is_dir():
        return 0
    with tarfile.open(out, "w:gz") as tar:
        for d in sorted(p for p in root.iterdir() if p.is_dir() and (p / "summary.json").is_file()):
            rec = records.load(d)  # checks it whole first
            for name in [*rec.summary["files"], "summary.json"]:
                if not name.endswith(".pt"):
                    tar.add(d / name, arcname=f"{profile}/{d.name}/{name}")
            n += 1
    return n


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, every value checked before anything trains."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, required=True, help="the deadline, in minutes from now")
    ap.add_argument("--plan", nargs="+", default=list(DEFAULT_PLAN), help="suite[:seeds] items, trained in order")
    ap.add_argument("--profile", default="paper")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rate-ms", type=float, help="ms of wall time per run-step to project the first stack with")
    ap.add_argument("--bench", type=Path, help="the JSON of `tools/bench.py --gpu --json`: projects the first stack")
    ap.add_argument("--pack", type=Path, help="write the finished records into this tar.gz")
    ap.add_argument(
        "--no-checkpoints",
        action="store_true",
        help="write no resume points (a lent machine that is handed back after the call keeps none of them anyway)",
    )
    ap.add_argument("--compile", action="store_true", help="torch.compile each stack (CUDA only)")
    a = ap.parse_args(argv)
    if not a.minutes > 0:
        raise Refused(f"paper_records: --minutes must be positive, got {a.minutes}")
    if a.rate_ms is not None and not a.rate_ms > 0:
        raise Refused(f"paper_records: --rate-ms must be positive, got {a.rate_ms}")
    try:
        check_compile(a.compile, resolve_device(a.device))
    except ValueError as e:
        raise Refused(f"paper_records: {e}") from None
    for item in a.plan:  # every item checked before the first stack trains
        plan_configs(item, a.profile, a.device, a.compile)
    return a


def main(argv: list[str] | None = None) -> int:
    try:
        a = parse_args(argv)
        measured = None if a.bench is None else bench_rates(a.bench, a.compile)
    except Refused as e:
        print(e, file=sys.stderr)
        return 2
    deadline = time.monotonic() + 60 * a.minutes
    rate = None if a.rate_ms is None else a.rate_ms / 1e3  # seconds per run-step, all in
    for item in a.plan:
        for stack in stacks(plan_configs(item, a.profile, a.device, a.compile)):
            todo = pending_configs(stack)
            if not todo:
                continue
            steps = todo[0].max_iters
            names = ", ".join(records.run_name(c.case, c.seed) for c in todo)
            left = deadline - time.monotonic() - MARGIN_S
            projected = None
            if rate is not None:
                projected = len(todo) * steps * rate
            elif measured is not None:
                projected = project_stack_seconds(measured, todo)
            if projected is not None and projected > left:
                print(f"skipped ({len(todo)} runs: {names}): projected {projected:.0f} s, {max(left, 0):.0f} s left",
                      flush=True)  # fmt: skip
                continue
            print(f"training {len(todo)} runs as one stack: {names}", flush=True)
            t = time.monotonic()
            for s in train_stack(todo, progress=True, checkpoints=not a.no_checkpoints):
                print(f"  {s['case']} seed {s['seed']}: final val loss {s['final_val_loss']:.4f}", flush=True)
            wall = time.monotonic() - t
            rate = wall / (len(todo) * steps)
            print(f"  {wall:.0f} s, {1e3 * rate:.2f} ms per run-step all in", flush=True)
            if a.pack is not None:  # after every stack: a call stopped later still has these
                print(f"packed {pack(a.profile, a.pack)} records into {a.pack}", flush=True)
    if a.pack is not None:
        print(f"packed {pack(a.profile, a.pack)} records into {a.pack}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
