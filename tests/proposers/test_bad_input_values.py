"""Issue 16's rows that only the values decide. Each row twice:

- checked mode (specdraft.checked()): a ValueError naming the argument, what was
  expected and what was found, before anything runs (the KV caches stay untouched);
- unchecked mode: the documented result (docs/usage.md, "Bad input"), against oracles
  that share no code with the proposer: the slow per-request proposer
  (specs.proposer.oracle_propose) on the inputs the rule implies, and the set of
  KV slots a propose may write, computed with plain loops (fixtures.bad_input).
"""

import dataclasses

import pytest
import torch

import specdraft
from specdraft.config import SamplingParams

from fixtures.bad_input import (
    SENTINEL,
    K,
    allowed_slots,
    build,
    last_rows,
    padded_inputs,
    request_slots,
    with_metadata,
    written_slots,
)
from fixtures.draft_heads import VOCAB
from specs.proposer import oracle_propose


def propose(proposer, batch):
    with torch.no_grad():
        return proposer.propose(*batch.propose_args())


def assert_untouched(proposer):
    assert all(bool((cache == SENTINEL).all()) for cache in proposer.kv_caches)


def narrow_table(batch):
    return with_metadata(batch, block_table=batch.metadata.block_table[:, :2].contiguous(), max_seq_len=None)


# (issue row, bad batch, checked-mode message)
SILENT_METADATA_ROWS = [
    ("max_seq_len smaller than the truth", lambda b: with_metadata(b, max_seq_len=4),
     r"^max_seq_len = 4 is below seq_lens\[2\] = 9"),
    ("max_query_len smaller than the truth", lambda b: with_metadata(b, max_query_len=2),
     r"^max_query_len = 2 is below request 2's window of 9 tokens"),
    ("block_table too narrow for the positions", narrow_table,
     r"^block_table has 2 columns \(reach 8 = width x block_size 4\) but request 2 needs 11 positions \(3 blocks\)"),
    ("block ids >= the cache's num_blocks", lambda b: with_metadata(b, block_table=b.metadata.block_table + 1000),
     r"^block_table\[0, 0\] = 10\d\d is outside \[0, num_blocks = 24\) of the KV cache"),
    ("slot_mapping past the cache", lambda b: with_metadata(b, slot_mapping=b.metadata.slot_mapping + 10_000),
     r"^slot_mapping\[0\] = 10\d\d\d is outside \[0, 96\) \(or -1\)"),
    ("seq_lens shorter than the window", lambda b: with_metadata(b, seq_lens=torch.ones_like(b.metadata.seq_lens)),
     r"^seq_lens\[0\] = 1 is shorter than request 0's window of 5 tokens"),
    ("NaN hidden states", lambda b: dataclasses.replace(b, target_hidden_states=b.target_hidden_states * float("nan")),
     r"^target_hidden_states\[0, 0\] = nan is not finite"),
]  # fmt: skip


@pytest.mark.parametrize(("row", "make_bad", "match"), SILENT_METADATA_ROWS, ids=[r[0] for r in SILENT_METADATA_ROWS])
def test_silent_rows_checked(row, make_bad, match):
    _, batch, proposer = build()
    with specdraft.checked(), pytest.raises(ValueError, match=match):
        propose(proposer, make_bad(batch))
    assert_untouched(proposer)


@pytest.mark.parametrize(("row", "make_bad", "match"), SILENT_METADATA_ROWS, ids=[r[0] for r in SILENT_METADATA_ROWS])
def test_silent_rows_unchecked_write_only_what_the_rules_allow(row, make_bad, match):
    """Static bounds, seq_lens and hidden values never move a KV write; a slot or a
    block outside the cache writes nothing; a position past the table's reach uses
    its last column. Whatever the values, the drafts are ids of the vocabulary."""
    _, batch, proposer = build()
    bad = make_bad(batch)
    out = propose(proposer, bad)
    tokens = out.draft_tokens
    assert tokens.dtype == torch.int32 and bool(((tokens >= 0) & (tokens < VOCAB)).all())
    assert written_slots(proposer.kv_caches) == allowed_slots(bad, sample_rows=last_rows(bad))


