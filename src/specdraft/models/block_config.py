"""config.json of a block drafter (DFlash, DSpark) in DeepSeek's DeepSpec layout,
read into BlockSettings (the head's DraftModelConfig, BlockConfig and, for Gemma4,
Gemma4Settings); specdraft.models.block_loading builds and fills the head from a
folder.

config.json is a copy of the target's (text) config with the draft's own depth in
num_hidden_layers and DeepSpec's keys added:

    architectures           ["Qwen3DSparkModel"] (model_type "qwen3") or
                            ["Gemma4DSparkModel"] (model_type "gemma4_text"); DFlash
                            checkpoints use the same classes
    num_target_layers       the target's depth (target_layer_ids are checked against it)
    block_size, mask_token_id, target_layer_ids   (DeepSpec's numbering, -1 = embeddings)
    markov_rank             0: no Markov head; markov_head_type vanilla | gated | rnn
                            (missing with a rank: vanilla, as vLLM reads it)
    enable_confidence_head, confidence_head_with_markov   (missing: false, as vLLM)
    num_anchors             training only (kept, and written back)

Every config key is read, known to leave the draft's math alone (the target's
bookkeeping: token ids, max_position_embeddings, the sliding-window settings of
layers the draft does not have, ...), or refused: a key this module does not know is a
ValueError naming it, and so is a known one set to a value whose math is not
implemented.

Conventions handled besides DeepSpec's own:
- vLLM "dspark": the same layout and semantics; sample_from_anchor must be true (false
  is the z-lab layout below), draft_vocab_size must equal vocab_size, target_hidden_size
  may differ from hidden_size (fc then reads len(target_layer_ids) *
  target_hidden_size); dspark_draft_topk (vLLM's top-k truncation of the corrected
  distribution) is refused: specdraft corrects the whole vocabulary, as DeepSpec does.
- the legacy ["DSparkDraftModel"] with model_type "qwen3": vLLM rewrites it to
  Qwen3DSparkModel with dflash_config's mask_token_id and target_layer_ids; read the
  same way (and so is a Qwen3DSparkModel config that kept its dflash_config), every
  dflash_config key agreeing with the top level where both are set.
- z-lab DFlash (["DFlashDraftModel"] and its kin, vLLM "dflash", SGLang DFLASH): block
  slot k >= 1 predicts its own position and a block gives block_size - 1 drafts;
  specdraft implements DeepSpec's convention (the newest token's slot predicts the next
  one, block_size drafts), so these are refused by name, as is sample_from_anchor false.
- ["LlamaDSparkModel"] (model_type "llama"): specdraft's own name for a block drafter on
  a Llama backbone (no q / k norms), which DeepSpec has no class for; the same keys.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import torch

from specdraft.models.config import DraftModelConfig
from specdraft.models.formats import check_unsupported_keys
from specdraft.models.heads.block import MARKOV_KINDS, BlockConfig
from specdraft.models.heads.block_gemma4 import Gemma4Settings

__all__ = [
    "BLOCK_ARCHITECTURES",
    "BlockSettings",
    "block_settings_from_hf",
    "config_flag",
    "is_block_config",
    "is_block_folder",
]

QWEN3, GEMMA4, LLAMA = "Qwen3DSparkModel", "Gemma4DSparkModel", "LlamaDSparkModel"
LEGACY = "DSparkDraftModel"
BLOCK_ARCHITECTURES = (QWEN3, GEMMA4, LLAMA)
MODEL_TYPES = {QWEN3: "qwen3", GEMMA4: "gemma4_text", LLAMA: "llama"}
SHAREABLE = ("embed_tokens.weight", "lm_head.weight")
DEFAULT_NUM_ANCHORS = 512  # DeepSpec's configs' value; training only

ZLAB_REFUSAL = (
    "the z-lab DFlash convention (vLLM 'dflash', SGLang DFLASH): its block slot k >= 1 predicts the token at "
    "its own position and a block gives block_size - 1 drafts, while specdraft implements DeepSpec's "
    "convention (the newest token's slot predicts the next token, block_size drafts); the weights would "
    "load but draft the wrong positions"
)

# The draft's own block settings (DeepSpec's keys and vLLM's dspark keys).
BLOCK_KEYS = {
    "block_size", "mask_token_id", "target_layer_ids", "num_target_layers", "markov_rank", "markov_head_type",
    "enable_confidence_head", "confidence_head_with_markov", "num_anchors", "sample_from_anchor",
    "draft_vocab_size", "target_hidden_size", "dspark_draft_topk",
}  # fmt: skip
# The target's bookkeeping, kept in the copy of its config: no bearing on the draft's math.
IGNORED_KEYS = {
    "architectures", "model_type", "transformers_version", "_name_or_path", "bos_token_id", "eos_token_id",
    "pad_token_id", "initializer_range", "max_position_embeddings", "use_cache", "attention_dropout",
    "output_attentions", "output_hidden_states", "return_dict", "torchscript", "id2label", "label2id",
    "tokenizer_class", "chunk_size_feed_forward", "problem_type", "dtype", "torch_dtype",
}  # fmt: skip
# Read for the Llama / Qwen3 backbone (DraftModelConfig.from_hf_config refuses what it
# does not compute: another hidden_act, mlp_bias, a partial or dynamic RoPE, ...).
LLAMA_QWEN3_KEYS = {
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
    "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "attention_bias", "hidden_act", "mlp_bias",
    "num_hidden_layers", "tie_word_embeddings", "layer_types", "sliding_window", "use_sliding_window",
    "max_window_layers", "pretraining_tp", "original_max_position_embeddings",
}  # fmt: skip
# Read (or checked) for the Gemma4 backbone. head_dim, num_key_value_heads (with
# attention_k_eq_v), sliding_window and the PLE / MoE keys describe the target's
# sliding or other layers, which the draft does not have.
GEMMA4_KEYS = {
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_global_key_value_heads",
    "global_head_dim", "head_dim", "vocab_size", "rms_norm_eps", "rope_parameters", "attention_bias",
    "attention_k_eq_v", "hidden_activation", "final_logit_softcapping", "num_hidden_layers", "tie_word_embeddings",
    "layer_types", "sliding_window", "use_bidirectional_attention", "enable_moe_block", "num_experts",
    "top_k_experts", "moe_intermediate_size", "hidden_size_per_layer_input", "vocab_size_per_layer_input",
    "num_kv_shared_layers", "use_double_wide_mlp", "per_layer_config", "target_model_type",
    "target_text_model_type",
}  # fmt: skip
# The legacy DSparkDraftModel's nested block settings.
DFLASH_CONFIG_KEYS = {
    "mask_token_id", "target_layer_ids", "markov_rank", "markov_head_type", "block_size", "num_target_layers",
    "enable_confidence_head", "confidence_head_with_markov", "target_hidden_size", "projector_type",
    "attention_mode",
}  # fmt: skip
GEMMA4_DEFAULT_ROPE = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}


class BlockSettings(NamedTuple):
    """What a block drafter's config.json asks for: the architecture it names, the
    backbone's DraftModelConfig, the BlockConfig, Gemma4's settings (None for the
    other backbones)."""

    architecture: str
    config: DraftModelConfig
    block: BlockConfig
    gemma: Gemma4Settings | None


# ------------------------------------------------------------------ config.json


def is_block_config(hf: object) -> bool:
    """Whether a config.json dict names a block drafter (one this module loads or
    refuses by name: the DSpark classes, the legacy name, the z-lab DFlash ones)."""
    if not isinstance(hf, dict):
        return False
    names = hf.get("architectures") or []
    names = names if isinstance(names, list) else [names]
    return (
        any(isinstance(n, str) and (n in BLOCK_ARCHITECTURES or n == LEGACY or "DFlash" in n) for n in names)
        or "dflash_config" in hf
        or hf.get("model_type") == "dflash"
    )


def is_block_folder(folder: str | Path) -> bool:
    """Whether folder/config.json names a block drafter (`is_block_config`)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return False
    try:
        return is_block_config(json.loads(path.read_text()))
    except ValueError:
        return False


