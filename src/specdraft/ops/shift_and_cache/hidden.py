"""The multi-layer EAGLE input shift, applied to token ids, positions, slot
mappings (`shift_and_cache_1d`) and hidden states (`shift_and_cache_hidden`); the
per-request shift comes from `shift_plan` (shift_plan.py). This file holds the
hidden-state op; the 1-D op is in shift_and_cache_1d.py (re-exported here), what
both share (the cache refresh window, the reference's core, the argument checks) in
common/shift_window.py.

Each request owns a window [start, stop) of the packed token axis. Before a
multi-layer draft pass the window is right-shifted by `shift` tokens; the vacated
prefix is filled from a per-request cache holding the tail of the previous step's
window, and the cache is then refreshed with the new tail ending at the token to
sample:

    dst[start + i] = cache[cached_len - shift + i]   for i < shift
    dst[start + i] = src[start + i - shift]          otherwise
    cache[m]       = dst[store_start + m]            for m < store_len, else 0

Race-freedom. vLLM's kernel refreshes the cache in the same launch that reads it,
from `dst` rows other programs write, and every token block of a request writes
the cache another block may still be reading: wrong as soon as a window spans two
blocks. Here the refreshed cache is computed from the *inputs* (src and the old
cache) by the same formula as dst, and only token block 0 of each request reads or
writes that request's cache, with a barrier between its reads and its writes. No
program reads what another program writes, at any window length.
"""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import FLOAT_DTYPES, check_int_range, check_tensor_arg
from specdraft.value_checks import check_shift_and_cache_values

from .backend import NAMESPACE, cdiv, next_power_of_2, tl, triton, use_triton

# Imported by name: Inductor re-emits a user Triton kernel with the jit functions it calls.
from .common.shift_window import CACHE_WIDTH, check_windows, shift_and_cache_rows_reference, store_window

# Re-exported: the 1-D op and the cache limit were defined here before the split.
from .common.shift_window import MAX_SHIFT_LIMIT as MAX_SHIFT_LIMIT
from .shift_and_cache_1d import BLOCK_TOKENS_1D as BLOCK_TOKENS_1D
from .shift_and_cache_1d import shift_and_cache_1d as shift_and_cache_1d
from .shift_and_cache_1d import shift_and_cache_1d_reference as shift_and_cache_1d_reference

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
