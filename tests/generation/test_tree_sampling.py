"""At temperature > 0 tree decoding samples the target's distribution: the first
three generated tokens of many requests (distinct seeds; two groups with their own
prompt and temperature in one batch) against the exact joint distribution the
oracle enumerates (specs.generate.sequence_distribution), by a chi-square test, for
trees of topk 2 and 4 whose drafts are often accepted (a head copied from the target,
with noise). A tree of topk 1 is the chain decoder token for token (its greedy drafts
through rejection sampling with one-hot draft probabilities). A verifier that accepts
every draft fails the same test by far, so it has power."""

import pytest
import torch

import specdraft.generation.tree_decoder as tree_decoder_module
from specdraft.config import SamplingParams
from specdraft.generation import SpeculativeDecoder, TreeSpeculativeDecoder
from specdraft.proposers import TreeShape

from fixtures.sampled_groups import NUM_TOKENS, PER_GROUP, sampled_groups
from specs.generate import chi_square_pvalue

MAX_MODEL_LEN = 16


@pytest.fixture(scope="module")
def setup(build):
    return sampled_groups(build, num_layers=1, unit_embeddings=True)


def decoder(build, target, shape: TreeShape, num_reqs: int):
    # Caches for N - 1 positions past a request (the proposer's K is not read by trees).
    proposer = build.make_proposer("eagle", target, shape.num_verify_tokens - 1, max_model_len=MAX_MODEL_LEN,
                                   copy=True, noise=0.5, max_reqs=num_reqs)  # fmt: skip
    return TreeSpeculativeDecoder(target, proposer, shape)


def pvalues(result, joints):
    samples = torch.stack(result.tokens)
    assert samples.shape == (len(joints) * PER_GROUP, NUM_TOKENS)
    return [chi_square_pvalue(samples[g * PER_GROUP : (g + 1) * PER_GROUP], j) for g, j in enumerate(joints)]


@pytest.mark.parametrize("shape", [(2, 2, 4), (2, 4, 8)], ids=str)
def test_tree_sampling_matches_target(build, setup, shape):
    target, joints, prompts, sampling = setup
    result = decoder(build, target, TreeShape(*shape), len(prompts)).generate(
        prompts, max_new_tokens=NUM_TOKENS, sampling=sampling
    )
    p = pvalues(result, joints)
    assert min(p) > 1e-3, p
    stats = result.stats
    assert stats.accepted_per_position[0] > 0.05 * stats.request_passes.sum()  # drafts do get accepted
    assert stats.accepted_sibling_rank[1:].sum() > 0  # and not only first children


def test_accepting_every_draft_is_caught(build, setup, monkeypatch):
    target, joints, prompts, sampling = setup
    real = tree_decoder_module.tree_verify

    def accept_all(tokens, parents, logits, *args, **kwargs):
        forced = logits.clone()
        forced.scatter_(2, tokens.long().gather(1, torch.arange(tokens.shape[1])[None].expand_as(tokens))[..., None]
                        .roll(-1, 1), 1e4)  # fmt: skip
        return real(tokens, parents, forced, *args, **kwargs)

    monkeypatch.setattr(tree_decoder_module, "tree_verify", accept_all)
    result = decoder(build, target, TreeShape(2, 2, 4), len(prompts)).generate(
        prompts, max_new_tokens=NUM_TOKENS, sampling=sampling
    )
    assert min(pvalues(result, joints)) < 1e-6


def test_topk_one_sampled_is_the_chain(build, setup):
    """(2, 1, 3) against the chain decoder with K = 2 greedy drafts: both verify
    with rejection_sample's noise at the same positions, so the same tokens."""
    target, _, prompts, sampling = setup
    prompts = prompts[::50]
    sampling = SamplingParams(sampling.temperature[::50].contiguous(), sampling.seeds[::50].contiguous())
    tree = decoder(build, target, TreeShape(2, 1, 3), len(prompts))
    chain_proposer = build.make_proposer("eagle", target, 2, max_model_len=MAX_MODEL_LEN, copy=True, noise=0.5,
                                         max_reqs=len(prompts))  # fmt: skip
    chain = SpeculativeDecoder(target, chain_proposer)
    got = tree.generate(prompts, max_new_tokens=6, sampling=sampling)
    want = chain.generate(prompts, max_new_tokens=6, sampling=sampling)
    assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
    assert got.stats.accepted_per_position.tolist() == want.stats.accepted_per_position.tolist()
