"""Budgeted verification (generation/budget.py) is lossless and, unlimited, is the
fixed-K iteration:

- greedy: for every chain and block proposer and budgets that cut through the drafts
  (0, 1, 5 drafts per iteration for 4 requests of K = 3), the output equals the
  target's own greedy decoding (the plain-loop oracle, specs.generate), and no
  iteration verifies more drafts than the budget;
- a budget of B * K or more equals today's fixed-K decoder token for token, accept
  count for accept count, greedy and sampled;
- sampled: the first three tokens of 2,000 requests follow the exact joint
  distribution (chi-square, as tests/generation/test_sampling.py) with a budget of
  about half the drafts, and a broken rejection sampler fails the same test;
- the budgeted iteration compiles whole (fullgraph, no break, no recompile);
- calibration (the decoder's `calibration`): its running rates follow a plain loop,
  an over-confident position loses its drafts to others, and greedy and sampled
  output stay lossless with it."""

import math

import pytest
import torch

import specdraft.generation.verify as verify_module
from specdraft.config import SamplingParams
from specdraft.generation import SpeculativeDecoder
from specdraft.generation.budget import calibrated, kept_drafts, updated_calibration

from fixtures.budget import check_budget_held
from fixtures.compiled_generate import assert_compiled_runs_equal
from fixtures.sampled_groups import NUM_TOKENS, PER_GROUP, sampled_groups
from specs.generate import chi_square_pvalue, greedy_decode

PROMPTS = [[3, 1, 4, 1, 5], [9, 2], list(range(10, 28)), [6, 5, 3]]
MAX_NEW = [6, 11, 10, 8]
MAX_MODEL_LEN = 24
K = 3
CHAIN_KINDS = ("eagle", "mtp", "multi_layer", "autoregressive")
BLOCK_KINDS = ("dflash", "dspark-rnn-confidence", "dspark-gated")
SURVIVAL = {"return_draft_confidence": True}
PROBABILISTIC = {"draft_sampling": "probabilistic", "return_probs": "probs", **SURVIVAL}


@pytest.fixture(scope="module")
def chain_target(build):
    target = build.make_target(num_layers=1, seed=2, unit_embeddings=True)
    want = [greedy_decode(target, p, n, max_model_len=MAX_MODEL_LEN) for p, n in zip(PROMPTS, MAX_NEW, strict=True)]
    return target, want


@pytest.fixture(scope="module")
def block_target(build):
    target = build.make_target(num_layers=2, seed=6, context_weight=0.05)
    want = [greedy_decode(target, p, n, max_model_len=MAX_MODEL_LEN) for p, n in zip(PROMPTS, MAX_NEW, strict=True)]
    return target, want


def proposer_for(build, kind, target, **config):
    return build.make_proposer(kind, target, K, max_model_len=MAX_MODEL_LEN, copy=True, noise=0.1, **config)


@pytest.mark.parametrize("budget", [0, 1, 5])
@pytest.mark.parametrize("kind", CHAIN_KINDS + BLOCK_KINDS)
def test_greedy_equals_oracle(build, chain_target, block_target, kind, budget):
    target, want = block_target if kind in BLOCK_KINDS else chain_target
    decoder = SpeculativeDecoder(target, proposer_for(build, kind, target, **SURVIVAL), budget=budget)
    got = decoder.generate(PROMPTS, max_new_tokens=MAX_NEW)
    assert [t.tolist() for t in got.tokens] == want
    check_budget_held(got.stats, budget)
    if budget == 0:
        assert int(got.stats.verified_per_request.sum()) == 0  # plain decoding
    else:
        assert int(got.stats.accepted_per_request.sum()) > 0  # drafts do get verified and accepted


SAMPLING = SamplingParams(torch.tensor([0.0, 0.8, 1.2, 0.5]), torch.tensor([1, 2, 3, 4]))