@pytest.mark.parametrize("bad_value", [-1.0, float("nan")], ids=["negative", "nan"])
def test_temperature_not_finite_or_negative(bad_value):
    head, batch, proposer = build(sampling="probabilistic")
    temperature = batch.sampling.temperature.clone()
    temperature[1] = bad_value
    bad = dataclasses.replace(batch, sampling=SamplingParams(temperature, batch.sampling.seeds))
    with (
        specdraft.checked(),
        pytest.raises(ValueError, match=r"^sampling.temperature\[1\] = .* must be finite and >= 0"),
    ):
        propose(proposer, bad)
    assert_untouched(proposer)
    # Unchecked: that request drafts greedily (as temperature 0), the others as before.
    got = propose(proposer, bad).draft_tokens.tolist()
    greedy_row = torch.tensor([0.0 if b == 1 else t for b, t in enumerate(temperature.tolist())])
    as_greedy = dataclasses.replace(batch, sampling=SamplingParams(greedy_row, batch.sampling.seeds))
    with torch.no_grad():
        assert got == oracle_propose(head, as_greedy, K, greedy=False)


# --------------------------------------------------------------- token ids


def clamp_list(values, low, high):
    return [min(max(v, low), high) for v in values]


TOKEN_ROWS = [
    ("target token ids >= vocab", "target_token_ids", lambda ids: ids + VOCAB, r"^target_token_ids\[0\] = \d+ is outside \[0, 64\)"),
    ("negative target token ids", "target_token_ids", lambda ids: ids - VOCAB, r"^target_token_ids\[0\] = -\d+ is outside \[0, 64\)"),
    ("next token ids >= vocab", "next_token_ids", lambda ids: ids + VOCAB, r"^next_token_ids\[0\] = \d+ is outside \[0, 64\)"),
]  # fmt: skip


@pytest.mark.parametrize(("row", "field", "make_bad", "match"), TOKEN_ROWS, ids=[r[0] for r in TOKEN_ROWS])
def test_token_ids_outside_the_vocabulary(row, field, make_bad, match):
    """Was an IndexError from the embedding. Unchecked: clamped into [0, V)."""
    head, batch, proposer = build()
    bad = dataclasses.replace(batch, **{field: make_bad(getattr(batch, field))})
    with specdraft.checked(), pytest.raises(ValueError, match=match):
        propose(proposer, bad)
    assert_untouched(proposer)
    got = propose(proposer, bad).draft_tokens.tolist()
    clamped = torch.tensor(clamp_list(getattr(bad, field).tolist(), 0, VOCAB - 1), dtype=torch.int32)
    with torch.no_grad():
        assert got == oracle_propose(head, dataclasses.replace(batch, **{field: clamped}), K)


# ----------------------------------------------------------------- propose_padded


def padded_rule(batch, sampled, cu, backup):
    """Plain loops: a sampled id outside [0, V) counts as rejected; rejected =
    drafts + 1 - valid, clamped into [0, min(drafts, window - 1)]; the next token
    is the last valid id, else the backup."""
    qsl = batch.metadata.query_start_loc.tolist()
    next_ids, rejected, previous = [], [], 0
    for b, row in enumerate(sampled):
        drafts, previous = cu[b] - previous, cu[b]
        valid = [t for t in row if 0 <= t < VOCAB]
        window = qsl[b + 1] - qsl[b]
        rejected.append(max(0, min(drafts + 1 - len(valid), drafts, window - 1)))
        next_ids.append(valid[-1] if valid else backup[b])
    return next_ids, rejected


