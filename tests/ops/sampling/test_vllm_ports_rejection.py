"""vLLM's rejection-sampler tests (tests/v1/sample/), ported to rejection_sample and
tree_verify with truncation_cut's cuts (issue 40, proof 4). The filter and draft
sampling: test_vllm_ports_truncation.py and test_vllm_ports_sampling.py.

API differences the ports adapt to: vLLM's sampler takes ragged drafts and mocks the
bonus token; rejection_sample takes drafts [B, K] padded with -1 (K >= 1, so vLLM's
empty draft list is one -1) and computes the bonus token from target row n, so
every port builds K + 1 target rows per request and checks the bonus too. Our output
is vLLM's: the accepted drafts, the emitted token, then -1. Our noise is seeded per
request (noise.py), so every request is deterministic, not only vLLM's seeded ones.
top-k / top-p / min-p reach the sampler as a cut per target row [B, K + 1].

The oracles: the expected tokens of vLLM's tests (greedy), vLLM's own top-p set
(sorted cumulative sum, in float64), vLLM's min-p mask (probability < min_p * the
largest), specs/sampling.py's plain-Python rejection sampler (same hash) and
chi-square laws. Sizes are cut from vLLM's (batch 100, vocab up to 152k) to seconds;
the interpreter lane runs smaller batches. Unmarked tests (statistical) run in the
CPU and GPU lanes only: the interpreted kernels equal the references in
test_rejection.py and test_truncated_sampling.py.

vLLM tests, by file (vllm-project/vllm, at the commit read):

tests/v1/sample/test_rejection_sampler.py @ 004fce2d0b6ad5146fa0f32b5e777dc8f5112d80
- test_perfect_match / test_early_mismatch / test_multiple_sequences /
  test_single_token_sequence / test_multiple_mismatches / test_parametrized_cases:
  ported under the same names.
- test_empty_sequence: ported under the same name (one -1 draft, n = 0: [[5, -1]]
  where vLLM gives [[5]]).
- test_deterministic_when_seeded: ported under the same name; every request is
  seeded here, and other seeds must change some output.
- test_rejection_sampling_approximates_target_distribution: ported under the same
  name (vLLM's distance-improvement assertion, and chi-square laws of the first two
  emitted tokens).
- test_top_k / test_top_p: ported under the same names (the bonus token checked too).
- test_frequency_penalties / test_bad_words / test_allowed_token_ids: not
  applicable: logits processors that run before our ops (they take the processed
  logits).
- test_sample_recovered_tokens: ported under the same name, against
  specs/sampling.py (our op has no separate recovered-token function: the recovered
  token is the emitted one after a rejection; the test asserts rejections happen).
- test_sample_recovered_tokens_uses_fp64_exponential_race_when_requested: not
  applicable: an fp64 option of vLLM's RNG; our race's noise is noise.py's.
- test_sample_recovered_tokens_vocab_boundary: ported under the same name, at our
  tiles' boundaries (tiles.py), with a third mode: draft probabilities at or above
  the target everywhere, so the residual is all zero and the race falls back to p.
- test_fly_greedy_rescues_mismatch_after_native_acceptance_window /
  test_fly_requires_full_lookahead_and_passes_entropy_gate /
  test_fly_does_not_override_target_constraint /
  test_fly_target_only_sampling_uses_mapped_target_ids /
  test_fly_probabilistic_draft_sampling_uses_probability_ratio /
  test_fly_mixed_greedy_and_random_batch: not applicable: FLy verification (lossy
  acceptance windows), not a method of ours.
- test_synthetic_all_accepted / test_synthetic_all_rejected: not applicable: vLLM's
  synthetic acceptance rates for benchmarking.
- test_placeholder_draft_token_rejected_random: ported under the same name (a -1 and
  an id >= V among the first n drafts are rejected without being read).

tests/v1/sample/test_triton_cpu_kernels.py @ 4baf9468468111420ed62f36acbf8c8edcff4404
- TestRejectionGreedySampleKernel.test_all_accepted / test_rejection: ported as
  test_greedy_kernel_all_accepted / test_greedy_kernel_rejection.
- TestRejectionRandomSampleKernel.test_accepted: ported as test_random_kernel_accepted.
- TestSampleRecoveredTokensKernel.test_basic: ported as test_recovered_tokens_basic
  (vLLM fixes the race's noise to 1; ours cannot be fixed, so the residual is made
  to have one positive entry, where every noise picks it).
- TestExpandKernel.test_basic / test_no_replace, TestEaglePrepareInputsPaddedKernel.
  test_basic: not applicable: vLLM's ragged-layout helpers, not sampling.

tests/v1/sample/test_tree_rejection_sampler.py @ 41d9d55b71a6e19c89412f17a2de8d72ff4468ef
- test_single_node / test_chain_full_acceptance / test_chain_partial_acceptance /
  test_tree_full_acceptance / test_tree_partial_acceptance / test_tree_early_rejection
  / test_tree_full_acceptance_multiple_sequences /
  test_tree_partial_acceptance_multiple_sequences / test_deep_tree_full_acceptance:
  ported under the same names, to tree_verify (greedy). (An older version, @
  3da3a66932eccd2254569ad6a6c312884bf4acec, held copies of test_topk_topp_sampler.py's
  tests: test_topk_impl_equivalence, ported in test_vllm_ports_truncation.py, and a
  FlashInfer one, not applicable.)

tests/v1/sample/test_min_p_spec_decode.py @ 5ac71baaa92d8fbdb3430ef713440871e84f2372
- test_apply_with_spec_decode_noop_when_disabled /
  test_apply_with_spec_decode_masks_per_request_rows /
  test_apply_with_spec_decode_mixed_zero_min_p: ported under the same names: each
  request's min_p over its K + 1 target rows (the cuts rejection_sample takes); the
  second also verifies drafts that min-p removes (vLLM's bug was min-p reaching the
  bonus row only): never accepted, the emitted token within the min-p set.

tests/v1/sample/test_rejection_sampler_block_verify.py @ 974eaf34cccb4c1598a5ef2b289fe58b82421594
- test_block_verify_pytorch_accepts_and_appends_bonus /
  test_sample_recovered_blockwise_pytorch_selects_argmax /
  test_triton_parity_with_pytorch / test_speculative_config_has_verify_method_default_standard:
  not applicable: block verification is another acceptance rule (and a vLLM config
  field); rejection_sample implements the per-token rule.
"""

