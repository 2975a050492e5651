"""Misuse of a block drafter (BlockConfig, BlockDraftHead, BlockProposer, and a block
proposer handed to the decoders): a ValueError naming the argument, raised before
anything runs (the draft's KV caches stay untouched). And checked mode with
BlockProposer.propose: a block drafter writes nothing past its window (draft_steps
0), so a block table that reaches just the window's tokens is valid; checked mode
runs the value checks and gives the unchecked drafts."""

import dataclasses

import pytest
import torch

import specdraft
from specdraft.config import SpeculativeConfig
from specdraft.generation import SpeculativeDecoder, TreeSpeculativeDecoder
from specdraft.models import DraftModelConfig, EagleHead, TinyTargetModel
from specdraft.models.heads.block import BlockConfig, BlockDraftHead
from specdraft.proposers import EagleProposer, MultiLayerEagleProposer, TreeShape
from specdraft.proposers.block import BlockProposer
from specdraft.testing.proposers import make_draft_batch

VOCAB, HIDDEN, CACHE_BLOCK, SENTINEL = 64, 32, 4, 12345.0
QUERY_LENS = [8, 4, 5]


def draft_config(**overrides) -> DraftModelConfig:
    fields = dict(hidden_size=HIDDEN, intermediate_size=48, num_heads=4, num_kv_heads=2, vocab_size=VOCAB,
                  num_layers=2)  # fmt: skip
    return DraftModelConfig(**{**fields, **overrides})


def block_config(**overrides) -> BlockConfig:
    fields = dict(block_size=4, mask_token_id=VOCAB - 1, target_layer_ids=(-1, 0, 1), num_target_layers=3)
    return BlockConfig(**{**fields, **overrides})


def spec_config(**overrides) -> SpeculativeConfig:
    fields = dict(method="block", num_speculative_tokens=3, max_model_len=64, block_size=CACHE_BLOCK)
    return SpeculativeConfig(**{**fields, **overrides})


def sentinel_caches(head, num_blocks=32):
    caches = head.allocate_kv_caches(num_blocks, CACHE_BLOCK)
    for cache in caches:
        cache.fill_(SENTINEL)
    return caches


def untouched(caches) -> bool:
    return all(bool((cache == SENTINEL).all()) for cache in caches)


# ------------------------------------------------------------------ BlockConfig

CONFIG_ROWS = [
    ({"block_size": 0}, r"^block_size must be a positive int, got 0"),
    ({"block_size": True}, r"^block_size must be a positive int, got True"),
    ({"num_target_layers": 0}, r"^num_target_layers must be a positive int"),
    ({"mask_token_id": -1}, r"^mask_token_id must be a non-negative int, got -1"),
    ({"mask_token_id": 3.0}, r"^mask_token_id must be a non-negative int, got 3.0"),
    ({"target_layer_ids": ()}, r"^target_layer_ids must be a non-empty sequence of ints"),
    ({"target_layer_ids": 1}, r"^target_layer_ids must be a non-empty sequence of ints, got 1"),
    ({"target_layer_ids": "01"}, r"^target_layer_ids must be a non-empty sequence of ints, got '01'"),
    ({"target_layer_ids": (-1.0, 0)}, r"^target_layer_ids must be a non-empty sequence of ints"),
    ({"target_layer_ids": (-2, 0)}, r"^target_layer_ids: -2 is outside \{-1\} U \[0, 1\] for a 3-layer target"),
    ({"target_layer_ids": (0, 2)},  # the target's last layer: its output is no aux state
     r"^target_layer_ids: 2 is outside \{-1\} U \[0, 1\] for a 3-layer target .*the last layer's output"),
    ({"target_layer_ids": (0, 0)}, r"^target_layer_ids must be strictly increasing, got \(0, 0\)"),
    ({"target_layer_ids": (1, 0)}, r"^target_layer_ids must be strictly increasing, got \(1, 0\)"),
    ({"markov_rank": -1}, r"^markov_rank must be a non-negative int, got -1"),
    ({"markov_rank": 4}, r"^markov_head_type must be one of \('vanilla', 'gated', 'rnn'\) with markov_rank > 0, "
                         r"got None"),
    ({"markov_rank": 4, "markov_head_type": "lstm"}, r"^markov_head_type must be one of .* got 'lstm'"),
    ({"markov_head_type": "gated"}, r"^markov_head_type: 'gated' given with markov_rank 0 \(no Markov head\)"),
    ({"confidence_head": 1}, r"^confidence_head must be a bool, got 1"),
    ({"confidence_head": True, "confidence_with_markov": True},
     r"^confidence_with_markov: needs a confidence head and a Markov head"),
    ({"markov_rank": 4, "markov_head_type": "rnn", "confidence_with_markov": True},
     r"^confidence_with_markov: needs a confidence head and a Markov head"),
]  # fmt: skip


