"""Copy and expand the target model's inputs into the drafting layout for parallel
drafting (vLLM's `copy_and_expand_eagle_inputs_kernel`).

Request r owns input tokens [start, stop) = [query_start_loc[r], query_start_loc[r+1]),
of which the last `num_rejected_tokens[r]` were rejected drafts. With P =
`num_padding_slots_per_request` new tokens per request (the bonus token and P - 1
parallel-drafting slots) and s = 1 if `shift_input_ids` else 0, the request gets an
output window of L + P - s slots (L = stop - start) starting at start + r * (P - s):

    j <  v            valid:      input_ids = target_token_ids[start + s + j]
    j == v            bonus:      input_ids = next_token_ids[r]
    v < j < v + P     parallel:   input_ids = parallel_drafting_token_id, masked
    j >= v + P        rejected:   input_ids = padding_token_id, position 0, rejected

with v = L - num_rejected - s valid tokens; positions are first_position + j (not
shifted: with s = 1 output slot j pairs the next token with the hidden state of
input token j). new_token_indices[r * P + k] = out_start + v + k are the P slots to
sample. hidden_state_mapping[start + j] = out_start + j sends each input token's
hidden state to its output slot.

Differences from vLLM, on purpose:
- vLLM leaves output slots past the batch (the tail that CUDA-graph padding of the
  input adds) and their hidden-state mapping unwritten; here the tail is written as
  rejected padding and the padded input tokens map one-to-one onto it, so every
  output is defined and the mapping is injective over the whole input
  (`index_copy_` with it is deterministic).
- the mapping is produced with and without the shift (the same rule).
- vLLM sizes the token-block grid from max_query_len and silently drops tokens past
  it; here each program strides over its window, so `max_query_len` is only a grid
  hint and any value gives the same result.
"""

from typing import NamedTuple

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import INDEX_DTYPES, at_least, check_bool, check_int_range, check_tensor_arg
from specdraft.layout import window_of
from specdraft.value_checks import window_lengths

from .backend import NAMESPACE, cdiv, next_power_of_2, tl, triton, use_triton

# Decode windows are a handful of slots; 64 keeps one program's lanes mostly busy
# there while a prefill window spreads over several programs.
BLOCK_TOKENS = 64
NUM_WARPS = 2
# Grid axis 1 is limited to 65535; programs stride over longer windows anyway.
MAX_TOKEN_BLOCKS = 4096
MAX_NEW_SLOTS = 64
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class ExpandedInputs(NamedTuple):
    input_ids: torch.Tensor  # [T_out], dtype of target_token_ids
    positions: torch.Tensor  # [T_out], dtype of target_positions
    is_rejected_token_mask: torch.Tensor  # [T_out] bool
    is_masked_token_mask: torch.Tensor  # [T_out] bool: the parallel-drafting slots
    new_token_indices: torch.Tensor  # [B * P], dtype of query_start_loc
    hidden_state_mapping: torch.Tensor  # [T_in], dtype of query_start_loc


# --------------------------------------------------------------------------- kernel


