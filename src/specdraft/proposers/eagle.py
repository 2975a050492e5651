"""EAGLE / EAGLE-3 / MTP proposer: a first pass over the target's windows (ids
shifted by one, each request's next token at its sample index), then K - 1
single-token steps (specdraft.proposers.loop.draft_k_tokens). config.method picks the
head family; the loop is the same for all three.

With config.parallel_drafting, all K tokens come from one forward pass
(`propose_parallel`): each request's window is expanded with its next token and
K - 1 mask slots (copy_and_expand_inputs, extend_queries_by_n, new_slot_mapping),
and the K drafts are sampled from those K slots at once.
"""

import functools

import torch

from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.layout import BatchMetadata, window_of
from specdraft.ops import copy_and_expand_inputs, extend_queries_by_n, new_slot_mapping
from specdraft.proposers.base import Proposer
from specdraft.proposers.checks import check_method
from specdraft.proposers.draft_sampling import DraftOutput, first_row, sample_per_request
from specdraft.proposers.loop import TargetWindow, advance, clamp_ids, clamp_rows, draft_k_tokens, static_min
from specdraft.proposers.tree import TreeDraftOutput, draft_tree
from specdraft.proposers.tree_build import TreeShape, check_tree_shape


def sequence_index(target_positions, query_start_loc, seq_lens) -> torch.Tensor:
    """[T] int64: each target token's index in its sequence, where its KV lives. A
    window is the last tokens of its request's seq_lens; 1-D positions are that index
    already, M-RoPE rows are not (an image advances them by less than its length).
    Tokens past the batch get their own row number (their slots are padding anyway)."""
    if target_positions.dim() == 1:
        return target_positions
    token = torch.arange(target_positions.shape[1], device=target_positions.device)
    ends = query_start_loc[1:].long()
    owner = window_of(token, ends)  # B past the batch: the appended zero entries
    lens = torch.cat([seq_lens.long(), ends.new_zeros(1)])
    ends = torch.cat([ends, ends.new_zeros(1)])
    return lens.index_select(0, owner) - ends.index_select(0, owner) + token


