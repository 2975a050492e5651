"""Pure-torch paged attention for variable-length query batches.

Causality is bottom-right aligned, as in FlashAttention's varlen mode that vLLM uses:
query i of a request with query length q and sequence length s sits at sequence index
s - q + i and sees that request's keys 0 .. s - q + i. For text this is "a query at
position p sees keys at positions <= p"; it is defined by query_start_loc and
seq_lens rather than by `positions` because M-RoPE positions are not sequence indices.

Vectorised with two static bounds (Python ints, so the graph has fixed shapes):
max_query_len Q and max_seq_len L. Queries are laid out padded [B, Q], keys gathered
per request [B, L] through the block table: ops.masked_paged_attention reads them
there, split over the keys (its Triton kernels on CUDA, its torch reference on CPU). This
is the draft-model path (Q is small during drafting); it is not a prefill kernel.
"""

from __future__ import annotations

import os

import torch

from specdraft.layout import resolve_max_seq_len, window_of
from specdraft.models.kv_cache import check_kv_cache
from specdraft.ops.paged_attention import (
    attention_over_keys,
    gather_slots,
    masked_paged_attention,
    masked_paged_attention_reference,
)

# The attention form (read at import; benches set the attribute before a fresh
# compile): "kernel" (the default), ops.masked_paged_attention, which on CUDA runs
# Triton kernels split over the keys that read the cache through the slots (the
# 8B-shaped verify forward 6-10% faster than "sdpa" on an H200, benchmarks/README.md)
# and on CPU its torch reference, which is the "sdpa" form; "sdpa", the keys gathered
# through the block table and one scaled_dot_product_attention; "fp32", the einsum
# form before both, q, K and V upcast to fp32. Tree attention over keys outside the
# cache (the drafter's) takes "sdpa" where the form is "kernel".
ATTENTION_FORM = os.environ.get("SPECDRAFT_ATTENTION", "kernel")
if ATTENTION_FORM not in ("kernel", "sdpa", "fp32"):
    raise ValueError(f"SPECDRAFT_ATTENTION must be kernel, sdpa or fp32, got {ATTENTION_FORM!r}")


def _padded_queries(query, query_start_loc, max_query_len):
    """[B, Q] token indices of each request's queries and whether each is real."""
    starts = query_start_loc[:-1].to(torch.int64)
    lens = query_start_loc[1:].to(torch.int64) - starts
    i = torch.arange(max_query_len, device=query.device)
    token = (starts[:, None] + i[None, :]).clamp(0, query.shape[0] - 1)
    return token, i[None, :] < lens[:, None], lens


