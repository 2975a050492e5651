"""Draft-token sampling.

Each request b samples one token from logits[b] [V]:
- temperature[b] == 0 (or below): greedy, argmax with the first index on ties;
- temperature[b] > 0: Gumbel-max, argmax(logits / T + g) with g = -log E, E the
  noise's Exp(1) draw (-log u, or its series in the far tail: noise.py), computed
  in base 2 as argmax(logits * log2(e) / T - log2(E * log2(e))): the same argmax
  (the base change scales every key by log2(e) and shifts it by a constant), one
  multiply-add and two hardware log2 per token.

The noise: noise.py (a pure function of seed, position, token, salt and stream,
identical in Triton and torch).

Unlike vLLM's `compute_probs_and_sample_next_token`, which ignores seeds, draws
exponentials from the global RNG and materialises probs / q for the argmax, the
kernels here stream the vocabulary (ops/common/scan.py): online argmax, online
softmax, no [B, V] temporaries. Each row is split across programs (CHUNK_V tokens each); a
second tiny pass combines the per-program partials and, if asked, writes the
probabilities. At V = 152k the hash, the two logs and the bf16 loads are then all
that is left per token.

Truncation (top-k / top-p / min-p, ops/sampling/truncation): with a per-row
`logit_cut`, a sampled row's tokens with logit < cut have probability 0: the row
samples softmax(logits / T) restricted to {i : logits[i] >= cut}, renormalised. The
mask replaces those logits by -inf as they are loaded (one compare per token, no
extra pass), so the Gumbel noise is the same as without a cut and truncation only
masks: a token kept by the cut wins exactly where it won the untruncated race among
the kept tokens. Greedy rows do not read the cut (the argmax is kept by any cut that
keeps anything). A cut of -inf (or NaN: no logit compares below it) masks nothing;
a cut above a sampled row's largest logit keeps nothing, a contract violation
(checked mode refuses it; the op then gives some id in [0, V) and NaN probabilities).

The optional buffer write stores this step's processed logits (logits / T, -inf
below the cut) or probabilities softmax(logits / T) (truncated, renormalised) into
out[:, step, :], with `step` a device scalar
read by the kernel, so one CUDA graph replays every draft step. Greedy rows use
T = 1 for what they store. A step outside [0, K) writes nothing.

Files: kernel.py (the two passes: per-chunk partials, then the combine and the
probabilities), reference.py (the pure-torch sampler: the CPU path and the oracle;
the NaN-skipping argmax and the cut that the other samplers' references share),
op.py (the registered ops, the public wrapper, the argument and checked mode's value
checks).
"""

from .op import check_draft_sample_values, check_logit_cut_arg, check_logit_cut_values, draft_sample
from .reference import (
    argmax_skipping_nan,
    draft_sample_reference,
    draft_sample_store_reference,
    store_step_reference,
    truncate_logits,
)

__all__ = [
    "argmax_skipping_nan",
    "check_draft_sample_values",
    "check_logit_cut_arg",
    "check_logit_cut_values",
    "draft_sample",
    "draft_sample_reference",
    "draft_sample_store_reference",
    "store_step_reference",
    "truncate_logits",
]
