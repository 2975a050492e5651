"""EAGLE-2 tree drafting with exact draft attention, in static shapes.

    draft_tree   window_pass -> grow_tree: expand_root -> (depth - 1) x [feed_frontier -> expand_frontier]
                 -> select_tree

The window pass is the chain's (`loop.window_pass`): the draft over the target's
window, ending on the root (the token the target emitted last). The root's logits
give its topk children (tree_build.expand_root). Each later step feeds the topk
frontier nodes of every request at once, B * topk rows, each at position root + its
depth, with the hidden state its parent's forward produced (what a chain feeds):
the head's own draft step (DraftHead.step), handed the tree's attention
(`frontier_attention`).

Draft attention is exact: a node sees its request's prefix in the paged cache (the
root's key last, written by the window pass) and the keys of its own ancestors and
itself, nothing else. The fed nodes' keys go to a per-call buffer [B, (depth - 1) *
topk, kv_heads, head_dim] (step s, lane f at (s - 1) * topk + f), never to the paged
cache, so no slot a chain or another request reads is written; a node's visible
buffer entries are its parent's plus its own. So every node's logits are those of
drafting its root-to-node path as a chain (tests/proposers/test_tree_draft.py).

Shapes are fixed by (B, depth, topk, num_verify_tokens); no host sync.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdraft.config import SpeculativeConfig
from specdraft.layout import BatchMetadata
from specdraft.models.attention import prefix_and_tree_attention
from specdraft.ops import top_logprobs, tree_positions
from specdraft.proposers.loop import TargetWindow, WindowPass, clamp_ids, window_pass
from specdraft.proposers.tree_build import (
    DraftTree,
    TreePool,
    TreeShape,
    expand_frontier,
    expand_root,
    select_tree,
)


class TreeDraftOutput(NamedTuple):
    """tree: the DraftTree the target verifies ([B, N]; tokens in the target
    vocabulary, node 0 the root = next_token_ids). With return_logprobs, the draft
    log-probabilities behind it, over the draft vocabulary: root_logprobs [B, Vd] (the
    root's forward) and frontier_logprobs [B, depth - 1, topk, Vd] (the forward of the
    node fed at step s, lane f, whose pool index is frontier_index [B, depth - 1, topk])
    and the whole pool the tree was selected from (tree_build.TreePool); else None."""

    tree: DraftTree
    root_logprobs: torch.Tensor | None = None
    frontier_logprobs: torch.Tensor | None = None
    frontier_index: torch.Tensor | None = None
    pool: TreePool | None = None


def top_children(logits: torch.Tensor, topk: int, model, all_logprobs: bool = False):
    """(target ids, log-probabilities, all log-probabilities or None) of the topk
    likeliest draft tokens of every row: ops.top_logprobs (one pass over the row;
    ties to the lower draft id, so to the lower target id too: a draft-to-target map
    is increasing). all_logprobs: also the fp32 log-softmax over the whole draft
    vocabulary (what the sampled verify needs), and the children's log-probabilities
    read from it, so the tree and the verify score with one tensor."""
    ids, logprobs = top_logprobs(logits, topk)
    if not all_logprobs:
        return model.draft_to_target(ids), logprobs, None
    full = torch.log_softmax(logits.float(), dim=-1)
    return model.draft_to_target(ids), full.gather(-1, ids), full


def node_positions(root_positions: torch.Tensor, depth: int, count: int, max_model_len: int) -> torch.Tensor:
    """Rotary positions of `count` nodes per request at `depth` below the root: the
    root's + depth on every row (M-RoPE: [3, B * count]), clamped below
    max_model_len by ops.tree_positions (a node past it can never be accepted; the
    clamp keeps its rotary lookup in range)."""
    depths = torch.full((root_positions.shape[-1], count), depth, dtype=torch.int64, device=root_positions.device)
    return tree_positions(root_positions.contiguous(), depths, max_model_len).flatten(-2)


def feed_frontier(model, kv_caches, tokens, hidden, positions, step: int, buffers: dict, visible,
                  batch: BatchMetadata):  # fmt: skip
    """One tree step: the frontier's B * topk nodes through the head's draft step,
    with `frontier_attention` over the step's KV layer. batch: the roots' step batch
    (seq_lens counting the root, the requests' block table). Returns (hidden for
    sampling, hidden for the next step), [B * topk, H] each."""
    cache = model.kv_layer(step)
    attend = frontier_attention(kv_caches[cache], batch, buffers, cache, step, tokens.shape, visible)
    return model.step(clamp_ids(tokens.reshape(-1), model.config.vocab_size), positions, hidden, step, attend)


def frontier_attention(kv_cache, batch: BatchMetadata, buffers: dict, key, step: int, shape, visible):
    """The attention of one layer for the B * topk frontier nodes of tree step
    `step` (shape: (B, topk)): their keys and values go to buffers[key]'s step slots
    (a new pair of tensors: the buffers are graph values, not state), then each node
    attends to its request's prefix in kv_cache (batch.seq_lens keys, the root last)
    and to the buffer entries `visible` marks. attend(q, k, v) -> [B * topk, heads,
    head_dim], before o_proj (models.layers)."""
    num_reqs, topk = shape
    lanes = slice((step - 1) * topk, step * topk)

    def attend(q, k, v):
        keys, values = (t.clone() for t in buffers[key])
        keys[:, lanes] = k.view(num_reqs, topk, *k.shape[1:])
        values[:, lanes] = v.view(num_reqs, topk, *v.shape[1:])
        buffers[key] = keys, values
        out = prefix_and_tree_attention(
            q.view(num_reqs, topk, *q.shape[1:]), kv_cache, batch.seq_lens, batch.block_table, batch.max_seq_len,
            keys, values, visible,
        )  # fmt: skip
        return out.reshape(num_reqs * topk, *out.shape[2:])

    return attend


def empty_buffers(model, kv_caches, batch: int, tree: TreeShape) -> dict:
    """Zeroed key / value buffers for each KV layer that tree steps 1 .. depth - 1 use
    (tree_buffers)."""
    caches = {model.kv_layer(step) for step in range(1, tree.depth)}
    return tree_buffers(kv_caches, caches, batch, tree, model.config)


def tree_buffers(kv_caches, layers, batch: int, tree: TreeShape, config) -> dict:
    """{layer: zeroed (keys, values)} [B, (depth - 1) * topk, kv_heads, head_dim], in
    each layer's cache dtype and device: step s, lane f at (s - 1) * topk + f."""
    size = (batch, (tree.depth - 1) * tree.topk, config.num_kv_heads, config.head_dim)
    return {i: (kv_caches[i].new_zeros(size), kv_caches[i].new_zeros(size)) for i in layers}


