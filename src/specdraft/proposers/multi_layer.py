"""Multi-layer EAGLE (chained MTP) proposer.

The draft has n_predict MTP layers and drafts exactly n_predict tokens: pass k
(k = 0 .. n_predict - 1) runs layer k over the *whole* window, as vLLM's multi-layer
proposer does (every `spec_step_idx` forward takes all the window's tokens);
`loop.draft_chained` is that loop:

    pass 0: ids_0 = shift_by_one(window ids), next token at the sample index
    pass k: ids_k = shift_by_one(ids_{k-1}), draft token k-1 at the sample index
            hidden_k = pass k-1's output hidden states (all rows)
            positions, slot mapping, seq_lens: those of pass 0, unchanged

so layer k at position p reads the token at p + k + 1 and layer k-1's hidden state at
p, and every layer writes its own KV for the whole window. Draft token k is sampled
from the sample row of pass k.

Before pass 0, `adjust_input` (specdraft.proposers.adjust_input) shifts each window right so it
ends at its token to sample, refilling the front from a per-request cache of the
previous call's tail. That recomputes, in every layer, the KV of up to n_predict
tokens before the window, which the previous call wrote from draft tokens that may
have been rejected, and drops the rejected tokens at the end.

Which ids are shifted. adjust_input runs on the *target* ids, before the
shift-by-one (pass 0's ids are built from the adjusted window), so its cache keeps
each token id with its own position (as vLLM's unit test of adjust_input checks
cached (id, position) pairs). In a real engine shifting before or after the
shift-by-one drafts the same tokens, because the next call's window starts with the
token the previous call put at its sample index. With arbitrary inputs they do not,
so the tests pin this order.

The shift cache. The proposer owns one ShiftCache of max_num_reqs rows and
MAX_SHIFT = n_predict entries. Cache row b belongs to batch row b from one call to
the next, so the engine must keep a request in the same batch row (a persistent
batch), and call `reset_cache([b])` when a new request takes row b. A request's
first call (a prefill that samples its last token) shifts by nothing and fills its
row.
"""

import dataclasses
import warnings

import torch

from specdraft.checked_mode import is_checked
from specdraft.checks import check_int_range
from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.layout import BatchMetadata
from specdraft.ops import MAX_SHIFT_LIMIT
from specdraft.proposers.adjust_input import ShiftCache, adjust_input
from specdraft.proposers.base import Proposer, check_unpadded_args
from specdraft.proposers.draft_sampling import DraftOutput
from specdraft.proposers.loop import TargetWindow, clamp_ids, clamp_rows, draft_chained, shift_input_ids
from specdraft.proposers.value_checks import check_unpadded_values