class EagleProposer(Proposer):
    """Drafts K tokens per request with an EAGLE-1, EAGLE-3 or MTP head
    (specdraft.models.heads): `propose`, or after verification `propose_padded` /
    `propose_unpadded` (specdraft.proposers.base.Proposer)."""

    drafts_fewer = True

    def __init__(self, model: torch.nn.Module, config: SpeculativeConfig, kv_caches: list[torch.Tensor]) -> None:
        super().__init__(model, config, kv_caches)
        check_method(model, config.method)
        if config.method == "block":  # a block head has no single-token step to loop over
            raise ValueError("config.method 'block': block drafters (DFlash, DSpark) draft with BlockProposer")
        token, vocab = config.parallel_drafting_token_id, model.config.vocab_size
        if config.parallel_drafting and token >= vocab:
            raise ValueError(f"parallel_drafting_token_id = {token} is outside the head's vocabulary [0, {vocab})")

    @torch.no_grad()
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
        """Draft K tokens for each of the B requests.

        target_token_ids [T] int, target_positions [T] int64 or M-RoPE [3, T],
        target_hidden_states [T, H_target] (EAGLE-3: the aux layers concatenated),
        next_token_ids [B]: the token the target just sampled for each request.
        token_indices_to_sample [B]: where each request's next token goes (default:
        the last token of its window; the padded path after rejection points at the
        last accepted token, see `prepare_inputs_padded`). num_rejected_tokens [B]:
        tokens of each window past that index (default 0); they are drafted over as
        padding and dropped from seq_lens for the later steps. With
        config.parallel_drafting the sample index is implied (the window end minus
        num_rejected_tokens): see `propose_parallel`.
        """
        if self.config.parallel_drafting:
            return self.propose_parallel(
                target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata, sampling,
                num_rejected_tokens=num_rejected_tokens,
            )  # fmt: skip
        window = self.checked_window(
            TargetWindow(target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata,
                         token_indices_to_sample, num_rejected_tokens),
            sampling,
        )  # fmt: skip
        return draft_k_tokens(
            self.model, self.kv_caches, self.config, window, sampling,
            advance=functools.partial(advance, block_size=self.config.block_size,
                                      max_model_len=self.config.max_model_len),
        )  # fmt: skip

    @property
    def drafts_trees(self) -> bool:
        """EAGLE-1 and EAGLE-3 heads draft trees (the EAGLE loop's step, fed a frontier);
        MTP heads draft chains only."""
        return self.config.method != "mtp" and self.model.draft_loop == "eagle"

    @torch.no_grad()
    def propose_tree(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        next_token_ids: torch.Tensor,
        metadata: BatchMetadata,
        shape: TreeShape,
        *,
        token_indices_to_sample: torch.Tensor | None = None,
        num_rejected_tokens: torch.Tensor | None = None,
        return_logprobs: bool = False,
    ) -> TreeDraftOutput:
        """An EAGLE-2 draft tree per request (specdraft.proposers.tree): the same
        window arguments as `propose`, then shape (depth, topk, num_verify_tokens).
        EAGLE-1 and EAGLE-3 heads; MTP heads draft chains only. The tree's children
        are the draft's topk likeliest tokens, so there is no sampling to seed."""
        if not self.drafts_trees:
            raise ValueError(f"draft trees need an EAGLE-1 or EAGLE-3 head; method {self.config.method!r} drafts "
                             "chains only (propose)")  # fmt: skip
        check_tree_shape("shape", shape)
        window = self.checked_window(
            TargetWindow(target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata,
                         token_indices_to_sample, num_rejected_tokens),
            None,
        )  # fmt: skip
        return draft_tree(self.model, self.kv_caches, self.config, window, shape, return_logprobs=return_logprobs)

    @torch.no_grad()
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
        PARD-style heads learn one). Rejected slots write no KV. Slots and the
        max_model_len limit follow each token's index in its sequence (the window
        is the last tokens of seq_lens); with M-RoPE that is not a positions row
        (images compress them). M-RoPE rotary positions: see `expanded_positions`."""
        window = self.checked_window(
            TargetWindow(target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata,
                         num_rejected_tokens=num_rejected_tokens),
            sampling,
        )  # fmt: skip
        metadata = window.metadata
        k, num_reqs = self.num_speculative_tokens, metadata.num_reqs
        qsl = metadata.query_start_loc
        seq_index = sequence_index(target_positions, qsl, metadata.seq_lens)
        expanded = copy_and_expand_inputs(
            target_token_ids, seq_index, next_token_ids, qsl, num_rejected_tokens,
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
        input_ids = clamp_ids(expanded.input_ids, self.model.config.vocab_size)
        h_sample, _ = self.model(input_ids, positions, hidden, attn, self.kv_caches, spec_step_idx=0)
        index = clamp_rows(expanded.new_token_indices, input_ids.shape[0])  # [B * K], request-major
        logits = self.model.compute_logits(h_sample.index_select(0, index), spec_step_idx=0)
        token_positions = first_row(positions).index_select(0, index) + 1  # each draft's own position
        return sample_per_request(self.config, sampling, logits, token_positions, num_reqs,
                                  self.model.config.vocab_size)  # fmt: skip

    def expanded_positions(self, target_positions, expanded, query_start_loc, extended_query_start_loc):
        """The rotary positions of the expanded window. 1-D: `expanded.positions`.
        M-RoPE: a slot holding input token t's hidden state keeps t's rows (whatever
        an image did to them); the parallel slots continue every row of the bonus
        slot's (the last kept token's) by one per slot, as text does."""
        if target_positions.dim() == 1:
            return expanded.positions
        starts = query_start_loc.long()  # B + 1 entries: owner B is the tail past the batch
        ext = extended_query_start_loc.long()
        slots = torch.arange(expanded.positions.shape[0], device=ext.device)
        owner = window_of(slots, ext[1:])
        new = clamp_rows(expanded.new_token_indices, slots.shape[0])
        bonus = torch.cat([new.view(-1, self.num_speculative_tokens)[:, 0], ext[-1:]])
        j = slots - ext.index_select(0, owner)  # offset in the window
        held = torch.minimum(j, bonus.index_select(0, owner) - ext.index_select(0, owner))
        source = (starts.index_select(0, owner) + held).clamp(0, target_positions.shape[1] - 1)
        rows = target_positions.index_select(1, source) + (j - held)[None]
        return torch.where(expanded.is_rejected_token_mask[None], 0, rows)

    def expanded_hidden(self, target_hidden_states, expanded, mask_hidden):
        hidden = self.model.combine_hidden_states(target_hidden_states)
        out = hidden.new_zeros(expanded.input_ids.shape[0], hidden.shape[1])
        out = out.index_copy(0, clamp_rows(expanded.hidden_state_mapping, out.shape[0]), hidden)
        fill = hidden.new_zeros(hidden.shape[1]) if mask_hidden is None else mask_hidden.to(hidden.dtype)
        return torch.where(expanded.is_masked_token_mask[:, None], fill, out)
