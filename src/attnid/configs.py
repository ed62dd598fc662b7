"""A model's ``config.json`` read into what attnid counts: the attention config, the family and the whole
model (:class:`attnid.presets.Preset`), as ``transformers``' own config classes read it
(:mod:`attnid.library_configs`, without the library) so that every field a file leaves out takes the library's
default, not ours (``attnid count --config``, ``audit --config``).

Every field of the config is accounted for: attnid reads it (:func:`config_preset`), or it cannot change
the count (:data:`attnid.config_fields.NEUTRAL`, each with its reason), or it holds the value the family's audits
were verified at (the config class's default). Any other value is refused by name, never ignored. The presets' released
configs ship under ``data/configs/`` (:data:`CONFIG_DIR`); ``tests/test_configs.py`` checks that each one
reads to its preset.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from .attention_config import AttentionConfig
from .config_fields import (
    ACTIVATION_FIELDS,
    ACTIVATIONS,
    ATTENTION_ONLY_NEUTRAL,
    BIAS_FIELDS,
    BLOCK_ONLY_FIELDS,
    CHECKED_BY_READER,
    FAMILY_BIAS,
    FAMILY_FIXED,
    FIXED_BY_CODE,
    GRANITE_MULTIPLIERS,
    MIN_WINDOW,
    MLP_BIAS_SWITCHES,
    NEUTRAL,
    OLDER_NAMES,
    POSITIVE,
    QK_NORM_FIELDS,
    REMOTE_CODE,
    REMOTE_CODE_NOTE,
    ROPE_FIELDS,
    SPLIT_BIAS_FIELDS,
    TRUTH_FIELDS,
    ConfigError,
)
from .config_hybrid import hybrid_model
from .config_mixtures import (
    _ernie_mixture_model,
    _grouped_mixture_model,
    _hunyuan_model,
    _layer_kinds_and_head,
    _llama4_model,
    _mixture_model,
    _positive,
    read_latent,
)
from .config_multimodal import TEXT_MODELS, multimodal_text
from .config_rope import positive_number, rope_of, unread_rotary_share
from .counting import Count, MLAConfig
from .families import HF_TYPES, MLA_TYPES, default_ffn, equivalent_config
from .family_kwargs import GROUPED_ROUTER_TYPES
from .hub import ConfigSource, locate_config
from .inputs import printable
from .library_configs import (
    LibraryConfig,
    LibraryConfigError,
    code_reads,
    default_dict,
    library_config,
    supported_version,
)
from .presets import Model, Preset, scope_count

CONFIG_DIR = Path(__file__).resolve().parents[2] / "data" / "configs"
MAX_CONFIG_BYTES = 16 * 2**20  # the largest config.json read (a file past it is refused unread)
SOURCE_KEY = "_attnid"  # in a shipped file: {"source": the released file, "note": what was transcribed}


ATTENTION_ONLY_TYPES = ("bert", "gemma")  # counted at scope attention (no block attnid models)

# model types with a config class of their own whose model another family's code builds (transformers' auto mapping
# names that family's causal LM): each is read as that family
BUILT_AS = {"internlm3": "llama"}

CONFIG_TYPES = (*HF_TYPES, *MLA_TYPES, *ATTENTION_ONLY_TYPES, *BUILT_AS)

# families transformers ships whose layers hold what attnid does not model yet, and what that is (Llama 4, Qwen3-Next
# and Command R, once here, are read below)
_MAMBA2_ALONE = "chapter 9 counts a Mamba-2 mixer and its layer alone (attnid.counting.mamba)"
UNMODELLED: dict[str, str] = {
    "jamba": "its Mamba-1 mixers, whose time steps, B and C pass RMSNorms of their own, are not derived",
    "mamba": "its Mamba-1 mixers are not derived, and it has no attention layer",
    "falcon_mamba": "its Mamba-1 mixers are not derived, and it has no attention layer",
    "mamba2": f"it has no attention layer; {_MAMBA2_ALONE}",
    "falcon_h1": ("each layer runs Mamba-2 and attention side by side on one input, with fixed vectors of multipliers "
                  f"on the mixer's projections; not derived ({_MAMBA2_ALONE})"),
    "zamba": "its shared attention block, reused at several depths on the stream and the embeddings, is not derived",
    "zamba2": ("its shared attention blocks, reused at several depths with LoRA adapters on the stream and the "
               "embeddings, are not derived"),
    "minimax": "its lightning attention, a linear attention with a decay per head, is not derived",
    "gemma3n": "its per-layer embeddings, AltUp and LAuReL blocks and sparse activations are not derived",
    "gemma3n_text": "its per-layer embeddings, AltUp and LAuReL blocks and sparse activations are not derived",
    "lfm2_moe": "LFM2's mixture-of-experts variant (a sigmoid router with a bias, after dense layers) is not derived",
}  # fmt: skip


def read_config(path: str | Path) -> tuple[dict, str]:
    """``(fields, source)`` of a ``config.json`` (or a folder holding one): its JSON object, and the released
    file it names under :data:`SOURCE_KEY` (a shipped config) or else its path."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"config: {p} is not a config.json file (or a folder holding one)")
    size = p.stat().st_size
    if size > MAX_CONFIG_BYTES:  # released files are a few kB (Llama 4's, with every layer listed, 6 kB)
        raise ConfigError(f"config: {p} holds {size:,} bytes, more than a model's config.json "
                          f"({MAX_CONFIG_BYTES // 2**20} MiB at most); is it a weights file?")  # fmt: skip
    try:
        fields = json.loads(p.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"config: {p} is not JSON ({printable(e)})") from None
    except RecursionError:
        raise ConfigError(f"config: {p} nests its JSON too deeply to be a model's config") from None
    if not isinstance(fields, dict):
        raise ConfigError(f"config: {p} holds a {type(fields).__name__}, not a JSON object")
    note = fields.pop(SOURCE_KEY, None)
    source = note.get("source", str(p)) if isinstance(note, dict) else str(p)
    return fields, printable(source, 200)  # a string from the file: shown escaped and cut


