"""Requests at the edge of max_model_len: steps past it clamp (position 0, PAD
slot), and the draft's KV cache changes only inside each request's own blocks, at
positions below max_model_len (the whole cache is compared before and after)."""

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.proposers import EagleProposer
from specdraft.testing.proposers import make_draft_batch

from fixtures.draft_heads import VOCAB, make_head
from specs.proposer import oracle_propose

BLOCK_SIZE, BLOCKS, MAX_MODEL_LEN, K = 4, 5, 16, 4
QUERY_LENS = [15, 13, 4, 16]  # last positions 14, 12, 3, 15: steps cross 16 at different k


@pytest.mark.parametrize("mrope", [False, True], ids=["1d", "mrope"])
@pytest.mark.parametrize("method", ["eagle", "mtp"])
def test_clamp_at_max_model_len_writes_only_own_blocks(method, mrope):
    head, target_hidden = make_head(method, mrope)
    batch = make_draft_batch(QUERY_LENS, vocab_size=VOCAB, target_hidden_size=target_hidden,
                             block_size=BLOCK_SIZE, blocks_per_request=BLOCKS, mrope=mrope)  # fmt: skip
    config = SpeculativeConfig(
        method=method, num_speculative_tokens=K, max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE
    )
    kv = head.allocate_kv_caches(len(QUERY_LENS) * BLOCKS, BLOCK_SIZE)
    for cache in kv:
        cache.fill_(float("nan"))  # every write shows
    with torch.no_grad():
        got = EagleProposer(head, config, kv).propose(*batch.propose_args()).draft_tokens.tolist()
        want = oracle_propose(head, batch, K)

    block_table = batch.metadata.block_table
    allowed = torch.zeros(len(QUERY_LENS) * BLOCKS, BLOCK_SIZE, dtype=torch.bool)
    for b, n in enumerate(QUERY_LENS):
        last = n - 1
        # Draft token k comes from a step fed at position last + k; unclamped steps
        # are those below max_model_len, and only they write KV.
        fed = [p for p in range(0, last + K) if p < MAX_MODEL_LEN]
        for p in fed:
            allowed[block_table[b, p // BLOCK_SIZE], p % BLOCK_SIZE] = True
        valid = [k for k in range(K) if last + k < MAX_MODEL_LEN]
        assert [got[b][k] for k in valid] == [want[b][k] for k in valid], f"request {b}"
    for cache in kv:
        written = ~torch.isnan(cache).all(dim=(-1, -2))  # [2, blocks, block_size]
        assert torch.equal(written[0], allowed) and torch.equal(written[1], allowed)
