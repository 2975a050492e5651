"""At temperature > 0 speculative decoding samples the target's distribution: the
first three generated tokens of many requests (distinct seeds, two groups with their
own prompt and temperature in one batch) against the exact joint distribution the
oracle enumerates (specs.generate.sequence_distribution), by a chi-square test.

Fixed seeds make every run deterministic; the threshold 1e-3 is the chance a correct
sampler fails with other seeds. Two broken rejection samplers (accept every draft;
draft probabilities of the wrong step) fail it by far, so the test has power.
(Dropping the draft probabilities altogether is *not* a bug: Leviathan's rule with
one-hot q is unbiased for any draft, it only accepts less; generate relies on that
for greedy drafts at temperature > 0.)"""

import pytest
import torch

import specdraft.generation.verify as verify_module
from specdraft.generation import generate, generate_plain

from fixtures.sampled_groups import NUM_TOKENS, PER_GROUP, sampled_groups
from specs.generate import chi_square_pvalue

MAX_MODEL_LEN = 16


@pytest.fixture(scope="module")
def setup(build):
    return sampled_groups(build)


def pvalues(result, joints):
    samples = torch.stack(result.tokens)
    assert samples.shape == (len(joints) * PER_GROUP, NUM_TOKENS)
    return [chi_square_pvalue(samples[g * PER_GROUP : (g + 1) * PER_GROUP], j) for g, j in enumerate(joints)]


def run(build, setup, kind, k, **config):
    target, joints, prompts, sampling = setup
    proposer = build.make_proposer(kind, target, k, max_model_len=MAX_MODEL_LEN, max_reqs=len(prompts), **config)
    result = generate(target, prompts, proposer, max_new_tokens=NUM_TOKENS, sampling=sampling)
    return result, pvalues(result, joints)


PROBABILISTIC = {"draft_sampling": "probabilistic", "return_probs": "probs"}


def test_plain_sampling_matches_target(build, setup):
    target, joints, prompts, sampling = setup
    result = generate_plain(
        target, prompts, max_new_tokens=NUM_TOKENS, sampling=sampling, max_model_len=MAX_MODEL_LEN,
        block_size=build.BLOCK_SIZE,
    )  # fmt: skip
    assert min(pvalues(result, joints)) > 1e-3


@pytest.mark.parametrize(
    ("kind", "k", "config"),
    [("eagle", 2, PROBABILISTIC), ("eagle3", 2, PROBABILISTIC), ("autoregressive", 3, {})],
    ids=["eagle-probabilistic", "eagle3-probabilistic", "autoregressive-greedy-drafts"],
)
def test_speculative_sampling_matches_target(build, setup, kind, k, config):
    result, p = run(build, setup, kind, k, **config)
    assert min(p) > 1e-3, p
    assert result.stats.accepted_per_position[0] > 0.05 * result.stats.request_passes.sum()  # drafts do get accepted


def accept_every_draft(real):
    def broken(drafts, num_drafts, draft_probs, logits, *args, **kwargs):
        forced = logits.clone()
        k = drafts.shape[1]
        forced[:, :k].scatter_(2, drafts.long().clamp(min=0)[..., None], 1e4)
        return real(drafts, num_drafts, draft_probs, forced, *args, **kwargs)

    return broken


def probs_of_the_wrong_step(real):
    def broken(drafts, num_drafts, draft_probs, *args, **kwargs):
        shifted = None if draft_probs is None else draft_probs.roll(1, dims=1).contiguous()
        return real(drafts, num_drafts, shifted, *args, **kwargs)

    return broken


@pytest.mark.parametrize("bug", [accept_every_draft, probs_of_the_wrong_step])
def test_broken_rejection_sampling_fails(build, setup, monkeypatch, bug):
    monkeypatch.setattr(verify_module, "rejection_sample", bug(verify_module.rejection_sample))
    _, p = run(build, setup, "eagle", 2, **PROBABILISTIC)
    assert min(p) < 1e-6, p  # the test above would fail, by far
