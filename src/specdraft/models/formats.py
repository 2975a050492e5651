"""config.json formats other than the Hugging Face one, translated to the HF-style
dict DraftModelConfig.from_hf_config reads, and the config keys of any draft format
whose math no head computes (refused by name).

The speculators format (github.com/vllm-project/speculators, `speculators_model_type`
in config.json) nests the draft's decoder-layer config under
`transformer_layer_config` and keeps the EAGLE-3 settings at the top level. Only
`speculators_model_type: "eagle3"` is read. Its translation follows vLLM's
(transformers_utils/configs/speculators: the layer config, plus draft_vocab_size,
target_hidden_size, norm_before_residual, norm_before_fc, fc_norm, norm_output and
eagle_aux_hidden_state_layer_ids from the top level), with these differences, the
first three where vLLM and the speculators library read the same file differently:

- `transformer_layer_config` is written with transformers' to_diff_dict, which
  leaves out every value equal to its config class's default; the defaults of
  LlamaConfig / Qwen3Config are filled in here (Qwen3Config's head_dim is 128, not
  hidden_size // num_attention_heads). Its `model_type` must be given (the
  speculators library reads a missing one as qwen3, vLLM as llama).
- a missing `draft_vocab_size` (speculators: 32000, vLLM: vocab_size) or
  `norm_before_residual` (speculators: false, vLLM: true) is refused.
- `num_hidden_layers` of the layer config must be 1: the speculators library builds
  that many decoder layers, Eagle3Head has one.
- `norm_output: true` (speculators' EAGLE-3.1: the normed state feeds the next step)
  becomes `hidden_feed: "normed"`; the key itself is not passed on, since in an
  HF-style (SpecForge) config `norm_output` means something else.

Keys that change the math are passed on under their HF names (model_type "qwen3"
means q/k-norm layers), so DraftModelConfig and the head either implement them or
refuse them by name; the weights the head has no module for are refused as
unexpected tensors. expected_fields lets the loader check that each variant the
speculators config switches on reached the built config.
"""

from __future__ import annotations

from typing import Any

# Keys of other model families that change the math; refused whenever set.
FOREIGN_KEYS = (
    "quantization_config",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "embedding_multiplier",
    "residual_multiplier",
    "attention_multiplier",
    "scale_emb",
    "scale_depth",
)

# The defaults of transformers' LlamaConfig and Qwen3Config for the keys that matter
# here (num_key_value_heads / head_dim None: derived from the head count).
LAYER_CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "head_dim": None,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "qwen3": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "use_sliding_window": False,
    },
}
# What each speculators EAGLE-3 key asks of DraftModelConfig: (field, value wanted
# when the key is true). Checked after the config is built (expected_fields).
SPECULATORS_FIELDS = {
    "norm_before_residual": ("norm_before_residual", True),
    "norm_before_fc": ("norm_before_fc", True),
    "fc_norm": ("fc_norm", True),
    "norm_output": ("hidden_feed", "normed"),
}


def is_speculators_config(hf: dict[str, Any]) -> bool:
    return isinstance(hf, dict) and "speculators_model_type" in hf


def to_hf_draft_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The HF-style dict of a draft's config.json: the speculators format
    translated, any other returned as is."""
    if not isinstance(hf, dict):
        raise ValueError(f"config.json must hold a JSON object, got {type(hf).__name__}")
    return speculators_to_hf(hf) if is_speculators_config(hf) else hf


def drop_training_only(tensors: dict[str, Any]) -> dict[str, Any]:
    """A speculators EAGLE-3 checkpoint may hold verifier_norm / verifier_lm_head:
    the verifier's modules it computes training targets with (the library's
    current versions leave them out on save), not part of the draft's math."""
    return {k: v for k, v in tensors.items() if not k.startswith(("verifier_norm.", "verifier_lm_head."))}


