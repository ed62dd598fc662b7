"""What tests plant in records: files changed and made to look intact, and pickles that would run code."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import torch

from attnid.lm import records


def relist(d: Path) -> None:
    """Make ``d/summary.json``'s file list match the files as they are now, and reseal it: a tampering that hides
    itself (or a test's own change to a record made to pass the seal)."""
    summary = json.loads((d / "summary.json").read_text())
    summary["files"] = {n: records.file_entry(d / n) for n in summary["files"]}
    summary["seal"] = records.seal_of(summary)
    (d / "summary.json").write_text(json.dumps(summary))


def seal_files(d: Path, names: tuple[str, ...] = ("model.pt",)) -> None:
    """A minimal sealed ``d/summary.json`` listing ``names`` as they are now: a hand-made record whose files the
    readers check against their seal."""
    summary = {"files": {n: records.file_entry(d / n) for n in names}, "format": records.FORMAT}
    summary["seal"] = records.seal_of(summary)
    (d / "summary.json").write_text(json.dumps(summary))


class _Touch:
    """Unpickled, it creates the file ``marker`` (through ``os.system``): the side effect a test watches for."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def hostile_pickle(path: Path, marker: Path, payload_key: str = "model") -> None:
    """Write to ``path`` a torch file whose ``payload_key`` entry, once unpickled, creates ``marker``."""
    buf = io.BytesIO()
    torch.save({payload_key: _Touch(marker), "gpt_config": {}}, buf)
    path.write_bytes(buf.getvalue())
