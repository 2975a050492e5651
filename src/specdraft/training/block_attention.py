"""Attention of a block drafter's training forward: the blocks of many anchors of a
packed batch at once (specdraft.training.block).

A block is drafted for an *anchor*, a row p of the packed batch: its queries are
the block_size rows [token p, mask, ...] at positions p .. p + block_size - 1 of
p's sequence. Query (a, s) of anchor a sees

- the context key of row j iff j lies in the anchor's sequence and j < anchors[a]
  (the target's features of the tokens before the anchor: what a serving proposer
  holds in its KV cache when the anchor is its newest token);
- every key of its own block (bidirectional), no key of another block;
- nothing at all when anchor_valid[a] is False (a padding anchor: its output is
  zeros, never NaN).

That is DeepSpec's `create_dspark_attention_mask` (context keys < anchor position,
draft keys of the same block, invalid blocks masked) over a packed batch instead of
padded rows: a padded sample is a packed sequence, its anchor position the anchor's
row minus the sequence's first row.

Two implementations of the same rule:

- "dense": scores [A, heads, block, T + block] in float32, masked, softmax,
  weighted sum. Differentiable anywhere; the CPU path (FlexAttention has no
  backward on the CPU in torch 2.13, and its CPU kernel compiles only with static
  shapes: under dynamic=True torch 2.13's C++ flex template fails to build);
- "flex": torch.nn.attention.flex_attention over the context keys and every
  block's keys laid end to end ([T + A * block]), the rule as a mask_mod and a
  block mask built from block-level bounds (`anchor_block_mask`): compiled on CUDA,
  a fused kernel that skips the key blocks of other sequences and other anchors.
  "auto" picks it for CUDA tensors under torch.compile
  (specdraft.training.attention.resolve_backend), dense elsewhere.
"""

from __future__ import annotations

import torch

from specdraft.ops.materialize import materialize
from specdraft.training.attention import BLOCK, FLEX_KERNEL_OPTIONS, ordered_blocks, pad_rows, resolve_backend

# Larger than any row, sequence or block index: the neutral element of the
# block-level min / max over rows that take no part.
FAR = 2**40


def block_attention(
    query: torch.Tensor,
    ctx_keys: torch.Tensor,
    ctx_values: torch.Tensor,
    block_keys: torch.Tensor,
    block_values: torch.Tensor,
    *,
    seq_id: torch.Tensor,
    anchors: torch.Tensor,
    anchor_valid: torch.Tensor,
    backend: str,
    scale: float | None = None,
) -> torch.Tensor:
    """query [A, S, heads, D] (anchor a's block rows); ctx_keys / ctx_values
    [T, kv_heads, D] (every packed row's context key); block_keys / block_values
    [A, S, kv_heads, D]; seq_id [T] int64 (each row's sequence); anchors [A] int64
    rows; anchor_valid [A] bool. Returns [A, S, heads, D] in query.dtype (module
    docstring for the rule). GQA when heads is a multiple of kv_heads."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    args = (query, ctx_keys, ctx_values, block_keys, block_values, seq_id, anchors.long(), anchor_valid, scale)
    if resolve_backend(backend, query.device, query.shape[-1]) == "flex":
        return flex_block_attention(*args)
    return dense_block_attention(*args)


def context_visible(seq_id: torch.Tensor, anchors: torch.Tensor, anchor_valid: torch.Tensor) -> torch.Tensor:
    """[A, T] bool: anchor a's block sees context row j."""
    rows = torch.arange(seq_id.shape[0], device=seq_id.device)
    same_sequence = seq_id[None, :] == seq_id.index_select(0, anchors)[:, None]
    return same_sequence & (rows[None, :] < anchors[:, None]) & anchor_valid[:, None]


def dense_block_attention(query, ctx_keys, ctx_values, block_keys, block_values, seq_id, anchors, anchor_valid, scale):
    num_anchors, size, heads, dim = query.shape
    num_rows, kv_heads = ctx_keys.shape[:2]
    group = heads // kv_heads
    q = query.float().view(num_anchors, size, kv_heads, group, dim)
    ctx_scores = torch.einsum("askgd,tkd->akgst", q, ctx_keys.float()) * scale  # [A, kvh, g, S, T]
    own_scores = torch.einsum("askgd,ackd->akgsc", q, block_keys.float()) * scale  # [A, kvh, g, S, S]
    own_visible = anchor_valid[:, None].expand(num_anchors, size)
    mask = torch.cat([context_visible(seq_id, anchors, anchor_valid), own_visible], dim=-1)[:, None, None, None]
    # finfo.min and the product with the mask afterwards, not -inf: a block that sees
    # nothing (a padding anchor) gets zeros, never NaN, which would poison the loss
    # and the gradients of every other block.
    scores = torch.cat([ctx_scores, own_scores], dim=-1).masked_fill(~mask, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1) * mask
    out = torch.einsum("akgst,tkd->askgd", probs[..., :num_rows], ctx_values.float())
    out = out + torch.einsum("akgsc,ackd->askgd", probs[..., num_rows:], block_values.float())
    return out.reshape(num_anchors, size, heads, dim).to(query.dtype)


