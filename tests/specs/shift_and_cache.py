"""Plain-Python oracles for the shift ops (one token, one request at a time) and the
edge layout their tests share as an explicit example."""

from specdraft.testing import ShiftLayout

# Three token blocks of the hidden kernel and of the 1-D kernel, cache prefix included.
LONG_WINDOWS = ShiftLayout(
    query_start_loc=[0, 1, 651, 652, 652],
    num_tokens=655,
    max_shift=5,
    cached_lens=[5, 4, 1, 0],
    shift=[1, 4, 1, 0],
    token_indices_to_sample=[0, 648, 651, 651],
    first_positions=[7, 100, 3, 0],
    seq_lens=[8, 750, 4, 0],
)


def spec_shift_and_cache(src, dst, cache, layout: ShiftLayout, zero):
    """vLLM's semantics, one token at a time: dst from the cache prefix and the
    shifted src; then the cache from the *written dst rows* ending at the sample.
    src/dst: lists indexed by token; cache: list per request of MAX_SHIFT entries."""
    dst, cache = list(dst), [list(c) for c in cache]
    qsl, m = layout.query_start_loc, layout.max_shift
    for b in range(layout.num_reqs):
        start, stop = qsl[b], qsl[b + 1]
        s, cached = layout.shift[b], layout.cached_lens[b]
        for i in range(stop - start):
            dst[start + i] = cache[b][cached - s + i] if i < s else src[start + i - s]
    for b in range(layout.num_reqs):
        sample = layout.token_indices_to_sample[b]
        store_start = max(qsl[b], sample + 1 - m)
        n = min(max(sample - store_start + 1, 0), m)
        cache[b] = [dst[store_start + j] for j in range(n)] + [zero] * (m - n)
    return dst, cache


def spec_shift_plan(layout: ShiftLayout):
    qsl, m, positions = layout.query_start_loc, layout.max_shift, layout.positions()
    out = {"shift": [], "token_indices_to_sample": [], "seq_lens": [], "cached_lens": []}
    for b in range(layout.num_reqs):
        start, stop = qsl[b], qsl[b + 1]
        first_pos = positions[start] if stop > start else 0
        s = min(
            max(min(stop - 1 - layout.token_indices_to_sample[b], first_pos), 0),
            layout.cached_lens[b],
        )
        sample = layout.token_indices_to_sample[b] + s
        store_start = max(start, sample + 1 - m)
        out["shift"].append(s)
        out["token_indices_to_sample"].append(sample)
        out["seq_lens"].append(layout.seq_lens[b] - s)
        out["cached_lens"].append(min(max(sample - store_start + 1, 0), m))
    return out