@triton.jit
def _copy_and_expand_kernel(
    target_ids_ptr,
    target_pos_ptr,
    next_ids_ptr,
    query_start_loc_ptr,
    rejected_ptr,
    out_ids_ptr,
    out_pos_ptr,
    out_rejected_ptr,
    out_masked_ptr,
    out_new_ptr,
    out_map_ptr,
    num_reqs,
    num_tokens_in,
    num_tokens_out,
    num_slots,
    padding_token_id,
    parallel_token_id,
    SHIFT: tl.constexpr,
    HAS_REJECTED: tl.constexpr,
    PADDED_SLOTS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Program (num_reqs, *) is the tail past the batch: a pseudo-request whose input
    # ends at num_tokens_in and whose every output slot is rejected padding.
    req = tl.program_id(0)
    is_req = req < num_reqs
    growth = num_slots - SHIFT
    start = tl.load(query_start_loc_ptr + req).to(tl.int64)
    stop = tl.load(query_start_loc_ptr + req + 1, mask=is_req, other=num_tokens_in).to(tl.int64)
    # Windows clipped to the input: a no-op in contract; out of it, a garbage bound
    # must not run the strided loop below for ages (the reference clips alike).
    start = tl.minimum(tl.maximum(start, 0), num_tokens_in)
    stop = tl.minimum(tl.maximum(stop, start), num_tokens_in)
    length = stop - start
    rejected = 0
    if HAS_REJECTED:
        rejected = tl.load(rejected_ptr + req, mask=is_req, other=0).to(tl.int64)
    valid = tl.minimum(tl.maximum(length - rejected - SHIFT, 0), tl.maximum(length - SHIFT, 0))
    valid = tl.where(is_req, valid, -num_slots)
    window = tl.where(is_req, length + growth, length)
    out_start = start + req.to(tl.int64) * growth
    has_first = is_req & (length > 0) & (start >= 0) & (start < num_tokens_in)
    first_pos = tl.load(target_pos_ptr + start, mask=has_first, other=0).to(tl.int64)
    bonus = tl.load(next_ids_ptr + req, mask=is_req, other=0)

    lanes = tl.arange(0, BLOCK).to(tl.int64)
    lo = tl.program_id(1).to(tl.int64) * BLOCK
    step = tl.num_programs(1).to(tl.int64) * BLOCK
    # Striding keeps the result independent of the grid: a window longer than the
    # grid's max_query_len hint is still covered, just by fewer programs.
    for j0 in range(lo, window, step):
        j = j0 + lanes
        is_valid = j < valid
        is_bonus = j == valid
        is_par = (j > valid) & (j < valid + num_slots)
        is_rej = j >= valid + num_slots
        out = out_start + j
        write = (j < window) & (out >= 0) & (out < num_tokens_out)
        src = start + SHIFT + j
        src_ok = write & is_valid & (src >= 0) & (src < num_tokens_in)
        ids = tl.load(target_ids_ptr + src, mask=src_ok, other=0)
        ids = tl.where(is_bonus, bonus, ids)
        ids = tl.where(is_par, parallel_token_id, ids)
        ids = tl.where(is_rej, padding_token_id, ids)
        tl.store(out_ids_ptr + out, ids, mask=write)
        tl.store(out_pos_ptr + out, tl.where(is_rej, 0, first_pos + j), mask=write)
        tl.store(out_rejected_ptr + out, is_rej, mask=write)
        tl.store(out_masked_ptr + out, is_par, mask=write)
        # window >= length, so this loop covers every input token of the request.
        src_tok = start + j
        map_ok = (j < length) & (src_tok >= 0) & (src_tok < num_tokens_in)
        tl.store(out_map_ptr + src_tok, out, mask=map_ok)

    if tl.program_id(1) == 0:
        k = tl.arange(0, PADDED_SLOTS)
        new_idx = out_start + valid + k
        # (a scalar & vector mask trips the interpreter; compare against a scalar bound)
        tl.store(out_new_ptr + req.to(tl.int64) * num_slots + k, new_idx, mask=k < tl.where(is_req, num_slots, 0))


# ------------------------------------------------------------------------ reference


def _gather(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values[index.clamp(...)], or zeros when values is empty (no input tokens)."""
    if values.shape[0] == 0:
        return torch.zeros(index.shape, dtype=values.dtype, device=values.device)
    return values[index.clamp(0, values.shape[0] - 1)]


def copy_and_expand_inputs_reference(
    target_token_ids: torch.Tensor,
    target_positions: torch.Tensor,
    next_token_ids: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_rejected_tokens: torch.Tensor | None,
    num_padding_slots_per_request: int,
    padding_token_id: int,
    parallel_drafting_token_id: int,
    shift_input_ids: bool,
) -> ExpandedInputs:
    device = target_token_ids.device
    num_in, num_reqs = target_token_ids.shape[0], query_start_loc.shape[0] - 1
    slots, shift = num_padding_slots_per_request, int(shift_input_ids)
    growth = slots - shift
    num_out = num_in + num_reqs * growth

    # Per request, plus the tail past the batch as request num_reqs (as in the kernel).
    req = torch.arange(num_reqs + 1, device=device)
    is_req = req < num_reqs
    raw = query_start_loc.long()
    starts = raw.clamp(0, num_in)  # windows clipped to the input, as in the kernel
    stops = torch.cat([raw[1:], raw.new_full((1,), num_in)])
    stops = torch.maximum(stops, starts).clamp(max=num_in)
    lengths = stops - starts
    rejected = torch.zeros_like(starts)
    if num_rejected_tokens is not None:
        rejected = torch.cat([num_rejected_tokens.long(), rejected[:1]])
    valid = torch.minimum((lengths - rejected - shift).clamp(min=0), (lengths - shift).clamp(min=0))
    valid = torch.where(is_req, valid, -slots)
    windows = torch.where(is_req, lengths + growth, lengths)
    out_starts = starts + req * growth
    first_pos = torch.where(is_req & (lengths > 0), _gather(target_positions, starts).long(), 0)
    bonus = torch.cat([next_token_ids, next_token_ids.new_zeros(1)])

    # Output windows tile [0, num_out) in request order: find each slot's owner.
    slot = torch.arange(num_out, device=device)
    owner = window_of(slot, out_starts + windows).clamp(max=num_reqs)
    j = slot - out_starts[owner]
    v = valid[owner]
    is_bonus = j == v
    is_par = (j > v) & (j < v + slots)
    is_rej = j >= v + slots
    ids_dtype = target_token_ids.dtype
    copied = _gather(target_token_ids, starts[owner] + shift + j)
    ids = torch.where(is_bonus, bonus[owner].to(ids_dtype), copied)
    ids = torch.where(is_par, parallel_drafting_token_id, ids)
    ids = torch.where(is_rej, padding_token_id, ids)
    positions = torch.where(is_rej, 0, first_pos[owner] + j).to(target_positions.dtype)

    index_dtype = query_start_loc.dtype
    new_token_indices = (out_starts + valid)[:num_reqs, None] + torch.arange(slots, device=device)
    token = torch.arange(num_in, device=device)
    token_owner = window_of(token, stops).clamp(max=num_reqs)
    mapping = token + token_owner * growth
    return ExpandedInputs(
        ids,
        positions,
        is_rej,
        is_par,
        new_token_indices.reshape(-1).to(index_dtype),
        mapping.to(index_dtype),
    )


# ------------------------------------------------------------------------------ op


@triton_op(f"{NAMESPACE}::copy_and_expand_inputs", mutates_args=())
def _copy_and_expand_op(
    target_token_ids: torch.Tensor,
    target_positions: torch.Tensor,
    next_token_ids: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_rejected_tokens: torch.Tensor | None,
    num_padding_slots_per_request: int,
    padding_token_id: int,
    parallel_drafting_token_id: int,
    shift_input_ids: bool,
    max_query_len: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if not use_triton(target_token_ids):
        return tuple(
            copy_and_expand_inputs_reference(
                target_token_ids,
                target_positions,
                next_token_ids,
                query_start_loc,
                num_rejected_tokens,
                num_padding_slots_per_request,
                padding_token_id,
                parallel_drafting_token_id,
                shift_input_ids,
            )  # fmt: skip
        )
    slots, shift = num_padding_slots_per_request, int(shift_input_ids)
    num_in, num_reqs = target_token_ids.shape[0], query_start_loc.shape[0] - 1
    num_out = num_in + num_reqs * (slots - shift)
    device = target_token_ids.device
    input_ids = torch.empty(num_out, dtype=target_token_ids.dtype, device=device)
    positions = torch.empty(num_out, dtype=target_positions.dtype, device=device)
    is_rejected = torch.empty(num_out, dtype=torch.bool, device=device)
    is_masked = torch.empty(num_out, dtype=torch.bool, device=device)
    new_token_indices = torch.empty(num_reqs * slots, dtype=query_start_loc.dtype, device=device)
    mapping = torch.empty(num_in, dtype=query_start_loc.dtype, device=device)
    # Requests plus one tail program; the token-block count comes from the host-side
    # hint, never from the device.
    token_blocks = torch.sym_min(torch.sym_max(1, cdiv(max_query_len + slots - shift, BLOCK_TOKENS)), MAX_TOKEN_BLOCKS)
    wrap_triton(_copy_and_expand_kernel)[(num_reqs + 1, token_blocks)](
        target_token_ids, target_positions, next_token_ids, query_start_loc,
        num_rejected_tokens if num_rejected_tokens is not None else query_start_loc,
        input_ids, positions, is_rejected, is_masked, new_token_indices, mapping,
        num_reqs, num_in, num_out, slots, padding_token_id, parallel_drafting_token_id,
        SHIFT=shift, HAS_REJECTED=num_rejected_tokens is not None, PADDED_SLOTS=next_power_of_2(slots),
        BLOCK=BLOCK_TOKENS, num_warps=NUM_WARPS,
    )  # fmt: skip
    return input_ids, positions, is_rejected, is_masked, new_token_indices, mapping


# ---------------------------------------------------------------- public wrapper


def copy_and_expand_inputs(
    target_token_ids: torch.Tensor,
    target_positions: torch.Tensor,
    next_token_ids: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_rejected_tokens: torch.Tensor | None,
    *,
    num_padding_slots_per_request: int,
    parallel_drafting_token_id: int,
    shift_input_ids: bool,
    padding_token_id: int = 0,
    max_query_len: int | None = None,
) -> ExpandedInputs:
    """Expand the target batch into the parallel-drafting input layout.

    T_in input tokens (possibly padded past query_start_loc[-1]), B requests, P =
    num_padding_slots_per_request, shift = int(shift_input_ids). Tensors are 1-D,
    contiguous, int32/int64, on one device.

    Args:
        target_token_ids: [T_in]. The target model's input tokens.
        target_positions: [T_in]. Each token's index in its sequence: `new_slot_mapping`
            turns these into KV slots. With M-RoPE pass that index (seq_lens minus the
            tokens after it in the window), not a rotary row: images compress those.
        next_token_ids: [B]. Each request's bonus token (the last accepted / sampled one).
        query_start_loc: [B + 1]. Request windows, query_start_loc[0] == 0, every window
            at least one token.
        num_rejected_tokens: [B], or None (none rejected). Rejected drafts at the end of
            each window, 0 <= n <= window - 1.
        num_padding_slots_per_request: Python int P in [1, 64]. New tokens per request
            (bonus + P - 1 parallel-drafting slots).
        parallel_drafting_token_id: Python int (int32 range). Id of the parallel slots.
        shift_input_ids: bool. EAGLE's shift by one (the first token of each window drops
            out, each request grows by P - 1); False (draft models) grows by P.
        padding_token_id: Python int (int32 range), default 0. Id of the rejected slots.
        max_query_len: Python int >= 0, or None (T_in). Hint of the longest window; sizes
            the grid only. Results never depend on it.

    Returns:
        ExpandedInputs, T_out = T_in + B * (P - shift):
            input_ids: [T_out], dtype of target_token_ids. Valid tokens (shifted when
                shift_input_ids), bonus token, parallel_drafting_token_id in the P - 1
                parallel slots, padding_token_id in rejected slots and the tail past the batch.
            positions: [T_out], dtype of target_positions. First position of the window
                + j; 0 where rejected.
            is_rejected_token_mask: [T_out] bool. Rejected slots and the tail (their KV must
                not be saved: `new_slot_mapping` maps them to PADDING_SLOT_ID).
            is_masked_token_mask: [T_out] bool. The parallel-drafting slots.
            new_token_indices: [B * P], dtype of query_start_loc. Output slots of the bonus
                and parallel tokens, request-major: the slots to sample drafts from.
            hidden_state_mapping: [T_in], dtype of query_start_loc. Output slot of each input
                token's hidden state (input token start + j -> out_start + j; padded input
                tokens -> the tail). Injective: `out.index_copy_(0, hidden_state_mapping,
                hidden_states)` fills T_in of the T_out rows; the P - shift slots per
                request it leaves out are the caller's to initialise.

    Out of contract (unchecked mode): windows are clipped to [0, T_in] (a decreasing
    one is empty) and nothing is read or written outside the tensors;
    new_token_indices then stay in [0, T_out); hidden_state_mapping entries of
    tokens no window covers (query_start_loc[0] > 0) are unspecified, and a caller
    indexing with them clamps (the proposers do).
    """
    check_tensor_arg("target_token_ids", target_token_ids, INDEX_DTYPES, rank=1, contiguous=True)
    num_in = target_token_ids.shape[0]
    check_tensor_arg(
        "target_positions", target_positions, INDEX_DTYPES, shape=(num_in,), contiguous=True, device_of=target_token_ids
    )
    check_tensor_arg(
        "query_start_loc", query_start_loc, INDEX_DTYPES, shape=(at_least(1, "B + 1"),), contiguous=True,
        device_of=target_token_ids,
    )  # fmt: skip
    num_reqs = query_start_loc.shape[0] - 1
    check_tensor_arg(
        "next_token_ids", next_token_ids, INDEX_DTYPES, shape=(num_reqs,), contiguous=True, device_of=target_token_ids
    )
    check_tensor_arg(
        "num_rejected_tokens", num_rejected_tokens, INDEX_DTYPES, shape=(num_reqs,), contiguous=True,
        device_of=target_token_ids, optional=True,
    )  # fmt: skip
    check_int_range("num_padding_slots_per_request", num_padding_slots_per_request, 1, MAX_NEW_SLOTS)
    check_int_range("parallel_drafting_token_id", parallel_drafting_token_id, INT32_MIN, INT32_MAX)
    check_int_range("padding_token_id", padding_token_id, INT32_MIN, INT32_MAX)
    check_bool("shift_input_ids", shift_input_ids)
    max_query_len = num_in if max_query_len is None else max_query_len
    check_int_range("max_query_len", max_query_len, 0)
    if is_checked():
        check_copy_and_expand_values(query_start_loc, num_rejected_tokens, num_in)
    return ExpandedInputs(
        *_copy_and_expand_op(
            target_token_ids,
            target_positions,
            next_token_ids,
            query_start_loc,
            num_rejected_tokens,
            num_padding_slots_per_request,
            padding_token_id,
            parallel_drafting_token_id,
            shift_input_ids,
            max_query_len,
        )  # fmt: skip
    )


# --------------------------------------------- checked mode's value checks (syncs)


def check_copy_and_expand_values(
    query_start_loc: torch.Tensor, num_rejected_tokens: torch.Tensor | None, num_tokens: int
) -> None:
    """copy_and_expand_inputs: windows from 0, non-decreasing, at least one token
    each, within the T_in input tokens; 0 <= num_rejected_tokens <= window - 1."""
    lens = window_lengths(query_start_loc, num_tokens, nonempty=True)
    if num_rejected_tokens is not None:
        for b, r in enumerate(num_rejected_tokens.tolist()):
            if not 0 <= r <= lens[b] - 1:
                raise ValueError(f"num_rejected_tokens[{b}] = {r} is outside [0, window - 1 = {lens[b] - 1}]")