@pytest.mark.parametrize("overrides,match", CONFIG_ROWS, ids=[str(r[0]) for r in CONFIG_ROWS])
def test_block_config_refuses(overrides, match):
    with pytest.raises(ValueError, match=match):
        block_config(**overrides)


def test_block_config_takes_any_sequence_and_the_embeddings_alone():
    assert block_config(target_layer_ids=[-1, 1]).target_layer_ids == (-1, 1)
    one_layer = block_config(target_layer_ids=(-1,), num_target_layers=1)
    assert one_layer.aux_layers == (0,) and one_layer.kind == "dflash"


# --------------------------------------------------------------- BlockDraftHead

HEAD_ROWS = [
    ({}, {"mask_token_id": VOCAB}, r"^mask_token_id = 64 is outside the vocabulary \[0, 64\)"),
    ({"draft_vocab_size": 32}, {}, r"^draft_vocab_size: block drafters draft over the target's vocabulary"),
    ({"mrope_section": (2, 1, 1)}, {}, r"^mrope_section: block drafters take 1-D positions \(no M-RoPE\)"),
]


@pytest.mark.parametrize("config,block,match", HEAD_ROWS, ids=["mask-out-of-vocab", "draft-vocab", "mrope"])
def test_block_head_refuses(config, block, match):
    with pytest.raises(ValueError, match=match):
        BlockDraftHead(draft_config(**config), block_config(**block))


def test_block_head_refuses_a_dict_for_its_block_config():
    with pytest.raises(ValueError, match=r"^block must be a BlockConfig, got dict"):
        BlockDraftHead(draft_config(), dataclasses.asdict(block_config()))


def test_block_head_has_no_single_token_step():
    with pytest.raises(TypeError, match=r"BlockDraftHead has no single-token step: use block_hidden"):
        BlockDraftHead(draft_config(), block_config())(None, None, None, None, None)


# ---------------------------------------------------------------- BlockProposer


def head_and_caches(**block):
    torch.manual_seed(0)
    head = BlockDraftHead(draft_config(), block_config(**block)).eval()
    return head, sentinel_caches(head)


def test_block_proposer_refuses_more_drafts_than_its_block():
    head, caches = head_and_caches()
    with pytest.raises(ValueError, match=r"^num_speculative_tokens = 5 exceeds the head's block_size 4"):
        BlockProposer(head, spec_config(num_speculative_tokens=5), caches)
    BlockProposer(head, spec_config(num_speculative_tokens=4), caches)  # K = block_size is fine


def test_block_proposer_refuses_parallel_drafting():
    head, caches = head_and_caches()
    config = spec_config(parallel_drafting=True, parallel_drafting_token_id=3)
    with pytest.raises(ValueError, match=r"^parallel_drafting: a block drafter drafts its block in one pass"):
        BlockProposer(head, config, caches)


def test_block_heads_and_other_proposers_do_not_mix():
    head, caches = head_and_caches()
    with pytest.raises(ValueError, match=r"^config.method is 'eagle' but the head is BlockDraftHead, which needs "
                                         r"method='block'"):  # fmt: skip
        BlockProposer(head, spec_config(method="eagle"), caches)
    with pytest.raises(ValueError, match=r"^config.method 'block': block drafters \(DFlash, DSpark\) draft with "
                                         r"BlockProposer"):  # fmt: skip
        EagleProposer(head, spec_config(), caches)
    with pytest.raises(ValueError, match=r"^method must be 'mtp' for the multi-layer proposer, got 'block'"):
        MultiLayerEagleProposer(head, spec_config(), caches, max_num_reqs=4)
    eagle = EagleHead(draft_config(num_layers=1))
    with pytest.raises(ValueError, match=r"^config.method is 'block' but the head is EagleHead, which needs "
                                         r"method='eagle'"):  # fmt: skip
        BlockProposer(eagle, spec_config(), eagle.allocate_kv_caches(8, CACHE_BLOCK))
    with pytest.raises(ValueError, match=r"^kv_caches must hold 2 caches \(one per draft layer\), got 1"):
        BlockProposer(head, spec_config(), caches[:1])
    assert untouched(caches)


def propose_setup(blocks_per_request=8):
    head, caches = head_and_caches()
    proposer = BlockProposer(head, spec_config(), caches)
    batch = make_draft_batch(QUERY_LENS, vocab_size=VOCAB, target_hidden_size=head.hidden_width,
                             block_size=CACHE_BLOCK, blocks_per_request=blocks_per_request,
                             temperatures=[0.0, 1.0, 0.5])  # fmt: skip
    return proposer, batch


