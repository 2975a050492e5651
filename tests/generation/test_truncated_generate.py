"""A request's top-k / top-p / min-p end to end (issue 40): speculative decoding
samples the *truncated* target distribution. The first three tokens of 2,000
requests (two groups, each with its own prompt, temperature and truncation) against
the exact joint of the truncated target (specs.generate.sequence_distribution with
specs.truncation's plain-Python rule), by a chi-square test, as
tests/generation/test_sampling.py does untruncated: plain decoding, EAGLE with
probabilistic drafts drawn inside the truncation, greedy drafts, a DFlash block, a
budget cutting through the drafts, a draft tree, EAGLE drafting outside the
truncation (SpeculativeConfig.draft_truncation=False). A verifier that truncates
only the drafts (the target untruncated) fails the same test by far."""

import pytest
import torch

import specdraft.generation.verify as verify_module
import specdraft.proposers.draft_sampling as draft_sampling_module
from specdraft.config import SamplingParams
from specdraft.generation import SpeculativeDecoder, TreeSpeculativeDecoder, generate_plain
from specdraft.tree_shape import TreeShape

import specs.truncation as truncation_spec
from specs.generate import chi_square_pvalue, sequence_distribution

VOCAB = 8
PER_GROUP = 1000
# (prompt, temperature, (top_k, top_p, min_p))
GROUPS = (([1, 2, 3, 4], 0.8, (3, 1.0, 0.0)), ([5, 6], 1.5, (0, 0.8, 0.1)))
NUM_TOKENS = 3
MAX_MODEL_LEN = 16
PROBABILISTIC = {"draft_sampling": "probabilistic", "return_probs": "probs"}


@pytest.fixture(scope="module")
def setup(build):
    target = build.make_target(num_layers=2, vocab=VOCAB, seed=3, logit_scale=3.0)
    margins = []
    joints = [sequence_distribution(target, p, t, NUM_TOKENS, truncation, margins) for p, t, truncation in GROUPS]
    # No top-p decision of the oracle sits within rounding of its boundary, so the
    # decoder's float32 logits truncate as the float64 oracle does.
    assert min(margins) > 1e-3, min(margins)
    prompts = [prompt for prompt, _, _ in GROUPS for _ in range(PER_GROUP)]

    def column(values, dtype):
        return torch.tensor([v for v in values for _ in range(PER_GROUP)], dtype=dtype)

    sampling = SamplingParams(
        temperature=column([t for _, t, _ in GROUPS], torch.float32),
        seeds=torch.arange(len(prompts), dtype=torch.int64) * 7919 + 13,
        top_k=column([c[0] for _, _, c in GROUPS], torch.int32),
        top_p=column([c[1] for _, _, c in GROUPS], torch.float32),
        min_p=column([c[2] for _, _, c in GROUPS], torch.float32),
    )
    untruncated = [sequence_distribution(target, p, t, NUM_TOKENS) for p, t, _ in GROUPS]
    return target, joints, untruncated, prompts, sampling


def pvalues(result, joints):
    samples = torch.stack(result.tokens)
    assert samples.shape == (len(joints) * PER_GROUP, NUM_TOKENS)
    return [chi_square_pvalue(samples[g * PER_GROUP : (g + 1) * PER_GROUP], j) for g, j in enumerate(joints)]


def speculative(build, setup, kind, k, budget=None, **config):
    target, joints, _, prompts, sampling = setup
    proposer = build.make_proposer(kind, target, k, max_model_len=MAX_MODEL_LEN, max_reqs=len(prompts), **config)
    result = SpeculativeDecoder(target, proposer, budget=budget).generate(
        prompts, max_new_tokens=NUM_TOKENS, sampling=sampling
    )
    return result, pvalues(result, joints)


def test_plain_sampling_is_truncated(build, setup):
    target, joints, untruncated, prompts, sampling = setup
    result = generate_plain(target, prompts, max_new_tokens=NUM_TOKENS, sampling=sampling,
                            max_model_len=MAX_MODEL_LEN, block_size=build.BLOCK_SIZE)  # fmt: skip
    assert min(pvalues(result, joints)) > 1e-3
    assert max(pvalues(result, untruncated)) < 1e-6  # the truncation changed the law: the test has power


@pytest.mark.parametrize(
    ("kind", "k", "budget", "config"),
    [
        ("eagle", 2, None, PROBABILISTIC),
        ("autoregressive", 3, None, {}),
        ("dflash", 2, None, PROBABILISTIC),
        ("eagle", 2, 2000, {**PROBABILISTIC, "return_draft_confidence": True}),
    ],
    ids=["eagle-probabilistic", "autoregressive-greedy-drafts", "dflash-probabilistic", "eagle-budget"],
)
def test_speculative_sampling_is_truncated(build, setup, kind, k, budget, config):
    result, p = speculative(build, setup, kind, k, budget, **config)
    assert min(p) > 1e-3, p
    assert result.stats.accepted_per_position[0] > 0.05 * result.stats.request_passes.sum()


