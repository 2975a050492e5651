"""A slow reference for the training unroll: one chain at a time, Python loops, and
at every step the chain's whole sequence recomputed from a fresh KV cache by the
head's own forward (specs.proposer.run_sequence). It shares only the weights with
the unroll: no batching of chains, no diagonal keys, no packed masks."""

import torch

from specs.proposer import run_sequence


def chain_logits(head, packed, t: int, start: int, end: int, num_steps: int, *, tokens: str, loop: str):
    """Target-vocabulary logits [n, V] of steps 0 .. n-1 of the chain that starts at
    row t (window: rows start .. t, next token t + 1); n < num_steps where data
    feeding runs out of data (step k reads the data token t + k + 1)."""
    ids = packed.token_ids[start + 1 : t + 2].tolist()
    positions = packed.positions[..., start : t + 1]
    hidden = head.combine_hidden_states(packed.hidden_states[start : t + 1])
    out = []
    for step in range(num_steps):
        h_sample, h_next = run_sequence(head, torch.tensor(ids, dtype=torch.int32), positions, hidden, step)
        logits = head.compute_logits(h_sample[-1:], spec_step_idx=step)[0]
        out.append(logits)
        if tokens == "draft":
            token = int(logits.argmax())
        elif t + step + 2 < end:
            token = int(packed.token_ids[t + step + 2])
        else:
            break
        if loop == "eagle":
            # One more token, one position on (every M-RoPE row), fed the step's hidden.
            ids.append(token)
            positions = torch.cat([positions, positions[..., -1:] + 1], dim=-1)
            hidden = torch.cat([hidden, h_next[-1:]])
        else:
            # The same window again, ids shifted by one, each row fed its own output.
            ids = ids[1:] + [token]
            hidden = h_next
    return torch.stack(out)
