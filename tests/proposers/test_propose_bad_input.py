"""Issue 16's rows that shapes, dtypes and configuration decide: a ValueError naming
the argument, in both modes (checked and unchecked), raised before anything runs
(the KV caches stay untouched). Rows are named after the issue's lists."""

import dataclasses

import pytest
import torch

import specdraft
from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.proposers import EagleProposer

from fixtures.bad_input import K, build, padded_inputs, with_metadata, written_slots
from fixtures.draft_heads import make_head


def plain(method="eagle", sampling="greedy", mrope=False):
    head, batch, proposer = build(method, sampling, mrope)
    return batch, proposer, list(batch.propose_args())


def call_propose(setup, change):
    batch, proposer, args = setup
    args = change(batch, args)
    return lambda: proposer.propose(*args)


def meta(**fields):
    return lambda batch, args: [*args[:4], with_metadata(batch, **fields).metadata, args[5]]


def arg(i, make):
    def change(batch, args):
        args = list(args)
        args[i] = make(batch, args[i])
        return args

    return change


# (issue row, setup, change of the propose arguments, message regex)
PROPOSE_ROWS = [
    # Deep torch errors
    ("EAGLE-3 hidden width H instead of 3H", "eagle3", arg(2, lambda b, h: h[:, :24]),
     r"^target_hidden_states must have 72 columns \(3 x target_hidden_size"),
    ("max_seq_len passed as a tensor", "eagle", meta(max_seq_len=torch.tensor(24)),
     r"^max_seq_len must be a Python int"),
    ("max_query_len passed as a tensor", "eagle", meta(max_query_len=torch.tensor(9)),
     r"^max_query_len must be a Python int"),
    # Errors that named the wrong argument
    ("seq_lens of length B - 1", "eagle", lambda b, a: meta(seq_lens=b.metadata.seq_lens[:3])(b, a),
     r"^seq_lens must have 4 rows \(query_start_loc, next_token_ids, block_table hold 4 requests\)"),
    # Silent rows that shapes and dtypes decide
    ("query_start_loc given as float", "eagle", lambda b, a: meta(query_start_loc=b.metadata.query_start_loc.float())(b, a),
     r"^query_start_loc must have dtype in \(int32, int64\), got torch.float32"),
    ("target hidden states in float64", "eagle", arg(2, lambda b, h: h.double()),
     r"^target_hidden_states must have dtype in \(float32, bfloat16, float16\), got torch.float64"),
    ("M-RoPE positions [3, T] to a head without M-RoPE", "eagle",
     arg(1, lambda b, p: torch.stack([p, p, p])), r"^target_positions: M-RoPE positions \[3, T\] given to a head without"),
    # Free checks that were missing
    ("sampling=None with a probabilistic config", "probabilistic", arg(5, lambda b, s: None),
     r"^sampling is None but config.draft_sampling is 'probabilistic'"),
    # Neighbours of the rows above, same rule
    ("max_seq_len past the block table's reach", "eagle", meta(max_seq_len=25),
     r"^max_seq_len = 25 is past the block table's reach \(width 6 x block_size 4 = 24\)"),
    ("next_token_ids of length B - 1", "eagle", arg(3, lambda b, n: n[:3]), r"^next_token_ids must have 4 rows"),
    ("block_table with B - 1 rows", "eagle", lambda b, a: meta(block_table=b.metadata.block_table[:3])(b, a),
     r"^block_table must have 4 rows"),
    ("query_start_loc of length B", "eagle", lambda b, a: meta(query_start_loc=b.metadata.query_start_loc[:4])(b, a),
     r"^query_start_loc must have 4 \+ 1 rows"),
    ("fewer tokens than requests", "eagle",
     lambda b, a: [a[0][:3], a[1][:3], a[2][:3], a[3], with_metadata(b, slot_mapping=b.metadata.slot_mapping[:3]).metadata, a[5]],
     r"^target_token_ids: 3 tokens for 4 requests"),
    ("sampling.temperature of length B - 1", "probabilistic",
     arg(5, lambda b, s: SamplingParams(s.temperature[:3], s.seeds)), r"^sampling.temperature must have shape \(4,\)"),
    ("EAGLE-1 hidden width", "eagle", arg(2, lambda b, h: h[:, :16]), r"^target_hidden_states must have 32 columns"),
]  # fmt: skip


def setup_for(kind):
    if kind == "probabilistic":
        return plain("eagle", "probabilistic")
    return plain(kind)


@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize(("row", "kind", "change", "match"), PROPOSE_ROWS, ids=[r[0] for r in PROPOSE_ROWS])
def test_propose_shape_and_dtype_rows(row, kind, change, match, checked):
    batch, proposer, args = setup_for(kind)
    with specdraft.checked(checked), pytest.raises(ValueError, match=match), torch.no_grad():
        call_propose((batch, proposer, args), change)()
    assert written_slots(proposer.kv_caches) == set()


# ------------------------------------------------------------------- propose_padded


def padded_call(proposer, batch, sampled, cu, backup, **kwargs):
    a = batch.propose_args()
    return lambda: proposer.propose_padded(a[0], a[1], a[2], sampled, cu, backup, batch.metadata, a[5], **kwargs)


