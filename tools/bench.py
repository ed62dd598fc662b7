"""Benchmarks: `make bench`. Prints the audit timing ladder with its rank certificates."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from attnid.attention import AttentionConfig
from attnid.audit import audit
from attnid.counting import count


def audit_ladder(threads: int) -> None:
    torch.set_num_threads(threads)
    print(f"\naudit ladder: H = 8, all biases, LAPACK/torch threads = {threads}")
    print(f"{'E':>4}{'params':>9}{'theory':>8}{'audit':>8}{'method':>9}{'sv_gap':>10}{'seconds':>9}")
    for E in (16, 32, 48, 64):
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
    from attnid.lm.profiles import make_config
    from attnid.lm.train import build, train

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


def step_and_metric_ms(cfg, data, device: str, precision: str, n: int, compile: bool = False) -> tuple[float, float]:
    """Median ms of one training step (no metrics) and of the probe's work on one step."""
    import statistics

    from attnid.lm.probe import IdentificationProbe
    from attnid.lm.train import build, precision_context

    model, opt = build(cfg, data.vocab_size, device)
    step_model = torch.compile(model) if compile else model
    probe = IdentificationProbe(model, opt)
    gen = torch.Generator().manual_seed(0)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    step_times, metric_times = [], []
    for i in range(n + 5):  # the first 5 steps warm up (and compile)
        x, y = data.batch("train", cfg.batch_size, cfg.block_size, gen, device)
        sync()
        t = time.perf_counter()
        with precision_context(precision, device):
            _, loss = step_model(x, y)
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
        probe.after_step(train_loss=loss.detach())
        sync()
        t4 = time.perf_counter()
        if i >= 5:
            step_times.append(t1 - t)
            metric_times.append((t2 - t1) + (t4 - t3))  # the probe's own work, not the extra step
    return 1e3 * statistics.median(step_times), 1e3 * statistics.median(metric_times)