def draft_tree(
    model, kv_caches, config: SpeculativeConfig, window: TargetWindow, shape: TreeShape, *,
    return_logprobs: bool = False,
) -> TreeDraftOutput:  # fmt: skip
    """The EAGLE-2 tree of every request (module docstring). window.metadata's
    max_seq_len is resolved (Proposer.checked_window)."""
    root = window_pass(model, kv_caches, window)
    buffers = empty_buffers(model, kv_caches, window.metadata.num_reqs, shape)

    def feed(tokens, hidden, node_pos, step, visible):
        return feed_frontier(model, kv_caches, tokens, hidden, node_pos, step, buffers, visible, root.state.batch)

    return grow_tree(model, config, shape, root, feed, window.next_token_ids, return_logprobs)


def grow_tree(model, config: SpeculativeConfig, shape: TreeShape, root: WindowPass, feed, next_token_ids,
              return_logprobs: bool = False) -> TreeDraftOutput:  # fmt: skip
    """expand_root, then (depth - 1) x [feed the frontier -> expand_frontier], then
    select_tree. root: the draft's window pass (the root's output, and its step
    state: the hidden state its children are fed with, its clamped position).
    feed(tokens [B, topk], hidden [B * topk, H], positions, step, visible [B, topk,
    (depth - 1) * topk]) runs the draft over the frontier and returns (hidden for its
    logits, hidden for the next step); the draft's own layers decide what that is
    (tree.feed_frontier: an EAGLE head's draft step, tree_lm.feed_lm_frontier: every
    layer of a standalone LM)."""
    batch, topk = next_token_ids.shape[0], shape.topk
    tokens, logprobs, root_logprobs = top_children(model.draft_logits(root.hidden, 0), topk, model, return_logprobs)
    pool, frontier = expand_root(tokens, logprobs)
    slots = (shape.depth - 1) * topk
    root_hidden, root_positions = root.state.hidden_states, root.state.clamped_positions
    device = root_hidden.device
    hidden = root_hidden.repeat_interleave(topk, dim=0)  # every depth-1 node's parent is the root
    ancestry = torch.zeros(batch, topk, slots, dtype=torch.bool, device=device)  # buffer entries seen
    lane = torch.arange(topk, device=device)
    step_logprobs, step_index = [], []
    for step in range(1, shape.depth):
        fed = pool.tokens.gather(1, frontier.index)
        visible = ancestry.clone()
        visible[:, lane, (step - 1) * topk + lane] = True  # each node sees itself
        node_pos = node_positions(root_positions, step, topk, config.max_model_len)
        h_sample, h_next = feed(fed, hidden, node_pos, step, visible)
        children, child_logprobs, all_logprobs = top_children(model.draft_logits(h_sample, step), topk, model,
                                                             return_logprobs)  # fmt: skip
        if return_logprobs:
            step_logprobs.append(all_logprobs.view(batch, topk, -1))
            step_index.append(frontier.index)
        start = pool.tokens.shape[1]
        pool, frontier = expand_frontier(pool, frontier, children.view(batch, topk, topk),
                                         child_logprobs.view(batch, topk, topk))  # fmt: skip
        parent_lane = (frontier.index - start) // topk  # [B, topk]: the fed lane each new frontier node came from
        hidden = h_next.view(batch, topk, -1).gather(1, parent_lane[:, :, None].expand(-1, -1, h_next.shape[-1]))
        hidden = hidden.reshape(batch * topk, -1)
        ancestry = visible.gather(1, parent_lane[:, :, None].expand(-1, -1, slots))
    tree = select_tree(pool, next_token_ids, shape.num_verify_tokens)
    if not return_logprobs:
        return TreeDraftOutput(tree)
    frontier_logprobs = torch.stack(step_logprobs, 1) if step_logprobs else root_logprobs.new_zeros(batch, 0, topk, 0)
    frontier_index = torch.stack(step_index, 1) if step_index else pool.tokens.new_zeros(batch, 0, topk)
    return TreeDraftOutput(tree, root_logprobs, frontier_logprobs, frontier_index, pool)