def block_settings_from_hf(
    hf: dict[str, Any], dtype: torch.dtype | None = None, num_target_layers: int | None = None
) -> BlockSettings:
    """Read a block drafter's config.json (see the module docstring). dtype overrides
    its dtype / torch_dtype; num_target_layers stands in for a config without the key
    (the legacy layout) and must agree with one that has it."""
    if not isinstance(hf, dict):
        raise ValueError(f"config.json must hold a JSON object, got {type(hf).__name__}")
    architecture = _architecture(hf)
    if architecture == LEGACY or (architecture == QWEN3 and "dflash_config" in hf):
        hf, architecture = _fold_legacy(hf, architecture), QWEN3
    if hf.get("model_type") != MODEL_TYPES[architecture]:
        raise ValueError(
            f"model_type: {hf.get('model_type')!r} with architectures [{architecture!r}]; expected "
            f"{MODEL_TYPES[architecture]!r} (the backbone the class computes)"
        )
    if hf.get("quantization_config") is not None:
        raise ValueError("quantization_config: quantized block drafters are not supported")
    known = BLOCK_KEYS | IGNORED_KEYS | (GEMMA4_KEYS if architecture == GEMMA4 else LLAMA_QWEN3_KEYS)
    unknown = sorted(set(hf) - known)
    if unknown:
        raise ValueError(
            f"{unknown[0]}: a config key the block-drafter loader does not know"
            + (f" (also {', '.join(unknown[1:])})" if len(unknown) > 1 else "")
            + "; it may change the draft's math, so the checkpoint is refused rather than read without it"
        )
    _check_serving_keys(hf)
    if architecture == GEMMA4:
        config, gemma = _gemma4_config(hf, dtype)
    else:
        config, gemma = _llama_qwen3_config(hf, dtype), None
    return BlockSettings(architecture, config, _block_config(hf, num_target_layers), gemma)


