"""``transformers``' config classes, as attnid reads them, without transformers or torch.

A ``config.json`` leaves most fields out; the model is then built at its config class's defaults, and some fields
are derived from others (a head's size from the width, the layer kinds from a pattern, the RoPE fields gathered into
``rope_parameters``). :func:`library_config` does what transformers 5.24's config class of a model type does with a
file's fields, for the types attnid reads: each declared field's default and JSON kind (from
``library_configs.json``, which ``tools/snapshot_library_configs.py`` writes from the library), the class's
``attribute_map``, its ``__post_init__`` (:data:`POST_INIT`) and the RoPE standardisation its base class applies.
``tests/test_library_configs.py`` checks, on every shipped and released file and on planted variants, that the
reading equals the one through transformers' own classes.

Emulated too: the validators that read the architecture (the heads dividing the width where the class requires it,
the layer types' names and number). Not emulated: the range checks of fields that cannot change a count (an
initialiser's scale in ``[0, 1]``), and the library's warnings.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).with_name("library_configs.json")

# what transformers' base class pops from the fields before it keeps the rest as attributes: generation parameters,
# bookkeeping of the Hub and of kernels (all neutral for the count)
GENERATION_FIELDS = ("max_length", "min_length", "do_sample", "early_stopping", "num_beams", "temperature", "top_k",
                     "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
                     "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
                     "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
                     "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "epsilon_cutoff",
                     "eta_cutoff", "encoder_repetition_penalty", "num_assistant_tokens",
                     "num_assistant_tokens_schedule", "assistant_confidence_threshold", "assistant_lookbehind",
                     "target_lookbehind", "num_beam_groups", "diversity_penalty")  # fmt: skip
POPPED = ("name_or_path", "_commit_hash", "attn_implementation", "experts_implementation", "per_layer_config",
          "_attn_implementation_internal", "_experts_implementation_internal")  # fmt: skip
LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention",
                      "deepseek_sparse_attention": "indexed_attention",
                      "qwen_sparse_attention": "indexed_attention"}  # fmt: skip
SCALED_ROPE = ("llama3", "yarn", "longrope")  # the RoPE types that keep the pretraining length in their parameters
MAX_LABELS = 1024  # a classifier's labels made from num_labels (neutral): more are not tabulated


class LibraryConfigError(ValueError):
    """A value transformers' config class refuses (a field of the wrong JSON kind); the message names the field."""


@cache
def snapshot() -> dict:
    """The snapshot of transformers' config classes (``library_configs.json``)."""
    return json.loads(SNAPSHOT.read_text())


def supported_version() -> str:
    """The transformers version whose config classes the snapshot holds."""
    return snapshot()["transformers"]


