"""EAGLE / EAGLE-3 / MTP proposer (reference 002), with the two ways into the
loop after the target's verification step:

- padded (no host sync): rejected tokens stay in the batch as padding; each
  request samples after its last accepted token (`propose_padded`);
- unpadded: rejected tokens are dropped and the batch repacked, which needs one
  host-side number, the kept token count (`propose_unpadded`).

With config.parallel_drafting, all K tokens come from one forward pass
(`propose_parallel`): each request's window is expanded with its next token and
K - 1 mask slots (copy_and_expand_inputs, extend_queries_by_n, new_slot_mapping),
and the K drafts are sampled from those K slots at once.
"""

import dataclasses

import torch

from specdraft.config import SamplingParams
from specdraft.layout import PADDING_SLOT_ID, BatchMetadata, window_of
from specdraft.ops import (
    copy_and_expand_inputs,
    extend_queries_by_n,
    new_slot_mapping,
    prepare_eagle_input,
    prepare_inputs_padded,
    prepare_next_token_padded,
)
from specdraft.proposers.base import DraftOutput, Proposer, first_row, rows, static_min


def repack_slots(slot_mapping: torch.Tensor, index: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Slots of the kept tokens; rows past the kept total write nothing (PAD)."""
    return torch.where(real, slot_mapping.index_select(0, index), PADDING_SLOT_ID)


class EagleProposer(Proposer):
    """config.method picks the head family ("eagle", "eagle3", "mtp"); the loop is
    the same for all three (see Proposer)."""

    repack_slots = staticmethod(repack_slots)

    def propose(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        next_token_ids: torch.Tensor,
        metadata: BatchMetadata,
        sampling: SamplingParams | None = None,
        *,
        token_indices_to_sample: torch.Tensor | None = None,
        num_rejected_tokens: torch.Tensor | None = None,
    ) -> DraftOutput:
        """Proposer.propose, or propose_parallel when config.parallel_drafting is set
        (there the sample index is implied: the window end minus num_rejected_tokens)."""
        if self.config.parallel_drafting:
            return self.propose_parallel(
                target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata, sampling,
                num_rejected_tokens=num_rejected_tokens,
            )  # fmt: skip
        return super().propose(
            target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata, sampling,
            token_indices_to_sample=token_indices_to_sample, num_rejected_tokens=num_rejected_tokens,
        )  # fmt: skip

    def propose_parallel(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        next_token_ids: torch.Tensor,
        metadata: BatchMetadata,
        sampling: SamplingParams | None = None,
        *,
        num_rejected_tokens: torch.Tensor | None = None,
        mask_hidden: torch.Tensor | None = None,
    ) -> DraftOutput:
        """All K drafts from one forward pass.

        Request b's window becomes [its kept tokens shifted by one, its next token,
        K - 1 slots of config.parallel_drafting_token_id, its rejected tokens as
        padding]; drafts 0 .. K-1 are sampled from the next-token slot and the mask
        slots. The mask slots' hidden states are `mask_hidden` [H] (default zeros;
        PARD-style heads learn one). Rejected slots write no KV. M-RoPE positions:
        the new slots continue each row from the window's first position (text
        tokens)."""
        self.check_inputs(target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata)
        k, num_reqs = self.num_speculative_tokens, metadata.num_reqs
        qsl = metadata.query_start_loc
        expanded = copy_and_expand_inputs(
            target_token_ids, first_row(target_positions).contiguous(), next_token_ids, qsl, num_rejected_tokens,
            num_padding_slots_per_request=k, parallel_drafting_token_id=self.config.parallel_drafting_token_id,
            shift_input_ids=True, max_query_len=metadata.max_query_len,
        )  # fmt: skip
        extended = extend_queries_by_n(qsl, metadata.seq_lens, k - 1, metadata.max_query_len, metadata.max_seq_len)
        positions = self.expanded_positions(target_positions, expanded, qsl, extended.query_start_loc)
        slot_mapping = new_slot_mapping(
            expanded.positions, expanded.is_rejected_token_mask, extended.query_start_loc, metadata.block_table,
            block_size=self.config.block_size, max_model_len=self.config.max_model_len,
            max_query_len=extended.max_query_len,
        )  # fmt: skip
        hidden = self.expanded_hidden(target_hidden_states, expanded, mask_hidden)
        attn = BatchMetadata(
            query_start_loc=extended.query_start_loc,
            seq_lens=extended.seq_lens,
            block_table=metadata.block_table,
            slot_mapping=slot_mapping,
            max_query_len=extended.max_query_len,
            # Static bound: the extension can't reach past the block table (or max_model_len).
            max_seq_len=static_min(
                static_min(extended.max_seq_len, self.config.max_model_len),
                metadata.block_table.shape[1] * self.config.block_size,
            ),
        )
        h_sample, _ = self.model(expanded.input_ids, positions, hidden, attn, self.kv_caches, spec_step_idx=0)
        index = expanded.new_token_indices.long()  # [B * K], request-major
        logits = self.model.compute_logits(h_sample.index_select(0, index), spec_step_idx=0)
        token_positions = expanded.positions.index_select(0, index) + 1  # each draft's own position
        return self.sample_parallel(logits, token_positions, sampling, num_reqs)

    def expanded_positions(self, target_positions, expanded, query_start_loc, extended_query_start_loc):
        if target_positions.dim() == 1:
            return expanded.positions
        # M-RoPE: every row continues from its own first position of the window.
        starts = query_start_loc[:-1].long()
        offsets = target_positions.index_select(1, starts) - target_positions[:1].index_select(1, starts)  # [3, B]
        num_reqs = starts.shape[0]
        slots = torch.arange(expanded.positions.shape[0], device=expanded.positions.device)
        owner = window_of(slots, extended_query_start_loc[1:].long()).clamp(max=max(num_reqs - 1, 0))
        shifted = expanded.positions[None] + offsets.index_select(1, owner)
        return torch.where(expanded.is_rejected_token_mask[None], 0, shifted)

    def expanded_hidden(self, target_hidden_states, expanded, mask_hidden):
        hidden = self.model.combine_hidden_states(target_hidden_states)
        out = hidden.new_zeros(expanded.input_ids.shape[0], hidden.shape[1])
        out = out.index_copy(0, expanded.hidden_state_mapping.long(), hidden)
        fill = hidden.new_zeros(hidden.shape[1]) if mask_hidden is None else mask_hidden.to(hidden.dtype)
        return torch.where(expanded.is_masked_token_mask[:, None], fill, out)

    def sample_parallel(self, logits, token_positions, sampling: SamplingParams | None, num_reqs: int) -> DraftOutput:
        """The B * K drafts in one call (request-major rows): the [B, K, V] buffer is
        filled as B * K requests of one step each."""
        k = self.num_speculative_tokens
        probs_out = self.allocate_probs(num_reqs, logits.device)
        rows_out, step = None, None
        if probs_out is not None:
            rows_out = probs_out.view(num_reqs * k, 1, -1)
            step = torch.zeros((), dtype=torch.int64, device=logits.device)
        tokens = self.draft_tokens(logits, token_positions, sampling, rows_out, step, repeat=k)
        return DraftOutput(tokens.view(num_reqs, k), probs_out)

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