def _architecture(hf: dict[str, Any]) -> str:
    names = hf.get("architectures")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"architectures: expected a list of class names, got {names!r}")
    zlab = [n for n in names if "DFlash" in n]
    if zlab or hf.get("model_type") == "dflash" or ("dflash_config" in hf and not {LEGACY, QWEN3} & set(names)):
        raise ValueError(f"architectures: {zlab or names} is {ZLAB_REFUSAL}")
    if len(names) != 1 or names[0] not in (*BLOCK_ARCHITECTURES, LEGACY):
        raise ValueError(
            f"architectures: {names} is not a block drafter class (one of {[*BLOCK_ARCHITECTURES, LEGACY]})"
        )
    return names[0]


def _fold_legacy(hf: dict[str, Any], architecture: str) -> dict[str, Any]:
    """The legacy DSparkDraftModel config as vLLM reads it: Qwen3DSparkModel with
    dflash_config's block settings at the top level (each must agree with a top-level
    value of the same key). A Qwen3DSparkModel config that kept its dflash_config
    (a legacy config rewritten by hand) is read the same way."""
    if hf.get("model_type") != "qwen3":
        raise ValueError(
            f"architectures: [{architecture!r}] with model_type {hf.get('model_type')!r}: only the Qwen3 layout "
            "(model_type 'qwen3') is read; vLLM routes the others to DeepSeek-V4's DSpark, whose weights live in "
            "the target"
        )
    nested = hf.get("dflash_config") or {}
    if not isinstance(nested, dict):
        raise ValueError(f"dflash_config: expected an object, got {nested!r}")
    out = {k: v for k, v in hf.items() if k != "dflash_config"}
    for key, value in nested.items():
        if key not in DFLASH_CONFIG_KEYS:
            raise ValueError(f"dflash_config.{key}: a key the block-drafter loader does not know")
        if key in out and out[key] != value:
            raise ValueError(
                f"dflash_config.{key}: {value!r} disagrees with the top-level {key} {out[key]!r}; which one the "
                "checkpoint means is ambiguous"
            )
        out[key] = value
    for key, allowed in (("projector_type", "dspark"), ("attention_mode", "gqa")):
        if out.get(key, allowed) != allowed:
            raise ValueError(f"{key}: {out[key]!r} is not supported (only {allowed!r}: DeepSpec's DSpark backbone)")
        out.pop(key, None)
    return {**out, "architectures": [QWEN3]}


