"""A multimodal release's text model (:mod:`attnid.configs` counts it; the vision tower is not counted): its fields
gathered from ``text_config``, or from a flat file as the library gathers them (Qwen2.5-VL as released), the fields the
multimodal config keeps for itself beside them, and which of the two files' ``tie_word_embeddings`` ties the head."""

from __future__ import annotations

from .config_fields import MULTIMODAL_FIELDS, ConfigError
from .inputs import printable
from .library_configs import library_fields

# multimodal releases whose text model attnid counts: its model type, its config class's tie_word_embeddings, and
# the multimodal class's default where that class's field decides the tying, as transformers 5.24's models tie it
# (None: the text model's class decides, Llama 4's, whose language model is a causal LM of its own)
TEXT_MODELS = {"gemma3": ("gemma3_text", True, True), "llama4": ("llama4_text", False, None),
               "mistral3": ("mistral", False, True), "qwen2_5_vl": ("qwen2_5_vl_text", False, False),
               "qwen3_vl": ("qwen3_vl_text", False, False), "qwen3_vl_moe": ("qwen3_vl_moe_text", True, False),
               "qwen3_5": ("qwen3_5_text", False, False),
               "qwen3_5_moe": ("qwen3_5_moe_text", False, False)}  # fmt: skip

# the fields a multimodal config keeps for itself beside text_config (its image and video tokens)
_VISION_TOKENS = ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")
MULTIMODAL_OWN_FIELDS = {
    "qwen2_5_vl": (*_VISION_TOKENS, "vision_token_id"),
    "qwen3_vl": _VISION_TOKENS,
    "qwen3_vl_moe": _VISION_TOKENS,
    "qwen3_5": _VISION_TOKENS,
    "qwen3_5_moe": _VISION_TOKENS,
}

# multimodal files whose released form is flat: the text model's fields beside the vision tower's, which the library
# gathers into text_config (the text config class's fields and the RoPE fields)
FLAT_TEXT_MODELS = ("qwen2_5_vl",)


def _text_fields(fields: dict, model_type: str) -> dict:
    """The text model's fields of a multimodal file: its ``text_config``, once every field beside it is one the
    multimodal config holds (:data:`MULTIMODAL_FIELDS`, :data:`MULTIMODAL_OWN_FIELDS`) and its model type is the one
    the family builds; :class:`ConfigError` naming the field otherwise."""
    text_type = TEXT_MODELS[model_type][0]
    for k in fields:
        if k not in MULTIMODAL_FIELDS and k not in MULTIMODAL_OWN_FIELDS.get(model_type, ()):
            raise ConfigError(
                f"config: field {printable(k, 60)} sits beside text_config: transformers' multimodal {model_type} "
                "reads the text model's fields from text_config only; move it there (or remove it)"
            )
    text = fields["text_config"]
    inner_type = text.get("model_type", text_type)
    if inner_type != text_type:
        raise ConfigError(f"config: text_config's model_type {printable(repr(inner_type), 40)} is not one attnid reads "
                          f"inside {model_type} (it reads {text_type!r})")  # fmt: skip
    return {**text, "model_type": text_type}


def multimodal_text(fields: dict, source: str, model_type: str) -> tuple[dict, str, str, bool | None, dict]:
    """``(fields, source, model_type, tie, unread)`` of a multimodal file's text model (:func:`_text_model`) and its
    tying (:func:`_tying`: None where the text model's class decides); a ``tie_word_embeddings`` inside
    ``text_config`` that no code reads is taken out into ``unread`` with that reason (Qwen3-VL's files write it in both
    places)."""
    outer = fields.get("tie_word_embeddings")
    text, source, text_type = _text_model(fields, source, model_type)
    tie = _tying(outer, text, model_type)
    if tie is None or "tie_word_embeddings" not in text:
        return text, source, text_type, tie, {}
    inner = printable(repr(text.pop("tie_word_embeddings")), 20)
    why = f"{inner} in text_config, where no code reads it: the multimodal class's tie_word_embeddings ({tie}) decides"
    return text, source, text_type, tie, {"tie_word_embeddings": why}


def _tying(outer: object, text: dict, model_type: str) -> bool | None:
    """Whether the head is tied, where the multimodal class's ``tie_word_embeddings`` decides it (None where the text
    model's class does: Llama 4): the file's ``outer`` field when given; else the class's default, unless the
    text model says otherwise (its field in ``text_config``, or its class's default), which the library would not
    follow: Mistral Small 3.1's file sets neither, so transformers ties a head its weights keep apart. That case is
    refused, naming the field to set."""
    text_type, text_default, outer_default = TEXT_MODELS[model_type]
    if outer_default is None:
        return None
    if outer is not None:
        if not isinstance(outer, bool):
            raise ConfigError(f"tie_word_embeddings: {printable(repr(outer))} must be true or false")
        return outer
    declared = "tie_word_embeddings" in library_fields(text_type)
    inner = text.get("tie_word_embeddings", text_default if declared else None)
    if inner is not None and inner != outer_default:
        raise ConfigError(
            f"config: tie_word_embeddings is {outer_default} by the multimodal class's default (which decides) and "
            f"{printable(inner, 20)} in text_config; attnid refuses to choose (set it beside text_config to the "
            "tying of the released weights)"
        )
    return outer_default


def flat_text_config(fields: dict, model_type: str) -> dict:
    """A flat multimodal file (:data:`FLAT_TEXT_MODELS`: Qwen2.5-VL as released) with its text model's fields gathered
    into ``text_config``, as transformers' multimodal class gathers them: the text config class's fields and the RoPE
    fields; the others stay beside it."""
    text_type = TEXT_MODELS[model_type][0]
    own = set(library_fields(text_type)) | {"rope_scaling", "rope_theta", "rope_parameters"}
    keep = set(MULTIMODAL_FIELDS) | set(MULTIMODAL_OWN_FIELDS[model_type]) | {"model_type"}
    text = {k: v for k, v in fields.items() if k in own and k not in keep}
    return {**{k: v for k, v in fields.items() if k not in text}, "text_config": text}


def _text_model(fields: dict, source: str, model_type: str) -> tuple[dict, str, str]:
    """``(fields, source, model_type)`` of a multimodal file's text model (:data:`TEXT_MODELS`)."""
    if model_type in FLAT_TEXT_MODELS and "text_config" not in fields:
        fields = flat_text_config(fields, model_type)
    if not isinstance(fields.get("text_config"), dict):
        raise ConfigError(f"config: a multimodal {model_type} file describes its text model under text_config (an "
                          f"object), and {source} has {'none' if 'text_config' not in fields else 'another value'}; "
                          "attnid counts the text model a file describes, not the library's default one")  # fmt: skip
    text = _text_fields(fields, model_type)
    return text, source + " (its text model; the vision tower is not counted)", TEXT_MODELS[model_type][0]
