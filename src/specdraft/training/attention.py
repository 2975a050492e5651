"""Attention of the training unroll: every draft chain of a packed batch at once.

The unroll computes the K-step draft chains that start at all T positions of a packed
batch together. A query block holds one draft token per chain start t ([Bq, T]
queries). It sees two kinds of keys:

- context keys [T] (a pass over every position of the batch): key s is visible to
  the query of chain t iff s is in t's sequence and s <= t - ctx_offset;
- diagonal keys [Bd, T]: block c holds one key per chain; the query of chain t sees
  only its own chain's key (c, t), and only where diag_visible[b, c, t] says so.

That is the shape of both draft loops (specdraft.training.unroll): EAGLE's step k
sees the first pass's keys up to t plus its chain's steps 1 .. k; a multi-layer
pass sees its shared rows up to t - k plus its chain's own rows. Context costs
O(T^2) scores per block and the diagonal O(T * Bd): the K steps never multiply the
quadratic part by the chain length.

Two implementations of the same rule:

- "dense": scores [Bq, heads, T, T + Bd] in float32 (as specdraft.models'
  paged_attention computes), masked, softmax, weighted sum. Differentiable anywhere;
  the CPU path (FlexAttention has no backward on CPU in torch 2.13) and fine for
  small T;
- "flex": torch.nn.attention.flex_attention over the keys laid end to end
  ([T + Bd * T]) with the rule as a mask_mod. Compiled, it is a fused kernel whose
  block mask skips the blocks that fall between packed sequences: memory O(T), no
  [T, T] scores. Eager, torch materialises the full scores, so "auto" picks it only
  for CUDA tensors under torch.compile. On the CPU, "flex" runs eager and without
  autograd only (torch 2.13's Inductor does not lower this mask on the CPU).
"""

from __future__ import annotations

import torch

from specdraft.ops.materialize import materialize

BACKENDS = ("auto", "dense", "flex")


def resolve_backend(backend: str, device: torch.device, head_dim: int) -> str:
    """ "auto": flex for CUDA tensors under torch.compile (the fused kernel), dense
    otherwise (eager flex materialises every score; CPU flex has no backward) and
    for head_dim < 16, below what the fused kernel takes."""
    if backend != "auto":
        return backend
    fused = device.type == "cuda" and torch.compiler.is_compiling() and head_dim >= 16
    return "flex" if fused else "dense"


