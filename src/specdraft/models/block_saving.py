"""Saving block drafters (DFlash, DSpark) in DeepSeek's DeepSpec layout, the one
specdraft.models.block_loading reads (its docstring describes the folder): config.json
and model.safetensors, or shards with model.safetensors.index.json. A save round-trips
exactly through load_block_drafter, and DeepSpec's own classes read the Qwen3 and
Gemma4 ones (scripts/check_against_deepspec.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specdraft.models.block_config import DEFAULT_NUM_ANCHORS, GEMMA4, LLAMA, MODEL_TYPES, QWEN3
from specdraft.models.heads.block import BlockDraftHead
from specdraft.models.heads.block_gemma4 import Gemma4BlockDraftHead
from specdraft.models.rope_config import rope_to_hf
from specdraft.models.safetensors_io import INDEX, write_safetensors

__all__ = ["block_hf_config", "save_block_drafter"]


def block_hf_config(head: BlockDraftHead) -> dict[str, Any]:
    """The config.json of `head` in DeepSpec's layout (load_block_drafter reads it
    back to the same head; DeepSpec's own classes read the Qwen3 and Gemma4 ones)."""
    if not isinstance(head, BlockDraftHead):
        raise ValueError(f"head must be a BlockDraftHead, got {type(head).__name__}")
    c, b = head.config, head.block
    if c.rope_scaling is not None and isinstance(head, Gemma4BlockDraftHead):
        raise ValueError("rope_scaling: a Gemma4 block head's RoPE is its Gemma4Settings'")
    if c.uses_mrope or c.draft_vocab_size != c.vocab_size:
        raise ValueError("mrope_section / draft_vocab_size: no block-drafter config.json spells them")
    common = {
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "vocab_size": c.vocab_size,
        "rms_norm_eps": c.rms_norm_eps,
        "num_hidden_layers": c.num_layers,
        "layer_types": ["full_attention"] * c.num_layers,
        "tie_word_embeddings": False,
        "dtype": str(c.dtype).removeprefix("torch."),
        "num_target_layers": b.num_target_layers,
        "block_size": b.block_size,
        "mask_token_id": b.mask_token_id,
        "target_layer_ids": list(b.target_layer_ids),
        "num_anchors": c.extra.get("num_anchors", DEFAULT_NUM_ANCHORS),
        "enable_confidence_head": b.confidence_head,
        "markov_rank": b.markov_rank,
    }
    if b.confidence_head:
        common["confidence_head_with_markov"] = b.confidence_with_markov
    if b.markov_rank:
        common["markov_head_type"] = b.markov_head_type
    if c.target_hidden_size != c.hidden_size:
        common["target_hidden_size"] = c.target_hidden_size  # vLLM's key; DeepSpec's fc assumes hidden_size
    if c.attention_bias != c.o_proj_bias:
        raise ValueError(
            "attention_bias / o_proj_bias: DeepSpec's backbones put biases on all four projections or none"
        )
    if isinstance(head, Gemma4BlockDraftHead):
        return {**_gemma4_keys(head), **common}
    arch = QWEN3 if c.qk_norm else LLAMA
    rope = rope_to_hf(c.rope_scaling, None, False) or {"rope_type": "default"}
    return {
        "architectures": [arch],
        "model_type": MODEL_TYPES[arch],
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "attention_bias": c.attention_bias,
        "rope_parameters": {**rope, "rope_theta": c.rope_theta},
        "use_sliding_window": False,
        **common,
    }


def _gemma4_keys(head: Gemma4BlockDraftHead) -> dict[str, Any]:
    c, g = head.config, head.gemma
    rope = {"rope_type": "proportional", "partial_rotary_factor": g.partial_rotary_factor, "rope_theta": c.rope_theta}
    if g.rope_factor != 1.0:
        rope["factor"] = g.rope_factor
    return {
        "architectures": [GEMMA4],
        "model_type": MODEL_TYPES[GEMMA4],
        "target_model_type": "gemma4",
        "target_text_model_type": "gemma4_text",
        "num_key_value_heads": c.num_kv_heads,
        "num_global_key_value_heads": c.num_kv_heads,
        "global_head_dim": c.head_dim,
        "head_dim": c.head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": c.attention_bias,
        "attention_k_eq_v": g.attention_k_eq_v,
        "final_logit_softcapping": g.final_logit_softcapping,
        "rope_parameters": {"full_attention": rope},
        "enable_moe_block": False,
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "use_double_wide_mlp": False,
    }


def save_block_drafter(
    head: BlockDraftHead, folder: str | Path, shared: tuple[str, ...] = (), max_shard_bytes: int | None = None
) -> None:
    """Write config.json and the weights in DeepSpec's layout: embed_tokens and
    lm_head included (DeepSpec saves them) unless named in `shared` (vLLM style: the
    target supplies them) or never loaded (`missing_weights`). With max_shard_bytes,
    the weights go to model-0000i-of-0000n.safetensors shards and
    model.safetensors.index.json. The weight files of an earlier save in the folder
    (model*.safetensors, the index) are removed first, so that no stale file is read
    back."""
    shared = set(shared)
    if not shared <= {"embed_tokens", "lm_head"}:
        raise ValueError(f"shared: only 'embed_tokens' and 'lm_head' can be left out, got {sorted(shared)}")
    config = block_hf_config(head)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("model*.safetensors"), folder / INDEX]:
        old.unlink(missing_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    leave_out = shared | set(head.missing_weights)
    state = {k: v for k, v in head.state_dict().items() if k.split(".")[0] not in leave_out}
    metadata = {"format": "pt"}  # what transformers' from_pretrained expects
    if max_shard_bytes is None:
        write_safetensors(folder / "model.safetensors", state, metadata)
        return
    shards = _shards(state, max_shard_bytes)
    weight_map = {}
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(folder / file, {n: state[n] for n in names}, metadata)
        weight_map |= dict.fromkeys(names, file)
    total = sum(t.numel() * t.element_size() for t in state.values())
    (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def _shards(state: dict[str, torch.Tensor], max_bytes: int) -> list[list[str]]:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_shard_bytes must be a positive int, got {max_bytes!r}")
    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(state):
        nbytes = state[name].numel() * state[name].element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards
