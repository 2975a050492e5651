"""Preparing the draft's inputs after the target's rejection step (references 001, 002).

Three ops, all single-launch and elementwise over requests (or over output tokens):

- `prepare_eagle_input` (unpadded path, 002 `prepare_inputs`): drop each request's
  rejected tail and pack the kept token indices. The output length is one host-known
  Python int (`num_tokens`, the kept total or an upper bound of it).
- `prepare_inputs_padded` (001): keep the batch layout; per request the index of the
  token to sample and the number of rejected tokens (which stay in place as padding).
  Needs no host-side number at all.
- `prepare_next_token_padded` (001): per request the number of valid sampled tokens
  and the last valid one, else a backup token.
"""

from typing import NamedTuple

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checks import (
    INDEX_DTYPES,
    check_dtype,
    check_int_range,
    check_rank,
    check_same_device,
    check_shape,
)
from specdraft.layout import window_of

from .backend import NAMESPACE, cdiv, next_power_of_2, tl, triton, use_triton

# Elementwise ops: one program per block of requests, one request per thread.
BLOCK_REQS = 128
# prepare_eagle_input: a program owns BLOCK_TOKENS output rows and scans the requests
# BLOCK_SCAN at a time with SCAN_WARPS warps; the [BLOCK_TOKENS, BLOCK_SCAN] compare
# tile (32 int32 a thread) stays in registers. Small tiles and two warps keep B <= 64
# near one memory round trip; B = 1024 takes 8 scan iterations (benchmarks/README.md).
# Fixed sizes keep every constexpr independent of the batch, so one compiled kernel
# serves every B, also under dynamic shapes.
BLOCK_TOKENS = 16
BLOCK_SCAN = 128
SCAN_WARPS = 2
# prepare_next_token_padded: K+1 columns read BLOCK_SAMPLED at a time, NEXT_BLOCK_REQS
# requests per program in one warp: its reductions along K never leave the warp.
BLOCK_SAMPLED = 16
NEXT_BLOCK_REQS = 32


class EagleInputs(NamedTuple):
    cu_num_tokens: torch.Tensor  # [B+1], cumulative kept lengths, starting at 0
    token_indices: torch.Tensor  # [num_tokens], kept token indices packed; 0 past the total


class PaddedInputs(NamedTuple):
    token_indices_to_sample: torch.Tensor  # [B]
    num_rejected_tokens: torch.Tensor  # [B]


class NextTokens(NamedTuple):
    next_token_ids: torch.Tensor  # [B]
    valid_sampled_tokens_count: torch.Tensor  # [B], int32


# --------------------------------------------------------------------------- kernels


@triton.jit
def _prepare_eagle_input_kernel(
    cu_query_ptr,
    rejected_ptr,
    cu_out_ptr,
    indices_ptr,
    num_reqs,
    num_tokens,
    BLOCK_TOKENS: tl.constexpr,
    BLOCK_SCAN: tl.constexpr,
):
    """Output row j of request r is `start[r] + j - cu_new[r]`, i.e. j plus the tokens
    dropped by every request whose packed run ends at or before j. Each program rescans
    the (small) per-request lengths instead of waiting on another program's scan, so the
    op is one launch; program 0 also writes the new cumulative lengths."""
    pid = tl.program_id(0)
    j = pid * BLOCK_TOKENS + tl.arange(0, BLOCK_TOKENS)
    base = tl.load(cu_query_ptr).to(tl.int64)
    dropped_before = tl.zeros([BLOCK_TOKENS], dtype=tl.int32)
    carry = tl.zeros([], dtype=tl.int32)
    # Vector masks: a scalar `pid == 0` mask is not accepted by the interpreter.
    first_program = tl.full([BLOCK_SCAN], pid, tl.int32) == 0
    for r0 in range(0, num_reqs, BLOCK_SCAN):
        r = r0 + tl.arange(0, BLOCK_SCAN)
        mask = r < num_reqs
        start = tl.load(cu_query_ptr + r, mask=mask, other=0).to(tl.int32)
        stop = tl.load(cu_query_ptr + r + 1, mask=mask, other=0).to(tl.int32)
        rejected = tl.load(rejected_ptr + r, mask=mask, other=0).to(tl.int32)
        length = tl.maximum(stop - start, 0)
        kept = tl.minimum(tl.maximum(length - rejected, 0), length)
        ends = carry + tl.cumsum(kept, 0)
        tl.store(cu_out_ptr + r + 1, ends.to(cu_out_ptr.dtype.element_ty), mask=mask & first_program)
        passed = (ends[None, :] <= j[:, None]) & mask[None, :]
        dropped_before += tl.sum(tl.where(passed, (length - kept)[None, :], 0), axis=1)
        carry += tl.sum(kept, axis=0)
    zero = tl.arange(0, 1)
    tl.store(cu_out_ptr + zero, zero.to(cu_out_ptr.dtype.element_ty), mask=(zero + pid) == 0)
    index = tl.where(j < carry, base + j + dropped_before, 0)
    tl.store(indices_ptr + j, index.to(indices_ptr.dtype.element_ty), mask=j < num_tokens)


