"""What every proposer holds (`Proposer`: a draft head, its config, its KV caches)
and the two ways back into `propose` after the target's verification step, the same
for every proposer: `propose_padded` (no host sync) and `propose_unpadded` (the
batch repacked without its rejected tokens, `repack`). The propose loop itself is
in loop.py."""

import copy
import dataclasses

import torch

from specdraft.checked_mode import is_checked
from specdraft.checks import INDEX_DTYPES, check_int_range, check_tensor_arg
from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.layout import PADDING_SLOT_ID, BatchMetadata, position_rows, resolve_max_seq_len
from specdraft.ops import prepare_eagle_input, prepare_inputs_padded, prepare_next_token_padded
from specdraft.proposers.checks import check_kv_caches, check_padded_inputs, check_propose_inputs
from specdraft.proposers.draft_sampling import DraftOutput
from specdraft.proposers.loop import TargetWindow, clamp_rows
from specdraft.proposers.value_checks import (
    KVGroup,
    check_padded_values,
    check_propose_values,
    check_unpadded_values,
)


def repack(metadata: BatchMetadata, num_rejected_tokens, num_kept_tokens: int):
    """The unpadded path: the batch without its rejected tokens, packed into
    num_kept_tokens rows (a Python int >= the kept total; rows past it are graph
    padding: PAD slots, never sampled). Returns (kept row index [num_kept_tokens], the
    repacked metadata); every slot mapping the metadata holds is repacked."""
    packed = prepare_eagle_input(metadata.query_start_loc, num_rejected_tokens, num_kept_tokens)
    index = clamp_rows(packed.token_indices, metadata.slot_mapping.shape[0])
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
    metadata, sampling=None, *, token_indices_to_sample=None, num_rejected_tokens=None),
    bundle those arguments into a TargetWindow and pass it through `checked_window`
    first; what differs between proposers is read from `reads_hidden`,
    `table_block_size`, `draft_steps` and `kv_groups`. `drafts_trees` says whether
    the proposer also drafts EAGLE-2 trees (`propose_tree`).

    Every propose path runs under `torch.no_grad()`, whatever the caller's grad mode:
    drafting is never differentiable, so a compiled propose called between a training
    loop's optimizer steps returns no autograd state, leaves none on the KV caches it
    writes, and does not recompile (tests/proposers/test_propose_grad_mode.py).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: SpeculativeConfig,
        kv_caches: list[torch.Tensor],
        *,
        cache_block_sizes: list[int] | None = None,
    ) -> None:
        """cache_block_sizes: each cache's block size, when they are not all
        config.block_size (several KV-cache groups)."""
        check_kv_caches(model, config, kv_caches, block_sizes=cache_block_sizes)
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

    # Whether `with_num_drafts` may draft fewer tokens than the config's K (EAGLE and
    # block proposers; one whose state is sized by K keeps False).
    drafts_fewer = False

    def with_num_drafts(self, k: int) -> "Proposer":
        """This proposer drafting k <= K tokens per request: a shallow copy sharing its
        head and KV caches (sized for K, so large enough), with config.num_speculative_tokens
        = k. What a budget's choice of draft depth runs (generation/step_costs.py)."""
        if k == self.num_speculative_tokens:
            return self
        if not self.drafts_fewer:
            raise ValueError(f"k: {type(self).__name__} drafts exactly its config's K = {self.num_speculative_tokens}")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.num_speculative_tokens:
            raise ValueError(f"k: an int in [1, {self.num_speculative_tokens}], got {k!r}")
        return self.with_config(num_speculative_tokens=k)

    def with_config(self, **changes) -> "Proposer":
        """This proposer with config fields replaced (dataclasses.replace's names): a
        shallow copy sharing its head and KV caches, or itself where nothing changes.
        The caller keeps the change within what those were built for (with_num_drafts:
        k <= K)."""
        config = dataclasses.replace(self.config, **changes)
        if config == self.config:
            return self
        changed = copy.copy(self)
        changed.config = config
        return changed

    # ------------------------------------------------------------ propose's prologue

    # False for a draft that ignores target_hidden_states (a standalone draft LM).
    reads_hidden = True

    @property
    def drafts_trees(self) -> bool:
        """Whether the proposer drafts EAGLE-2 trees (`propose_tree`); the tree decoder
        and propose_tree refuse one that does not."""
        return False

    @property
    def table_block_size(self) -> int:
        """The block size of metadata.block_table (several KV-cache groups: group 0's)."""
        return self.config.block_size

    @property
    def draft_steps(self) -> int:
        """KV slots each request writes past its kept tokens, beyond the window: the
        block table must reach them (EAGLE: one per single-token step, K - 1)."""
        return self.num_speculative_tokens - 1

    def kv_groups(self, metadata: BatchMetadata) -> list[KVGroup] | None:
        """The KV-cache groups checked mode checks; None: the metadata's one group,
        holding every cache."""
        return None

    def checked_window(self, window: TargetWindow, sampling: SamplingParams | None) -> TargetWindow:
        """The start of every `propose`: the free checks, checked mode's value checks,
        then the window with max_seq_len resolved (`resolve_max_seq_len`), ready for the loop."""
        block_size = self.table_block_size
        check_propose_inputs(self, window, sampling, block_size=block_size, reads_hidden=self.reads_hidden)
        if is_checked():
            check_propose_values(
                self, window, sampling, draft_steps=self.draft_steps, groups=self.kv_groups(window.metadata),
                reads_hidden=self.reads_hidden,
            )  # fmt: skip
        metadata = window.metadata
        max_seq_len = resolve_max_seq_len(metadata.max_seq_len, metadata.block_table, block_size)
        return window._replace(metadata=dataclasses.replace(metadata, max_seq_len=max_seq_len))

    def propose(self, target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata,
                sampling=None, *, token_indices_to_sample=None, num_rejected_tokens=None) -> DraftOutput:  # fmt: skip
        raise NotImplementedError

    @torch.no_grad()
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
        target batch (metadata) still holds every verified token.

        Out of contract (unchecked mode): a sampled id outside [0, vocab_size) counts
        as rejected (-1); each request rejects at most min(its drafts, window - 1),
        so it samples inside its window whatever cu_num_draft_tokens holds."""
        check_padded_inputs(
            self, sampled_token_ids, cu_num_draft_tokens, backup_next_token_ids, metadata, discard_request_mask
        )
        if is_checked():
            check_padded_values(
                self, sampled_token_ids, cu_num_draft_tokens, backup_next_token_ids, metadata, discard_request_mask,
                target_token_ids.shape[0],
            )  # fmt: skip
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

    @torch.no_grad()
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
        host-side number this path needs.

        Out of contract (unchecked mode): rows past num_kept_tokens are dropped and
        every gather index is clamped into the batch."""
        check_unpadded_args(metadata, num_rejected_tokens, num_kept_tokens)
        if is_checked():
            check_unpadded_values(metadata, num_rejected_tokens, num_kept_tokens, target_token_ids.shape[0])
        index, repacked = repack(metadata, num_rejected_tokens, num_kept_tokens)
        hidden = None if target_hidden_states is None else target_hidden_states.index_select(0, index)
        return self.propose(
            target_token_ids.index_select(0, index), position_rows(target_positions, index), hidden, next_token_ids, repacked,
            sampling,
        )  # fmt: skip


def check_unpadded_args(metadata: BatchMetadata, num_rejected_tokens, num_kept_tokens) -> None:
    """propose_unpadded's own free checks: num_kept_tokens a Python int, at least one
    kept token per request; num_rejected_tokens one int per request."""
    if not isinstance(metadata, BatchMetadata):
        raise ValueError(f"metadata must be a BatchMetadata, got {type(metadata).__name__}")
    if isinstance(num_kept_tokens, torch.Tensor):
        raise ValueError("num_kept_tokens must be a Python int (the host-side bound of the kept tokens), got a tensor")
    num_reqs = metadata.seq_lens.shape[0]
    check_int_range("num_kept_tokens", num_kept_tokens, 0)
    if isinstance(num_kept_tokens, int) and isinstance(num_reqs, int) and num_kept_tokens < num_reqs:
        raise ValueError(
            f"num_kept_tokens = {num_kept_tokens} is below the {num_reqs} requests: every request keeps at least "
            "one token"
        )
    check_tensor_arg("num_rejected_tokens", num_rejected_tokens, INDEX_DTYPES, shape=(num_reqs,))
