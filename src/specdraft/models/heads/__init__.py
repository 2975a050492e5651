"""Reference draft heads behind one interface the proposers call.

Every head (EagleHead, Eagle3Head, MTPHead) implements::

    forward(input_ids [T] int, positions [T] or [3, T] int64, hidden_states [T, Hin],
            attn_metadata, kv_caches, spec_step_idx: int = 0, inputs_embeds=None)
        -> (hidden_for_sampling [T, H], hidden_for_next_step [T, H])
    compute_logits(hidden [N, H], spec_step_idx: int = 0) -> [N, vocab_size]

- hidden_for_sampling goes to compute_logits; hidden_for_next_step is what the next
  draft step receives as `hidden_states`: the pre-norm residual stream, or the final
  norm's output when config.hidden_feed == "normed" (see DraftModelConfig).
- compute_logits always returns logits over the *target* vocabulary, so proposers
  sample the same way for every head (EAGLE-3 places its draft-vocabulary logits at
  their target ids and puts -inf elsewhere; the cheaper path is
  compute_draft_logits + map_draft_to_target).
- attn_metadata: a BatchMetadata (or any object with its attributes), or a
  list / tuple of them indexed by layer (several KV-cache groups, Step3.5-style).
- kv_caches: one [2, num_blocks, block_size, kv_heads, head_dim] tensor per layer
  (`num_kv_layers` of them; allocate_kv_caches makes them). Layer i writes kv_caches[i].
- spec_step_idx is a Python int (static per compiled call); only MTPHead uses it.
- combine_hidden_states(h) maps target hidden states to the head's input width
  (EAGLE-3's fusion of three aux layers; identity for the others).
- share_from(target) reuses the target's embed_tokens / lm_head modules.

Each head's math exists once: DraftHead.step(input_ids, positions, hidden_states,
step, attend, inputs_embeds=None), built from the pieces each head kind defines
(step_layer, step_hidden, step_input, step_outputs, draft_logits, draft_to_target;
base.py), with the attention passed in. `forward` is `step` with paged attention
over kv_caches[kv_layer(step)] (specdraft.models.cache_attention); the training
unroll (specdraft.training.unroll) and the tree drafter (specdraft.proposers.tree)
call `step` with theirs.
"""

from __future__ import annotations

from specdraft.models.heads.base import DraftHead, check_shareable
from specdraft.models.heads.block import BlockConfig, BlockDraftHead
from specdraft.models.heads.block_gemma4 import Gemma4BlockDraftHead, Gemma4Settings
from specdraft.models.heads.eagle import Eagle3DecoderLayer, Eagle3Head, EagleHead
from specdraft.models.heads.mtp import MTPHead, MTPLayer

__all__ = [
    "BlockConfig",
    "BlockDraftHead",
    "DraftHead",
    "Eagle3DecoderLayer",
    "Eagle3Head",
    "EagleHead",
    "Gemma4BlockDraftHead",
    "Gemma4Settings",
    "MTPHead",
    "MTPLayer",
    "check_shareable",
]
