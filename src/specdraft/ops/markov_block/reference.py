"""The torch reference of `markov_block_sample` (this package's docstring defines what
it computes): the CPU path and the kernels' oracle. Vectorised over the batch; the
Python loop over the S steps of the block unrolls at trace time (S is a shape)."""

import torch

from ..sampling.draft import draft_sample_reference


def markov_latent_reference(
    kind: str,
    emb: torch.Tensor,
    hidden: torch.Tensor | None,
    latent_weight: torch.Tensor | None,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's (latent [B, r], next state [B, r]) in fp32 from the previous token's
    embedding emb = W1[p] [B, r], this step's hidden part [B, r or 3r] and the
    latent weight (the package docstring's split); the state only moves for rnn."""
    if kind == "vanilla":
        return emb, state
    if kind == "gated":
        return torch.sigmoid(hidden + emb @ latent_weight.T) * emb, state
    proj = hidden + torch.cat([state, emb], -1) @ latent_weight.T
    gate_raw, candidate_raw, output_raw = proj.chunk(3, -1)
    gate = torch.sigmoid(gate_raw)
    state = gate * state + (1.0 - gate) * torch.tanh(candidate_raw)
    return torch.tanh(output_raw), state


def markov_block_sample_reference(
    base_logits: torch.Tensor,
    first_prev_tokens: torch.Tensor,
    markov_w1: torch.Tensor,
    markov_w2: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    kind: str,
    hidden_part: torch.Tensor | None,
    latent_weight: torch.Tensor | None,
    salt: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_reqs, num_steps, vocab = base_logits.shape
    w1, w2 = markov_w1.float(), markov_w2.float()
    weight = None if latent_weight is None else latent_weight.float()
    # Out-of-range first tokens break the contract (checked mode refuses them); clamped,
    # they never index outside W1.
    prev = first_prev_tokens.long().clamp(0, vocab - 1)
    state = torch.zeros((num_reqs, w1.shape[1]), dtype=torch.float32, device=base_logits.device)
    tokens, corrected = [], []
    for step in range(num_steps):
        hidden = None if hidden_part is None else hidden_part[:, step].float()
        latent, state = markov_latent_reference(kind, w1.index_select(0, prev), hidden, weight, state)
        row = base_logits[:, step].float() + latent @ w2.T
        token = draft_sample_reference(row, temperature, seeds, positions.long() + step, salt)
        tokens.append(token)
        corrected.append(row)
        prev = token.long()
    return torch.stack(tokens, 1), torch.stack(corrected, 1)
