"""MultiLayerEagleProposer (reference 000) and MultiGroupMTPProposer (reference 003)
against the slow per-request oracles of proposer_layer_oracle, over several calls
in a row (prefill, then continuations with rejected tokens), greedy and seeded
sampling, 1-D and M-RoPE positions. Each layer's KV writes are checked too: a
layer's cache holds something at exactly the slots of the positions the oracle says
that layer wrote (so a group's layers write only into that group's blocks)."""

import dataclasses
import warnings

import pytest
import torch
from proposer_layer_oracle import Memories, MultiLayerOracle, oracle_stepwise
from proposer_models import VOCAB, draft_config

from specdraft.config import SpeculativeConfig
from specdraft.models import MTPHead
from specdraft.proposers import GroupedBatchMetadata, MultiGroupMTPProposer, MultiLayerEagleProposer
from specdraft.testing.proposers import make_draft_batch

QUERY_LENS = [5, 1, 9, 3]
TEMPERATURES = [0.0, 1.0, 0.5, 2.0]


def mtp_head(mrope, n_predict, per_layer_lm_head=False, seed=0):
    torch.manual_seed(seed)
    return MTPHead(draft_config(mrope, n_predict=n_predict), per_layer_lm_head=per_layer_lm_head).eval()


def call_batch(query_lens, starts, *, call, mrope, sampling, block_size, blocks_per_request):
    """One call's batch: the block table depends only on the sizes (seed 0), so it is
    the same every call; token ids, hidden states and next tokens are fresh."""
    batch = make_draft_batch(
        query_lens,
        vocab_size=VOCAB,
        target_hidden_size=32,
        block_size=block_size,
        blocks_per_request=blocks_per_request,
        start_positions=starts,
        mrope=mrope,
        temperatures=TEMPERATURES if sampling == "probabilistic" else None,
        seed=0,
    )
    gen = torch.Generator().manual_seed(100 + call)
    num_tokens, num_reqs = sum(query_lens), len(query_lens)
    return dataclasses.replace(
        batch,
        target_token_ids=torch.randint(0, VOCAB, (num_tokens,), generator=gen, dtype=torch.int32),
        target_hidden_states=torch.randn(num_tokens, 32, generator=gen),
        next_token_ids=torch.randint(0, VOCAB, (num_reqs,), generator=gen, dtype=torch.int32),
    )


def written_slots(cache):
    """Flat slots of a [2, blocks, block_size, heads, dim] cache holding anything."""
    return set(torch.nonzero(cache.abs().sum(dim=(0, 3, 4)).flatten()).flatten().tolist())


