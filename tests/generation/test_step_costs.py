"""Choosing the budget from measured iteration costs (generation/step_costs.py):
expected tokens against a brute-force allocation, the choice against an exhaustive
search over the table, the table's checks and JSON form, the conditional rates the
decoder keeps between runs, and a decoder driven by a table."""

import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdraft.generation import SpeculativeDecoder
from specdraft.generation.step_costs import (
    PLAIN,
    Choice,
    StepCosts,
    choose_budget,
    conditional_rates,
    demo_pair_costs,
    expected_tokens,
)

from specs.generate import greedy_decode


def brute_force_tokens(budget, num_reqs, rates):
    """Every position of every request ranked by its chance of acceptance (the
    product of the rates up to it), the best `budget` kept: B + their sum."""
    gains = []
    for _ in range(num_reqs):
        gains += [math.prod(rates[: j + 1]) for j in range(len(rates))]
    return num_reqs + sum(sorted(gains, reverse=True)[:budget])


@given(
    num_reqs=st.integers(1, 6),
    rates=st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]), min_size=1, max_size=4),
    data=st.data(),
)
def test_expected_tokens_is_the_best_allocation(num_reqs, rates, data):
    budget = data.draw(st.integers(0, num_reqs * len(rates) + 3))
    assert expected_tokens(budget, num_reqs, rates) == pytest.approx(brute_force_tokens(budget, num_reqs, rates))


def table(rates=(0.8, 0.7, 0.6), **seconds):
    """seconds: b<B>={(k, budget): s}."""
    rows = {int(b[1:]): {Choice(*c): v for c, v in row.items()} for b, row in seconds.items()}
    return StepCosts(seconds=rows, rates=rates)


@given(
    seconds=st.lists(st.floats(0.5, 3.0), min_size=6, max_size=6),
    rates=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3),
)
def test_choice_is_the_best_measured_rate(seconds, rates):
    choices = (PLAIN, (1, 4), (3, 2), (3, 4), (3, 8), (3, 12))
    costs = table(rates=tuple(rates), b4=dict(zip(choices, seconds, strict=True)))
    chosen = choose_budget(4, costs)
    speed = {
        c: (4 if c == PLAIN else brute_force_tokens(c[1], 4, rates[: c[0]])) / s
        for c, s in zip(choices, seconds, strict=True)
    }
    assert speed[chosen] == pytest.approx(max(speed.values()))


def test_choice_follows_costs_and_rates():
    # Verifying is nearly free: the whole budget. Verifying is dear: plain decoding.
    cheap = table(b8={PLAIN: 1.0, (3, 8): 1.05, (3, 16): 1.08, (3, 24): 1.1})
    dear = table(b8={PLAIN: 1.0, (3, 8): 2.5, (3, 16): 3.0, (3, 24): 4.0})
    assert choose_budget(8, cheap) == (3, 24)
    assert choose_budget(8, dear) == PLAIN
    # Drafts that are never accepted do not pay even when verifying is cheap.
    assert choose_budget(8, cheap, rates=(0.0, 0.0, 0.0)) == PLAIN
    # Scaled to another batch size from the nearest measured one (8 for 5, 8 for 40).
    assert choose_budget(5, cheap) == (3, 15)
    assert choose_budget(40, cheap) == (3, 120)
    # Drafting one token is cheaper than drafting three and verifying one each.
    shallow = table(b8={PLAIN: 1.0, (1, 8): 1.2, (3, 8): 1.6, (3, 24): 2.2})
    assert choose_budget(8, shallow) == (1, 8)
    assert choose_budget(8, shallow, draft_depths=[3]) == (3, 24)