PADDED_VALUE_ROWS = [
    ("exclusive cumulative count", lambda s, c: (s, torch.tensor([0, 3, 3, 6], dtype=torch.int32)),
     r"^cu_num_draft_tokens: request 1 has 3 drafts in a window of 1 tokens \(cu_num_draft_tokens must be the "
     r"inclusive cumulative sum"),
    ("draft counts past the windows", lambda s, c: (s, torch.tensor([100, 300, 600, 800], dtype=torch.int32)),
     r"^cu_num_draft_tokens: request 0 has 100 drafts in a window of 5 tokens"),
    ("draft counts that disagree with the sampled rows", lambda s, c: (s, torch.tensor([0, 0, 3, 5], dtype=torch.int32)),
     r"^cu_num_draft_tokens gives request 0 0 drafts, but sampled_token_ids\[0\] holds 2 tokens"),
    ("sampled ids >= vocab", lambda s, c: (torch.where(s >= 0, s + 1000, s), c),
     r"^sampled_token_ids\[0, 0\] = 1011 is outside \[0, vocab_size = 64\) \(or -1 for a rejected slot\)"),
    ("sampled id after a -1", lambda s, c: (torch.tensor([[11, -1, 12, -1], *s[1:].tolist()], dtype=s.dtype), c),
     r"^sampled_token_ids\[0, 2\] = 12 follows a -1"),
]  # fmt: skip


@pytest.mark.parametrize(("row", "change", "match"), PADDED_VALUE_ROWS, ids=[r[0] for r in PADDED_VALUE_ROWS])
def test_propose_padded_value_rows(row, change, match):
    head, batch, proposer = build()
    sampled, cu, backup = padded_inputs()
    sampled, cu = change(sampled, cu)
    a = batch.propose_args()

    def call():
        with torch.no_grad():
            return proposer.propose_padded(a[0], a[1], a[2], sampled, cu, backup, batch.metadata, a[5])

    with specdraft.checked(), pytest.raises(ValueError, match=match):
        call()
    assert_untouched(proposer)
    got = call().draft_tokens.tolist()
    next_ids, rejected = padded_rule(batch, sampled.tolist(), cu.tolist(), backup.tolist())
    with_next = dataclasses.replace(batch, next_token_ids=torch.tensor(next_ids, dtype=torch.int32))
    with torch.no_grad():
        assert got == oracle_propose(head, with_next, K, rejected=rejected)
    assert written_slots(proposer.kv_caches) == allowed_slots(batch, sample_rows=last_rows(batch, rejected))


def test_backup_ids_outside_the_vocabulary():
    _, batch, proposer = build()
    sampled, cu, backup = padded_inputs()
    sampled[1] = -1  # request 1 emitted nothing: it takes its backup token
    a = batch.propose_args()
    with specdraft.checked(), pytest.raises(ValueError, match=r"^backup_next_token_ids\[0\] = 65 is outside \[0, 64\)"):
        proposer.propose_padded(a[0], a[1], a[2], sampled, cu, backup + VOCAB, batch.metadata, a[5])


# --------------------------------------------------------------- propose_unpadded


UNPADDED_VALUE_ROWS = [
    ("num_kept_tokens too small", [2, 0, 3, 1], 5,
     r"^num_kept_tokens = 5 is less than the kept total 12 \(query_start_loc\[-1\] = 18 minus 6 rejected\)"),
    ("num_rejected_tokens >= the window", [5, 1, 9, 3], 18,
     r"^num_rejected_tokens\[0\] = 5 is outside \[0, window - 1 = 4\]: every request keeps at least one token"),
]  # fmt: skip


@pytest.mark.parametrize(("row", "rejected", "kept", "match"), UNPADDED_VALUE_ROWS,
                         ids=[r[0] for r in UNPADDED_VALUE_ROWS])  # fmt: skip
def test_propose_unpadded_value_rows(row, rejected, kept, match):
    """Were index_copy_ / setStorage errors. Unchecked: the gathers clamp into the
    batch, so the call returns vocabulary ids and writes only slots of this batch
    (its slot mapping's and its requests' blocks)."""
    _, batch, proposer = build()
    a = batch.propose_args()
    rej = torch.tensor(rejected, dtype=torch.int32)

    def call():
        with torch.no_grad():
            return proposer.propose_unpadded(*a[:4], rej, batch.metadata, num_kept_tokens=kept, sampling=a[5])

    with specdraft.checked(), pytest.raises(ValueError, match=match):
        call()
    assert_untouched(proposer)
    tokens = call().draft_tokens
    assert bool(((tokens >= 0) & (tokens < VOCAB)).all())
    ours = request_slots(batch) | set(batch.metadata.slot_mapping.tolist())
    assert written_slots(proposer.kv_caches) <= ours