def drafts_outside_the_truncation(build, setup, monkeypatch, **config) -> tuple[int, int]:
    """Run the EAGLE case with draft_sample recorded: (drafted tokens that lie outside
    their row's truncation by specs.truncation's plain-Python cut of the draft's own
    logits, drafts checked). A row's group is told by its temperature. Rows with a
    top-p decision within rounding of its boundary are not checked."""
    drafts = []

    def recording(logits, temperature, *args, **kwargs):
        tokens = real(logits, temperature, *args, **kwargs)
        drafts.append((logits.float().clone(), temperature.clone(), tokens.clone()))
        return tokens

    real = draft_sampling_module.draft_sample
    monkeypatch.setattr(draft_sampling_module, "draft_sample", recording)
    result, p = speculative(build, setup, "eagle", 2, None, **PROBABILISTIC, **config)
    monkeypatch.undo()
    truncation_of = {t: truncation for _, t, truncation in GROUPS}
    outside = checked = 0
    for logits, temperature, tokens in drafts:
        for row, t, token in zip(logits.tolist(), temperature.tolist(), tokens.tolist(), strict=True):
            t = min(truncation_of, key=lambda group: abs(group - t))  # fp32 0.8 is not 0.8
            cut, margin = truncation_spec.truncation_cut(row, t, *truncation_of[t])
            if margin > 1e-4:
                checked += 1
                outside += row[token] < cut
    assert checked > 0.9 * sum(tokens.numel() for *_, tokens in drafts)
    return result, p, outside, checked


def test_drafting_outside_the_truncation_stays_lossless(build, setup, monkeypatch):
    """SpeculativeConfig(draft_truncation=False), vLLM's way: the drafts are sampled
    from the untruncated draft distribution, so many lie outside the request's
    truncation (where the default never drafts, same seeds), and verify still
    truncates the target: the emitted tokens follow the truncated target's joint."""
    _, _, inside_outside, inside_checked = drafts_outside_the_truncation(build, setup, monkeypatch)
    assert inside_outside == 0 and inside_checked > 1000
    result, p, outside, checked = drafts_outside_the_truncation(build, setup, monkeypatch, draft_truncation=False)
    assert outside > 0.05 * checked, (outside, checked)
    assert min(p) > 1e-3, p
    assert result.stats.accepted_per_position[0] > 0.05 * result.stats.request_passes.sum()


def test_truncating_only_the_drafts_fails(build, setup, monkeypatch):
    monkeypatch.setattr(verify_module, "target_cut", lambda logits, sampling: None)
    _, p = speculative(build, setup, "eagle", 2, None, **PROBABILISTIC)
    assert min(p) < 1e-6, p


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("top_p", [0.0, 0.5], r"sampling.top_p\[0\] = 0.0 is outside \(0, 1\]"),
        ("top_p", [1.0, 1.5], r"sampling.top_p\[1\] = 1.5 is outside \(0, 1\]"),
        ("min_p", [-0.1, 0.0], r"sampling.min_p\[0\] = -0.1\d* is outside \[0, 1\]"),
        ("min_p", [0.0, float("nan")], r"sampling.min_p\[1\] = nan is outside \[0, 1\]"),
        ("top_k", [2.0, 3.0], "sampling.top_k must be an int tensor"),
        ("top_k", [1], r"sampling.top_k must be a \[2\] tensor"),
    ],
)
def test_bad_truncation(build, setup, field, value, match):
    target = setup[0]
    dtype = torch.int64 if field == "top_k" and isinstance(value[0], int) else torch.float32
    sampling = SamplingParams(
        torch.tensor([0.5, 1.0]), torch.tensor([1, 2]), **{field: torch.tensor(value, dtype=dtype)}
    )
    with pytest.raises(ValueError, match=match):
        generate_plain(target, [[1, 2], [3]], sampling=sampling, max_model_len=MAX_MODEL_LEN, max_new_tokens=2)


def test_tree_sampling_is_truncated(build, setup):
    """A draft tree (EAGLE, depth 2, top-2, 4 nodes) verified by ops.tree_verify with
    every node's target distribution truncated."""
    target, joints, _, prompts, sampling = setup
    proposer = build.make_proposer("eagle", target, 2, max_model_len=MAX_MODEL_LEN, max_reqs=len(prompts))
    decoder = TreeSpeculativeDecoder(target, proposer, TreeShape(2, 2, 4))
    result = decoder.generate(prompts, max_new_tokens=NUM_TOKENS, sampling=sampling)
    assert min(pvalues(result, joints)) > 1e-3
    assert result.stats.accepted_per_position[0] > 0.05 * result.stats.request_passes.sum()


def test_truncated_iteration_compiles_once_for_any_parameters(build):
    """fullgraph, no break; a second run with other top-k / top-p / min-p values
    compiles nothing (they are tensors), and both equal the eager runs."""
    from specdraft.testing import CompileCounts

    target = build.make_target(num_layers=1, seed=2, unit_embeddings=True)
    prompts, max_new = [[3, 1, 4, 1, 5], [9, 2], [6, 5, 3]], [9, 6, 7]

    def sampling(top_k, top_p, min_p):
        return SamplingParams(torch.tensor([0.8, 1.2, 0.0]), torch.tensor([1, 2, 3]), top_k=torch.tensor(top_k),
                              top_p=torch.tensor(top_p), min_p=torch.tensor(min_p))  # fmt: skip

    runs = [
        sampling([5, 0, 0], [1.0, 0.8, 1.0], [0.0, 0.1, 0.0]),
        sampling([2, 30, 1], [0.5, 1.0, 0.9], [0.2, 0.0, 0.0]),
    ]

    def decoder(compile):
        proposer = build.make_proposer("eagle", target, 2, max_model_len=24, copy=True, noise=0.1, **PROBABILISTIC)
        return SpeculativeDecoder(target, proposer, compile=compile)

    eager = decoder(False)
    want = [eager.generate(prompts, max_new_tokens=max_new, sampling=s) for s in runs]
    torch._dynamo.reset()
    compiled = decoder({"backend": "aot_eager"})
    for i, (s, w) in enumerate(zip(runs, want, strict=True)):
        with CompileCounts.measure() as counts:
            got = compiled.generate(prompts, max_new_tokens=max_new, sampling=s)
        assert [t.tolist() for t in got.tokens] == [t.tolist() for t in w.tokens]
        assert (counts.graph_breaks, counts.compiles) == (0, 1 if i == 0 else 0)
