"""Autoregressive speculator: a small standalone draft LM (token ids in, no target
hidden states) driven by the shared step loop (loop.decode_n_tokens), with the draft split
into a prefill (one pass over the new tokens) and a multi-step decode (K - 1
single-token steps), so an engine can compile or CUDA-graph the decode alone:

    spec = AutoregressiveSpeculator(DraftLM(model), config, kv_caches)
    decode = torch.compile(spec.decode, mode="reduce-overhead")  # one graph, K - 1 steps
    state = spec.prefill(ids, positions, None, next_ids, metadata, sampling)  # eager or compiled
    out = decode(state)

`decode` clones the small [B] state tensors it advances, so the captured graph
mutates none of its inputs (CUDA-graph trees then capture it as is).

Layout of the prefill. A standalone LM must see every token at its own position, so
the target window is not shifted as for EAGLE: request r's kept tokens keep their
ids, positions and slots, and its next token (the one the target just sampled) is
appended at the last kept position + 1 (`copy_and_expand_inputs` with one slot per
request, no shift): T + B tokens. Rejected tokens follow as padding (position 0, no
KV write). Bottom-right causality then needs seq_len + 1 per request. The next
token's slot comes from `step_metadata` at its index in the sequence (the kept
seq_len; with M-RoPE not a positions row, which images compress), clamped at
max_model_len: position 0, PAD.

advance_draft_positions=False (Gemma4-style, constant positions): the first decode
step places draft token 0 one position on, as usual; every later step feeds the
newest draft token at that same position with the same seq_len and the same slot,
computed once (as vLLM's speculator builds its slot mapping once, at step 1). So each
step overwrites one KV slot and never writes past it; the noise key (position) is
the same for every decode step.
"""

import dataclasses
import functools
from dataclasses import dataclass

import torch
from torch import nn

from specdraft.checks import check_shape
from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.layout import PADDING_SLOT_ID, BatchMetadata
from specdraft.ops import copy_and_expand_inputs
from specdraft.proposers.base import Proposer
from specdraft.proposers.draft_sampling import DraftOutput, DraftSampler, allocate_draft_probs, first_row
from specdraft.proposers.loop import (
    StepState,
    TargetWindow,
    WindowPass,
    advance,
    clamp_ids,
    clamp_rows,
    decode_n_tokens,
    first_step_state,
    one_group,
    static_min,
)
from specdraft.proposers.tree import TreeDraftOutput
from specdraft.proposers.tree_build import TreeShape, check_tree_shape
from specdraft.proposers.tree_lm import check_tree_lm, draft_lm_tree


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

    def draft_logits(self, hidden: torch.Tensor, step: int) -> torch.Tensor:
        """Logits over the LM's vocabulary (the target's: no draft vocabulary map)."""
        return self.model.compute_logits(hidden)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids.to(torch.int64)


@dataclass
class PrefillState:
    """What prefill hands to decode: draft token 0, the step state of the token fed
    next (the next token's position, already clamped; its slot; seq_lens), the
    sampler (with its [B, K, V] buffer, step 0 written) and the device step counter
    of the buffer row step 0 wrote."""

    first_tokens: torch.Tensor  # [B] int32: draft token 0
    step: StepState
    sample: DraftSampler
    draft_step: torch.Tensor | None  # 0-dim int64 on the device, or None without a buffer


