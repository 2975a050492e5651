"""Autoregressive speculator (reference 004): a small standalone draft LM (token ids
in, no target hidden states) driven by the shared step hooks, with the draft split
into a prefill (one pass over the new tokens) and a multi-step decode (K - 1
single-token steps), so an engine can compile or CUDA-graph the decode alone:

    spec = AutoregressiveSpeculator(DraftLM(model), config, kv_caches)
    decode = torch.compile(spec.decode, mode="reduce-overhead")  # one graph, K - 1 steps
    state = spec.prefill(ids, positions, next_ids, metadata, sampling)  # eager or compiled
    out = decode(state)

`decode` clones the small [B] state tensors it advances, so the captured graph
mutates none of its inputs (CUDA-graph trees then capture it as is).

Layout of the prefill. A standalone LM must see every token at its own position, so
the target window is not shifted as for EAGLE: request r's kept tokens keep their
ids, positions and slots, and its next token (the one the target just sampled) is
appended at the last kept position + 1 (`copy_and_expand_inputs` with one slot per
request, no shift): T + B tokens. Rejected tokens follow as padding (position 0, no
KV write). Bottom-right causality then needs seq_len + 1 per request. The next
token's slot comes from `step_metadata` (clamped at max_model_len: position 0, PAD).

advance_draft_positions=False (Gemma4-style, constant positions): the first decode
step places draft token 0 one position on, as usual; every later step feeds the
newest draft token at that same position with the same seq_len and the same slot,
computed once (as the reference builds its slot mapping once, at step 1). So each
step overwrites one KV slot and never writes past it; the noise key (position) is
the same for every decode step.
"""

from dataclasses import dataclass

import torch
from torch import nn

from specdraft.checks import check_shape
from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.layout import PADDING_SLOT_ID, BatchMetadata
from specdraft.ops import copy_and_expand_inputs
from specdraft.proposers.base import DraftOutput, Proposer, StepState, first_row, rows, static_min


