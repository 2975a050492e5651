"""EagleProposer (eagle / eagle3 / mtp) against the slow per-request oracle, on
random tiny heads: same draft tokens, for greedy and seeded sampling, 1-D and
M-RoPE positions, and every input path (plain, padded after rejection, unpadded)."""

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.proposers import EagleProposer
from specdraft.testing.proposers import make_draft_batch

from fixtures.draft_heads import VOCAB, make_head
from specs.proposer import oracle_propose

K = 3
BLOCK_SIZE = 4
QUERY_LENS = [5, 1, 9, 3]
REJECTED = [2, 0, 3, 1]


def build(method, mrope, sampling, seed=0):
    head, target_hidden = make_head(method, mrope, seed)
    batch = make_draft_batch(
        QUERY_LENS,
        vocab_size=VOCAB,
        target_hidden_size=target_hidden,
        block_size=BLOCK_SIZE,
        blocks_per_request=6,
        mrope=mrope,
        temperatures=[0.0, 1.0, 0.5, 2.0] if sampling == "probabilistic" else None,
        seed=seed,
    )
    config = SpeculativeConfig(
        method=method, num_speculative_tokens=K, max_model_len=256, block_size=BLOCK_SIZE, draft_sampling=sampling
    )
    kv = head.allocate_kv_caches(len(QUERY_LENS) * 6, BLOCK_SIZE)
    return head, batch, EagleProposer(head, config, kv)


@pytest.mark.parametrize("path", ["plain", "padded", "unpadded"])
@pytest.mark.parametrize("mrope", [False, True], ids=["1d", "mrope"])
@pytest.mark.parametrize("sampling", ["greedy", "probabilistic"])
@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_eagle_proposer_matches_oracle(method, sampling, mrope, path):
    head, batch, proposer = build(method, mrope, sampling)
    greedy = sampling == "greedy"
    with torch.no_grad():
        if path == "plain":
            want = oracle_propose(head, batch, K, greedy=greedy)
            got = proposer.propose(*batch.propose_args())
        elif path == "padded":
            want = oracle_propose(head, batch, K, rejected=REJECTED, greedy=greedy)
            rejected = torch.tensor(REJECTED, dtype=torch.int32)
            got = proposer.propose(
                *batch.propose_args(),
                token_indices_to_sample=batch.metadata.query_start_loc[1:] - 1 - rejected,
                num_rejected_tokens=rejected,
            )
        else:
            want = oracle_propose(head, batch, K, rejected=REJECTED, greedy=greedy)
            args = batch.propose_args()
            got = proposer.propose_unpadded(
                *args[:4],
                torch.tensor(REJECTED, dtype=torch.int32),
                batch.metadata,
                num_kept_tokens=sum(QUERY_LENS),  # an upper bound: the tail is graph padding
                sampling=batch.sampling,
            )
    assert got.draft_tokens.dtype == torch.int32
    assert got.draft_tokens.tolist() == want