class AutoregressiveSpeculator(Proposer):
    """Drafts K tokens per request with a standalone draft LM (wrap it in DraftLM).

    advance_draft_positions: True (default) moves every step one position on; False
    keeps positions, seq_lens and slots constant after the first decode step (see
    the module doc). config.return_probs="logits" (or "probs") fills a [B, K, V]
    buffer, one row per step, at a device step counter.
    """

    reads_hidden = False  # a standalone LM takes no target hidden states

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

    @property
    def drafts_trees(self) -> bool:
        """A standalone LM drafts trees (`propose_tree`, specdraft.proposers.tree_lm)."""
        return True

    @property
    def draft_steps(self) -> int:
        """The next token at the kept length, then K - 1 steps (or one slot, held)."""
        return self.num_speculative_tokens if self.advance_draft_positions else 1

    @torch.no_grad()
    def propose(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor | None,
        next_token_ids: torch.Tensor,
        metadata: BatchMetadata,
        sampling: SamplingParams | None = None,
        *,
        token_indices_to_sample: torch.Tensor | None = None,
        num_rejected_tokens: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> DraftOutput:
        """prefill + decode. Arguments as for `prefill`."""
        state = self.prefill(
            target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata, sampling,
            token_indices_to_sample=token_indices_to_sample, num_rejected_tokens=num_rejected_tokens,
            inputs_embeds=inputs_embeds,
        )  # fmt: skip
        return self.decode(state)

    def prefill(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor | None,
        next_token_ids: torch.Tensor,
        metadata: BatchMetadata,
        sampling: SamplingParams | None = None,
        *,
        token_indices_to_sample: torch.Tensor | None = None,
        num_rejected_tokens: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> PrefillState:
        """The draft's pass over the target's window plus each request's next token;
        samples draft token 0.

        target_token_ids [T], target_positions [T] or [3, T] int64, next_token_ids [B],
        metadata: the target's batch (its slots are the draft's too: same block table).
        target_hidden_states: ignored (a standalone LM takes none; the argument keeps
        the proposers' common signature). num_rejected_tokens [B]: tokens at the end of
        each window to drop (at most window - 1); token_indices_to_sample is implied by
        it (each window's last kept token) and ignored. inputs_embeds [T, H]
        (multimodal): used instead of the embedding of target_token_ids; the next token
        is always embedded from its id.
        """
        # token_indices_to_sample is implied by num_rejected_tokens: neither checked nor read.
        h_next_token, state = self.window_pass(
            target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata, sampling,
            num_rejected_tokens=num_rejected_tokens, inputs_embeds=inputs_embeds,
        )  # fmt: skip
        device = next_token_ids.device
        sample = DraftSampler(
            self.config, sampling, allocate_draft_probs(self.config, self.model.config.vocab_size,
                                                        metadata.num_reqs, device)
        )  # fmt: skip
        draft_step = None if sample.probs is None else torch.zeros((), dtype=torch.int64, device=device)
        logits = self.model.compute_logits(h_next_token, spec_step_idx=0)
        return PrefillState(sample.step(logits, state, draft_step), state, sample, draft_step)

    def window_pass(
        self, target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata, sampling=None, *,
        num_rejected_tokens=None, inputs_embeds=None,
    ) -> WindowPass:  # fmt: skip
        """The LM over each request's kept window plus its next token (module doc:
        the layout of the prefill), after the argument checks. Returns the output at
        the next tokens' rows [B, H] and the step state of the token fed after them
        (the next token's position, slot and seq_len; its hidden state): the
        WindowPass an EAGLE head's window pass returns (loop.window_pass)."""
        window = self.checked_window(
            TargetWindow(target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata,
                         num_rejected_tokens=num_rejected_tokens),
            sampling,
        )  # fmt: skip
        metadata, num_tokens = window.metadata, target_token_ids.shape[0]
        if inputs_embeds is not None:
            check_shape("inputs_embeds", inputs_embeds, (num_tokens, self.model.config.hidden_size))
        expanded = copy_and_expand_inputs(
            target_token_ids.contiguous(), first_row(target_positions).contiguous(), next_token_ids,
            metadata.query_start_loc, num_rejected_tokens, num_padding_slots_per_request=1,
            parallel_drafting_token_id=0, shift_input_ids=False, max_query_len=metadata.max_query_len,
        )  # fmt: skip
        last = metadata.query_start_loc[1:].long() - 1
        kept = metadata.seq_lens
        if num_rejected_tokens is not None:
            last = last - num_rejected_tokens.long()
            kept = kept - num_rejected_tokens.to(kept.dtype)
        last = clamp_rows(last, num_tokens)
        # The next token: one step on from the last kept token (position, slot, seq_len).
        state = first_step_state(target_positions, last, kept, None, metadata)
        advance(state, 0, block_size=self.config.block_size, max_model_len=self.config.max_model_len)
        vocab, num_out = self.model.config.vocab_size, expanded.input_ids.shape[0]
        input_ids = clamp_ids(expanded.input_ids, vocab)
        new_index = clamp_rows(expanded.new_token_indices, num_out)
        mapping = clamp_rows(expanded.hidden_state_mapping, num_out)
        embeds = None
        if inputs_embeds is not None:
            embeds = self.model.embed_input_ids(input_ids)
            embeds = embeds.index_copy(0, mapping, inputs_embeds.to(embeds.dtype))
            embeds = embeds.index_copy(0, new_index, self.model.embed_input_ids(clamp_ids(next_token_ids, vocab)))
        h_sample, h_next = self.model(
            input_ids,
            prefill_positions(target_positions, expanded, mapping, new_index, state),
            None,
            prefill_batch(metadata, expanded, mapping, new_index, state, self.config.block_size),
            self.kv_caches,
            spec_step_idx=0,
            inputs_embeds=embeds,
        )
        state.hidden_states = h_next.index_select(0, new_index)
        return WindowPass(h_sample.index_select(0, new_index), state)

    @torch.no_grad()
    def propose_tree(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor | None,
        next_token_ids: torch.Tensor,
        metadata: BatchMetadata,
        shape: TreeShape,
        *,
        token_indices_to_sample: torch.Tensor | None = None,
        num_rejected_tokens: torch.Tensor | None = None,
        return_logprobs: bool = False,
    ) -> TreeDraftOutput:
        """An EAGLE-2 draft tree per request (specdraft.proposers.tree_lm): the
        window pass of `prefill` (same arguments; the root is next_token_ids), then
        shape.depth - 1 steps that feed every request's topk frontier nodes through
        the whole LM with exact tree attention. Returns what EagleProposer.propose_tree
        returns (the drafts are the LM's top-k: deterministic, at any temperature)."""
        check_tree_shape("shape", shape)
        check_tree_lm(self.model)
        root = self.window_pass(target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata,
                                num_rejected_tokens=num_rejected_tokens)  # fmt: skip
        return draft_lm_tree(self.model, self.kv_caches, self.config, root, next_token_ids, shape,
                             return_logprobs=return_logprobs)  # fmt: skip

    def decode(self, state: PrefillState) -> DraftOutput:
        """The K - 1 single-token steps after prefill. Compile / capture this alone:
        `torch.compile(spec.decode, mode="reduce-overhead")`. Leaves `state` as it was
        (the captured graph mutates none of its inputs)."""
        step = state.step
        own = StepState(
            positions=step.positions.clone(),
            clamped_positions=step.clamped_positions.clone(),
            hidden_states=step.hidden_states,
            batch=dataclasses.replace(step.batch, seq_lens=step.batch.seq_lens.clone()),
            seq_index=None if step.seq_index is None else step.seq_index.clone(),
        )
        tokens = decode_n_tokens(
            self.model, self.kv_caches, state.first_tokens, own, state.sample, state.draft_step,
            num_steps=self.num_speculative_tokens,
            advance=functools.partial(
                advance_or_hold, moving=self.advance_draft_positions,
                block_size=self.config.block_size, max_model_len=self.config.max_model_len,
            ),
            attention=one_group,
        )  # fmt: skip
        return DraftOutput(torch.stack(tokens, dim=1), state.sample.probs, state.sample.confidences(len(tokens[0])))


def advance_or_hold(state: StepState, step: int, *, moving: bool, block_size: int, max_model_len: int) -> None:
    """Constant positions (moving=False): only the first decode step moves, to the
    slot every later step overwrites; afterwards positions, seq_lens and the slot stay."""
    if moving or step == 1:
        advance(state, step, block_size=block_size, max_model_len=max_model_len)


def prefill_batch(metadata: BatchMetadata, expanded, mapping, new_index, state: StepState, block_size: int):
    """The prefill pass's batch: every window one token longer (its next token).
    mapping, new_index: expanded's hidden_state_mapping and new_token_indices, clamped."""
    num_reqs = metadata.num_reqs
    device = metadata.slot_mapping.device
    num_out = expanded.input_ids.shape[0]
    slots = torch.full((num_out,), PADDING_SLOT_ID, dtype=torch.int64, device=device)
    slots = slots.index_copy(0, mapping, metadata.slot_mapping.to(torch.int64))
    # The first rejected input token lands on the next token's row: overwritten below.
    slots = torch.where(expanded.is_rejected_token_mask, PADDING_SLOT_ID, slots)
    slots = slots.index_copy(0, new_index, state.batch.slot_mapping)
    reach = metadata.block_table.shape[1] * block_size
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


def prefill_positions(target_positions, expanded, mapping, new_index, state: StepState) -> torch.Tensor:
    """Kept rows keep their (M-RoPE) positions, the next token gets its clamped
    position, rejected rows 0."""
    dim = target_positions.dim() - 1
    shape = (*target_positions.shape[:-1], expanded.input_ids.shape[0])
    out = target_positions.new_zeros(shape).index_copy(dim, mapping, target_positions)
    out = torch.where(expanded.is_rejected_token_mask, 0, out)
    return out.index_copy(dim, new_index, state.clamped_positions.to(out.dtype))
