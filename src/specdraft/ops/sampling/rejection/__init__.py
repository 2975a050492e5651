"""Rejection sampling of draft tokens against the target model (vLLM's rejection
sampler).

Per request b with n = num_draft_tokens[b] drafts x_0..x_{n-1} (n <= K, padded
with -1) and target logits for K + 1 rows (row n gives the bonus token):

- greedy (temperature 0): accept x_j while x_j == argmax(target row j); at the
  first mismatch emit that argmax; if all n are accepted emit argmax(row n).
- random (temperature T > 0), Leviathan et al.: p_j = softmax(target_j / T),
  q_j = draft_probs[b, j] (one-hot of x_j when draft_probs is None). Accept x_j
  while u_j * q_j(x_j) <= p_j(x_j) (u_j <= p/q without dividing by q = 0). At the
  first rejection j, emit a sample of normalise(max(p_j - q_j, 0)); if all are
  accepted, emit a sample of p_n. A draft token outside [0, V) is rejected.

Truncation (top-k / top-p / min-p): with `logit_cut` [B, K + 1], one cut per target
row (ops.truncation_cut of the rows viewed as [B * (K + 1), V]), a random request's
p_j is softmax(target_j / T) restricted to {i : target_j[i] >= cut[b, j]},
renormalised: in the acceptance test, the residual max(p_j - q_j, 0) and the bonus
token alike. The emitted tokens then follow the truncated target exactly, whatever q
is (drafts inside or outside the truncation: a draft the cut removes has p = 0 and
is always rejected). The noise is unchanged: the cut only masks.

Noise: the counter-based hash of noise.py, at position positions[b] + j for row j,
in two streams of its own (so independent of the draft sampling noise at the same
position): STREAM_ACCEPT for u_j (token index 0), STREAM_SAMPLE for the emitted
token. The residual is sampled by the exponential race argmax_i r_i / E_i (E_i the
noise's Exp(1) draw, noise.py: Gumbel-max over log r_i without taking log 0);
should the residual be all zero (q exceeding p everywhere, only possible with
unnormalised draft probs or rounding) the same race runs over p. The bonus token is
Gumbel-max over target / T, which needs no normalisation. Both draw the same E as
draft sampling, far tail included; the acceptance tests use the 23-bit u.

Kernels: (1) per (request, row, vocab chunk) statistics: the argmax for greedy
rows 0..n, the online-softmax max and sum for random rows 0..n-1; rows past those
are never read. (2) per (request, vocab chunk): the acceptance chain from those
statistics (cheap, recomputed by every chunk program; chunk 0 writes the tokens
and counts), then for random requests the partial race over its chunk of the one
row c that emits. (3) per request: combine the races into the emitted token. (1)
and (3) are verify_kernels.py's, shared with tree verification; (2), with the
acceptance test and the residual race step it scans a row with, is below.

Files: kernel.py (the chain kernel, (2), and its device-side rules), reference.py
(the pure-torch sampler: the CPU path and the oracle), op.py (the registered op, its
public wrapper and checked mode's value checks).
"""

from .op import check_rejection_sample_values, rejection_sample
from .reference import rejection_sample_reference

__all__ = ["check_rejection_sample_values", "rejection_sample", "rejection_sample_reference"]
