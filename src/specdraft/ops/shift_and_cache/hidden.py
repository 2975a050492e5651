"""`shift_and_cache_hidden`: the shift (this package's docstring) applied to hidden
states [T, H]: a [tokens x hidden] tile per program, only token block 0 of a
request touching its cache."""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import FLOAT_DTYPES, check_int_range, check_tensor_arg

from ..backend import NAMESPACE, cdiv, next_power_of_2, tl, triton, use_triton

# Imported by name: Inductor re-emits a user Triton kernel with the jit functions it calls.
from .window import (
    CACHE_WIDTH,
    check_shift_and_cache_values,
    check_windows,
    shift_and_cache_rows_reference,
    store_window,
)

# Hidden states: a [tokens x hidden] tile per program; 32 x 256 keeps tiles small
# enough for any hidden size while each row segment is a 512-byte (bf16) burst.
BLOCK_TOKENS_HIDDEN = 32
BLOCK_HIDDEN = 256
NUM_WARPS_HIDDEN = 4


# --------------------------------------------------------------------------- kernel


@triton.jit
def _shifted_hidden(
    src_ptr, cache_req, cols, col_mask, start, i, shift, cached_len, num_tokens, hidden, mask, MAX_SHIFT
):
    from_cache = i < shift
    cache_idx = cached_len - shift + i
    cache_ok = (cache_idx >= 0) & (cache_idx < MAX_SHIFT)
    cache_mask = (mask & from_cache & cache_ok)[:, None] & col_mask[None, :]
    cached = tl.load(cache_req + cache_idx[:, None] * hidden + cols[None, :], mask=cache_mask, other=0)
    src_tok = start + i - shift
    src_ok = (src_tok >= 0) & (src_tok < num_tokens)
    body_mask = (mask & ~from_cache & src_ok)[:, None] & col_mask[None, :]
    body = tl.load(src_ptr + src_tok[:, None] * hidden + cols[None, :], mask=body_mask, other=0)
    return tl.where(from_cache[:, None], cached, body)


@triton.jit
def _shift_and_cache_hidden_kernel(
    src_ptr,
    dst_ptr,
    cache_ptr,
    query_start_loc_ptr,
    sample_ptr,
    shift_ptr,
    cached_lens_ptr,
    num_tokens,
    hidden,
    MAX_SHIFT: tl.constexpr,
    PADDED_SHIFT: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
    BLOCK_HIDDEN: tl.constexpr,
):
    req = tl.program_id(0)
    blk = tl.program_id(1)
    cols = tl.program_id(2) * BLOCK_HIDDEN + tl.arange(0, BLOCK_HIDDEN)
    col_mask = cols < hidden
    start = tl.load(query_start_loc_ptr + req).to(tl.int64)
    stop = tl.load(query_start_loc_ptr + req + 1).to(tl.int64)
    shift = tl.load(shift_ptr + req).to(tl.int64)
    cached_len = tl.load(cached_lens_ptr + req).to(tl.int64)
    cache_req = cache_ptr + req.to(tl.int64) * MAX_SHIFT * hidden

    i = blk * BLOCK_TOKENS + tl.arange(0, BLOCK_TOKENS).to(tl.int64)
    tok = start + i
    # tok >= 0: a negative query_start_loc (out of contract) must not store before dst.
    in_window = (tok >= 0) & (tok < stop) & (tok < num_tokens)
    values = _shifted_hidden(
        src_ptr, cache_req, cols, col_mask, start, i, shift, cached_len, num_tokens, hidden,
        in_window, MAX_SHIFT,
    )  # fmt: skip
    tl.store(dst_ptr + tok[:, None] * hidden + cols[None, :], values, mask=in_window[:, None] & col_mask[None, :])

    if blk == 0:
        sample = tl.load(sample_ptr + req).to(tl.int64)
        rel, keep, m = store_window(start, stop, sample, MAX_SHIFT, PADDED_SHIFT)
        fresh = _shifted_hidden(
            src_ptr, cache_req, cols, col_mask, start, rel, shift, cached_len, num_tokens, hidden,
            keep, MAX_SHIFT,
        )  # fmt: skip
        fresh = tl.where(keep[:, None], fresh, 0)
        tl.debug_barrier()  # as in the 1-D kernel: all cache reads done before writes
        slot_mask = (m < MAX_SHIFT)[:, None] & col_mask[None, :]
        tl.store(cache_req + m[:, None].to(tl.int64) * hidden + cols[None, :], fresh, mask=slot_mask)


