"""`tree_select`: the tree kept from an EAGLE-2 candidate pool: the root plus the
N - 1 best pool nodes by cumulative draft log-probability (ties: the lower pool
index, which is never deeper), laid out by pool index (so by depth), with each
node's parent as a tree index. One program per request (a pool of at most a few
hundred nodes fits its registers); the reference is the same computation in torch."""

from typing import NamedTuple

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, check_int_range, check_tensor_arg

from ..backend import NAMESPACE, power_of_two_tile, tl, triton, use_triton
from .ranking import rows_of_rank, stable_rank

SCAN_BLOCK = 32  # pool nodes compared per step of tree_select's ranking loops


class SelectedTree(NamedTuple):
    tokens: torch.Tensor  # [B, N] int64: the root token, then the kept nodes' tokens
    parents: torch.Tensor  # [B, N] int64: -1 for the root, else a tree index < the node's own
    depths: torch.Tensor  # [B, N] int64: 0 for the root
    scores: torch.Tensor  # [B, N] fp32: cumulative draft log-probabilities, 0 for the root


@triton.jit
def tree_select_kernel(
    tokens_ptr, scores_ptr, parents_ptr, depths_ptr, roots_ptr,
    out_tokens_ptr, out_parents_ptr, out_depths_ptr, out_scores_ptr, index_ptr,  # index: [B, P] scratch
    pool, keep, POOL_PAD: tl.constexpr, SCAN: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, POOL_PAD)
    in_pool = i < pool
    row = b * pool
    s_i = tl.load(scores_ptr + row + i, mask=in_pool, other=float("-inf")).to(tl.float32)
    s_i = tl.where(s_i != s_i, float("-inf"), s_i)  # NaN ranks as -inf
    # Rank by counting: pool node j is ahead of i with a higher score, or an equal one
    # and a lower index.
    rank = tl.zeros([POOL_PAD], tl.int32)
    for j0 in range(0, pool, SCAN):
        j = j0 + tl.arange(0, SCAN)
        s_j = tl.load(scores_ptr + row + j, mask=j < pool, other=float("-inf")).to(tl.float32)
        s_j = tl.where(s_j != s_j, float("-inf"), s_j)
        ahead = (s_j[None, :] > s_i[:, None]) | ((s_j[None, :] == s_i[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((ahead & (j < pool)[None, :]).to(tl.int32), axis=1)
    chosen = in_pool & (rank < keep)
    tl.store(index_ptr + row + i, chosen.to(tl.int32), mask=in_pool)
    tl.debug_barrier()
    # A kept node's tree index: 1 + the kept nodes before it in pool order.
    before = tl.zeros([POOL_PAD], tl.int32)
    for j0 in range(0, pool, SCAN):
        j = j0 + tl.arange(0, SCAN)
        kept_j = tl.load(index_ptr + row + j, mask=j < pool, other=0)
        before += tl.sum(((kept_j[None, :] != 0) & (j[None, :] < i[:, None])).to(tl.int32), axis=1)
    tree_index = tl.where(chosen, before + 1, -1)
    tl.debug_barrier()  # every program thread has read the chosen flags
    tl.store(index_ptr + row + i, tree_index, mask=in_pool)
    tl.debug_barrier()
    pool_parent = tl.load(parents_ptr + row + i, mask=in_pool, other=-1).to(tl.int64)
    has_parent = chosen & (pool_parent >= 0) & (pool_parent < pool)
    parent = tl.load(index_ptr + row + pool_parent, mask=has_parent, other=0).to(tl.int64)
    n = keep + 1
    dest = b * n + tree_index
    tl.store(out_tokens_ptr + dest, tl.load(tokens_ptr + row + i, mask=chosen, other=0).to(tl.int64), mask=chosen)
    tl.store(out_parents_ptr + dest, parent, mask=chosen)
    tl.store(out_depths_ptr + dest, tl.load(depths_ptr + row + i, mask=chosen, other=0).to(tl.int64), mask=chosen)
    tl.store(out_scores_ptr + dest, s_i, mask=chosen)
    root = tl.arange(0, 1)
    tl.store(out_tokens_ptr + b * n + root, tl.load(roots_ptr + b + root).to(tl.int64))
    tl.store(out_parents_ptr + b * n + root, tl.full([1], -1, tl.int64))
    tl.store(out_depths_ptr + b * n + root, tl.zeros([1], tl.int64))
    tl.store(out_scores_ptr + b * n + root, tl.zeros([1], tl.float32))


def tree_select_reference(tokens, scores, parents, depths, roots, num_verify_tokens: int):
    batch, size = tokens.shape
    keep = num_verify_tokens - 1
    device = tokens.device
    # The pool is laid out step by step, so a lower pool index is never deeper: the
    # rank by (score, then pool index) is (score, then shallower, then pool index).
    chosen = stable_rank(scores) < keep
    kept = rows_of_rank(torch.where(chosen, chosen.long().cumsum(1) - 1, size), keep)  # chosen, in pool order
    tree_index = torch.full((batch, size), -1, dtype=torch.long, device=device)
    tree_index.scatter_(1, kept, torch.arange(1, keep + 1, device=device).expand(batch, keep))
    pool_parents = parents.long().gather(1, kept)
    inside = (pool_parents >= 0) & (pool_parents < size)
    kept_parents = torch.where(inside, tree_index.gather(1, pool_parents.clamp(0, size - 1)), 0)
    root = torch.zeros(batch, 1, dtype=torch.long, device=device)
    return (
        torch.cat([roots.long()[:, None], tokens.long().gather(1, kept)], dim=1),
        torch.cat([root - 1, kept_parents], dim=1),
        torch.cat([root, depths.long().gather(1, kept)], dim=1),
        torch.cat([root.float(), torch.nan_to_num(scores.float(), nan=float("-inf")).gather(1, kept)], dim=1),
    )


@triton_op(f"{NAMESPACE}::tree_select", mutates_args=())
def _tree_select_op(
    tokens: torch.Tensor, scores: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, roots: torch.Tensor,
    num_verify_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    if not use_triton(tokens):
        return tree_select_reference(tokens, scores, parents, depths, roots, num_verify_tokens)
    batch, size = tokens.shape
    device = tokens.device
    out_tokens = torch.empty((batch, num_verify_tokens), dtype=torch.int64, device=device)
    out_parents = torch.empty((batch, num_verify_tokens), dtype=torch.int64, device=device)
    out_depths = torch.empty((batch, num_verify_tokens), dtype=torch.int64, device=device)
    out_scores = torch.empty((batch, num_verify_tokens), dtype=torch.float32, device=device)
    index = torch.empty((batch, size), dtype=torch.int32, device=device)
    if batch > 0:
        wrap_triton(tree_select_kernel)[(batch,)](
            tokens, scores, parents, depths, roots, out_tokens, out_parents, out_depths, out_scores, index,
            size, num_verify_tokens - 1, POOL_PAD=power_of_two_tile(size, smallest=16), SCAN=SCAN_BLOCK,
        )  # fmt: skip
    return out_tokens, out_parents, out_depths, out_scores


def tree_select(
    tokens: torch.Tensor,
    scores: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    roots: torch.Tensor,
    num_verify_tokens: int,
) -> SelectedTree:
    """The draft tree of num_verify_tokens nodes kept from an EAGLE-2 candidate pool.

    The pool holds P candidates per request, in the order they were drafted (step by
    step, so a lower index is never deeper), each with its parent's pool index (-1: a
    child of the root). Kept: the num_verify_tokens - 1 best by score (NaN as -inf), ties
    to the lower pool index; a child never scores above its parent, so the kept set is
    closed under parents. They are laid out in pool order after the root (tree index 0).

    Args:
        tokens: [B, P] int32/int64, the candidates' tokens.
        scores: [B, P] fp32/bf16/fp16, cumulative draft log-probabilities.
        parents: [B, P] int32/int64, each candidate's parent pool index, -1 for the root's
            children. An index outside [0, P) counts as the root.
        depths: [B, P] int32/int64, each candidate's depth (1 for the root's children).
        roots: [B] int32/int64, the root tokens.
        num_verify_tokens: Python int in [2, P + 1]: N, the root included.

    Returns:
        SelectedTree (tokens, parents, depths, scores), each [B, N]; a parent is a tree
        index (-1 for the root), lower than its child's.
    """
    check_tensor_arg("tokens", tokens, INDEX_DTYPES, shape=(None, at_least(1, "P")), contiguous=True)
    batch, size = tokens.shape
    check_tensor_arg("scores", scores, FLOAT_DTYPES, shape=(batch, size), contiguous=True, device_of=tokens)
    check_tensor_arg("parents", parents, INDEX_DTYPES, shape=(batch, size), contiguous=True, device_of=tokens)
    check_tensor_arg("depths", depths, INDEX_DTYPES, shape=(batch, size), contiguous=True, device_of=tokens)
    check_tensor_arg("roots", roots, INDEX_DTYPES, shape=(batch,), contiguous=True, device_of=tokens)
    check_int_range("num_verify_tokens", num_verify_tokens, 2, size + 1)
    return SelectedTree(*_tree_select_op(tokens, scores, parents, depths, roots, num_verify_tokens))