def load_config(source: str | Path, revision: str | None = None) -> Preset:
    """The :class:`~attnid.presets.Preset` of a model's config: a local ``config.json`` (or a folder holding one), or
    a model on the Hub by its name ``ORG/NAME[@REVISION]`` (:func:`attnid.hub.locate_config`; only its
    ``config.json`` is fetched). :class:`ConfigError` naming the field for anything attnid cannot count,
    :class:`attnid.hub.HubError` for a model that cannot be had."""
    origin = locate_config(source, revision)
    return config_preset(origin.path, origin=origin)


def count_config(source: str | Path, scope: str = "attention", revision: str | None = None) -> Count:
    """The closed-form count of a model's config (:func:`load_config`) at ``scope``: ``"attention"`` (one attention
    layer, §4), ``"block"`` (one decoder layer) or ``"model"`` (the whole model; chapters 8–9)."""
    p = load_config(source, revision)
    return scope_count(p, scope, p.description)


def config_preset(path: str | Path, origin: ConfigSource | None = None) -> Preset:
    """The :class:`~attnid.presets.Preset` of the model a local ``config.json`` describes (counted like a preset by
    :func:`attnid.presets.scope_count`); :class:`ConfigError` naming the field for anything attnid cannot
    count. ``origin``: where the file came from (a model on the Hub), named in the description."""
    fields, source = read_config(path)
    if origin is not None and origin.repo is not None:
        source = origin.describe()
    model_type = fields.get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError(f"config: {source} names no model_type; attnid knows {', '.join(CONFIG_TYPES)}")
    outer_tie: bool | None = None  # a multimodal file's tying, where its multimodal class decides it
    unread_tie: dict[str, str] = {}
    if model_type in TEXT_MODELS:  # a multimodal release
        fields, source, model_type, outer_tie, unread_tie = multimodal_text(fields, source, model_type)
    hf_type = {"gemma3_text": "gemma3", "llama4_text": "llama4", "qwen2_5_vl_text": "qwen2_5_vl",
               "qwen3_vl_text": "qwen3_vl", "qwen3_vl_moe_text": "qwen3_vl_moe", "qwen3_5_text": "qwen3_5",
               "qwen3_5_moe_text": "qwen3_5_moe", **BUILT_AS}.get(model_type, model_type)  # fmt: skip
    if hf_type in UNMODELLED:
        raise ConfigError(f"config: model_type {model_type!r}: {UNMODELLED[hf_type]}; attnid refuses rather than count "
                          "it as another family")  # fmt: skip
    if hf_type not in CONFIG_TYPES:
        raise ConfigError(f"config: model_type {model_type!r} is not a family attnid knows; it knows "
                          f"{', '.join(CONFIG_TYPES)}")  # fmt: skip
    remote = fields.pop(REMOTE_CODE, None)  # data, never code: the family is the one model_type names
    fields, truths = _truth_values(fields)
    c = _library_config(model_type, fields)
    got: tuple[AttentionConfig | MLAConfig, Model | None, set[str]]
    if hf_type in MLA_TYPES:
        got = read_latent(c)
    elif hf_type in ATTENTION_ONLY_TYPES:
        got = _read_attention_only(hf_type, c)
    elif hf_type == "falcon":
        got = _read_falcon(c)
    else:
        got = _read_family(hf_type, c)
    config, model, read = got
    default = default_dict(model_type)  # the config class's defaults: the values the family's audits were verified at
    beyond = _refuse_unmodelled(c, read, hf_type, default, code_reads(model_type))
    only = _attention_only_reason(hf_type, c)
    switch = MLP_BIAS_SWITCHES.get(hf_type)
    beyond += [f"{switch} = True (biases on the gated MLP too)"] if switch is not None and getattr(c, switch) else []
    if beyond:  # fields of the block that attnid does not model: its attention is still counted
        model, only = None, (f"{'; '.join(beyond)}: not modelled for {hf_type}'s decoder layer (they do not reach "
                             "its attention layer)")  # fmt: skip
    if model is not None:
        model = replace(model, source=source, tied=model.tied if outer_tie is None else outer_tie)
    reading = config_reading(fields, c, read, remote is not None, default, code_reads(model_type), hf_type)
    reading["truth_values"] = truths
    reading["neutral"].update(unread_tie)
    if outer_tie is not None:  # the multimodal class's tying, not the text model's default
        reading["defaults"].pop("tie_word_embeddings", None)
    unread_rotary_share(reading, hf_type)
    # no module audits Falcon RW's ALiBi attention here (BLOOM's verifies ALiBi)
    family = None if hf_type in ATTENTION_ONLY_TYPES or (hf_type == "falcon" and c.alibi) else hf_type
    return Preset(f"{model_type} config ({source})", config, family,
                  model, reading=reading, attention_only=only, origin=origin or ConfigSource(Path(path)))  # fmt: skip