def speculators_to_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """Translate a speculators-format config.json (see the module docstring)."""
    kind = hf["speculators_model_type"]
    if kind != "eagle3":
        raise ValueError(f"speculators_model_type: {kind!r} is not supported (only 'eagle3' is read)")
    layer = hf.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError("transformer_layer_config: missing or not an object in the speculators config")
    model_type = layer.get("model_type")
    if model_type is None:
        raise ValueError(
            "transformer_layer_config.model_type: missing (the speculators library reads it as qwen3, vLLM as llama)"
        )
    if model_type not in LAYER_CONFIG_DEFAULTS:
        raise ValueError(
            f"transformer_layer_config.model_type: {model_type!r} is not supported (one of {sorted(LAYER_CONFIG_DEFAULTS)})"
        )
    defaults = dict(LAYER_CONFIG_DEFAULTS[model_type])
    if isinstance(layer.get("rope_parameters"), dict) and "rope_theta" in layer["rope_parameters"]:
        del defaults["rope_theta"]  # transformers 5 keeps it there; two values would disagree
    out = {**defaults, **layer}
    if out["num_hidden_layers"] != 1:
        raise ValueError(
            f"transformer_layer_config.num_hidden_layers: {out['num_hidden_layers']} decoder layers; Eagle3Head has one"
        )
    out["num_key_value_heads"] = out["num_key_value_heads"] or out["num_attention_heads"]
    for key in ("draft_vocab_size", "norm_before_residual"):
        if hf.get(key) is None:
            raise ValueError(
                f"{key}: missing from the speculators config (speculators and vLLM default it differently)"
            )
    out["draft_vocab_size"] = hf["draft_vocab_size"]
    out["norm_before_residual"] = flag(hf, "norm_before_residual")
    if hf.get("target_hidden_size") is not None:
        out["target_hidden_size"] = hf["target_hidden_size"]
    for key in ("norm_before_fc", "fc_norm"):
        out[key] = flag(hf, key)
    # speculators' norm_output (EAGLE-3.1) feeds the normed state to the next step;
    # SpecForge's key of that name means something else, so it is not passed on.
    out["hidden_feed"] = "normed" if flag(hf, "norm_output") else "prenorm"
    aux = hf.get("eagle_aux_hidden_state_layer_ids")
    if aux is not None:
        if not isinstance(aux, list) or len(aux) != 3:
            raise ValueError(f"eagle_aux_hidden_state_layer_ids: Eagle3Head fuses 3 target layers, got {aux!r}")
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux)}
    dtype = hf.get("torch_dtype", hf.get("dtype"))
    if dtype is not None:
        out["torch_dtype"] = dtype
    out["architectures"] = ["LlamaForCausalLMEagle3"]
    return out


def flag(hf: dict[str, Any], key: str) -> bool:
    value = hf.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{key}: expected true or false, got {value!r}")
    return value


def expected_fields(hf: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """For a speculators config: DraftModelConfig field -> (the key asking for it, the
    value it must have) for each variant the config switches on, so the loader can
    refuse that key by name if the config it built does not carry it out."""
    if not is_speculators_config(hf):
        return {}
    layer = hf.get("transformer_layer_config") or {}
    out = {}
    if layer.get("model_type") == "qwen3":
        out["qk_norm"] = ("transformer_layer_config.model_type", True)
    for key, (name, on) in SPECULATORS_FIELDS.items():
        if hf.get(key):
            out[name] = (key, on)
    return out


def check_layer_count(hf: dict[str, Any], method: str) -> None:
    """An EAGLE-3 config.json's num_hidden_layers counts the head's own decoder
    layers (vLLM's EAGLE-3 model builds that many) and Eagle3Head has one: any other
    count is a ValueError naming the key, before the weights are read. EAGLE-1 and
    MTP configs are not checked here: an MTP config's num_hidden_layers is the
    target's depth (its MTP layers are num_nextn_predict_layers, checked against the
    weights by the loader)."""
    layers = hf.get("num_hidden_layers")
    if method == "eagle3" and layers is not None and layers != 1:
        raise ValueError(
            f"num_hidden_layers: {layers!r} decoder layers in an EAGLE-3 config; only 1 is supported "
            "(Eagle3Head has one decoder layer)"
        )


def check_unsupported_keys(hf: dict[str, Any]) -> None:
    """Refuse (ValueError naming the key) config keys whose math no draft head
    computes and DraftModelConfig does not read: sliding windows and other
    non-full-attention layers, quantization, and the FOREIGN_KEYS of other families."""
    # Qwen configs store a window they only use with use_sliding_window; a config with a
    # window and no such switch (Mistral's convention) uses it.
    window = hf.get("sliding_window")
    if window is not None and hf.get("use_sliding_window", not str(hf.get("model_type", "")).startswith("qwen")):
        raise ValueError(f"sliding_window: sliding-window attention ({window}) is not supported")
    odd = sorted({t for t in hf.get("layer_types") or () if t not in ("full_attention", "sliding_attention")})
    if odd:
        raise ValueError(f"layer_types: {odd} layers are not supported (only full attention)")
    for key in FOREIGN_KEYS:
        if hf.get(key) is not None:
            raise ValueError(f"{key}: not supported ({hf[key]!r})")
