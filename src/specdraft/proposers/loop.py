"""The propose loop, as free functions that read top to bottom:

    draft_k_tokens   first_pass -> sample -> decode_n_tokens          (EAGLE, EAGLE-3, MTP)
    decode_n_tokens  K - 1 times: advance -> decode_one_token -> sample
    draft_chained    K whole-window passes, one MTP layer each        (multi-layer EAGLE)

Each proposer (a thin holder of head, config and KV caches) builds its first pass and
passes in what differs: the `advance` rule (one KV group, several groups, constant
positions) and the `attention` metadata per layer (one group, or a list per layer).

Everything is tensors in, tensors out, with Python ints for static bounds:
`torch.compile(proposer.propose, fullgraph=True)` traces the whole loop (K is a
Python int, so the loop unrolls), with no host sync.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.layout import PADDING_SLOT_ID, BatchMetadata
from specdraft.ops import (
    draft_sample,
    prepare_eagle_input,
    prepare_inputs_padded,
    prepare_next_token_padded,
    step_metadata,
)


class DraftOutput(NamedTuple):
    draft_tokens: torch.Tensor  # [B, K] int32 (target vocabulary)
    draft_probs: torch.Tensor | None  # [B, K, V] fp32, when config.return_probs is set


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


Advance = Callable[[StepState, int], None]
Attention = Callable[[BatchMetadata], object]


# ----------------------------------------------------------------------------- small steps


def rows(positions: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """positions[..., index] for 1-D or M-RoPE positions."""
    return positions.index_select(positions.dim() - 1, index)


def first_row(positions: torch.Tensor) -> torch.Tensor:
    return positions[0] if positions.dim() == 2 else positions


def static_min(a, b):
    """min of two static bounds: plain ints stay ints (torch 2.11's Dynamo cannot
    trace torch.sym_min on them); SymInts stay symbolic (no guard)."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return torch.sym_min(a, b)


def bounded(metadata: BatchMetadata, block_size: int) -> BatchMetadata:
    """max_seq_len resolved: None means the block table's reach."""
    if metadata.max_seq_len is not None:
        return metadata
    return dataclasses.replace(metadata, max_seq_len=metadata.block_table.shape[1] * block_size)


def shift_input_ids(target_token_ids, next_token_ids, sample_index) -> torch.Tensor:
    """[a1, b1, b2, c1, c2] -> [b1, b2, c1, c2, c2], then each request's next token at
    its sample index: the draft predicts token t+1 from token t+1's embedding and
    token t's hidden state."""
    shifted = torch.cat([target_token_ids[1:], target_token_ids[-1:]])
    return shifted.index_copy(0, sample_index, next_token_ids.to(shifted.dtype))


def sample_rows(metadata: BatchMetadata, token_indices_to_sample, num_rejected_tokens):
    """Where each request samples (default: its window's last token) and its seq_len
    once the rejected tokens at the window's end are dropped."""
    if token_indices_to_sample is None:
        token_indices_to_sample = metadata.query_start_loc[1:] - 1
    seq_lens = metadata.seq_lens
    if num_rejected_tokens is not None:
        seq_lens = seq_lens - num_rejected_tokens.to(seq_lens.dtype)
    return token_indices_to_sample.long(), seq_lens


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
    sampled = rows(positions, sample_index)
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


# ------------------------------------------------------------------------------ sampling


def allocate_draft_probs(config: SpeculativeConfig, vocab_size: int, num_reqs: int, device) -> torch.Tensor | None:
    if config.return_probs is None:
        return None
    return torch.zeros(num_reqs, config.num_speculative_tokens, vocab_size, dtype=torch.float32, device=device)


