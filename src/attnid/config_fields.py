"""The fields of a model's ``config.json`` as data: which ones cannot change the count and why (:data:`NEUTRAL`),
which must be positive, which transformers' code fixes to one value, which switch a family's biases or QK-norm, the
RoPE variants and activations each family's count stands for, and :class:`ConfigError`, the refusal of a field.
:mod:`attnid.configs` reads a file against them."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config attnid cannot count: the message names the field (or the file) and why."""


# fields that transformers' code reads (some family's modeling module, config class or the shared modules) but whose
# value cannot change the count, and why; a field no code of a family reads is accepted for that family without a
# list (attnid.configs.unread_reason), so this list holds read fields only (tests/test_configs.py checks)
NEUTRAL: dict[str, str] = {
    **dict.fromkeys(("architectures", "_name_or_path", "dtype", "model_type", "_attn_implementation"),
                    "bookkeeping: a name, a version, a storage type or a kernel"),
    **dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "use_cache", "initializer_range",
                     "init_std", "output_router_logits", "router_aux_loss_coef", "gradient_checkpointing"),
                    "tokens, caching, initialisation or a training loss: not the function of the weights"),
    **dict.fromkeys(("attention_dropout", "hidden_dropout", "dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop",
                     "residual_dropout", "embedding_dropout", "summary_first_dropout", "classifier_dropout",
                     "layerdrop"),
                    "dropout: off when the function is evaluated"),
    **dict.fromkeys(("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels", "num_labels"),
                    "a classification head outside the language model"),
    **dict.fromkeys(("sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
                     "_sliding_window_pattern", "sliding_window_pattern", "rope_local_base_freq"),
                    "a banded mask of at least two tokens (the count of full causal attention holds: "
                    "tests/test_trust.py) or a second RoPE base on some layers (checked like the first)"),
    **dict.fromkeys(("query_pre_attn_scalar", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
                     "reorder_and_upcast_attn", "routed_scaling_factor"),
                    "a fixed factor (or its numerics): absorbed by the weights it multiplies, no new symmetry"),
    "rms_norm_eps": "a norm's ε; refused if not positive (released norms have ε > 0)",
    "layer_norm_eps": "a norm's ε; refused if not positive",
    "norm_eps": "a norm's ε; refused if not positive",
    "layer_norm_epsilon": "a norm's ε; refused if not positive",
    "norm_epsilon": "a norm's ε; refused if not positive",
    "max_position_embeddings": "the longest input; a RoPE model has no position rows (read where it has)",
    **dict.fromkeys(("output_attentions", "output_hidden_states", "return_dict"),
                    "what a call returns: not the function of the weights"),
    "router_jitter_noise": "noise on the router's input while training only: off when the function is evaluated",
    **dict.fromkeys(("n_group", "topk_group"),
                    "group-limited routing: which experts a token may choose among; each chosen expert and the "
                    "router are counted as with full routing (two or more chosen per token)"),
}  # fmt: skip

# the fields a multimodal Gemma 3 file (transformers' Gemma3Config) holds beside its text_config: the vision tower
# and its image tokens (not counted), and bookkeeping; a text model's field there is not read by transformers either
MULTIMODAL_FIELDS = ("text_config", "vision_config", "mm_tokens_per_image", "boi_token_index", "eoi_token_index",
                     "image_token_index", "tie_word_embeddings", "model_type", "architectures", "_name_or_path",
                     "transformers_version", "torch_dtype", "dtype", "bos_token_id", "eos_token_id", "pad_token_id",
                     "initializer_range", "_commit_hash", "use_cache", "quantization_config",
                     # Mistral 3's vision tower and projector (not counted)
                     "multimodal_projector_bias", "projector_hidden_act", "spatial_merge_size",
                     "vision_feature_layer")  # fmt: skip

# a field naming remote code: data here (attnid never imports model code), accepted for a family transformers ships
REMOTE_CODE = "auto_map"

REMOTE_CODE_NOTE = ("names Python classes in the model's own repository; attnid reads the file as the transformers "
                    "family its model_type names and never imports or reads that code")  # fmt: skip

# neutral fields that must be positive to mean what NEUTRAL says of them: refused by name otherwise
POSITIVE: dict[str, str] = {
    "query_pre_attn_scalar": "the scores are divided by its square root",
    "final_logit_softcapping": "c tanh(z / c) needs c > 0 (0 divides by zero)",
    "routed_scaling_factor": "a factor of 0 zeroes every routed expert's output",
}

MIN_WINDOW = 2  # the shortest sliding window whose attention has the count of full causal attention

# fields that transformers' code does not read but fixes to one value: accepted at that value only
FIXED_BY_CODE: dict[str, object] = {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1,
                                    "position_embedding_type": "absolute", "use_mrope": False,
                                    "apply_residual_connection_post_layernorm": False}  # fmt: skip
