"""`shift_and_cache_1d`: the shift (this package's docstring) applied to token ids,
positions (M-RoPE [3, T] too) and slot mappings, shifted in their windows and
cached; hidden.py holds its hidden-state twin, window.py what the two share.
"""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import INDEX_DTYPES, check_int_range, check_tensor_arg

from ..backend import NAMESPACE, next_power_of_2, tl, triton, use_triton

# Imported by name: Inductor re-emits a user Triton kernel with the jit functions it calls.
from .window import (
    CACHE_WIDTH,
    check_shift_and_cache_values,
    check_windows,
    shift_and_cache_rows_reference,
    store_window,
)

# One program copies a run of tokens of one row of one request.
BLOCK_TOKENS_1D = 256


# --------------------------------------------------------------------------- kernel


@triton.jit
def _shifted_1d(src_row, cache_row, start, i, shift, cached_len, num_tokens, mask, MAX_SHIFT):
    from_cache = i < shift
    cache_idx = cached_len - shift + i
    cache_ok = (cache_idx >= 0) & (cache_idx < MAX_SHIFT)
    cached = tl.load(cache_row + cache_idx, mask=mask & from_cache & cache_ok, other=0)
    src_tok = start + i - shift
    src_ok = (src_tok >= 0) & (src_tok < num_tokens)
    body = tl.load(src_row + src_tok, mask=mask & ~from_cache & src_ok, other=0)
    return tl.where(from_cache, cached, body)


@triton.jit
def _shift_and_cache_1d_kernel(
    src_ptr,
    dst_ptr,
    cache_ptr,
    query_start_loc_ptr,
    sample_ptr,
    shift_ptr,
    cached_lens_ptr,
    num_tokens,
    num_reqs,
    MAX_SHIFT: tl.constexpr,
    PADDED_SHIFT: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
):
    req = tl.program_id(0)
    blk = tl.program_id(1)
    row = tl.program_id(2).to(tl.int64)
    start = tl.load(query_start_loc_ptr + req).to(tl.int64)
    stop = tl.load(query_start_loc_ptr + req + 1).to(tl.int64)
    shift = tl.load(shift_ptr + req).to(tl.int64)
    cached_len = tl.load(cached_lens_ptr + req).to(tl.int64)
    src_row = src_ptr + row * num_tokens
    dst_row = dst_ptr + row * num_tokens
    cache_row = cache_ptr + (row * num_reqs + req) * MAX_SHIFT

    i = blk * BLOCK_TOKENS + tl.arange(0, BLOCK_TOKENS).to(tl.int64)
    tok = start + i
    # tok >= 0: a negative query_start_loc (out of contract) must not store before dst.
    in_window = (tok >= 0) & (tok < stop) & (tok < num_tokens)
    values = _shifted_1d(src_row, cache_row, start, i, shift, cached_len, num_tokens, in_window, MAX_SHIFT)
    tl.store(dst_row + tok, values, mask=in_window)

    if blk == 0:
        sample = tl.load(sample_ptr + req).to(tl.int64)
        rel, keep, m = store_window(start, stop, sample, MAX_SHIFT, PADDED_SHIFT)
        fresh = _shifted_1d(src_row, cache_row, start, rel, shift, cached_len, num_tokens, keep, MAX_SHIFT)
        fresh = tl.where(keep, fresh, 0)
        # Every read of this request's cache (prefix above, refresh just now) is in
        # this program; finish them all before any thread overwrites the cache.
        tl.debug_barrier()
        tl.store(cache_row + m, fresh, mask=m < MAX_SHIFT)


# ------------------------------------------------------------------------ reference


def shift_and_cache_1d_reference(src, dst, cache, query_start_loc, token_indices_to_sample, shift, cached_lens):
    """src/dst [..., T] (rows lead, e.g. M-RoPE [3, T]); cache [..., B, MAX_SHIFT]."""
    num_rows = src.shape[0] if src.dim() == 2 else 1
    num_reqs, max_shift = cache.shape[-2], cache.shape[-1]
    rows = src.reshape(num_rows, src.shape[-1]).T  # [T, R]: tokens first, as for hidden
    dst_rows = dst.reshape(num_rows, dst.shape[-1]).T
    cache_rows = cache.reshape(num_rows, num_reqs, max_shift).permute(1, 2, 0)  # [B, M, R]
    new_dst, new_cache = shift_and_cache_rows_reference(
        rows, dst_rows, cache_rows, query_start_loc, token_indices_to_sample, shift, cached_lens
    )
    dst.copy_(new_dst.T.reshape(dst.shape))
    cache.copy_(new_cache.permute(2, 0, 1).reshape(cache.shape))


