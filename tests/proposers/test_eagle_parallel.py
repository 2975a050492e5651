"""Parallel drafting (config.parallel_drafting): all K drafts from one pass, against
a per-request oracle that builds the expanded sequence by hand ([kept tokens shifted
by one, next token, K - 1 mask tokens], their positions and hidden states) and runs
it through the model with a fresh cache. (M-RoPE windows holding images:
test_mrope_images.py.)"""

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.ops.sampling import draft_sample_reference
from specdraft.proposers import EagleProposer
from specdraft.testing.proposers import make_draft_batch

from fixtures.draft_heads import VOCAB, make_head
from specs.proposer import run_sequence

K, BLOCK_SIZE, MASK_TOKEN = 3, 4, 7
QUERY_LENS = [5, 1, 9, 4]
REJECTED = [2, 0, 3, 1]


def oracle_parallel(head, batch, rejected, greedy):
    qsl = batch.metadata.query_start_loc.tolist()
    out = []
    for b in range(len(qsl) - 1):
        start, stop = qsl[b], qsl[b + 1]
        kept = stop - start - rejected[b]  # tokens up to and including the last accepted
        ids = batch.target_token_ids[start + 1 : start + kept].tolist() + [int(batch.next_token_ids[b])]
        ids += [MASK_TOKEN] * (K - 1)
        # Kept tokens keep their positions; the K - 1 mask slots continue every row of
        # the last kept token's by one (text).
        last = batch.target_positions[..., start + kept - 1 : start + kept]
        positions = torch.cat([batch.target_positions[..., start : start + kept], last + torch.arange(1, K)], dim=-1)
        hidden = head.combine_hidden_states(batch.target_hidden_states[start : start + kept])
        hidden = torch.cat([hidden, hidden.new_zeros(K - 1, hidden.shape[1])])
        h_sample, _ = run_sequence(head, torch.tensor(ids, dtype=torch.int32), positions, hidden, spec_step_idx=0)
        logits = head.compute_logits(h_sample[kept - 1 :], spec_step_idx=0)  # next-token slot + mask slots
        row0 = positions[0] if positions.dim() == 2 else positions
        token_pos = row0[kept - 1 :] + 1
        temp = torch.zeros(K) if greedy else batch.sampling.temperature[b].repeat(K)
        seeds = batch.sampling.seeds[b].repeat(K)
        out.append(draft_sample_reference(logits, temp, seeds, token_pos).tolist())
    return out


@pytest.mark.parametrize("rejected", [False, True], ids=["all-kept", "rejected"])
@pytest.mark.parametrize("mrope", [False, True], ids=["1d", "mrope"])
@pytest.mark.parametrize("sampling", ["greedy", "probabilistic"])
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_parallel_drafting_matches_oracle(method, sampling, mrope, rejected):
    head, target_hidden = make_head(method, mrope)
    batch = make_draft_batch(QUERY_LENS, vocab_size=VOCAB, target_hidden_size=target_hidden, block_size=BLOCK_SIZE,
                             blocks_per_request=6, mrope=mrope, temperatures=[0.0, 1.0, 0.5, 2.0])  # fmt: skip
    config = SpeculativeConfig(
        method=method, num_speculative_tokens=K, max_model_len=256, block_size=BLOCK_SIZE, draft_sampling=sampling,
        return_probs="probs" if sampling == "probabilistic" else None,
        parallel_drafting=True, parallel_drafting_token_id=MASK_TOKEN,
    )  # fmt: skip
    kv = head.allocate_kv_caches(len(QUERY_LENS) * 6, BLOCK_SIZE)
    rej = REJECTED if rejected else [0] * len(QUERY_LENS)
    with torch.no_grad():
        got = EagleProposer(head, config, kv).propose(
            *batch.propose_args(), num_rejected_tokens=torch.tensor(rej, dtype=torch.int32)
        )
        want = oracle_parallel(head, batch, rej, greedy=sampling == "greedy")
    assert got.draft_tokens.tolist() == want
    if sampling == "probabilistic":
        torch.testing.assert_close(got.draft_probs.sum(-1), torch.ones(len(QUERY_LENS), K))


def test_parallel_drafting_needs_the_mask_token():
    with pytest.raises(ValueError, match="parallel_drafting_token_id"):
        SpeculativeConfig(parallel_drafting=True)
