"""What the two shift ops (hidden.py: hidden states; one_d.py: token ids, positions,
slot mappings) share: the widest per-request cache, the rows a
request's cache is refreshed from (`store_window`, in Triton), the op's whole
reference on the canonical layout (tokens on dim 0, in torch) and the checks of the
per-request window arguments. The algorithm: this package's docstring.
"""

import torch

from specdraft.checks import INDEX_DTYPES, at_least, between, check_tensor_arg
from specdraft.layout import window_of
from specdraft.value_checks import window_lengths

from ..backend import tl, triton

MAX_SHIFT_LIMIT = 8  # the widest per-request cache (max_shift)
CACHE_WIDTH = between(1, MAX_SHIFT_LIMIT, "max_shift")  # a cache holds up to max_shift rows per request


@triton.jit
def store_window(start, stop, sample, MAX_SHIFT: tl.constexpr, PADDED_SHIFT: tl.constexpr):
    """Window-relative indices of the rows to cache, and which of the MAX_SHIFT slots
    they fill (the rest are zeroed)."""
    store_start = tl.maximum(start, sample + 1 - MAX_SHIFT)
    store_len = tl.minimum(tl.maximum(sample - store_start + 1, 0), MAX_SHIFT)
    m = tl.arange(0, PADDED_SHIFT)
    keep = (m < store_len) & (store_start + m < stop)
    return store_start - start + m, keep, m


# ------------------------------------------------------------------------ reference


def shifted_rows(src, cache, start, rel, shift, cached_len, mask):
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


def shift_and_cache_rows_reference(src, dst, cache, query_start_loc, sample, shift, cached_lens):
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
        c_idx, c_ok, s_idx, s_ok = shifted_rows(src, cache, start, tok - start, shift[req], cached_lens[req], in_window)
        values = torch.where(c_ok[:, None], cache[req, c_idx], torch.where(s_ok[:, None], src[s_idx], zeros))
        new_dst = torch.where(in_window[:, None], values, dst)

    # The refreshed cache, computed from the inputs by the same rule as dst.
    store_start = torch.maximum(starts, sample + 1 - max_shift)
    store_len = (sample - store_start + 1).clamp(0, max_shift)
    m = torch.arange(max_shift, device=src.device)
    keep = (m < store_len[:, None]) & (store_start[:, None] + m < stops[:, None])
    rel = store_start[:, None] - starts[:, None] + m
    c_idx, c_ok, s_idx, s_ok = shifted_rows(
        src, cache, starts[:, None], rel, shift[:, None], cached_lens[:, None], keep
    )
    req_rows = torch.arange(num_reqs, device=src.device)[:, None].expand(num_reqs, max_shift)
    from_cache = cache[req_rows, c_idx]
    from_src = src[s_idx] if num_tokens > 0 else torch.zeros_like(from_cache)
    new_cache = torch.where(c_ok[..., None], from_cache, torch.where(s_ok[..., None], from_src, zeros))
    return new_dst, new_cache


# --------------------------------------------------------------------- argument checks


def check_windows(query_start_loc, token_indices_to_sample, shift, cached_lens, device_of) -> int:
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


# --------------------------------------------- checked mode's value checks (syncs)


def check_shift_and_cache_values(
    query_start_loc: torch.Tensor,
    token_indices_to_sample: torch.Tensor,
    shift: torch.Tensor,
    cached_lens: torch.Tensor,
    max_shift: int,
    num_tokens: int | None = None,
) -> None:
    """A shift-and-cache input: query_start_loc from 0, non-decreasing, within
    num_tokens; 0 <= cached_lens <= max_shift; 0 <= shift <= cached_lens; a sample
    index inside its (non-empty) window."""
    lens = window_lengths(query_start_loc, num_tokens)
    qsl = query_start_loc.tolist()
    samples, shifts, cached = token_indices_to_sample.tolist(), shift.tolist(), cached_lens.tolist()
    for b, n in enumerate(lens):
        start, stop = qsl[b], qsl[b + 1]
        if not 0 <= cached[b] <= max_shift:
            raise ValueError(f"cached_lens[{b}] = {cached[b]} is outside [0, max_shift={max_shift}]")
        if not 0 <= shifts[b] <= cached[b]:
            raise ValueError(f"shift[{b}] = {shifts[b]} is outside [0, cached_lens[{b}]={cached[b]}]")
        if n > 0 and not start <= samples[b] < stop:
            raise ValueError(f"token_indices_to_sample[{b}] = {samples[b]} is outside its window [{start}, {stop})")
