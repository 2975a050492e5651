"""A slow reference proposer: one request at a time, Python loops, and at every
draft step the whole sequence so far recomputed from scratch (a fresh KV cache,
causal attention over the prefix). It shares only the model weights and the
sampler's noise with the batched loop: no KV reuse, no slot mapping, no step
metadata, no batching."""

import torch

from specdraft.layout import BatchMetadata
from specdraft.ops.sampling import draft_sample_reference


def run_sequence(model, input_ids, positions, hidden_states, spec_step_idx):
    """Model outputs for one request's whole sequence, prefill-style."""
    n = input_ids.shape[0]
    block_size = 8
    num_blocks = (n + block_size - 1) // block_size
    kv = model.allocate_kv_caches(num_blocks, block_size)
    meta = BatchMetadata(
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_table=torch.arange(num_blocks, dtype=torch.int32)[None],
        slot_mapping=torch.arange(n, dtype=torch.int64),
        max_query_len=n,
        max_seq_len=num_blocks * block_size,
    )
    return model(input_ids, positions, hidden_states, meta, kv, spec_step_idx=spec_step_idx)


def oracle_propose(model, batch, num_speculative_tokens, *, rejected=None, greedy=True, salt=0):
    """Draft tokens [B, K] (list of lists) for a prefill batch; `rejected[b]`
    tokens at the end of window b are dropped (what rejection would remove)."""
    qsl = batch.metadata.query_start_loc.tolist()
    out = []
    for b in range(len(qsl) - 1):
        start, stop = qsl[b], qsl[b + 1] - (rejected[b] if rejected else 0)
        ids = batch.target_token_ids[start:stop].tolist()[1:] + [int(batch.next_token_ids[b])]
        input_ids = torch.tensor(ids, dtype=torch.int32)
        positions = batch.target_positions[..., start:stop]
        hidden = model.combine_hidden_states(batch.target_hidden_states[start:stop])
        tokens = []
        for step in range(num_speculative_tokens):
            h_sample, h_next = run_sequence(model, input_ids, positions, hidden, spec_step_idx=step)
            logits = model.compute_logits(h_sample[-1:], spec_step_idx=step)
            last_pos = positions[..., -1:]
            token_pos = (last_pos[0] if last_pos.dim() == 2 else last_pos) + 1
            temp = torch.zeros(1) if greedy else batch.sampling.temperature[b : b + 1]
            token = int(draft_sample_reference(logits, temp, batch.sampling.seeds[b : b + 1], token_pos, salt)[0])
            tokens.append(token)
            input_ids = torch.cat([input_ids, torch.tensor([token], dtype=torch.int32)])
            positions = torch.cat([positions, last_pos + 1], dim=-1)
            hidden = torch.cat([hidden, h_next[-1:]])
        out.append(tokens)
    return out


def oracle_path_logprobs(model, batch, b, path):
    """Draft log-probabilities over the draft vocabulary after each prefix of `path`
    (forced target ids following request b's next token), each recomputed from
    scratch as a chain: [len(path) + 1, Vd], row 0 the root's."""
    qsl = batch.metadata.query_start_loc.tolist()
    start, stop = qsl[b], qsl[b + 1]
    ids = batch.target_token_ids[start:stop].tolist()[1:] + [int(batch.next_token_ids[b])]
    input_ids = torch.tensor(ids, dtype=torch.int32)
    positions = batch.target_positions[..., start:stop]
    hidden = model.combine_hidden_states(batch.target_hidden_states[start:stop])
    rows = []
    for step in range(len(path) + 1):
        h_sample, h_next = run_sequence(model, input_ids, positions, hidden, spec_step_idx=step)
        rows.append(torch.log_softmax(model.draft_logits(h_sample[-1:], step).float(), -1)[0])
        if step == len(path):
            break
        input_ids = torch.cat([input_ids, torch.tensor([path[step]], dtype=torch.int32)])
        positions = torch.cat([positions, positions[..., -1:] + 1], dim=-1)
        hidden = torch.cat([hidden, h_next[-1:]])
    return torch.stack(rows)
