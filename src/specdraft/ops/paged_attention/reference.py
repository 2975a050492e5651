"""The torch reference of `masked_paged_attention`: the CPU path and the kernels'
oracle. Gathers each request's keys and values through their slots, then one
scaled_dot_product_attention (a kv head's query heads as rows of one query
matrix): attention_over_keys, which the models' tree attention over keys outside
the cache calls too."""

import torch
import torch.nn.functional as F


def masked_paged_attention_reference(
    query: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    # A contract violation reads inside the cache, as the kernel does.
    slots = slots.clamp(0, kv_cache.shape[1] * kv_cache.shape[2] - 1)
    return attention_over_keys(query, *gather_slots(kv_cache, slots), visible, scale)


def gather_slots(kv_cache: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values [B, L, kv_heads, D] of kv_cache [2, num_blocks, block_size,
    kv_heads, D] at flat slots [B, L] (each in bounds)."""
    flat = kv_cache.flatten(1, 2)  # [2, slots, kv_heads, D]
    keys = flat[0].index_select(0, slots.reshape(-1)).view(*slots.shape, *flat.shape[2:])
    values = flat[1].index_select(0, slots.reshape(-1)).view(*slots.shape, *flat.shape[2:])
    return keys, values


def attention_over_keys(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """query [B, Q, heads, D] over keys / values [B, L, kv_heads, D] where visible [B,
    Q, L]: [B, Q, heads, D] in query's dtype; a query that sees nothing gets zeros.
    One scaled_dot_product_attention (its kernels accumulate in fp32) with a kv
    head's query heads as rows of one query matrix: no GQA expansion."""
    batch, num_queries, heads, dim = query.shape
    kv_heads = keys.shape[2]
    group = heads // kv_heads
    # Keys no query sees are zeroed: an unwritten slot may hold NaN, and 0 * NaN would leak.
    seen = visible.any(1)[:, :, None, None]
    keys, values = torch.where(seen, keys, 0), torch.where(seen, values, 0)
    rows = query.view(batch, num_queries, kv_heads, group, dim).permute(0, 2, 3, 1, 4)
    rows = rows.reshape(batch, kv_heads, group * num_queries, dim)
    mask = visible[:, None, None].expand(-1, 1, group, -1, -1).reshape(batch, 1, group * num_queries, -1)
    out = F.scaled_dot_product_attention(
        rows, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask, scale=scale
    )  # [B, kv_heads, group * Q, D]; NaN in rows that see nothing
    # .contiguous() before the merge of (kv_heads, group): torch 2.11's nested compile
    # region traced a reshape here as a view of the producer's layout, which its
    # fake-tensor pass then saw with other strides on CUDA (B = 1: "Cannot view a tensor").
    out = out.view(batch, kv_heads, group, num_queries, dim).permute(0, 3, 1, 2, 4).contiguous()
    return torch.where(visible.any(-1)[:, :, None, None], out.view(batch, num_queries, heads, dim), 0)
