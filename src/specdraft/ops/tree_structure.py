"""Draft-tree structure: the ops a tree iteration runs besides the model and the
verifier (ops/sampling/tree_verify.py).

- `tree_expand`: one EAGLE-2 expansion step: the children's cumulative scores (their
  parent's plus their own log-probability) and the best k of them (ties: the lower
  index), the next frontier;
- `tree_select`: the tree kept from an EAGLE-2 candidate pool: the root plus the
  N - 1 best pool nodes by cumulative draft log-probability (ties: the lower pool
  index, which is never deeper), laid out by pool index (so by depth), with each
  node's parent as a tree index;
- `tree_ancestors`: the ancestor mask [B, N, N] of a parent array (node j is node i
  or an ancestor of it): the draft's and the target's tree attention mask;
- `tree_positions`: the rotary positions of tree nodes: their root's position plus
  their depth, clamped below max_model_len (1-D or M-RoPE rows);
- `tree_commit_kv`: after verification, the accepted path's KV moved into the
  contiguous slots a chain would have written, in place, in every layer's cache at
  once (a launch per 8 caches: one per layer and a serial depth loop were 139 µs of
  an 8B-shaped target's tree iteration).

One program per request for the first four (per M-RoPE row and request for the
positions; N <= 64 and a pool of at most a few hundred nodes fit one program's
registers), one per (request, feature block) for the commit. Each op's reference is the same computation in torch.
"""

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, check_int_range, check_tensor_arg
from specdraft.value_checks import check_in_range

from .backend import NAMESPACE, cdiv, triton, use_triton

# Imported by name: Inductor re-emits a user Triton kernel with the jit functions it
# calls, and a module attribute is not carried along.
from .tree_structure_kernels import (
    tree_ancestors_kernel,
    tree_commit_kv_kernel,
    tree_expand_kernel,
    tree_positions_kernel,
    tree_select_kernel,
)

SCAN_BLOCK = 32  # pool nodes compared per step of tree_select's ranking loops
COMMIT_BLOCK = 128  # cache features a tree_commit_kv program copies (of every depth and cache: in registers)
COMMIT_CACHES = 8  # caches one tree_commit_kv launch moves (its kernel's cache arguments)


class SelectedTree(NamedTuple):
    tokens: torch.Tensor  # [B, N] int64: the root token, then the kept nodes' tokens
    parents: torch.Tensor  # [B, N] int64: -1 for the root, else a tree index < the node's own
    depths: torch.Tensor  # [B, N] int64: 0 for the root
    scores: torch.Tensor  # [B, N] fp32: cumulative draft log-probabilities, 0 for the root


# ----------------------------------------------------------------------- references


def stable_rank(scores: torch.Tensor) -> torch.Tensor:
    """[B, P] int64: each score's place in (descending score, then ascending index)
    order, a permutation of 0 .. P - 1 per row (NaN ranks as -inf). By counting, not
    sorting: torch 2.11's Inductor lowers a CUDA sort of a non-power-of-two row (the
    pool's 68 nodes at depth 5, topk 4) to a kernel that indexed past the row (a
    device-side assert), and P <= 456 keeps the [B, P, P] comparison small."""
    s = torch.nan_to_num(scores.float(), nan=float("-inf"))
    index = torch.arange(s.shape[-1], device=s.device)
    ahead = (s[..., None, :] > s[..., :, None]) | (
        (s[..., None, :] == s[..., :, None]) & (index[None, :] < index[:, None])
    )  # [B, i, j]: j comes before i
    return ahead.sum(dim=-1)


def rows_of_rank(rank: torch.Tensor, k: int) -> torch.Tensor:
    """[B, k]: the index holding each place 0 .. k - 1 (rank a permutation per row)."""
    index = torch.arange(rank.shape[-1], device=rank.device)
    places = torch.arange(k, device=rank.device)
    return ((rank[..., None, :] == places[:, None]).long() * index).sum(dim=-1)


def tree_expand_reference(frontier_scores: torch.Tensor, child_logprobs: torch.Tensor, k: int):
    batch, width, fanout = child_logprobs.shape
    scores = (frontier_scores.float()[:, :, None] + child_logprobs.float()).reshape(batch, width * fanout)
    return scores, rows_of_rank(stable_rank(scores), k)


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


def tree_ancestors_reference(parents: torch.Tensor) -> torch.Tensor:
    """The reflexive-transitive closure of "j is i's parent", by squaring: after s
    squarings every path of up to 2**s steps is covered."""
    batch, n = parents.shape
    inside = (parents >= 0) & (parents < n)
    closure = torch.eye(n, device=parents.device).expand(batch, n, n).clone()
    edges = torch.zeros_like(closure).scatter_(2, torch.where(inside, parents, 0).long()[..., None],
                                               inside.float()[..., None])  # fmt: skip
    closure = torch.maximum(closure, edges)
    for _ in range(max(1, (n - 1).bit_length())):
        closure = ((closure @ closure) > 0).float()
    return closure > 0