def _attention_only_reason(hf_type: str, c) -> str:
    """Why a family with a counted attention has no counted block or model (Falcon RW's ALiBi layers)."""
    if hf_type == "falcon" and c.alibi:
        return ("its layers use ALiBi (Falcon RW): attnid counts their attention as BLOOM's, a layer without a "
                "position map, and audits Falcon's decoder layer with RoPE only")  # fmt: skip
    return ""


def _truth_values(fields: dict) -> tuple[dict, dict]:
    """``fields`` with each :data:`TRUTH_FIELDS` number replaced by its truth value, and ``{field: "v read as b"}``."""
    truths = {}
    for k in TRUTH_FIELDS:
        v = fields.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            truths[k] = f"{printable(repr(v))} read as {bool(v)} (the model's code reads its truth value)"
            fields = {**fields, k: bool(v)}
    return fields, truths


def config_reading(fields: dict, c, read: set[str], remote_code: bool, default: dict, by_code: frozenset[str],
                   family: str) -> dict:  # fmt: skip
    """What attnid made of a config file (``count --config`` prints it, ``--json`` carries it): ``read``, the
    file's fields that the count reads; ``neutral``, those accepted because they cannot change the count, each with
    its reason (``auto_map`` among them: the remote code it names is not read; a field that no code of the family
    reads, ``by_code`` being the fields it reads); ``at_default``, those at the config class's default (the value
    the family's audits were verified at); ``fixed``, those at the one value transformers' code implements;
    ``defaults``, the fields the count reads that the file left out, at the library's defaults."""
    lib = c.to_dict()
    fixed_by_code = fixed_fields(family)
    if "rope_parameters" in read:
        # GPT-NeoX's names are gathered by its own class only
        read = read | {f for f in ROPE_FIELDS if f not in ("rotary_pct", "rotary_emb_base") or family == "gpt_neox"}
    # the name the class keeps each field under
    stored = {k: OLDER_NAMES.get(k, c.attribute_map.get(k, k)) for k in fields}
    # an older name of the layer kinds given beside layer_types: the class reads it only when layer_types is absent
    shadowed = {k for k in fields if stored[k] == "layer_types" != k and "layer_types" in fields}
    read = read | {k for k in fields if stored[k] in read and k not in shadowed}
    neutral = {k: NEUTRAL[k] for k in sorted(fields) if k in NEUTRAL and k not in read}
    neutral.update({k: "given beside layer_types, from which the class takes the layers' kinds" for k in shadowed})
    unread = unread_reason(family)
    neutral.update({k: unread for k in sorted(fields) if k not in read and k not in NEUTRAL and stored[k] not in by_code
                    and k not in by_code and k not in fixed_by_code and k != REMOTE_CODE})  # fmt: skip
    if remote_code:
        neutral[REMOTE_CODE] = REMOTE_CODE_NOTE
    fixed = {k: fields[k] for k in sorted(fields) if k in fixed_by_code}
    listed = set(read) | set(neutral) | set(fixed)
    at_default = [k for k in fields if k not in listed and stored[k] in default and default[stored[k]] == fields[k]]
    given = set(fields) | set(stored.values())
    return {
        "read": sorted(k for k in fields if k in read),
        # neither read nor neutral, at the class default: the value the family's audits were verified at
        "at_default": sorted(at_default),
        "neutral": neutral,
        "fixed": fixed,
        "defaults": {k: lib[k] for k in sorted(read) if k in lib and k not in given and k not in ACTIVATION_FIELDS},
    }


