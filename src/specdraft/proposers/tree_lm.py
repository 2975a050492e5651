"""EAGLE-2 draft trees for the autoregressive speculator (a standalone draft LM):

    draft_lm_tree   window_pass -> grow_tree (tree.py), each step feed_lm_frontier

The window pass is the speculator's prefill pass (autoregressive.py): the LM over
each request's kept window plus its next token, the tree's root, whose KV it writes
to the paged cache. Each tree step feeds the topk frontier nodes of every request,
B * topk rows, through every layer of the LM: each layer's keys and values of the
fed nodes go to a per-call buffer of that layer (step s, lane f at (s - 1) * topk +
f), never to the paged cache, and each node attends to its request's prefix (the
root last) and to the buffer entries of its ancestors and itself. So every node's
logits are those of the LM run over the root-to-node path as a chain
(tests/proposers/test_tree_autoregressive.py). The hidden state a step hands on is
not read: an LM takes token ids only.
"""

from __future__ import annotations

import torch

from specdraft.config import SpeculativeConfig
from specdraft.proposers.loop import clamp_ids
from specdraft.proposers.tree import TreeDraftOutput, TreeRoot, attend_frontier, grow_tree
from specdraft.proposers.tree_build import TreeShape


def check_tree_lm(model) -> None:
    """A ValueError naming `model` unless the wrapped LM exposes what a tree step runs
    layer by layer: embed_tokens, layers (decoder layers), norm."""
    lm = getattr(model, "model", None)
    missing = [name for name in ("embed_tokens", "layers", "norm") if not hasattr(lm, name)]
    if missing:
        raise ValueError(
            f"model: draft trees feed a standalone LM layer by layer and need its {', '.join(missing)} "
            f"(as TinyTargetModel has); {type(lm).__name__} lacks them"
        )


def lm_buffers(model, kv_caches, batch: int, shape: TreeShape) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Zeroed key / value buffers [B, (depth - 1) * topk, kv_heads, head_dim] per LM layer."""
    lm = model.model
    size = (batch, (shape.depth - 1) * shape.topk, lm.config.num_kv_heads, lm.config.head_dim)
    return [(kv_caches[i].new_zeros(size), kv_caches[i].new_zeros(size)) for i in range(len(lm.layers))]


def feed_lm_frontier(model, kv_caches, tokens, positions, step: int, buffers: list, visible, metadata, seq_lens):
    """One tree step of a standalone LM: the frontier's B * topk nodes through every
    layer, each layer's keys into its buffer's step slots, attention over prefix +
    visible buffer entries. Returns the final norm's output [B * topk, H] twice (for
    the logits, and as the unread hidden state grow_tree hands on)."""
    lm = model.model
    h = lm.embed_tokens(clamp_ids(tokens.reshape(-1), lm.config.vocab_size))
    for i, layer in enumerate(lm.layers):
        attn_input, residual = layer.attention_input(h)
        out = attend_frontier(layer, attn_input, positions, tokens.shape, step, buffers, i, kv_caches[i], visible,
                              metadata, seq_lens)  # fmt: skip
        h = layer.finish(out, residual)
    h = lm.norm(h)
    return h, h


def draft_lm_tree(speculator, window_args: dict, shape: TreeShape, *, return_logprobs: bool = False):
    """The EAGLE-2 tree of every request, drafted by the speculator's LM (module
    docstring). window_args: AutoregressiveSpeculator.window_pass's arguments."""
    model, kv_caches = speculator.model, speculator.kv_caches
    config: SpeculativeConfig = speculator.config
    h_root, state = speculator.window_pass(**window_args)
    step_batch = state.batch  # the root's: its seq_len counts the root, its block table is the request's
    buffers = lm_buffers(model, kv_caches, h_root.shape[0], shape)

    def feed(tokens, hidden, node_pos, step, visible):
        return feed_lm_frontier(model, kv_caches, tokens, node_pos, step, buffers, visible, step_batch,
                                step_batch.seq_lens)  # fmt: skip

    root = TreeRoot(model.draft_logits(h_root, 0), h_root, state.clamped_positions)
    out: TreeDraftOutput = grow_tree(model, config, shape, root, feed, window_args["next_token_ids"], return_logprobs)
    return out
