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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--only", choices=["audit", "train"], default=None)
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus")
    if a.only in (None, "audit"):
        for th in a.threads:
            audit_ladder(th)


if __name__ == "__main__":
    main()
