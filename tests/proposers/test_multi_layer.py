"""MultiLayerEagleProposer against the slow per-request oracle of specs.proposer_layers,
over several calls in a row (a prefill, then continuations with rejected tokens),
greedy and seeded sampling, 1-D and M-RoPE positions. Each layer's KV writes are
checked too: a layer's cache holds something at exactly the slots the oracle says
that layer wrote."""

import dataclasses
import warnings

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.proposers import MultiLayerEagleProposer

from fixtures.multi_proposers import (
    ML_BLOCK,
    ML_LAYERS,
    QUERY_LENS,
    expected_slots,
    make_multi_layer,
    mtp_head,
    multi_layer_calls,
    propose_by_path,
    written_slots,
)
from specs.proposer_layers import MultiLayerOracle


@pytest.mark.parametrize("path", ["padded", "unpadded"])
@pytest.mark.parametrize("mrope", [False, True], ids=["1d", "mrope"])
@pytest.mark.parametrize("sampling", ["greedy", "probabilistic"])
def test_multi_layer_matches_oracle(sampling, mrope, path):
    head, proposer = make_multi_layer(mrope, sampling)
    oracle = MultiLayerOracle(head, len(QUERY_LENS))
    greedy = sampling == "greedy"
    with torch.no_grad():
        for call, (batch, rejected) in enumerate(multi_layer_calls(mrope, sampling)):
            want, _, _ = oracle.propose(batch, rejected=rejected, greedy=greedy)
            got = propose_by_path(proposer, batch, rejected, path)
            assert got.draft_tokens.shape == (len(QUERY_LENS), ML_LAYERS)
            assert got.draft_tokens.tolist() == want, f"call {call}"
            cached = proposer.shift_cache.cached_lens[: len(QUERY_LENS)].tolist()
            assert cached == [len(t) for t in oracle.tails], f"call {call}"
            for layer in range(ML_LAYERS):
                memory = {b: oracle.memories.of(b, layer) for b in range(len(QUERY_LENS))}
                want_slots = expected_slots(memory, batch.metadata.block_table, ML_BLOCK)
                assert written_slots(proposer.kv_caches[layer]) == want_slots, f"call {call} layer {layer}"


def test_multi_layer_shift_happened():
    """The scenario exercises the shift: some windows move (else the test is weak)."""
    head = mtp_head(False, ML_LAYERS)
    oracle = MultiLayerOracle(head, len(QUERY_LENS))
    shifts = []
    with torch.no_grad():
        for batch, rejected in multi_layer_calls(False, "greedy"):
            _, _, seq_lens = oracle.propose(batch, rejected=rejected)
            shifts += [int(s) - a for s, a in zip(batch.metadata.seq_lens.tolist(), seq_lens, strict=True)]
    assert max(shifts) == ML_LAYERS and 0 < sum(s > 0 for s in shifts) < len(shifts)


def test_multi_layer_adjusts_num_speculative_tokens():
    with pytest.warns(UserWarning, match="adjusted to n_predict = 3"):
        _, proposer = make_multi_layer(False, "greedy", k=5)
    assert proposer.num_speculative_tokens == 3 and proposer.config.num_speculative_tokens == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_multi_layer(False, "greedy", k=3)


def test_multi_layer_reset_cache_forgets_rows():
    _, proposer = make_multi_layer(False, "greedy")
    batch, _ = next(multi_layer_calls(False, "greedy"))
    with torch.no_grad():
        proposer.propose(*batch.propose_args())
    assert proposer.shift_cache.cached_lens[:4].tolist() == [3, 1, 3, 3]
    proposer.reset_cache([0, 2])
    assert proposer.shift_cache.cached_lens[:4].tolist() == [0, 1, 0, 3]
    proposer.reset_cache()
    assert proposer.shift_cache.cached_lens.tolist() == [0] * 6


def test_multi_layer_bad_input():
    head = mtp_head(False, ML_LAYERS)
    kv = head.allocate_kv_caches(8, ML_BLOCK)
    eagle = SpeculativeConfig(method="eagle", num_speculative_tokens=3, block_size=ML_BLOCK)
    with pytest.raises(ValueError, match="method"):
        MultiLayerEagleProposer(head, eagle, kv, max_num_reqs=4)
    mtp = dataclasses.replace(eagle, method="mtp")
    with pytest.raises(ValueError, match="max_num_reqs"):
        MultiLayerEagleProposer(head, mtp, kv, max_num_reqs=0)
    proposer = MultiLayerEagleProposer(head, mtp, kv, max_num_reqs=2)
    batch, _ = next(multi_layer_calls(False, "greedy"))
    with pytest.raises(ValueError, match="max_num_reqs"):
        proposer.propose(*batch.propose_args())
    args = batch.propose_args()
    rejected = torch.zeros(batch.metadata.num_reqs, dtype=torch.int32)
    with pytest.raises(ValueError, match="num_kept_tokens"):
        proposer.propose_unpadded(*args[:4], rejected, batch.metadata, num_kept_tokens=-1)