def seeds_bench(steps: int, device: str = "cpu") -> None:
    """What seeds cost: the chapter-6 suite (every case, ``steps`` steps at the cpu profile) with one seed
    one run after another (the one-seed chapter), then three seeds as parallel one-thread processes (what
    the book does on the CPU) and as one batched model per case (attnid.lm.batched)."""
    import tempfile

    from attnid.lm.batched import train_seeds
    from attnid.lm.data import load
    from attnid.lm.launch import launch
    from attnid.lm.profiles import SUITES, make_config
    from attnid.lm.train import train

    data = load()
    cases = list(SUITES["dynamics"].cases)
    seeds = (0, 1, 2)
    over = dict(max_iters=steps, eval_interval=max(1, steps // 4), ckpt_interval=10 * steps, device=device)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ATTNID_RUNS"] = tmp  # the local jobs inherit it
        t = time.perf_counter()
        for c in cases:
            train(make_config("cpu", c, seed=0, **over), out=Path(tmp) / "one", data=data, progress=False)
        one = time.perf_counter() - t
        cfgs = [make_config("cpu", c, seed=s, **over) for s in seeds for c in cases]
        t = time.perf_counter()
        launch(cfgs, "local", parallel=2, threads=1, folder=Path(tmp) / "logs", report=lambda _: None)
        procs = time.perf_counter() - t
        t = time.perf_counter()
        for c in cases:
            train_seeds([make_config("cpu", c, seed=s, **over) for s in seeds], out=Path(tmp) / "b", data=data,
                        progress=False)  # fmt: skip
        batched = time.perf_counter() - t
    print(f"\nseeds: the chapter-6 suite ({len(cases)} cases, {steps} steps each, cpu profile, {device})")
    print(f"  1 seed, one run after another ({torch.get_num_threads()} threads): {one:7.1f} s")
    print(f"  3 seeds, 2 processes of 1 thread:          {procs:7.1f} s  ({procs / one:.2f}x the one-seed time)")
    print(f"  3 seeds, one batched model per case:       {batched:7.1f} s  ({batched / one:.2f}x)")


def gpu_bench(device: str, profile: str, steps: int, compile: bool) -> None:
    """Per-step ms per precision, the probe's overhead, one real run's steps/s, projected suite times."""
    from attnid.lm.data import load
    from attnid.lm.profiles import SUITES, make_config
    from attnid.lm.train import train

    data = load()
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"
    cfg = make_config(profile, "adamw", device=device)
    print(
        f"\nGPU path: profile {profile} ({cfg.n_layer} x {cfg.n_head} x {cfg.n_embd}, context {cfg.block_size}, "
        f"batch {cfg.batch_size}) on {name}, torch {torch.__version__}"
    )
    print(f"{'precision':<16}{'step ms':>10}{'probe ms':>10}{'overhead @10':>14}")
    variants = [("fp32", False), ("tf32", False), ("bf16", False)] + ([("bf16", True)] if compile else [])
    bf16_ms = None
    for precision, comp in variants:
        step, metric = step_and_metric_ms(cfg, data, device, precision, 40, compile=comp)
        label = precision + (" + compile" if comp else "")
        print(
            f"{label:<16}{step:>10.2f}{metric:>10.2f}{100 * metric / (cfg.metric_interval * step):>13.1f}%", flush=True
        )
        if precision == "bf16" and not comp:
            bf16_ms = step
    if device.startswith("cuda"):
        print(f"bf16 against the physical floor of about 1.6 ms per step on an H200: {bf16_ms / 1.6:.1f}x")
    # one real run (default precision): metrics every 10 steps, evaluations at its start and end only
    from attnid.lm.ablation import analyse, fixed_batches
    from attnid.lm.train import build, evaluate, precision_context

    run = make_config(profile, "adamw", device=device, max_iters=steps, eval_interval=steps)
    t = time.perf_counter()
    s = train(run, data=data, save=False, progress=False)
    wall = time.perf_counter() - t
    model, _ = build(run, data.vocab_size, device)
    with precision_context(s["precision"], device):
        t = time.perf_counter()
        evaluate(model, data, run, device, 0)
        t_eval = time.perf_counter() - t
        batches = fixed_batches(data, run.batch_size, run.block_size, run.head_batches, device=device)
        t = time.perf_counter()
        analyse(model, batches)
        t_heads = time.perf_counter() - t
    per_step = (wall - 2 * t_eval - t_heads) / steps
    full = make_config(profile, "adamw")
    n_evals = full.max_iters // full.eval_interval + 1
    projected = full.max_iters * per_step + n_evals * t_eval + t_heads
    print(
        f"\none {s['precision']} run of {steps} steps ({len(s['rows'])} recorded rows): {wall:.1f} s; "
        f"{1e3 * per_step:.2f} ms per step with the probe every {run.metric_interval}, "
        f"{1 / per_step:.1f} steps/s; one evaluation ({run.eval_iters} batches) {t_eval:.2f} s; "
        f"head analysis {t_heads:.2f} s"
    )
    print(f"projected {full.max_iters}-step run ({n_evals} evaluations, head analysis): {projected:.0f} s")
    for suite, spec in SUITES.items():
        n = len(spec.cases_at(profile)) * len(spec.seeds[profile])
        print(f"projected suite {suite!r} ({n} runs, one after another): {n * projected / 60:.1f} min")
    # several seeds as one batched model (attnid.lm.batched): what 3 seeds cost against one
    from attnid.lm.batched import train_seeds

    cfgs = [
        make_config(profile, "adamw", seed=s, device=device, max_iters=steps, eval_interval=steps) for s in (0, 1, 2)
    ]
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        train_seeds(cfgs, out=Path(tmp), data=data, progress=False)
        batched = time.perf_counter() - t
    print(f"3 seeds as one batched model, {steps} steps: {batched:.1f} s against {wall:.1f} s for one seed alone "
          f"({batched / wall:.2f}x the time for 3x the runs)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--only", choices=["audit", "train", "seeds"], default=None)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gpu", action="store_true", help="the GPU path (paper profile): precisions, probe, projections")
    ap.add_argument("--device", default="cuda", help="with --gpu: the device (cpu only to test this script)")
    ap.add_argument("--profile", default="paper", help="with --gpu: the profile measured")
    ap.add_argument("--compile", action="store_true", help="with --gpu: also time torch.compile")
    a = ap.parse_args()
    if a.gpu:
        if a.device.startswith("cuda") and not torch.cuda.is_available():
            raise SystemExit("bench --gpu: CUDA is not available on this machine")
        gpu_bench(a.device, a.profile, a.steps, a.compile)
        return
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus")
    if a.only in (None, "audit"):
        for th in a.threads:
            audit_ladder(th)
    if a.only in (None, "train"):
        torch.set_num_threads(max(a.threads))
        train_bench(a.steps, a.repeats)
    if a.only in (None, "seeds"):
        torch.set_num_threads(max(a.threads))
        seeds_bench(a.steps)


if __name__ == "__main__":
    main()