@dataclass
class DraftSampler:
    """Samples one draft token per row of logits: argmax when greedy (and no buffer to
    fill), else draft_sample with each request's temperature and seed, storing this
    step's probs / logits into probs[:, step_index] when a buffer is given.

    A token's noise is keyed by its own position, so a request drafts the same tokens
    whatever batch it is in.
    """

    config: SpeculativeConfig
    sampling: SamplingParams | None
    probs: torch.Tensor | None  # [B, K, V] fp32 or None

    def __call__(self, logits, token_positions, step_index: torch.Tensor | None, repeat: int = 1, probs=None):
        """repeat: rows per request (parallel drafting samples K rows per request);
        probs: the buffer viewed as those rows (default self.probs)."""
        probs = self.probs if probs is None else probs
        config = self.config
        if config.draft_sampling == "greedy" and probs is None:
            return logits.argmax(dim=-1).to(torch.int32)
        num_rows = logits.shape[0]
        if self.sampling is None or config.draft_sampling == "greedy":
            temperature = torch.zeros(num_rows, dtype=torch.float32, device=logits.device)
            seeds = torch.zeros(num_rows, dtype=torch.int64, device=logits.device)
        else:
            temperature = self.sampling.temperature.repeat_interleave(repeat)
            seeds = self.sampling.seeds.repeat_interleave(repeat)
        kwargs = {"salt": config.salt}
        if probs is not None:
            kwargs.update(probs_out=probs, step=step_index, write=config.return_probs)
        return draft_sample(logits.contiguous(), temperature, seeds, token_positions.long(), **kwargs)

    def step(self, logits, state: StepState, step_index: torch.Tensor | None):
        """Draft token of one step: the fed token's position + 1 keys its noise."""
        return self(logits, first_row(state.positions) + 1, step_index)


def step_counter(probs: torch.Tensor | None, step: int, device) -> torch.Tensor | None:
    """The buffer row a step writes, as a 0-dim device tensor (None without a buffer)."""
    return None if probs is None else torch.full((), step, dtype=torch.int64, device=device)


# ---------------------------------------------------------------------------------- loop


def first_pass(model, kv_caches, input_ids, positions, hidden_states, attention_metadata, sample_index):
    """The draft's forward over every window token; rows at the sample indices of
    (hidden for sampling, hidden for the next step)."""
    h_sample, h_next = model(input_ids, positions, hidden_states, attention_metadata, kv_caches, spec_step_idx=0)
    return h_sample.index_select(0, sample_index), h_next.index_select(0, sample_index)


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
    model, kv_caches, config: SpeculativeConfig, target_token_ids, target_positions, target_hidden_states,
    next_token_ids, metadata: BatchMetadata, sampling: SamplingParams | None, *, token_indices_to_sample=None,
    num_rejected_tokens=None, advance: Advance, attention: Attention = one_group,
) -> DraftOutput:  # fmt: skip
    """EAGLE's loop: a first pass over the target's windows (ids shifted by one, each
    request's next token at its sample index), then K - 1 single-token steps."""
    num_reqs, device = metadata.num_reqs, target_token_ids.device
    sample_index, seq_lens = sample_rows(metadata, token_indices_to_sample, num_rejected_tokens)
    input_ids = shift_input_ids(target_token_ids, next_token_ids, sample_index)
    hidden_states = model.combine_hidden_states(target_hidden_states)
    h_sample, h_next = first_pass(
        model, kv_caches, input_ids, target_positions, hidden_states, attention(metadata), sample_index
    )
    sample = DraftSampler(config, sampling, allocate_draft_probs(config, model.config.vocab_size, num_reqs, device))
    state = first_step_state(target_positions, sample_index, seq_lens, h_next, metadata)
    step_index = step_counter(sample.probs, 0, device)
    first = sample.step(model.compute_logits(h_sample, spec_step_idx=0), state, step_index)
    tokens = decode_n_tokens(
        model, kv_caches, first, state, sample, step_index,
        num_steps=config.num_speculative_tokens, advance=advance, attention=attention,
    )  # fmt: skip
    return DraftOutput(torch.stack(tokens, dim=1), sample.probs)


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
    token_positions = first_row(rows(positions, sample_index)) + 1
    tokens: list[torch.Tensor] = []
    for step in range(config.num_speculative_tokens):
        if step:
            input_ids = shift_input_ids(input_ids, tokens[-1], sample_index)
        h_sample, hidden_states = model(input_ids, positions, hidden_states, metadata, kv_caches, spec_step_idx=step)
        logits = model.compute_logits(h_sample.index_select(0, sample_index), spec_step_idx=step)
        tokens.append(sample(logits, token_positions + step, step_counter(sample.probs, step, device)))
    return DraftOutput(torch.stack(tokens, dim=1), sample.probs)


# ----------------------------------------------------------------- after verification