def test_table_checks_and_json():
    costs = table(b1={PLAIN: 1e-3, (3, 3): 1.5e-3}, b8={PLAIN: 2e-3, (1, 8): 3e-3})
    assert StepCosts.from_json(costs.to_json()) == costs
    for bad, match in [
        ({}, "no measured batch size"),
        ({0: {PLAIN: 1.0}}, "batch sizes are ints >= 1"),
        ({2: {Choice(3, 3): 1.0}}, r"needs plain decoding's time"),
        ({2: {PLAIN: 1.0, Choice(3, 7): 1.0}}, r"0 <= budget <= B \* k"),
        ({2: {PLAIN: 1.0, Choice(4, 1): 1.0}}, r"1 <= k <= 3"),
        ({2: {PLAIN: float("nan")}}, "a time > 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            StepCosts(seconds=bad, rates=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="rates: conditional"):
        StepCosts(seconds={1: {PLAIN: 1.0}}, rates=(0.5, 1.5, 0.5))
    with pytest.raises(ValueError, match="num_reqs"):
        choose_budget(0, costs)


def test_conditional_rates():
    assert conditional_rates(torch.tensor([8, 4, 1]), torch.tensor([10, 8, 4])) == (0.8, 0.5, 0.25)
    assert conditional_rates([1, 0], [2, 0]) is None


def test_shipped_demo_pair_table_loads():
    costs = demo_pair_costs()
    assert costs.max_k >= 1 and costs.device
    assert all(PLAIN in row for row in costs.seconds.values())


# ------------------------------------------------------------------ the decoder

PROMPTS = [[3, 1, 4, 1, 5], [9, 2], list(range(10, 28)), [6, 5, 3]]
MAX_NEW = [6, 11, 10, 8]
MAX_MODEL_LEN = 24
K = 3


@pytest.fixture(scope="module")
def pair(build):
    target = build.make_target(num_layers=1, seed=2, unit_embeddings=True)
    want = [greedy_decode(target, p, n, max_model_len=MAX_MODEL_LEN) for p, n in zip(PROMPTS, MAX_NEW, strict=True)]
    return target, want


def decoder_with(build, target, costs):
    proposer = build.make_proposer("eagle", target, K, max_model_len=MAX_MODEL_LEN, copy=True, noise=0.1,
                                   return_draft_confidence=True)  # fmt: skip
    return SpeculativeDecoder(target, proposer, budget=costs)


def test_decoder_takes_the_tables_choice(build, pair):
    target, want = pair
    plain = decoder_with(build, target, table(b4={PLAIN: 1.0, (3, 4): 3.0, (3, 12): 5.0}))
    got = plain.generate(PROMPTS, max_new_tokens=MAX_NEW)
    assert [t.tolist() for t in got.tokens] == want
    # Plain decoding itself: no proposer for the run (no draft prefill or pass).
    assert (plain.proposer, plain.k, plain.budget) == (None, 0, None)
    assert int(got.stats.verified_per_request.sum()) == 0

    full = decoder_with(build, target, table(b4={PLAIN: 1.0, (3, 4): 1.01, (3, 12): 1.02}))
    got = full.generate(PROMPTS, max_new_tokens=MAX_NEW)
    assert [t.tolist() for t in got.tokens] == want
    # A budget of every draft (B * K) runs as the fixed-K iteration, without the draft's confidence.
    assert (full.k, full.budget) == (3, None) and full.proposer.model is full.full_proposer.model
    assert not full.proposer.config.return_draft_confidence and full.full_proposer.config.return_draft_confidence
    assert torch.equal(got.stats.verified_per_request, K * got.stats.request_passes)
    # The run's own conditional rates replace the table's for the next run.
    accepted, tested = got.stats.accepted_per_position, got.stats.tested_per_position
    assert full.acceptance_rates == tuple((accepted.double() / tested.double()).tolist())


def test_tested_counts_are_conditional(build, pair):
    """Without a budget draft j is tested exactly when draft j - 1 was accepted (and
    draft 0 in every pass); under a budget at most then."""
    target, _ = pair
    proposer = build.make_proposer("eagle", target, K, max_model_len=MAX_MODEL_LEN, copy=True, noise=0.1,
                                   return_draft_confidence=True)  # fmt: skip
    stats = SpeculativeDecoder(target, proposer).generate(PROMPTS, max_new_tokens=MAX_NEW).stats
    accepted, tested = stats.accepted_per_position, stats.tested_per_position
    assert int(tested[0]) == int(stats.request_passes.sum())
    assert torch.equal(tested[1:], accepted[:-1])
    budgeted = SpeculativeDecoder(target, proposer, budget=3).generate(PROMPTS, max_new_tokens=MAX_NEW).stats
    b_accepted, b_tested = budgeted.accepted_per_position, budgeted.tested_per_position
    assert bool((b_tested[1:] <= b_accepted[:-1]).all()) and bool((b_accepted <= b_tested).all())
    assert int(b_tested.sum()) <= int(budgeted.verified_per_request.sum())
    assert int(b_tested[0]) < int(budgeted.request_passes.sum())  # some passes verified no draft


def test_table_deeper_than_the_proposer(build, pair):
    target, _ = pair
    with pytest.raises(ValueError, match="the table drafts up to k = 4"):
        decoder_with(build, target, StepCosts(seconds={4: {PLAIN: 1.0}}, rates=(0.5, 0.5, 0.5, 0.5)))


def test_every_choice_of_a_small_table_is_lossless(build, pair):
    """Every (k, budget) a 4-request table can choose, run one after another on one
    decoder (the draft depth changes between runs): the target's own output."""
    target, want = pair
    decoder = decoder_with(build, target, table(b4={PLAIN: 1.0}))
    decoder.budget_policy = None  # each run takes the choice set below, not the table's
    num_reqs = len(PROMPTS)
    for choice in itertools.chain([PLAIN], [Choice(k, b) for k in (1, 2, 3) for b in range(1, 4 * k + 1, 3)]):
        decoder.take_choice(choice, num_reqs)
        got = decoder.generate(PROMPTS, max_new_tokens=MAX_NEW)
        assert [t.tolist() for t in got.tokens] == want, choice
        every_draft = choice != PLAIN and choice.budget >= num_reqs * choice.k
        assert decoder.k == choice.k and decoder.budget == (None if every_draft else choice.budget or None)
        assert got.stats.accepted_per_position.shape == (choice.k,)
        assert int(got.stats.iteration_verified.sum(1).max()) <= choice.budget
        if every_draft:  # the fixed-k iteration: every request verifies k drafts a pass
            assert torch.equal(got.stats.verified_per_request, choice.k * got.stats.request_passes)


def test_a_calibrated_table_keeps_the_budgeted_iteration(build, pair):
    """With calibration on, a budget of every draft still runs the budgeted iteration
    (the only one that keeps the running rates)."""
    target, want = pair
    proposer = build.make_proposer("eagle", target, K, max_model_len=MAX_MODEL_LEN, copy=True, noise=0.1,
                                   return_draft_confidence=True)  # fmt: skip
    decoder = SpeculativeDecoder(target, proposer, budget=table(b4={PLAIN: 1.0, (3, 12): 0.5}), calibration=0.5)
    got = decoder.generate(PROMPTS, max_new_tokens=MAX_NEW)
    assert [t.tolist() for t in got.tokens] == want
    assert (decoder.k, decoder.budget) == (3, 12)


def test_choice_stays_unless_another_is_clearly_faster(build, pair):
    """A batch size keeps its choice while another is within SWITCH_MARGIN (each
    choice is a graph of its own), and changes when one is clearly faster."""
    from specdraft.generation.run_budget import SWITCH_MARGIN

    target, _ = pair
    costs = table(b4={PLAIN: 1.0, (1, 4): 1.5, (3, 12): 2.5})
    decoder = decoder_with(build, target, costs)
    decoder.acceptance_rates = (0.8, 0.7, 0.6)  # (1, 4): 7.2 / 1.5 = 4.8; (3, 12): 10.7 / 2.5 = 4.28
    assert decoder.choose_for_run(4) == (1, 4)
    # (3, 12) now a little faster: 4 + 4 (0.8 + 0.72 + 0.72 * 0.85) = 12.53 / 2.5 = 5.01 < 4.8 * (1 + margin)
    decoder.acceptance_rates = (0.8, 0.9, 0.85)
    assert 4.8 < 12.528 / 2.5 < 4.8 * (1 + SWITCH_MARGIN)
    assert decoder.choose_for_run(4) == (1, 4)
    decoder.acceptance_rates = (0.8, 1.0, 1.0)  # 16.8 / 2.5 = 6.72: clearly faster
    assert decoder.choose_for_run(4) == (3, 12)
    assert choose_budget(4, costs, rates=(0.8, 0.9, 0.85)) == (3, 12)  # without the margin it would have switched