def _library_config(model_type: str, fields: dict) -> LibraryConfig:
    """transformers' config for ``fields`` (:func:`attnid.library_configs.library_config`, without the library):
    the library's defaults for every field left out."""
    try:
        return library_config(model_type, fields)
    except (LibraryConfigError, TypeError, ZeroDivisionError) as e:  # a kind, or arithmetic on a value of none
        raise ConfigError(
            f"config: transformers {supported_version()} refuses this {model_type} config: {printable(e, 200)}"
        ) from None


def _activations(c, hf_type: str) -> set[str]:
    """The MLP activation fields a config has, after checking that each value is one the family's MLP kind
    (:data:`ACTIVATIONS`) stands for."""
    names = {f for f in ACTIVATION_FIELDS if f in c.to_dict()}
    mlp = HF_TYPES[hf_type].mlp
    for name in sorted(names):
        if getattr(c, name) not in ACTIVATIONS[mlp]:
            raise ConfigError(f"{name}: {getattr(c, name)!r} is not modelled for {hf_type} (its {mlp} MLP has "
                              f"{', '.join(ACTIVATIONS[mlp])})")  # fmt: skip
    return names


def _read_family(hf_type: str, c) -> tuple[AttentionConfig, Model | None, set[str]]:
    """A family with a counted decoder layer (:data:`attnid.families.HF_TYPES`)."""
    t = HF_TYPES[hf_type]
    E = c.hidden_size
    cfg, read = _read_attention(hf_type, c)
    if t.hybrid:  # LFM2, Bamba, Qwen3-Next, Granite 4: attention layers beside layers of another mixer
        return cfg, hybrid_model(hf_type, c, cfg, read), read
    if hf_type == "llama4":
        return cfg, _llama4_model(c, read), read
    if hf_type in ("cohere", "cohere2"):
        read |= _logit_scale(c)
    if hf_type == "gpt2":
        ffn = _positive(c, "n_inner", default=4 * E)
    elif t.fixed_ffn:  # BLOOM: 4E by its code
        ffn = default_ffn(hf_type, E)
    elif hf_type in GROUPED_ROUTER_TYPES:
        return cfg, _grouped_mixture_model(c, t, read), read
    elif hf_type == "ernie4_5_moe":
        return cfg, _ernie_mixture_model(c, t, read), read
    elif hf_type == "hunyuan_v1_moe":
        return cfg, _hunyuan_model(c, t, read), read
    elif t.moe:
        return cfg, _mixture_model(c, hf_type, read), read
    else:
        ffn = _positive(c, "ffn_dim" if hf_type == "opt" else "intermediate_size", default=None)
    context = {"gpt2": "n_positions", "opt": "max_position_embeddings"}.get(hf_type)
    if context:
        read.add(context)
    model = Model(c.num_hidden_layers, ffn, c.vocab_size, bool(getattr(c, "tie_word_embeddings", False)), "",
                  context=getattr(c, context) if context else 0, **_layer_kinds_and_head(c, t, read))  # fmt: skip
    return cfg, model, read


