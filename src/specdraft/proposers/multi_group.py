"""MTP proposer whose draft layers live in several KV-cache groups (as Step-3.5's MTP
draft does): each group has its own block table, slot mapping and block size.

The loop is the shared one (loop.draft_k_tokens): a first pass over the target
tokens with layer 0, then K - 1 single-token steps, step k with layer k % n_predict (MTPHead
chooses it; with per_layer_lm_head=True each layer has its own lm_head). What
differs is only where each layer's KV lives:

- the batch carries one block table and one slot mapping per group
  (`GroupedBatchMetadata`), and each layer gets attention metadata built from its
  group's (a list indexed by layer, which the heads accept);
- every draft step recomputes every group's slot mapping: one `step_metadata` call
  per group with that group's block table and block size. The running positions and
  seq_lens advance once (group 0's call); the other groups' calls work on copies and
  contribute only their slots.

Unlike vLLM's Step-3.5 proposer, which recomputes the other groups' slots with the
primary group's block size, each group uses its own; the step loop has no host sync.
"""

import dataclasses
import functools
from dataclasses import dataclass, field

import torch

from specdraft.checks import INDEX_DTYPES, check_dtype, check_int_range, check_shape
from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.layout import BatchMetadata
from specdraft.ops import step_metadata
from specdraft.proposers.base import Proposer
from specdraft.proposers.draft_sampling import DraftOutput
from specdraft.proposers.loop import StepState, TargetWindow, draft_k_tokens, single_token_batch, static_min
from specdraft.proposers.value_checks import KVGroup


@dataclass
class GroupedBatchMetadata(BatchMetadata):
    """BatchMetadata with one block table and slot mapping per KV-cache group.

    block_tables[g] [B, max_blocks_g] int32 and slot_mappings[g] [T] int64: group g's.
    The inherited block_table / slot_mapping are group 0's (what code that knows one
    group reads). Build with `from_groups`.
    """

    block_tables: list[torch.Tensor] = field(default_factory=list)
    slot_mappings: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def from_groups(
        cls,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_tables: list[torch.Tensor],
        slot_mappings: list[torch.Tensor],
        max_query_len: int,
        max_seq_len: int,
    ) -> "GroupedBatchMetadata":
        if len(block_tables) < 1 or len(block_tables) != len(slot_mappings):
            raise ValueError(
                f"block_tables and slot_mappings must hold one entry per group (>= 1), "
                f"got {len(block_tables)} and {len(slot_mappings)}"
            )
        return cls(
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_table=block_tables[0],
            slot_mapping=slot_mappings[0],
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            block_tables=list(block_tables),
            slot_mappings=list(slot_mappings),
        )

    @property
    def num_groups(self) -> int:
        return len(self.block_tables)


def advance_groups(state: StepState, step: int, *, block_sizes: list[int], max_model_len: int) -> None:
    """positions + 1 once; every group's slot from its own block table and block size,
    at the token's sequence index (M-RoPE: state.seq_index, not a positions row).
    Group 0's call advances positions, seq_index and seq_lens; the other groups' calls
    work on copies (they must see the values before the step) and contribute only slots."""
    batch = state.batch
    slots: list[torch.Tensor] = [batch.slot_mapping] * len(block_sizes)
    for g in [*range(1, len(block_sizes)), 0]:  # group 0 last: it moves the positions in place
        positions = state.positions if g == 0 else state.positions.clone()
        seq_index = state.seq_index if g == 0 or state.seq_index is None else state.seq_index.clone()
        seq_lens = batch.seq_lens.clone()
        slots[g] = torch.empty_like(batch.slot_mapping)
        clamped = torch.empty_like(state.positions)
        step_metadata(
            positions, seq_lens, batch.block_tables[g], slots[g], clamped,
            block_size=block_sizes[g], max_model_len=max_model_len, seq_index=seq_index,
        )  # fmt: skip
    state.clamped_positions = clamped
    # Each group's block-table reach caps its own layers (per_layer_attention).
    max_seq_len = static_min(batch.max_seq_len + 1, max_model_len)
    state.batch = dataclasses.replace(single_token_batch(batch, seq_lens, slots[0], max_seq_len), slot_mappings=slots)


def per_layer_attention(
    metadata: GroupedBatchMetadata, *, layer_groups: list[int], block_sizes: list[int]
) -> list[BatchMetadata]:
    """One BatchMetadata per draft layer: its group's block table and slot mapping."""
    per_group = [
        BatchMetadata(
            query_start_loc=metadata.query_start_loc,
            seq_lens=metadata.seq_lens,
            block_table=metadata.block_tables[g],
            slot_mapping=metadata.slot_mappings[g],
            max_query_len=metadata.max_query_len,
            max_seq_len=static_min(metadata.max_seq_len, metadata.block_tables[g].shape[1] * size),
        )
        for g, size in enumerate(block_sizes)
    ]
    return [per_group[g] for g in layer_groups]


