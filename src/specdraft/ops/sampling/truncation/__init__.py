"""A request's top-k, top-p and min-p as one logit cut per row.

A row's request distribution is softmax(logits / T) restricted to
{i : logits[i] >= cut}, renormalised. `truncation_cut` computes the cut, once per
row, from logits [R, V] and per-row temperature, top_k, top_p, min_p:

1. min-p (min_p > 0): keep p_i >= min_p * p_max. p_i / p_max = exp((l_i - max) / T)
   is the same before and after any renormalisation, so this is the logit threshold
   l_i >= max + T * ln(min_p), taken in fp64 (so exact up to ln's last bit); min_p
   >= 1 keeps the max's ties alone;
2. top-k (0 < top_k < V): keep the logits >= the k-th largest kept one (all of
   them where fewer than k are kept);
3. top-p (top_p < 1): over the distribution those keep, renormalised, keep the
   smallest set {l >= c} whose mass is >= top_p (at least the max's tie group).

Ties: every rule is a threshold on the logit, so every token tied with the token at
the cut is kept. For min-p and top-k this is vLLM's own rule (its min-p masks only
p_i < min_p * p_max; its top-k masks only logits < the k-th value). For top-p,
vLLM sorts the row and masks by cumulative sum, so which members of a tie group
straddling the cut survive depends on the sort's order there; here the whole group
is kept.

The order is vLLM's sampler's (vllm/v1/sample/sampler.py's documented steps:
temperature, then the argmax-invariant logits processors, min-p by default, then
top-k and/or top-p; its GPU model runner, vllm/v1/worker/gpu/sample/sampler.py,
applies min_p before apply_top_k_top_p the same way). Top-k and min-p are both
thresholds on the logit, so their order does not matter; top-p's mass is over what
they keep, so min-p before top-p does (vLLM's older V0 sampler applied min-p last).

Rows not truncated, cut = -inf (keep all): greedy rows (T not > 0), rows with a
non-finite T (checked mode refuses it), rows with every parameter off, and rows
with no logit above -inf. In a truncated row the cut is a logit of the row, never
-inf: -inf logits are never kept (they have probability 0 anyway). NaN logits count
as -inf (never kept). +inf logits: each weighs 1 and every finite logit 0 (the
limit of the softmax). The cut is always a value of the row or -inf, so
`logits >= cut` is exact in any dtype.

The samplers take the cut as their optional `logit_cut` (draft_sample one per row,
rejection_sample one per target row [B, K + 1], tree_verify one per node [B, N]).

Files: split.py (the CUDA path: two reads of the logits split over the GPU, then
exact work on the values that decide, copied or, for bf16 / fp16, counted per key;
rows it leaves undone, and the min-p rows maxima.py does not take, go to kernel.py), maxima.py
(the CUDA path of top-k rows with k <= V / 1,024, whose chunks' maxima bound the
k-th logit, and of min-p alone), resolve.py (both paths' last step: the exact cut
from what they collected), kernel.py (the per-row search without a sort: its
passes), reference.py (the sort-based torch reference, the CPU path), op.py (the
registered op, its public wrapper and checked mode's value checker).
"""

from .op import check_truncation_cut_values, truncation_cut
from .reference import truncation_cut_reference

__all__ = ["check_truncation_cut_values", "truncation_cut", "truncation_cut_reference"]