def _read_attention(hf_type: str, c) -> tuple[AttentionConfig, set[str]]:
    """The attention of a family's config, and the fields read (the model's sizes among them)."""
    t = HF_TYPES[hf_type]
    d = c.to_dict()
    E, H = c.hidden_size, c.num_attention_heads
    G = _positive(c, "num_key_value_heads", default=H)  # a field left out (None) takes its default; 0 is refused
    D = _positive(c, "head_dim", default=E // H)
    bias_fields: tuple[str, ...] = ()  # the field that switches the family's biases (none: its code fixes them)
    if hf_type in FAMILY_BIAS:
        bias = FAMILY_BIAS[hf_type]
    elif hf_type in SPLIT_BIAS_FIELDS:
        pairs = SPLIT_BIAS_FIELDS[hf_type]
        bias, bias_fields = "".join(letters for f, letters in pairs if getattr(c, f)), tuple(f for f, _ in pairs)
    else:
        field, letters = BIAS_FIELDS.get(hf_type, ("attention_bias", "qkvo"))
        bias, bias_fields = (letters if getattr(c, field) else ""), (field,)
    read = {"hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", *bias_fields,
            *_multipliers(c, hf_type),
            "num_hidden_layers", "vocab_size", "tie_word_embeddings", "rope_parameters", "attn_logit_softcapping",
            "n_embd", "n_head", "n_layer", "n_inner", "intermediate_size", "ffn_dim", "word_embed_proj_dim",
            *_activations(c, hf_type)}  # fmt: skip
    if hf_type == "opt" and c.word_embed_proj_dim != E:
        raise ConfigError(f"word_embed_proj_dim: {c.word_embed_proj_dim} != hidden_size {E} is not modelled "
                          "(OPT's projections in and out of the embedding)")  # fmt: skip
    rope_dims = None
    base = 10000.0
    if t.rotary is not None:
        base, share = rope_of(c, t.partial_rope)
        rope_dims = int(D * share) if t.partial_rope else None  # as transformers takes it
    if t.mrope:
        _check_mrope_sections(c.rope_parameters or {}, D, t.interleaved_mrope)
    qk_norm, eps = _qk_norm_of(c, hf_type, read)
    try:
        cfg = equivalent_config(hf_type, embed=E, heads=H, groups=G, head_dim=D, rope_dims=rope_dims, bias=bias,
                                norm_eps=eps, qk_norm=qk_norm)  # fmt: skip
        if t.rotary is not None:
            cfg = cfg.with_(rope_base=base)
        if "attn_logit_softcapping" in d:
            cfg = cfg.with_(logit_softcap=c.attn_logit_softcapping)
    except ValueError as e:
        raise ConfigError(f"config: {e}") from None
    return cfg, read


def _check_mrope_sections(rope: dict, D: int, interleaved: bool) -> None:
    """M-RoPE's ``mrope_section``: how many of a head's ``D / 2`` rotated pairs each of the three position streams
    (time, height, width) turns. Qwen2.5-VL's code splits the pairs into three runs by it, so it must be three counts
    that add up to ``D / 2``; Qwen3-VL's deals the pairs out in turn (time, height, width, time, ...), height and width
    stopping after their counts and time taking the rest, so three counts do. Which pairs go to which stream does not
    change the count (every pair keeps its own frequency)."""
    sections = rope.get("mrope_section", [24, 20, 20] if interleaved else [16, 24, 24])
    ok = isinstance(sections, list) and len(sections) == 3
    ok = ok and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sections)
    if interleaved and not ok:
        raise ConfigError(f"rope_parameters: mrope_section {printable(repr(sections), 60)} must give the three "
                          "position streams counts of rotated pairs")  # fmt: skip
    if not interleaved and (not ok or sum(sections) != D // 2):
        raise ConfigError(f"rope_parameters: mrope_section {printable(repr(sections), 60)} must give the three "
                          f"position streams counts of rotated pairs adding up to head_dim / 2 = {D // 2}")  # fmt: skip


def _qk_norm_of(c, hf_type: str, read: set[str]) -> tuple[str, float]:
    """``(qk_norm, ε)`` of a config: the family's QK-norm, or the one its field switches on or off
    (:data:`QK_NORM_FIELDS`, added to ``read``), at the ε of its norms."""
    qk_norm = HF_TYPES[hf_type].qk_norm
    if hf_type in QK_NORM_FIELDS:
        field, norm = QK_NORM_FIELDS[hf_type]
        read.add(field)
        qk_norm = norm if getattr(c, field) else ""
    d = c.to_dict()
    eps = "layer_norm_eps" if qk_norm == "layer" else "norm_eps" if hf_type == "lfm2" else "rms_norm_eps"
    return qk_norm, (d.get(eps, 0.0) if qk_norm else 0.0)


def _logit_scale(c) -> set[str]:
    """Command R's fixed factor on the logits, after checking it is a finite number other than 0."""
    v = c.logit_scale
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v != 0):
        raise ConfigError(f"logit_scale: {printable(repr(v))} must be a finite number other than 0 (a fixed factor)")
    return {"logit_scale"}