import math

import pytest
import torch

from specdraft.ops import rejection_sample, tree_verify
from specdraft.ops.sampling.tiles import BLOCK_V, CHUNK_V

import specs.sampling as spec
from fixtures.lanes import INTERPRETER
from fixtures.vllm_ports import cut_of, generator

INF = math.inf
VOCAB = 100  # vLLM's


def run(drafts, target_logits, temperature=0.0, draft_probs=None, num_draft=None, cut=None, seeds=None, device="cpu"):
    """rejection_sample of drafts [B, K] (-1 padded) against target_logits [B, K + 1, V];
    num_draft defaults to each row's drafts before its first -1. Returns CPU
    (tokens, counts)."""
    drafts = torch.as_tensor(drafts)
    batch = drafts.shape[0]
    if num_draft is None:
        num_draft = (drafts >= 0).long().cumprod(1).sum(1)
    temperature = torch.as_tensor(temperature, dtype=torch.float32).expand(batch).contiguous()
    seeds = torch.arange(batch) if seeds is None else seeds
    tokens, counts = rejection_sample(
        drafts.to(device), torch.as_tensor(num_draft).to(device),
        None if draft_probs is None else draft_probs.to(device), target_logits.to(device), temperature.to(device),
        seeds.to(device), torch.zeros(batch, dtype=torch.int64, device=device),
        logit_cut=None if cut is None else cut.to(device),
    )  # fmt: skip
    return tokens.cpu(), counts.cpu()


def row_cuts(target_logits, device, **params):
    """truncation_cut of every target row [B, K + 1, V], as [B, K + 1]."""
    batch, rows, vocab = target_logits.shape
    per_request = {k: v.repeat_interleave(rows) if isinstance(v, torch.Tensor) else v for k, v in params.items()}
    return cut_of(target_logits.reshape(batch * rows, vocab), device, **per_request).view(batch, rows)


# --------------------------------------------------------- greedy (test_rejection_sampler.py)


def greedy_logits(output_tokens, vocab=VOCAB):
    """vLLM's create_logits_tensor, one request per row of output_tokens: target row
    j's argmax is output_tokens[b][j] (100 there, -100 elsewhere), the last one the
    bonus row. Rows past a request's tokens: filler (-100)."""
    rows = max(len(tokens) for tokens in output_tokens)
    logits = torch.full((len(output_tokens), rows, vocab), -100.0)
    for b, tokens in enumerate(output_tokens):
        for j, token in enumerate(tokens):
            logits[b, j, token] = 100.0
    return logits


