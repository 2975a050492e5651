"""At temperature > 0 speculative decoding with a block drafter samples the target's
distribution: the first three generated tokens of many requests (distinct seeds, two
groups with their own prompt and temperature in one batch) against the exact joint
distribution the oracle enumerates (specs.generate.sequence_distribution), by a
chi-square test, as tests/generation/test_sampling.py does for the other proposers.

Block drafts are sampled per position (DFlash: every row at once; DSpark: in order
over the block, each row's Markov bias from the token drafted before it), with their
probabilities (draft_sampling="probabilistic", return_probs="probs"), or greedy
(one-hot). Fixed seeds make every run deterministic; the threshold 1e-3 is the
chance a correct sampler fails with other seeds. Two broken rejection samplers
(accept every draft; draft probabilities of the wrong step) fail it by far with a
block drafter too, so the test has power."""

import pytest
import torch

import specdraft.generation.verify as verify_module
from specdraft.generation import generate

from fixtures.sampled_groups import NUM_TOKENS, PER_GROUP, sampled_groups
from specs.generate import chi_square_pvalue

MAX_MODEL_LEN = 16
PROBABILISTIC = {"draft_sampling": "probabilistic", "return_probs": "probs"}


@pytest.fixture(scope="module")
def setup(build):
    return sampled_groups(build)


def run(build, setup, kind, k, head_block, **config):
    target, joints, prompts, sampling = setup
    proposer = build.make_proposer(kind, target, k, max_model_len=MAX_MODEL_LEN, max_reqs=len(prompts),
                                   head_block_size=head_block, **config)  # fmt: skip
    result = generate(target, prompts, proposer, max_new_tokens=NUM_TOKENS, sampling=sampling)
    samples = torch.stack(result.tokens)
    assert samples.shape == (len(joints) * PER_GROUP, NUM_TOKENS)
    groups = [samples[g * PER_GROUP : (g + 1) * PER_GROUP] for g in range(len(joints))]
    return result, [chi_square_pvalue(s, j) for s, j in zip(groups, joints, strict=True)]


@pytest.mark.parametrize(
    ("kind", "k", "head_block", "config"),
    [
        ("dflash", 2, 3, PROBABILISTIC),
        ("dflash-confidence", 3, 3, PROBABILISTIC),
        ("dspark-vanilla", 2, 2, PROBABILISTIC),
        ("dspark-gated-confidence", 2, 3, PROBABILISTIC),
        ("dspark-rnn", 3, 3, PROBABILISTIC),
        ("dflash", 3, 4, {}),
        ("dspark-rnn-confidence", 2, 3, {}),
    ],
    ids=[
        "dflash-k2-block3-probabilistic",
        "dflash-confidence-k3-probabilistic",
        "dspark-vanilla-k2-probabilistic",
        "dspark-gated-confidence-k2-block3-probabilistic",
        "dspark-rnn-k3-probabilistic",
        "dflash-k3-block4-greedy-drafts",
        "dspark-rnn-confidence-k2-block3-greedy-drafts",
    ],
)
def test_block_sampling_matches_target(build, setup, kind, k, head_block, config):
    result, p = run(build, setup, kind, k, head_block, **config)
    assert min(p) > 1e-3, p
    stats = result.stats
    assert stats.accepted_per_position[0] > 0.05 * stats.request_passes.sum()  # drafts do get accepted
    if k > 1:
        assert stats.accepted_per_position[1] > 0  # and blocks past their first draft


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


@pytest.mark.parametrize("kind", ["dflash", "dspark-gated-confidence"])
@pytest.mark.parametrize("bug", [accept_every_draft, probs_of_the_wrong_step])
def test_broken_rejection_sampling_fails(build, setup, monkeypatch, bug, kind):
    monkeypatch.setattr(verify_module, "rejection_sample", bug(verify_module.rejection_sample))
    _, p = run(build, setup, kind, 2, 3, **PROBABILISTIC)
    assert min(p) < 1e-6, p  # the test above would fail, by far