class MultiGroupMTPProposer(Proposer):
    """MTP head (n_predict layers) whose layer i keeps its KV in group layer_groups[i].

    layer_groups: the group of each draft layer (len = model.num_kv_layers; groups
    are numbered 0 .. G-1). block_sizes: block size of each group (len G); kv_caches[i]
    must have block size block_sizes[layer_groups[i]]. config.block_size is not used.
    metadata: a GroupedBatchMetadata.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: SpeculativeConfig,
        kv_caches: list[torch.Tensor],
        *,
        layer_groups: list[int],
        block_sizes: list[int],
    ) -> None:
        if config.method != "mtp":
            raise ValueError(f"method must be 'mtp' for the multi-group MTP proposer, got {config.method!r}")
        if config.parallel_drafting:
            raise ValueError("parallel_drafting is not supported by the multi-group proposer")
        num_groups = len(block_sizes)
        if num_groups < 1:
            raise ValueError("block_sizes must hold one block size per group (at least one)")
        for g, size in enumerate(block_sizes):
            check_int_range(f"block_sizes[{g}]", size, 1)
        if len(layer_groups) != len(kv_caches):
            raise ValueError(f"layer_groups must name a group for each of the {len(kv_caches)} draft layers")
        for i, g in enumerate(layer_groups):
            check_int_range(f"layer_groups[{i}]", g, 0, num_groups - 1)
        # Each cache in its group's block size (checked with the rest of the caches).
        super().__init__(model, config, kv_caches, cache_block_sizes=[block_sizes[g] for g in layer_groups])
        self.layer_groups = list(layer_groups)
        self.block_sizes = list(block_sizes)

    @property
    def num_groups(self) -> int:
        return len(self.block_sizes)

    @property
    def table_block_size(self) -> int:
        """metadata.block_table is group 0's."""
        return self.block_sizes[0]

    @torch.no_grad()
    def propose(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        next_token_ids: torch.Tensor,
        metadata: GroupedBatchMetadata,
        sampling: SamplingParams | None = None,
        *,
        token_indices_to_sample: torch.Tensor | None = None,
        num_rejected_tokens: torch.Tensor | None = None,
    ) -> DraftOutput:
        """As EagleProposer.propose, with every group's block table and slot mapping."""
        self.check_groups(metadata, target_token_ids.shape[0])
        window = self.checked_window(
            TargetWindow(target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata,
                         token_indices_to_sample, num_rejected_tokens),
            sampling,
        )  # fmt: skip
        return draft_k_tokens(
            self.model, self.kv_caches, self.config, window, sampling,
            advance=functools.partial(advance_groups, block_sizes=self.block_sizes,
                                      max_model_len=self.config.max_model_len),
            attention=functools.partial(per_layer_attention, layer_groups=self.layer_groups,
                                        block_sizes=self.block_sizes),
        )  # fmt: skip

    def kv_groups(self, metadata: GroupedBatchMetadata) -> list[KVGroup]:
        """Each group's block table, slot mapping, block size and caches."""
        return [
            KVGroup(f"block_tables[{g}]", metadata.block_tables[g], f"slot_mappings[{g}]", metadata.slot_mappings[g],
                    size, [c for c, lg in zip(self.kv_caches, self.layer_groups, strict=True) if lg == g])
            for g, size in enumerate(self.block_sizes)
        ]  # fmt: skip

    def check_groups(self, metadata, num_tokens: int) -> None:
        if not isinstance(metadata, GroupedBatchMetadata):
            raise ValueError(f"metadata must be a GroupedBatchMetadata, got {type(metadata).__name__}")
        if metadata.num_groups != self.num_groups or len(metadata.slot_mappings) != self.num_groups:
            raise ValueError(
                f"metadata must hold {self.num_groups} block tables and slot mappings (one per group), "
                f"got {metadata.num_groups} and {len(metadata.slot_mappings)}"
            )
        num_reqs = metadata.num_reqs
        for g in range(self.num_groups):
            table = metadata.block_tables[g]
            check_dtype(f"block_tables[{g}]", table, INDEX_DTYPES)
            if table.dim() != 2 or table.shape[0] != num_reqs or table.shape[1] < 1:
                raise ValueError(
                    f"block_tables[{g}] must have shape ({num_reqs}, max_blocks), got {tuple(table.shape)}"
                )
            check_dtype(f"slot_mappings[{g}]", metadata.slot_mappings[g], INDEX_DTYPES)
            check_shape(f"slot_mappings[{g}]", metadata.slot_mappings[g], (num_tokens,))
