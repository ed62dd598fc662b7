"""Convert run records of format 1 (attnid at commit 360a5c8 and before) into the current format, or seal
records of format 2 (made before summaries were sealed) in place.

    python tools/import_records.py SRC DEST --device "NVIDIA H200" --precision tf32 \
        --torch 2.11.0+cu130 --commit 360a5c8 --note "..."
    python tools/import_records.py --seal data/runs/paper/sgd data/runs/paper/adamw ...

``SRC`` holds one folder per case (``config.json``, ``metrics.jsonl``, ``summary.json``); each is
written to ``DEST/<case>`` through :func:`attnid.lm.records.finish`: rows gzip'd with float32-precision
numbers, a file list, and the provenance in ``summary.json``. Format 1 measured ρ as the float32
weight difference, so its ``rho`` is stored as ``rho_diff`` (see chapter 6). No head analysis is
made (format 1 kept no weights for it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnid.lm import records


def convert(src: Path, dest: Path, provenance: dict) -> dict:
    config = json.loads((src / "config.json").read_text())
    summary = json.loads((src / "summary.json").read_text())
    rows = records.read_rows(src)
    for r in rows:
        if "rho" in r:
            r["rho_diff"] = r.pop("rho")
    config.setdefault("precision", provenance["precision"])
    vals = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    summary.update(
        seed=config.get("seed", 0),
        best_val_loss=min(vals),
        precision=provenance["precision"],
        metrics=True,
        rho_method="float32 weight difference",
        provenance=provenance,
    )
    dest.mkdir(parents=True, exist_ok=True)
    records.write_json(dest / "config.json", config)
    out = records.finish(dest, rows, summary)
    records.load(dest)  # the converted record checks out
    return out


def main() -> None:
    import sys

    if sys.argv[1:2] == ["--seal"]:
        for d in sys.argv[2:]:
            records.seal(Path(d))
            print(f"{d}: sealed")
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--device", required=True)
    ap.add_argument("--precision", required=True, choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--torch", required=True)
    ap.add_argument("--commit", required=True, help="commit of the attnid code that made the runs")
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    provenance = {
        "device": a.device,
        "precision": a.precision,
        "torch": a.torch,
        "code_commit": a.commit,
        "record_format": 1,
        "note": a.note,
    }
    for src in sorted(p for p in a.src.iterdir() if (p / "summary.json").exists()):
        s = convert(src, a.dest / src.name, provenance)
        size = sum(v["bytes"] for v in s["files"].values())
        print(f"{src.name}: {len(records.read_rows(a.dest / src.name))} rows, {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