def tree_positions_reference(root_positions: torch.Tensor, depths: torch.Tensor, max_model_len: int) -> torch.Tensor:
    return (root_positions.long()[..., None] + depths.long()).clamp(max=max_model_len - 1)


def tree_commit_kv_reference(caches: list[torch.Tensor], src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
    """Every source read (index_select copies), then every destination written."""
    for cache in caches:
        flat = cache.view(2, -1, cache.shape[-2], cache.shape[-1])
        last = flat.shape[1] - 1
        src, dst = src_slots.long().clamp(0, last).flatten(), dst_slots.long().clamp(0, last).flatten()
        flat.index_copy_(1, dst, flat.index_select(1, src))


# ------------------------------------------------------------------------------ ops


@triton_op(f"{NAMESPACE}::tree_expand", mutates_args=())
def _tree_expand_op(
    frontier_scores: torch.Tensor, child_logprobs: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if not use_triton(frontier_scores):
        return tree_expand_reference(frontier_scores, child_logprobs, k)
    batch, width, fanout = child_logprobs.shape
    count = width * fanout
    scores = torch.empty((batch, count), dtype=torch.float32, device=frontier_scores.device)
    best = torch.empty((batch, k), dtype=torch.int64, device=frontier_scores.device)
    if batch > 0:
        wrap_triton(tree_expand_kernel)[(batch,)](
            frontier_scores, child_logprobs, scores, best, fanout, count, k, PAD=max(16, triton.next_power_of_2(count))
        )  # fmt: skip
    return scores, best


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
            size, num_verify_tokens - 1, POOL_PAD=max(16, triton.next_power_of_2(size)), SCAN=SCAN_BLOCK,
        )  # fmt: skip
    return out_tokens, out_parents, out_depths, out_scores


@triton_op(f"{NAMESPACE}::tree_ancestors", mutates_args=())
def _tree_ancestors_op(parents: torch.Tensor) -> torch.Tensor:
    if not use_triton(parents):
        return tree_ancestors_reference(parents)
    batch, n = parents.shape
    out = torch.empty((batch, n, n), dtype=torch.bool, device=parents.device)
    if batch > 0:
        wrap_triton(tree_ancestors_kernel)[(batch,)](parents, out, n, N_PAD=max(16, triton.next_power_of_2(n)))
    return out


@triton_op(f"{NAMESPACE}::tree_positions", mutates_args=())
def _tree_positions_op(root_positions: torch.Tensor, depths: torch.Tensor, max_model_len: int) -> torch.Tensor:
    if not use_triton(depths):
        return tree_positions_reference(root_positions, depths, max_model_len)
    batch, n = depths.shape
    out = torch.empty((*root_positions.shape, n), dtype=torch.int64, device=depths.device)
    if out.numel() > 0:
        wrap_triton(tree_positions_kernel)[(root_positions.numel(),)](
            root_positions, depths, out, batch, n, max_model_len - 1, N_PAD=max(16, triton.next_power_of_2(n)),
        )  # fmt: skip
    return out


@triton_op(f"{NAMESPACE}::tree_commit_kv", mutates_args=("caches",))
def _tree_commit_kv_op(caches: list[torch.Tensor], src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
    if not use_triton(caches[0]):
        tree_commit_kv_reference(caches, src_slots, dst_slots)
        return
    batch, depth = src_slots.shape
    two, blocks, block_size, heads, dim = caches[0].shape
    features = two * heads * dim
    if batch == 0 or depth == 0:
        return
    for start in range(0, len(caches), COMMIT_CACHES):
        group = caches[start : start + COMMIT_CACHES]
        unused = [group[0]] * (COMMIT_CACHES - len(group))  # never read or written (NUM)
        wrap_triton(tree_commit_kv_kernel)[(batch, cdiv(features, COMMIT_BLOCK))](
            *group, *unused, src_slots, dst_slots, depth, blocks * block_size, features, NUM=len(group),
            D_PAD=max(2, triton.next_power_of_2(depth)), BLOCK=COMMIT_BLOCK,
        )  # fmt: skip


# ----------------------------------------------------------------- public wrappers


def tree_expand(
    frontier_scores: torch.Tensor, child_logprobs: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One EAGLE-2 expansion step: each frontier node's children scored, the best k kept.

    Args:
        frontier_scores: [B, F] fp32/bf16/fp16, the frontier nodes' cumulative scores.
        child_logprobs: [B, F, C] fp32/bf16/fp16, each frontier node's C children's
            log-probabilities (row f: frontier node f's children).
        k: Python int in [1, F * C], how many to keep.

    Returns:
        (scores, best): scores [B, F * C] fp32, child f * C + c's cumulative score
        (frontier_scores[f] + child_logprobs[f, c]); best [B, k] int64, the indices of the
        k highest scores, highest first, ties to the lower index (NaN ranks as -inf).
    """
    check_tensor_arg("frontier_scores", frontier_scores, FLOAT_DTYPES, shape=(None, at_least(1, "F")),
                     contiguous=True)  # fmt: skip
    batch, width = frontier_scores.shape
    check_tensor_arg("child_logprobs", child_logprobs, FLOAT_DTYPES, shape=(batch, width, at_least(1, "C")),
                     contiguous=True, device_of=frontier_scores)  # fmt: skip
    check_int_range("k", k, 1, width * child_logprobs.shape[2])
    return _tree_expand_op(frontier_scores, child_logprobs, k)


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


def tree_ancestors(parents: torch.Tensor) -> torch.Tensor:
    """[B, N, N] bool: node j is node i or one of its ancestors.

    Args:
        parents: [B, N] int32/int64, each node's parent index, -1 for the root; a
            parent outside [0, N) ends the path as -1 does.

    Returns:
        The ancestor mask, reflexive: out[b, i, i] is True for every node.
    """
    check_tensor_arg("parents", parents, INDEX_DTYPES, shape=(None, at_least(1, "N")), contiguous=True)
    return _tree_ancestors_op(parents)


def tree_positions(root_positions: torch.Tensor, depths: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Rotary positions of tree nodes: root_positions + depth, clamped to
    max_model_len - 1 (a node past it can never be accepted; the clamp keeps its
    rotary lookup in range).

    Args:
        root_positions: [B] or M-RoPE [3, B] int32/int64, each request's root position
            (every row shifted alike).
        depths: [B, N] int32/int64, each node's depth below its root.
        max_model_len: Python int >= 1.

    Returns:
        [B, N] (or [3, B, N]) int64.
    """
    check_tensor_arg("depths", depths, INDEX_DTYPES, shape=(None, None), contiguous=True)
    batch = depths.shape[0]
    rows = (batch,) if root_positions.dim() == 1 else (3, batch)
    check_tensor_arg("root_positions", root_positions, INDEX_DTYPES, shape=rows, contiguous=True, device_of=depths)
    check_int_range("max_model_len", max_model_len, 1, 2**62)
    return _tree_positions_op(root_positions, depths, max_model_len)


def tree_commit_kv(
    cache: torch.Tensor | Sequence[torch.Tensor], src_slots: torch.Tensor, dst_slots: torch.Tensor
) -> None:
    """Move KV slots of paged caches in place: for each request b and depth d, slot
    src_slots[b, d] is copied to dst_slots[b, d] (K and V, every head), in one cache
    or in each of several (every layer's) alike.

    Contract: every move reads the cache as it was before the call (all sources are
    read, then all destinations written), so one depth's destination may be another's
    source; requests touch disjoint slots, and the destinations of one request are
    distinct, except that a move onto itself (a no-op, which is how a shorter accepted
    path pads its row) may share its slot with another move's source. Slots outside
    the cache raise a ValueError in checked mode (specdraft.checked_mode); outside it
    they are clamped into the cache, never written out of bounds.

    Args:
        cache: [2, num_blocks, block_size, kv_heads, head_dim], contiguous, any float
            dtype; or a non-empty list of such caches of one shape, dtype and device.
        src_slots: [B, D] int32/int64, slots in [0, num_blocks * block_size).
        dst_slots: [B, D] int32/int64, likewise.
    """
    caches = [cache] if isinstance(cache, torch.Tensor) else list(cache)
    if not caches:
        raise ValueError("cache must be a tensor or a non-empty list of tensors, got an empty list")
    check_tensor_arg("cache", caches[0], FLOAT_DTYPES, shape=(2, None, None, None, None), contiguous=True)
    for i, other in enumerate(caches[1:], start=1):
        check_tensor_arg(f"cache[{i}]", other, caches[0].dtype, shape=tuple(caches[0].shape), contiguous=True,
                         device_of=caches[0])  # fmt: skip
    check_tensor_arg("src_slots", src_slots, INDEX_DTYPES, shape=(None, None), contiguous=True, device_of=caches[0])
    check_tensor_arg("dst_slots", dst_slots, INDEX_DTYPES, shape=tuple(src_slots.shape), contiguous=True,
                     device_of=caches[0])  # fmt: skip
    if is_checked():
        num_slots = caches[0].shape[1] * caches[0].shape[2]  # num_blocks * block_size
        check_in_range("src_slots", src_slots, 0, num_slots)
        check_in_range("dst_slots", dst_slots, 0, num_slots)
    _tree_commit_kv_op(caches, src_slots, dst_slots)
