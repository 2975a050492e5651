"""Load and save TinyTargetModel from / to a local Hugging Face folder of the Llama,
Qwen2 or Qwen3 family (config.json plus model.safetensors, or shards through
model.safetensors.index.json; specdraft.models.safetensors_io says which files are
read), under the HF tensor names:

    model.embed_tokens.weight, model.norm.weight, lm_head.weight (absent when
    tie_word_embeddings), model.layers.{i}.input_layernorm.weight,
    model.layers.{i}.post_attention_layernorm.weight,
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ {q,k,v}_proj.bias for Qwen2,
    + {q,k,v,o}_proj.bias for Llama / Qwen3 with attention_bias),
    model.layers.{i}.self_attn.{q,k}_norm.weight (Qwen3),
    model.layers.{i}.mlp.{gate,up,down}_proj.weight.

Every config.json key that changes the math is either implemented (sizes, GQA,
head_dim (Qwen3's default 128 when absent, as transformers), rms_norm_eps, RoPE with
its scalings in either spelling (DraftModelConfig / specdraft.models.rope_config
implement or refuse them), tie_word_embeddings, Qwen2's q/k/v bias, Llama's and
Qwen3's attention_bias (q/k/v and o_proj), Qwen3's q/k-norm, dtype) or refused with a
ValueError naming the key (sliding windows, mlp_bias, activations other than SiLU,
quantization, logit soft-capping and scaling): a target that loads but computes
something else would make the demo's "lossless" claim meaningless. Keys that only
matter to training or serving (token ids, attention_dropout, pretraining_tp, which
splits the same matmuls) are accepted.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from specdraft.checked_mode import is_checked
from specdraft.models.config import DraftModelConfig
from specdraft.models.formats import FOREIGN_KEYS
from specdraft.models.loading import check_weights_finite, copy_state
from specdraft.models.rope_config import rope_to_hf
from specdraft.models.safetensors_io import read_checkpoint, strip_model_prefix, write_safetensors
from specdraft.models.target import TinyTargetModel

MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
QWEN3_HEAD_DIM = 128  # Qwen3Config's default, whatever the width
# Kept from config.json on the model's config (config.extra), written back on save.
KEPT_KEYS = ("max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")


def check_target_config(hf: dict[str, Any]) -> str:
    """Refuse what TinyTargetModel does not compute; return the model type."""
    if not isinstance(hf, dict):
        raise ValueError(f"hf config must be a dict, got {type(hf).__name__}")
    model_type = hf.get("model_type", "llama")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type: {model_type!r} is not supported (one of {sorted(MODEL_TYPES)})")
    if "num_hidden_layers" not in hf:
        raise ValueError("num_hidden_layers: missing from the HF config")
    if model_type != "llama" and "num_key_value_heads" not in hf:
        # Qwen2Config's / Qwen3Config's default (32) is not the number of heads: do not guess.
        raise ValueError(f"num_key_value_heads: missing from the {model_type} config")
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"hidden_act: {act!r} is not supported (only silu)")
    _check_sliding_window(hf, model_type)
    if hf.get("mlp_bias", False):
        raise ValueError("mlp_bias: MLP biases are not supported")
    for key in FOREIGN_KEYS:
        if hf.get(key) is not None:
            raise ValueError(f"{key}: not supported ({hf[key]!r})")
    return model_type


def _check_sliding_window(hf: dict[str, Any], model_type: str) -> None:
    # Qwen2 / Qwen3 store a window size they only use with use_sliding_window; a config with
    # sliding_window and no such switch (Mistral's convention) uses it.
    window = hf.get("sliding_window")
    use = hf.get("use_sliding_window", model_type == "llama")
    if window is not None and use:
        raise ValueError(f"sliding_window: sliding-window attention ({window}) is not supported")
    # transformers marks layers "sliding_attention" only when a window is in use (refused
    # above); any other kind of layer (linear attention, ...) is not this model.
    odd = sorted({t for t in hf.get("layer_types") or () if t not in ("full_attention", "sliding_attention")})
    if odd:
        raise ValueError(f"layer_types: {odd} layers are not supported (only full attention)")


def target_config_from_hf(hf: dict[str, Any], dtype: torch.dtype | None = None) -> DraftModelConfig:
    """The TinyTargetModel config of a Llama / Qwen2 / Qwen3 config.json dict (after
    the refusals of check_target_config)."""
    model_type = check_target_config(hf)
    if model_type == "qwen2":
        # Qwen2 always has q/k/v biases (and never an o_proj bias, DraftModelConfig's
        # reading of attention_bias for this model_type), whatever the key says.
        hf = {**hf, "attention_bias": True}
    if model_type == "qwen3" and hf.get("head_dim") is None:
        hf = {**hf, "head_dim": QWEN3_HEAD_DIM}
    config = DraftModelConfig.from_hf_config(hf, dtype=dtype)
    extra = {key: hf[key] for key in KEPT_KEYS if hf.get(key) is not None}
    return dataclasses.replace(config, extra={"model_type": model_type, **extra})


def hf_to_module_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF names -> TinyTargetModel's (a leading "model." dropped); old checkpoints'
    rotary_emb.inv_freq buffers are derived, not weights, and are skipped."""
    return {strip_model_prefix(k): v for k, v in tensors.items() if not k.endswith("rotary_emb.inv_freq")}


