"""The shared propose loop: one pass over the target's tokens, then K - 1
single-token draft steps, each sampled greedily or with seeded Gumbel noise.

Everything here is tensors in, tensors out, with Python ints for static bounds:
`torch.compile(proposer.propose, fullgraph=True)` traces the whole loop (K is a
Python int, so the loop unrolls), with no host sync.

Subclasses change only what differs:
- `prepare_first_pass` (multi-layer EAGLE shifts the windows first),
- `attention_metadata` (several KV-cache groups build one per layer),
- `advance` (the autoregressive speculator may keep positions constant).
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch

from specdraft.checks import INDEX_DTYPES, check_dtype, check_rank, check_shape
from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.layout import BatchMetadata
from specdraft.ops import draft_sample, step_metadata


class DraftOutput(NamedTuple):
    draft_tokens: torch.Tensor  # [B, K] int32 (target vocabulary)
    draft_probs: torch.Tensor | None  # [B, K, V] fp32, when config.return_probs is set


@dataclass
class FirstPass:
    """The draft's first forward, over every target token."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T] or [3, T]
    hidden_states: torch.Tensor  # [T, H]
    metadata: BatchMetadata
    token_indices_to_sample: torch.Tensor  # [B]
    seq_lens_after: torch.Tensor  # [B]: seq_lens once rejected tokens are dropped


@dataclass
class StepState:
    """What one single-token draft step reads and advances (all [B] or [3, B])."""

    positions: torch.Tensor  # running positions of the token fed next (unclamped)
    clamped_positions: torch.Tensor  # what the model sees (0 past max_model_len)
    seq_lens: torch.Tensor
    slot_mapping: torch.Tensor  # [B] int64
    hidden_states: torch.Tensor  # [B, H]
    max_seq_len: int