# ------------------------------------------------------------------------ reference


def shift_and_cache_hidden_reference(src, dst, cache, query_start_loc, token_indices_to_sample, shift, cached_lens):
    """src/dst [T, H]; cache [B, MAX_SHIFT, H]."""
    new_dst, new_cache = shift_and_cache_rows_reference(
        src, dst, cache, query_start_loc, token_indices_to_sample, shift, cached_lens
    )
    dst.copy_(new_dst)
    cache.copy_(new_cache)


# --------------------------------------------------------------------------- the op


@triton_op(f"{NAMESPACE}::shift_and_cache_hidden", mutates_args=("dst", "cache"))
def _shift_and_cache_hidden_op(
    src: torch.Tensor,
    dst: torch.Tensor,
    cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    token_indices_to_sample: torch.Tensor,
    shift: torch.Tensor,
    cached_lens: torch.Tensor,
    max_query_len: int,
) -> None:
    if not use_triton(src):
        shift_and_cache_hidden_reference(src, dst, cache, query_start_loc, token_indices_to_sample, shift, cached_lens)
        return
    num_reqs, max_shift, hidden = cache.shape[0], int(cache.shape[1]), cache.shape[2]
    if num_reqs == 0 or hidden == 0:
        return
    token_blocks = max_query_len // BLOCK_TOKENS_HIDDEN + 1
    wrap_triton(_shift_and_cache_hidden_kernel)[(num_reqs, token_blocks, cdiv(hidden, BLOCK_HIDDEN))](
        src, dst, cache, query_start_loc, token_indices_to_sample, shift, cached_lens,
        src.shape[0], hidden,
        MAX_SHIFT=max_shift, PADDED_SHIFT=next_power_of_2(max_shift),
        BLOCK_TOKENS=BLOCK_TOKENS_HIDDEN, BLOCK_HIDDEN=BLOCK_HIDDEN, num_warps=NUM_WARPS_HIDDEN,
    )  # fmt: skip


# ------------------------------------------------------------------ public wrapper


def shift_and_cache_hidden(
    src: torch.Tensor,
    dst: torch.Tensor,
    cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    token_indices_to_sample: torch.Tensor,
    shift: torch.Tensor,
    cached_lens: torch.Tensor,
    max_query_len: int | None = None,
) -> None:
    """Shift hidden states; refresh their cache. In place, same contract as `shift_and_cache_1d`.

    Args:
        src: [T, H] fp32 / bf16 / fp16, contiguous.
        dst: like src (same shape and dtype), a distinct buffer; written.
        cache: [B, MAX_SHIFT, H], dtype of src, contiguous, 1 <= MAX_SHIFT <= 8; read and
            rewritten.
        query_start_loc: [B + 1] int32/int64, the request windows.
        token_indices_to_sample: [B] int32/int64, as returned by `shift_plan` (after the shift).
        shift: [B] int32/int64, as returned by `shift_plan`.
        cached_lens: [B] int32/int64, as returned by `shift_plan`.
        max_query_len: Python int >= 0, or None (T). Upper bound of the window lengths; sizes
            the grid.

    Returns:
        None; dst and cache are written in place.
    """
    check_tensor_arg("src", src, FLOAT_DTYPES, rank=2, contiguous=True)
    num_reqs = check_windows(query_start_loc, token_indices_to_sample, shift, cached_lens, device_of=src)
    check_tensor_arg(
        "cache", cache, src.dtype, shape=(num_reqs, CACHE_WIDTH, src.shape[1]), contiguous=True,
        distinct_from={"src": src}, device_of=src,
    )  # fmt: skip
    check_tensor_arg(
        "dst", dst, src.dtype, shape=tuple(src.shape), contiguous=True, distinct_from={"src": src}, device_of=src
    )
    max_query_len = src.shape[0] if max_query_len is None else max_query_len
    check_int_range("max_query_len", max_query_len, 0)
    if is_checked():
        check_shift_and_cache_values(
            query_start_loc, token_indices_to_sample, shift, cached_lens, cache.shape[1], src.shape[0]
        )
    _shift_and_cache_hidden_op(
        src, dst, cache, query_start_loc, token_indices_to_sample, shift, cached_lens, max_query_len
    )
