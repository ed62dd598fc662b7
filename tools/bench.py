"""Benchmarks: `make bench` (the audit ladder with its rank certificates, training throughput, stacked runs against
one run alone on the CPU) and `make bench-gpu` (`--gpu`: the stacked training path at the paper profile)."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from attnid.attention import AttentionConfig
from attnid.audit import audit
from attnid.counting import count
from attnid.lm.ablation import fixed_batches


def audit_ladder(threads: int, widths: list[int]) -> None:
    torch.set_num_threads(threads)
    print(f"\naudit ladder: H = 8, all biases, LAPACK/torch threads = {threads}")
    print(f"{'E':>4}{'params':>9}{'theory':>8}{'audit':>8}{'method':>9}{'sv_gap':>10}{'seconds':>9}")
    for E in widths:
        cfg = AttentionConfig(E, 8, bias="all")
        t = time.perf_counter()
        r = audit(cfg)
        dt = time.perf_counter() - t
        print(
            f"{E:>4}{r.total_params:>9,}{count(cfg).unidentified:>8,}{r.unidentified:>8,}{r.method:>9}"
            f"{r.sv_gap:>10.1e}{dt:>9.1f}",
            flush=True,
        )
        if "stage_seconds" in r.details:  # where certify spends its time
            stages = ", ".join(f"{k} {v:.1f}" for k, v in r.details["stage_seconds"].items())
            print(f"{'':>4}  certify stages (s): {stages}", flush=True)


def train_bench(steps: int, repeats: int) -> None:
    """Tokens/s of the chapter-6 loop with metrics on and off, and of a minimal loop (cpu profile)."""
    import statistics

    from attnid.lm.data import load
    from attnid.lm.optimizers import build
    from attnid.lm.profiles import make_config
    from attnid.lm.train import train

    data = load()
    cfg = make_config("cpu", "adamw", max_iters=steps, eval_interval=10 * steps, ckpt_interval=10 * steps)
    tokens = steps * cfg.batch_size * cfg.block_size

    def ours(metrics: bool) -> float:
        """The loop alone: the end-of-run head analysis is a fixed cost per run, reported separately."""
        t = time.perf_counter()
        s = train(cfg, data=data, save=False, progress=False, metrics=metrics)
        if metrics:
            heads_seconds.append(s["head_analysis_seconds"])
        return tokens / (time.perf_counter() - t - s["head_analysis_seconds"])

    heads_seconds: list[float] = []

    def minimal() -> float:
        model, opt = build(cfg, data.vocab_size, "cpu")
        gen = torch.Generator().manual_seed(0)
        t = time.perf_counter()
        for _ in range(steps):
            x, y = data.batch("train", cfg.batch_size, cfg.block_size, gen)
            _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return tokens / (time.perf_counter() - t)

    results = {"minimal loop": [], "ours, metrics off": [], f"ours, metrics every {cfg.metric_interval}": []}
    for _ in range(repeats):  # interleaved, so machine load hits all three alike
        results["minimal loop"].append(minimal())
        results["ours, metrics off"].append(ours(False))
        results[f"ours, metrics every {cfg.metric_interval}"].append(ours(True))
    med = {k: statistics.median(v) for k, v in results.items()}

    # The metric work itself, timed in isolation (robust to machine noise): per-step cost / step time
    step, metric = step_and_metric_ms(cfg, data, "cpu", "fp32", 200)
    step, metric = step / 1e3, metric / 1e3
    print(
        f"\ntraining throughput, cpu profile ({steps} steps x {repeats} repeats, median tokens/s, "
        f"{torch.get_num_threads()} threads)"
    )
    base = med["ours, metrics off"]
    for k, v in med.items():
        print(f"  {k:<28}{v:>12,.0f}   {100 * (base / v - 1):+6.1f} % time vs metrics off")
    print(f"  end-of-run head analysis (chapter 7): median {statistics.median(heads_seconds):.2f} s per run")
    print(
        f"  isolated: median step {1e3 * step:.2f} ms, median metric computation {1e3 * metric:.2f} ms "
        f"-> overhead at metric_interval={cfg.metric_interval}: {100 * metric / (cfg.metric_interval * step):.2f} %"
    )


def step_and_metric_ms(cfg, data, device: str, precision: str, n: int) -> tuple[float, float]:
    """Median ms of one training step of one model (no metrics) and of the probe's work on one step (its host part
    included, computed at once)."""
    import statistics

    from attnid.lm.optimizers import build, precision_context
    from attnid.lm.probe import IdentificationProbe

    model, opt = build(cfg, data.vocab_size, device)
    probe = IdentificationProbe.for_model(model, opt)
    gen = torch.Generator().manual_seed(0)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    step_times, metric_times = [], []
    for i in range(n + 5):  # the first 5 steps warm up
        x, y = data.batch("train", cfg.batch_size, cfg.block_size, gen, device)
        sync()
        t = time.perf_counter()
        with precision_context(precision, device):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sync()
        t1 = time.perf_counter()
        probe.before_step()
        sync()
        t2 = time.perf_counter()
        opt.step()  # a second step gives the probe an update to measure
        sync()
        t3 = time.perf_counter()
        probe.after_step(train_loss=loss.detach()).result()
        sync()
        t4 = time.perf_counter()
        if i >= 5:
            step_times.append(t1 - t)
            metric_times.append((t2 - t1) + (t4 - t3))  # the probe's own work, not the extra step
    return 1e3 * statistics.median(step_times), 1e3 * statistics.median(metric_times)


# ------------------------------------------------------------------------------ stacked runs (issue: one window)
PEAK_BF16 = 790e12  # dense bf16 FLOP/s of one H200 as measured on this workplace's machines (8192^3 products)


def stack_configs(profile: str, R: int, device: str, **over) -> list:
    """``R`` runs of chapter 6's suite at ``profile`` that share the model's shape: its cases in turn, seeds 0, 1..."""
    from attnid.lm.batched import stack_key
    from attnid.lm.profiles import SUITES, make_config

    cases = SUITES["dynamics"].cases_at(profile)
    ref = stack_key(make_config(profile, cases[0], device=device, **over))
    cases = [c for c in cases if stack_key(make_config(profile, c, device=device, **over)) == ref]
    return [make_config(profile, cases[i % len(cases)], seed=i // len(cases), device=device, **over) for i in range(R)]


def stacked_group(cfgs, data, device: str, precision: str, tmp: Path):
    from attnid.lm.batched import stacked_runs

    return stacked_runs([(c, tmp / f"{c.case}-{c.seed}") for c in cfgs], data, device, precision)


def time_steps(group, steps: int, probe=None, interval: int = 10) -> float:
    """Seconds of ``steps`` training steps of ``group`` (the probe, if given, every ``interval`` steps and its rows
    waited for at the end, as the loop does)."""
    from attnid.lm.metrics import Key
    from attnid.lm.train import train_step

    device = group.runs[0].device
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    pending = []
    sync()
    t = time.perf_counter()
    for it in range(steps):
        probing = probe is not None and it % interval == 0
        losses, _ = train_step(group, it, probe if probing else None)
        if probing:
            pending.append(probe.after_step(1.0 if not group.stacked else torch.ones(len(group.runs)),
                                            **{Key.TRAIN_LOSS: losses}))  # fmt: skip
            while len(pending) > 1:
                pending.pop(0).result()
    for row in pending:
        row.result()
    sync()
    return time.perf_counter() - t


def operators_per_step(group) -> int:
    """How many operators the autograd profiler records at the top level in one training step of ``group``
    (forward, backward, clipping, optimizer; no metrics; the runs' batches, drawn from each run's own generator,
    before it). Top level: the calls of the step and of the autograd engine, not what a kernel calls inside
    (the CPU's kernels split large tensors into chunks, each with its own ``fill_``)."""
    from attnid.lm.train import draw_batches, step_on

    step_on(group, *draw_batches(group), 0, None)  # the first step allocates the optimizer's state
    x, y = draw_batches(group)
    with torch.autograd.profiler.profile() as prof:
        step_on(group, x, y, 1, None)
    return sum(e.cpu_parent is None for e in prof.function_events)


def measure_stack(R: int, ref, data, device: str, precision: str, tmp: Path, steps: int, compile: bool = False) -> dict:
    """One row of :func:`stack_bench`: R runs of the suite stacked (and R seeds of one case for the operator count).
    Seconds of a step with and without the probe, of one evaluation and of the head analysis (projected from one
    batch of one mask), under the run's precision; ``compile``: the training step compiled, and the seconds of the
    three warm-up steps that compile it (``compile_s``)."""
    from attnid.lm.optimizers import precision_context
    from attnid.lm.probe import IdentificationProbe
    from attnid.lm.profiles import make_config
    from attnid.lm.train import evaluate_group

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    cfgs = stack_configs(ref.profile, R, device, eval_iters=min(ref.eval_iters, 20), compile=compile)
    seeds = [make_config(ref.profile, "adamw", seed=s, device=device) for s in range(R)]  # one optimizer class
    ops = operators_per_step(stacked_group(seeds, data, device, precision, tmp / "ops"))
    group = stacked_group(cfgs, data, device, precision, tmp)
    group.module.train()
    warmup = time_steps(group, 3)  # warm up (and compile)
    plain = time_steps(group, steps) / steps
    probe = IdentificationProbe(ref.n_head, group.qk_params(), group.qk_update, background=device.startswith("cuda"))
    probed = time_steps(group, steps, probe, ref.metric_interval) / steps
    probe.close()
    t = time.perf_counter()
    evaluate_group(group, 0)
    sync()
    eval_s = (time.perf_counter() - t) * ref.eval_iters / cfgs[0].eval_iters  # at the profile's eval_iters
    firsts = [fixed_batches(data, ref.batch_size, ref.block_size, 1, seed=c.seed)[0] for c in cfgs]
    losses = group.module.masked_losses([tuple(torch.stack(t).to(device) for t in zip(*firsts))])  # (R, B, T)
    with precision_context(precision, device):
        losses(None)  # warm up
        t = time.perf_counter()
        losses(None)  # one mask, one batch (the result comes to the host: synchronised)
        heads_s = (time.perf_counter() - t) * ref.head_batches * (1 + 2 * ref.n_layer * ref.n_head)
    out = {"step_s": probed, "plain_step_s": plain, "eval_s": eval_s, "heads_s": heads_s, "ops": ops}
    return {**out, "compile_s": warmup - 3 * plain} if compile else out


def stack_bench(
    device: str,
    profile: str,
    sizes: list[int],
    steps: int,
    precision: str,
    json_out: Path | None = None,
    compile: bool = False,
) -> None:
    """ms per run-step of R stacked runs, with and without the probe; the evaluation's and the head analysis's
    cost; the operators per step; the projected wall time of each suite; the ratio to the bf16 floor. ``compile``:
    each stack's training step through ``torch.compile`` (CUDA only), its compilation timed apart."""
    import tempfile

    from attnid.lm.batched import stacks
    from attnid.lm.data import load
    from attnid.lm.profiles import SUITES, check_compile, make_config, resolve_precision

    precision = resolve_precision(precision, device)
    check_compile(compile, device)
    data = load()
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"
    ref = make_config(profile, "adamw", device=device)
    flops = ref.gpt_config(data.vocab_size).train_flops(ref.batch_size)
    floor_ms = 1e3 * flops / PEAK_BF16
    print(
        f"\nstacked runs: profile {profile} ({ref.n_layer} x {ref.n_head} x {ref.n_embd}, context {ref.block_size}, "
        f"batch {ref.batch_size}) on {name}, {precision}{', compiled' if compile else ''}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"one run-step: {flops / 1e12:.3f} TFLOP; bf16 floor at {PEAK_BF16 / 1e12:.0f} TFLOP/s: {floor_ms:.2f} ms")
    print("ops/step: operators per step of R seeds of one case (the suite's mix adds one optimizer call per class)")
    print(f"{'R':>4}{'ops/step':>10}{'ms/step':>10}{'ms/run-step':>13}{'+probe':>10}{'probe %':>9}"
          f"{'eval s':>9}{'heads s':>9}{'x floor':>9}")  # fmt: skip
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        for R in sizes:
            m = measured[R] = measure_stack(R, ref, data, device, precision, Path(tmp), steps, compile)
            plain, probed = m["plain_step_s"], m["step_s"]
            print(
                f"{R:>4}{m['ops']:>10}{1e3 * plain:>10.2f}{1e3 * plain / R:>13.3f}{1e3 * probed / R:>10.3f}"
                f"{100 * (probed / plain - 1):>8.1f}%{m['eval_s']:>9.2f}{m['heads_s']:>9.2f}"
                + (f"{1e3 * plain / R / floor_ms:>9.2f}" if device.startswith("cuda") else f"{'n/a':>9}")
                + (f"  (compiled in {m['compile_s']:.0f} s)" if compile else ""),
                flush=True,
            )
    print(f"projected wall time of each suite at {profile} (one stack per model shape, the nearest R measured):")
    suites = {}
    for suite, spec in SUITES.items():
        cfgs = [make_config(profile, c, seed=s) for s in spec.seeds[profile] for c in spec.cases_at(profile)]
        three = [make_config(profile, c, seed=s) for s in (0, 1, 2) for c in spec.cases_at(profile)]
        total = sum(project_stack_seconds(measured, stack) for stack in stacks(cfgs))
        total3 = sum(project_stack_seconds(measured, stack) for stack in stacks(three))
        suites[suite] = {"runs": len(cfgs), "seconds": total, "runs_3_seeds": len(three), "seconds_3_seeds": total3}
        print(f"  {suite!r}: {len(cfgs)} runs in {len(stacks(cfgs))} stack(s): {total / 60:.1f} min; "
              f"3 seeds ({len(three)} runs): {total3 / 60:.1f} min")  # fmt: skip
    if json_out is not None:
        got = {"profile": profile, "device": name, "precision": precision, "compiled": compile, "floor_ms": floor_ms}
        json_out.write_text(json.dumps({**got, "measured": measured, "suites": suites}, indent=1))


def project_stack_seconds(measured: dict, stack: list) -> float:
    """Wall time of training ``stack`` (its steps with the probe, its evaluations, its head analysis) from the
    bench's ``measured`` ``{R: {"step_s", "eval_s", "heads_s"}}``, scaled linearly from the nearest R measured,
    plus its compilation (``compile_s``) where the bench compiled."""
    R = min(measured, key=lambda m: abs(m - len(stack)))
    m, cfg = measured[R], stack[0]
    n_evals = cfg.max_iters // cfg.eval_interval + 1
    training = len(stack) / R * (cfg.max_iters * m["step_s"] + n_evals * m["eval_s"] + m["heads_s"])
    return training + m.get("compile_s", 0.0)  # a compiled stack compiles once


def stack_vs_solo_cpu(steps: int, repeats: int, R: int = 3) -> None:
    """At the cpu profile on one thread: ms per run-step of R stacked runs against one run alone, interleaved."""
    import statistics
    import tempfile

    from attnid.lm.data import load
    from attnid.lm.train import single_run

    torch.set_num_threads(1)
    data = load()
    cfgs = stack_configs("cpu", R, "cpu")
    solo_t, stack_t = [], []
    with tempfile.TemporaryDirectory() as tmp:
        solo = single_run([(cfgs[0], Path(tmp) / "solo")], data, "cpu", "fp32")
        stack = stacked_group(cfgs, data, "cpu", "fp32", Path(tmp))
        for g in (solo, stack):
            g.module.train()
            time_steps(g, 3)
        for _ in range(repeats):  # interleaved, so machine load hits both alike
            solo_t.append(time_steps(solo, steps) / steps)
            stack_t.append(time_steps(stack, steps) / steps / R)
    a, b = statistics.median(solo_t), statistics.median(stack_t)
    print(f"\ncpu profile, 1 thread: a run-step alone {1e3 * a:.1f} ms, stacked ({R} runs) {1e3 * b:.1f} ms "
          f"per run-step ({b / a:.2f}x)")  # fmt: skip


GPU_ONLY = {"device", "profile", "stack_sizes", "precision", "json", "compile"}  # the flags of --gpu alone


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--only", choices=["audit", "train", "stack"], default=None)
    ap.add_argument("--E", type=int, nargs="+", default=[16, 32, 48, 64, 128], help="the audit ladder's widths")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gpu", action="store_true", help="stacked runs at the paper profile: ms per run-step, probe, "
                    "evaluation, head analysis, projected suite times, ratio to the floor")  # fmt: skip
    ap.add_argument("--device", default="cuda", help="with --gpu: the device (cpu: the same logic, at --profile smoke)")
    ap.add_argument(
        "--profile", default=None, help="with --gpu: the profile measured (default: paper; smoke on the cpu)"
    )
    ap.add_argument("--stack-sizes", type=int, nargs="+", default=[1, 3, 7, 21], help="with --gpu: the R measured")
    ap.add_argument("--precision", default="auto", help="with --gpu: auto (bf16 on CUDA) | fp32 | tf32 | bf16")
    ap.add_argument("--json", type=Path, help="with --gpu: also write the measurements and projections here")
    ap.add_argument("--compile", action="store_true", help="with --gpu: torch.compile each stack (CUDA only); the "
                    "compilation's seconds are printed apart")  # fmt: skip
    a = ap.parse_args(argv)
    given = {k for k, v in vars(a).items() if v != ap.get_default(k)}
    stray = sorted(given & ({"threads", "only", "E", "repeats"} if a.gpu else GPU_ONLY))
    if stray:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in stray)
        raise SystemExit(f"bench: {flags} {'do not apply with' if a.gpu else 'only apply with'} --gpu")
    for name, values in (("--steps", [a.steps]), ("--repeats", [a.repeats]), ("--stack-sizes", a.stack_sizes),
                         ("--threads", a.threads), ("--E", a.E)):  # fmt: skip
        if any(v < 1 for v in values):
            raise SystemExit(f"bench: {name} must be whole numbers >= 1, got {' '.join(map(str, values))}")
    if a.json is not None and not a.json.resolve().parent.is_dir():
        raise SystemExit(f"bench: --json {a.json}: its folder does not exist (checked before the bench runs)")
    if a.gpu:
        if a.device.startswith("cuda") and not torch.cuda.is_available():
            raise SystemExit("bench --gpu: CUDA is not available on this machine (--device cpu runs it on the CPU)")
        profile = a.profile if a.profile is not None else ("paper" if a.device.startswith("cuda") else "smoke")
        steps = a.steps if a.steps != ap.get_default("steps") else 20
        try:
            stack_bench(a.device, profile, a.stack_sizes, steps, a.precision, a.json, compile=a.compile)
        except ValueError as e:  # a precision or --compile the device has not
            raise SystemExit(f"bench --gpu: {e}") from None
        return
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus")
    if a.only in (None, "audit"):
        for th in a.threads:
            audit_ladder(th, a.E)
    if a.only in (None, "train"):
        torch.set_num_threads(max(a.threads))
        train_bench(a.steps, a.repeats)
    if a.only in (None, "stack"):
        stack_vs_solo_cpu(min(a.steps, 40), a.repeats)


if __name__ == "__main__":
    main()