def _multipliers(c, hf_type: str) -> tuple[str, ...]:
    """Granite's fixed factors (on the embedding, the scores, each branch and the logits), after checking that each
    is a finite number other than 0 (a factor of 0 cuts what it multiplies): any such factor is absorbed by the
    weights beside it, so the count is Llama's."""
    if hf_type not in ("granite", "granitemoehybrid"):
        return ()
    for name in GRANITE_MULTIPLIERS:
        v = getattr(c, name)
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v != 0):
            raise ConfigError(f"{name}: {printable(repr(v))} must be a finite number other than 0 (a fixed factor)")
    return GRANITE_MULTIPLIERS


def _read_falcon(c) -> tuple[AttentionConfig, Model | None, set[str]]:
    """Falcon: its attention, with RoPE or (Falcon RW) ALiBi, a fixed bias on the scores counted as BLOOM's is, as a
    layer without a position map; with RoPE its decoder layer as its three switches wire it
    (:func:`attnid.family_kwargs.falcon_kwargs`)."""
    E, H, new = c.hidden_size, c.num_attention_heads, bool(c.new_decoder_architecture)
    G = c.num_kv_heads if new else 1 if c.multi_query else H
    read = {"hidden_size", "num_attention_heads", "num_kv_heads", "new_decoder_architecture", "multi_query", "bias",
            "alibi", "rope_parameters", "parallel_attn", "num_ln_in_parallel_attn", "ffn_hidden_size",
            "num_hidden_layers", "vocab_size", "tie_word_embeddings", *_activations(c, "falcon")}  # fmt: skip
    ln = c.num_ln_in_parallel_attn  # the layer reads a LayerNorm its __init__ did not make, or none at all:
    if (new and not c.parallel_attn) or (c.parallel_attn and (ln not in (None, 1, 2) if new else ln == 2)):
        raise ConfigError(f"parallel_attn = {c.parallel_attn!r}, new_decoder_architecture = {new}, "
                          f"num_ln_in_parallel_attn = {c.num_ln_in_parallel_attn!r}: transformers' Falcon code builds "
                          "no such layer")  # fmt: skip
    base, _ = rope_of(c, partial=False)
    try:
        cfg = AttentionConfig(E, H, groups=G, bias="qkvo" if c.bias else "", rope=not c.alibi, causal=True,
                              rope_base=base)  # fmt: skip
    except ValueError as e:
        raise ConfigError(f"config: {e}") from None
    if c.alibi:
        return cfg, None, read
    two_norms = new and c.num_ln_in_parallel_attn in (None, 2)
    residual = "parallel" if two_norms else "shared_norm" if c.parallel_attn else "sequential"
    ffn = _positive(c, "ffn_hidden_size", default=4 * E)
    return cfg, Model(c.num_hidden_layers, ffn, c.vocab_size, bool(c.tie_word_embeddings), "", residual=residual), read