PROPOSE_ROWS = [
    ("M-RoPE positions", lambda a: [a[0], torch.stack([a[1]] * 3), *a[2:]],
     r"^target_positions: block drafters take 1-D positions \(no M-RoPE\)"),
    ("one aux layer's width", lambda a: [a[0], a[1], a[2][:, :HIDDEN], *a[3:]],
     r"^target_hidden_states must have 96 columns \(len\(target_layer_ids\) x target_hidden_size: the aux layers "
     r"concatenated\), got shape \(17, 32\)"),
    ("hidden states of a wider target", lambda a: [a[0], a[1], torch.cat([a[2], a[2][:, :3]], 1), *a[3:]],
     r"^target_hidden_states must have 96 columns"),
    ("next_token_ids of B - 1 requests", lambda a: [*a[:3], a[3][:2], *a[4:]], r"^next_token_ids"),
]  # fmt: skip


@pytest.mark.parametrize("change,match", [r[1:] for r in PROPOSE_ROWS], ids=[r[0] for r in PROPOSE_ROWS])
@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "checked"])
def test_propose_refuses(change, match, checked):
    proposer, batch = propose_setup()
    with specdraft.checked(checked), torch.no_grad(), pytest.raises(ValueError, match=match):
        proposer.propose(*change(list(batch.propose_args())))
    assert untouched(proposer.kv_caches)


# ------------------------------------------------------------------ the decoders


def target_of(num_layers, hidden=HIDDEN):
    torch.manual_seed(1)
    return TinyTargetModel(draft_config(hidden_size=hidden, num_layers=num_layers)).eval()


def test_decoder_refuses_a_block_head_of_another_target():
    head, caches = head_and_caches()  # built for a 3-layer target
    proposer = BlockProposer(head, spec_config(), caches)
    with pytest.raises(ValueError, match=r"^proposer: the block head was built for a 3-layer target "
                                         r"\(BlockConfig.num_target_layers\); this target has 4 layers"):  # fmt: skip
        SpeculativeDecoder(target_of(4), proposer)
    with pytest.raises(ValueError, match=r"^aux_layers: \(1, 2\) differs from the block head's, \(0, 1, 2\) "
                                         r"\(its target_layer_ids \(-1, 0, 1\)"):  # fmt: skip
        SpeculativeDecoder(target_of(3), proposer, aux_layers=(1, 2))
    with pytest.raises(ValueError, match=r"^aux_layers: the head reads 96 features \(len\(target_layer_ids\) x "
                                         r"target_hidden_size: the aux layers concatenated"):  # fmt: skip
        SpeculativeDecoder(target_of(3, hidden=48), proposer)
    assert SpeculativeDecoder(target_of(3), proposer).aux_layers == (0, 1, 2)
    assert SpeculativeDecoder(target_of(3), proposer, aux_layers=[0, 1, 2]).aux_layers == (0, 1, 2)
    assert untouched(caches)


def test_tree_decoder_refuses_a_block_proposer():
    head, caches = head_and_caches()
    tree = TreeShape(depth=3, topk=2, num_verify_tokens=6)
    with pytest.raises(ValueError, match=r"^proposer: draft trees need .*; got BlockProposer with method 'block'"):
        TreeSpeculativeDecoder(target_of(3), BlockProposer(head, spec_config(), caches), tree)


# ------------------------------------------------------------------ checked mode


def test_checked_propose_takes_a_table_that_reaches_just_the_window():
    """A request's window of 8 tokens and a block table of 2 blocks of 4: EAGLE's loop
    would need slots past them (K - 1 = 2 more), a block drafter none."""
    proposer, batch = propose_setup(blocks_per_request=2)
    assert proposer.draft_steps == 0
    rejected = torch.tensor([2, 0, 1], dtype=torch.int32)
    sample_at = batch.metadata.query_start_loc[1:] - 1 - rejected
    runs = []
    for checked in (True, False):
        for cache in proposer.kv_caches:
            cache.fill_(SENTINEL)
        with specdraft.checked(checked), torch.no_grad():
            out = proposer.propose(*batch.propose_args(), token_indices_to_sample=sample_at,
                                   num_rejected_tokens=rejected)  # fmt: skip
        runs.append((out, [cache.clone() for cache in proposer.kv_caches]))
    (got, got_caches), (want, want_caches) = runs
    assert torch.equal(got.draft_tokens, want.draft_tokens)
    for a, b in zip(got_caches, want_caches, strict=True):
        assert torch.equal(a, b)
    assert not untouched(proposer.kv_caches)  # the context was written


def test_checked_propose_refuses_bad_values_that_unchecked_runs():
    proposer, batch = propose_setup()
    args = list(batch.propose_args())
    args[3] = torch.tensor([1, VOCAB, 2], dtype=torch.int32)  # next_token_ids[1] outside the vocabulary
    with specdraft.checked(), torch.no_grad(), pytest.raises(ValueError, match=r"^next_token_ids\[1\] = 64"):
        proposer.propose(*args)
    assert untouched(proposer.kv_caches)
    with torch.no_grad():
        out = proposer.propose(*args)  # unchecked: out of contract, clamped, no error
    assert bool(((out.draft_tokens >= 0) & (out.draft_tokens < VOCAB)).all())
