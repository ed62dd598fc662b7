"""A finished run's summary (:func:`summarize`): its timings, the machine and precision it ran on, and the
provenance of its training (the segments it was trained in, alone or stacked)."""

from __future__ import annotations

import contextlib
import platform
import time
from pathlib import Path

import torch

from .. import __version__
from . import records
from .lifecycle import Run
from .metrics import Key


def summarize(run: Run, *, metrics: bool, train_seconds: float, heads_seconds: float, start: int) -> dict:
    """The summary of a finished run (``summary.json`` without its file list); ``wall_seconds`` is the
    training time of this process plus what the run's checkpoint says came before."""
    cfg, rows, device = run.cfg, run.rows, run.device
    vals = [r[Key.VAL_LOSS] for r in rows if r.get(Key.VAL_LOSS) is not None]
    return {
        "profile": cfg.profile,
        "case": cfg.case,
        "seed": cfg.seed,
        "steps": cfg.max_iters,
        "final_val_loss": vals[-1] if vals else None,
        "best_val_loss": min(vals) if vals else None,
        "final_train_loss": rows[-1][Key.TRAIN_LOSS] if rows else None,
        "wall_seconds": run.elapsed + train_seconds + heads_seconds,
        "head_analysis_seconds": heads_seconds,
        "tokens_per_second": cfg.batch_size * cfg.block_size * (cfg.max_iters - start) / max(train_seconds, 1e-9),
        "device": device if not device.startswith("cuda") else torch.cuda.get_device_name(device),
        "precision": run.precision,
        "compile": cfg.compile,
        "metrics": metrics,
        "rho_method": "float64 optimizer update",
        "threads": torch.get_num_threads(),
        "attnid": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "rebalances": run.rebalances,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_description(device),
        "code_commit": records.code_commit(),
        **provenance_of(run.history_to(cfg.max_iters)),
    }


def machine_description(device: str) -> str:
    """E.g. ``"x86_64, 2 cores, AMD EPYC 7B13"``: the machine a run trained on (a summary's provenance)."""
    import os

    name = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    text = f"{platform.machine()}, {os.cpu_count()} cores" + (f", {name}" if name else "")
    if device.startswith("cuda"):
        text += f"; {torch.cuda.get_device_name(device)}"
    return text


def provenance_of(history: list) -> dict:
    """What a summary says of how a run was trained: ``history`` (``[first step, end step, runs stacked with
    or None]`` per segment) and ``stacked_with``, every run it was ever stacked with, itself included (absent if
    never; records made before cases were stacked name seeds under ``batched_seeds``)."""
    stacked = sorted({str(s) for _, _, names in history if names for s in names})
    return {"history": history, **({"stacked_with": stacked} if stacked else {})}