def _read_attention_only(hf_type: str, c) -> tuple[AttentionConfig, None, set[str]]:
    """BERT and Gemma (1): their attention only."""
    E, H = c.hidden_size, c.num_attention_heads
    read = {"hidden_size", "num_attention_heads", *ATTENTION_ONLY_NEUTRAL}
    try:
        if hf_type == "bert":
            read |= {"is_decoder"}
            return AttentionConfig(E, H, bias="qkvo", causal=bool(c.is_decoder)), None, read
        base, _ = rope_of(c, partial=False)
        read |= {"num_key_value_heads", "head_dim", "attention_bias", "rope_parameters", "use_bidirectional_attention"}
        cfg = AttentionConfig(E, H, groups=c.num_key_value_heads, head_dim=c.head_dim,
                              bias="qkvo" if c.attention_bias else "", rope=True,
                              causal=not c.use_bidirectional_attention, rope_base=base)  # fmt: skip
        return cfg, None, read
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(f"config: {e}") from None


def unread_reason(family: str) -> str:
    """The reason a field no code of ``family`` reads is accepted."""
    return f"not read by transformers {supported_version()}'s {family} code (its modeling and config modules)"


def fixed_fields(hf_type: str) -> dict[str, object]:
    """The fields whose one value transformers' ``hf_type`` code implements (:data:`FIXED_BY_CODE`, the family's own
    in :data:`FAMILY_FIXED`), less those its reader checks."""
    merged = {**FIXED_BY_CODE, **FAMILY_FIXED.get(hf_type, {})}
    return {k: v for k, v in merged.items() if v != CHECKED_BY_READER}


def _refuse_unmodelled(c, read: set[str], hf_type: str, default: dict, by_code: frozenset[str]) -> list[str]:
    """Refuse, naming them, the fields attnid neither reads nor knows to be neutral that the family's code reads
    (``by_code``: :func:`attnid.library_configs.code_reads`) and that differ from the config class's ``default``
    (the value the family's audits were verified at); and a norm's ε ≤ 0. A field no code of the family reads cannot
    change its function: it is accepted (:func:`config_reading` says so). Returns the refused fields that shape only
    the decoder layer around the attention (:data:`BLOCK_ONLY_FIELDS`), when no other field is refused: the
    attention is still counted."""
    # a field the class does not know is read by no code (activations aside, which are checked): never "read"
    # also head_dim where the family's code reads it with getattr (Qwen3-MoE's class does not declare it), and
    # gpt-oss's experts_per_token, checked against num_experts_per_tok
    checked = (*ACTIVATION_FIELDS, "head_dim", "experts_per_token")
    read = (read & set(default)) | {f for f in checked if f in read and hasattr(c, f)}
    if "rope_parameters" in read:  # Phi-3 keeps partial_rotary_factor beside the rope_parameters it was read into
        read |= set(ROPE_FIELDS)
    bad = []
    fixed_by_code = fixed_fields(hf_type)
    for k, v in c.to_dict().items():
        if k in NEUTRAL and "ε" in NEUTRAL[k] and isinstance(v, (int, float)) and not (math.isfinite(v) and v > 0):
            bad.append(f"{k} = {v!r} (attnid counts norms with ε > 0)")
        elif k in POSITIVE and v is not None and not positive_number(v):
            bad.append(f"{k} = {printable(repr(v))} ({POSITIVE[k]})")
        elif k == "sliding_window" and v is not None and not (isinstance(v, int) and v >= MIN_WINDOW):
            bad.append(f"{k} = {printable(repr(v))} (a window of one token: each query sees only itself, its scores "
                       "do nothing and every query and key weight is unidentified; attnid counts windows of at least "
                       f"{MIN_WINDOW} tokens, where the count of full causal attention holds)")  # fmt: skip
        elif k in fixed_by_code:
            if v != fixed_by_code[k]:
                bad.append(f"{k} = {v!r} (transformers' code implements {fixed_by_code[k]!r} only)")
        elif (
            k not in read
            and OLDER_NAMES.get(k) not in read
            and k not in NEUTRAL
            and k in by_code
            and (k not in default or default[k] != v)
        ):
            bad.append(printable(f"{k} = {v!r}", 120) + (f" (default {printable(repr(default[k]))})" if k in default
                                                         else " (a field unknown here)"))  # fmt: skip
    beyond = [b for b in bad if b.split(" = ", 1)[0] in BLOCK_ONLY_FIELDS]
    if len(beyond) < len(bad):
        raise ConfigError(f"config: {'; '.join(bad)}: not modelled for {hf_type}, and it may change the count; "
                          "attnid refuses rather than ignore it")  # fmt: skip
    return beyond
