"""Masked attention over a paged KV cache, split over the keys (flash decoding).

`masked_paged_attention(query [B, Q, heads, D], kv_cache, slots [B, L], visible [B,
Q, L], scale)`: query q of request b attends, with one softmax, to the keys and
values at kv_cache's flat slots[b, l] for which visible[b, q, l]; a query that sees
nothing gets zeros; keys no query of a request sees are never read (an unwritten
slot may hold NaN). The models' paged attention (specdraft.models.attention: the
causal windows of a chain, the target's verify over draft trees) builds slots and
visible and calls it.

Files: kernel.py (the two Triton passes), reference.py (gather + one
scaled_dot_product_attention: the CPU path and the oracle), op.py (the registered op
and its public wrapper).
"""

from .op import check_masked_paged_attention_values, masked_paged_attention
from .reference import attention_over_keys, gather_slots, masked_paged_attention_reference

__all__ = [
    "attention_over_keys",
    "check_masked_paged_attention_values",
    "gather_slots",
    "masked_paged_attention",
    "masked_paged_attention_reference",
]
