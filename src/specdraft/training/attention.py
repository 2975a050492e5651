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


def flex_chain_attention(query, ctx_keys, ctx_values, diag_keys, diag_values, seq_id, ctx_offset, diag_visible, scale):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    num_blocks, num_rows, heads, dim = query.shape
    if diag_keys is None:
        keys, values, num_diag = ctx_keys, ctx_values, 0
    else:
        num_diag = diag_keys.shape[0]
        keys = torch.cat([ctx_keys, diag_keys.reshape(-1, *diag_keys.shape[2:])])
        values = torch.cat([ctx_values, diag_values.reshape(-1, *diag_values.shape[2:])])
    if diag_visible is None:
        diag_visible = torch.ones(num_blocks, max(num_diag, 1), num_rows, dtype=torch.bool, device=query.device)

    def mask_mod(batch, head, q_index, kv_index):
        block, t = q_index // num_rows, q_index % num_rows
        key_block, s = kv_index // num_rows, kv_index % num_rows
        context = (key_block == 0) & (seq_id[s] == seq_id[t]) & (s <= t - ctx_offset)
        diag_block = (key_block - 1).clamp(min=0)
        diagonal = (key_block > 0) & (s == t) & diag_visible[block, diag_block, t]
        return context | diagonal

    num_queries, num_keys = num_blocks * num_rows, (1 + num_diag) * num_rows
    block_mask = create_block_mask(mask_mod, None, None, num_queries, num_keys, device=query.device)
    out = flex_attention(
        query.reshape(num_queries, heads, dim).transpose(0, 1)[None],
        keys.transpose(0, 1)[None],
        values.transpose(0, 1)[None],
        block_mask=block_mask,
        scale=scale,
        enable_gqa=heads != keys.shape[1],
    )
    return out[0].transpose(0, 1).reshape(num_blocks, num_rows, heads, dim)