# a family whose released files name what its code implements otherwise (Command R7B's original Cohere keys: its
# interleaved-pair RoPE, GPT-J's)
# fields that a config class's __post_init__ turns into another: older names (LFM2's, Falcon's), and LFM2's list of
# attention layers, from which it writes layer_types
OLDER_NAMES = {"block_ff_dim": "intermediate_size", "tie_embedding": "tie_word_embeddings", "n_embed": "hidden_size",
               "full_attn_idxs": "layer_types", "full_attention_interval": "layer_types"}  # fmt: skip

# a family's own value of a field fixed by code, or CHECKED_BY_READER where its reader takes more than one value
# (Granite 4's hybrids: no position map, written null or "nope")
CHECKED_BY_READER = "checked by the family's reader"
FAMILY_FIXED: dict[str, dict[str, object]] = {
    "cohere2": {"position_embedding_type": "rope_gptj"},
    "granitemoehybrid": {"position_embedding_type": CHECKED_BY_READER},
}

# fields read by families attnid counts at scope attention only (their blocks are not modelled)
ATTENTION_ONLY_NEUTRAL = ("intermediate_size", "num_hidden_layers", "vocab_size", "type_vocab_size", "hidden_act",
                          "hidden_activation", "tie_word_embeddings")  # fmt: skip

# fields that shape the decoder layer around the attention but not the attention layer: at a value attnid does not
# model, the block and the model are refused (naming the field) and the attention is still counted
BLOCK_ONLY_FIELDS = ("use_parallel_residual", "parallel_attn", "num_ln_in_parallel_attn", "mlp_bias",
                     "do_layer_norm_before", "intermediate_size_mlp")  # fmt: skip

# the older RoPE fields, which transformers gathers into rope_parameters (read where that is)
ROPE_FIELDS = (
    "rope_theta",
    "rope_scaling",
    "partial_rotary_factor",
    "rotary_pct",
    "rotary_emb_base",
    "original_max_position_embeddings",
)  # the last moved in by scaled RoPE only (LongRoPE, YaRN, Llama 3)

# RoPE variants whose frequencies stay distinct (each rescales base^(-2i/D) by a factor that is monotone in
# i, or uniformly): the count of plain RoPE holds
DISTINCT_FREQUENCY_ROPE = ("default", "linear", "dynamic", "llama3", "yarn")

# activations each MLP kind of attnid.counting stands for
ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "gelu": ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python"),
    "relu": ("relu", "relu2"),  # ReLU² (Arcee) is positively homogeneous too: relu(c z)² = c² relu(z)²
    "swiglu": ("silu", "swish"),
    "swiglu_biased": ("silu",),  # gpt-oss's experts fix their gate z σ(α z) in code; its file says silu
    "geglu": ("gelu_pytorch_tanh", "gelu", "gelu_new"),
    "xielu": ("xielu",),  # Apertus's MLP builds its xIELU (with its parameters) for this name only
}

ACTIVATION_FIELDS = ("activation_function", "hidden_act", "hidden_activation", "activation")  # Falcon's the last

# the fields of a config that switch a family's QK-norm on or off, and the norm they switch on
QK_NORM_FIELDS = {"llama4": ("use_qk_norm", "l2"), "stablelm": ("qk_layernorm", "layer"),
                  "cohere": ("use_qk_norm", "layer"), "glm4_moe": ("use_qk_norm", "head")}  # fmt: skip


# flags a released file writes as numbers that transformers' config class now types as booleans; the model code reads
# their truth value (Llama 4 Scout's file has attn_temperature_tuning = 4)
TRUTH_FIELDS = ("attn_temperature_tuning",)

# the field that switches a family's attention biases on, and the biases it switches (default: attention_bias, all)
BIAS_FIELDS = {"opt": ("enable_bias", "qkvo"), "ernie4_5": ("use_bias", "qkvo"), "glm4": ("attention_bias", "qkv"),
               "ernie4_5_moe": ("use_bias", "qkvo"),
               "glm4_moe": ("attention_bias", "qkv"),
               "stablelm": ("use_qkv_bias", "qkv"), "starcoder2": ("use_bias", "qkvo")}  # fmt: skip

# families whose one bias field also puts biases on the gated MLP, which attnid's block does not model: with it on,
# the attention is counted and the block and the model are refused, naming it
MLP_BIAS_SWITCHES = {"ernie4_5": "use_bias", "ernie4_5_moe": "use_bias"}

# families whose biases two fields switch apart: (field, the biases it switches) each
SPLIT_BIAS_FIELDS = {"seed_oss": (("attention_bias", "qkv"), ("attention_out_bias", "o"))}

GRANITE_MULTIPLIERS = ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")

FAMILY_BIAS = {
    "gpt2": "qkvo",
    "bloom": "qkvo",
    "qwen2_5_vl": "qkv",
    "qwen2": "qkv",
    "phi": "qkvo",
    "mistral": "",
    "mixtral": "",
    "phi3": "",
    "exaone4": "",
    "lfm2": "",
}  # by its code (fmt: skip)