def hf_name(name: str) -> str:
    """TinyTargetModel's name -> the HF checkpoint's."""
    return name if name.startswith("lm_head.") else "model." + name


def load_target_model(
    folder: str | Path, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> TinyTargetModel:
    """A TinyTargetModel from a local Llama / Qwen2 / Qwen3 HF folder. dtype overrides
    config.json's torch_dtype. Missing, mis-shaped and unexpected tensors are a
    ValueError naming them; so are config keys whose math is not implemented.
    Checked mode (specdraft.checked_mode) also reads every weight and refuses a NaN
    or Inf by tensor and file (check_weights_finite); unchecked, the values are
    loaded as they are."""
    hf, raw = read_checkpoint(folder)
    config = target_config_from_hf(hf, dtype=dtype)
    tied = bool(hf.get("tie_word_embeddings", False))
    tensors = hf_to_module_names(raw)
    model = TinyTargetModel(config)
    if tied:
        model.tie_embeddings()
        head = tensors.pop("lm_head.weight", None)
        embed = tensors.get("embed_tokens.weight")
        if head is not None and embed is not None and not same_bits(head, embed):
            raise ValueError(
                "tensor 'lm_head.weight' differs from 'model.embed_tokens.weight' but tie_word_embeddings is true"
            )
    copy_state(model, tensors, may_be_missing=lambda name: tied and name == "lm_head.weight", checkpoint_name=hf_name)
    if is_checked():
        check_weights_finite(model, tensors, raw, folder, checkpoint_name=hf_name)
    return model.to(device) if device is not None else model


def target_hf_config(model: TinyTargetModel) -> dict[str, Any]:
    """The config.json of save_target_model, readable by transformers'
    LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM: Qwen3 when the model has
    q/k-norm, Qwen2 when it has q/k/v biases without an o_proj bias, else Llama.
    Scaled RoPE is written in transformers 4's rope_scaling spelling (which
    transformers 5 reads too)."""
    c = model.config
    if c.uses_mrope:
        raise ValueError("mrope_section: an M-RoPE target has no Llama / Qwen2 / Qwen3 config")
    model_type = "qwen3" if c.qk_norm else "qwen2" if c.attention_bias and not c.o_proj_bias else "llama"
    if model_type != "qwen2" and c.attention_bias != c.o_proj_bias:
        raise ValueError(
            f"o_proj_bias: {c.o_proj_bias} with q/k/v biases {c.attention_bias} has no {model_type} config"
        )
    extra = {key: c.extra[key] for key in KEPT_KEYS if c.extra.get(key) is not None}
    out = {
        "architectures": [MODEL_TYPES[model_type]],
        "model_type": model_type,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": rope_to_hf(c.rope_scaling, None, False),
        "tie_word_embeddings": model.tied_embeddings,
        "torch_dtype": str(c.dtype).removeprefix("torch."),
        **extra,
    }
    if model_type == "llama":
        out |= {"attention_bias": c.attention_bias, "mlp_bias": False}
    else:
        out |= {"use_sliding_window": False, "sliding_window": None}
    if model_type == "qwen3":
        out["attention_bias"] = c.attention_bias
    return out


def save_target_model(model: TinyTargetModel, folder: str | Path) -> None:
    """Write config.json and model.safetensors under the HF names (lm_head.weight left
    out when the embeddings are tied), so load_target_model and transformers read it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf = target_hf_config(model)
    state = {hf_name(name): value for name, value in model.state_dict().items()}
    if model.tied_embeddings:
        del state["lm_head.weight"]
    (folder / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    write_safetensors(folder / "model.safetensors", state, metadata={"format": "pt"})


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and bits: a tied copy holding NaN equals itself (NaN != NaN
    under torch.equal would call it different)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))
    return torch.equal(a, b)
