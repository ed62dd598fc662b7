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
    snaps = ck.get("snapshots", {})
    most = _most_snapshots(Path(d))
    if isinstance(snaps, dict) and most is not None and len(snaps) > most:  # before each is checked (their cost)
        raise RecordError(f"{f}: {len(snaps):,} snapshots, more than the {most:,} its run takes (one per evaluation)")
    return ck, digest


def _most_snapshots(d: Path) -> int | None:
    """How many snapshots the run of record ``d`` takes: one before training and one per evaluation (from its
    sealed ``config.json``); None where the record has none to read."""
    import json

    try:
        config = json.loads(records.sealed_bytes(d, "config.json")[0])
        return 1 + len(records.expected_steps(config, metrics=False))
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return None


def load_model(d: Path, device: str = "cpu") -> GPT:
    """The trained model of a finished run saved with ``save_model=True`` (in eval mode)."""
    return model_from_file(read_model_file(d)[0], Path(d) / "model.pt", device)


# a model file's gpt_config: each field's type
GPT_CONFIG_TYPES: dict[str, type | tuple[type, ...]] = {
    "block_size": int, "n_layer": int, "n_head": int, "n_embd": int, "dropout": float, "bias": bool,
    "head_dim": (int, type(None)), "vocab_size": int,
}  # fmt: skip


def _declared_config(ck: dict, f: Path) -> GPTConfig:
    """The ``gpt_config`` of model file ``f``, its fields of the right types and its sizes those of the tensors the file
    holds (layers, width, vocabulary, context), checked before any model is built: a config cannot ask for more than
    the file's own weights."""
    declared = ck["gpt_config"]
    for k, v in declared.items():
        want = GPT_CONFIG_TYPES.get(k)
        ok = want is not None and isinstance(v, want) and not (want is int and isinstance(v, bool))
        if want is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not ok:
            field = f"{records.printable(k, 40)} = {records.printable(v, 40)}"
            raise RecordError(f"{f}: its gpt_config is not a model's (field {field})")
    model = ck["model"]
    layers = {k.split(".")[1] for k in model if isinstance(k, str) and k.startswith("blocks.")}
    wte, wpe = model.get("wte.weight"), model.get("wpe.weight")
    if not (isinstance(wte, torch.Tensor) and wte.dim() == 2 and isinstance(wpe, torch.Tensor) and wpe.dim() == 2):
        raise RecordError(f"{f}: its weights lack the token and position embeddings of a GPT")
    held = {"n_layer": len(layers), "vocab_size": wte.shape[0], "n_embd": wte.shape[1], "block_size": wpe.shape[0]}
    for k, v in held.items():
        if declared.get(k, getattr(GPTConfig, k)) != v:
            said = records.printable(declared.get(k), 40)
            raise RecordError(f"{f}: its weights do not fit its gpt_config ({k} = {said}, its weights hold {v})")
    try:
        return GPTConfig(**declared)
    except (TypeError, ValueError) as e:  # a bad value
        raise RecordError(f"{f}: its gpt_config is not a model's ({records.printable(e)})") from None


def _check_weights(f: Path, name: str, got, want: dict[str, tuple]) -> None:
    """``got`` holds finite tensors of exactly ``want``'s names and shapes
    (:func:`attnid.lm.records.tensors_problem`)."""
    problem = records.tensors_problem(got, want)
    if problem is None:
        return
    kind, key = problem
    if kind == "dict":
        raise RecordError(f"{f}: its {name} is not a dict of tensors")
    if kind == "fit":
        raise RecordError(f"{f}: its {name} do not fit its gpt_config (first: {key})")
    raise RecordError(f"{f}: {name} that are not finite floats in {key}")


def checked_model_file(ck: dict, f: Path) -> GPTConfig:
    """The config of the contents ``ck`` of model file ``f`` (:func:`read_model_file`), once its config, its
    weights and its snapshots are checked against each other (types, shapes on the meta device, finiteness), before
    anything is built or allocated."""
    from .lifecycle import SNAPSHOT_PARTS

    cfg = _declared_config(ck, f)
    with torch.device("meta"):  # the shapes its config declares, before anything is allocated
        want = {k: tuple(v.shape) for k, v in GPT(cfg).state_dict().items()}
    _check_weights(f, "weights", ck["model"], want)
    snaps = ck.get("snapshots", {})
    if not isinstance(snaps, dict) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in snaps):
        raise RecordError(f"{f}: its snapshots are not a dict of steps >= 0")
    parts = {k: v for k, v in want.items() if any(part in k for part in SNAPSHOT_PARTS)}
    for s, snap in snaps.items():
        _check_weights(f, f"snapshot of step {s}", snap, parts)
    return cfg


def model_from_file(ck: dict, f: Path, device: str = "cpu") -> GPT:
    """The model (in eval mode) of the contents ``ck`` of ``model.pt`` file ``f`` (:func:`read_model_file`), the
    file checked whole first (:func:`checked_model_file`)."""
    model = GPT(checked_model_file(ck, f)).to(device)
    model.load_state_dict(ck["model"])
    return model.eval()


def load_snapshots(d: Path) -> tuple[GPTConfig, dict[int, dict[str, torch.Tensor]], str]:
    """The model config and the snapshots (:attr:`Run.snapshots`) kept in a finished run's ``model.pt``, and the
    file's sha256 (:func:`read_model_file`)."""
    f = Path(d) / "model.pt"
    ck, digest = read_model_file(d)
    cfg = checked_model_file(ck, f)
    if not ck.get("snapshots"):
        raise FileNotFoundError(f"{f} keeps no snapshots (written before they were kept); rerun with --force")
    return cfg, ck["snapshots"], digest