class MultiLayerEagleProposer(Proposer):
    """Drafts n_predict tokens with an n_predict-layer MTP head (MTPHead picks layer
    spec_step_idx % n_predict), one whole-window pass per layer.

    max_num_reqs: batch rows the shift cache holds (every call has B <= it).
    hidden_dtype: dtype of the hidden states the head receives (default: the head's).
    config.num_speculative_tokens is replaced by n_predict, with a warning if it
    differs. propose_padded is the way in after verification (the shift needs the
    rejected tokens still in the window); propose_unpadded gives the same drafts.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: SpeculativeConfig,
        kv_caches: list[torch.Tensor],
        *,
        max_num_reqs: int,
        hidden_dtype: torch.dtype | None = None,
    ) -> None:
        num_layers = getattr(getattr(model, "config", None), "n_predict", None)
        if isinstance(num_layers, bool) or not isinstance(num_layers, int):
            raise ValueError("model must be a multi-layer MTP head with an int config.n_predict")
        check_int_range("n_predict", num_layers, 1, MAX_SHIFT_LIMIT)
        check_int_range("max_num_reqs", max_num_reqs, 1)
        if config.method != "mtp":
            raise ValueError(f"method must be 'mtp' for the multi-layer proposer, got {config.method!r}")
        if config.parallel_drafting:
            raise ValueError("parallel_drafting is not supported by the multi-layer proposer")
        if config.num_speculative_tokens != num_layers:
            warnings.warn(
                f"multi-layer EAGLE drafts one token per layer: num_speculative_tokens "
                f"{config.num_speculative_tokens} adjusted to n_predict = {num_layers}",
                stacklevel=2,
            )
            config = dataclasses.replace(config, num_speculative_tokens=num_layers)
        super().__init__(model, config, kv_caches)
        self.max_num_reqs = max_num_reqs
        self.shift_cache = ShiftCache.zeros(
            max_num_reqs,
            num_layers,
            model.config.hidden_size,
            dtype=model.config.dtype if hidden_dtype is None else hidden_dtype,
            device=kv_caches[0].device,
            mrope=model.config.mrope_section is not None,
        )

    @property
    def num_layers(self) -> int:
        return self.shift_cache.max_shift

    @property
    def draft_steps(self) -> int:
        """Every pass covers the window only: no draft step writes past it."""
        return 0

    def reset_cache(self, rows: torch.Tensor | list[int] | None = None) -> None:
        """Forget the cached tails of batch rows `rows` (default: all), e.g. when new
        requests take those rows."""
        lens = self.shift_cache.cached_lens
        if rows is None:
            lens.zero_()
        else:
            lens.index_fill_(0, torch.as_tensor(rows, dtype=torch.int64, device=lens.device), 0)

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
        """As EagleProposer.propose, with the windows shifted first (adjust_input).
        num_rejected_tokens is accepted for the padded path and not needed: the shift
        drops rejected tokens from the end of each window, and tokens it cannot drop
        sit after the sample index, where causal attention keeps them from the sampled
        row in every pass."""
        window = self.checked_window(
            TargetWindow(target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata,
                         token_indices_to_sample, num_rejected_tokens),
            sampling,
        )  # fmt: skip
        metadata = window.metadata
        if metadata.num_reqs > self.max_num_reqs:
            raise ValueError(f"metadata holds {metadata.num_reqs} requests, more than max_num_reqs {self.max_num_reqs}")
        if token_indices_to_sample is None:
            token_indices_to_sample = metadata.query_start_loc[1:] - 1
        num_reqs = metadata.num_reqs
        cache = self.cache_rows(num_reqs)
        # The cache's dtypes: int32 ids, int64 positions and slots.
        adjusted = adjust_input(
            target_token_ids.to(cache.token_ids.dtype),
            target_positions.to(cache.positions.dtype),
            self.model.combine_hidden_states(target_hidden_states).to(cache.hidden_states.dtype),
            metadata.query_start_loc,
            metadata.seq_lens,
            cache,
            token_indices_to_sample=token_indices_to_sample,
            slot_mapping=metadata.slot_mapping.to(torch.int64),
            max_query_len=metadata.max_query_len,
        )
        self.store_cache_rows(cache, num_reqs)
        sample_index = clamp_rows(adjusted.token_indices_to_sample, target_token_ids.shape[0])
        return draft_chained(
            self.model, self.kv_caches, self.config,
            clamp_ids(shift_input_ids(adjusted.token_ids, next_token_ids, sample_index), self.model.config.vocab_size),
            adjusted.positions,
            adjusted.hidden_states,
            dataclasses.replace(metadata, seq_lens=adjusted.seq_lens, slot_mapping=adjusted.slot_mapping),
            sample_index, sampling,
        )  # fmt: skip

    @torch.no_grad()
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
        """The unpadded entry point (vLLM raises here). The shift refills each window's
        front from the cache by exactly as many tokens as it drops from its end, so it
        needs the rejected rows as room: instead of repacking them away, this samples
        after each request's last kept token, which drafts exactly what the padded
        path does. num_kept_tokens (the unpadded path's host-side bound) is checked
        and otherwise not needed: no repacking, no host sync."""
        check_unpadded_args(metadata, num_rejected_tokens, num_kept_tokens)
        if is_checked():
            check_unpadded_values(metadata, num_rejected_tokens, num_kept_tokens, target_token_ids.shape[0])
        rejected = num_rejected_tokens.to(metadata.query_start_loc.dtype)
        return self.propose(
            target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata, sampling,
            token_indices_to_sample=metadata.query_start_loc[1:] - 1 - rejected,
            num_rejected_tokens=num_rejected_tokens,
        )  # fmt: skip

    # ------------------------------------------------------------- cache rows

    def cache_rows(self, num_reqs: int) -> ShiftCache:
        """Rows 0 .. B-1 of the shift cache, as the shift ops want them (contiguous).
        Views, except M-RoPE positions ([3, max_num_reqs, S] sliced on dim 1), which
        are copied and written back by `store_cache_rows`."""
        c = self.shift_cache
        # narrow(0, 0, B), not [:B]: a slice has size min(B, rows), which dynamic shapes
        # turn into an unbacked size that later checks cannot decide; narrow's is B.
        positions = (
            c.positions.narrow(1, 0, num_reqs).contiguous()
            if c.positions.dim() == 3
            else c.positions.narrow(0, 0, num_reqs)
        )
        return ShiftCache(
            token_ids=c.token_ids.narrow(0, 0, num_reqs),
            positions=positions,
            hidden_states=c.hidden_states.narrow(0, 0, num_reqs),
            cached_lens=c.cached_lens.narrow(0, 0, num_reqs),
            slot_mapping=c.slot_mapping.narrow(0, 0, num_reqs),
        )

    def store_cache_rows(self, cache: ShiftCache, num_reqs: int) -> None:
        if self.shift_cache.positions.dim() == 3:
            self.shift_cache.positions.narrow(1, 0, num_reqs).copy_(cache.positions)
