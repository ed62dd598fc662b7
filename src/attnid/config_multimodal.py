"""A multimodal release's text model (:mod:`attnid.configs` counts it; the vision tower is not counted): its fields
gathered from ``text_config``, or from a flat file as the library gathers them (Qwen2.5-VL as released), the fields the
multimodal config keeps for itself beside them, and which of the two files' ``tie_word_embeddings`` ties the head."""

from __future__ import annotations

from .config_fields import MULTIMODAL_FIELDS, ConfigError
from .inputs import printable
from .library_configs import library_fields

# multimodal releases whose text model attnid counts: its model type, its config class's tie_word_embeddings, and
# the multimodal class's own where that one decides the tying (Mistral 3: its model ties by the outer field)
TEXT_MODELS = {"gemma3": ("gemma3_text", True, None), "llama4": ("llama4_text", False, None),
               "mistral3": ("mistral", False, True), "qwen2_5_vl": ("qwen2_5_vl_text", False, False),
               "qwen3_vl": ("qwen3_vl_text", False, False), "qwen3_5": ("qwen3_5_text", False, False),
               "qwen3_5_moe": ("qwen3_5_moe_text", False, False)}  # fmt: skip

# the fields a multimodal config keeps for itself beside text_config (its image and video tokens)
_VISION_TOKENS = ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")
MULTIMODAL_OWN_FIELDS = {
    "qwen2_5_vl": (*_VISION_TOKENS, "vision_token_id"),
    "qwen3_vl": _VISION_TOKENS,
    "qwen3_5": _VISION_TOKENS,
    "qwen3_5_moe": _VISION_TOKENS,
}

# multimodal files whose released form is flat: the text model's fields beside the vision tower's, which the library
# gathers into text_config (the text config class's fields and the RoPE fields)
FLAT_TEXT_MODELS = ("qwen2_5_vl",)


def _text_fields(fields: dict, model_type: str) -> dict:
    """The text model's fields of a multimodal Gemma 3, Llama 4 or Mistral 3 file: its ``text_config``, once every field
    beside it is one the multimodal config holds (:data:`MULTIMODAL_FIELDS`), its model type is the one the family
    builds, and the tying of the embeddings is not in doubt: a ``tie_word_embeddings`` beside it agrees with the text
    model's, and where the outer field decides (Mistral 3, outer default True) it agrees, given or not;
    :class:`ConfigError` naming the field otherwise."""
    text_type, tie_default, outer_default = TEXT_MODELS[model_type]
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
    tie, inner = fields.get("tie_word_embeddings", outer_default), text.get("tie_word_embeddings", tie_default)
    if tie is not None and tie != inner and "tie_word_embeddings" in library_fields(text_type):
        where = "beside text_config" if "tie_word_embeddings" in fields else "by its class's default (which decides)"
        raise ConfigError(
            f"config: tie_word_embeddings is {printable(tie, 20)} {where} and {printable(inner, 20)} in it; "
            "attnid refuses to choose (set it beside text_config to the tying of the released weights)"
        )
    return {**text, "model_type": text_type}


def multimodal_text(fields: dict, source: str, model_type: str) -> tuple[dict, str, str, bool | None, dict]:
    """``(fields, source, model_type, outer_tie, unread)`` of a multimodal file's text model (:func:`_text_model`):
    where the multimodal class's ``tie_word_embeddings`` decides the tying (:func:`_outer_tie`), a
    ``tie_word_embeddings`` inside ``text_config`` is read by no code, and is taken out into ``unread`` with that
    reason (Qwen3-VL's files write it in both places)."""
    outer_tie = _outer_tie(fields, model_type)
    fields, source, model_type = _text_model(fields, source, model_type)
    if outer_tie is None or "tie_word_embeddings" not in fields:
        return fields, source, model_type, outer_tie, {}
    inner = printable(repr(fields.pop("tie_word_embeddings")), 20)
    why = (
        f"{inner} in text_config, where no code reads it: the multimodal class's tie_word_embeddings "
        f"({outer_tie}) decides the tying"
    )
    return fields, source, model_type, outer_tie, {"tie_word_embeddings": why}


def _outer_tie(fields: dict, model_type: str) -> bool | None:
    """The tying of a multimodal file whose text model's class has no ``tie_word_embeddings`` (Qwen2.5-VL's): the
    multimodal class's, the file's or its default; None where the text model's class decides."""
    text_type, _, outer_default = TEXT_MODELS[model_type]
    if "tie_word_embeddings" in library_fields(text_type):
        return None
    tie = fields.get("tie_word_embeddings", outer_default)
    if not isinstance(tie, bool):
        raise ConfigError(f"tie_word_embeddings: {printable(repr(tie))} must be true or false")
    return tie


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
