"""Trained ``transformers`` checkpoints (chapter 10): a ``save_pretrained`` folder of a family attnid knows,
loaded offline in float64, each attention layer audited at its trained weights on the hidden states that
really enter it (the checkpoint's own model run on seeded random tokens of its vocabulary).

The reference is the generic count of the layer's config (:func:`attnid.counting.count`, read from the
folder's ``config.json`` by :func:`attnid.configs.config_preset`), corrected for what the inputs themselves
do: a LayerNorm puts them on an affine hyperplane, which adds one direction per biased query, key and value
row (:func:`attnid.counting.biased_reader_rows`, as for attnid's own runs in :mod:`attnid.lm.points`). The
hyperplane is read off the inputs (:func:`input_deficiency`), not assumed from the family; inputs that span
less (a norm without shift, a vocabulary smaller than the width) are refused, since the count would then
describe the data.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .attention import AttentionConfig
from .audit import RTOL, audit_module, check_seed, default_data_size
from .configs import ConfigError, config_preset
from .counting import biased_reader_rows, count, nope_attention
from .families import HF_TYPES, nope_layer_flags
from .hf.build import HFAuditError, _exact_rotary, _float64_softmax, _modeling, _transformers, set_norms
from .hf.scopes import _check_memory
from .inputs import check_layers, printable

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# tensors a checkpoint may hold that are buffers of older code, not weights: not "unexpected"
BUFFER_SUFFIXES = (".inv_freq", ".masked_bias", ".attn.bias")
SPAN_RTOL = 1e-9  # an input direction whose singular value is this far below the largest is not spanned


def _check_weight_index(d: Path) -> None:
    """Refuse a sharded checkpoint whose index names a weight file outside its folder (``../``, an absolute path)."""
    index = d / "model.safetensors.index.json"
    if not index.is_file():
        return
    try:
        files = set(json.loads(index.read_text()).get("weight_map", {}).values())
    except (ValueError, AttributeError, RecursionError, OSError):
        raise ConfigError(f"checkpoint: {index} is not a weight index (JSON with a weight_map)") from None
    root = d.resolve()
    outside = sorted(str(f) for f in files if not isinstance(f, str) or root not in (root / f).resolve().parents)
    if outside:
        raise ConfigError(f"checkpoint: {index} names weight files outside its folder: {printable(outside[0])}")


def _check_model_memory(preset, d: Path, max_memory: float | None) -> None:
    """Refuse, before anything is loaded, a model whose float64 weights (from its config's count) would need more
    than ``max_memory`` bytes (default: the memory available)."""
    from .audit import available_memory
    from .presets import scope_count

    n = scope_count(preset, "model", str(d)).total_params
    need, limit = 8 * n, available_memory() if max_memory is None else max_memory
    if limit is not None and need > limit:
        raise ValueError(
            f"checkpoint: {d} holds a model of {n:,} parameters, {need / 2**30:,.3g} GiB in float64, more than the "
            f"{limit / 2**30:.3g} GiB available (--max-memory, free memory, ulimit -v, the cgroup limit)"
        )


def load_checkpoint(path: str | Path, max_memory: float | None = None) -> tuple[AttentionConfig, str, torch.nn.Module]:
    """``(cfg, hf_type, model)``: the attention config of a ``save_pretrained`` folder (its ``config.json`` read
    as :func:`attnid.configs.config_preset` reads any config, refusing what attnid does not model), its family,
    and its causal LM loaded offline in float64, eval mode, every RMSNorm computing in float64. Refused before
    loading: a model too large for ``max_memory`` bytes, a weight index that leaves the folder; after: weights the
    model lacks or does not have, and weights that are not finite."""
    d = Path(path)
    if not d.is_dir():
        raise ConfigError(f"checkpoint: {d} is not a folder (give the folder save_pretrained wrote)")
    if not any((d / f).is_file() for f in WEIGHT_FILES):
        raise ConfigError(f"checkpoint: {d} holds no weights ({', '.join(WEIGHT_FILES)}); for a config alone use "
                          "--config")  # fmt: skip
    preset = config_preset(d)
    if preset.hf_type not in HF_TYPES or not isinstance(preset.config, AttentionConfig):
        known = ", ".join(HF_TYPES)
        raise ConfigError(f"checkpoint: attnid audits trained checkpoints of {known}; this one is "
                          f"{preset.description.split(' config')[0]}")  # fmt: skip
    hf_type = preset.hf_type
    _check_weight_index(d)
    _check_model_memory(preset, d, max_memory)
    tf = _transformers()
    eager = HF_TYPES[hf_type].eager  # sdpa cannot cap the scores
    logging.getLogger("transformers").setLevel(logging.ERROR)
    tf.utils.logging.disable_progress_bar()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model, info = tf.AutoModelForCausalLM.from_pretrained(
                d,
                local_files_only=True,
                dtype=torch.float64,
                attn_implementation="eager" if eager else "sdpa",
                experts_implementation="eager",  # the experts' own loop: the grouped product has no float64
                output_loading_info=True,
            )
        except Exception as e:  # a damaged or mismatched weight file (safetensors has its own error types)
            raise ConfigError(f"checkpoint: transformers cannot load {d}: {type(e).__name__}: {printable(e)}") from None
    _check_loaded(d, model, info)
    return preset.config, hf_type, set_norms(model.eval(), exact=True)


def _check_loaded(d: Path, model: torch.nn.Module, info: dict) -> None:
    """Refuse a checkpoint whose weights the model lacks (transformers fills them with a random initialisation,
    which would be audited as if trained), holds tensors the model does not have, or holds weights that are not
    finite: each named."""
    missing = sorted(info.get("missing_keys") or [])
    unexpected = sorted(k for k in info.get("unexpected_keys") or [] if not k.endswith(BUFFER_SUFFIXES))
    mismatched = sorted(str(m[0]) if isinstance(m, tuple) else str(m) for m in info.get("mismatched_keys") or [])
    for what, names in (("lacks the weights", missing), ("holds tensors the model does not have", unexpected),
                        ("holds weights of another shape", mismatched)):  # fmt: skip
        if names:
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            raise ConfigError(f"checkpoint: {d} {what} {printable(', '.join(names[:3]), 200)}{more}; attnid audits "
                              "a checkpoint that holds every weight of its model")  # fmt: skip
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise ConfigError(f"checkpoint: {d} holds weights that are not finite in {printable(', '.join(bad[:3]), 200)}")


def attention_layers(model: torch.nn.Module, hf_type: str) -> list[torch.nn.Module]:
    """The attention modules of ``model``, first layer first."""
    name = HF_TYPES[hf_type].attention
    return [m for m in model.modules() if type(m).__name__ == name]


def layer_calls(model: torch.nn.Module, hf_type: str, ids: torch.Tensor) -> list[tuple[torch.Tensor, tuple, dict]]:
    """For each attention layer, ``(x, args, kwargs)``: the hidden states ``(B, L, E)`` it reads when ``model``
    runs on ``ids`` ``(B, L)``, and the rest of its call (position tables, mask) as the model made it."""
    calls: list[tuple[torch.Tensor, tuple, dict]] = []

    def keep(module, args, kwargs):
        kw = dict(kwargs)
        x = kw.pop("hidden_states") if "hidden_states" in kw else args[0]
        rest = args if "hidden_states" in kwargs else args[1:]
        calls.append((x.detach(), rest, kw))

    hooks = [m.register_forward_pre_hook(keep, with_kwargs=True) for m in attention_layers(model, hf_type)]
    try:
        with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
            model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return calls


def input_deficiency(x: torch.Tensor, rtol: float = SPAN_RTOL) -> tuple[int, int]:
    """``(linear, affine)``: how many dimensions the tokens ``x`` ``(..., E)`` leave out of the space (directions
    ``a`` with ``a·x = 0`` for all of them) and of affine space (``a·x = c``; a LayerNorm's hyperplane is one)."""
    X = x.reshape(-1, x.shape[-1]).to(torch.float64)
    ones = X.pow(2).mean().sqrt() * torch.ones(X.shape[0], 1, dtype=X.dtype)  # the constant, at the inputs' scale

    def missing(A: torch.Tensor) -> int:
        s = torch.linalg.svdvals(A)
        return A.shape[1] - int((s > rtol * s[0]).sum())

    return missing(X), missing(torch.cat([X, ones], 1))


def generic_count_on(cfg: AttentionConfig, x: torch.Tensor) -> tuple[int, bool]:
    """``(count, hyperplane)``: the unidentified directions of ``cfg``'s layer at generic weights on inputs ``x``
    ``(..., E)``: :func:`attnid.counting.count`, plus :func:`attnid.counting.biased_reader_rows` where the inputs
    lie on an affine hyperplane. Other inputs spanning less than the space are refused (:class:`HFAuditError`)."""
    linear, affine = input_deficiency(x)
    if linear == 0 and affine == 0:
        return count(cfg).unidentified, False
    if linear == 0 and affine == 1 and all(c in cfg.bias for c in "qkv"):
        return count(cfg).unidentified + biased_reader_rows(cfg), True
    if linear == 0 and affine == 1:
        raise HFAuditError("inputs: the layer's inputs lie on a hyperplane (a LayerNorm's) and some query, key or "
                           "value rows have no bias; attnid derives that case for biased rows only")  # fmt: skip
    raise HFAuditError(
        f"inputs: the layer's inputs span only {cfg.E - max(linear, affine - 1)} of {cfg.E} dimensions "
        f"(linear deficiency {linear}, affine {affine}), so its count would describe the data, not the weights "
        "(a norm without shift, or a vocabulary narrower than the width)"
    )


def layer_config(cfg: AttentionConfig, hf_type: str, config: Any, k: int) -> AttentionConfig:
    """The attention of layer ``k`` (from 0) of a checkpoint whose layers are ``cfg``'s: a NoPE layer of a type with
    them (:func:`attnid.families.nope_layer_flags`: SmolLM3's and Llama 4's ``no_rope_layers``, Command R7B's and
    EXAONE 4's full-attention layers) has no rotation, and no QK-norm where the type normalises in its RoPE layers
    only."""
    if nope_layer_flags(hf_type, config)[k]:
        return nope_attention(cfg, HF_TYPES[hf_type].nope_qk_norm)
    return cfg


INPUT_NORMS = ("ln_1", "input_layernorm", "self_attn_layer_norm")  # the norm in front of a layer's attention


def _zero_shift_note(model: torch.nn.Module, k: int) -> str:
    """Where layer ``k``'s input norm has a shift of zero in every coordinate, a note naming it as the cause of inputs
    on a hyperplane through the origin: a LayerNorm at its initialisation, so likely an untrained checkpoint."""
    for name, m in model.named_modules():
        parts = name.split(".")
        bias = getattr(m, "bias", None)
        if parts[-1] in INPUT_NORMS and str(k) in parts and isinstance(bias, torch.Tensor) and not bias.any():
            return (
                f"; the cause: layer {k + 1}'s input norm ({name}) has a shift of zero in every coordinate, as a "
                "LayerNorm has at its initialisation (is this checkpoint untrained? attnid audits trained weights)"
            )
    return ""


def audit_checkpoint(
    path: str | Path,
    *,
    layers: list[int] | None = None,
    seed: int = 0,
    rtol: float = RTOL,
    max_memory: float | None = None,
    progress: bool = False,
) -> list[dict]:
    """Audit each attention layer (or ``layers``) of the checkpoint in folder ``path`` at its trained weights: the
    dense Jacobian on the hidden states entering it (the model run on seeded random tokens, as many as
    :func:`attnid.audit.default_data_size` asks), against :func:`generic_count_on` those inputs. Rows have the
    keys of :func:`attnid.lm.points.audit_point` (``layer``, ``params``, ``rank``, ``unidentified``, ``generic``,
    ``at_generic``, ``gap``, ``weakest``, ``method``, ``note``, ``seconds``) and ``hyperplane``. A layer whose
    dense Jacobian needs more than ``max_memory`` bytes (default: the memory available) is refused before
    anything is run."""
    from tqdm import tqdm

    check_seed(seed)
    cfg, hf_type, model = load_checkpoint(path, max_memory)
    attns = attention_layers(model, hf_type)
    chosen = [k - 1 for k in check_layers(layers, len(attns))]  # numbered from 1, indexed from 0
    n = sum(p.numel() for p in attns[0].parameters())
    B, L = default_data_size(cfg, n)
    field = "n_positions" if hf_type == "gpt2" else "max_position_embeddings"  # learned or rotary positions
    config: Any = model.config  # a transformers PretrainedConfig
    context = getattr(config, field, None)
    if context is not None and context < L:
        raise ValueError(f"checkpoint: the audit reads sequences of {L} tokens; the model has {context} positions")
    _check_memory(f"{hf_type} attention", cfg.E, n, B * L * cfg.E, max_memory, "checkpoint")
    vocab = config.vocab_size
    ids = torch.randint(0, vocab, (B, L), generator=torch.Generator().manual_seed(20_000 + seed))
    calls = layer_calls(model, hf_type, ids)
    eager, modeling = HF_TYPES[hf_type].eager, _modeling(hf_type)
    rows = []
    for k in tqdm(chosen, desc="layers", disable=not progress):
        x, args, kw = calls[k]
        t0 = time.perf_counter()
        try:
            generic, hyperplane = generic_count_on(layer_config(cfg, hf_type, config, k), x)
        except HFAuditError as e:
            raise HFAuditError(f"{e}{_zero_shift_note(model, k)}") from None

        def forward(call, h, args=args, kw=kw):  # the rotation in float64 where the library's runs in float32
            with (
                sdpa_kernel([SDPBackend.MATH]),
                _float64_softmax() if eager else nullcontext(),
                _exact_rotary(modeling),
            ):
                return call(h, *args, **kw)

        r = audit_module(attns[k], (x,), forward=forward, rtol=rtol)
        sv = r.singular_values or [1.0]
        rows.append({
            "layer": k + 1, "params": n, "rank": r.rank, "unidentified": r.unidentified, "generic": generic,
            "at_generic": r.unidentified == generic, "gap": r.sv_gap, "weakest": sv[r.rank - 1] / sv[0],
            "method": "dense", "note": "", "hyperplane": hyperplane, "seconds": time.perf_counter() - t0,
            "tokens": B * L,
        })  # fmt: skip
    return rows
