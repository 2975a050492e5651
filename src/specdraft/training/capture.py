"""Capture a target's outputs over token sequences: the data a draft head is
evaluated (or distilled) against, as a `TargetBatch` ready for `save_batch`.

The target runs once over the packed sequences, each from position 0, through its
own paged KV cache (allocated here for this batch and dropped after): the same
forward the generate loop's prefill runs, so the captured hidden states are the
ones a proposer reads when serving.
"""

from __future__ import annotations

import math

import torch

from specdraft.generation.verify import prompt_batch
from specdraft.training.shards import TargetBatch


def check_sequences(sequences: list[torch.Tensor]) -> None:
    """At least one sequence, each a non-empty 1-D integer tensor."""
    if not sequences:
        raise ValueError("sequences: at least one sequence is needed")
    for i, s in enumerate(sequences):
        if not isinstance(s, torch.Tensor) or s.dim() != 1 or s.shape[0] < 1 or s.is_floating_point():
            raise ValueError(f"sequences[{i}] must be a non-empty 1-D integer tensor")


@torch.no_grad()
def capture_target_outputs(
    target: torch.nn.Module,
    sequences: list[torch.Tensor],
    *,
    aux_layers: tuple[int, ...] = (),
    block_size: int = 16,
) -> TargetBatch:
    """Run `target` (a TinyTargetModel or what load_target_model returns) over the
    sequences. hidden_states is the concatenation of aux_layers' inputs (what an
    EAGLE-3 head fuses) when aux_layers is given, else the final normed hidden state
    (what EAGLE-1 and MTP heads read). target_logits are in the target's dtype.
    Tensors come back on the target's device."""
    weight = target.embed_tokens.weight
    vocab = weight.shape[0]
    check_sequences(sequences)
    if min(int(s.min()) for s in sequences) < 0 or max(int(s.max()) for s in sequences) >= vocab:
        raise ValueError(f"sequences: token ids must lie in [0, {vocab}), the target's vocabulary")
    longest = max(s.shape[0] for s in sequences)
    limit = getattr(target, "max_position_embeddings", None)
    if limit is not None and longest > limit:
        raise ValueError(
            f"sequences: the longest is {longest} tokens, past the target's max_position_embeddings {limit}"
        )
    blocks = math.ceil(longest / block_size)
    device = weight.device
    block_table = torch.arange(len(sequences) * blocks, dtype=torch.int32, device=device).view(len(sequences), blocks)
    caches = target.allocate_kv_caches(len(sequences) * blocks, block_size)
    prompts = [s.long() for s in sequences]
    ids, positions, metadata, _ = prompt_batch(prompts, block_table, block_size, blocks * block_size)
    hidden, aux = target(ids, positions, metadata, caches, aux_layers=tuple(aux_layers))
    logits = target.compute_logits(hidden)
    return TargetBatch(
        token_ids=ids.long(),  # prompt_batch's packed int32 ids
        hidden_states=aux if aux_layers else hidden,
        target_logits=logits,
        positions=positions,
        cu_seqlens=metadata.query_start_loc.long(),
    )
