"""The invalid-input strategies of specdraft.testing: every tagged rule of every op
and of propose() is refused in checked mode with a ValueError that starts with the
tagged argument's name; without checked mode the same input runs on the CPU path
(whose torch indexing raises on any out-of-bounds index) and leaves the guard rows
around every buffer it writes alone. The valid layouts the cases start from pass
checked mode (test_checked_mode.py and the op suites)."""

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specdraft
from specdraft.testing import BATCH_RULES, OP_RULES, invalid_draft_batches, invalid_op_cases

from fixtures.bad_input import BLOCKS_PER_REQ, MAX_MODEL_LEN, K, build
from fixtures.draft_heads import VOCAB

OP_CASES = [(op, rule) for op, rules in OP_RULES.items() for rule in rules]


@pytest.mark.parametrize(("op", "rule"), OP_CASES, ids=[f"{op}: {rule}" for op, rule in OP_CASES])
@settings(max_examples=3)
@given(data=st.data())
def test_op_rule_is_refused_in_checked_mode_and_safe_without(op, rule, data):
    case = data.draw(invalid_op_cases(op, rule))
    assert case.rule == rule
    with specdraft.checked(), pytest.raises(ValueError, match="^" + re.escape(case.argument)):
        case.run("cpu")
    _, _, intact = case.run("cpu", guard=2)
    assert intact


def test_every_op_has_invalid_cases():
    import specdraft.ops as ops

    wrappers = {name for name in ops.__all__ if callable(getattr(ops, name)) and name[0].islower()}
    # noise_uniform, tree_select, tree_ancestors, tree_expand, tree_positions,
    # top_logprobs: no argument a value can break (each defines what it does with any
    # value, NaN and infinities included, and writes only its own output); vocab_metrics:
    # the training metrics' op (its bad input is that module's own suite's).
    assert wrappers - set(OP_RULES) <= {"noise_uniform", "tree_select", "tree_ancestors", "tree_expand",
                                        "tree_positions", "top_logprobs", "vocab_metrics"}  # fmt: skip


VOCAB_CASES = dict(vocab_size=VOCAB, target_hidden_size=32, block_size=4, blocks_per_request=BLOCKS_PER_REQ,
                   num_blocks=4 * BLOCKS_PER_REQ, num_speculative_tokens=K, max_model_len=MAX_MODEL_LEN)  # fmt: skip


@pytest.fixture(scope="module")
def eagle():
    _, _, proposer = build()
    return proposer


@pytest.mark.parametrize("rule", BATCH_RULES)
@settings(max_examples=2)
@given(data=st.data())
def test_batch_rule_is_refused_in_checked_mode_and_safe_without(eagle, rule, data):
    case = data.draw(invalid_draft_batches(**VOCAB_CASES, rule=rule))
    with specdraft.checked(), torch.no_grad(), pytest.raises(ValueError, match="^" + re.escape(case.argument)):
        eagle.propose(*case.batch.propose_args(), **case.kwargs())
    with torch.no_grad():
        tokens = eagle.propose(*case.batch.propose_args(), **case.kwargs()).draft_tokens
    assert bool(((tokens >= 0) & (tokens < VOCAB)).all())
