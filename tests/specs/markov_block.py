"""Plain-Python oracle for ops.markov_block_sample: DSpark's Markov head walked one
request and one step at a time in float64, from the head's own (unsplit) modules'
weights, the way DeepSpec's VanillaMarkov / GatedMarkovHead / RNNHead compute it:
an embedding lookup, Linear layers over the concatenations in DeepSpec's order
([hidden ; prev_emb] for gated, [state ; prev_emb ; hidden] for rnn), then the row
sampled by the sampling spec (greedy first argmax, or Gumbel-max from the hash)."""

import torch
import torch.nn.functional as F

import specs.sampling as sampling


def markov_latent(kind, emb, hidden, state, proj_weight, proj_bias):
    """(latent, next state) of one step for one request, float64."""
    if kind == "vanilla":
        return emb, state
    if kind == "gated":
        return torch.sigmoid(F.linear(torch.cat([hidden, emb]), proj_weight, proj_bias)) * emb, state
    gate_raw, candidate_raw, output_raw = F.linear(torch.cat([state, emb, hidden]), proj_weight, proj_bias).chunk(3)
    gate = torch.sigmoid(gate_raw)
    return torch.tanh(output_raw), gate * state + (1.0 - gate) * torch.tanh(candidate_raw)


def markov_block_sample(kind, weights, first_prev, temperature, seeds, positions, salt):
    """weights: the case's module weights (fixtures/markov_block.py), any float dtype.
    Returns (tokens [B][S] ints, corrected logits [B, S, V] float64)."""
    w = {name: t.double() for name, t in weights.items()}
    num_reqs, num_steps, vocab = w["base"].shape
    corrected = torch.zeros(num_reqs, num_steps, vocab, dtype=torch.float64)
    tokens = []
    for b in range(num_reqs):
        prev, state, row_tokens = first_prev[b], torch.zeros(w["w1"].shape[1], dtype=torch.float64), []
        for s in range(num_steps):
            emb = F.embedding(torch.tensor(prev), w["w1"])
            latent, state = markov_latent(kind, emb, w["hidden_states"][b, s], state, w["proj_weight"], w["proj_bias"])
            row = w["base"][b, s] + F.linear(latent, w["w2"])
            corrected[b, s] = row
            prev = sampling.draft_sample(row.tolist(), temperature[b], seeds[b], positions[b] + s, salt)
            row_tokens.append(prev)
        tokens.append(row_tokens)
    return tokens, corrected
