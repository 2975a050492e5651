"""Vocabulary-wide metrics of a draft row against a target row, neither softmax
materialised: the op behind specdraft.training's draft metrics.

Per row n of draft logits [N, Vd] and target logits [N, V], at temperature
T = temperature[n] (scale s = T; s = 1 for a greedy row, T <= 0): q = softmax(draft / s)
over the draft vocabulary, p = softmax(target / s) over the whole target vocabulary.
Draft id i stands for target id i + d2t[i] (EAGLE-3's map, as
Eagle3Head.map_draft_to_target; without d2t, Vd == V and the map is the identity).
The map must be injective (EAGLE-3's are); an id it sends outside [0, V) has no mass.

Outputs, per row:
- draft_token: the target id of argmax(draft) (the lowest draft id on ties, as
  torch.argmax), int32; target_token: argmax(target), the lowest id on ties, int32;
- draft_lse, target_lse: logsumexp(draft / s), logsumexp(target / s) (natural log);
- accept: the expected acceptance sum_i min(q(i), p(i + d2t[i])); target mass outside
  the draft vocabulary never accepts. Greedy: p and q are one-hot, so accept is 1.0
  when draft_token == target_token, else 0.0;
- with divergence=True, cross_entropy = -sum_i pd(i) log q(i) and
  kl = sum_i pd(i) (log pd(i) - log q(i)), pd the target restricted to the draft
  vocabulary and renormalised (the usual EAGLE-3 training target), at the same s
  (1 for greedy rows). Terms with pd(i) = 0 count 0; pd(i) > 0 where q(i) = 0 makes
  both +inf. Without divergence both are empty ([0]).

A row of all -inf logits has no mass (lse -inf, no acceptance, argmax 0). With
target_is_probs, target holds probabilities: p = softmax(log(target) / s) (target
itself at s = 1), target_lse = logsumexp(log(target) / s).

Files: kernel.py (the Triton kernel), reference.py (the torch reference), op.py
(the registered op and the public wrapper).
"""

from .op import VocabMetrics, vocab_metrics
from .reference import vocab_metrics_reference

__all__ = ["VocabMetrics", "vocab_metrics", "vocab_metrics_reference"]
