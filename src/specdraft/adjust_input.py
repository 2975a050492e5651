"""The multi-layer EAGLE adjust-input step (reference 000), on specdraft's ops.

Before the multi-layer draft pass, each request's window is shifted right so that
it ends at the token to sample; the vacated prefix comes from a per-request cache
of the previous step's tail (token ids, positions, slot mapping, hidden states),
which is then refreshed. No host sync: compiles under fullgraph=True.
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch

from specdraft.ops import shift_and_cache_1d, shift_and_cache_hidden, shift_plan


@dataclass
class ShiftCache:
    """Per-request tails kept between steps. Updated in place by `adjust_input`."""

    token_ids: torch.Tensor  # [B, MAX_SHIFT], dtype of the token ids
    positions: torch.Tensor  # [B, MAX_SHIFT] int64, or [3, B, MAX_SHIFT] for M-RoPE
    hidden_states: torch.Tensor  # [B, MAX_SHIFT, H]
    cached_lens: torch.Tensor  # [B] int32, valid entries of each tail
    slot_mapping: torch.Tensor | None = None  # [B, MAX_SHIFT] int64, when slots shift too

    @property
    def max_shift(self) -> int:
        return self.token_ids.shape[-1]

    @classmethod
    def zeros(cls, num_reqs: int, max_shift: int, hidden_size: int, *, dtype=torch.bfloat16, device="cpu",
              mrope: bool = False, slot_mapping: bool = True) -> "ShiftCache":  # fmt: skip
        lead = (3,) if mrope else ()
        return cls(
            token_ids=torch.zeros(num_reqs, max_shift, dtype=torch.int32, device=device),
            positions=torch.zeros(*lead, num_reqs, max_shift, dtype=torch.int64, device=device),
            hidden_states=torch.zeros(num_reqs, max_shift, hidden_size, dtype=dtype, device=device),
            cached_lens=torch.zeros(num_reqs, dtype=torch.int32, device=device),
            slot_mapping=torch.zeros(num_reqs, max_shift, dtype=torch.int64, device=device) if slot_mapping else None,
        )


class AdjustedInput(NamedTuple):
    token_ids: torch.Tensor
    positions: torch.Tensor
    hidden_states: torch.Tensor
    slot_mapping: torch.Tensor | None
    token_indices_to_sample: torch.Tensor
    seq_lens: torch.Tensor
    shift: torch.Tensor


def adjust_input(
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    hidden_states: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    cache: ShiftCache,
    *,
    token_indices_to_sample: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
    max_query_len: int | None = None,
) -> AdjustedInput:
    """Shift every request's window to end at its token to sample.

    Returns shifted copies (inputs are not modified; rows past the batch are copied
    unchanged) with the moved sample indices and shortened seq_lens; `cache` is
    refreshed in place for the next step. `max_query_len` (a Python int bound on the
    window lengths) keeps the kernels' grids small; default: the token count.
    """
    if (slot_mapping is None) != (cache.slot_mapping is None):
        raise ValueError("slot_mapping must be given exactly when the cache keeps slot mappings")
    plan = shift_plan(query_start_loc, positions, token_indices_to_sample, seq_lens, cache.cached_lens, cache.max_shift)
    args = (query_start_loc, plan.token_indices_to_sample, plan.shift, cache.cached_lens, max_query_len)

    # dst starts as a copy so tokens past the batch (graph padding) stay defined.
    out_ids, out_positions, out_hidden = token_ids.clone(), positions.clone(), hidden_states.clone()
    shift_and_cache_1d(token_ids, out_ids, cache.token_ids, *args)
    shift_and_cache_1d(positions, out_positions, cache.positions, *args)
    shift_and_cache_hidden(hidden_states, out_hidden, cache.hidden_states, *args)
    out_slots = None
    if slot_mapping is not None:
        out_slots = slot_mapping.clone()
        shift_and_cache_1d(slot_mapping, out_slots, cache.slot_mapping, *args)
    # Last: every op above reads the old cached lengths.
    cache.cached_lens.copy_(plan.cached_lens)
    return AdjustedInput(
        out_ids, out_positions, out_hidden, out_slots, plan.token_indices_to_sample, plan.seq_lens, plan.shift
    )
