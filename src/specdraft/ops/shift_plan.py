"""The shift plan of the multi-layer EAGLE input shift: how far each request's
window moves before a draft pass (the shift itself: ops/shift_and_cache/).

Per request b with window [start, stop), sample index s, cached length c and the
window's first position p0:

    shift           = min(max(min(stop - 1 - s, p0), 0), c)
    sample'         = s + shift
    seq_len'        = seq_len - shift
    cached_len'     = min(MAX_SHIFT, rows of the window up to sample')   (after the refresh)

Elementwise over requests, one launch.
"""

from typing import NamedTuple

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import INDEX_DTYPES, at_least, check_int_range, check_tensor_arg
from specdraft.value_checks import check_in_range, window_lengths

from .backend import NAMESPACE, cdiv, tl, triton, use_triton
from .shift_and_cache.window import MAX_SHIFT_LIMIT

BLOCK_REQS = 256


class ShiftPlan(NamedTuple):
    shift: torch.Tensor  # [B], how far each window moves right
    token_indices_to_sample: torch.Tensor  # [B], moved by shift
    seq_lens: torch.Tensor  # [B], shortened by shift
    cached_lens: torch.Tensor  # [B], cache length after the refresh


@triton.jit
def _shift_plan_kernel(
    query_start_loc_ptr,
    positions_ptr,
    sample_ptr,
    seq_lens_ptr,
    cached_lens_ptr,
    shift_out_ptr,
    sample_out_ptr,
    seq_lens_out_ptr,
    cached_lens_out_ptr,
    num_reqs,
    num_tokens,
    MAX_SHIFT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    req = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = req < num_reqs
    start = tl.load(query_start_loc_ptr + req, mask=mask, other=0).to(tl.int64)
    stop = tl.load(query_start_loc_ptr + req + 1, mask=mask, other=0).to(tl.int64)
    sample = tl.load(sample_ptr + req, mask=mask, other=0).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + req, mask=mask, other=0).to(tl.int64)
    cached_len = tl.load(cached_lens_ptr + req, mask=mask, other=0).to(tl.int64)
    # An empty window has no first token; its position reads as 0 (no shift).
    has_first = mask & (start >= 0) & (start < num_tokens)  # start < 0: out of contract, read nothing
    first_pos = tl.load(positions_ptr + start, mask=has_first, other=0)

    shift = tl.minimum(stop - 1 - sample, first_pos.to(tl.int64))
    shift = tl.minimum(tl.maximum(shift, 0), cached_len)
    sample = sample + shift
    store_start = tl.maximum(start, sample + 1 - MAX_SHIFT)
    store_len = tl.minimum(tl.maximum(sample - store_start + 1, 0), MAX_SHIFT)

    tl.store(shift_out_ptr + req, shift, mask=mask)
    tl.store(sample_out_ptr + req, sample, mask=mask)
    tl.store(seq_lens_out_ptr + req, seq_len - shift, mask=mask)
    tl.store(cached_lens_out_ptr + req, store_len, mask=mask)


def shift_plan_reference(
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    token_indices_to_sample: torch.Tensor,
    seq_lens: torch.Tensor,
    cached_lens: torch.Tensor,
    max_shift: int,
) -> ShiftPlan:
    first_row = positions[0] if positions.dim() == 2 else positions
    start = query_start_loc[:-1].long()
    stop = query_start_loc[1:].long()
    sample = token_indices_to_sample.long()
    num_tokens = first_row.shape[0]
    if num_tokens == 0:
        first_pos = torch.zeros_like(start)
    else:
        gathered = first_row[start.clamp(0, num_tokens - 1)].long()
        first_pos = torch.where((start >= 0) & (start < num_tokens), gathered, 0)
    shift = torch.minimum(stop - 1 - sample, first_pos).clamp(min=0)
    shift = torch.minimum(shift, cached_lens.long())
    sample = sample + shift
    store_start = torch.maximum(start, sample + 1 - max_shift)
    store_len = (sample - store_start + 1).clamp(0, max_shift)
    return ShiftPlan(
        shift.to(token_indices_to_sample.dtype),
        sample.to(token_indices_to_sample.dtype),
        (seq_lens.long() - shift).to(seq_lens.dtype),
        store_len.to(cached_lens.dtype),
    )


