"""Budgeted verification over draft trees (budget.py does chains and block drafters):
each iteration verifies the tree nodes that pay off best over the whole batch.

- **Survival estimate** of node i: its path probability under the draft, exp of the
  tree's cumulative log-probability (DraftTree.scores), the product of the draft's
  probabilities of the tokens from the root down to i. The tree's drafts are the
  draft's top-k, a function of the context alone (never sampled), so ranking them by
  it decides nothing from a drawn token: verifying any such subtree is lossless.
- **Allocation**: the expected gain of node i is its path probability, made no larger
  than its parent's (a min down the tree, so rounding never ranks a child above its
  parent); ops.budget_keep keeps the `budget` best nodes of the batch, ties to the
  shallower node, so a kept node always has its parent kept: every request keeps a
  subtree of its draft tree (possibly the root alone), a finished request the root
  alone.
- **The verify pass**: request r's kept nodes, in their tree order (parents first),
  renumbered 0 .. n_r - 1 (the subtree's own tree), go one request after the other
  into B + min(budget, B * (N - 1)) rows (a Python int: one compiled graph per batch
  size and budget). The subtree's node m is written at sequence index lens + m and
  attends to the prefix and its kept ancestors (TreeBatchMetadata with packed=True);
  the walk (greedy or ops.tree_verify) runs over the renumbered subtree padded to N
  nodes, whose padding nodes have parent -1 below the root and are never reached.
  The accepted path's KV moves as without a budget (tree_decoder.move_path_kv).

A budget of at least B * (N - 1) keeps every node of every running request: today's
tree iteration, token for token.
"""

from typing import NamedTuple

import torch

from specdraft.layout import TreeBatchMetadata
from specdraft.ops import budget_keep, tree_ancestors, tree_positions

from .budget import packed_layout, packed_rows, survival_rates, window_rows
from .step_costs import StepCosts
from .tree_costs import TreeCosts, shape_tuple