class DraftLM(nn.Module):
    """Gives a standalone LM the draft-head interface the proposers drive:
    forward(input_ids, positions, hidden_states, attn_metadata, kv_caches,
    spec_step_idx=0, inputs_embeds=None) -> (h_sample, h_next), compute_logits(h,
    spec_step_idx). hidden_states is ignored (the LM takes none).

    model: forward(input_ids, positions, attn_metadata, kv_caches, inputs_embeds=None),
    compute_logits(h), embed_tokens, num_kv_layers, config (e.g. TinyTargetModel).
    model_returns_tuple: True when forward returns a tuple (last_hidden, hidden); a
    None second element (TinyTargetModel's aux) means "the same tensor". False: one
    tensor used for both.
    """

    def __init__(self, model: nn.Module, model_returns_tuple: bool = True) -> None:
        super().__init__()
        self.model = model
        self.model_returns_tuple = model_returns_tuple

    @property
    def config(self):
        return self.model.config

    @property
    def num_kv_layers(self) -> int:
        return self.model.num_kv_layers

    def allocate_kv_caches(self, num_blocks: int, block_size: int, device=None, dtype=None) -> list[torch.Tensor]:
        return self.model.allocate_kv_caches(num_blocks, block_size, device, dtype)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states

    def forward(
        self, input_ids, positions, hidden_states, attn_metadata, kv_caches, spec_step_idx: int = 0, inputs_embeds=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids, positions, attn_metadata, kv_caches, inputs_embeds=inputs_embeds)
        if not self.model_returns_tuple:
            return out, out
        last, hidden = out[0], out[1]
        return last, last if hidden is None else hidden

    def compute_logits(self, hidden: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        return self.model.compute_logits(hidden)


@dataclass
class DecodeState:
    """What prefill hands to decode: the first draft token and the step state of
    the token fed next (positions of the next token, already clamped; slots; seq_lens)."""

    first_tokens: torch.Tensor  # [B] int32: draft token 0
    step: StepState
    metadata: BatchMetadata  # the prefill batch (decode reads its block table)
    sampling: SamplingParams | None
    draft_probs: torch.Tensor | None  # [B, K, V] fp32, step 0 written
    draft_step: torch.Tensor  # 0-dim int64 on the device: the step index sampling writes at


@dataclass
class ConstantStepState(StepState):
    advanced: bool = False  # a trace-time flag: has the one advance of constant mode run


class AutoregressiveSpeculator(Proposer):
    """Drafts K tokens per request with a standalone draft LM (wrap it in DraftLM).

    advance_draft_positions: True (default) moves every step one position on; False
    keeps positions, seq_lens and slots constant after the first decode step (see
    the module doc). config.return_probs="logits" (or "probs") fills a [B, K, V]
    buffer, one row per step, at a device step counter.
    """

    def __init__(
        self,
        model: nn.Module,
        config: SpeculativeConfig,
        kv_caches: list[torch.Tensor],
        *,
        advance_draft_positions: bool = True,
    ) -> None:
        super().__init__(model, config, kv_caches)
        self.advance_draft_positions = advance_draft_positions

    # -------------------------------------------------------------- public API

    def propose(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        next_token_ids: torch.Tensor,
        metadata: BatchMetadata,
        sampling: SamplingParams | None = None,
        *,
        num_rejected_tokens: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> DraftOutput:
        """prefill + decode. Arguments as for `prefill`."""
        state = self.prefill(
            target_token_ids,
            target_positions,
            next_token_ids,
            metadata,
            sampling,
            num_rejected_tokens=num_rejected_tokens,
            inputs_embeds=inputs_embeds,
        )
        return self.decode(state)

    def prefill(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        next_token_ids: torch.Tensor,
        metadata: BatchMetadata,
        sampling: SamplingParams | None = None,
        *,
        num_rejected_tokens: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> DecodeState:
        """The draft's pass over the target's window plus each request's next token;
        samples draft token 0.

        target_token_ids [T], target_positions [T] or [3, T] int64, next_token_ids [B],
        metadata: the target's batch (its slots are the draft's too: same block table).
        num_rejected_tokens [B]: tokens at the end of each window to drop (at most
        window - 1). inputs_embeds [T, H] (multimodal): used instead of the embedding
        of target_token_ids; the next token is always embedded from its id.
        """
        self.check_prefill_inputs(target_token_ids, target_positions, next_token_ids, metadata, inputs_embeds)
        num_reqs = metadata.num_reqs
        expanded = copy_and_expand_inputs(
            target_token_ids.contiguous(),
            first_row(target_positions).contiguous(),
            next_token_ids,
            metadata.query_start_loc,
            num_rejected_tokens,
            num_padding_slots_per_request=1,
            parallel_drafting_token_id=0,
            shift_input_ids=False,
            max_query_len=metadata.max_query_len,
        )
        kept = (
            metadata.seq_lens
            if num_rejected_tokens is None
            else metadata.seq_lens - num_rejected_tokens.to(metadata.seq_lens.dtype)
        )
        last = metadata.query_start_loc[1:].long() - 1
        if num_rejected_tokens is not None:
            last = last - num_rejected_tokens.long()
        state = self.next_token_state(rows(target_positions, last), kept, metadata)
        new_index = expanded.new_token_indices.long()
        pass_metadata = self.prefill_metadata(metadata, expanded, new_index, state)
        embeds = None
        if inputs_embeds is not None:
            embeds = self.model.embed_input_ids(expanded.input_ids)
            embeds = embeds.index_copy(0, expanded.hidden_state_mapping.long(), inputs_embeds.to(embeds.dtype))
            embeds = embeds.index_copy(0, new_index, self.model.embed_input_ids(next_token_ids))
        h_sample, h_next = self.model(
            expanded.input_ids,
            self.prefill_positions(target_positions, expanded, new_index, state),
            None,
            self.attention_metadata(pass_metadata),
            self.kv_caches,
            spec_step_idx=0,
            inputs_embeds=embeds,
        )
        state.hidden_states = h_next.index_select(0, new_index)
        draft_step = torch.zeros((), dtype=torch.int64, device=next_token_ids.device)
        probs = self.allocate_probs(num_reqs, next_token_ids.device)
        logits = self.model.compute_logits(h_sample.index_select(0, new_index), spec_step_idx=0)
        first = self.sample_at(logits, state, sampling, probs, draft_step)
        return DecodeState(first, state, metadata, sampling, probs, draft_step)

    def decode(self, state: DecodeState) -> DraftOutput:
        """The K - 1 single-token steps after prefill. Compile / capture this alone:
        `torch.compile(spec.decode, mode="reduce-overhead")`. Leaves `state` as it was."""
        step_state = self.clone_step_state(state.step)
        draft_step = state.draft_step.clone()
        probs = state.draft_probs
        tokens = [state.first_tokens]
        for step in range(1, self.num_speculative_tokens):
            self.advance(step_state, state.metadata)
            h_sample, step_state.hidden_states = self.model(
                tokens[-1],
                step_state.clamped_positions,
                step_state.hidden_states,
                self.attention_metadata(self.step_metadata(step_state, state.metadata)),
                self.kv_caches,
                spec_step_idx=step,
            )
            draft_step.add_(1)
            logits = self.model.compute_logits(h_sample, spec_step_idx=step)
            tokens.append(self.sample_at(logits, step_state, state.sampling, probs, draft_step))
        return DraftOutput(torch.stack(tokens, dim=1), probs)

    # ------------------------------------------------------------------- hooks

    def advance(self, state: StepState, metadata: BatchMetadata) -> None:
        """Constant mode: only the first decode step moves (to the slot every later
        step overwrites); afterwards positions, seq_lens and the slot stay."""
        if self.advance_draft_positions or not getattr(state, "advanced", False):
            super().advance(state, metadata)
            state.advanced = True

    # ------------------------------------------------------------------- steps

    def next_token_state(self, last_positions, kept_seq_lens, metadata: BatchMetadata) -> ConstantStepState:
        """The next token's position (last kept + 1, clamped), slot and seq_len: one
        step_metadata step from the last kept token."""
        num_reqs = metadata.num_reqs
        state = ConstantStepState(
            positions=last_positions.clone(),
            clamped_positions=torch.empty_like(last_positions),
            seq_lens=kept_seq_lens.clone(),
            slot_mapping=torch.empty(num_reqs, dtype=torch.int64, device=last_positions.device),
            hidden_states=None,
            max_seq_len=metadata.max_seq_len,
        )
        Proposer.advance(self, state, metadata)
        return state

    def prefill_metadata(self, metadata, expanded, new_index, state: StepState) -> BatchMetadata:
        num_reqs = metadata.num_reqs
        device = metadata.slot_mapping.device
        mapping = expanded.hidden_state_mapping.long()
        num_out = expanded.input_ids.shape[0]
        slots = torch.full((num_out,), PADDING_SLOT_ID, dtype=torch.int64, device=device)
        slots = slots.index_copy(0, mapping, metadata.slot_mapping.to(torch.int64))
        # The first rejected input token lands on the next token's row: overwritten below.
        slots = torch.where(expanded.is_rejected_token_mask, PADDING_SLOT_ID, slots)
        slots = slots.index_copy(0, new_index, state.slot_mapping)
        reach = metadata.block_table.shape[1] * self.config.block_size
        return BatchMetadata(
            query_start_loc=metadata.query_start_loc
            + torch.arange(num_reqs + 1, dtype=metadata.query_start_loc.dtype, device=device),
            # Bottom-right causality: the window grew by one, rejected rows sit after
            # the next token, so every kept row keeps its sequence index.
            seq_lens=metadata.seq_lens + 1,
            block_table=metadata.block_table,
            slot_mapping=slots,
            max_query_len=metadata.max_query_len + 1,
            max_seq_len=static_min(metadata.max_seq_len + 1, reach),
        )

    @staticmethod
    def prefill_positions(target_positions, expanded, new_index, state: StepState) -> torch.Tensor:
        """Kept rows keep their (M-RoPE) positions, the next token gets its clamped
        position, rejected rows 0."""
        dim = target_positions.dim() - 1
        shape = (*target_positions.shape[:-1], expanded.input_ids.shape[0])
        out = target_positions.new_zeros(shape).index_copy(dim, expanded.hidden_state_mapping.long(), target_positions)
        out = torch.where(expanded.is_rejected_token_mask, 0, out)
        return out.index_copy(dim, new_index, state.clamped_positions.to(out.dtype))

    @staticmethod
    def clone_step_state(step: StepState) -> ConstantStepState:
        return ConstantStepState(
            positions=step.positions.clone(),
            clamped_positions=step.clamped_positions.clone(),
            seq_lens=step.seq_lens.clone(),
            slot_mapping=step.slot_mapping.clone(),
            hidden_states=step.hidden_states,
            max_seq_len=step.max_seq_len,
        )

    def sample_at(self, logits, state: StepState, sampling: SamplingParams | None, probs_out, draft_step):
        """As Proposer.sample, with the buffer row chosen by a device step counter."""
        return self.draft_tokens(logits, first_row(state.positions) + 1, sampling, probs_out, draft_step)

    # ------------------------------------------------------------------ checks

    def check_prefill_inputs(self, target_token_ids, target_positions, next_token_ids, metadata, inputs_embeds):
        num_tokens = self.check_batch(target_token_ids, target_positions, next_token_ids, metadata)
        if inputs_embeds is not None:
            hidden = self.model.config.hidden_size
            check_shape("inputs_embeds", inputs_embeds, (num_tokens, hidden))
