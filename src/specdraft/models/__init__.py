"""Draft models in pure torch that compile under torch.compile(fullgraph=True): a
paged KV cache and attention, RoPE / M-RoPE, Llama-style layers, the draft
heads (EAGLE-1, EAGLE-3, MTP; the DFlash / DSpark block drafters) behind one interface (see specdraft.models.heads), a
tiny target model, and loading from local HF-format folders."""

from specdraft.layout import PADDING_SLOT_ID, BatchMetadata
from specdraft.models.attention import paged_attention
from specdraft.models.block_loading import load_block_drafter
from specdraft.models.block_saving import save_block_drafter
from specdraft.models.config import DraftModelConfig
from specdraft.models.heads import (
    BlockConfig,
    BlockDraftHead,
    DraftHead,
    Eagle3Head,
    EagleHead,
    Gemma4BlockDraftHead,
    Gemma4Settings,
    MTPHead,
)
from specdraft.models.kv_cache import allocate_kv_caches, kv_cache_shape, write_kv_cache
from specdraft.models.layers import DecoderLayer, RMSNorm
from specdraft.models.loading import load_draft_model, read_safetensors, save_draft_model, write_safetensors
from specdraft.models.rope import RopeScaling, RotaryEmbedding
from specdraft.models.target import TinyTargetModel, default_aux_layers
from specdraft.models.target_loading import load_target_model, save_target_model

__all__ = [
    "PADDING_SLOT_ID",
    "BatchMetadata",
    "BlockConfig",
    "BlockDraftHead",
    "DecoderLayer",
    "DraftHead",
    "DraftModelConfig",
    "Eagle3Head",
    "EagleHead",
    "Gemma4BlockDraftHead",
    "Gemma4Settings",
    "MTPHead",
    "RMSNorm",
    "RopeScaling",
    "RotaryEmbedding",
    "TinyTargetModel",
    "allocate_kv_caches",
    "default_aux_layers",
    "kv_cache_shape",
    "load_block_drafter",
    "load_draft_model",
    "load_target_model",
    "paged_attention",
    "read_safetensors",
    "save_block_drafter",
    "save_draft_model",
    "save_target_model",
    "write_kv_cache",
    "write_safetensors",
]