class PackedTree(NamedTuple):
    """A verify pass over each request's kept subtree, packed (module docstring).

    tokens, parents, depths [B, N] int64: the subtree renumbered (kept nodes in tree
    order, then padding: token -1, parent -1, depth 0); nodes [B, N] int64: the draft
    tree's node of each subtree node (0 for padding); local [B, N] int64: the subtree
    node of each draft tree node (clamped into [0, N) where not kept); kept [B, N]
    bool: the draft tree's nodes kept (the root always); rows [B, N] int64: the packed
    row of each subtree node (clamped where padding); num_drafts [B] int32: kept nodes
    below the root; token_ids [T] int32, positions [T] int64 and metadata: the packed
    pass (padding rows: token 0, position 0, no KV write)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    nodes: torch.Tensor
    local: torch.Tensor
    kept: torch.Tensor
    rows: torch.Tensor
    num_drafts: torch.Tensor
    token_ids: torch.Tensor
    positions: torch.Tensor
    metadata: TreeBatchMetadata


def node_gains(survival: torch.Tensor, parents: torch.Tensor, done: torch.Tensor, depth: int) -> torch.Tensor:
    """[B, N] fp32: each node's path probability (survival [B, N], NaN read as 0,
    clamped to [0, 1]) made no larger than any ancestor's by a min down `depth`
    levels, or -1 (never verified) for a finished request."""
    gains = survival_rates(survival)
    up = parents.long().clamp(min=0)  # the root is its own parent here
    for _ in range(depth):
        gains = torch.minimum(gains, gains.gather(1, up))
    return torch.where(done[:, None], -1.0, gains)


def kept_nodes(survival, parents, depths, done, budget: torch.Tensor, depth: int) -> torch.Tensor:
    """[B, N] bool: the nodes each request verifies this iteration, the root always."""
    if survival.shape[1] == 1:  # the roots alone
        return torch.ones_like(done[:, None])
    gains = node_gains(survival, parents, done, depth)
    keep = budget_keep(gains[:, 1:].contiguous(), depths[:, 1:].to(torch.int32).contiguous(), budget).keep
    return torch.cat([torch.ones_like(keep[:, :1]), keep], dim=1)


def pack_tree(tokens, parents, depths, kept, lens, num_rows: int, block_table, block_size: int, max_seq_len: int,
              max_model_len: int) -> PackedTree:  # fmt: skip
    """The kept subtree of each request's tree (tokens, parents, depths [B, N], node 0
    the root; kept [B, N]) renumbered and packed into num_rows rows."""
    num_reqs, n = tokens.shape
    device = tokens.device
    local = kept.long().cumsum(1) - 1  # each kept node's number in its subtree
    num_nodes = kept.sum(1)
    index = torch.arange(n, device=device)
    # nodes[b, m]: the kept node numbered m (a [B, N, N] match; N <= 64).
    match = kept[:, None, :] & (local[:, None, :] == index[None, :, None])
    nodes = (match.long() * index).sum(dim=-1)
    real = index[None, :] < num_nodes[:, None]
    up = parents.long().gather(1, nodes)
    sub_parents = torch.where(real & (up >= 0), local.gather(1, up.clamp(min=0)), -1)
    sub_depths = torch.where(real, depths.long().gather(1, nodes), 0)
    sub_tokens = torch.where(real, tokens.long().gather(1, nodes), -1)

    rows = packed_rows(num_nodes, num_rows, n)
    token_ids = torch.where(rows.real, sub_tokens[rows.request, rows.offset], 0).to(torch.int32)
    positions = tree_positions(lens, sub_depths.contiguous(), max_model_len)  # [B, N]
    positions = torch.where(rows.real, positions[rows.request, rows.offset], 0)
    query_start_loc, slot_mapping = packed_layout(rows, lens, block_table, block_size)
    metadata = TreeBatchMetadata(
        query_start_loc=query_start_loc,
        seq_lens=(lens + num_nodes).to(torch.int32),
        block_table=block_table,
        slot_mapping=slot_mapping,
        max_query_len=n,
        max_seq_len=max_seq_len,
        prefix_lens=lens,
        ancestors=tree_ancestors(sub_parents.contiguous()),
        packed=True,
    )
    return PackedTree(
        tokens=sub_tokens,
        parents=sub_parents,
        depths=sub_depths,
        nodes=nodes,
        local=local.clamp(0, n - 1),
        kept=kept,
        rows=window_rows(rows, n, num_rows),
        num_drafts=(num_nodes - 1).to(torch.int32),
        token_ids=token_ids,
        positions=positions,
        metadata=metadata,
    )


def has_kept_child(sub_parents: torch.Tensor) -> torch.Tensor:
    """[B, N] bool: the subtree node has a child in its subtree."""
    index = torch.arange(sub_parents.shape[1], device=sub_parents.device)
    return (sub_parents[:, None, :] == index[None, :, None]).any(dim=-1)


def check_tree_budget(budget, calibration, tree):
    """TreeSpeculativeDecoder's budget: None (verify every node), an int >= 0 (the
    most tree nodes below the roots verified per iteration over the batch) or a
    TreeCosts table measured with this tree shape (a budget chosen per run)."""
    if calibration is not None:
        raise ValueError("calibration: calibrates per-position estimates of chains and block drafters; a draft "
                         "tree ranks its nodes by their path probabilities as they are")  # fmt: skip
    if budget is None:
        return None
    if isinstance(budget, StepCosts):
        raise ValueError("budget: a StepCosts table chooses among chain lengths; a draft tree takes an int budget "
                         "or a TreeCosts table")  # fmt: skip
    if isinstance(budget, TreeCosts):
        if budget.shape != shape_tuple(tree):
            raise ValueError(f"budget: the TreeCosts table was measured with the tree {budget.shape}, the decoder "
                             f"drafts {shape_tuple(tree)}")  # fmt: skip
        return budget
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"budget: an int >= 0 (tree nodes verified per iteration over the batch) or None, "
                         f"got {budget!r}")  # fmt: skip
    return budget