def expected_slots(memory_by_req, block_table, block_size):
    slots = set()
    for b, positions in memory_by_req.items():
        for p in positions:
            slots.add(int(block_table[b, p // block_size]) * block_size + p % block_size)
    return slots


def padded_kwargs(batch, rejected):
    rej = torch.tensor(rejected, dtype=torch.int32, device=batch.metadata.query_start_loc.device)
    return dict(token_indices_to_sample=batch.metadata.query_start_loc[1:] - 1 - rej, num_rejected_tokens=rej)


def propose_by_path(proposer, batch, rejected, path):
    """padded: the rejected rows stay as padding; unpadded: propose_unpadded with an
    upper bound of the kept tokens (all of them), as an engine would call it."""
    if not rejected:
        return proposer.propose(*batch.propose_args())
    if path == "padded":
        return proposer.propose(*batch.propose_args(), **padded_kwargs(batch, rejected))
    args = batch.propose_args()
    return proposer.propose_unpadded(
        *args[:4], torch.tensor(rejected, dtype=torch.int32, device=batch.metadata.query_start_loc.device), batch.metadata,
        num_kept_tokens=batch.target_token_ids.shape[0], sampling=batch.sampling,
    )  # fmt: skip


# --------------------------------------------------------------------------- multi-layer

ML_LAYERS = 3
ML_BLOCK, ML_BLOCKS_PER_REQ = 4, 8
# Call 1: prefills sampling their last token. Calls 2, 3: K + 1 = 4 tokens from the
# token after the last accepted one, with these many rejected at the end (the shift
# is limited by the window's first position and by the cached tail).
ML_REJECTED = [None, [2, 0, 3, 1], [1, 3, 0, 2]]


def multi_layer_calls(mrope, sampling):
    starts = [0] * len(QUERY_LENS)
    lens = QUERY_LENS
    for call, rejected in enumerate(ML_REJECTED):
        batch = call_batch(
            lens, starts, call=call, mrope=mrope, sampling=sampling,
            block_size=ML_BLOCK, blocks_per_request=ML_BLOCKS_PER_REQ,
        )  # fmt: skip
        rej = rejected or [0] * len(lens)
        yield batch, rejected
        # The next window starts at the token after the last kept one.
        starts = [s + n - r for s, n, r in zip(starts, lens, rej, strict=True)]
        lens = [ML_LAYERS + 1] * len(lens)


def make_multi_layer(mrope, sampling, k=ML_LAYERS):
    head = mtp_head(mrope, ML_LAYERS)
    config = SpeculativeConfig(
        method="mtp", num_speculative_tokens=k, max_model_len=256, block_size=ML_BLOCK, draft_sampling=sampling
    )
    kv = head.allocate_kv_caches(len(QUERY_LENS) * ML_BLOCKS_PER_REQ, ML_BLOCK)
    return head, MultiLayerEagleProposer(head, config, kv, max_num_reqs=6)


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


# --------------------------------------------------------------------------- multi-group

MG_LAYERS, MG_K = 2, 3  # step 2 runs layer 0 again: it reads the first pass's KV
MG_BLOCK_SIZES = [4, 8]
MG_BLOCKS_PER_REQ = [8, 4]
MG_SPARE_BLOCKS = 5  # blocks no request owns: must stay untouched
MG_REJECTED = [[2, 0, 3, 1], [0, 1, 2, 3]]


def group_tables(num_reqs):
    """Group 0's table is make_draft_batch's; group 1 gets its own blocks and size."""
    gen = torch.Generator().manual_seed(7)
    n = MG_BLOCKS_PER_REQ[1]
    return torch.randperm(num_reqs * n + MG_SPARE_BLOCKS, generator=gen)[: num_reqs * n].view(num_reqs, n).int()


def grouped(batch, table1):
    md = batch.metadata
    qsl = md.query_start_loc.tolist()
    pos = (batch.target_positions[0] if batch.target_positions.dim() == 2 else batch.target_positions).tolist()
    bs = MG_BLOCK_SIZES[1]
    slots1 = [
        int(table1[b, pos[t] // bs]) * bs + pos[t] % bs for b in range(len(qsl) - 1) for t in range(qsl[b], qsl[b + 1])
    ]
    metadata = GroupedBatchMetadata.from_groups(
        md.query_start_loc,
        md.seq_lens,
        [md.block_table, table1.to(md.block_table.device)],
        [md.slot_mapping, torch.tensor(slots1, dtype=torch.int64, device=md.slot_mapping.device)],
        md.max_query_len,
        md.max_seq_len,
    )
    return dataclasses.replace(batch, metadata=metadata)


def multi_group_calls(mrope, sampling):
    starts, lens = [0] * len(QUERY_LENS), QUERY_LENS
    table1 = group_tables(len(QUERY_LENS))
    for call, rejected in enumerate(MG_REJECTED):
        batch = call_batch(
            lens, starts, call=call, mrope=mrope, sampling=sampling,
            block_size=MG_BLOCK_SIZES[0], blocks_per_request=MG_BLOCKS_PER_REQ[0],
        )  # fmt: skip
        yield grouped(batch, table1), rejected, table1
        starts = [s + n - r for s, n, r in zip(starts, lens, rejected, strict=True)]
        lens = [MG_K + 1] * len(lens)


def make_multi_group(mrope, sampling):
    head = mtp_head(mrope, MG_LAYERS, per_layer_lm_head=True)
    config = SpeculativeConfig(
        method="mtp", num_speculative_tokens=MG_K, max_model_len=256, block_size=4, draft_sampling=sampling
    )
    layer_groups = [0, 1]
    kv = [
        torch.zeros(head.kv_cache_shape(len(QUERY_LENS) * MG_BLOCKS_PER_REQ[g] + MG_SPARE_BLOCKS, MG_BLOCK_SIZES[g]))
        for g in layer_groups
    ]
    return head, MultiGroupMTPProposer(head, config, kv, layer_groups=layer_groups, block_sizes=MG_BLOCK_SIZES)


@pytest.mark.parametrize("path", ["padded", "unpadded"])
@pytest.mark.parametrize("mrope", [False, True], ids=["1d", "mrope"])
@pytest.mark.parametrize("sampling", ["greedy", "probabilistic"])
def test_multi_group_matches_oracle(sampling, mrope, path):
    head, proposer = make_multi_group(mrope, sampling)
    memories = Memories(MG_LAYERS)
    greedy = sampling == "greedy"
    with torch.no_grad():
        for call, (batch, rejected, table1) in enumerate(multi_group_calls(mrope, sampling)):
            want = oracle_stepwise(head, batch, MG_K, memories, rejected=rejected, greedy=greedy)
            got = propose_by_path(proposer, batch, rejected, path)
            assert got.draft_tokens.tolist() == want, f"call {call}"
            tables = [batch.metadata.block_table, table1]
            for layer, group in enumerate(proposer.layer_groups):
                memory = {b: memories.of(b, layer) for b in range(len(QUERY_LENS))}
                want_slots = expected_slots(memory, tables[group], MG_BLOCK_SIZES[group])
                written = written_slots(proposer.kv_caches[layer])
                if path == "padded":
                    assert written == want_slots, f"call {call} layer {layer}"
                else:  # repacked: the rejected rows are never written
                    assert written <= want_slots, f"call {call} layer {layer}"


def test_multi_group_equals_single_group_when_groups_agree():
    """Both layers in one group with one block table: the same drafts and caches as
    EagleProposer, whose loop it shares."""
    from specdraft.proposers import EagleProposer

    head = mtp_head(False, MG_LAYERS, per_layer_lm_head=True)
    config = SpeculativeConfig(method="mtp", num_speculative_tokens=MG_K, max_model_len=256, block_size=4)
    batch = call_batch(QUERY_LENS, None, call=0, mrope=False, sampling="greedy", block_size=4, blocks_per_request=8)
    md = batch.metadata
    one = GroupedBatchMetadata.from_groups(
        md.query_start_loc, md.seq_lens, [md.block_table], [md.slot_mapping], md.max_query_len, md.max_seq_len
    )
    kv_a, kv_b = head.allocate_kv_caches(32, 4), head.allocate_kv_caches(32, 4)
    multi = MultiGroupMTPProposer(head, config, kv_a, layer_groups=[0, 0], block_sizes=[4])
    single = EagleProposer(head, config, kv_b)
    kwargs = padded_kwargs(batch, MG_REJECTED[0])
    with torch.no_grad():
        got = multi.propose(*batch.propose_args()[:4], one, batch.sampling, **kwargs)
        want = single.propose(*batch.propose_args(), **kwargs)
    assert torch.equal(got.draft_tokens, want.draft_tokens)
    for a, b in zip(kv_a, kv_b, strict=True):
        assert torch.equal(a, b)


def test_multi_group_bad_input():
    head, proposer = make_multi_group(False, "greedy")
    kv = proposer.kv_caches
    config = proposer.config
    with pytest.raises(ValueError, match="layer_groups"):
        MultiGroupMTPProposer(head, config, kv, layer_groups=[0], block_sizes=MG_BLOCK_SIZES)
    with pytest.raises(ValueError, match=r"layer_groups\[1\]"):
        MultiGroupMTPProposer(head, config, kv, layer_groups=[0, 2], block_sizes=MG_BLOCK_SIZES)
    with pytest.raises(ValueError, match=r"kv_caches\[1\]"):
        MultiGroupMTPProposer(head, config, kv, layer_groups=[0, 0], block_sizes=MG_BLOCK_SIZES)
    with pytest.raises(ValueError, match=r"block_sizes\[0\]"):
        MultiGroupMTPProposer(head, config, kv, layer_groups=[0, 1], block_sizes=[0, 8])
    batch, _, _ = next(multi_group_calls(False, "greedy"))
    with pytest.raises(ValueError, match="GroupedBatchMetadata"):
        md = batch.metadata
        plain = type(md).__mro__[1](
            md.query_start_loc, md.seq_lens, md.block_table, md.slot_mapping, md.max_query_len, md.max_seq_len
        )
        proposer.propose(*batch.propose_args()[:4], plain)
    md = batch.metadata
    short = dataclasses.replace(md, slot_mappings=[md.slot_mappings[0], md.slot_mappings[1][:-1]])
    with pytest.raises(ValueError, match=r"slot_mappings\[1\]"):
        proposer.propose(*batch.propose_args()[:4], short)
    with pytest.raises(ValueError, match="one per group"):
        proposer.propose(*batch.propose_args()[:4], dataclasses.replace(md, block_tables=md.block_tables[:1]))
