"""The multi-layer EAGLE input shift, applied to token ids, positions, slot
mappings (`shift_and_cache_1d`) and hidden states (`shift_and_cache_hidden`); the
per-request shift comes from `shift_plan` (shift_plan.py).

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
from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, between, check_int_range, check_tensor_arg
from specdraft.layout import window_of
from specdraft.value_checks import check_shift_and_cache_values

from .backend import NAMESPACE, cdiv, next_power_of_2, tl, triton, use_triton

MAX_SHIFT_LIMIT = 8  # the widest per-request cache (max_shift)

# 1-D arrays: one program copies a run of tokens of one row of one request.
BLOCK_TOKENS_1D = 256
# Hidden states: a [tokens x hidden] tile per program; 32 x 256 keeps tiles small
# enough for any hidden size while each row segment is a 512-byte (bf16) burst.
BLOCK_TOKENS_HIDDEN = 32
BLOCK_HIDDEN = 256
NUM_WARPS_HIDDEN = 4


# --------------------------------------------------------------------------- kernels


@triton.jit
def _store_window(start, stop, sample, MAX_SHIFT: tl.constexpr, PADDED_SHIFT: tl.constexpr):
    """Window-relative indices of the rows to cache, and which of the MAX_SHIFT slots
    they fill (the rest are zeroed)."""
    store_start = tl.maximum(start, sample + 1 - MAX_SHIFT)
    store_len = tl.minimum(tl.maximum(sample - store_start + 1, 0), MAX_SHIFT)
    m = tl.arange(0, PADDED_SHIFT)
    keep = (m < store_len) & (store_start + m < stop)
    return store_start - start + m, keep, m


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
        rel, keep, m = _store_window(start, stop, sample, MAX_SHIFT, PADDED_SHIFT)
        fresh = _shifted_1d(src_row, cache_row, start, rel, shift, cached_len, num_tokens, keep, MAX_SHIFT)
        fresh = tl.where(keep, fresh, 0)
        # Every read of this request's cache (prefix above, refresh just now) is in
        # this program; finish them all before any thread overwrites the cache.
        tl.debug_barrier()
        tl.store(cache_row + m, fresh, mask=m < MAX_SHIFT)


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
        rel, keep, m = _store_window(start, stop, sample, MAX_SHIFT, PADDED_SHIFT)
        fresh = _shifted_hidden(
            src_ptr, cache_req, cols, col_mask, start, rel, shift, cached_len, num_tokens, hidden,
            keep, MAX_SHIFT,
        )  # fmt: skip
        fresh = tl.where(keep[:, None], fresh, 0)
        tl.debug_barrier()  # as in the 1-D kernel: all cache reads done before writes
        slot_mask = (m < MAX_SHIFT)[:, None] & col_mask[None, :]
        tl.store(cache_req + m[:, None].to(tl.int64) * hidden + cols[None, :], fresh, mask=slot_mask)


# ------------------------------------------------------------------------ references


def _shifted_rows(src, cache, start, rel, shift, cached_len, mask):
    """Rows of the shifted window at window-relative indices `rel`.

    src [T, F]; cache [B, M, F]; start/shift/cached_len per index (already gathered
    per request); out-of-contract indices read 0, as in the kernels."""
    num_tokens, max_shift = src.shape[0], cache.shape[1]
    from_cache = rel < shift
    cache_idx = cached_len - shift + rel
    cache_ok = mask & from_cache & (cache_idx >= 0) & (cache_idx < max_shift)
    src_tok = start + rel - shift
    src_ok = mask & ~from_cache & (src_tok >= 0) & (src_tok < num_tokens)
    return (
        cache_idx.clamp(0, max_shift - 1),
        cache_ok,
        src_tok.clamp(0, max(num_tokens - 1, 0)),
        src_ok,
    )


def _shift_and_cache_rows_reference(src, dst, cache, query_start_loc, sample, shift, cached_lens):
    """The whole op on the canonical layout: tokens on dim 0 of src/dst [T, F], cache
    [B, M, F]. Returns (new dst, new cache)."""
    num_tokens, num_reqs, max_shift = src.shape[0], cache.shape[0], cache.shape[1]
    if num_reqs == 0:
        return dst, cache
    zeros = torch.zeros((), dtype=src.dtype, device=src.device)
    starts = query_start_loc[:-1].long()
    stops = query_start_loc[1:].long()
    shift, cached_lens, sample = shift.long(), cached_lens.long(), sample.long()

    new_dst = dst
    if num_tokens > 0:
        tok = torch.arange(num_tokens, device=src.device)
        # Request of each token; tokens past the batch (graph padding) map to B.
        req = window_of(tok, stops).clamp(max=num_reqs - 1)
        start = starts[req]
        in_window = (tok >= start) & (tok < stops[req])
        c_idx, c_ok, s_idx, s_ok = _shifted_rows(
            src, cache, start, tok - start, shift[req], cached_lens[req], in_window
        )
        values = torch.where(c_ok[:, None], cache[req, c_idx], torch.where(s_ok[:, None], src[s_idx], zeros))
        new_dst = torch.where(in_window[:, None], values, dst)

    # The refreshed cache, computed from the inputs by the same rule as dst.
    store_start = torch.maximum(starts, sample + 1 - max_shift)
    store_len = (sample - store_start + 1).clamp(0, max_shift)
    m = torch.arange(max_shift, device=src.device)
    keep = (m < store_len[:, None]) & (store_start[:, None] + m < stops[:, None])
    rel = store_start[:, None] - starts[:, None] + m
    c_idx, c_ok, s_idx, s_ok = _shifted_rows(
        src, cache, starts[:, None], rel, shift[:, None], cached_lens[:, None], keep
    )
    req_rows = torch.arange(num_reqs, device=src.device)[:, None].expand(num_reqs, max_shift)
    from_cache = cache[req_rows, c_idx]
    from_src = src[s_idx] if num_tokens > 0 else torch.zeros_like(from_cache)
    new_cache = torch.where(c_ok[..., None], from_cache, torch.where(s_ok[..., None], from_src, zeros))
    return new_dst, new_cache


def shift_and_cache_1d_reference(src, dst, cache, query_start_loc, token_indices_to_sample, shift, cached_lens):
    """src/dst [..., T] (rows lead, e.g. M-RoPE [3, T]); cache [..., B, MAX_SHIFT]."""
    num_rows = src.shape[0] if src.dim() == 2 else 1
    num_reqs, max_shift = cache.shape[-2], cache.shape[-1]
    rows = src.reshape(num_rows, src.shape[-1]).T  # [T, R]: tokens first, as for hidden
    dst_rows = dst.reshape(num_rows, dst.shape[-1]).T
    cache_rows = cache.reshape(num_rows, num_reqs, max_shift).permute(1, 2, 0)  # [B, M, R]
    new_dst, new_cache = _shift_and_cache_rows_reference(
        rows, dst_rows, cache_rows, query_start_loc, token_indices_to_sample, shift, cached_lens
    )
    dst.copy_(new_dst.T.reshape(dst.shape))
    cache.copy_(new_cache.permute(2, 0, 1).reshape(cache.shape))


def shift_and_cache_hidden_reference(src, dst, cache, query_start_loc, token_indices_to_sample, shift, cached_lens):
    """src/dst [T, H]; cache [B, MAX_SHIFT, H]."""
    new_dst, new_cache = _shift_and_cache_rows_reference(
        src, dst, cache, query_start_loc, token_indices_to_sample, shift, cached_lens
    )
    dst.copy_(new_dst)
    cache.copy_(new_cache)


# -------------------------------------------------------------------------- the ops


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


# ---------------------------------------------------------------- public wrappers


def _check_windows(query_start_loc, token_indices_to_sample, shift, cached_lens, device_of) -> int:
    """query_start_loc [B + 1] and the plan's per-request tensors [B]; returns B."""
    check_tensor_arg(
        "query_start_loc", query_start_loc, INDEX_DTYPES, shape=(at_least(1, "B + 1"),), device_of=device_of
    )
    num_reqs = query_start_loc.shape[0] - 1
    check_tensor_arg(
        "token_indices_to_sample", token_indices_to_sample, INDEX_DTYPES, shape=(num_reqs,), device_of=device_of
    )
    check_tensor_arg("shift", shift, INDEX_DTYPES, shape=(num_reqs,), device_of=device_of)
    check_tensor_arg("cached_lens", cached_lens, INDEX_DTYPES, shape=(num_reqs,), device_of=device_of)
    return num_reqs