# --------------------------------------------------------------------------- the op


@triton_op(f"{NAMESPACE}::shift_and_cache_1d", mutates_args=("dst", "cache"))
def _shift_and_cache_1d_op(
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
        shift_and_cache_1d_reference(src, dst, cache, query_start_loc, token_indices_to_sample, shift, cached_lens)
        return
    # MAX_SHIFT is a constexpr: under dynamic=True int() specializes on it (it is
    # fixed per deployment), while B and T stay symbolic.
    num_reqs, max_shift = cache.shape[-2], int(cache.shape[-1])
    num_rows = src.shape[0] if src.dim() == 2 else 1
    if num_reqs == 0:
        return
    token_blocks = max_query_len // BLOCK_TOKENS_1D + 1  # >= 1 even for empty windows; no sym_max node
    wrap_triton(_shift_and_cache_1d_kernel)[(num_reqs, token_blocks, num_rows)](
        src, dst, cache, query_start_loc, token_indices_to_sample, shift, cached_lens,
        src.shape[-1], num_reqs,
        MAX_SHIFT=max_shift, PADDED_SHIFT=next_power_of_2(max_shift), BLOCK_TOKENS=BLOCK_TOKENS_1D,
    )  # fmt: skip


# ------------------------------------------------------------------ public wrapper


def shift_and_cache_1d(
    src: torch.Tensor,
    dst: torch.Tensor,
    cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    token_indices_to_sample: torch.Tensor,
    shift: torch.Tensor,
    cached_lens: torch.Tensor,
    max_query_len: int | None = None,
) -> None:
    """Shift token ids, positions or slot mappings; refresh their cache. In place.

    Only tokens inside a request's window [query_start_loc[b], query_start_loc[b + 1])
    are written in dst; each request's cache is rewritten whole (rows past the new
    cached length are zeroed).

    Args:
        src: [T] or [R, T] (M-RoPE positions: R = 3) int32/int64, contiguous.
        dst: like src (same shape and dtype), a distinct buffer; written.
        cache: [B, MAX_SHIFT] or [R, B, MAX_SHIFT], dtype of src, contiguous,
            1 <= MAX_SHIFT <= 8; read and rewritten.
        query_start_loc: [B + 1] int32/int64, the request windows.
        token_indices_to_sample: [B] int32/int64, as returned by `shift_plan` (the sample
            index *after* the shift).
        shift: [B] int32/int64, as returned by `shift_plan`.
        cached_lens: [B] int32/int64, as returned by `shift_plan`.
        max_query_len: Python int >= 0, or None (T: always safe, larger grid). An upper
            bound of the window lengths; it sizes the grid without a host sync.

    Returns:
        None; dst and cache are written in place.

    Out of contract (unchecked mode; checked mode raises instead): nothing is read
    or written outside src, dst and cache. Windows are clipped to [0, T); rows a
    too-small max_query_len keeps the kernel from reaching stay as they were;
    overlapping windows leave their common rows unspecified.
    """
    check_tensor_arg("src", src, INDEX_DTYPES, rank=(1, 2), contiguous=True)
    num_reqs = check_windows(query_start_loc, token_indices_to_sample, shift, cached_lens, device_of=src)
    check_tensor_arg(
        "cache", cache, src.dtype, shape=(*src.shape[:-1], num_reqs, CACHE_WIDTH), contiguous=True,
        distinct_from={"src": src}, device_of=src,
    )  # fmt: skip
    check_tensor_arg(
        "dst", dst, src.dtype, shape=tuple(src.shape), contiguous=True, distinct_from={"src": src}, device_of=src
    )
    max_query_len = src.shape[-1] if max_query_len is None else max_query_len
    check_int_range("max_query_len", max_query_len, 0)
    if is_checked():
        check_shift_and_cache_values(
            query_start_loc, token_indices_to_sample, shift, cached_lens, cache.shape[-1], src.shape[-1]
        )
    _shift_and_cache_1d_op(src, dst, cache, query_start_loc, token_indices_to_sample, shift, cached_lens, max_query_len)
