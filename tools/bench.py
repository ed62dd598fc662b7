"""Benchmarks: `make bench`. Prints the audit timing ladder (issue 2) with its rank certificates."""
from __future__ import annotations

import argparse
import os
import time

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
        print(f"{E:>4}{r.total_params:>9,}{count(cfg).unidentified:>8,}{r.unidentified:>8,}{r.method:>9}"
              f"{r.sv_gap:>10.1e}{dt:>9.1f}", flush=True)


def train_bench(steps: int, repeats: int) -> None:
    """Tokens/s of the chapter-6 loop with metrics on and off, and of a minimal loop (cpu profile)."""
    import statistics
    from attnid.data import load
    from attnid.profiles import make_config
    from attnid.train import build, train

    data = load()
    cfg = make_config("cpu", "adamw", max_iters=steps, eval_interval=10 * steps, ckpt_interval=10 * steps)
    tokens = steps * cfg.batch_size * cfg.block_size

    def ours(metrics: bool) -> float:
        t = time.perf_counter()
        train(cfg, data=data, save=False, progress=False, metrics=metrics)
        return tokens / (time.perf_counter() - t)

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
    for _ in range(repeats):                    # interleaved, so machine load hits all three alike
        results["minimal loop"].append(minimal())
        results["ours, metrics off"].append(ours(False))
        results[f"ours, metrics every {cfg.metric_interval}"].append(ours(True))
    med = {k: statistics.median(v) for k, v in results.items()}

    # The metric work itself, timed in isolation (robust to machine noise): per-step cost / step time
    from attnid import dynamics
    from attnid.train import bias_grad_norms, qk_stack
    model, opt = build(cfg, data.vocab_size, "cpu")
    gen = torch.Generator().manual_seed(0)
    step_times, metric_times = [], []
    for _ in range(200):
        x, y = data.batch("train", cfg.batch_size, cfg.block_size, gen)
        t = time.perf_counter()
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        Q0, K0 = qk_stack(model)
        bias_grad_norms(model)
        Q1, K1 = qk_stack(model)
        dynamics.unidentified_step_fraction(Q0, K0, Q1 - Q0, K1 - K0)
        b = dynamics.beta(Q1, K1)
        torch.linalg.matrix_norm(b - b).norm(dim=-1)
        dynamics.tau(Q1, K1)
        metric_times.append(time.perf_counter() - t)
    step, metric = statistics.median(step_times), statistics.median(metric_times)
    print(f"\ntraining throughput, cpu profile ({steps} steps x {repeats} repeats, median tokens/s, "
          f"{torch.get_num_threads()} threads)")
    base = med["ours, metrics off"]
    for k, v in med.items():
        print(f"  {k:<28}{v:>12,.0f}   {100 * (base / v - 1):+6.1f} % time vs metrics off")
    print(f"  isolated: median step {1e3 * step:.2f} ms, median metric computation {1e3 * metric:.2f} ms "
          f"-> overhead at metric_interval={cfg.metric_interval}: {100 * metric / (cfg.metric_interval * step):.2f} %")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--only", choices=["audit", "train"], default=None)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus")
    if a.only in (None, "audit"):
        for th in a.threads:
            audit_ladder(th)
    if a.only in (None, "train"):
        torch.set_num_threads(max(a.threads))
        train_bench(a.steps, a.repeats)


if __name__ == "__main__":
    main()