class LibraryConfig:
    """A config as transformers' class holds it: attributes (through its ``attribute_map``) and ``to_dict()``."""

    def __init__(self, model_type: str, values: dict[str, Any], attribute_map: dict[str, str]):
        self.__dict__["_values"] = values
        self.__dict__["_map"] = attribute_map
        self.__dict__["model_type"] = model_type

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__["_values"]
        name = self.__dict__["_map"].get(name, name)
        if name in values:
            return values[name]
        raise AttributeError(f"{self.__dict__['model_type']} config has no field {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        self.__dict__["_values"][self.__dict__["_map"].get(name, name)] = value

    @property
    def attribute_map(self) -> dict[str, str]:
        """The class's other names for fields, as transformers' configs have it (InternLM3's ``qkv_bias`` is kept as
        ``attention_bias``)."""
        return self.__dict__["_map"]

    def to_dict(self) -> dict[str, Any]:
        """Every field with its value, as transformers' ``to_dict()`` gives them."""
        out = copy.deepcopy(self.__dict__["_values"])
        out["model_type"] = self.__dict__["model_type"]
        out["transformers_version"] = supported_version()
        return out


def code_reads(model_type: str) -> frozenset[str]:
    """The config fields transformers' code for ``model_type`` reads: its modeling module, its config class and the
    shared modules they call (the base model class, the rotary initialisers, the masks). A field outside it cannot
    change the model's function."""
    return frozenset(snapshot()["types"][model_type]["code_reads"])


def library_fields(model_type: str) -> tuple[str, ...]:
    """The fields ``model_type``'s config class declares (its own and those it inherits)."""
    return tuple(snapshot()["types"][model_type]["fields"])


def default_dict(model_type: str) -> dict[str, Any]:
    """``to_dict()`` of the class's default instance (the values the family's audits were verified at)."""
    out = copy.deepcopy(snapshot()["types"][model_type]["defaults"])
    out["transformers_version"] = supported_version()
    out["id2label"] = {int(k): v for k, v in out["id2label"].items()}  # JSON keeps the ids as strings
    return out


KIND_OF = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict", type(None): "null"}


def _check_kind(name: str, value: Any, kinds: list[str]) -> None:
    """Refuse a value whose JSON kind the field's annotation does not accept (strict: an int is not a float)."""
    if "any" in kinds:
        return
    kind = KIND_OF.get(type(value), "other")
    if kind not in kinds:
        raise LibraryConfigError(f"field {name!r} expects {' or '.join(kinds)}, got {kind} ({value!r:.60})")


def library_config(model_type: str, fields: dict[str, Any]) -> LibraryConfig:
    """The config transformers' class for ``model_type`` makes of a file's ``fields``: the declared fields at their
    defaults unless given (:class:`LibraryConfigError` for a value of the wrong kind), its ``__post_init__``, the RoPE
    fields gathered into ``rope_parameters``, and every other field kept as it is."""
    spec = snapshot()["types"][model_type]
    amap = spec["attribute_map"]
    kwargs = {amap.get(k, k): copy.deepcopy(v) for k, v in fields.items() if k != "model_type"}
    given = set(kwargs)
    values: dict[str, Any] = {}
    for name, f in spec["fields"].items():  # a declared field stored under the name its attribute_map gives
        if name in kwargs:
            _check_kind(name, kwargs[name], f["kinds"])
            values[amap.get(name, name)] = kwargs.pop(name)
        else:
            values[amap.get(name, name)] = copy.deepcopy(f["default"])
    c = LibraryConfig(model_type, values, amap)
    try:
        POST_INIT.get(model_type, lambda c, kw: None)(c, kwargs)
    except ZeroDivisionError:  # a size the class divides by (the width by the heads, the layers by a pattern)
        zero = sorted(k for k, v in values.items() if k in given and v == 0 and not isinstance(v, bool))
        raise LibraryConfigError(f"{' or '.join(zero) or 'a field'} = 0, which the class divides by") from None
    _base_post_init(c, kwargs, spec)
    _validate(c, spec)
    return c


def _validate(c: LibraryConfig, spec: dict) -> None:
    """The class's validators that read the architecture: the heads divide the width (where the class requires it),
    and each layer type is one the library knows, one per layer."""
    if spec["heads_divide_width"] and c.hidden_size % c.num_attention_heads:
        raise LibraryConfigError(f"the hidden size ({c.hidden_size}) is not a multiple of the number of attention "
                                 f"heads ({c.num_attention_heads})")  # fmt: skip
    if c.model_type == "internlm3" and c.attention_bias != c.mlp_bias:  # Llama's code biases all four maps or none
        raise LibraryConfigError("InternLM3 with qkv_bias different from bias is not supported (Llama's code that "
                                 "builds it biases the query, key, value and output maps alike)")  # fmt: skip
    kinds = c.__dict__["_values"].get("layer_types")
    layers = c.__dict__["_values"].get("num_hidden_layers")
    if kinds is None or layers is None:
        return
    if not all(k in snapshot()["layer_types"] for k in kinds):
        raise LibraryConfigError(f"the layer_types entries must be in {tuple(snapshot()['layer_types'])}")
    if len(kinds) != layers:
        raise LibraryConfigError(f"num_hidden_layers ({layers}) must equal the number of layer_types ({len(kinds)})")


def _base_post_init(c: LibraryConfig, kwargs: dict, spec: dict) -> None:
    """What transformers' ``PreTrainedConfig.__post_init__`` does with the fields (the parts that reach a count)."""
    values = c.__dict__["_values"]
    torch_dtype = kwargs.pop("torch_dtype", None)
    if torch_dtype is not None and values.get("dtype") is None:
        values["dtype"] = torch_dtype
    labels = values.get("id2label")  # a classifier's labels (neutral): two by default, their ids as integers
    if labels is None:
        n = kwargs.get("num_labels", 2)
        n = n if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_LABELS else 2  # no huge table
        values["id2label"] = {i: f"LABEL_{i}" for i in range(n)}
        values["label2id"] = {f"LABEL_{i}": i for i in range(n)}
    elif isinstance(labels, dict):
        try:
            values["id2label"] = {int(k): v for k, v in labels.items()}
        except ValueError:
            raise LibraryConfigError("id2label: its keys must be label ids (whole numbers)") from None
    if "rope_parameters" in values:
        CONVERT_ROPE.get(c.model_type, _convert_rope)(c, kwargs, spec)
    for k in (*GENERATION_FIELDS, *POPPED):  # name_or_path among them: the folder it was loaded from, none here
        kwargs.pop(k, None)
    values["_name_or_path"] = ""  # the folder it was loaded from: none here
    values["output_attentions"] = kwargs.pop("output_attentions", False)
    values.update(kwargs)
    for key in ("layer_types", "mtp_layer_types"):
        if isinstance(values.get(key), list):
            values[key] = [LEGACY_LAYER_TYPES.get(t, t) if isinstance(t, str) else t for t in values[key]]


# ------------------------------------------------------------------------------------------ RoPE fields
def _convert_rope(c: LibraryConfig, kwargs: dict, spec: dict) -> None:
    """The base class's ``convert_rope_params_to_dict``: ``rope_scaling`` (or ``rope_parameters``) with the file's
    ``rope_theta`` and ``partial_rotary_factor`` moved in."""
    values = c.__dict__["_values"]
    rope_scaling = kwargs.pop("rope_scaling", None)
    rp = rope_scaling or values.get("rope_parameters")
    rp = rp if rp is not None else {}
    values["rope_parameters"] = rp
    theta = kwargs.pop("rope_theta", values.get("rope_theta", spec["default_theta"]))
    partial = kwargs.pop("partial_rotary_factor", values.get("partial_rotary_factor"))
    nested = _nested_keys(values, rp)
    for params in [rp[k] for k in nested] or [rp]:
        if isinstance(params, dict):
            params.setdefault("rope_theta", theta)
            if partial is not None:
                params.setdefault("partial_rotary_factor", partial)
    _standardize_rope(c, spec, theta_attr=values.get("rope_theta"), partial_attr=values.get("partial_rotary_factor"))


def _nested_keys(values: dict, rp: Any) -> list[str]:
    """The layer types ``rope_parameters`` is nested under (none: one flat dict)."""
    labels = values.get("_rope_type_labels") or values.get("layer_types") or ()
    return [k for k in rp if k in labels] if isinstance(rp, dict) else []


def _standardize_rope(c: LibraryConfig, spec: dict, theta_attr: Any = None, partial_attr: Any = None) -> None:
    """The base class's ``standardize_rope_params``: each RoPE dict gets its ``rope_type`` and ``rope_theta``, and a
    scaled RoPE the pretraining length."""
    values = c.__dict__["_values"]
    rp = values.get("rope_parameters") or {}
    if not (rp or theta_attr):
        return
    nested = _nested_keys(values, rp)
    for params in [rp[k] for k in nested] if nested else [rp]:
        if not isinstance(params, dict):
            continue
        params.setdefault("rope_type", params.get("type", "default"))
        params.setdefault("rope_theta", theta_attr)
        if partial_attr is not None:
            params.setdefault("partial_rotary_factor", partial_attr)
        if spec["default_rope_type"] != "default" and params["rope_type"] == "default":
            params["rope_type"] = spec["default_rope_type"]
        if params["rope_type"] in SCALED_ROPE:
            if not nested and "original_max_position_embeddings" in values:
                params["original_max_position_embeddings"] = values["original_max_position_embeddings"]
            else:
                params.setdefault("original_max_position_embeddings", values.get("max_position_embeddings"))
    values["rope_parameters"] = rp


def _convert_rope_gpt_neox(c: LibraryConfig, kwargs: dict, spec: dict) -> None:
    values = c.__dict__["_values"]
    rp = kwargs.pop("rope_scaling", None) or values.get("rope_parameters")
    rp = rp if rp is not None else {}
    values["rope_parameters"] = rp
    rp.setdefault("rope_theta", kwargs.pop("rotary_emb_base", spec["default_theta"]))
    rp.setdefault("partial_rotary_factor", kwargs.pop("rotary_pct", 0.25))
    _standardize_rope(c, spec, values.get("rope_theta"), values.get("partial_rotary_factor"))


def _convert_rope_phi3(c: LibraryConfig, kwargs: dict, spec: dict) -> None:
    values = c.__dict__["_values"]
    rp = kwargs.pop("rope_scaling", None) or values.get("rope_parameters")
    rp = rp if rp is not None else {}
    values["rope_parameters"] = rp
    rp.setdefault("rope_theta", kwargs.pop("rope_theta", 10_000.0))
    rp.setdefault("partial_rotary_factor", kwargs.get("partial_rotary_factor", 1.0))  # kept beside it too
    _standardize_rope(c, spec, values.get("rope_theta"), values.get("partial_rotary_factor"))
    if rp.get("rope_type") in ("su", "yarn"):
        rp["rope_type"] = "longrope"


def _convert_rope_by_layer_type(c: LibraryConfig, kwargs: dict, spec: dict, thetas: dict[str, tuple]) -> None:
    """Gemma 3's and OLMo 3's: one RoPE dict per layer type, a ``rope_scaling`` for the full-attention layers only, and
    each type's base from ``thetas`` (``{type: (field, default)}``, the field popped from the file in that order)."""
    values = c.__dict__["_values"]
    rope_scaling = kwargs.pop("rope_scaling", None)
    rp = values.get("rope_parameters")
    if rp is None:
        rp = {"sliding_attention": {"rope_type": "default"}, "full_attention": {"rope_type": "default"}}
    values["rope_parameters"] = rp
    if rope_scaling is not None:
        rp["full_attention"].update(rope_scaling)
    for kind, (field, default) in thetas.items():
        if rp.get(kind) is None:
            rp[kind] = {"rope_type": "default"}
        rp[kind].setdefault("rope_theta", kwargs.pop(field, default))
    _standardize_rope(c, spec, values.get("rope_theta"), values.get("partial_rotary_factor"))


def _convert_rope_gemma3(c: LibraryConfig, kwargs: dict, spec: dict) -> None:
    theta = spec["default_theta"]
    thetas = {"full_attention": ("rope_theta", theta["global"]), "sliding_attention": ("rope_local_base_freq",
                                                                                        theta["local"])}  # fmt: skip
    _convert_rope_by_layer_type(c, kwargs, spec, thetas)


def _convert_rope_olmo3(c: LibraryConfig, kwargs: dict, spec: dict) -> None:
    """The file's ``rope_theta`` goes to the full-attention layers; the sliding ones get the class's default (the
    class pops the field twice)."""
    both = ("rope_theta", spec["default_theta"])
    _convert_rope_by_layer_type(c, kwargs, spec, {"full_attention": both, "sliding_attention": both})


def _convert_rope_qwen2_5_vl(c: LibraryConfig, kwargs: dict, spec: dict) -> None:
    """Qwen2.5-VL's text model: ``rope_scaling`` (or ``rope_parameters``) with the file's ``rope_theta``, an
    ``"mrope"`` type read as the default RoPE (its ``mrope_section`` kept beside)."""
    values = c.__dict__["_values"]
    rp = kwargs.pop("rope_scaling", None) or values.get("rope_parameters")
    rp = rp if rp is not None else {}
    values["rope_parameters"] = rp
    rp.setdefault("rope_theta", kwargs.pop("rope_theta", spec["default_theta"]))
    if rp.get("rope_type", rp.get("type")) == "mrope":
        rp["rope_type"] = "default"
    _standardize_rope(c, spec, values.get("rope_theta"), values.get("partial_rotary_factor"))


CONVERT_ROPE: dict[str, Callable[[LibraryConfig, dict, dict], None]] = {
    "qwen2_5_vl_text": _convert_rope_qwen2_5_vl,
    "gpt_neox": _convert_rope_gpt_neox,
    "phi3": _convert_rope_phi3,
    "gemma3_text": _convert_rope_gemma3,
    "olmo3": _convert_rope_olmo3,
}


# ------------------------------------------------------------------------------ each class's __post_init__
def _kv_heads(c: LibraryConfig, kw: dict) -> None:
    if c.num_key_value_heads is None:
        c.num_key_value_heads = c.num_attention_heads


def _head_dim(c: LibraryConfig, kw: dict) -> None:
    if c.head_dim is None:
        c.head_dim = c.hidden_size // c.num_attention_heads


def _windows_by_depth(c: LibraryConfig, kw: dict) -> None:
    """Qwen2 and Qwen3: a window only where ``use_sliding_window``, on the layers from ``max_window_layers`` on."""
    c.sliding_window = c.sliding_window if c.use_sliding_window else None
    _kv_heads(c, kw)
    if c.layer_types is None:
        c.layer_types = ["sliding_attention" if c.sliding_window is not None and i >= c.max_window_layers
                         else "full_attention" for i in range(c.num_hidden_layers)]  # fmt: skip


def _alternating(every: int) -> Callable[[LibraryConfig, dict], None]:
    def post_init(c: LibraryConfig, kw: dict) -> None:
        if c.layer_types is None:
            c.layer_types = ["sliding_attention" if (i + 1) % every else "full_attention"
                             for i in range(c.num_hidden_layers)]  # fmt: skip

    return post_init


def _cohere2(c: LibraryConfig, kw: dict) -> None:
    _kv_heads(c, kw)
    c.head_dim = c.hidden_size // c.num_attention_heads
    if c.layer_types is None:  # the pattern an older file gives, popped
        _alternating(kw.pop("sliding_window_pattern", 4))(c, kw)


def _exaone4(c: LibraryConfig, kw: dict) -> None:
    if c.sliding_window is None:
        c.sliding_window_pattern = 0
    if c.layer_types is None:
        every = c.sliding_window_pattern
        if not isinstance(every, int) or isinstance(every, bool):  # the class takes (i + 1) % pattern
            raise LibraryConfigError(f"sliding_window_pattern {every!r:.40} without layer_types: the class "
                                     "computes the layer types from an integer pattern only")  # fmt: skip
        c.layer_types = ["sliding_attention" if (i + 1) % every != 0 and i < c.num_hidden_layers
                         else "full_attention" for i in range(c.num_hidden_layers)]  # fmt: skip


def _gemma3(c: LibraryConfig, kw: dict) -> None:
    if c.use_bidirectional_attention:
        c.sliding_window = c.sliding_window // 2 + 1
    c._sliding_window_pattern = kw.get("sliding_window_pattern", 6)
    _alternating(c._sliding_window_pattern)(c, kw)


def _smollm3(c: LibraryConfig, kw: dict) -> None:
    _kv_heads(c, kw)
    if c.no_rope_layers is None:
        c.no_rope_layers = [int((i + 1) % c.no_rope_layer_interval != 0) for i in range(c.num_hidden_layers)]
    if c.layer_types is None:
        c.layer_types = ["sliding_attention" if c.use_sliding_window and c.sliding_window is not None and not rope
                         else "full_attention" for rope in c.no_rope_layers[: c.num_hidden_layers]]  # fmt: skip


def _llama4(c: LibraryConfig, kw: dict) -> None:
    _kv_heads(c, kw)
    default = [int((i + 1) % c.no_rope_layer_interval != 0) for i in range(c.num_hidden_layers)]
    c.no_rope_layers = c.no_rope_layers if c.no_rope_layers else default
    _head_dim(c, kw)
    if c.moe_layers is None:
        step = c.interleave_moe_layer_step
        c.moe_layers = list(range(step - 1, c.num_hidden_layers, step))
    if c.layer_types is None:
        c.layer_types = ["chunked_attention" if no_rope and c.attention_chunk_size is not None else "full_attention"
                         for no_rope in c.no_rope_layers]  # fmt: skip


def _gpt_oss(c: LibraryConfig, kw: dict) -> None:
    _kv_heads(c, kw)
    _head_dim(c, kw)
    _alternating(2)(c, kw)
    if c.rope_parameters is None:
        c.rope_parameters = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip


def _qwen3_5(c: LibraryConfig, kw: dict) -> None:
    kw.setdefault("partial_rotary_factor", 0.25)
    if c.layer_types is None:
        every = kw.pop("full_attention_interval", 4)
        c.layer_types = ["linear_attention" if (i + 1) % every else "full_attention"
                         for i in range(c.num_hidden_layers)]  # fmt: skip


def _qwen3_next(c: LibraryConfig, kw: dict) -> None:
    c.mlp_only_layers = [] if c.mlp_only_layers is None else c.mlp_only_layers
    _qwen3_5(c, kw)


def _qwen3_moe(c: LibraryConfig, kw: dict) -> None:
    c.sliding_window = c.sliding_window if c.use_sliding_window else None
    c.mlp_only_layers = [] if c.mlp_only_layers is None else c.mlp_only_layers


def _apertus(c: LibraryConfig, kw: dict) -> None:
    _kv_heads(c, kw)
    if c.rope_parameters is None:
        c.rope_parameters = {"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0,
                             "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0}  # fmt: skip


def _qwen3_vl_moe(c: LibraryConfig, kw: dict) -> None:
    _kv_heads(c, kw)
    c.head_dim = c.head_dim or c.hidden_size // c.num_attention_heads
    c.sliding_window = None
    c.mlp_only_layers = [] if c.mlp_only_layers is None else c.mlp_only_layers


def _deepseek_v3(c: LibraryConfig, kw: dict) -> None:
    _kv_heads(c, kw)
    c.qk_head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim
    c.head_dim = c.qk_rope_head_dim


def _deepseek_v32(c: LibraryConfig, kw: dict) -> None:
    """DeepSeek-V3.2: V3's sizes, its MLP kinds by layer (the first first_k_dense_replace dense) and every layer's
    attention indexed."""
    c.qk_head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim
    c.head_dim = c.qk_rope_head_dim
    if c.mlp_layer_types is None:
        dense = min(c.first_k_dense_replace, c.num_hidden_layers)
        c.mlp_layer_types = ["dense"] * dense + ["sparse"] * (c.num_hidden_layers - dense)
    if c.layer_types is None:
        c.layer_types = ["indexed_attention"] * c.num_hidden_layers
    experts = kw.pop("num_experts", None)
    c.n_routed_experts = c.n_routed_experts if experts is None else experts


def _falcon(c: LibraryConfig, kw: dict) -> None:
    n_embed = kw.pop("n_embed", None)
    c.hidden_size = c.hidden_size if n_embed is None else n_embed
    c.num_kv_heads = c.num_attention_heads if c.num_kv_heads is None else c.num_kv_heads
    if c.ffn_hidden_size is None:
        c.ffn_hidden_size = c.hidden_size * 4


def _gemma(c: LibraryConfig, kw: dict) -> None:
    if c.hidden_act == "gelu":  # the legacy name of the tanh approximation in Gemma's files
        c.hidden_act = "gelu_pytorch_tanh"


def _partial_rope(share: float) -> Callable[[LibraryConfig, dict], None]:
    def post_init(c: LibraryConfig, kw: dict) -> None:
        kw.setdefault("partial_rotary_factor", share)

    return post_init


def _both(*steps: Callable[[LibraryConfig, dict], None]) -> Callable[[LibraryConfig, dict], None]:
    def post_init(c: LibraryConfig, kw: dict) -> None:
        for step in steps:
            step(c, kw)

    return post_init


def _opt(c: LibraryConfig, kw: dict) -> None:
    c.word_embed_proj_dim = c.word_embed_proj_dim if c.word_embed_proj_dim is not None else c.hidden_size


def _dots1(c: LibraryConfig, kw: dict) -> None:
    """dots.llm1: Qwen2's windows by depth, without a use_sliding_window switch."""
    _kv_heads(c, kw)
    if c.layer_types is None:
        c.layer_types = ["sliding_attention" if c.sliding_window is not None and i >= c.max_window_layers
                         else "full_attention" for i in range(c.num_hidden_layers)]  # fmt: skip


def _ernie4_5_moe(c: LibraryConfig, kw: dict) -> None:
    """ERNIE 4.5's mixtures: an end index of -1 is the last layer."""
    if c.moe_layer_end_index == -1:
        c.moe_layer_end_index = c.num_hidden_layers - 1


def _bloom(c: LibraryConfig, kw: dict) -> None:
    n_embed = kw.pop("n_embed", None)  # an older name of hidden_size
    c.hidden_size = c.hidden_size if n_embed is None else n_embed


def _glm4(c: LibraryConfig, kw: dict) -> None:
    kw.setdefault("partial_rotary_factor", 0.5)
    if c.eos_token_id is None:
        c.eos_token_id = [151329, 151336, 151338]


def _lfm2(c: LibraryConfig, kw: dict) -> None:
    """LFM2: its layers' kinds from full_attn_idxs (every layer attention without it); tie_embedding and block_ff_dim,
    the older names of tie_word_embeddings and intermediate_size."""
    if c.layer_types is None:
        c.full_attn_idxs = c.full_attn_idxs if c.full_attn_idxs is not None else list(range(c.num_hidden_layers))
        c.layer_types = ["full_attention" if i in c.full_attn_idxs else "conv" for i in range(c.num_hidden_layers)]
    c.tie_word_embeddings = kw.pop("tie_embedding", c.tie_word_embeddings)
    c.intermediate_size = kw.pop("block_ff_dim", c.intermediate_size)


def _bamba(c: LibraryConfig, kw: dict) -> None:
    """Bamba: Mamba-2's head size from its inner width ("auto"); half of each attention head rotated, whatever the
    file says."""
    _bamba_mamba(c, kw)
    kw["partial_rotary_factor"] = 0.5


def _bamba_mamba(c: LibraryConfig, kw: dict) -> None:
    """Bamba's and Granite 4's Mamba-2: its head size from its inner width ("auto"), the time step's limits."""
    _kv_heads(c, kw)
    if c.mamba_d_head == "auto" and isinstance(c.mamba_n_heads, int) and c.mamba_n_heads:
        c.mamba_d_head = c.mamba_expand * c.hidden_size // c.mamba_n_heads
    # a tuple in transformers' config, a list in its to_dict(), which is what this class stands for
    c.time_step_limit = list(c.time_step_limit) if isinstance(c.time_step_limit, (list, tuple)) else c.time_step_limit


def _granitemoehybrid(c: LibraryConfig, kw: dict) -> None:
    """Granite 4's hybrids: Bamba's Mamba-2 sizes; every layer a Mamba-2 one where layer_types is left out."""
    _bamba_mamba(c, kw)
    if c.layer_types is None:
        c.layer_types = ["linear_attention"] * c.num_hidden_layers


POST_INIT: dict[str, Callable[[LibraryConfig, dict], None]] = {
    "opt": _opt,
    "llama": _both(_head_dim, _kv_heads),
    "mistral": _both(_head_dim, _kv_heads),
    "qwen2": _windows_by_depth,
    "qwen3": _windows_by_depth,
    "phi": _both(_kv_heads, _partial_rope(0.5)),
    "phi3": _kv_heads,
    "granite": _kv_heads,
    "glm4": _glm4,
    "glm4_moe": _partial_rope(0.5),
    "dots1": _dots1,
    "bloom": _bloom,
    "ernie4_5_moe": _ernie4_5_moe,
    "hunyuan_v1_moe": _kv_heads,
    "qwen2_5_vl_text": _windows_by_depth,
    "stablelm": _partial_rope(0.25),
    "gemma2": _alternating(2),
    "gemma3_text": _gemma3,
    "olmo2": _kv_heads,
    "olmo3": _both(_kv_heads, _alternating(4)),
    "internlm3": _both(_head_dim, _kv_heads),
    "cohere2": _cohere2,
    "exaone4": _exaone4,
    "smollm3": _smollm3,
    "gpt_oss": _gpt_oss,
    "mixtral": _kv_heads,
    "qwen3_moe": _qwen3_moe,
    "qwen3_vl_moe_text": _qwen3_vl_moe,
    "apertus": _apertus,
    "llama4_text": _llama4,
    "qwen3_next": _qwen3_next,
    "qwen3_5_text": _qwen3_5,
    "qwen3_5_moe_text": _qwen3_5,
    "cohere": _kv_heads,
    "seed_oss": _both(_kv_heads, _head_dim),
    "ernie4_5": _both(_kv_heads, _head_dim),
    "deepseek_v3": _deepseek_v3,
    "deepseek_v32": _deepseek_v32,
    "falcon": _falcon,
    "gemma": _gemma,
    "lfm2": _lfm2,
    "bamba": _bamba,
    "granitemoehybrid": _granitemoehybrid,
}