def padded(spec_tokens):
    width = max(1, *(len(s) for s in spec_tokens))
    return [s + [-1] * (width - len(s)) for s in spec_tokens]


def assert_greedy(spec_tokens, output_tokens, expected, device):
    """Greedy verify: the drafts against argmax rows built from output_tokens."""
    drafts = padded(spec_tokens)
    logits = greedy_logits(output_tokens)
    logits = torch.cat([logits, torch.full((len(drafts), len(drafts[0]) + 1 - logits.shape[1], VOCAB), -100.0)], 1)
    tokens, counts = run(drafts, logits, device=device)
    assert tokens.tolist() == expected
    assert counts.tolist() == [leading_matches(row, spec_row) for row, spec_row in zip(expected, drafts, strict=True)]


def leading_matches(tokens, drafts):
    count = 0
    while count < len(drafts) and drafts[count] >= 0 and tokens[count] == drafts[count]:
        count += 1
    return count


@pytest.mark.kernel
def test_perfect_match(device):
    assert_greedy([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]], device)  # 4: the bonus


@pytest.mark.kernel
def test_early_mismatch(device):
    assert_greedy([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, -1, -1]], device)


@pytest.mark.kernel
def test_multiple_sequences(device):
    assert_greedy([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, -1]], device)


@pytest.mark.kernel
def test_single_token_sequence(device):
    assert_greedy([[1]], [[1, 2]], [[1, 2]], device)


@pytest.mark.kernel
def test_empty_sequence(device):
    """No drafts (K = 1, the draft -1, n = 0): the bonus token alone."""
    assert_greedy([[]], [[5]], [[5, -1]], device)


@pytest.mark.kernel
def test_multiple_mismatches(device):
    assert_greedy([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], [[1, 2, 7, -1], [4, 8, -1, -1]], device)


@pytest.mark.kernel
@pytest.mark.parametrize(
    "spec_tokens,output_tokens,expected",
    [
        ([[1, 2]], [[1, 2, 3]], [[1, 2, 3]]),  # perfect match with bonus
        ([[1]], [[2, 3]], [[2, -1]]),  # first mismatch
        ([[1, 2], [3, 4]], [[1, 5, 6], [3, 4, 7]], [[1, 5, -1], [3, 4, 7]]),  # mixed
    ],
)
def test_parametrized_cases(device, spec_tokens, output_tokens, expected):
    assert_greedy(spec_tokens, output_tokens, expected, device)


@pytest.mark.kernel
def test_greedy_kernel_all_accepted(device):
    """test_triton_cpu_kernels.py: two requests of two drafts, both accepted, their
    bonus tokens 99 and 50."""
    assert_greedy([[10, 20], [30, 40]], [[10, 20, 99], [30, 40, 50]], [[10, 20, 99], [30, 40, 50]], device)


@pytest.mark.kernel
def test_greedy_kernel_rejection(device):
    assert_greedy([[10, 20]], [[10, 99, 50]], [[10, 99, -1]], device)


# --------------------------------------------------------- random (test_rejection_sampler.py)


@pytest.mark.kernel
@pytest.mark.parametrize("k", [3] if INTERPRETER else [1, 3, 5])
@pytest.mark.parametrize("batch_size", [2] if INTERPRETER else [1, 4, 8])
def test_deterministic_when_seeded(device, k, batch_size):
    """The same seeds, the same tokens on every repetition (vLLM: 20 repetitions, for
    its seeded requests); other seeds change some request's tokens."""
    vocab = 40 if INTERPRETER else 1000
    gen = generator(k * 10 + batch_size)
    target = torch.rand(batch_size, k + 1, vocab, generator=gen)
    drafts = torch.randint(0, vocab, (batch_size, k), generator=gen)
    results = [run(drafts, target, 1.0, device=device) for _ in range(2 if INTERPRETER else 5)]
    for tokens, counts in results[1:]:
        assert torch.equal(tokens, results[0][0]) and torch.equal(counts, results[0][1])
    others = [run(drafts, target, 1.0, seeds=torch.arange(batch_size) + 1000 * s, device=device)[0] for s in (1, 2)]
    assert any(not torch.equal(o, results[0][0]) for o in others)