def _key_slots(kv_cache, block_table, max_seq_len):
    """[L] key positions and [B, L] the flat slot of each request's key l."""
    block_size, num_blocks = kv_cache.shape[2], kv_cache.shape[1]
    key_pos = torch.arange(max_seq_len, device=kv_cache.device)
    blocks = block_table.to(torch.int64).index_select(1, key_pos // block_size)
    # Entries past a request's last block may hold anything: clamp so every read stays
    # in bounds; those keys are masked out.
    return key_pos, blocks.clamp(0, num_blocks - 1) * block_size + key_pos % block_size


def _gathered_keys(kv_cache, block_table, max_seq_len):
    """[L] key positions, and the keys and values [B, L, kv_heads, D] at their slots."""
    key_pos, slots = _key_slots(kv_cache, block_table, max_seq_len)
    return key_pos, *gather_slots(kv_cache, slots)


def _attend_cache(query, kv_cache, slots, visible, scale):
    """query [B, Q, heads, D] over the keys at slots [B, L] where visible [B, Q, L], in
    the form ATTENTION_FORM names: [B, Q, heads, D] in query's dtype."""
    _grouped(query, kv_cache.shape[3])  # a ValueError where heads is not a multiple of kv_heads
    if ATTENTION_FORM == "kernel":
        return masked_paged_attention(query, kv_cache, slots, visible, scale)
    if ATTENTION_FORM == "sdpa":
        return masked_paged_attention_reference(query, kv_cache, slots, visible, scale)
    return _attend_visible(query, *gather_slots(kv_cache, slots), visible, scale)


def _scatter_back(out_padded, query_start_loc, num_tokens, max_query_len):
    """[B, Q, H, D] -> [T, H, D]: token t takes row (its request, t - request start)."""
    bounds = query_start_loc.to(torch.int64)
    t = torch.arange(num_tokens, device=out_padded.device)
    req = window_of(t, bounds[1:])
    num_reqs = out_padded.shape[0]
    req_c = req.clamp(max=num_reqs - 1)
    i = t - bounds.index_select(0, req_c)
    real = (req < num_reqs) & (i < max_query_len)
    rows = out_padded[req_c, i.clamp(0, max_query_len - 1)]
    return torch.where(real[:, None, None], rows, 0)


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_query_len: int,
    max_seq_len: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """query [T, heads, head_dim] -> [T, heads, head_dim] in query.dtype; GQA when
    heads is a multiple of the cache's kv_heads. The cache must already hold this
    step's keys (write_kv_cache first)."""
    check_kv_cache("kv_cache", kv_cache)
    num_tokens, heads, dim = query.shape
    kv_heads = kv_cache.shape[3]
    if heads % kv_heads or dim != kv_cache.shape[4]:
        raise ValueError(f"query must be [T, k * {kv_heads}, {kv_cache.shape[4]}], got {tuple(query.shape)}")
    bound = block_table.shape[1] * kv_cache.shape[2]
    max_seq_len = resolve_max_seq_len(max_seq_len, block_table, kv_cache.shape[2])
    if isinstance(max_seq_len, int) and isinstance(bound, int) and not 1 <= max_seq_len <= bound:
        raise ValueError(f"max_seq_len must be in [1, block_table width * block_size = {bound}], got {max_seq_len}")
    if isinstance(max_query_len, int) and max_query_len < 1:
        raise ValueError(f"max_query_len must be >= 1, got {max_query_len}")
    num_reqs = seq_lens.shape[0]
    if num_tokens == 0 or num_reqs == 0:
        return torch.zeros_like(query)
    scale = dim**-0.5 if scale is None else scale

    token, q_real, q_lens = _padded_queries(query, query_start_loc, max_query_len)
    key_pos, slots = _key_slots(kv_cache, block_table, max_seq_len)
    lens = seq_lens.to(torch.int64)[:, None]
    k_real = key_pos[None, :] < lens  # [B, L]
    q_index = lens - q_lens[:, None] + torch.arange(max_query_len, device=query.device)[None, :]  # [B, Q]
    visible = k_real[:, None, :] & (key_pos[None, None, :] <= q_index[:, :, None]) & q_real[:, :, None]  # [B, Q, L]
    q = query.index_select(0, token.reshape(-1)).view(num_reqs, max_query_len, heads, dim)
    out = _attend_cache(q, kv_cache, slots, visible, scale)
    return _scatter_back(out, query_start_loc, num_tokens, max_query_len).to(query.dtype)


def _attend_visible(query, keys, values, visible, scale):
    """query [B, Q, heads, D] over keys / values [B, L, kv_heads, D] where visible [B,
    Q, L]: [B, Q, heads, D] in query's dtype; a query that sees nothing gets zeros.
    ops.paged_attention.attention_over_keys, or the fp32 einsum form where
    ATTENTION_FORM is "fp32"."""
    grouped = _grouped(query, keys.shape[2])  # a ValueError where heads is not a multiple of kv_heads
    if ATTENTION_FORM != "fp32":
        return attention_over_keys(query, keys, values, visible, scale)
    # Keys no query sees are zeroed: an unwritten slot may hold NaN, and 0 * NaN would leak.
    real = visible.any(1)[:, :, None, None]
    keys, values = torch.where(real, keys, 0), torch.where(real, values, 0)
    return _attend_visible_fp32(grouped, keys, values, visible, scale)


def _attend_visible_fp32(q, keys, values, visible, scale):
    """_attend_visible's einsum form, every operand upcast to fp32."""
    scores = torch.einsum("bqhgd,blhd->bhgql", q.float(), keys.float()) * scale
    scores = scores.masked_fill(~visible[:, None, None], torch.finfo(torch.float32).min)
    # A row with nothing visible gets uniform weights from softmax; zero them.
    probs = torch.softmax(scores, dim=-1) * visible[:, None, None]
    out = torch.einsum("bhgql,blhd->bqhgd", probs, values.float()).clone(memory_format=torch.contiguous_format)
    return out.view(*out.shape[:2], -1, out.shape[-1]).to(q.dtype)


def _grouped(query, kv_heads):
    """query [B, Q, heads, D] as [B, Q, kv_heads, group, D]; a ValueError naming the
    heads where heads is not a multiple of kv_heads."""
    batch, num_queries, heads, dim = query.shape
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of the cache's kv_heads ({kv_heads})")
    return query.view(batch, num_queries, kv_heads, heads // kv_heads, dim)


def prefix_and_tree_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_seq_len: int,
    tree_keys: torch.Tensor,
    tree_values: torch.Tensor,
    tree_visible: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Draft-tree attention: query [B, Q, heads, D], Q tree nodes of each request fed
    at once. Every node sees its request's first seq_lens keys in the paged cache
    (the prefix, the tree's root last) and the tree keys / values [B, M, kv_heads, D]
    that tree_visible [B, Q, M] marks (its ancestors and itself): one softmax over
    both. The tree's keys stay out of the paged cache, so nothing a chain would read
    is written. Returns [B, Q, heads, D] in query.dtype."""
    check_kv_cache("kv_cache", kv_cache)
    dim = query.shape[-1]
    scale = dim**-0.5 if scale is None else scale
    key_pos, keys, values = _gathered_keys(kv_cache, block_table, max_seq_len)
    prefix = (key_pos[None, :] < seq_lens.to(torch.int64)[:, None])[:, None, :].expand(-1, query.shape[1], -1)
    visible = torch.cat([prefix, tree_visible], dim=2)
    keys, values = torch.cat([keys, tree_keys], dim=1), torch.cat([values, tree_values], dim=1)
    return _attend_visible(query, keys, values, visible, scale).to(query.dtype)


def paged_tree_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_seq_len: int,
    ancestors: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Target verify of a draft tree on the paged cache: query [B, N, heads, D], node
    i of request b at sequence index prefix_lens[b] + i, where its key already is
    (write_kv_cache first). Node i sees the request's first prefix_lens keys and the
    tree nodes j with ancestors[b, i, j] (itself and its ancestors). max_seq_len
    bounds prefix_lens + N. Returns [B, N, heads, D] in query.dtype."""
    check_kv_cache("kv_cache", kv_cache)
    num_nodes, dim = query.shape[1], query.shape[-1]
    scale = dim**-0.5 if scale is None else scale
    key_pos, slots = _key_slots(kv_cache, block_table, max_seq_len)
    offset = key_pos[None, :] - prefix_lens.to(torch.int64)[:, None]  # [B, L]: tree index of key l
    in_tree = (offset >= 0) & (offset < num_nodes)
    node = offset.clamp(0, num_nodes - 1)[:, None, :].expand(-1, num_nodes, -1)
    visible = (offset < 0)[:, None, :] | (in_tree[:, None, :] & ancestors.gather(2, node))
    return _attend_cache(query, kv_cache, slots, visible, scale).to(query.dtype)


def packed_tree_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    prefix_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_seq_len: int,
    ancestors: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """paged_tree_attention over trees packed by query_start_loc (a budgeted verify):
    query [T, heads, D], request b's n_b <= N nodes at rows query_start_loc[b] ..
    query_start_loc[b + 1] - 1, node i at sequence index prefix_lens[b] + i, seeing
    the request's first prefix_lens keys and the nodes j < n_b with ancestors[b, i,
    j] (ancestors [B, N, N]). The queries are laid out padded [B, N] as
    paged_attention lays out a chain's; rows past the last request get zeros.
    Returns [T, heads, D] in query.dtype."""
    num_tokens, heads, dim = query.shape
    num_reqs, num_nodes = ancestors.shape[:2]
    token, real, _ = _padded_queries(query, query_start_loc, num_nodes)
    q = query.index_select(0, token.reshape(-1)).view(num_reqs, num_nodes, heads, dim)
    # Nodes past a request's n_b see no tree key: their slots are not written this
    # pass (they may hold NaN, and a key any query sees reaches every query's sum).
    ancestors = ancestors & real[:, :, None] & real[:, None, :]
    out = paged_tree_attention(q, kv_cache, prefix_lens, block_table, max_seq_len, ancestors, scale)
    return _scatter_back(out, query_start_loc, num_tokens, num_nodes).to(query.dtype)