def _check_serving_keys(hf: dict[str, Any]) -> None:
    anchor = hf.get("sample_from_anchor", True)
    if anchor is not True:
        raise ValueError(f"sample_from_anchor: {anchor!r} is {ZLAB_REFUSAL}")
    if hf.get("dspark_draft_topk") is not None:
        raise ValueError(
            f"dspark_draft_topk: {hf['dspark_draft_topk']!r} is vLLM's top-k truncation of the Markov-corrected "
            "draft distribution; specdraft corrects the whole vocabulary, as DeepSpec does (remove the key to "
            "load the checkpoint with the full correction)"
        )
    draft_vocab = hf.get("draft_vocab_size")
    if draft_vocab is not None and draft_vocab != hf.get("vocab_size"):
        raise ValueError(
            f"draft_vocab_size: {draft_vocab!r} differs from vocab_size {hf.get('vocab_size')!r}; block drafters "
            "draft over the target's whole vocabulary (no d2t map)"
        )
    for key in ("mask_token_id", "markov_rank", "block_size"):
        if key in hf and (isinstance(hf[key], bool) or not isinstance(hf[key], int)):
            raise ValueError(f"{key}: expected an int, got {hf[key]!r}")


def config_flag(hf: dict[str, Any], key: str, default: bool) -> bool:
    value = hf.get(key, default)
    value = default if value is None else value
    if not isinstance(value, bool):
        raise ValueError(f"{key}: expected true or false, got {value!r}")
    return value