def estimate_rejection_sampling_pdf(draft_probs, target_logits, k, num_samples, device, gen):
    """The emitted tokens of num_samples requests (each its own seed) drafting k
    tokens from draft_probs against target_logits at every position: all of them
    (vLLM's histogram: slots 0..k-1, placeholders left out), and the first two slots."""
    vocab = draft_probs.shape[0]
    drafts = torch.multinomial(draft_probs.expand(num_samples, vocab), k, replacement=True, generator=gen)
    probs = draft_probs.expand(num_samples, k, vocab).contiguous()
    target = target_logits.expand(num_samples, k + 1, vocab).contiguous()
    tokens, _ = run(drafts, target, 1.0, draft_probs=probs, device=device)
    emitted = tokens[:, :-1].flatten()
    hist = torch.bincount(emitted[emitted >= 0], minlength=vocab).double()
    return hist / hist.sum(), tokens


def test_rejection_sampling_approximates_target_distribution(device):
    """vLLM's check: as the number of samples grows from 10 to 100,000, the observed
    distribution's distance to the target shrinks at least 20 times more than its
    distance to 100 random distributions. Here also: the first emitted token (every
    request) and the second (where the first draft was accepted) follow the target,
    chi-square at p = 1e-6."""
    vocab, k = 10, 2
    gen = generator(0)
    draft_probs = torch.softmax(torch.rand(vocab, generator=gen), -1)
    target_logits = torch.rand(vocab, generator=gen)
    target_probs = torch.softmax(target_logits.double(), -1)
    reference_probs = torch.softmax(torch.rand(100, vocab, generator=gen, dtype=torch.float64), -1)
    to_target, to_reference = [], []
    for num_samples in (10, 100, 1_000, 10_000, 100_000):
        observed, tokens = estimate_rejection_sampling_pdf(draft_probs, target_logits, k, num_samples, device, gen)
        to_reference.append(torch.dist(reference_probs, observed).item() / 100)
        to_target.append(torch.dist(target_probs, observed).item())
    assert to_target[0] / to_target[-1] > 20 * to_reference[0] / to_reference[-1]
    first, second = tokens[:, 0], tokens[:, 1][tokens[:, 1] >= 0]
    for drawn in (first, second):
        counts = torch.bincount(drawn, minlength=vocab).tolist()
        assert spec.chi_square(counts, target_probs.tolist()) < spec.chi2_threshold(vocab - 1), counts


def masked_logits_case(target_logits, batch_size, num_draft_tokens, gen):
    """vLLM's _test_masked_logits inputs: draft probabilities softmax(rand), drafts
    drawn from them."""
    vocab = target_logits.shape[-1]
    draft_probs = torch.softmax(torch.rand(batch_size, num_draft_tokens, vocab, generator=gen), -1)
    drafts = torch.multinomial(draft_probs.view(-1, vocab), 1, generator=gen).view(batch_size, num_draft_tokens)
    return drafts, draft_probs


def assert_within(tokens, allowed):
    """Every emitted token (accepted draft, recovered or bonus) of slot j lies in
    allowed[b][j] (the set of target row j)."""
    for b, row in enumerate(tokens.tolist()):
        for j, token in enumerate(row):
            if token >= 0:
                assert token in allowed[b][j], (b, j, token)


RANDOM_BATCH = 1 if INTERPRETER else 100  # vLLM: 100
RANDOM_VOCAB = 40 if INTERPRETER else VOCAB


@pytest.mark.kernel
@pytest.mark.parametrize("top_k", [5] if INTERPRETER else [1, 5, RANDOM_VOCAB - 1])
def test_top_k(device, top_k):
    """Target logits 0.1 on top_k random tokens per row, 0 elsewhere: however close,
    the others are never emitted."""
    batch, spec_len, vocab = RANDOM_BATCH, 3, RANDOM_VOCAB
    gen = generator(top_k)
    top_k_indices = torch.stack([torch.randperm(vocab, generator=gen)[:top_k] for _ in range(batch * (spec_len + 1))])
    target = torch.zeros(batch * (spec_len + 1), vocab).scatter_(1, top_k_indices, 0.1).view(batch, spec_len + 1, vocab)
    drafts, draft_probs = masked_logits_case(target, batch, spec_len, gen)
    cut = row_cuts(target, device, top_k=top_k)
    tokens, _ = run(drafts, target, 1.0, draft_probs=draft_probs, cut=cut, device=device)
    allowed = [[set(top_k_indices[b * (spec_len + 1) + j].tolist()) for j in range(spec_len + 1)] for b in range(batch)]
    assert_within(tokens, allowed)