def rows(positions: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """positions[..., index] for 1-D or M-RoPE positions."""
    return positions.index_select(positions.dim() - 1, index)


def static_min(a, b):
    """min of two static bounds: plain ints stay ints (torch 2.11's Dynamo cannot
    trace torch.sym_min on them); SymInts stay symbolic (no guard)."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return torch.sym_min(a, b)


def first_row(positions: torch.Tensor) -> torch.Tensor:
    return positions[0] if positions.dim() == 2 else positions


class Proposer:
    """Drafts K tokens per request from a draft head (see specdraft.models.heads).

    kv_caches: the draft's KV caches, one per draft layer, written in place.
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

    # ------------------------------------------------------------------ the loop

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
        tokens of each window past that index (default 0); they are drafted over
        as padding and dropped from seq_lens for the later steps.
        """
        self.check_inputs(target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata)
        if token_indices_to_sample is None:
            token_indices_to_sample = metadata.query_start_loc[1:] - 1
        seq_lens_after = metadata.seq_lens
        if num_rejected_tokens is not None:
            seq_lens_after = metadata.seq_lens - num_rejected_tokens.to(metadata.seq_lens.dtype)
        first = FirstPass(
            input_ids=self.shift_input_ids(target_token_ids, next_token_ids, token_indices_to_sample),
            positions=target_positions,
            hidden_states=self.model.combine_hidden_states(target_hidden_states),
            metadata=metadata,
            token_indices_to_sample=token_indices_to_sample,
            seq_lens_after=seq_lens_after,
        )
        first = self.prepare_first_pass(first)
        return self.draft(first, sampling)

    def draft(self, first: FirstPass, sampling: SamplingParams | None) -> DraftOutput:
        num_reqs, k = first.metadata.num_reqs, self.num_speculative_tokens
        index = first.token_indices_to_sample.long()
        h_sample, h_next = self.model(
            first.input_ids,
            first.positions,
            first.hidden_states,
            self.attention_metadata(first.metadata),
            self.kv_caches,
            spec_step_idx=0,
        )
        state = self.first_step_state(first, index, h_next.index_select(0, index))
        probs_out = self.allocate_probs(num_reqs, first.hidden_states.device)
        logits = self.model.compute_logits(h_sample.index_select(0, index), spec_step_idx=0)
        tokens = [self.sample(logits, state, sampling, probs_out, step=0)]
        for step in range(1, k):
            self.advance(state, first.metadata)
            h_sample, state.hidden_states = self.model(
                tokens[-1],
                state.clamped_positions,
                state.hidden_states,
                self.attention_metadata(self.step_metadata(state, first.metadata)),
                self.kv_caches,
                spec_step_idx=step,
            )
            logits = self.model.compute_logits(h_sample, spec_step_idx=step)
            tokens.append(self.sample(logits, state, sampling, probs_out, step=step))
        return DraftOutput(torch.stack(tokens, dim=1), probs_out)

    # ------------------------------------------------------------------- steps

    @staticmethod
    def shift_input_ids(target_token_ids, next_token_ids, token_indices_to_sample) -> torch.Tensor:
        """[a1, b1, b2, c1, c2] -> [b1, b2, c1, c2, c2], then each request's next
        token at its sample index: the draft predicts token t+1 from token t+1's
        embedding and token t's hidden state."""
        shifted = torch.cat([target_token_ids[1:], target_token_ids[-1:]])
        return shifted.index_copy(0, token_indices_to_sample.long(), next_token_ids.to(shifted.dtype))

    def prepare_first_pass(self, first: FirstPass) -> FirstPass:
        return first

    def first_step_state(self, first: FirstPass, index: torch.Tensor, hidden: torch.Tensor) -> StepState:
        positions = rows(first.positions, index)  # position of each request's sampled token
        return StepState(
            positions=positions,
            clamped_positions=positions,
            seq_lens=first.seq_lens_after.clone(),
            slot_mapping=torch.full((first.metadata.num_reqs,), -1, dtype=torch.int64, device=positions.device),
            hidden_states=hidden,
            max_seq_len=first.metadata.max_seq_len,
        )

    def advance(self, state: StepState, metadata: BatchMetadata) -> None:
        """Move every request one token on: positions + 1 (clamped at max_model_len),
        its KV slot from the block table, seq_len + 1."""
        state.clamped_positions = torch.empty_like(state.positions)
        step_metadata(
            state.positions,
            state.seq_lens,
            metadata.block_table,
            state.slot_mapping,
            state.clamped_positions,
            block_size=self.config.block_size,
            max_model_len=self.config.max_model_len,
        )
        # A static bound (a Python int or SymInt), never read from the device.
        reach = metadata.block_table.shape[1] * self.config.block_size
        state.max_seq_len = static_min(static_min(state.max_seq_len + 1, self.config.max_model_len), reach)

    def step_metadata(self, state: StepState, metadata: BatchMetadata) -> BatchMetadata:
        num_reqs = metadata.num_reqs
        return BatchMetadata(
            query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32, device=state.seq_lens.device),
            seq_lens=state.seq_lens,
            block_table=metadata.block_table,
            slot_mapping=state.slot_mapping,
            max_query_len=1,
            max_seq_len=state.max_seq_len,
        )

    def attention_metadata(self, metadata: BatchMetadata):
        return BatchMetadata(
            query_start_loc=metadata.query_start_loc,
            seq_lens=metadata.seq_lens,
            block_table=metadata.block_table,
            slot_mapping=metadata.slot_mapping,
            max_query_len=metadata.max_query_len,
            max_seq_len=metadata.max_seq_len,
        )

    # ---------------------------------------------------------------- sampling

    def allocate_probs(self, num_reqs: int, device) -> torch.Tensor | None:
        if self.config.return_probs is None:
            return None
        vocab = self.model.config.vocab_size
        return torch.zeros(num_reqs, self.num_speculative_tokens, vocab, dtype=torch.float32, device=device)

    def sample(self, logits, state: StepState, sampling: SamplingParams | None, probs_out, step: int):
        """Token `step` of every request. Its noise is keyed by the token's own
        position (the fed token's position + 1), so a request drafts the same
        tokens whatever batch it is in."""
        step_index = None if probs_out is None else torch.full((), step, dtype=torch.int64, device=logits.device)
        return self.draft_tokens(logits, first_row(state.positions) + 1, sampling, probs_out, step_index)

    def draft_tokens(self, logits, token_positions, sampling: SamplingParams | None, probs_out, step_index, repeat=1):
        """One draft token per row of logits: argmax when greedy (and no buffer to
        fill), else draft_sample with each request's temperature and seed (repeated
        `repeat` times when a request owns several consecutive rows), storing into
        probs_out[:, step_index] when a buffer is given."""
        if self.config.draft_sampling == "greedy" and probs_out is None:
            return logits.argmax(dim=-1).to(torch.int32)
        rows_ = logits.shape[0]
        if sampling is None or self.config.draft_sampling == "greedy":
            temperature = torch.zeros(rows_, dtype=torch.float32, device=logits.device)
            seeds = torch.zeros(rows_, dtype=torch.int64, device=logits.device)
        else:
            temperature = sampling.temperature.repeat_interleave(repeat) if repeat > 1 else sampling.temperature
            seeds = sampling.seeds.repeat_interleave(repeat) if repeat > 1 else sampling.seeds
        kwargs = {"salt": self.config.salt}
        if probs_out is not None:
            kwargs.update(probs_out=probs_out, step=step_index, write=self.config.return_probs)
        return draft_sample(logits.contiguous(), temperature, seeds, token_positions.long(), **kwargs)

    # ------------------------------------------------------------------ checks

    def check_inputs(self, target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata):
        num_tokens = self.check_batch(target_token_ids, target_positions, next_token_ids, metadata)
        check_rank("target_hidden_states", target_hidden_states, 2)
        if target_hidden_states.shape[0] != num_tokens:
            raise ValueError(
                f"target_hidden_states must have {num_tokens} rows, got {tuple(target_hidden_states.shape)}"
            )

    @staticmethod
    def check_batch(target_token_ids, target_positions, next_token_ids, metadata) -> int:
        """Token ids, positions, next tokens and the batch metadata agree; returns T."""
        check_dtype("target_token_ids", target_token_ids, INDEX_DTYPES)
        check_rank("target_token_ids", target_token_ids, 1)
        num_tokens = target_token_ids.shape[0]
        check_dtype("target_positions", target_positions, INDEX_DTYPES)
        check_rank("target_positions", target_positions, (1, 2))
        if target_positions.shape[-1] != num_tokens or (target_positions.dim() == 2 and target_positions.shape[0] != 3):
            raise ValueError(
                f"target_positions must have shape ({num_tokens},) or (3, {num_tokens}), got {tuple(target_positions.shape)}"
            )
        num_reqs = metadata.num_reqs
        check_shape("next_token_ids", next_token_ids, (num_reqs,))
        check_shape("query_start_loc", metadata.query_start_loc, (num_reqs + 1,))
        check_shape("slot_mapping", metadata.slot_mapping, (num_tokens,))
        if metadata.block_table.dim() != 2 or metadata.block_table.shape[0] != num_reqs:
            raise ValueError(
                f"block_table must have shape ({num_reqs}, max_blocks), got {tuple(metadata.block_table.shape)}"
            )
        return num_tokens