PADDED_ROWS = [
    ("sampled_token_ids missing the bonus column", lambda s, c, b: (s[:, :K].contiguous(), c, b),
     r"^sampled_token_ids must have shape \(4, K \+ 1 = 4\): the K verified drafts and the bonus column"),
    ("backup_next_token_ids of length B - 1", lambda s, c, b: (s, c, b[:3]),
     r"^backup_next_token_ids must have 4 rows \(query_start_loc, seq_lens, sampled_token_ids, "),
    ("cu_num_draft_tokens as float", lambda s, c, b: (s, c.float(), b), r"^cu_num_draft_tokens must have dtype"),
    ("sampled_token_ids of B - 1 rows", lambda s, c, b: (s[:3], c, b), r"^sampled_token_ids must have 4 rows"),
]  # fmt: skip


@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize(("row", "change", "match"), PADDED_ROWS, ids=[r[0] for r in PADDED_ROWS])
def test_propose_padded_shape_rows(row, change, match, checked):
    _, batch, proposer = build()
    with specdraft.checked(checked), pytest.raises(ValueError, match=match), torch.no_grad():
        padded_call(proposer, batch, *change(*padded_inputs()))()
    assert written_slots(proposer.kv_caches) == set()


@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "checked"])
def test_discard_mask_of_length_b_minus_1_names_itself(checked):
    _, batch, proposer = build()
    mask = torch.zeros(3, dtype=torch.bool)
    with specdraft.checked(checked), pytest.raises(ValueError, match=r"^discard_request_mask must have 4 rows"):
        padded_call(proposer, batch, *padded_inputs(), discard_request_mask=mask)()


# ----------------------------------------------------------------- propose_unpadded


UNPADDED_ROWS = [
    ("num_kept_tokens as a tensor (reported as num_tokens before)", torch.tensor(18),
     r"^num_kept_tokens must be a Python int"),
    ("num_kept_tokens 0", 0, r"^num_kept_tokens = 0 is below the 4 requests: every request keeps at least one token"),
    ("num_kept_tokens negative", -1, r"^num_kept_tokens must be in >= 0"),
]  # fmt: skip


@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize(("row", "kept", "match"), UNPADDED_ROWS, ids=[r[0] for r in UNPADDED_ROWS])
def test_propose_unpadded_rows(row, kept, match, checked):
    _, batch, proposer = build()
    a = batch.propose_args()
    rejected = torch.tensor([2, 0, 3, 1], dtype=torch.int32)
    with specdraft.checked(checked), pytest.raises(ValueError, match=match), torch.no_grad():
        proposer.propose_unpadded(*a[:4], rejected, batch.metadata, num_kept_tokens=kept, sampling=a[5])
    assert written_slots(proposer.kv_caches) == set()


# ------------------------------------------------------------- at construction


def test_eagle3_head_with_method_eagle():
    head, _ = make_head("eagle3")
    config = SpeculativeConfig(method="eagle", num_speculative_tokens=K, block_size=4)
    with pytest.raises(ValueError, match=r"^config.method is 'eagle' but the head is Eagle3Head, which needs"):
        EagleProposer(head, config, head.allocate_kv_caches(8, 4))


@pytest.mark.parametrize(("head_kind", "method"), [("eagle", "mtp"), ("mtp", "eagle3")])
def test_other_heads_with_the_wrong_method(head_kind, method):
    head, _ = make_head(head_kind)
    config = SpeculativeConfig(method=method, num_speculative_tokens=K, block_size=4)
    with pytest.raises(ValueError, match=rf"^config.method is '{method}' but the head is"):
        EagleProposer(head, config, head.allocate_kv_caches(8, 4))


def test_kv_cache_block_size_against_the_config():
    """Reported as a max_seq_len error from attention before."""
    head, _ = make_head("eagle")
    config = SpeculativeConfig(method="eagle", num_speculative_tokens=K, block_size=16)
    with pytest.raises(ValueError, match=r"^kv_caches\[0\] must have shape \[2, num_blocks, block_size = 16"):
        EagleProposer(head, config, head.allocate_kv_caches(8, 8))


def test_bf16_head_with_fp32_kv_cache():
    head, _ = make_head("eagle")
    head = head.to(torch.bfloat16)
    config = SpeculativeConfig(method="eagle", num_speculative_tokens=K, block_size=4)
    caches = head.allocate_kv_caches(8, 4, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"^kv_caches\[0\] has dtype torch.float32 but the head's weights are "):
        EagleProposer(head, config, caches)


def test_kv_cache_heads_against_the_head():
    head, _ = make_head("eagle")
    config = SpeculativeConfig(method="eagle", num_speculative_tokens=K, block_size=4)
    caches = [torch.zeros(2, 8, 4, 4, 8)]  # 4 kv heads, the head has 2
    with pytest.raises(ValueError, match=r"^kv_caches\[0\] must hold 2 kv heads of 8 features"):
        EagleProposer(head, config, caches)


def test_parallel_drafting_token_outside_the_vocabulary():
    head, _ = make_head("eagle")
    config = SpeculativeConfig(
        method="eagle", num_speculative_tokens=K, block_size=4, parallel_drafting=True, parallel_drafting_token_id=64
    )
    with pytest.raises(ValueError, match=r"^parallel_drafting_token_id = 64 is outside the head's vocabulary"):
        EagleProposer(head, config, head.allocate_kv_caches(8, 4))


def test_metadata_of_another_type():
    batch, proposer, args = plain()
    not_metadata = dataclasses.asdict(batch.metadata)
    with pytest.raises(ValueError, match=r"^metadata must be a BatchMetadata, got dict"):
        proposer.propose(*args[:4], not_metadata, args[5])
