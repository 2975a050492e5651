"""Dropping the rejected drafts, unpadded path: `prepare_eagle_input` keeps each
request's accepted tokens and packs their indices, in one launch. The output length
is one host-known Python int (`num_tokens`, the kept total or an upper bound of it).
The padded path, which keeps the batch layout and needs no host-side number:
prepare_inputs.py.
"""

from typing import NamedTuple

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import INDEX_DTYPES, at_least, check_int_range, check_tensor_arg
from specdraft.layout import window_of

from .backend import NAMESPACE, cdiv, tl, triton, use_triton
from .prepare_inputs import check_rejection_values

# A program owns BLOCK_TOKENS output rows and scans the requests BLOCK_SCAN at a time
# with SCAN_WARPS warps; the [BLOCK_TOKENS, BLOCK_SCAN] compare tile (32 int32 a
# thread) stays in registers. Small tiles and two warps keep B <= 64 near one memory
# round trip; B = 1024 takes 8 scan iterations (benchmarks/README.md). Fixed sizes
# keep every constexpr independent of the batch, so one compiled kernel serves every
# B, also under dynamic shapes.
BLOCK_TOKENS = 16
BLOCK_SCAN = 128
SCAN_WARPS = 2


class EagleInputs(NamedTuple):
    cu_num_tokens: torch.Tensor  # [B+1], cumulative kept lengths, starting at 0
    token_indices: torch.Tensor  # [num_tokens], kept token indices packed; 0 past the total


# --------------------------------------------------------------------------- kernel


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


# ------------------------------------------------------------------------ reference


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


# ------------------------------------------------------------------------------ op


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


# ---------------------------------------------------------------- public wrapper


def prepare_eagle_input(
    cu_target_query_lens: torch.Tensor,
    num_rejected_tokens: torch.Tensor,
    num_tokens: int,
) -> EagleInputs:
    """Unpadded path: drop each request's rejected tail and pack the kept token indices.

    This path needs one host-side number, num_tokens (the caller knows it on the host,
    or passes the total token count as a bound); the padded path
    (`prepare_inputs_padded`) needs none.

    Args:
        cu_target_query_lens: [B + 1] int32/int64, cumulative target query lengths from 0.
        num_rejected_tokens: [B] int32/int64, 0 <= rejected <= query length (out-of-range
            counts are clamped into [0, query length]).
        num_tokens: Python int >= 0, the length of the index output: the kept total
            (= total tokens - total rejected) or an upper bound of it.

    Returns:
        EagleInputs, both in the dtype of cu_target_query_lens:
            cu_num_tokens: [B + 1]. cu_num_tokens[0] = 0, cu_num_tokens[b + 1] -
                cu_num_tokens[b] = kept length of request b.
            token_indices: [num_tokens]. Request after request, the first kept-length indices
                of each window. Rows at or past the kept total are 0 (a valid row to gather
                from whenever the batch has a token).

    Out of contract (unchecked mode): decreasing windows count as empty; the indices
    stay inside the windows given, which need not be inside the batch: a caller
    gathering with them clamps (the proposers do).
    """
    check_tensor_arg("cu_target_query_lens", cu_target_query_lens, INDEX_DTYPES, shape=(at_least(1, "B + 1"),))
    num_reqs = cu_target_query_lens.shape[0] - 1
    check_tensor_arg(
        "num_rejected_tokens", num_rejected_tokens, INDEX_DTYPES, shape=(num_reqs,), device_of=cu_target_query_lens
    )
    check_int_range("num_tokens", num_tokens, 0)
    if is_checked():
        check_rejection_values(
            cu_target_query_lens, num_rejected_tokens, name="cu_target_query_lens", num_tokens=num_tokens
        )
    return EagleInputs(*_prepare_eagle_input_op(cu_target_query_lens, num_rejected_tokens, num_tokens))
