"""The multi-layer EAGLE input shift, applied to token ids, positions, slot
mappings (`shift_and_cache_1d`, one_d.py) and hidden states
(`shift_and_cache_hidden`, hidden.py); what both share (the cache refresh window,
the reference's core, the argument checks) is window.py's. The per-request shift
comes from `shift_plan` (ops/shift_plan.py).

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

from .hidden import shift_and_cache_hidden, shift_and_cache_hidden_reference
from .one_d import shift_and_cache_1d, shift_and_cache_1d_reference
from .window import MAX_SHIFT_LIMIT

__all__ = [
    "MAX_SHIFT_LIMIT",
    "shift_and_cache_1d",
    "shift_and_cache_1d_reference",
    "shift_and_cache_hidden",
    "shift_and_cache_hidden_reference",
]