@pytest.mark.parametrize("sampling", [None, SAMPLING], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", ["eagle", "dspark-rnn-confidence"])
def test_unlimited_budget_is_fixed_k(build, chain_target, block_target, kind, sampling):
    """A budget of B * K keeps every draft of every running request: the same tokens
    and the same accept counts as the decoder without a budget, sampled rows
    included (the rejection sampler reads the packed rows' logits)."""
    target, _ = block_target if kind in BLOCK_KINDS else chain_target
    run = {"max_new_tokens": MAX_NEW, "sampling": sampling}
    want = SpeculativeDecoder(target, proposer_for(build, kind, target, **PROBABILISTIC)).generate(PROMPTS, **run)
    budgeted = SpeculativeDecoder(target, proposer_for(build, kind, target, **PROBABILISTIC), budget=len(PROMPTS) * K)
    got = budgeted.generate(PROMPTS, **run)
    assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
    assert torch.equal(got.stats.accepted_per_position, want.stats.accepted_per_position)
    assert torch.equal(got.stats.request_passes, want.stats.request_passes)
    assert torch.equal(got.stats.verified_per_request, want.stats.verified_per_request)
    assert torch.equal(got.stats.verified_per_request, K * want.stats.request_passes)


def test_budget_keeps_the_likeliest_drafts(build, chain_target):
    """With 1 draft per iteration for 4 requests, the draft verified is each time one
    the draft model is sure of: the accept rate beats verifying everything."""
    target, _ = chain_target
    full = SpeculativeDecoder(target, proposer_for(build, "eagle", target, **SURVIVAL)).generate(
        PROMPTS, max_new_tokens=MAX_NEW
    )
    tight = SpeculativeDecoder(target, proposer_for(build, "eagle", target, **SURVIVAL), budget=2).generate(
        PROMPTS, max_new_tokens=MAX_NEW
    )
    rate = lambda s: s.accepted_per_request.sum() / s.verified_per_request.sum()  # noqa: E731
    assert float(rate(tight.stats)) > float(rate(full.stats))


# ------------------------------------------------------------------ sampled


@pytest.fixture(scope="module")
def sampled_setup(build):
    return sampled_groups(build)


def sampled_pvalues(build, setup, kind, budget, calibration=None):
    target, joints, prompts, sampling = setup
    proposer = build.make_proposer(kind, target, 2, max_model_len=16, max_reqs=len(prompts), **PROBABILISTIC)
    result = SpeculativeDecoder(target, proposer, budget=budget, calibration=calibration).generate(
        prompts, max_new_tokens=NUM_TOKENS, sampling=sampling
    )
    samples = torch.stack(result.tokens)
    groups = [samples[g * PER_GROUP : (g + 1) * PER_GROUP] for g in range(len(joints))]
    return result, [chi_square_pvalue(s, j) for s, j in zip(groups, joints, strict=True)]


@pytest.mark.parametrize("fraction", [0.25, 0.5], ids=["quarter", "half"])
@pytest.mark.parametrize("kind", ["eagle", "dspark-vanilla-confidence"])
def test_sampled_equals_target_distribution(build, sampled_setup, kind, fraction):
    budget = int(fraction * 2 * len(sampled_setup[2]))  # of K = 2 drafts per request
    result, p = sampled_pvalues(build, sampled_setup, kind, budget)
    assert min(p) > 1e-3, p
    stats = result.stats
    check_budget_held(stats, budget)
    assert 0 < int(stats.verified_per_request.sum()) < 2 * int(stats.request_passes.sum())  # the budget cut
    assert int(stats.accepted_per_request.sum()) > 0.05 * int(stats.request_passes.sum())


def test_ranking_by_the_drawn_tokens_probability_fails(build, sampled_setup, monkeypatch):
    """The survival estimate must not read the token drawn at its position: ranking
    by the draft's probability of its own sampled token (instead of its row's
    confidence) biases what is accepted, and the test above catches it."""
    import specdraft.generation.decoder as decoder_module

    def drawn_token_probability(out):
        return out.draft_probs.gather(2, out.draft_tokens.long()[..., None])[..., 0]

    monkeypatch.setattr(decoder_module, "survival_from", drawn_token_probability)
    _, p = sampled_pvalues(build, sampled_setup, "eagle", len(sampled_setup[2]) // 2)
    assert min(p) < 1e-6, p


def test_broken_rejection_sampling_fails(build, sampled_setup, monkeypatch):
    real = verify_module.rejection_sample

    def accept_every_draft(drafts, num_drafts, draft_probs, logits, *args, **kwargs):
        forced = logits.clone()
        forced[:, : drafts.shape[1]].scatter_(2, drafts.long().clamp(min=0)[..., None], 1e4)
        return real(drafts, num_drafts, draft_probs, forced, *args, **kwargs)

    monkeypatch.setattr(verify_module, "rejection_sample", accept_every_draft)
    _, p = sampled_pvalues(build, sampled_setup, "eagle", len(sampled_setup[2]))
    assert min(p) < 1e-6, p


# ------------------------------------------------------------------ compile, bad input


@pytest.mark.parametrize("calibration", [None, 0.5], ids=["estimates", "calibrated"])
def test_budgeted_iteration_compiles(build, chain_target, calibration):
    """fullgraph, no break, one compile for the run and none for a second run, equal
    to the eager run; greedy and sampled rows in one batch."""
    target, _ = chain_target
    run = {"max_new_tokens": MAX_NEW, "sampling": SAMPLING}
    budgeted = {"budget": 5, "calibration": calibration}
    want = SpeculativeDecoder(target, proposer_for(build, "eagle", target, **PROBABILISTIC), **budgeted).generate(
        PROMPTS, **run
    )
    torch._dynamo.reset()
    compiled = SpeculativeDecoder(
        target, proposer_for(build, "eagle", target, **PROBABILISTIC), **budgeted, compile={"backend": "aot_eager"}
    )
    assert_compiled_runs_equal(want, compiled, PROMPTS, run)


@pytest.mark.parametrize(
    ("budget", "config", "match"),
    [
        (-1, SURVIVAL, "budget: an int >= 0"),
        (True, SURVIVAL, "budget: an int >= 0"),
        (2.0, SURVIVAL, "budget: an int >= 0"),
        (4, {}, "return_draft_confidence=True"),
    ],
)
def test_bad_budget(build, chain_target, budget, config, match):
    target, _ = chain_target
    with pytest.raises(ValueError, match=match):
        SpeculativeDecoder(target, proposer_for(build, "eagle", target, **config), budget=budget)


def test_budget_needs_drafts(build, chain_target):
    """(Draft trees take a budget too: tests/generation/test_tree_budget.py.)"""
    target, _ = chain_target
    with pytest.raises(ValueError, match="budget: plain decoding"):
        SpeculativeDecoder(target, None, max_model_len=MAX_MODEL_LEN, budget=4)


# ------------------------------------------------------------------ calibration


def test_calibration_follows_a_plain_loop():
    """updated_calibration's EMA and calibrated's scaling against plain Python over
    random passes: draft j of request r tested when r runs, verified j and accepted
    every draft before it; accepted when it accepted more than j; estimates read NaN
    as 0 and clamped to [0, 1]."""
    gen = torch.Generator().manual_seed(0)
    num_reqs, k, weight = 6, 4, 0.3
    rates = torch.zeros(2, k)
    accepted_ema, estimate_ema = [0.0] * k, [0.0] * k
    for _ in range(8):
        survival = torch.rand(num_reqs, k, generator=gen) * 1.2
        survival[0, 1], survival[1, 2] = math.nan, -0.5
        num_drafts = torch.randint(0, k + 1, (num_reqs,), generator=gen)
        counts = torch.minimum(torch.randint(0, k + 1, (num_reqs,), generator=gen), num_drafts)
        done = torch.rand(num_reqs, generator=gen) < 0.2
        rates = updated_calibration(rates, survival, counts, num_drafts, done, weight)
        for j in range(k):
            accepted = estimates = 0.0
            for r in range(num_reqs):
                if done[r] or j >= num_drafts[r] or counts[r] < j:
                    continue
                value = survival[r, j].item()
                estimates += 0.0 if math.isnan(value) else min(max(value, 0.0), 1.0)
                accepted += float(counts[r] > j)
            accepted_ema[j] = accepted_ema[j] * (1 - weight) + accepted * weight
            estimate_ema[j] = estimate_ema[j] * (1 - weight) + estimates * weight
        assert torch.allclose(rates, torch.tensor([accepted_ema, estimate_ema]), atol=1e-5)
    factors = torch.tensor([(a + 1.0) / (e + 1.0) for a, e in zip(accepted_ema, estimate_ema, strict=True)])
    assert torch.allclose(calibrated(survival, rates), survival * factors, atol=1e-6, equal_nan=True)
    assert calibrated(survival, None) is survival


def test_calibration_moves_drafts_off_an_overconfident_position():
    """Request 0 is sure of both its drafts (0.9, 0.9), request 1 less so (0.5, 0.5);
    a budget of 2 keeps request 0's two drafts. After passes in which draft 1 was
    never accepted (every request accepted draft 0 only), draft 1's calibrated gain
    (0.9 x 0.9 x its factor) falls below request 1's first (0.5 x draft 0's factor >= 1)
    and the budget goes one draft to each."""
    survival = torch.tensor([[0.9, 0.9], [0.5, 0.5]])
    done = torch.tensor([False, False])
    budget = torch.tensor(2)
    assert kept_drafts(survival, done, budget).tolist() == [2, 0]
    rates = torch.zeros(2, 2)
    for _ in range(5):
        rates = updated_calibration(rates, survival, torch.tensor([1, 1]), torch.tensor([2, 2]), done, 0.5)
    assert kept_drafts(calibrated(survival, rates), done, budget).tolist() == [1, 1]


@pytest.mark.parametrize("budget", [1, 5])
@pytest.mark.parametrize("kind", ["eagle", "dspark-rnn-confidence"])
def test_calibrated_greedy_equals_oracle(build, chain_target, block_target, kind, budget):
    target, want = block_target if kind in BLOCK_KINDS else chain_target
    proposer = proposer_for(build, kind, target, **SURVIVAL)
    got = SpeculativeDecoder(target, proposer, budget=budget, calibration=0.5).generate(PROMPTS, max_new_tokens=MAX_NEW)
    assert [t.tolist() for t in got.tokens] == want
    check_budget_held(got.stats, budget)


def test_decoder_keeps_the_running_rates(build, chain_target):
    """The decoder's calibration after a run: its accepted row is the EMA of each
    pass's accepted drafts per position, recomputed from the per-iteration statistics
    (a request verified draft j and accepted it when it accepted more than j); its
    estimates row is positive wherever a draft was tested; none without calibration."""
    target, _ = chain_target
    weight = 0.25
    proposer = proposer_for(build, "eagle", target, **SURVIVAL)
    stats = (
        SpeculativeDecoder(target, proposer, budget=5, calibration=weight)
        .generate(PROMPTS, max_new_tokens=MAX_NEW)
        .stats
    )
    want = torch.zeros(K)
    tested = torch.zeros(K, dtype=torch.bool)
    for verified, accepted in zip(stats.iteration_verified, stats.iteration_accepted, strict=True):
        now = torch.tensor([float(sum(int(a) > j for a in accepted)) for j in range(K)])
        want = want * (1 - weight) + now * weight
        tested |= torch.tensor([bool(((verified > j) & (accepted >= j)).any()) for j in range(K)])
    assert torch.allclose(stats.calibration[0], want, atol=1e-5)
    assert bool((stats.calibration[1][tested] > 0).all()) and bool(tested.any())
    assert (
        SpeculativeDecoder(target, proposer, budget=5).generate(PROMPTS, max_new_tokens=MAX_NEW).stats.calibration
        is None
    )


def test_calibrated_sampled_equals_target_distribution(build, sampled_setup):
    budget = len(sampled_setup[2])  # half of K = 2 drafts per request
    result, p = sampled_pvalues(build, sampled_setup, "eagle", budget, calibration=0.5)
    assert min(p) > 1e-3, p
    check_budget_held(result.stats, budget)


@pytest.mark.parametrize(
    ("calibration", "budget", "match"),
    [
        (0.0, 4, r"calibration: the newest pass's weight in \(0, 1\]"),
        (1.5, 4, r"calibration: the newest pass's weight in \(0, 1\]"),
        (True, 4, r"calibration: the newest pass's weight in \(0, 1\]"),
        ("0.5", 4, r"calibration: the newest pass's weight in \(0, 1\]"),
        (0.5, None, "calibration: calibrates a budget's survival estimates"),
    ],
)
def test_bad_calibration(build, chain_target, calibration, budget, match):
    target, _ = chain_target
    with pytest.raises(ValueError, match=match):
        SpeculativeDecoder(target, proposer_for(build, "eagle", target, **SURVIVAL), budget=budget,
                           calibration=calibration)  # fmt: skip
