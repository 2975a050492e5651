"""MultiGroupMTPProposer (draft layers in several KV-cache groups) against the
step-by-step oracle of specs.proposer_layers, over several calls in a row, greedy and
seeded sampling, 1-D and M-RoPE positions; each group's layers write only into that
group's blocks."""

import dataclasses

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.proposers import EagleProposer, GroupedBatchMetadata, MultiGroupMTPProposer

from fixtures.multi_proposers import (
    MG_BLOCK_SIZES,
    MG_K,
    MG_LAYERS,
    MG_REJECTED,
    QUERY_LENS,
    call_batch,
    expected_slots,
    make_multi_group,
    mtp_head,
    multi_group_calls,
    padded_kwargs,
    propose_by_path,
    written_slots,
)
from specs.proposer_layers import Memories, oracle_stepwise


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