CACHE_WIDTH = between(1, MAX_SHIFT_LIMIT, "max_shift")  # a cache holds up to max_shift rows per request


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

    src, dst: [T] or [R, T] (M-RoPE positions: R = 3), int32 or int64, distinct.
    cache: [B, MAX_SHIFT] or [R, B, MAX_SHIFT], same dtype, 1 <= MAX_SHIFT <= 8.
    token_indices_to_sample, shift, cached_lens: [B], as returned by `shift_plan`
    (the sample index *after* the shift). Only tokens inside a request's window
    [query_start_loc[b], query_start_loc[b+1]) are written in dst; each request's
    cache is rewritten whole (rows past the new cached length are zeroed).
    max_query_len: a Python-int upper bound of the window lengths; it sizes the
    grid without a host sync (default: T, always safe, larger grid).

    Out of contract (unchecked mode; checked mode raises instead): nothing is read
    or written outside src, dst and cache. Windows are clipped to [0, T); rows a
    too-small max_query_len keeps the kernel from reaching stay as they were;
    overlapping windows leave their common rows unspecified.
    """
    check_tensor_arg("src", src, INDEX_DTYPES, rank=(1, 2), contiguous=True)
    num_reqs = _check_windows(query_start_loc, token_indices_to_sample, shift, cached_lens, device_of=src)
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
    """Shift hidden states [T, H] (fp32 / bf16 / fp16); cache [B, MAX_SHIFT, H].
    Same contract as `shift_and_cache_1d`."""
    check_tensor_arg("src", src, FLOAT_DTYPES, rank=2, contiguous=True)
    num_reqs = _check_windows(query_start_loc, token_indices_to_sample, shift, cached_lens, device_of=src)
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
