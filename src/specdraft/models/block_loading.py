"""Loading block drafters (DFlash, DSpark: specdraft.models.heads.block) in
DeepSeek's DeepSpec layout, the one its released checkpoints
(deepseek-ai/{dflash,dspark}_qwen3_*, *_gemma4_*) and vLLM's "dspark" method use.

The folder: config.json and model.safetensors (or shards named by
model.safetensors.index.json).
config.json and its conventions: specdraft.models.block_config.

Tensors carry DeepSpec's module names (a leading "model." is dropped):
embed_tokens, layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
post_attention_layernorm, mlp.{gate,up,down}_proj}, fc, hidden_norm, norm, lm_head,
markov_head.{markov_w1, markov_w2, gate_proj, joint_proj}, confidence_head.proj; Gemma4
adds layers.N.{pre,post}_feedforward_layernorm and layers.N.layer_scalar and has no
v_proj with attention_k_eq_v. DeepSpec saves embed_tokens and lm_head (frozen copies
of the target's); vLLM-style checkpoints may leave them out: they are recorded in
`missing_weights`, and share_from(target) fills them. Every tensor is checked by name,
shape and kind (loading.copy_state).

Writing the layout is specdraft.models.block_saving's (save_block_drafter).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from specdraft.checked_mode import is_checked
from specdraft.models.block_config import GEMMA4, QWEN3, SHAREABLE, BlockSettings, block_settings_from_hf, config_flag
from specdraft.models.heads.block import BlockDraftHead
from specdraft.models.heads.block_gemma4 import Gemma4BlockDraftHead
from specdraft.models.loading import check_weights_finite, copy_state
from specdraft.models.safetensors_io import read_checkpoint, strip_model_prefix

__all__ = [
    "block_head_from_checkpoint",
    "build_block_head",
    "load_block_checkpoint",
    "load_block_drafter",
]


# ------------------------------------------------------------------ weights


def build_block_head(settings: BlockSettings) -> BlockDraftHead:
    """An uninitialised head of the settings' backbone."""
    if settings.architecture == GEMMA4:
        return Gemma4BlockDraftHead(settings.config, settings.block, settings.gemma)
    if (settings.architecture == QWEN3) != settings.config.qk_norm:
        raise ValueError(f"qk_norm: {settings.config.qk_norm} does not match architectures [{settings.architecture!r}]")
    return BlockDraftHead(settings.config, settings.block)


def block_head_from_checkpoint(
    hf: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    dtype: torch.dtype | None = None,
    num_target_layers: int | None = None,
    strict: bool = True,
) -> BlockDraftHead:
    """A filled head from config.json's dict and the checkpoint's tensors (by their
    stored names)."""
    settings = block_settings_from_hf(hf, dtype, num_target_layers)
    named = _module_names(tensors)
    if config_flag(hf, "tie_word_embeddings", False) and set(named) & set(SHAREABLE):
        raise ValueError(
            "tie_word_embeddings: true with embed_tokens or lm_head in the checkpoint; transformers would tie "
            "lm_head to embed_tokens, DeepSpec writes false: which weight is meant is ambiguous"
        )
    head = build_block_head(settings)
    if "num_anchors" in hf:
        head.config = replace(head.config, extra={**head.config.extra, "num_anchors": hf["num_anchors"]})
    left_out = copy_state(head, named, lambda name: name in SHAREABLE, strict=strict)
    head.missing_weights = frozenset(name.split(".")[0] for name in left_out)
    return head


def _module_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        key = strip_model_prefix(name)
        if key in out:
            raise ValueError(f"tensor {key!r} is in the checkpoint both with and without the 'model.' prefix")
        out[key] = value
    return out


def load_block_drafter(
    folder: str | Path,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    num_target_layers: int | None = None,
) -> BlockDraftHead:
    """A DFlash / DSpark head from a DeepSpec-layout folder (see the module
    docstring). dtype overrides config.json's; num_target_layers is for configs
    without the key. Weights the folder leaves out (embed_tokens, lm_head) are in
    `missing_weights`: call share_from(target). Checked mode (specdraft.checked_mode)
    also refuses a NaN or Inf weight by tensor and file."""
    hf, raw = read_checkpoint(folder)
    return load_block_checkpoint(folder, hf, raw, dtype, device, num_target_layers)


def load_block_checkpoint(
    folder: str | Path,
    hf: dict[str, Any],
    raw: dict[str, torch.Tensor],
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    num_target_layers: int | None = None,
    strict: bool = True,
) -> BlockDraftHead:
    """load_block_drafter from the folder's config.json dict and tensors, already
    read (load_draft_model's path)."""
    head = block_head_from_checkpoint(hf, raw, dtype, num_target_layers, strict)
    if is_checked():
        check_weights_finite(head, _module_names(raw), raw, folder)
    return head.to(device) if device is not None else head