@pytest.mark.kernel
@pytest.mark.parametrize("top_p", [0.9] if INTERPRETER else [0.5, 0.9, 0.99])
def test_top_p(device, top_p):
    """vLLM's top-p set of each row (ascending sort, cumulative mass <= 1 - p
    dropped, the largest always kept), float64 here; randn has no ties, where ours
    keeps a whole tie group. Rows whose set is within 1e-6 of a boundary: any
    emitted token of theirs is only checked against the looser set."""
    batch, spec_len, vocab = RANDOM_BATCH, 3, RANDOM_VOCAB
    gen = generator(int(top_p * 100))
    target = torch.randn(batch, spec_len + 1, vocab, generator=gen)
    drafts, draft_probs = masked_logits_case(target, batch, spec_len, gen)
    cut = row_cuts(target, device, top_p=top_p)
    tokens, _ = run(drafts, target, 1.0, draft_probs=draft_probs, cut=cut, device=device)
    logits_sort, logits_idx = target.double().sort(-1, descending=False)
    probs_sum = logits_sort.softmax(-1).cumsum(-1)
    bar = 1 - float(torch.tensor(top_p))
    dropped = probs_sum <= bar - 1e-6  # only tokens no rounding could keep
    dropped[..., -1] = False
    allowed = [[set(logits_idx[b, j][~dropped[b, j]].tolist()) for j in range(spec_len + 1)] for b in range(batch)]
    assert_within(tokens, allowed)
    near = ((probs_sum - bar).abs() < 1e-6).any(-1)
    assert near.float().mean() < 0.05  # the looser sets are rare


@pytest.mark.kernel
@pytest.mark.parametrize("batch_size", [2] if INTERPRETER else [1, 8])  # vLLM: 1, 100
@pytest.mark.parametrize("vocab_size", [VOCAB] if INTERPRETER else [VOCAB, 1000])  # vLLM: 100, 8192, 10000
@pytest.mark.parametrize("max_spec_len", [3] if INTERPRETER else [1, 3])
@pytest.mark.parametrize("no_draft_probs", [True, False])
def test_sample_recovered_tokens(device, batch_size, vocab_size, max_spec_len, no_draft_probs):
    """Tokens and counts equal specs/sampling.py's rejection sampler (plain Python,
    the same hash): the recovered token after a rejection is its residual race's."""
    gen = generator(batch_size * vocab_size + max_spec_len)
    draft_probs = torch.softmax(torch.rand(batch_size, max_spec_len, vocab_size, generator=gen), -1)
    # vLLM's rand target, peaked (x 8) so that most drafts are rejected.
    target = torch.rand(batch_size, max_spec_len + 1, vocab_size, generator=gen) * 8
    drafts = torch.multinomial(draft_probs.view(-1, vocab_size), 1, generator=gen).view(batch_size, max_spec_len)
    probs = None if no_draft_probs else draft_probs
    tokens, counts = run(drafts, target, 1.0, draft_probs=probs, device=device)
    q = [None] * batch_size if no_draft_probs else draft_probs.tolist()
    for b in range(batch_size):
        want = spec.rejection_sample(drafts[b].tolist(), max_spec_len, q[b], target[b].tolist(), 1.0, b, 0, 0)
        assert (tokens[b].tolist(), counts[b].item()) == want, b
    assert (counts < max_spec_len).any()  # some rejection, so a recovered token