def _need(hf: dict[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise ValueError(f"{key}: missing from config.json")
    return hf[key]


def _block_config(hf: dict[str, Any], num_target_layers: int | None) -> BlockConfig:
    depth = hf.get("num_target_layers")
    if depth is None:
        if num_target_layers is None:
            raise ValueError(
                "num_target_layers: missing from config.json; pass num_target_layers= (the target's depth, which "
                "target_layer_ids are checked against)"
            )
        depth = num_target_layers
    elif num_target_layers is not None and num_target_layers != depth:
        raise ValueError(f"num_target_layers: config.json gives {depth!r}, the caller {num_target_layers!r}")
    ids = _need(hf, "target_layer_ids")
    if not isinstance(ids, list):
        raise ValueError(f"target_layer_ids: expected a list of ints, got {ids!r}")
    rank = _need(hf, "markov_rank")
    kind = hf.get("markov_head_type")
    if rank:
        # DeepSpec lower-cases the type; vLLM reads a missing one as vanilla (the
        # weights are checked by name, so a gated or rnn head cannot pass for vanilla).
        kind = "vanilla" if kind is None else str(kind).lower()
        if kind not in MARKOV_KINDS:
            raise ValueError(f"markov_head_type: {hf['markov_head_type']!r} is not one of {MARKOV_KINDS}")
    else:
        kind = None  # DeepSpec ignores the type without a Markov head
    confidence = config_flag(hf, "enable_confidence_head", False)
    with_markov = config_flag(hf, "confidence_head_with_markov", False) if confidence else False
    return BlockConfig(
        block_size=_need(hf, "block_size"),
        mask_token_id=_need(hf, "mask_token_id"),
        target_layer_ids=tuple(ids),
        num_target_layers=depth,
        markov_rank=rank,
        markov_head_type=kind,
        confidence_head=confidence,
        confidence_with_markov=with_markov,
    )


def _check_layer_types(hf: dict[str, Any]) -> None:
    types = hf.get("layer_types")
    if types is None:
        return
    layers = hf.get("num_hidden_layers")
    if not isinstance(types, list) or len(types) != layers or any(t != "full_attention" for t in types):
        raise ValueError(
            f"layer_types: {types!r}; a block drafter's {layers} layers are all 'full_attention' (the block "
            "attends to its whole context)"
        )


def _llama_qwen3_config(hf: dict[str, Any], dtype: torch.dtype | None) -> DraftModelConfig:
    _check_layer_types(hf)
    # max_position_embeddings too: a YaRN / Llama 3 RoPE falls back on it.
    passed = LLAMA_QWEN3_KEYS | {"model_type", "dtype", "torch_dtype", "target_hidden_size", "max_position_embeddings"}
    read = {k: hf[k] for k in passed if k in hf}
    read.pop("layer_types", None)  # checked above: all full attention
    if read.get("pretraining_tp", 1) != 1:
        raise ValueError(f"pretraining_tp: {read['pretraining_tp']!r} is not supported (only 1)")
    read.pop("pretraining_tp", None)
    check_unsupported_keys(read)
    for key in ("num_hidden_layers", "num_key_value_heads"):
        _need(hf, key)
    return DraftModelConfig.from_hf_config(read, dtype=dtype)


def _gemma4_config(hf: dict[str, Any], dtype: torch.dtype | None) -> tuple[DraftModelConfig, Gemma4Settings]:
    _check_layer_types(hf)
    act = hf.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"hidden_activation: {act!r} is not supported (only gelu_pytorch_tanh)")
    if config_flag(hf, "enable_moe_block", False):
        raise ValueError("enable_moe_block: Gemma4 MoE blocks are not supported (nor by DeepSpec's Gemma4 drafter)")
    if hf.get("hidden_size_per_layer_input") != 0:
        raise ValueError(
            f"hidden_size_per_layer_input: {hf.get('hidden_size_per_layer_input')!r}; only 0 (no per-layer inputs, "
            "as DeepSpec's Gemma4 drafter requires)"
        )
    if config_flag(hf, "use_double_wide_mlp", False) and hf.get("num_kv_shared_layers"):
        raise ValueError("use_double_wide_mlp: double-wide MLPs of KV-shared layers are not supported")
    k_eq_v = config_flag(hf, "attention_k_eq_v", False)
    kv_key = "num_global_key_value_heads" if k_eq_v else "num_key_value_heads"
    head_dim = _need(hf, "global_head_dim")
    rope = _gemma4_rope(hf, head_dim)
    bias = config_flag(hf, "attention_bias", False)
    cap = hf.get("final_logit_softcapping")
    gemma = Gemma4Settings(
        partial_rotary_factor=rope.get("partial_rotary_factor", 1.0),
        rope_factor=rope.get("factor", 1.0),
        attention_k_eq_v=k_eq_v,
        final_logit_softcapping=cap,
    )
    read = {
        "model_type": "gemma4_text",
        "hidden_size": _need(hf, "hidden_size"),
        "intermediate_size": _need(hf, "intermediate_size"),
        "num_attention_heads": _need(hf, "num_attention_heads"),
        "num_key_value_heads": _need(hf, kv_key),
        "head_dim": head_dim,
        "vocab_size": _need(hf, "vocab_size"),
        "target_hidden_size": hf.get("target_hidden_size"),
        "rms_norm_eps": hf.get("rms_norm_eps", 1e-6),
        "rope_theta": rope["rope_theta"],
        "num_hidden_layers": _need(hf, "num_hidden_layers"),
        "attention_bias": bias,  # on q, k, v and o
        "qk_norm": True,
        "torch_dtype": hf.get("dtype", hf.get("torch_dtype")),
    }
    return DraftModelConfig.from_hf_config(read, dtype=dtype), gemma


def _gemma4_rope(hf: dict[str, Any], head_dim: int) -> dict[str, Any]:
    """The full-attention layers' RoPE dict (the draft's layers are all full attention)."""
    params = hf.get("rope_parameters")
    if params is None:
        return dict(GEMMA4_DEFAULT_ROPE)
    rope = params.get("full_attention") if isinstance(params, dict) else None
    if not isinstance(rope, dict):
        raise ValueError(f"rope_parameters: no 'full_attention' entry in {params!r}")
    kind = rope.get("rope_type", "default")
    allowed = {"proportional": {"partial_rotary_factor", "factor"}, "default": set()}
    if kind not in allowed:
        raise ValueError(
            f"rope_parameters.full_attention: rope type {kind!r} is not supported (one of {sorted(allowed)})"
        )
    odd = sorted(set(rope) - {"rope_type", "rope_theta"} - allowed[kind])
    if odd:
        raise ValueError(f"rope_parameters.full_attention: {odd} not understood for rope type {kind!r}")
    if rope.get("rope_theta") is None:
        raise ValueError("rope_parameters.full_attention: no rope_theta")
    if kind == "default" and hf.get("head_dim", head_dim) != head_dim:
        # transformers 5.10 sizes the default RoPE by head_dim, 5.24 by global_head_dim.
        raise ValueError(
            "rope_parameters.full_attention: rope type 'default' with head_dim != global_head_dim is read "
            "differently by transformers versions"
        )
    return rope