@triton.jit
def _prepare_inputs_padded_kernel(
    cu_draft_ptr,
    valid_count_ptr,
    query_start_loc_ptr,
    sample_out_ptr,
    rejected_out_ptr,
    num_reqs,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = r < num_reqs
    cu_draft = tl.load(cu_draft_ptr + r, mask=mask, other=0).to(tl.int64)
    cu_prev = tl.load(cu_draft_ptr + r - 1, mask=mask & (r > 0), other=0).to(tl.int64)
    num_drafts = cu_draft - cu_prev
    valid = tl.load(valid_count_ptr + r, mask=mask, other=0).to(tl.int64)
    # Clamped to [0, num_drafts]: in contract (1 <= valid <= drafts + 1) a no-op; a
    # discarded request with drafts (valid = 0) would otherwise sample the token
    # before its window, as vLLM's kernel does.
    rejected = tl.minimum(tl.maximum(num_drafts + 1 - valid, 0), tl.maximum(num_drafts, 0))
    last = tl.load(query_start_loc_ptr + r + 1, mask=mask, other=0).to(tl.int64) - 1
    tl.store(sample_out_ptr + r, (last - rejected).to(sample_out_ptr.dtype.element_ty), mask=mask)
    tl.store(rejected_out_ptr + r, rejected.to(rejected_out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _prepare_next_token_padded_kernel(
    sampled_ptr,
    discard_ptr,
    backup_ptr,
    next_out_ptr,
    count_out_ptr,
    vocab_size,
    num_reqs,
    num_sampled,
    stride_req,
    stride_tok,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """K+1 columns in BLOCK_K chunks (one chunk for K < BLOCK_K), so no constexpr
    depends on K: one compiled kernel for every K, also under dynamic shapes."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    req_mask = r < num_reqs
    # Every load is issued before any of their values is used (the sampled ids are
    # not masked by `discard`, which is applied afterwards): one memory round trip.
    discard = tl.load(discard_ptr + r, mask=req_mask, other=1).to(tl.int1)
    backup = tl.load(backup_ptr + r, mask=req_mask, other=0).to(tl.int64)
    row = r.to(tl.int64)[:, None] * stride_req
    count = tl.zeros([BLOCK_R], dtype=tl.int32)
    # The last valid (column, id) in one max: column in the high word, the id (in
    # [0, vocab), so non-negative) in the low word; -1 while none is valid.
    last = tl.full([BLOCK_R], -1, dtype=tl.int64)
    for k0 in range(0, num_sampled, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        tile_mask = req_mask[:, None] & (k < num_sampled)[None, :]
        ids = tl.load(sampled_ptr + row + k.to(tl.int64)[None, :] * stride_tok, mask=tile_mask, other=-1)
        ids = ids.to(tl.int64)
        # vLLM tests `id != -1`; any negative id is as invalid as -1.
        valid = (ids >= 0) & (ids < vocab_size) & tile_mask
        count += tl.sum(valid.to(tl.int32), axis=1)
        packed = tl.where(valid, (k.to(tl.int64)[None, :] << 32) | ids, -1)
        last = tl.maximum(last, tl.max(packed, axis=1))
    live = req_mask & ~discard
    next_id = tl.where(live & (last >= 0), last & 0xFFFFFFFF, backup)
    count = tl.where(live, count, 0)
    tl.store(next_out_ptr + r, next_id.to(next_out_ptr.dtype.element_ty), mask=req_mask)
    tl.store(count_out_ptr + r, count, mask=req_mask)


# ------------------------------------------------------------------------ references


def prepare_eagle_input_reference(
    cu_target_query_lens: torch.Tensor, num_rejected_tokens: torch.Tensor, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    cu = cu_target_query_lens.long()
    starts = cu[:-1]
    lengths = (cu[1:] - starts).clamp(min=0)
    kept = torch.minimum((lengths - num_rejected_tokens.long()).clamp(min=0), lengths)
    cu_new = torch.cat([kept.new_zeros(1), torch.cumsum(kept, 0)])
    j = torch.arange(num_tokens, device=cu.device)
    if starts.shape[0] == 0:
        index = torch.zeros_like(j)
    else:
        # Request of each output row: how many packed runs end at or before it.
        req = window_of(j, cu_new[1:]).clamp(max=starts.shape[0] - 1)
        index = torch.where(j < cu_new[-1], starts[req] + j - cu_new[req], 0)
    dtype = cu_target_query_lens.dtype
    return cu_new.to(dtype), index.to(dtype)


def prepare_inputs_padded_reference(
    cu_num_draft_tokens: torch.Tensor,
    valid_sampled_tokens_count: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    cu = cu_num_draft_tokens.long()
    num_drafts = cu - torch.cat([cu.new_zeros(1), cu[:-1]])
    rejected = num_drafts + 1 - valid_sampled_tokens_count.long()
    rejected = torch.minimum(rejected.clamp(min=0), num_drafts.clamp(min=0))
    last = query_start_loc[1:].long() - 1
    dtype = query_start_loc.dtype
    return (last - rejected).to(dtype), rejected.to(dtype)


def prepare_next_token_padded_reference(
    sampled_token_ids: torch.Tensor,
    discard_request_mask: torch.Tensor,
    backup_next_token_ids: torch.Tensor,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    ids = sampled_token_ids.long()
    valid = (ids >= 0) & (ids < vocab_size) & ~discard_request_mask[:, None]
    count = valid.sum(1, dtype=torch.int32)
    k = torch.arange(ids.shape[1], device=ids.device)
    last_k = torch.where(valid, k, -1).amax(1, keepdim=True)
    last_id = torch.gather(ids, 1, last_k.clamp(min=0)).squeeze(1)
    next_ids = torch.where(count > 0, last_id, backup_next_token_ids.long())
    return next_ids.to(backup_next_token_ids.dtype), count


# -------------------------------------------------------------------------- the ops


@triton_op(f"{NAMESPACE}::prepare_eagle_input", mutates_args=())
def _prepare_eagle_input_op(
    cu_target_query_lens: torch.Tensor, num_rejected_tokens: torch.Tensor, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if not use_triton(cu_target_query_lens):
        return prepare_eagle_input_reference(cu_target_query_lens, num_rejected_tokens, num_tokens)
    num_reqs = num_rejected_tokens.shape[0]
    cu_num_tokens = torch.empty_like(cu_target_query_lens)
    token_indices = torch.empty(num_tokens, dtype=cu_target_query_lens.dtype, device=cu_target_query_lens.device)
    # At least one program: program 0 writes cu_num_tokens even when no row is asked for.
    grid = (torch.sym_max(1, cdiv(num_tokens, BLOCK_TOKENS)),)
    wrap_triton(_prepare_eagle_input_kernel)[grid](
        cu_target_query_lens, num_rejected_tokens, cu_num_tokens, token_indices, num_reqs, num_tokens,
        BLOCK_TOKENS=BLOCK_TOKENS, BLOCK_SCAN=BLOCK_SCAN, num_warps=SCAN_WARPS,
    )  # fmt: skip
    return cu_num_tokens, token_indices


@triton_op(f"{NAMESPACE}::prepare_inputs_padded", mutates_args=())
def _prepare_inputs_padded_op(
    cu_num_draft_tokens: torch.Tensor,
    valid_sampled_tokens_count: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    if not use_triton(query_start_loc):
        return prepare_inputs_padded_reference(cu_num_draft_tokens, valid_sampled_tokens_count, query_start_loc)
    num_reqs = cu_num_draft_tokens.shape[0]
    sample = torch.empty(num_reqs, dtype=query_start_loc.dtype, device=query_start_loc.device)
    rejected = torch.empty(num_reqs, dtype=query_start_loc.dtype, device=query_start_loc.device)
    if num_reqs > 0:
        wrap_triton(_prepare_inputs_padded_kernel)[(cdiv(num_reqs, BLOCK_REQS),)](
            cu_num_draft_tokens, valid_sampled_tokens_count, query_start_loc, sample, rejected, num_reqs,
            BLOCK=BLOCK_REQS,
        )  # fmt: skip
    return sample, rejected


@triton_op(f"{NAMESPACE}::prepare_next_token_padded", mutates_args=())
def _prepare_next_token_padded_op(
    sampled_token_ids: torch.Tensor,
    discard_request_mask: torch.Tensor,
    backup_next_token_ids: torch.Tensor,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    if not use_triton(sampled_token_ids):
        return prepare_next_token_padded_reference(
            sampled_token_ids, discard_request_mask, backup_next_token_ids, vocab_size
        )
    num_reqs, num_sampled = sampled_token_ids.shape
    next_ids = torch.empty_like(backup_next_token_ids)
    count = torch.empty(num_reqs, dtype=torch.int32, device=sampled_token_ids.device)
    if num_reqs > 0:
        wrap_triton(_prepare_next_token_padded_kernel)[(cdiv(num_reqs, NEXT_BLOCK_REQS),)](
            sampled_token_ids, discard_request_mask, backup_next_token_ids, next_ids, count,
            vocab_size, num_reqs, num_sampled, sampled_token_ids.stride(0), sampled_token_ids.stride(1),
            # K + 1 columns in one chunk when they fit: K is fixed per deployment, so
            # int() specializes on it (B stays symbolic) and the tile is B x (K + 1).
            BLOCK_R=NEXT_BLOCK_REQS, BLOCK_K=min(BLOCK_SAMPLED, next_power_of_2(int(num_sampled))), num_warps=1,
        )  # fmt: skip
    return next_ids, count


# ---------------------------------------------------------------- public wrappers


def _check_cumulative(name: str, tensor: torch.Tensor) -> int:
    """A [B+1] cumulative index tensor; returns B."""
    check_dtype(name, tensor, INDEX_DTYPES)
    check_rank(name, tensor, 1)
    if tensor.shape[0] < 1:
        raise ValueError(f"{name} must have B + 1 >= 1 entries")
    return tensor.shape[0] - 1


def _check_per_request(name: str, tensor: torch.Tensor, num_reqs: int, dtypes=INDEX_DTYPES) -> None:
    check_dtype(name, tensor, dtypes)
    check_shape(name, tensor, (num_reqs,))


def prepare_eagle_input(
    cu_target_query_lens: torch.Tensor,
    num_rejected_tokens: torch.Tensor,
    num_tokens: int,
) -> EagleInputs:
    """Unpadded path: drop each request's rejected tail and pack the kept token indices.

    cu_target_query_lens: [B+1] int32/int64, cumulative target query lengths from 0.
    num_rejected_tokens: [B], 0 <= rejected <= query length (out-of-range counts are
    clamped into [0, query length]).
    num_tokens: a Python int, the length of the index output: the kept total
    (= total tokens - total rejected) or an upper bound of it. This path needs this one
    host-side number (the caller knows it on the host, or passes the total token count
    as a bound); the padded path (`prepare_inputs_padded`) needs none.

    Returns `EagleInputs(cu_num_tokens [B+1], token_indices [num_tokens])`, both in the
    dtype of cu_target_query_lens: cu_num_tokens[0] = 0, cu_num_tokens[b+1] -
    cu_num_tokens[b] = kept length of request b; token_indices holds, request after
    request, the first kept-length indices of each window. Rows at or past the kept
    total are 0 (a valid row to gather from whenever the batch has a token).
    """
    num_reqs = _check_cumulative("cu_target_query_lens", cu_target_query_lens)
    _check_per_request("num_rejected_tokens", num_rejected_tokens, num_reqs)
    check_int_range("num_tokens", num_tokens, 0)
    check_same_device({"cu_target_query_lens": cu_target_query_lens, "num_rejected_tokens": num_rejected_tokens})
    return EagleInputs(*_prepare_eagle_input_op(cu_target_query_lens, num_rejected_tokens, num_tokens))


def prepare_inputs_padded(
    cu_num_draft_tokens: torch.Tensor,
    valid_sampled_tokens_count: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> PaddedInputs:
    """Padded path: per request the token to sample and the number of rejected tokens,
    which stay in the batch as padding. No host-side number needed.

    cu_num_draft_tokens: [B], the *inclusive* cumulative sum of draft counts (entry b
    counts requests 0..b). valid_sampled_tokens_count: [B], 1 + accepted drafts (as
    returned by `prepare_next_token_padded`). query_start_loc: [B+1].

    rejected = drafts + 1 - valid (0 for a request without drafts), clamped to
    [0, drafts]; token_indices_to_sample = query_start_loc[b+1] - 1 - rejected.
    Returns `PaddedInputs(token_indices_to_sample, num_rejected_tokens)`, [B] each, in
    the dtype of query_start_loc.
    """
    num_reqs = _check_cumulative("query_start_loc", query_start_loc)
    _check_per_request("cu_num_draft_tokens", cu_num_draft_tokens, num_reqs)
    _check_per_request("valid_sampled_tokens_count", valid_sampled_tokens_count, num_reqs)
    check_same_device(
        {
            "query_start_loc": query_start_loc,
            "cu_num_draft_tokens": cu_num_draft_tokens,
            "valid_sampled_tokens_count": valid_sampled_tokens_count,
        }
    )
    return PaddedInputs(*_prepare_inputs_padded_op(cu_num_draft_tokens, valid_sampled_tokens_count, query_start_loc))


def prepare_next_token_padded(
    sampled_token_ids: torch.Tensor,
    discard_request_mask: torch.Tensor,
    backup_next_token_ids: torch.Tensor,
    vocab_size: int,
) -> NextTokens:
    """Per request the count of valid sampled tokens and the last valid one.

    sampled_token_ids: [B, K+1] int32/int64; an entry is valid iff 0 <= id < vocab_size
    (-1 marks a rejected slot; vLLM's kernel counted other negative ids as valid).
    discard_request_mask: [B] bool. backup_next_token_ids: [B] int32/int64.

    next_token_ids[b] = the last valid entry of row b, or backup_next_token_ids[b] when
    the row has none or the request is discarded (count 0).
    Returns `NextTokens(next_token_ids [B] in backup's dtype, valid_sampled_tokens_count
    [B] int32)`.
    """
    check_dtype("sampled_token_ids", sampled_token_ids, INDEX_DTYPES)
    check_rank("sampled_token_ids", sampled_token_ids, 2)
    num_reqs, num_sampled = sampled_token_ids.shape
    if num_sampled < 1:
        raise ValueError(f"sampled_token_ids must have K+1 >= 1 columns, got shape {tuple(sampled_token_ids.shape)}")
    _check_per_request("discard_request_mask", discard_request_mask, num_reqs, (torch.bool,))
    _check_per_request("backup_next_token_ids", backup_next_token_ids, num_reqs)
    check_int_range("vocab_size", vocab_size, 1)
    check_same_device(
        {
            "sampled_token_ids": sampled_token_ids,
            "discard_request_mask": discard_request_mask,
            "backup_next_token_ids": backup_next_token_ids,
        }
    )
    return NextTokens(
        *_prepare_next_token_padded_op(sampled_token_ids, discard_request_mask, backup_next_token_ids, vocab_size)
    )