@triton_op(f"{NAMESPACE}::shift_plan", mutates_args=())
def _shift_plan_op(
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    token_indices_to_sample: torch.Tensor,
    seq_lens: torch.Tensor,
    cached_lens: torch.Tensor,
    max_shift: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if not use_triton(query_start_loc):
        return tuple(
            shift_plan_reference(query_start_loc, positions, token_indices_to_sample, seq_lens, cached_lens, max_shift)
        )
    num_reqs = token_indices_to_sample.shape[0]
    shift = torch.empty_like(token_indices_to_sample)
    sample = torch.empty_like(token_indices_to_sample)
    new_seq_lens = torch.empty_like(seq_lens)
    new_cached_lens = torch.empty_like(cached_lens)
    if num_reqs > 0:
        wrap_triton(_shift_plan_kernel)[(cdiv(num_reqs, BLOCK_REQS),)](
            query_start_loc, positions, token_indices_to_sample, seq_lens, cached_lens,
            shift, sample, new_seq_lens, new_cached_lens,
            num_reqs, positions.shape[-1],
            MAX_SHIFT=int(max_shift), BLOCK=BLOCK_REQS,  # specializes a SymInt, as in the shift ops
        )  # fmt: skip
    return shift, sample, new_seq_lens, new_cached_lens


def shift_plan(
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    token_indices_to_sample: torch.Tensor | None,
    seq_lens: torch.Tensor,
    cached_lens: torch.Tensor,
    max_shift: int,
) -> ShiftPlan:
    """The adjust-input step: how far to shift each request's window.

    shift = clamp(min(window end - token_indices_to_sample, first position of the
    window), 0), then limited by cached_lens. Inputs are not modified.

    Unlike vLLM, which moves the sample index and seq_lens by the shift *before*
    limiting it by the cached length, all outputs here use the one limited shift,
    so the moved index always points at the token the data moved to.

    Args:
        query_start_loc: [B + 1] int32/int64, the request windows.
        positions: [T] or M-RoPE [3, T] int32/int64, contiguous (row 0 decides).
        token_indices_to_sample: [B] int32/int64, or None (each window's last token).
        seq_lens: [B] int32/int64.
        cached_lens: [B] int32/int64, the cached length of each request.
        max_shift: Python int MAX_SHIFT in [1, 8], the cache width.

    Returns:
        ShiftPlan:
            shift: [B], dtype of token_indices_to_sample. How far each window moves right.
            token_indices_to_sample: [B], same dtype. The sample indices, moved by shift.
            seq_lens: [B], dtype of seq_lens. Shortened by shift.
            cached_lens: [B], dtype of cached_lens. The length of the cache after
                `shift_and_cache_*` refreshes it (min(MAX_SHIFT, rows up to the sample index)).

    Out of contract (unchecked mode): a window starting outside the positions reads
    its first position as 0; every output is computed elementwise, so the outputs
    are defined but meaningless.
    """
    check_tensor_arg("query_start_loc", query_start_loc, INDEX_DTYPES, shape=(at_least(1, "B + 1"),))
    num_reqs = query_start_loc.shape[0] - 1
    if token_indices_to_sample is None:
        token_indices_to_sample = query_start_loc[1:] - 1
    check_tensor_arg(
        "token_indices_to_sample", token_indices_to_sample, INDEX_DTYPES, shape=(num_reqs,), device_of=query_start_loc
    )
    check_tensor_arg("seq_lens", seq_lens, INDEX_DTYPES, shape=(num_reqs,), device_of=query_start_loc)
    check_tensor_arg("cached_lens", cached_lens, INDEX_DTYPES, shape=(num_reqs,), device_of=query_start_loc)
    check_tensor_arg("positions", positions, INDEX_DTYPES, rank=(1, 2), contiguous=True, device_of=query_start_loc)
    check_int_range("max_shift", max_shift, 1, MAX_SHIFT_LIMIT)
    if is_checked():
        check_shift_plan_values(query_start_loc, positions, token_indices_to_sample, seq_lens, cached_lens, max_shift)
    return ShiftPlan(
        *_shift_plan_op(query_start_loc, positions, token_indices_to_sample, seq_lens, cached_lens, max_shift)
    )


# --------------------------------------------- checked mode's value checks (syncs)


def check_shift_plan_values(
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    token_indices_to_sample: torch.Tensor | None,
    seq_lens: torch.Tensor,
    cached_lens: torch.Tensor,
    max_shift: int,
) -> None:
    """A shift_plan / adjust_input input: windows as for shift-and-cache within the
    positions' T tokens, 0 <= cached_lens <= max_shift, each sample index inside its
    window, seq_lens at least the window, positions (row 0) non-negative."""
    num_tokens = positions.shape[-1]
    lens = window_lengths(query_start_loc, num_tokens)
    qsl = query_start_loc.tolist()
    samples = None if token_indices_to_sample is None else token_indices_to_sample.tolist()
    cached, seq = cached_lens.tolist(), seq_lens.tolist()
    for b, n in enumerate(lens):
        if not 0 <= cached[b] <= max_shift:
            raise ValueError(f"cached_lens[{b}] = {cached[b]} is outside [0, max_shift={max_shift}]")
        if seq[b] < n:
            raise ValueError(f"seq_lens[{b}] = {seq[b]} is shorter than request {b}'s window of {n} tokens")
        if samples is not None and n > 0 and not qsl[b] <= samples[b] < qsl[b + 1]:
            raise ValueError(
                f"token_indices_to_sample[{b}] = {samples[b]} is outside its window [{qsl[b]}, {qsl[b + 1]})"
            )
    row = positions[0] if positions.dim() == 2 else positions
    check_in_range("positions", row[: qsl[-1] if qsl else 0], 0, None)
