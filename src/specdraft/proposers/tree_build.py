"""EAGLE-2 dynamic draft trees: the shape, the expansion and the final selection, in
static shapes with no host sync (issue 26, its first piece: the tree build).

The tree of one request: node 0 is the root, the token the target verifies first (the
last token it emitted). Draft step 0 expands the root to its `topk` most likely
children (depth 1). Every later step expands each of the `topk` frontier nodes to its
`topk` children, and the `topk` of those `topk**2` candidates with the highest
cumulative draft log-probability (the sum along the path from the root) become the
next frontier. Every candidate ever expanded joins the pool: `topk + (depth - 1) *
topk**2` nodes. After `depth` steps the `num_verify_tokens - 1` best pool nodes by
cumulative log-probability are kept, with the root: the tree the target verifies.

Ties are broken so the result is one defined tree: among equal scores, the frontier
and the final selection take the lower pool index (pool order: step by step,
frontier node by frontier node, child rank by child rank), and the final selection
ranks a shallower node first. A child's score never exceeds its parent's
(log-probabilities are <= 0) and a parent is shallower, so the kept set is closed
under parents: no orphan node, ties included.

Kept nodes are laid out by (depth, pool index): a parent always comes before its
children, node i attends to the prefix and to its ancestors (`ancestors[i, j]`), at
position prefix length + depth.

How the three numbers map to other engines: depth is SGLang's
speculative_num_steps and TensorRT-LLM's max_draft_len; topk is SGLang's
speculative_eagle_topk and TensorRT-LLM's dynamic_tree_max_topK; num_verify_tokens
(the root included) is SGLang's speculative_num_draft_tokens and TensorRT-LLM's
max_total_draft_tokens + 1.

Each expansion's scoring and frontier choice, the final selection and the ancestor
mask are ops (ops/tree_structure/, a file per op: a Triton kernel on CUDA, the torch
reference on CPU).
Everything compiles under torch.compile(fullgraph=True): every shape is fixed by
(B, depth, topk, num_verify_tokens). tests/proposers/test_tree_build.py checks the
build against a plain-Python EAGLE-2 reference.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdraft.ops.tree_structure import tree_ancestors, tree_expand, tree_select
from specdraft.tree_shape import TreeShape  # plain Python, so a CLI can check one before importing torch


def check_tree_shape(name: str, value) -> None:
    """A ValueError naming `name` unless value is a TreeShape."""
    if not isinstance(value, TreeShape):
        raise ValueError(f"{name} must be a TreeShape(depth, topk, num_verify_tokens), got {type(value).__name__}")


class TreePool(NamedTuple):
    """Every node drafted so far, per request: tokens, cumulative log-probabilities,
    parents (pool index; -1 for the root), depths (1 for the root's children). [B, P]
    each, P growing by topk**2 per step after the first."""

    tokens: torch.Tensor
    scores: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor


class Frontier(NamedTuple):
    """The nodes the next step expands: their pool indices and scores, [B, topk]."""

    index: torch.Tensor
    scores: torch.Tensor


class DraftTree(NamedTuple):
    """The tree the target verifies, [B, N] (node 0 the root): tokens, parents (tree
    index, -1 for the root), depths (0 for the root), cumulative draft
    log-probabilities (0 for the root), and ancestors [B, N, N] bool (i sees j: j is
    i or one of its ancestors)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    ancestors: torch.Tensor


def expand_root(child_tokens: torch.Tensor, child_logprobs: torch.Tensor) -> tuple[TreePool, Frontier]:
    """Step 0: the root's topk children ([B, topk] tokens and log-probabilities, in
    rank order) start the pool, and all of them are the frontier."""
    batch, topk = child_tokens.shape
    index = torch.arange(topk, device=child_tokens.device).expand(batch, topk)
    pool = TreePool(child_tokens.long(), child_logprobs.float(), torch.full_like(index, -1), torch.ones_like(index))
    return pool, Frontier(index, pool.scores)


def expand_frontier(
    pool: TreePool, frontier: Frontier, child_tokens: torch.Tensor, child_logprobs: torch.Tensor
) -> tuple[TreePool, Frontier]:
    """A later step: each frontier node's topk children ([B, F, topk] tokens and
    log-probabilities; row f belongs to frontier node f) join the pool with cumulative
    scores, and the best topk of them become the next frontier."""
    batch, num_frontier, topk = child_tokens.shape
    scores, best = tree_expand(frontier.scores.contiguous(), child_logprobs.float().contiguous(), topk)
    parents = frontier.index[:, :, None].expand(-1, -1, topk).reshape(batch, -1)
    depth = pool.depths.gather(1, frontier.index[:, :1]) + 1  # every frontier node is at one depth
    start = pool.tokens.shape[1]
    pool = TreePool(
        torch.cat([pool.tokens, child_tokens.long().reshape(batch, -1)], dim=1),
        torch.cat([pool.scores, scores], dim=1),
        torch.cat([pool.parents, parents], dim=1),
        torch.cat([pool.depths, depth.expand(-1, num_frontier * topk)], dim=1),
    )
    return pool, Frontier(best + start, scores.gather(1, best))


def select_tree(pool: TreePool, root_tokens: torch.Tensor, num_verify_tokens: int) -> DraftTree:
    """The root plus the num_verify_tokens - 1 best pool nodes (score, then shallower,
    then lower pool index), laid out by (depth, pool index), with the ancestor mask:
    ops.tree_select and ops.tree_ancestors."""
    tree = tree_select(pool.tokens, pool.scores, pool.parents, pool.depths, root_tokens, num_verify_tokens)
    return DraftTree(*tree, tree_ancestors(tree.parents))