class FlexLayout:
    """The flex path's index tensors: queries are the A * S block rows padded to a
    multiple of BLOCK; keys are the T context rows padded to a multiple of BLOCK,
    then the block rows padded likewise (so the context and the blocks never share
    a sparse block). Per query: its anchor's row, sequence and block index and
    whether it is valid (padding rows are not); per key: its row, sequence (-1 for
    padding, -2 for block keys) and block index (-3 for context keys, -2 for
    padding)."""

    def __init__(self, seq_id, anchors, anchor_valid, size: int) -> None:
        num_anchors, num_rows = anchors.shape[0], seq_id.shape[0]
        device = seq_id.device
        self.num_queries = num_anchors * size
        self.query_pad = -(-self.num_queries // BLOCK) * BLOCK - self.num_queries
        self.ctx_pad = -(-num_rows // BLOCK) * BLOCK - num_rows
        self.num_rows = num_rows

        def per_query(values, pad_value):  # [A] -> [A * S + query_pad]
            flat = values[:, None].expand(num_anchors, size).reshape(-1)
            return torch.nn.functional.pad(flat, (0, self.query_pad), value=pad_value)

        block_index = torch.arange(num_anchors, device=device)
        self.q_anchor = per_query(anchors, 0)
        self.q_seq = per_query(seq_id.long().index_select(0, anchors), -1)
        self.q_valid = per_query(anchor_valid, False)
        self.q_block = per_query(block_index, -1)
        ctx_seq = torch.nn.functional.pad(seq_id.long(), (0, self.ctx_pad), value=-1)
        num_queries_padded = self.num_queries + self.query_pad
        self.ctx_seq = ctx_seq
        self.kv_row = torch.cat([torch.arange(ctx_seq.shape[0], device=device),
                                 torch.zeros(num_queries_padded, dtype=torch.int64, device=device)])  # fmt: skip
        self.kv_seq = torch.cat([ctx_seq, ctx_seq.new_full((num_queries_padded,), -2)])
        self.kv_block = torch.cat([ctx_seq.new_full((ctx_seq.shape[0],), -3), per_query(block_index, -2)])


def anchor_mask_mod(layout: FlexLayout):
    """The rule (module docstring) as a FlexAttention mask_mod over `layout`'s rows.
    Every capture is a stored buffer (specdraft.ops.materialize: Inductor's flex
    lowering inlines an unstored expression into its template and fails)."""
    q_anchor, q_seq, q_valid, q_block = map(
        materialize, (layout.q_anchor, layout.q_seq, layout.q_valid, layout.q_block)
    )
    kv_row, kv_seq, kv_block = map(materialize, (layout.kv_row, layout.kv_seq, layout.kv_block))

    def mask_mod(batch, head, q_index, kv_index):
        context = (kv_seq[kv_index] == q_seq[q_index]) & (kv_row[kv_index] < q_anchor[q_index])
        own_block = kv_block[kv_index] == q_block[q_index]
        return q_valid[q_index] & (context | own_block)

    return mask_mod


def flex_block_attention(query, ctx_keys, ctx_values, block_keys, block_values, seq_id, anchors, anchor_valid, scale):
    from torch.nn.attention.flex_attention import flex_attention

    num_anchors, size, heads, dim = query.shape
    layout = FlexLayout(seq_id, anchors, anchor_valid, size)
    keys = torch.cat(
        [pad_rows(ctx_keys, layout.ctx_pad, dim=0), pad_rows(block_keys.flatten(0, 1), layout.query_pad, dim=0)]
    )
    values = torch.cat([pad_rows(ctx_values, layout.ctx_pad, dim=0),
                        pad_rows(block_values.flatten(0, 1), layout.query_pad, dim=0)])  # fmt: skip
    block_mask = anchor_block_mask(layout, anchor_mask_mod(layout))
    # [1, heads, rows, D] made contiguous: Inductor's CPU flex template reads the
    # query's layout as a 4-D buffer's and fails on a view of a 3-D one.
    out = flex_attention(
        pad_rows(query.flatten(0, 1), layout.query_pad, dim=0).transpose(0, 1)[None].contiguous(),
        keys.transpose(0, 1)[None].contiguous(),
        values.transpose(0, 1)[None].contiguous(),
        block_mask=block_mask,
        scale=scale,
        enable_gqa=heads != keys.shape[1],
        kernel_options=FLEX_KERNEL_OPTIONS,
    )
    out = out[0].transpose(0, 1)[: layout.num_queries]
    return out.reshape(num_anchors, size, heads, dim)


def row_block_bounds(values: torch.Tensor, taking_part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) per BLOCK rows of values over the rows taking part (FAR, -FAR for
    a block where none does)."""
    lo = torch.where(taking_part, values, FAR).view(-1, BLOCK).amin(-1)
    hi = torch.where(taking_part, values, -FAR).view(-1, BLOCK).amax(-1)
    return lo, hi


def anchor_block_mask(layout: FlexLayout, mask_mod):
    """The BlockMask of the rule from block-level bounds: O(query blocks x key
    blocks) work, where create_block_mask evaluates mask_mod at every (query, key)
    pair. A block pair is kept when some pair in it may be visible (a superset is
    correct: mask_mod decides inside kept blocks):

    - a context key block, for a query block with a valid query, when its first row
      is before the block's last anchor and the sequence ranges of the two overlap;
      it is full (mask_mod skipped) when every query is valid, every query's anchor
      and every key lie in one sequence, and the key block ends before the block's
      first anchor;
    - a block key block when the block indices of its rows and of the valid
      queries overlap (never full)."""
    from torch.nn.attention.flex_attention import BlockMask

    valid = layout.q_valid
    num_query_blocks = valid.shape[0] // BLOCK
    any_valid = valid.view(-1, BLOCK).any(-1)
    all_valid = valid.view(-1, BLOCK).all(-1)
    anchor_lo, anchor_hi = row_block_bounds(layout.q_anchor, valid)
    qseq_lo, qseq_hi = row_block_bounds(layout.q_seq, valid)
    qblock_lo, qblock_hi = row_block_bounds(layout.q_block, valid)

    ctx_real = torch.arange(layout.ctx_seq.shape[0], device=valid.device) < layout.num_rows
    kseq_lo, kseq_hi = row_block_bounds(layout.ctx_seq, ctx_real)
    first = torch.arange(kseq_lo.shape[0], device=valid.device) * BLOCK
    last = first + BLOCK - 1
    overlap = (kseq_lo[None, :] <= qseq_hi[:, None]) & (qseq_lo[:, None] <= kseq_hi[None, :])
    ctx_any = any_valid[:, None] & (first[None, :] < anchor_hi[:, None]) & overlap
    one_sequence = (
        (qseq_lo == qseq_hi)[:, None] & (kseq_lo == kseq_hi)[None, :] & (kseq_lo[None, :] == qseq_lo[:, None])
    )
    whole_keys = (last < layout.num_rows)[None, :]
    ctx_full = all_valid[:, None] & one_sequence & whole_keys & (last[None, :] < anchor_lo[:, None])
    ctx_any = ctx_any & ~ctx_full

    kblock = layout.kv_block[layout.ctx_seq.shape[0] :]
    kblock_lo, kblock_hi = row_block_bounds(kblock, kblock >= 0)
    own_any = (
        any_valid[:, None] & (kblock_lo[None, :] <= qblock_hi[:, None]) & (qblock_lo[:, None] <= kblock_hi[None, :])
    )

    partial = torch.cat([ctx_any, own_any], dim=-1)  # [query blocks, context blocks + block-key blocks]
    full = torch.cat([ctx_full, torch.zeros_like(own_any)], dim=-1)
    kv_num, kv_indices = ordered_blocks(partial)
    full_kv_num, full_kv_indices = ordered_blocks(full)
    q_num, q_indices = ordered_blocks(partial.transpose(0, 1))
    full_q_num, full_q_indices = ordered_blocks(full.transpose(0, 1))
    lengths = (num_query_blocks * BLOCK, layout.kv_block.shape[0])
    return BlockMask(
        lengths, kv_num, kv_indices, full_kv_num, full_kv_indices, q_num, q_indices, full_q_num, full_q_indices,
        (BLOCK, BLOCK), mask_mod,
    )  # fmt: skip