def chain_attention(
    query: torch.Tensor,
    ctx_keys: torch.Tensor,
    ctx_values: torch.Tensor,
    diag_keys: torch.Tensor | None,
    diag_values: torch.Tensor | None,
    *,
    seq_id: torch.Tensor,
    ctx_offset: int,
    diag_visible: torch.Tensor | None,
    backend: str,
    scale: float | None = None,
) -> torch.Tensor:
    """query [Bq, T, heads, D]; ctx_keys / ctx_values [T, kv_heads, D];
    diag_keys / diag_values [Bd, T, kv_heads, D] or None; seq_id [T] int64 (the
    sequence of each row); diag_visible [Bq, Bd, T] bool or None (every diagonal key
    visible). Returns [Bq, T, heads, D] in query.dtype. GQA when heads is a multiple
    of kv_heads. A query that sees no key gets zeros."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    if resolve_backend(backend, query.device, query.shape[-1]) == "flex":
        return flex_chain_attention(
            query, ctx_keys, ctx_values, diag_keys, diag_values, seq_id, ctx_offset, diag_visible, scale
        )
    return dense_chain_attention(
        query, ctx_keys, ctx_values, diag_keys, diag_values, seq_id, ctx_offset, diag_visible, scale
    )


def context_visible(seq_id: torch.Tensor, ctx_offset: int) -> torch.Tensor:
    """[T, T] bool: query row t sees context key s."""
    rows = torch.arange(seq_id.shape[0], device=seq_id.device)
    return (seq_id[:, None] == seq_id[None, :]) & (rows[None, :] <= rows[:, None] - ctx_offset)


def dense_chain_attention(query, ctx_keys, ctx_values, diag_keys, diag_values, seq_id, ctx_offset, diag_visible, scale):
    num_blocks, num_rows, heads, dim = query.shape
    kv_heads = ctx_keys.shape[1]
    group = heads // kv_heads
    q = query.float().view(num_blocks, num_rows, kv_heads, group, dim)
    ctx_scores = torch.einsum("btkgd,skd->bkgts", q, ctx_keys.float()) * scale  # [Bq, kvh, g, T, T]
    visible = context_visible(seq_id, ctx_offset)[None, None, None].expand(num_blocks, 1, 1, -1, -1)
    scores, masks = [ctx_scores], [visible]
    if diag_keys is not None:
        diag_scores = torch.einsum("btkgd,ctkd->bkgtc", q, diag_keys.float()) * scale  # [Bq, kvh, g, T, Bd]
        scores.append(diag_scores)
        if diag_visible is None:
            diag_mask = torch.ones_like(diag_scores[:, :1, :1], dtype=torch.bool)
        else:
            diag_mask = diag_visible.permute(0, 2, 1)[:, None, None]  # [Bq, 1, 1, T, Bd]
        masks.append(diag_mask)
    scores = torch.cat(scores, dim=-1)
    mask = torch.cat([m.expand(num_blocks, 1, 1, num_rows, m.shape[-1]) for m in masks], dim=-1)
    # finfo.min rather than -inf and the product with the mask afterwards: a query that
    # sees nothing (a chain row before its sequence starts) gets zeros, never NaN,
    # which would poison the gradients of every other row.
    scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1) * mask
    out = torch.einsum("bkgts,skd->btkgd", probs[..., :num_rows], ctx_values.float())
    if diag_values is not None:
        out = out + torch.einsum("bkgtc,ctkd->btkgd", probs[..., num_rows:], diag_values.float())
    return out.reshape(num_blocks, num_rows, heads, dim).to(query.dtype)


# Ask Inductor for its main Triton flex kernel. For fewer than 128 queries it would
# otherwise pick flex_decoding, which sets BLOCK_M = next_pow2(queries x GQA group):
# past the 128-row sparse block (102 queries, group 2: 256) every config is rejected
# and the compile fails with NoValidChoicesError (fixed upstream after torch 2.13, in
# pytorch#185349). The CPU template ignores the option.
FLEX_KERNEL_OPTIONS = {"BACKEND": "TRITON"}
BLOCK = 128  # FlexAttention's sparse block, queries and keys


def flex_chain_attention(query, ctx_keys, ctx_values, diag_keys, diag_values, seq_id, ctx_offset, diag_visible, scale):
    """The flex implementation. Rows are padded to a multiple of BLOCK, so that every
    sparse block lies in one query block and one key block, and the block mask is
    built from that structure (`chain_block_mask`) instead of by evaluating mask_mod
    at every (query, key) pair."""
    from torch.nn.attention.flex_attention import flex_attention

    num_blocks, num_rows, heads, dim = query.shape
    padded_rows = -(-num_rows // BLOCK) * BLOCK
    pad = padded_rows - num_rows
    num_diag = 0 if diag_keys is None else diag_keys.shape[0]
    keys = pad_rows(ctx_keys, pad, dim=0)
    values = pad_rows(ctx_values, pad, dim=0)
    if diag_keys is not None:
        keys = torch.cat([keys, pad_rows(diag_keys, pad, dim=1).flatten(0, 1)])
        values = torch.cat([values, pad_rows(diag_values, pad, dim=1).flatten(0, 1)])
    # mask_mod reads each index's row, block and sequence from tensors rather than
    # dividing by the padded length: a captured symbolic size that is an expression
    # (128 * ceil(T / 128)) fails to lower under dynamic shapes. Every captured tensor
    # is a stored buffer (see specdraft.ops.materialize); an all-visible diagonal
    # captures nothing. Padding rows are in sequence -1, diagonal keys in -2.
    seq_id = torch.nn.functional.pad(seq_id.long(), (0, pad), value=-1)
    rows = torch.arange(padded_rows, device=query.device)
    q_row = materialize(rows.repeat(num_blocks))
    q_seq = materialize(seq_id.repeat(num_blocks))
    kv_row = materialize(rows.repeat(1 + num_diag))
    kv_block = materialize(torch.arange(1 + num_diag, device=query.device).repeat_interleave(padded_rows))
    kv_seq = materialize(torch.cat([seq_id, seq_id.new_full((num_diag * padded_rows,), -2)]))
    flat_visible = q_offset = kv_offset = None  # mask_mod's cells, bound on every path for Dynamo
    if diag_visible is not None:
        # Flat, with offsets per query and per key: diag_visible[b, c - 1, t] is
        # flat[q_offset[q] + kv_offset[kv]]. No index arithmetic on a symbolic stride
        # inside the mask, which CPU Inductor's flex template miscompiles.
        diag_visible = torch.nn.functional.pad(diag_visible, (0, pad), value=False)
        flat_visible = diag_visible.flatten()
        block_of_q = torch.arange(num_blocks, device=query.device).repeat_interleave(padded_rows)
        q_offset = materialize(block_of_q * (num_diag * padded_rows) + q_row)
        kv_offset = materialize((kv_block - 1).clamp(min=0) * padded_rows)
        flat_visible = materialize(flat_visible)

    def mask_mod(batch, head, q_index, kv_index):
        t, s, key_block = q_row[q_index], kv_row[kv_index], kv_block[kv_index]
        context = (q_seq[q_index] == kv_seq[kv_index]) & (s <= t - ctx_offset)
        diagonal = (key_block > 0) & (s == t)
        if flat_visible is not None:
            diagonal = diagonal & flat_visible[q_offset[q_index] + kv_offset[kv_index]]
        return context | diagonal

    block_mask = chain_block_mask(mask_mod, seq_id, num_rows, num_blocks, num_diag, ctx_offset, diag_visible)
    out = flex_attention(
        pad_rows(query, pad, dim=1).flatten(0, 1).transpose(0, 1)[None],
        keys.transpose(0, 1)[None],
        values.transpose(0, 1)[None],
        block_mask=block_mask,
        scale=scale,
        enable_gqa=heads != keys.shape[1],
        kernel_options=FLEX_KERNEL_OPTIONS,
    )
    out = out[0].transpose(0, 1).unflatten(0, (num_blocks, padded_rows))
    return out[:, :num_rows]


def pad_rows(x: torch.Tensor, pad: int, *, dim: int) -> torch.Tensor:
    """x with `pad` zero rows appended along dim."""
    widths = [0, 0] * (x.dim() - 1 - dim) + [0, pad]
    return torch.nn.functional.pad(x, widths)


def chain_block_mask(mask_mod, seq_id, num_rows, num_blocks, num_diag, ctx_offset, diag_visible):
    """The BlockMask of the chain rule over rows padded to a multiple of BLOCK
    (seq_id and diag_visible padded, padding rows in sequence -1), from block-level
    bounds: O((T / BLOCK)^2) work, where create_block_mask evaluates mask_mod at every
    (query, key) pair ([Bq * T, (1 + Bd) * T] of them per call).

    A block pair is kept when some pair in it may be visible (a superset is correct:
    mask_mod decides inside kept blocks): context blocks whose sequence-id ranges
    overlap and whose first key is at or before the last query minus ctx_offset;
    diagonal blocks on the diagonal where some query of the block sees its key. It is
    full (mask_mod skipped) only when every pair is visible: both blocks real rows of
    one sequence, the last key at or before the first query minus ctx_offset.

    Also why it is built here: create_block_mask derives the backward's per-key-block
    lists by scattering into a dense block matrix, and under dynamic shapes on CUDA
    that scatter's view of [Qb, Qb] blocks failed to lower in torch 2.11 Inductor
    (CantSplit). Here both lists come from one dense [Qb, KVb] matrix and its
    transpose."""
    from torch.nn.attention.flex_attention import BlockMask

    row_blocks = seq_id.view(-1, BLOCK)  # [nb, BLOCK]
    num_row_blocks = row_blocks.shape[0]
    lo, hi = row_blocks.amin(-1), row_blocks.amax(-1)
    first = torch.arange(num_row_blocks, device=seq_id.device) * BLOCK
    last = first + BLOCK - 1
    t_lo, t_hi, s_lo, s_hi = lo[:, None], hi[:, None], lo[None, :], hi[None, :]
    causal_any = first[None, :] <= last[:, None] - ctx_offset  # [t block, s block]
    ctx_any = (t_lo <= s_hi) & (s_lo <= t_hi) & causal_any
    whole = (lo == hi) & (lo >= 0) & (last < num_rows)  # real rows of one sequence
    ctx_full = whole[:, None] & whole[None, :] & (t_lo == s_lo) & (last[None, :] <= first[:, None] - ctx_offset)
    ctx_any = ctx_any & ~ctx_full
    parts_any = [ctx_any.expand(num_blocks, -1, -1)]
    parts_full = [ctx_full.expand(num_blocks, -1, -1)]
    if num_diag:
        on_diagonal = torch.eye(num_row_blocks, dtype=torch.bool, device=seq_id.device)
        if diag_visible is None:
            seen = (first < num_rows)[None, None, :].expand(num_blocks, num_diag, -1)
        else:
            seen = diag_visible.view(num_blocks, num_diag, num_row_blocks, BLOCK).any(-1)  # [Bq, Bd, nb]
        diag_any = seen[..., :, None] & on_diagonal  # [Bq, Bd, t block, s block]
        parts_any += list(diag_any.unbind(1))
        parts_full += [torch.zeros_like(ctx_full).expand(num_blocks, -1, -1)] * num_diag
    # [Bq, t block, (1 + Bd) * s block] -> [Bq * nb query blocks, (1 + Bd) * nb key blocks]
    partial = torch.cat(parts_any, dim=-1).flatten(0, 1)
    full = torch.cat(parts_full, dim=-1).flatten(0, 1)
    kv_num, kv_indices = ordered_blocks(partial)
    full_kv_num, full_kv_indices = ordered_blocks(full)
    q_num, q_indices = ordered_blocks(partial.transpose(0, 1))
    full_q_num, full_q_indices = ordered_blocks(full.transpose(0, 1))
    lengths = (num_blocks * num_row_blocks * BLOCK, (1 + num_diag) * num_row_blocks * BLOCK)
    return BlockMask(
        lengths, kv_num, kv_indices, full_kv_num, full_kv_indices, q_num, q_indices, full_q_num, full_q_indices,
        (BLOCK, BLOCK), mask_mod,
    )  # fmt: skip


def ordered_blocks(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, cols] bool -> (count per row [1, 1, rows], the kept columns first, in
    order [1, 1, rows, cols]), both int32: the BlockMask layout."""
    dense = dense.to(torch.int32)
    count = dense.sum(-1).to(torch.int32)
    order = torch.argsort(dense, dim=-1, descending=True, stable=True).to(torch.int32)
    return count[None, None].contiguous(), order[None, None].contiguous()