def repack(metadata: BatchMetadata, num_rejected_tokens, num_kept_tokens: int):
    """The unpadded path: the batch without its rejected tokens, packed into
    num_kept_tokens rows (a Python int >= the kept total; rows past it are graph
    padding: PAD slots, never sampled). Returns (kept row index [num_kept_tokens], the
    repacked metadata); every slot mapping the metadata holds is repacked."""
    packed = prepare_eagle_input(metadata.query_start_loc, num_rejected_tokens, num_kept_tokens)
    index = packed.token_indices.long()
    real = torch.arange(num_kept_tokens, device=index.device) < packed.cu_num_tokens[-1]

    def kept_slots(slots):
        return torch.where(real, slots.index_select(0, index), PADDING_SLOT_ID)

    fields = {
        "query_start_loc": packed.cu_num_tokens.to(metadata.query_start_loc.dtype),
        "seq_lens": metadata.seq_lens - num_rejected_tokens.to(metadata.seq_lens.dtype),
        "slot_mapping": kept_slots(metadata.slot_mapping),
    }
    if hasattr(metadata, "slot_mappings"):  # several KV-cache groups
        fields["slot_mappings"] = [kept_slots(s) for s in metadata.slot_mappings]
    return index, dataclasses.replace(metadata, **fields)


# ----------------------------------------------------------------------------- holder


class Proposer:
    """What every proposer holds (a draft head, its config, its KV caches: one per
    draft layer, written in place) and the two ways back into `propose` after the
    target's verification step, which are the same for every proposer:

    - `propose_padded` (no host sync): rejected tokens stay in the batch as padding;
      each request samples after its last accepted token;
    - `propose_unpadded`: rejected tokens are dropped and the batch repacked, which
      needs one host-side number, an upper bound of the kept tokens.

    Subclasses define `propose` with the common signature:
    propose(target_token_ids, target_positions, target_hidden_states, next_token_ids,
    metadata, sampling=None, *, token_indices_to_sample=None, num_rejected_tokens=None).
    """

    def __init__(self, model: torch.nn.Module, config: SpeculativeConfig, kv_caches: list[torch.Tensor]) -> None:
        if len(kv_caches) != model.num_kv_layers:
            raise ValueError(
                f"kv_caches must hold {model.num_kv_layers} caches (one per draft layer), got {len(kv_caches)}"
            )
        self.model = model
        self.config = config
        self.kv_caches = kv_caches
        for cache in kv_caches:
            # Written in place every call: a static address lets mode="reduce-overhead"
            # keep the whole propose in one CUDA graph instead of skipping graphs.
            torch._dynamo.mark_static_address(cache)

    @property
    def num_speculative_tokens(self) -> int:
        return self.config.num_speculative_tokens

    def propose(self, target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata,
                sampling=None, *, token_indices_to_sample=None, num_rejected_tokens=None) -> DraftOutput:  # fmt: skip
        raise NotImplementedError

    def propose_padded(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor | None,
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
        first rejection). cu_num_draft_tokens [B]: inclusive cumsum of the drafts each
        request was verified with. backup_next_token_ids [B]: the next token of
        requests that emitted none (e.g. partial prefills, discarded requests). The
        target batch (metadata) still holds every verified token."""
        if discard_request_mask is None:
            discard_request_mask = torch.zeros_like(backup_next_token_ids, dtype=torch.bool)
        next_tokens = prepare_next_token_padded(
            sampled_token_ids, discard_request_mask, backup_next_token_ids, self.model.config.vocab_size
        )
        padded = prepare_inputs_padded(
            cu_num_draft_tokens, next_tokens.valid_sampled_tokens_count, metadata.query_start_loc
        )
        return self.propose(
            target_token_ids, target_positions, target_hidden_states, next_tokens.next_token_ids, metadata, sampling,
            token_indices_to_sample=padded.token_indices_to_sample, num_rejected_tokens=padded.num_rejected_tokens,
        )  # fmt: skip

    def propose_unpadded(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor | None,
        next_token_ids: torch.Tensor,
        num_rejected_tokens: torch.Tensor,
        metadata: BatchMetadata,
        num_kept_tokens: int,
        sampling: SamplingParams | None = None,
    ) -> DraftOutput:
        """After verification, with the rejected tokens dropped (see `repack`):
        num_kept_tokens is a Python int >= the kept total (T - sum of rejected), the one
        host-side number this path needs."""
        index, repacked = repack(metadata, num_rejected_tokens, num_kept_tokens)
        hidden = None if target_hidden_states is None else target_hidden_states.index_select(0, index)
        return self.propose(
            target_token_ids.index_select(0, index), rows(target_positions, index), hidden, next_token_ids, repacked,
            sampling,
        )  # fmt: skip
