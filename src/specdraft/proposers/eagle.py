"""EAGLE / EAGLE-3 / MTP proposer (reference 002), with the two ways into the
loop after the target's verification step:

- padded (no host sync): rejected tokens stay in the batch as padding; each
  request samples after its last accepted token (`propose_padded`);
- unpadded: rejected tokens are dropped and the batch repacked, which needs one
  host-side number, the kept token count (`propose_unpadded`).
"""

import dataclasses

import torch

from specdraft.config import BatchMetadata, SamplingParams
from specdraft.ops import prepare_eagle_input, prepare_inputs_padded, prepare_next_token_padded
from specdraft.proposers.base import DraftOutput, Proposer, rows

PADDING_SLOT_ID = -1


def repack_slots(slot_mapping: torch.Tensor, index: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Slots of the kept tokens; rows past the kept total write nothing (PAD)."""
    return torch.where(real, slot_mapping.index_select(0, index), PADDING_SLOT_ID)


class EagleProposer(Proposer):
    """config.method picks the head family ("eagle", "eagle3", "mtp"); the loop is
    the same for all three (see Proposer)."""

    repack_slots = staticmethod(repack_slots)

    def repack_group_slots(self, metadata: BatchMetadata, index: torch.Tensor, real: torch.Tensor) -> BatchMetadata:
        """Hook: proposers with more slot mappings (KV-cache groups) repack them too."""
        return metadata

    def propose_padded(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        sampled_token_ids: torch.Tensor,
        cu_num_draft_tokens: torch.Tensor,
        backup_next_token_ids: torch.Tensor,
        metadata: BatchMetadata,
        sampling: SamplingParams | None = None,
        *,
        discard_request_mask: torch.Tensor | None = None,
    ) -> DraftOutput:
        """After verification, with no host sync.

        sampled_token_ids [B, K+1]: what the rejection sampler emitted (-1 after the
        first rejection). cu_num_draft_tokens [B]: inclusive cumsum of the drafts
        each request was verified with. backup_next_token_ids [B]: the next token of
        requests that emitted none (e.g. partial prefills, discarded requests).
        The target batch (metadata) still holds every verified token."""
        if discard_request_mask is None:
            discard_request_mask = torch.zeros_like(backup_next_token_ids, dtype=torch.bool)
        next_tokens = prepare_next_token_padded(
            sampled_token_ids, discard_request_mask, backup_next_token_ids, self.model.config.vocab_size
        )
        padded = prepare_inputs_padded(
            cu_num_draft_tokens, next_tokens.valid_sampled_tokens_count, metadata.query_start_loc
        )
        return self.propose(
            target_token_ids,
            target_positions,
            target_hidden_states,
            next_tokens.next_token_ids,
            metadata,
            sampling,
            token_indices_to_sample=padded.token_indices_to_sample,
            num_rejected_tokens=padded.num_rejected_tokens,
        )

    def propose_unpadded(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        next_token_ids: torch.Tensor,
        num_rejected_tokens: torch.Tensor,
        metadata: BatchMetadata,
        num_kept_tokens: int,
        sampling: SamplingParams | None = None,
    ) -> DraftOutput:
        """After verification, with the rejected tokens dropped.

        num_kept_tokens: a Python int >= the kept total (T - sum of rejected): the
        one host-side number this path needs; it sizes the repacked batch. Rows
        past the kept total are graph padding (PAD slots, never sampled)."""
        packed = prepare_eagle_input(metadata.query_start_loc, num_rejected_tokens, num_kept_tokens)
        index = packed.token_indices.long()
        real = torch.arange(num_kept_tokens, device=index.device) < packed.cu_num_tokens[-1]
        repacked = dataclasses.replace(
            metadata,
            query_start_loc=packed.cu_num_tokens.to(metadata.query_start_loc.dtype),
            seq_lens=metadata.seq_lens - num_rejected_tokens.to(metadata.seq_lens.dtype),
            slot_mapping=self.repack_slots(metadata.slot_mapping, index, real),
        )
        repacked = self.repack_group_slots(repacked, index, real)
        return self.propose(
            target_token_ids.index_select(0, index),
            rows(target_positions, index),
            target_hidden_states.index_select(0, index),
            next_token_ids,
            repacked,
            sampling,
        )