# Below one block, one token into the second chunk, unaligned (vLLM: 100, 8193, 10000, 151936).
BOUNDARY_VOCABS = [CHUNK_V + 1] if INTERPRETER else [BLOCK_V // 2 + 3, CHUNK_V + 1, CHUNK_V + BLOCK_V + 7]


@pytest.mark.kernel
@pytest.mark.parametrize("vocab_size", BOUNDARY_VOCABS)
@pytest.mark.parametrize("mode", ["no_draft_probs", "draft_probs", "residual_all_zero"])
def test_sample_recovered_tokens_vocab_boundary(device, vocab_size, mode):
    """vLLM's GHSA-8wr5-jm2h-8r4f: with the last partial tile's tokens all at
    probability 0 (the single tile: all mass on token 0), a masked position past V
    must not win the race. Every emitted token is in [0, V) and has target
    probability > 0 (the residual's support and the bonus row's lie within p's).
    residual_all_zero: q = 2 p (unnormalised), so p - q <= 0 everywhere and a
    rejection races over p."""
    batch, spec_len, repeats = 2, 3, 1 if INTERPRETER else 16
    gen = generator(42 + vocab_size)
    last_tile = (vocab_size // CHUNK_V) * CHUNK_V
    p = torch.rand(batch, spec_len + 1, vocab_size, generator=gen)
    if last_tile > 0:
        p[..., last_tile:] = 0.0
    else:
        p = torch.zeros_like(p)
        p[..., 0] = 1.0
    p /= p.sum(-1, keepdim=True)
    if mode == "residual_all_zero":
        draft_probs = 2 * p[:, :spec_len]
    else:
        draft_probs = torch.softmax(torch.rand(batch, spec_len, vocab_size, generator=gen), -1)
    if last_tile == 0 or mode == "residual_all_zero":
        drafts = torch.zeros(batch, spec_len, dtype=torch.int64)  # p > 0 there
    else:
        drafts = torch.randint(0, vocab_size, (batch, spec_len), generator=gen)
    probs = None if mode == "no_draft_probs" else draft_probs.repeat(repeats, 1, 1)
    p = p.repeat(repeats, 1, 1)  # each request `repeats` times, with other seeds
    tokens, counts = run(drafts.repeat(repeats, 1), p.log(), 1.0, draft_probs=probs, device=device)
    emitted = tokens.gather(1, counts.long()[:, None])[:, 0]
    assert ((emitted >= 0) & (emitted < vocab_size)).all(), emitted
    row = p[torch.arange(batch * repeats), counts.long()]
    assert (row.gather(1, emitted[:, None]) > 0).all(), emitted


@pytest.mark.kernel
def test_placeholder_draft_token_rejected_random(device):
    """A -1 draft (and an id past V) among the first n drafts of a sampled request is
    rejected without being read; the accepted ones before it stay, and the emitted
    token comes from that row (token 7 holds all its mass)."""
    output_tokens = [[1, VOCAB - 1, 7, 9]]
    logits = greedy_logits(output_tokens)
    for bad in (-1, VOCAB):
        tokens, counts = run([[1, VOCAB - 1, bad]], logits, 1.0, num_draft=torch.tensor([3]), device=device)
        assert tokens.tolist() == [[1, VOCAB - 1, 7, -1]] and counts.tolist() == [2]


@pytest.mark.kernel
def test_random_kernel_accepted(device):
    """test_triton_cpu_kernels.py: draft 5 with q(5) = 0.8 against p(5) = 0.9: p / q
    > 1, accepted for every noise; the bonus row holds all its mass on 7."""
    seeds = 8 if INTERPRETER else 64
    target = torch.full((seeds, 2, 8), math.log(0.1 / 7))
    target[:, 0, 5] = math.log(0.9)
    target[:, 1] = -50.0
    target[:, 1, 7] = 50.0
    q = torch.full((seeds, 1, 8), 0.2 / 7)
    q[:, 0, 5] = 0.8
    tokens, counts = run(torch.full((seeds, 1), 5), target, 1.0, draft_probs=q, device=device)
    assert (tokens == torch.tensor([5, 7])).all() and (counts == 1).all()


@pytest.mark.kernel
def test_recovered_tokens_basic(device):
    """The recovered token samples max(p - q, 0). Request 0: draft 0 has p = 0, so it
    is always rejected, and the residual [0, 0, 0.5, 0] leaves token 2 alone.
    Request 1: draft 1 (p 0.1, q 0.5) is accepted with probability 0.2, else the
    residual [0, 0, 0, 0.5] gives 3 (vLLM's expected recovered tokens, 2 and 3)."""
    draws = 8 if INTERPRETER else 200  # of each request, each draw its own seed
    p = torch.tensor([[[0.0, 0.2, 0.5, 0.3], [0.25] * 4], [[0.1, 0.1, 0.1, 0.7], [0.25] * 4]])
    q = torch.tensor([[[0.5, 0.2, 0.0, 0.3]], [[0.1, 0.5, 0.2, 0.2]]])
    drafts = torch.tensor([[0], [1]])
    tokens, counts = run(
        drafts.repeat(draws, 1), p.log().repeat(draws, 1, 1), 1.0, draft_probs=q.repeat(draws, 1, 1), device=device
    )
    outcomes = {0: set(), 1: set()}
    for b in range(2 * draws):
        outcomes[b % 2].add((counts[b].item(), tokens[b, 0].item()))
    assert outcomes[0] == {(0, 2)}
    assert (0, 3) in outcomes[1] and outcomes[1] <= {(1, 1), (0, 3)}
    if not INTERPRETER:
        assert (1, 1) in outcomes[1]  # accepted 1 time in 5: seen in 200 draws


# -------------------------------------------------------- test_tree_rejection_sampler.py


def assert_tree_verify(draft_tree, drafted, target_maps, expected_accepted, expected_bonus, device):
    """vLLM's assert_rejection_sample, greedy, through tree_verify: node j of the tree
    [()] + draft_tree has parent its prefix; a node's token is its index in [()] +
    draft_tree + the bonus level when the sequence drafts it (a unique id past every
    node's otherwise, never an argmax); target row j's argmax is target_maps[b][node
    j]'s token. Expected: the accepted nodes along the path, then the bonus node."""
    last_level = len(draft_tree[-1])
    bonus_level = [leaf + (0,) for leaf in draft_tree if len(leaf) == last_level]
    ids = [(), *draft_tree, *bonus_level]
    nodes = [(), *draft_tree]
    batch, num_nodes = len(drafted), len(nodes)
    parents = torch.tensor([[-1] + [nodes.index(n[:-1]) for n in draft_tree]] * batch)
    tokens = torch.tensor(
        [[0] + [ids.index(n) if n in d else len(ids) + j for j, n in enumerate(draft_tree)] for d in drafted]
    )
    logits = torch.full((batch, num_nodes, VOCAB), -100.0)
    for b, sample_map in enumerate(target_maps):
        for j, node in enumerate(nodes):
            if node in sample_map:
                logits[b, j, ids.index(sample_map[node])] = 100.0
    zeros = torch.zeros(batch, dtype=torch.int64, device=device)
    path = tree_verify(
        tokens.to(device), parents.to(device), logits.to(device), torch.zeros(batch, device=device), zeros, zeros
    )
    for b in range(batch):
        accepted, bonus = expected_accepted[b], expected_bonus[b]
        pad = [-1] * (num_nodes - 1 - len(accepted))
        assert path.tokens[b].tolist() == [ids.index(n) for n in accepted] + [ids.index(bonus)] + pad, b
        assert path.nodes[b].tolist() == [0] + [nodes.index(n) for n in accepted] + pad, b
        assert path.counts[b].item() == len(accepted)


TREE_2x2 = [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.kernel
def test_single_node(device):
    assert_tree_verify([(0,)], [[(0,)]], [{(): (0,), (0,): (0, 0)}], [[(0,)]], [(0, 0)], device)


@pytest.mark.kernel
def test_chain_full_acceptance(device):
    chain = [(0,), (0, 0), (0, 0, 0)]
    target = {(): (0,), (0,): (0, 0), (0, 0): (0, 0, 0), (0, 0, 0): (0, 0, 0, 0)}
    assert_tree_verify(chain, [chain], [target], [chain], [(0, 0, 0, 0)], device)


@pytest.mark.kernel
def test_chain_partial_acceptance(device):
    chain = [(0,), (0, 0), (0, 0, 0)]
    target = {(): (0,), (0,): (0, 0), (0, 0): (0, 0, 0)}
    # The last node's token is (0, 0)'s, not its own: a mismatch there.
    assert_tree_verify(chain, [[(0,), (0, 0)]], [target], [[(0,), (0, 0)]], [(0, 0, 0)], device)


@pytest.mark.kernel
def test_tree_full_acceptance(device):
    target = {(): (1,), (1,): (1, 1), (1, 1): (1, 1, 0)}
    assert_tree_verify(TREE_2x2, [[(1,), (1, 1)]], [target], [[(1,), (1, 1)]], [(1, 1, 0)], device)


@pytest.mark.kernel
def test_tree_partial_acceptance(device):
    target = {(): (0,), (0,): (0, 1)}
    assert_tree_verify(TREE_2x2, [[(0,), (0, 0)]], [target], [[(0,)]], [(0, 1)], device)


@pytest.mark.kernel
def test_tree_early_rejection(device):
    target = {(): (0,), (0,): (0, 0), (0, 0): (0, 0, 0)}
    assert_tree_verify(TREE_2x2, [[(1,), (0, 1)]], [target], [[]], [(0,)], device)


@pytest.mark.kernel
def test_tree_full_acceptance_multiple_sequences(device):
    targets = [{(): (0,), (0,): (0, 1), (0, 1): (0, 1, 0)}, {(): (1,), (1,): (1, 0), (1, 0): (1, 0, 0)}]
    drafted = [[(0,), (0, 1)], [(1,), (1, 0)]]
    assert_tree_verify(TREE_2x2, drafted, targets, drafted, [(0, 1, 0), (1, 0, 0)], device)


@pytest.mark.kernel
def test_tree_partial_acceptance_multiple_sequences(device):
    targets = [{(): (0,), (0,): (0, 1)}, {(): (1,), (1,): (1, 0)}]
    drafted = [[(0,), (0, 0)], [(0,), (0, 1)]]
    assert_tree_verify(TREE_2x2, drafted, targets, [[(0,)], []], [(0, 1), (1,)], device)


@pytest.mark.kernel
def test_deep_tree_full_acceptance(device):
    tree = TREE_2x2 + [(a, b, c) for a in (0, 1) for b in (0, 1) for c in (0, 1)]
    target = {(): (1,), (0,): (0, 1), (1,): (1, 1), (0, 0): (0, 0, 0), (1, 1): (1, 1, 0), (1, 1, 0): (1, 1, 0, 0)}
    drafted = [(1,), (1, 1), (1, 1, 0)]
    assert_tree_verify(tree, [drafted], [target], [drafted], [(1, 1, 0, 0)], device)


# ----------------------------------------------------------- test_min_p_spec_decode.py


def min_p_reference_mask(logits, min_p):
    """vLLM's reference: drop probability < min_p * the largest (softmax in float64)."""
    probs = torch.softmax(logits.double(), -1)
    return probs < probs.amax(-1, keepdim=True) * min_p[:, None].double()


SPEC_LEN = 2  # 2 requests x (K + 1) = 6 target rows; vLLM: ragged [2, 3]


@pytest.mark.kernel
def test_apply_with_spec_decode_noop_when_disabled(device):
    target = torch.randn(2, SPEC_LEN + 1, 32, generator=generator(0))
    cut = row_cuts(target, device, min_p=torch.tensor([0.0, 0.0]))
    assert (cut == -INF).all()


@pytest.mark.kernel
def test_apply_with_spec_decode_masks_per_request_rows(device):
    """Request 0 (min_p 0.1) and request 1 (0.05): every target row of a request,
    the verified ones and the bonus one, gets its request's min-p. Drafts of tokens
    that min-p removes are then never accepted, and the emitted token is within the
    row's min-p set."""
    target = torch.randn(2, SPEC_LEN + 1, 64, generator=generator(0)) * 2
    min_p = torch.tensor([0.1, 0.05])
    cut = row_cuts(target, device, min_p=min_p)
    dropped = min_p_reference_mask(target.view(-1, 64), min_p.repeat_interleave(SPEC_LEN + 1))
    assert torch.equal(target.view(-1, 64) < cut.cpu().view(-1, 1), dropped)
    assert dropped.any(-1).all()
    drafts = target[:, :SPEC_LEN].argmin(-1)  # the least likely token: min-p removes it
    for s in range(2 if INTERPRETER else 32):
        tokens, counts = run(drafts, target, 1.0, cut=cut, seeds=torch.tensor([s, s + 1000]), device=device)
        assert (counts == 0).all()
        assert not dropped.view(2, SPEC_LEN + 1, 64)[:, 0].gather(1, tokens[:, :1]).any()


@pytest.mark.kernel
def test_apply_with_spec_decode_mixed_zero_min_p(device):
    target = torch.randn(2, SPEC_LEN + 1, 32, generator=generator(1))
    min_p = torch.tensor([0.0, 0.2])
    cut = row_cuts(target, device, min_p=min_p).cpu()
    assert (cut[0] == -INF).all()  # untouched rows
    dropped = min_p_reference_mask(target[1], min_p[1:].expand(SPEC_LEN + 1))
    assert torch.equal(target[1] < cut[1, :, None], dropped)
