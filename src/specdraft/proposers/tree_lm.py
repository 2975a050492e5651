"""EAGLE-2 draft trees for the autoregressive speculator (a standalone draft LM):

    draft_lm_tree   window_pass (autoregressive.py) -> grow_tree (tree.py), each step feed_lm_frontier

The window pass is the speculator's prefill pass (autoregressive.py): the LM over
each request's kept window plus its next token, the tree's root, whose KV it writes
to the paged cache. Each tree step feeds the topk frontier nodes of every request,
B * topk rows, through every layer of the LM: each layer's keys and values of the
fed nodes go to a per-call buffer of that layer (step s, lane f at (s - 1) * topk +
f), never to the paged cache, and each node attends to its request's prefix (the
root last) and to the buffer entries of its ancestors and itself: each layer's own
forward, handed the tree's attention (tree.frontier_attention). So every node's
logits are those of the LM run over the root-to-node path as a chain
(tests/proposers/test_tree_autoregressive.py). The hidden state a step hands on is
not read: an LM takes token ids only.
"""

from __future__ import annotations

from specdraft.config import SpeculativeConfig
from specdraft.layout import BatchMetadata
from specdraft.proposers.loop import WindowPass, clamp_ids
from specdraft.proposers.tree import TreeDraftOutput, frontier_attention, grow_tree, tree_buffers
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


def feed_lm_frontier(model, kv_caches, tokens, positions, step: int, buffers: dict, visible, batch: BatchMetadata):
    """One tree step of a standalone LM: the frontier's B * topk nodes through every
    layer, each layer handed `frontier_attention` over its own cache and buffer.
    batch: the roots' step batch. Returns the final norm's output [B * topk, H] twice
    (for the logits, and as the unread hidden state grow_tree hands on)."""
    lm = model.model
    h = lm.embed_tokens(clamp_ids(tokens.reshape(-1), lm.config.vocab_size))
    for i, layer in enumerate(lm.layers):
        h = layer(positions, h, frontier_attention(kv_caches[i], batch, buffers, i, step, tokens.shape, visible))
    h = lm.norm(h)
    return h, h


def draft_lm_tree(model, kv_caches, config: SpeculativeConfig, root: WindowPass, next_token_ids, shape: TreeShape,
                  *, return_logprobs: bool = False) -> TreeDraftOutput:  # fmt: skip
    """The EAGLE-2 tree of every request, drafted by a standalone LM (module
    docstring) from its window pass: root.hidden [B, H] the output at the roots,
    root.state the step state of the root (its clamped position; its batch: seq_lens
    counting the root, the requests' block table)."""
    batch = root.state.batch
    buffers = tree_buffers(kv_caches, range(len(model.model.layers)), root.hidden.shape[0], shape, model.model.config)

    def feed(tokens, hidden, node_pos, step, visible):
        return feed_lm_frontier(model, kv_caches, tokens, node_pos, step, buffers, visible, batch)

    return grow_tree(model, config, shape, root, feed, next_token_ids, return_logprobs)
