"""The attention a layer is handed for a pass over the paged KV cache (see
specdraft.models.layers: a layer's forward takes `attend(q, k, v)`):

- `paged`: a batch of windows (prefill, a draft step, a chain verify): this pass's
  keys and values go to the cache at slot_mapping, then every query attends to its
  request's keys up to its own (models.attention.paged_attention);
- `paged_tree`: the target's verify over draft trees (TreeBatchMetadata): the nodes'
  keys go to the cache likewise, each node attends to the prefix and its ancestors
  (models.attention.paged_tree_attention);
- `cache_attention` picks one of the two by the kind of pass the metadata describes,
  once per layer call, outside the layer.

The attention runs in a nested compile region (models.regions.compile_region),
shared by every layer and draft step that calls it with the same signature. The
cache write before it stays outside (a mutation inside a region that a graph with
dynamic shapes reuses trips Dynamo, torch 2.13: tests/proposers/test_multi_compile.py);
where every layer of a pass shares its metadata, the writes are planned once for
all of them (planned_writes), so a layer adds only its scatter.
"""

from __future__ import annotations

import torch

from specdraft.layout import BatchMetadata, TreeBatchMetadata
from specdraft.models.attention import packed_tree_attention, paged_attention, paged_tree_attention
from specdraft.models.kv_cache import SlotWrites, plan_slot_writes, write_kv_cache
from specdraft.models.layers import Attend
from specdraft.models.regions import compile_region


def metadata_for_layer(attn_metadata, layer: int):
    """Layer `layer`'s metadata: one BatchMetadata for every layer, or a list / tuple
    of them indexed by layer (several KV-cache groups)."""
    if isinstance(attn_metadata, list | tuple):
        return attn_metadata[layer]
    return attn_metadata


@compile_region
def paged_attention_region(q, kv_cache, query_start_loc, seq_lens, block_table, max_query_len, max_seq_len):
    # The metadata goes into the region as tensors and the Python ints that fix its shapes.
    return paged_attention(q, kv_cache, query_start_loc, seq_lens, block_table, max_query_len, max_seq_len)


@compile_region
def tree_attention_region(q, kv_cache, prefix_lens, block_table, max_seq_len, ancestors):
    batch, num_nodes = ancestors.shape[:2]
    out = paged_tree_attention(q.view(batch, num_nodes, *q.shape[1:]), kv_cache, prefix_lens, block_table,
                               max_seq_len, ancestors)  # fmt: skip
    return out.reshape(batch * num_nodes, *out.shape[2:])


@compile_region
def packed_tree_attention_region(q, kv_cache, query_start_loc, prefix_lens, block_table, max_seq_len, ancestors):
    return packed_tree_attention(q, kv_cache, query_start_loc, prefix_lens, block_table, max_seq_len, ancestors)


def paged(kv_cache: torch.Tensor, metadata: BatchMetadata, writes: SlotWrites | None = None) -> Attend:
    """Attention over kv_cache for the windows `metadata` lays out: writes k / v at
    its slot_mapping, then paged attention over the cache."""

    def attend(q, k, v):
        m = metadata
        write_kv_cache(kv_cache, k, v, m.slot_mapping, writes)
        return paged_attention_region(q, kv_cache, m.query_start_loc, m.seq_lens, m.block_table, m.max_query_len,
                                      m.max_seq_len)  # fmt: skip

    return attend


def paged_tree(kv_cache: torch.Tensor, metadata: TreeBatchMetadata, writes: SlotWrites | None = None) -> Attend:
    """Attention of the target's verify over draft trees: q [B * N, heads, D], N
    nodes per request (or, packed, each request's kept nodes: metadata.packed);
    writes k / v at slot_mapping, then tree attention."""

    def attend(q, k, v):
        m = metadata
        write_kv_cache(kv_cache, k, v, m.slot_mapping, writes)
        if m.packed:  # a budgeted pass: each request's kept nodes, packed
            return packed_tree_attention_region(q, kv_cache, m.query_start_loc, m.prefix_lens, m.block_table,
                                                m.max_seq_len, m.ancestors)  # fmt: skip
        return tree_attention_region(q, kv_cache, m.prefix_lens, m.block_table, m.max_seq_len, m.ancestors)

    return attend


def planned_writes(kv_caches, attn_metadata) -> SlotWrites | None:
    """The cache writes of a pass whose every layer shares one metadata and one cache
    shape, planned once (plan_slot_writes): None where layers differ (a list of
    metadata, several KV-cache groups) or there are no rows, and each layer plans its
    own."""
    if isinstance(attn_metadata, list | tuple) or attn_metadata.slot_mapping.shape[0] == 0:
        return None
    shape = kv_caches[0].shape
    if any(cache.shape != shape for cache in kv_caches):
        return None
    return plan_slot_writes(attn_metadata.slot_mapping, shape[1], shape[2])


def cache_attention(kv_cache: torch.Tensor, metadata: BatchMetadata, writes: SlotWrites | None = None) -> Attend:
    """The attention of one layer's pass over kv_cache, by the kind of pass:
    `paged_tree` for a verify over draft trees (TreeBatchMetadata), `paged` else;
    `writes` from planned_writes where the caller planned the pass's cache writes."""
    if isinstance(metadata, TreeBatchMetadata):
        return paged_tree(kv_cache, metadata, writes)
    return paged(kv_cache, metadata, writes)
