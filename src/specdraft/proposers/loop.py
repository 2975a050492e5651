"""The propose loop, as free functions that read top to bottom:

    draft_k_tokens   window_pass -> sample -> decode_n_tokens         (EAGLE, EAGLE-3, MTP)
    window_pass      shift ids -> first_pass -> first step state      (shared with the tree, tree.py)
    decode_n_tokens  K - 1 times: advance -> decode_one_token -> sample
    draft_chained    K whole-window passes, one MTP layer each        (multi-layer EAGLE)

Each proposer (a thin holder of head, config and KV caches) builds its first pass and
passes in what differs: the `advance` rule (one KV group, several groups, constant
positions) and the `attention` metadata per layer (one group, or a list per layer).

Everything is tensors in, tensors out, with Python ints for static bounds:
`torch.compile(proposer.propose, fullgraph=True)` traces the whole loop (K is a
Python int, so the loop unrolls), with no host sync.

Whatever the values (unchecked mode; checked mode refuses them first), nothing reads
or writes outside its tensor: every index this loop derives from device values is
clamped into the tensor it indexes (`clamp_rows`), token ids into the vocabulary
(`clamp_ids`), and temperatures that are not > 0 (NaN included) sample greedily.
Slots and block ids outside the KV cache are the cache write's and attention's to
skip or clamp.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.layout import PADDING_SLOT_ID, BatchMetadata, position_rows
from specdraft.ops import step_metadata

from .draft_sampling import DraftOutput, DraftSampler, allocate_draft_probs, first_row, step_counter


class TargetWindow(NamedTuple):
    """What `propose` receives from the target, bundled once so the checks and the
    loop take one argument (the public signature stays vLLM's flat one).

    token_ids [T], positions [T] or M-RoPE [3, T], hidden_states [T, H_target] (None
    for a draft that reads none), next_token_ids [B], metadata: the target's batch.
    token_indices_to_sample [B] (default: each window's last token) and
    num_rejected_tokens [B] (default 0): where each request samples after
    verification, and the rejected tokens after it."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    hidden_states: torch.Tensor | None
    next_token_ids: torch.Tensor
    metadata: BatchMetadata
    token_indices_to_sample: torch.Tensor | None = None
    num_rejected_tokens: torch.Tensor | None = None


@dataclass
class StepState:
    """What one single-token draft step reads and advances.

    positions: [B] or [3, B] running positions of the token fed next (unclamped, so a
    request past max_model_len never wraps onto its own block 0); clamped_positions:
    what the model sees; hidden_states [B, H]; batch: the step's batch (one query
    token per request: seq_lens, slot_mapping, max_seq_len advance every step);
    seq_index [B] int64 (M-RoPE only, else None): the fed token's running index in its
    sequence, which decides the KV slot and the clamp (M-RoPE rows are compressed over
    images, so none of them is that index; see `step_metadata`).
    """

    positions: torch.Tensor
    clamped_positions: torch.Tensor
    hidden_states: torch.Tensor
    batch: BatchMetadata
    seq_index: torch.Tensor | None = None


class WindowPass(NamedTuple):
    """What a draft's pass over the target's window leaves for drafting, chain or
    tree alike: hidden [B, H], the output at each request's sampled row (draft token
    0's logits, or the tree root's, come from it), and the step state of the token
    fed next (its hidden state; the request's position, seq_len and batch)."""

    hidden: torch.Tensor
    state: StepState


Advance = Callable[[StepState, int], None]
Attention = Callable[[BatchMetadata], object]


# ----------------------------------------------------------------------------- small steps


def clamp_rows(index: torch.Tensor, num_rows) -> torch.Tensor:
    """An index into num_rows rows, out-of-range entries moved to the nearest row
    (int64). In contract a no-op; num_rows >= 1 wherever an index is non-empty."""
    return index.long().clamp(0, num_rows - 1)


def clamp_ids(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Token ids moved into [0, vocab_size) before they index an embedding."""
    return token_ids.clamp(0, vocab_size - 1)


def static_min(a, b):
    """min of two static bounds: plain ints stay ints (torch 2.11's Dynamo cannot
    trace torch.sym_min on them); SymInts stay symbolic (no guard)."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return torch.sym_min(a, b)


def shift_input_ids(target_token_ids, next_token_ids, sample_index) -> torch.Tensor:
    """[a1, b1, b2, c1, c2] -> [b1, b2, c1, c2, c2], then each request's next token at
    its sample index: the draft predicts token t+1 from token t+1's embedding and
    token t's hidden state."""
    shifted = torch.cat([target_token_ids[1:], target_token_ids[-1:]])
    return shifted.index_copy(0, sample_index, next_token_ids.to(shifted.dtype))


def sample_rows(metadata: BatchMetadata, token_indices_to_sample, num_rejected_tokens):
    """Where each request samples (default: its window's last token; clamped into the
    batch's rows) and its seq_len once the rejected tokens at the window's end are
    dropped."""
    if token_indices_to_sample is None:
        token_indices_to_sample = metadata.query_start_loc[1:] - 1
    seq_lens = metadata.seq_lens
    if num_rejected_tokens is not None:
        seq_lens = seq_lens - num_rejected_tokens.to(seq_lens.dtype)
    return clamp_rows(token_indices_to_sample, metadata.slot_mapping.shape[0]), seq_lens


def single_token_batch(metadata: BatchMetadata, seq_lens, slot_mapping, max_seq_len) -> BatchMetadata:
    """The batch of one draft step: one query token per request. Fields the step does
    not change (block tables, and any a subclass of BatchMetadata adds) carry over."""
    num_reqs = metadata.num_reqs
    return dataclasses.replace(
        metadata,
        query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32, device=seq_lens.device),
        seq_lens=seq_lens,
        slot_mapping=slot_mapping,
        max_query_len=1,
        max_seq_len=max_seq_len,
    )


def first_step_state(positions, sample_index, seq_lens, hidden, metadata: BatchMetadata) -> StepState:
    """The state before step 1: each request sits on its sampled token, the last of
    its seq_lens tokens (index seq_len - 1, whatever its M-RoPE positions say)."""
    sampled = position_rows(positions, sample_index)
    pad = torch.full((metadata.num_reqs,), PADDING_SLOT_ID, dtype=torch.int64, device=sampled.device)
    batch = single_token_batch(metadata, seq_lens.clone(), pad, metadata.max_seq_len)
    seq_index = seq_lens.long() - 1 if positions.dim() == 2 else None
    return StepState(positions=sampled, clamped_positions=sampled, hidden_states=hidden, batch=batch,
                     seq_index=seq_index)  # fmt: skip


def advance(state: StepState, step: int, *, block_size: int, max_model_len: int) -> None:
    """The default rule: every request one token on: positions + 1, its KV slot from
    the block table at its sequence index, seq_len + 1 (clamped where the index
    reaches max_model_len: position 0, PAD slot, seq_len 1)."""
    batch = state.batch
    slots = torch.empty_like(batch.slot_mapping)
    clamped = torch.empty_like(state.positions)
    seq_lens = batch.seq_lens.clone()
    step_metadata(
        state.positions, seq_lens, batch.block_table, slots, clamped, block_size=block_size,
        max_model_len=max_model_len, seq_index=state.seq_index,
    )  # fmt: skip
    # A static bound (a Python int or SymInt), never read from the device.
    reach = batch.block_table.shape[1] * block_size
    max_seq_len = static_min(static_min(batch.max_seq_len + 1, max_model_len), reach)
    state.clamped_positions = clamped
    state.batch = single_token_batch(batch, seq_lens, slots, max_seq_len)


def one_group(batch: BatchMetadata) -> BatchMetadata:
    """Attention metadata when every draft layer shares one KV-cache group."""
    return batch


# ---------------------------------------------------------------------------------- loop


def first_pass(model, kv_caches, input_ids, positions, hidden_states, attention_metadata, sample_index):
    """The draft's forward over every window token; rows at the sample indices of
    (hidden for sampling, hidden for the next step)."""
    h_sample, h_next = model(input_ids, positions, hidden_states, attention_metadata, kv_caches, spec_step_idx=0)
    return h_sample.index_select(0, sample_index), h_next.index_select(0, sample_index)


def window_pass(model, kv_caches, window: TargetWindow, attention: Attention = one_group) -> WindowPass:
    """EAGLE's pass over the target's windows, shared by the chain and the tree: ids
    shifted by one (each request's next token at its sample index), the first pass,
    and the state of every request sitting on its sampled token.
    window.metadata's max_seq_len is resolved (`resolve_max_seq_len`)."""
    metadata, positions = window.metadata, window.positions
    sample_index, seq_lens = sample_rows(metadata, window.token_indices_to_sample, window.num_rejected_tokens)
    shifted = shift_input_ids(window.token_ids, window.next_token_ids, sample_index)
    input_ids = clamp_ids(shifted, model.config.vocab_size)
    hidden_states = model.combine_hidden_states(window.hidden_states)
    h_sample, h_next = first_pass(
        model, kv_caches, input_ids, positions, hidden_states, attention(metadata), sample_index
    )
    return WindowPass(h_sample, first_step_state(positions, sample_index, seq_lens, h_next, metadata))


def decode_one_token(model, kv_caches, token_ids, state: StepState, attention: Attention, step: int):
    """One single-token forward of every request; returns its logits."""
    h_sample, state.hidden_states = model(
        token_ids, state.clamped_positions, state.hidden_states, attention(state.batch), kv_caches, spec_step_idx=step
    )
    return model.compute_logits(h_sample, spec_step_idx=step)


def decode_n_tokens(
    model, kv_caches, first_tokens, state: StepState, sample: DraftSampler, step_index, *, num_steps: int,
    advance: Advance, attention: Attention,
) -> list[torch.Tensor]:  # fmt: skip
    """Draft tokens 1 .. num_steps - 1 after `first_tokens` (token 0). step_index: the
    buffer row of token 0 (a device counter, so a decode compiled alone writes the
    right rows), or None."""
    tokens = [first_tokens]
    for step in range(1, num_steps):
        advance(state, step)
        logits = decode_one_token(model, kv_caches, tokens[-1], state, attention, step)
        step_index = None if step_index is None else step_index + 1
        tokens.append(sample.step(logits, state, step_index))
    return tokens


def draft_k_tokens(
    model, kv_caches, config: SpeculativeConfig, window: TargetWindow, sampling: SamplingParams | None, *,
    advance: Advance, attention: Attention = one_group,
) -> DraftOutput:  # fmt: skip
    """EAGLE's loop: the window pass (`window_pass`), then K - 1 single-token steps.
    window.metadata's max_seq_len is resolved (`resolve_max_seq_len`)."""
    num_reqs, device = window.metadata.num_reqs, window.token_ids.device
    h_sample, state = window_pass(model, kv_caches, window, attention)
    sample = DraftSampler(config, sampling, allocate_draft_probs(config, model.config.vocab_size, num_reqs, device))
    step_index = step_counter(sample.probs, 0, device)
    first = sample.step(model.compute_logits(h_sample, spec_step_idx=0), state, step_index)
    tokens = decode_n_tokens(
        model, kv_caches, first, state, sample, step_index,
        num_steps=config.num_speculative_tokens, advance=advance, attention=attention,
    )  # fmt: skip
    return DraftOutput(torch.stack(tokens, dim=1), sample.probs, sample.confidences(num_reqs))


def draft_chained(
    model, kv_caches, config: SpeculativeConfig, input_ids, positions, hidden_states, metadata: BatchMetadata,
    sample_index, sampling: SamplingParams | None,
) -> DraftOutput:  # fmt: skip
    """Multi-layer EAGLE: pass k runs MTP layer k over the whole window.

    pass 0 reads `input_ids` (already shifted by one, next token at the sample index);
    pass k reads pass k-1's ids shifted by one more, with draft token k-1 at the sample
    index, and pass k-1's output hidden states (every row). Positions, slots and
    seq_lens stay those of pass 0, so layer k at position p reads the token at
    p + k + 1 and writes its own KV for the whole window. Draft token k is sampled
    from the sample row of pass k; its noise is keyed by its position (sample row's
    position + 1 + k)."""
    num_reqs, device = metadata.num_reqs, hidden_states.device
    sample = DraftSampler(config, sampling, allocate_draft_probs(config, model.config.vocab_size, num_reqs, device))
    token_positions = first_row(position_rows(positions, sample_index)) + 1
    tokens: list[torch.Tensor] = []
    for step in range(config.num_speculative_tokens):
        if step:
            input_ids = shift_input_ids(input_ids, tokens[-1], sample_index)
        h_sample, hidden_states = model(input_ids, positions, hidden_states, metadata, kv_caches, spec_step_idx=step)
        logits = model.compute_logits(h_sample.index_select(0, sample_index), spec_step_idx=step)
        tokens.append(sample(logits, token_positions + step, step_counter(sample.probs, step, device)))
    return DraftOutput(torch.stack(tokens, dim=1), sample.probs, sample.confidences(num_reqs))
