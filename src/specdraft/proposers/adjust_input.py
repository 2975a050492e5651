"""The multi-layer EAGLE adjust-input step, on specdraft's ops.

After verification a request's window may extend past its token to sample (the
rejected drafts). Before the multi-layer draft pass, each window is shifted right
by `shift` = min(tokens after the sample index, the window's first position,
cached_len), so that it ends at the token to sample; its first `shift` rows come
from a per-request cache of the previous step's tail (token ids, positions, slot
mapping, hidden states; M-RoPE positions move as a whole). The sample index moves
right by the same shift and seq_len shrinks by it. The cache is then refreshed with
the last min(MAX_SHIFT, rows up to the sample) rows of the shifted window. No host
sync: compiles under fullgraph=True (docs/design.md, "No host sync").
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch

from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, check_int_range, check_tensor_arg
from specdraft.ops import shift_and_cache_1d, shift_and_cache_hidden, shift_plan


@dataclass
class ShiftCache:
    """Per-request tails kept between steps: row b holds the last cached_lens[b]
    rows (at most MAX_SHIFT) of request b's previous shifted window, ending at its
    sampled token. Row b is batch row b across calls; zero cached_lens[b] for a new
    request. Updated in place by `adjust_input`."""

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

    shift[b] = min(window end - 1 - token_indices_to_sample[b], first position of
    window b, cache.cached_lens[b]), never negative: a window at position 0 (a
    prefill) or with an empty cache does not move. Row i of the shifted window is
    cached row cached_len - shift + i for i < shift, else input row i - shift.

    Returns shifted copies (inputs are not modified; rows past the batch are copied
    unchanged), the sample indices moved by shift and seq_lens shortened by it, and
    the shifts; `cache` is refreshed in place for the next step.
    token_indices_to_sample=None means each window's last token (shift 0).
    slot_mapping must be given exactly when the cache keeps slot mappings.
    `max_query_len` (a Python int bound on the window lengths) keeps the kernels'
    grids small; default: the token count.

    Checked mode (specdraft.checked_mode) checks the windows, sample indices, seq_lens
    and cached lengths (shift_plan's value checks). Out of contract (unchecked mode)
    nothing is read or written outside the tensors: windows are clipped to the
    batch, cache rows outside [0, MAX_SHIFT) are not read.
    """
    check_adjust_inputs(token_ids, positions, hidden_states, query_start_loc, seq_lens, cache,
                        token_indices_to_sample, slot_mapping, max_query_len)  # fmt: skip
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


def check_adjust_inputs(
    token_ids, positions, hidden_states, query_start_loc, seq_lens, cache: ShiftCache, token_indices_to_sample,
    slot_mapping, max_query_len,
) -> None:  # fmt: skip
    """adjust_input's free checks, with its own argument names (the shift ops below
    would name theirs: src, dst, cache)."""
    if not isinstance(cache, ShiftCache):
        raise ValueError(f"cache must be a ShiftCache, got {type(cache).__name__}")
    if (slot_mapping is None) != (cache.slot_mapping is None):
        raise ValueError("slot_mapping must be given exactly when the cache keeps slot mappings")
    check_tensor_arg("token_ids", token_ids, INDEX_DTYPES, rank=1)
    num_tokens = token_ids.shape[0]
    check_tensor_arg("positions", positions, INDEX_DTYPES, shape=[(num_tokens,), (None, num_tokens)],
                     device_of=token_ids)  # fmt: skip
    check_tensor_arg("hidden_states", hidden_states, FLOAT_DTYPES, shape=(num_tokens, None), device_of=token_ids)
    check_tensor_arg("query_start_loc", query_start_loc, INDEX_DTYPES, shape=(at_least(1, "B + 1"),),
                     device_of=token_ids)  # fmt: skip
    num_reqs = query_start_loc.shape[0] - 1
    check_tensor_arg("seq_lens", seq_lens, INDEX_DTYPES, shape=(num_reqs,), device_of=token_ids)
    check_tensor_arg("token_indices_to_sample", token_indices_to_sample, INDEX_DTYPES, shape=(num_reqs,),
                     device_of=token_ids, optional=True)  # fmt: skip
    check_tensor_arg("slot_mapping", slot_mapping, INDEX_DTYPES, shape=(num_tokens,), device_of=token_ids,
                     optional=True)  # fmt: skip
    max_shift = cache.max_shift
    check_tensor_arg("cache.token_ids", cache.token_ids, token_ids.dtype, shape=(num_reqs, max_shift),
                     device_of=token_ids)  # fmt: skip
    check_tensor_arg("cache.positions", cache.positions, positions.dtype,
                     shape=(*positions.shape[:-1], num_reqs, max_shift), device_of=token_ids)  # fmt: skip
    check_tensor_arg("cache.hidden_states", cache.hidden_states, hidden_states.dtype,
                     shape=(num_reqs, max_shift, hidden_states.shape[1]), device_of=token_ids)  # fmt: skip
    check_tensor_arg("cache.cached_lens", cache.cached_lens, INDEX_DTYPES, shape=(num_reqs,), device_of=token_ids)
    if slot_mapping is not None:
        check_tensor_arg("cache.slot_mapping", cache.slot_mapping, slot_mapping.dtype, shape=(num_reqs, max_shift),
                         device_of=token_ids)  # fmt: skip
    check_int_range("max_query_len", max_query_len, 0, optional=True)
