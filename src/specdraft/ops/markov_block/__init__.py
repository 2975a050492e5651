"""The Markov head of a block drafter (DSpark, arXiv 2607.05147; DeepSpec's
`deepspec/modeling/dspark/markov_head.py`): its sequential logit bias and sampling
over a whole drafted block, as one op.

A block drafter drafts S tokens from one forward: base logits [B, S, V]. The Markov
head then walks the block in order. At step s, with p the previous token
(first_prev_tokens[b] at s = 0, else the token sampled at s - 1) and e = W1[p]
(W1 = markov_w1.weight [V, r], an embedding):

- vanilla: latent = e;
- gated:   latent = sigmoid(gate_proj([h_s ; e])) * e, gate_proj a Linear(H + r -> r)
  with bias reading the hidden state first;
- rnn:     (g, c, o) = chunk3(joint_proj([state ; e ; h_s])), joint_proj a
  Linear(2r + H -> 3r) with bias; state' = sigmoid(g) * state + (1 - sigmoid(g)) *
  tanh(c); latent = tanh(o); the state is zero at the start of each block;

then corrected_s = base_s + W2 @ latent (W2 = markov_w2.weight [V, r], a Linear(r -> V)
without bias), and the token at s is sampled from corrected_s exactly as
`draft_sample` samples a row (ops/sampling/draft/): greedy argmax (first index on
ties) where temperature[b] <= 0, else seeded Gumbel-max with the noise of
(seeds[b], positions[b] + s, token, salt).

The part of gate_proj / joint_proj that reads h_s does not depend on the sampled
tokens, so the caller computes it for the whole block in one matmul (`hidden_part`)
and the op receives the rest (`latent_weight`), split by columns:

- gated: hidden_part = h @ gate_proj.weight[:, :H].T + gate_proj.bias   [B, S, r],
         latent_weight = gate_proj.weight[:, H:]                        [r, r];
- rnn:   hidden_part = h @ joint_proj.weight[:, 2r:].T + joint_proj.bias [B, S, 3r],
         latent_weight = joint_proj.weight[:, :2r]                      [3r, 2r]
         (its columns read [state ; e], its rows give [g | c | o]).

Everything after the weights' loads is fp32: the latent, the bias, the corrected
logits (DeepSpec computes in the module's dtype; in fp32 the two agree).

Files: kernel.py (the Triton kernels), reference.py (the torch reference), op.py (the
registered op, its public wrapper and checked mode's value checker).
"""

from .op import MARKOV_KINDS, check_markov_block_sample_values, markov_block_sample
from .reference import markov_block_sample_reference

__all__ = [
    "MARKOV_KINDS",
    "check_markov_block_sample_values",
    "markov_block_sample",
    "markov_block_sample_reference",
]
