"""A small Llama-style target model (embedding, N decoder layers, norm, lm_head) on
the same paged KV cache, for tests, the demo and evaluation. It can return the
auxiliary hidden states EAGLE-3 fuses."""

from __future__ import annotations

import torch
from torch import nn

from specdraft.models.cache_attention import cache_attention, metadata_for_layer, planned_writes
from specdraft.models.config import DraftModelConfig
from specdraft.models.heads import check_shareable
from specdraft.models.kv_cache import allocate_kv_caches
from specdraft.models.layers import DecoderLayer, RMSNorm, TokenEmbedding
from specdraft.models.linear import Linear


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's usual choice, (2, N // 2, N - 3), clamped into [0, N - 1] for tiny models."""
    return tuple(min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))


class TinyTargetModel(nn.Module):
    """forward(input_ids, positions, attn_metadata, kv_caches, aux_layers=()) ->
    (hidden [T, H] after the final norm, aux [T, len(aux_layers) * H] or None),
    aux in the order of aux_layers (repeats allowed).

    The aux hidden state of layer i is the residual stream entering layer i (vLLM's
    convention for EAGLE-3: hidden + residual before layer i runs); with
    aux_layers=default_aux_layers(N) it is what Eagle3Head.combine_hidden_states takes.
    """

    def __init__(self, config: DraftModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = TokenEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(config) for _ in range(config.num_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.to(config.dtype)

    @property
    def num_kv_layers(self) -> int:
        return self.config.num_layers

    def allocate_kv_caches(self, num_blocks: int, block_size: int, device=None, dtype=None) -> list[torch.Tensor]:
        c = self.config
        weight = self.embed_tokens.weight  # device and dtype default to the model's
        dtype = weight.dtype if dtype is None else dtype
        device = weight.device if device is None else device
        return allocate_kv_caches(c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim, dtype, device)

    def tie_embeddings(self) -> None:
        """lm_head.weight = embed_tokens.weight (tied-embedding targets)."""
        check_shareable("embed_tokens", self.lm_head.weight, self.embed_tokens)
        self.lm_head.weight = self.embed_tokens.weight

    @property
    def tied_embeddings(self) -> bool:
        return self.lm_head.weight is self.embed_tokens.weight

    @property
    def max_position_embeddings(self) -> int | None:
        """config.json's max_position_embeddings (None when the model was built without
        one): the longest sequence the model was trained for; RoPE itself has no limit."""
        return self.config.extra.get("max_position_embeddings")

    def forward(
        self, input_ids, positions, attn_metadata, kv_caches, aux_layers: tuple[int, ...] = (), inputs_embeds=None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        for i in aux_layers:
            if not 0 <= i < self.config.num_layers:
                raise ValueError(f"aux_layers: layer {i} is not in [0, {self.config.num_layers})")
        h = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        entering = []  # the residual stream entering each layer
        writes = planned_writes(kv_caches[: len(self.layers)], attn_metadata)
        for i, layer in enumerate(self.layers):
            entering.append(h)
            attend = cache_attention(kv_caches[i], metadata_for_layer(attn_metadata, i), writes)
            h = layer(positions, h, attend)
        aux = torch.cat([entering[i] for i in aux_layers], dim=-1) if aux_layers else None
        return self.norm(h), aux

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
