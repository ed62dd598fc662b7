"""A trained run's model file, ``model.pt`` (:func:`save_model`): its final weights and the snapshots of its
attention layers at every evaluation (chapter 10), read back without running code (:func:`load_model`,
:func:`load_snapshots`)."""

from __future__ import annotations

import io
from pathlib import Path

import torch

from . import records
from .gpt import GPT, GPTConfig
from .lifecycle import Run
from .records import RecordError


def save_model(run: Run, d: Path) -> None:
    """``model.pt``: the trained weights, the model's config and the run's snapshots (``RunConfig.save_model``)."""
    buf = io.BytesIO()
    torch.save({"model": run.model.state_dict(), "gpt_config": vars(run.model.cfg), "snapshots": run.snapshots}, buf)
    records.atomic_write(d / "model.pt", buf.getvalue())


def read_model_file(d: Path) -> tuple[dict, str]:
    """The contents of a finished run's ``model.pt`` and the sha256 of the bytes they were parsed from (what a
    cache of results on this model is keyed by): the file is read once, checked against its record's seal before
    it is parsed and read without running code (:func:`attnid.lm.records.sealed_bytes`,
    :func:`attnid.lm.records.load_tensors`)."""
    f = Path(d) / "model.pt"
    try:
        data, digest = records.sealed_bytes(Path(d), "model.pt")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no trained model at {f}; rerun with save_model=True (`attnid train --save-model`)"
        ) from None
    ck = records.load_tensors(data, f)
    if not (isinstance(ck, dict) and isinstance(ck.get("model"), dict) and isinstance(ck.get("gpt_config"), dict)):
        raise RecordError(f"{f}: not a trained model of attnid (a dict with 'model' and 'gpt_config')")
    return ck, digest


def load_model(d: Path, device: str = "cpu") -> GPT:
    """The trained model of a finished run saved with ``save_model=True`` (in eval mode)."""
    return model_from_file(read_model_file(d)[0], Path(d) / "model.pt", device)


def model_from_file(ck: dict, f: Path, device: str = "cpu") -> GPT:
    """The model (in eval mode) of the contents ``ck`` of ``model.pt`` file ``f`` (:func:`read_model_file`), its
    weights checked against its ``gpt_config`` on the meta device before anything is built."""
    try:
        cfg = GPTConfig(**ck["gpt_config"])
        with torch.device("meta"):  # the shapes its config declares, before anything is allocated
            want = {k: tuple(v.shape) for k, v in GPT(cfg).state_dict().items()}
    except (TypeError, ValueError) as e:  # an unknown config key, a bad value
        raise RecordError(f"{f}: its gpt_config is not a model's ({records.printable(e)})") from None
    got = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else None for k, v in ck["model"].items()}
    if got != want:
        diff = sorted(set(got) ^ set(want)) or sorted(k for k in want if got[k] != want[k])
        raise RecordError(f"{f}: its weights do not fit its gpt_config (first: {records.printable(diff[0])})")
    bad = [k for k, v in ck["model"].items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise RecordError(f"{f}: weights that are not finite in {records.printable(', '.join(bad[:3]))}")
    model = GPT(cfg).to(device)
    model.load_state_dict(ck["model"])
    return model.eval()


def load_snapshots(d: Path) -> tuple[GPTConfig, dict[int, dict[str, torch.Tensor]], str]:
    """The model config and the snapshots (:attr:`Run.snapshots`) kept in a finished run's ``model.pt``, and the
    file's sha256 (:func:`read_model_file`)."""
    f = Path(d) / "model.pt"
    ck, digest = read_model_file(d)
    if not ck.get("snapshots"):
        raise FileNotFoundError(f"{f} keeps no snapshots (written before they were kept); rerun with --force")
    return GPTConfig(**ck["gpt_config"]), ck["snapshots"], digest
