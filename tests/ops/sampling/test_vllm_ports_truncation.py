"""vLLM's top-k / top-p / min-p tests of the logit filter (tests/v1/sample/), ported
to truncation_cut (issue 40, proof 4). The sampling half (draft_sample with the
cut): test_vllm_ports_sampling.py; the rejection sampler: test_vllm_ports_rejection.py.

vLLM's filters return the logits with -inf outside the kept set; truncation_cut
returns one logit cut per row (the samplers keep `logits >= cut`). The ports compare
the cut with the plain-Python oracle specs/truncation.py (fixtures/vllm_ports.py's
compare_results: min-p, then top-k, then top-p over what those keep, every rule a
threshold on the logit, so ties at the cut are kept; NaN never kept) and keep
vLLM's own assertions on the kept logits. "Off" is top_k <= 0 or >= V, top_p = 1,
min_p = 0, where vLLM passes None. Where vLLM's rule differs from ours, the port
asserts ours and says so.

Sizes: vLLM's batches of up to 1024 rows of 128k logits, cut to what the CPU lane
runs in seconds; the interpreter lane (every kernel lane emulated in NumPy, 0.1 to
0.3 s per row of 40 logits) gets a few rows of a few dozen logits and fewer
parameter values. Unmarked tests (the large batch, and cases the marked ones already
take through the interpreter) run in the CPU and GPU lanes only.

vLLM tests, by file (vllm-project/vllm, at the commit read):

tests/v1/sample/test_topk_topp_sampler.py @ 01fa3fe74b058bb604f236341ab2361c7cf3d25b
- test_sampler_threads_fp64_gumbel_to_topk_topp_sampler: not applicable: a Sampler
  option (fp64 Gumbel noise); our noise is noise.py's seeded hash, without options.
- test_rocm_aiter_sampler_defers_import_when_generators_force_native: not
  applicable: ROCm aiter import plumbing.
- test_random_sample_uses_fp64_exponential_race_when_requested: not applicable: the
  fp64 option again, on torch's global RNG.
- test_topk_impl_equivalence: ported as test_topk_impl_equivalence.
- test_flashinfer_sampler_fallback_when_jit_cannot_target_gpu: not applicable:
  FlashInfer JIT gating.
- TestTritonTopkTopp.test_topk_only / test_topp_only / test_topk_and_topp: ported
  under the same names; exact under top-p too, where vLLM allows 0.5% of the kept
  counts to differ.
- TestTritonTopkTopp.test_both_disabled / test_extreme_k_values /
  test_extreme_p_values / test_large_batch / test_noncontiguous_logits_match_contiguous
  / test_topk_with_neginf_logits / test_topp_with_neginf_logits /
  test_topk_topp_with_neginf_logits / test_all_neginf_logits /
  test_few_valid_tokens_with_neginf / test_nearly_equal_logits_topp /
  test_mixed_neginf_and_normal_rows / test_mixed_batch_grammar_rows_get_topp:
  ported under the same names.
- TestTritonTopkTopp.test_large_batch_int64_row_offset: ported under the same name
  (marked cuda: B * V > 2**31 logits on a GPU; it checks draft_sample too).
- TestTritonTopkTopp.test_equal_logits_few_valid: ported under the same name; ours
  keeps every tied token, where vLLM asserts only that one survives.
- TestTritonTopkTopp.test_topp_tie_break_deterministic: ported under the same name;
  ours keeps the whole tie group at the cut, where vLLM keeps its first copies in
  index order.
- TestFlashInferTopkToppRobustness.test_flashinfer_handles_pathological_logits:
  ported as test_pathological_logits (test_vllm_ports_sampling.py).
- TestFlashInferDistributionMatch.test_distribution_matches_theoretical: its native
  half ported as test_distribution_matches_theoretical (test_vllm_ports_sampling.py);
  the FlashInfer half is not applicable.
- test_absent_flashinfer_falls_back_instead_of_aborting /
  test_unbuildable_flashinfer_sampler_is_reported_not_raised: not applicable:
  FlashInfer availability.
- test_flashinfer_sampler (of an older version, @ 5d1ee758d8febcd3990415ba712111e9229b7e8a):
  not applicable: FlashInfer's renorm kernels.

tests/v1/sample/test_topk_topp_scatter_cudagraph.py @ 80ab63c5b416e275e091658ce5ab36e12554513e
- test_top_k_only_does_not_modify_original / test_top_p_only_does_not_modify_original
  / test_top_k_top_p_combined_does_not_modify_original: ported as
  test_does_not_modify_original.
- test_top_k_masks_correct_tokens / test_top_p_at_least_one_finite /
  test_result_shape_preserved: ported under the same names.
- test_no_op_returns_input_unchanged: ported into test_both_disabled (the op never
  returns the logits: all off is a cut of -inf, which keeps every token).

tests/v1/sample/test_min_p_kernel.py @ 268739128c8adbf9f37212626957d6a94ac05000
- test_min_p_basic / test_min_p_zero_is_noop / test_min_p_one_keeps_only_max /
  test_min_p_all_equal_logits / test_min_p_shared_request_mapping /
  test_min_p_mixed_zero_and_nonzero / test_min_p_already_neg_inf /
  test_min_p_threshold_correctness: ported under the same names (test_min_p_basic at
  two temperatures: our threshold is max + T ln(min_p) on the raw logits).

tests/v1/sample/test_sampler.py @ 0c586818053c5fc5703c3c5ea7378498c5402637 (a
version with min-p in the sampler) and tests/v1/sample/test_logits_processors.py @
03a836b7b4f58495c57de5c9a95167f801efd21e
- test_sampler_min_p, and test_min_p of the logits-processor file (the same test):
  ported as test_sampler_min_p.
- test_sampler_min_tokens_penalty / test_sampler_presence_penalty /
  test_sampler_frequency_penalty / test_sampler_repetition_penalty /
  test_sampler_logit_bias / test_sampler_allowed_token_ids / test_sampler_bad_words,
  and the logits-processor file's test_logit_bias / test_min_tokens_penalty and
  other processors: not applicable: logits processors that run before our ops (they
  take the processed logits).

Not applicable, whole files: test_topk_topp_triton_warmup.py (vLLM's autotune
warmup dispatch), test_min_k.py and test_p_less.py (other truncation methods),
the logprobs, penalties, DRY, thinking-budget and diffusion files (outside issue 40's
parameters). The other sampler files: test_vllm_ports_sampling.py and
test_vllm_ports_rejection.py.
"""

import math

import pytest
import torch

from specdraft.ops import draft_sample

from fixtures.lanes import INTERPRETER
from fixtures.vllm_ports import compare_results, cut_of, generator, kept_counts, masked_by

INF = math.inf
# vLLM: batches [1, 8, 32, 128, 512, 1024] x vocabularies [1024, 32000, 128256].
BATCHES = (3,) if INTERPRETER else (1, 8, 32)
VOCABS = (37,) if INTERPRETER else (1024, 8192)
SMALL_VOCAB = 40 if INTERPRETER else 4096  # vLLM: 32000 / 128256 in the edge-case tests
SMALL_BATCH = 2 if INTERPRETER else 16  # vLLM: 16 / 32


# ------------------------------------------------------- test_topk_topp_sampler.py


@pytest.mark.kernel
def test_topk_impl_equivalence(device):
    """Top-k alone, with top-p at its no-op 1.0: the k-th largest logit is the cut;
    k = V (top-k off, half the rows) keeps everything (cut -inf)."""
    gen = generator(33)
    batch, vocab = (4, 40) if INTERPRETER else (128, 4096)
    logits = torch.rand((batch, vocab), generator=gen)
    k = torch.randint(1, 10, (batch,), generator=gen)
    k.masked_fill_(torch.randint(0, 2, (batch,), generator=gen, dtype=torch.bool), vocab)
    cut = cut_of(logits, device, top_k=k, top_p=1.0).cpu()
    for r in range(batch):
        kth = logits[r].topk(int(k[r])).values[-1].item() if k[r] < vocab else -INF
        assert cut[r].item() == kth, r


def random_k(batch, vocab, gen):
    """vLLM's draws: k in [1, min(100, V)), off (k = V) for about a quarter of the rows."""
    k = torch.randint(1, min(100, vocab), (batch,), generator=gen)
    return k.masked_fill_(torch.randint(0, 4, (batch,), generator=gen) == 0, vocab)


def random_p(batch, gen):
    """vLLM's draws: p in [0.1, 1.0], off (p = 1) for about a quarter of the rows."""
    p = torch.rand(batch, generator=gen) * 0.9 + 0.1
    return p.masked_fill_(torch.randint(0, 4, (batch,), generator=gen) == 0, 1.0)


@pytest.mark.kernel
@pytest.mark.parametrize("batch_size", BATCHES)
@pytest.mark.parametrize("vocab_size", VOCABS)
def test_topk_only(device, batch_size, vocab_size):
    gen = generator(42)
    logits = torch.randn(batch_size, vocab_size, generator=gen)
    compare_results(logits, device, top_k=random_k(batch_size, vocab_size, gen))


@pytest.mark.kernel
@pytest.mark.parametrize("batch_size", BATCHES)
@pytest.mark.parametrize("vocab_size", VOCABS)
def test_topp_only(device, batch_size, vocab_size):
    gen = generator(43)
    logits = torch.randn(batch_size, vocab_size, generator=gen)
    compare_results(logits, device, top_p=random_p(batch_size, gen))


@pytest.mark.kernel
@pytest.mark.parametrize("batch_size", BATCHES)
@pytest.mark.parametrize("vocab_size", VOCABS)
def test_topk_and_topp(device, batch_size, vocab_size):
    gen = generator(44)
    logits = torch.randn(batch_size, vocab_size, generator=gen)
    compare_results(logits, device, top_k=random_k(batch_size, vocab_size, gen), top_p=random_p(batch_size, gen))


@pytest.mark.kernel
def test_both_disabled(device):
    """Every parameter off (k = 0 or V, p = 1, min_p = 0): a cut of -inf, which keeps
    every token; the logits are not touched."""
    logits = torch.randn(SMALL_BATCH, SMALL_VOCAB, generator=generator(1)).to(device)
    before = logits.clone()
    k = torch.tensor([0, SMALL_VOCAB] * SMALL_BATCH)[:SMALL_BATCH]
    cut = cut_of(logits, device, top_k=k, top_p=1.0, min_p=0.0)
    assert (cut == -INF).all()
    assert torch.equal(logits, before)
    assert torch.equal(masked_by(logits, cut), logits.cpu())


@pytest.mark.kernel
def test_extreme_k_values(device):
    batch, vocab = SMALL_BATCH, SMALL_VOCAB
    logits = torch.randn(batch, vocab, generator=generator(2))
    cut = compare_results(logits, device, top_k=1)  # the max alone (no ties in randn)
    assert torch.equal(cut.cpu(), logits.amax(-1)) and (kept_counts(logits, cut) == 1).all()
    cut = compare_results(logits, device, top_k=vocab)  # off
    assert (cut == -INF).all()
    compare_results(logits, device, top_k=torch.tensor([1, vocab, 2, vocab - 1] * batch)[:batch])


def test_extreme_p_values(device):
    batch, vocab = SMALL_BATCH, SMALL_VOCAB
    logits = torch.randn(batch, vocab, generator=generator(3))
    compare_results(logits, device, top_p=0.01)  # very restrictive: the max's mass passes it
    cut = compare_results(logits, device, top_p=1.0)
    assert (cut == -INF).all()
    compare_results(logits, device, top_p=torch.tensor([0.1, 0.5, 0.9, 1.0] * batch)[:batch])


def test_large_batch(device):
    batch, vocab = 128, 8192  # vLLM: 512 x 32000
    gen = generator(4)
    logits = torch.randn(batch, vocab, generator=gen)
    k = torch.randint(1, 50, (batch,), generator=gen)
    p = torch.rand(batch, generator=gen) * 0.5 + 0.5
    compare_results(logits, device, top_k=k, top_p=p)


@pytest.mark.cuda
def test_large_batch_int64_row_offset():
    """row * row_stride must not overflow int32: B * V > 2**31 logits (bf16, 4.3 GB),
    the last row a copy of row 0, must get row 0's cut and, with the same seed and
    position, its draft token."""
    vocab = 131072
    batch = 2**31 // vocab + 64
    gen = torch.Generator(device="cuda").manual_seed(5)
    logits = torch.randn(batch, vocab, generator=gen, device="cuda", dtype=torch.bfloat16)
    logits[-1] = logits[0]
    cut = cut_of(logits, "cuda", top_k=5)
    torch.cuda.synchronize()  # surface an illegal address here
    assert cut[-1].item() == cut[0].item() == logits[0].float().topk(5).values[-1].item()
    ones = torch.ones(batch, device="cuda")
    seeds = torch.zeros(batch, dtype=torch.int64, device="cuda")
    tokens = draft_sample(logits, ones, seeds, seeds, logit_cut=cut)
    assert tokens[-1].item() == tokens[0].item()
    assert logits[0, tokens[0]].float().item() >= cut[0].item()


@pytest.mark.kernel
@pytest.mark.parametrize("mode", ["topk_and_topp"] if INTERPRETER else ["topk_only", "topp_only", "topk_and_topp"])
def test_noncontiguous_logits_match_contiguous(device, mode):
    """Rows of a wider buffer (row stride V + pad) get the contiguous rows' cuts. The
    padding holds a logit larger than any row's (vLLM pads with -1000): a kernel
    reading past its row would move the max and the cut."""
    batch, vocab, pad = (2, 24, 8) if INTERPRETER else (16, 4096, 8)
    source = torch.linspace(10.0, -10.0, vocab)[None, :] + torch.arange(batch)[:, None] / 1000.0
    backing = torch.full((batch, vocab + pad), 1000.0, device=device)
    logits = backing[:, :vocab]
    logits.copy_(source.to(device))
    assert logits.stride() == (vocab + pad, 1) and not logits.is_contiguous()
    params = {}
    if mode in ("topk_only", "topk_and_topp"):
        params["top_k"] = 5 if INTERPRETER else 154
    if mode in ("topp_only", "topk_and_topp"):
        params["top_p"] = 0.95
    strided = cut_of(logits, device, **params)
    contiguous = compare_results(source, device, **params)
    assert torch.equal(strided.cpu(), contiguous.cpu())
    assert torch.equal(logits.cpu(), source)  # not written


# -inf logits (grammar / structured-output masks before sampling)


NEGINF_ROWS = 2 if INTERPRETER else 32  # vLLM: 32 x 128256
INF_FRACTIONS = (0.9,) if INTERPRETER else (0.5, 0.9, 0.99)


def masked_randn(batch, vocab, inf_fraction, gen):
    logits = torch.randn(batch, vocab, generator=gen)
    return logits.masked_fill_(torch.rand(batch, vocab, generator=gen) < inf_fraction, -INF)


def assert_kept_some(logits, cut):
    """vLLM's invariant: a row with a finite logit keeps at least one token."""
    finite = torch.isfinite(logits.cpu()).sum(-1)
    assert ((kept_counts(logits, cut) > 0) | (finite == 0)).all()


@pytest.mark.kernel
@pytest.mark.parametrize("inf_fraction", INF_FRACTIONS)
def test_topk_with_neginf_logits(device, inf_fraction):
    gen = generator(6)
    logits = masked_randn(NEGINF_ROWS, SMALL_VOCAB, inf_fraction, gen)
    k = torch.randint(1, 50, (NEGINF_ROWS,), generator=gen)
    cut = compare_results(logits, device, top_k=k)
    # vLLM's kept <= k, exact here (randn has no ties): min(k, finite tokens).
    finite = torch.isfinite(logits).sum(-1)
    assert torch.equal(kept_counts(logits, cut), torch.minimum(k, finite))
    assert_kept_some(logits, cut)


@pytest.mark.kernel
@pytest.mark.parametrize("inf_fraction", INF_FRACTIONS)
def test_topp_with_neginf_logits(device, inf_fraction):
    gen = generator(7)
    logits = masked_randn(NEGINF_ROWS, SMALL_VOCAB, inf_fraction, gen)
    p = torch.rand(NEGINF_ROWS, generator=gen) * 0.9 + 0.1
    assert_kept_some(logits, compare_results(logits, device, top_p=p))


@pytest.mark.kernel
@pytest.mark.parametrize("inf_fraction", INF_FRACTIONS)
def test_topk_topp_with_neginf_logits(device, inf_fraction):
    gen = generator(8)
    logits = masked_randn(NEGINF_ROWS, SMALL_VOCAB, inf_fraction, gen)
    k = torch.randint(1, 50, (NEGINF_ROWS,), generator=gen)
    p = torch.rand(NEGINF_ROWS, generator=gen) * 0.9 + 0.1
    cut = compare_results(logits, device, top_k=k, top_p=p)
    assert (kept_counts(logits, cut) <= k).all()
    assert_kept_some(logits, cut)


@pytest.mark.kernel
def test_all_neginf_logits(device):
    """A fully masked row is not truncated (cut -inf; it keeps its -inf logits,
    probability 0 each): no NaN cut, nothing changed."""
    logits = torch.full((SMALL_BATCH, SMALL_VOCAB), -INF)
    k = torch.randint(1, 50, (SMALL_BATCH,), generator=generator(9))
    for params in ({"top_k": k}, {"top_p": 0.9}, {"top_k": k, "top_p": 0.9}):
        cut = compare_results(logits, device, **params)
        assert (cut == -INF).all()
        assert (masked_by(logits, cut) == -INF).all()


@pytest.mark.kernel
def test_few_valid_tokens_with_neginf(device):
    """Five finite logits per row (a strict grammar)."""
    gen = generator(10)
    logits = torch.full((SMALL_BATCH, SMALL_VOCAB), -INF)
    for r in range(SMALL_BATCH):
        logits[r, torch.randperm(SMALL_VOCAB, generator=gen)[:5]] = torch.randn(5, generator=gen)
    cut = compare_results(logits, device, top_k=50)  # k above the finite count: all 5
    assert (kept_counts(logits, cut) == 5).all()
    cut = compare_results(logits, device, top_k=3)
    assert (kept_counts(logits, cut) == 3).all()  # vLLM: <= 3; randn has no ties
    cut = compare_results(logits, device, top_p=0.9)
    assert (kept_counts(logits, cut) > 0).all()


@pytest.mark.kernel
@pytest.mark.parametrize("num_valid", [5] if INTERPRETER else [1, 2, 5, 10, 50])
@pytest.mark.parametrize("mode", ["topk_only", "topp_only", "topk_and_topp"])
def test_equal_logits_few_valid(device, num_valid, mode):
    """A few tokens sharing one logit, the rest -inf. vLLM asserts that at least one
    survives (its pivot search may keep more than k); our rule keeps every token tied
    with the cut, so all num_valid survive, whatever k and p."""
    batch, vocab = (1, 40) if INTERPRETER else (8, SMALL_VOCAB)
    gen = generator(11)
    logits = torch.full((batch, vocab), -INF)
    for r in range(batch):
        logits[r, torch.randperm(vocab, generator=gen)[:num_valid]] = 1.0
    params = {}
    if mode in ("topk_only", "topk_and_topp"):
        params["top_k"] = max(1, num_valid - 1)
    if mode in ("topp_only", "topk_and_topp"):
        params["top_p"] = 0.95
    cut = compare_results(logits, device, **params)
    assert (kept_counts(logits, cut) == num_valid).all()


@pytest.mark.kernel
@pytest.mark.parametrize("num_valid", [5] if INTERPRETER else [2, 5, 10])
def test_nearly_equal_logits_topp(device, num_valid):
    """A few tokens within 1e-6 of each other (a collapsed search range)."""
    gen = generator(12)
    logits = torch.full((SMALL_BATCH, SMALL_VOCAB), -INF)
    for r in range(SMALL_BATCH):
        idx = torch.randperm(SMALL_VOCAB, generator=gen)[:num_valid]
        logits[r, idx] = 1.0 + torch.rand(num_valid, generator=gen) * 1e-6
    cut = compare_results(logits, device, top_p=0.95)
    assert (kept_counts(logits, cut) > 0).all()


def test_mixed_neginf_and_normal_rows(device):
    """Even rows 99% -inf, odd rows untouched, in one batch."""
    batch, vocab = NEGINF_ROWS, SMALL_VOCAB
    gen = generator(13)
    logits = torch.randn(batch, vocab, generator=gen)
    for r in range(0, batch, 2):
        logits[r][torch.rand(vocab, generator=gen) < 0.99] = -INF
    k = torch.randint(1, 50, (batch,), generator=gen)
    p = torch.rand(batch, generator=gen) * 0.9 + 0.1
    cut = compare_results(logits, device, top_k=k, top_p=p)
    assert (kept_counts(logits, cut) <= k).all()
    assert_kept_some(logits, cut)


@pytest.mark.kernel
def test_mixed_batch_grammar_rows_get_topp(device):
    """Rows whose top-k is a no-op (fewer finite logits than k) still get their
    top-p: it trims them below what top-k alone keeps."""
    vocab, finite, k = (24, 8, 10) if INTERPRETER else (8192, 30, 50)  # vLLM: V = 32000
    grammar, p_only, both = (1, 1, 1) if INTERPRETER else (3, 2, 3)
    gen = generator(14)
    logits = torch.full((grammar + p_only + both, vocab), -INF)
    for r in range(grammar):
        logits[r, torch.randperm(vocab, generator=gen)[:finite]] = torch.randn(finite, generator=gen)
    logits[grammar:] = torch.randn(p_only + both, vocab, generator=gen)
    top_k = torch.tensor([k] * grammar + [vocab] * p_only + [k] * both)
    top_p = torch.tensor([0.5] * grammar + [0.9] * (p_only + both))
    cut = compare_results(logits, device, top_k=top_k, top_p=top_p)
    k_only = cut_of(logits[:grammar], device, top_k=top_k[:grammar])
    assert (kept_counts(logits, cut)[:grammar] < kept_counts(logits[:grammar], k_only)).all()


@pytest.mark.kernel
def test_topp_tie_break_deterministic(device):
    """The p = 0.5 boundary inside a group of tied top tokens: the same kept set on
    every call. Our rule keeps the whole tie group: the group at 1.0 weighs e / (e +
    1) = 0.73 of the kept mass, so the cut is 1.0 and all of its copies survive
    (vLLM keeps only the first copies in index order, 0.5 of the mass)."""
    batch, tied, vocab = (1, 20, 48) if INTERPRETER else (4, 1000, 4096)
    logits = torch.full((batch, vocab), -INF)
    logits[:, :tied] = 1.0
    logits[:, tied : 2 * tied] = 0.0
    cuts = [compare_results(logits, device, top_p=0.5).cpu()]
    cuts += [cut_of(logits, device, top_p=0.5).cpu() for _ in range(1 if INTERPRETER else 4)]
    for cut in cuts[1:]:
        assert torch.equal(cut, cuts[0])
    kept = torch.nonzero(masked_by(logits, cuts[0])[0] > -INF)[:, 0]
    assert torch.equal(kept, torch.arange(tied))


# ------------------------------------------------ test_topk_topp_scatter_cudagraph.py


@pytest.mark.kernel
@pytest.mark.parametrize(
    "mode", ["top_k_top_p_combined"] if INTERPRETER else ["top_k_only", "top_p_only", "top_k_top_p_combined"]
)
def test_does_not_modify_original(device, mode):
    batch, vocab = (2, 32) if INTERPRETER else (8, 256)
    logits = torch.randn(batch, vocab, generator=generator(2)).to(device)
    before = logits.clone()
    params = {
        "top_k_only": {"top_k": vocab // 2},
        "top_p_only": {"top_p": 0.9},
        "top_k_top_p_combined": {"top_k": vocab // 4, "top_p": 0.95},
    }[mode]
    cut = compare_results(logits, device, **params)
    assert cut.data_ptr() != logits.data_ptr()
    assert torch.equal(logits, before)


@pytest.mark.kernel
def test_top_k_masks_correct_tokens(device):
    """Exactly k finite logits kept per row (no ties in randn)."""
    batch, vocab = (2, 32) if INTERPRETER else (4, 128)
    logits = torch.randn(batch, vocab, generator=generator(3))
    cut = compare_results(logits, device, top_k=vocab // 4)
    assert (kept_counts(logits, cut) == vocab // 4).all()


@pytest.mark.kernel
def test_top_p_at_least_one_finite(device):
    batch, vocab = (2, 32) if INTERPRETER else (4, 128)
    logits = torch.randn(batch, vocab, generator=generator(4))
    cut = compare_results(logits, device, top_p=0.01)
    assert (kept_counts(logits, cut) >= 1).all()


def test_result_shape_preserved(device):
    """One fp32 cut per row; masking with it keeps the logits' shape."""
    logits = torch.randn(3, 40, generator=generator(5))
    cut = compare_results(logits, device, top_k=10, top_p=0.9)
    assert cut.shape == (3,) and masked_by(logits, cut).shape == logits.shape


# ------------------------------------------------------------ test_min_p_kernel.py


def min_p_oracle_keep(logits, min_p, temperature=1.0):
    """vLLM's reference in our units: keep logit >= max + T ln(min_p), in Python
    floats (float64); min_p = 0 keeps everything."""
    keep = torch.ones(logits.shape, dtype=torch.bool)
    for r, (row, p) in enumerate(zip(logits.tolist(), min_p, strict=True)):
        if p > 0:
            threshold = max(row) + temperature * math.log(p)
            keep[r] = torch.tensor([v >= threshold for v in row])
    return keep


@pytest.mark.kernel
@pytest.mark.parametrize("vocab_size", [40] if INTERPRETER else [128, 1024, 32000])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_min_p_basic(device, vocab_size, temperature):
    """Tokens with probability below min_p * max_prob are dropped, at any temperature."""
    logits = torch.randn(4, vocab_size, generator=generator(0))
    min_p = torch.tensor([0.1, 0.05, 0.5, 0.2])
    cut = compare_results(logits, device, temperature=temperature, min_p=min_p)
    assert torch.equal(logits >= cut.cpu()[:, None], min_p_oracle_keep(logits, min_p.tolist(), temperature))


@pytest.mark.kernel
def test_min_p_zero_is_noop(device):
    logits = torch.randn(2, 40, generator=generator(1))
    cut = cut_of(logits, device, min_p=0.0)
    assert (cut == -INF).all()


@pytest.mark.kernel
def test_min_p_one_keeps_only_max(device):
    logits = torch.randn(1, 40 if INTERPRETER else 256, generator=generator(2))
    logits[0, 7] = logits[0, 3] = logits.max() + 1.0  # a tied max: both kept
    cut = compare_results(logits, device, min_p=1.0)
    kept = masked_by(logits, cut)[0] > -INF
    assert torch.nonzero(kept)[:, 0].tolist() == [3, 7]


@pytest.mark.kernel
def test_min_p_all_equal_logits(device):
    """Every logit equals the max: all pass the threshold."""
    logits = torch.full((1, 40), 2.0)
    cut = compare_results(logits, device, min_p=0.5)
    assert kept_counts(logits, cut).item() == 40


@pytest.mark.kernel
def test_min_p_shared_request_mapping(device):
    """Rows 0, 1 of request 0 (min_p 0.1), rows 2, 3 of request 1 (min_p 0.5): the
    request's value repeated over its rows."""
    logits = torch.randn(4, 40, generator=generator(3))
    min_p = torch.tensor([0.1, 0.5]).repeat_interleave(2)
    cut = compare_results(logits, device, min_p=min_p)
    assert torch.equal(logits >= cut.cpu()[:, None], min_p_oracle_keep(logits, min_p.tolist()))


@pytest.mark.kernel
def test_min_p_mixed_zero_and_nonzero(device):
    logits = torch.randn(3, 40, generator=generator(4))
    min_p = torch.tensor([0.0, 0.3, 0.0])
    cut = compare_results(logits, device, min_p=min_p)
    assert cut[0].item() == cut[2].item() == -INF
    assert torch.equal(logits >= cut.cpu()[:, None], min_p_oracle_keep(logits, min_p.tolist()))


@pytest.mark.kernel
def test_min_p_already_neg_inf(device):
    """-inf logits stay out (a truncated row never keeps one)."""
    logits = torch.randn(1, 40, generator=generator(5))
    logits[0, :10] = -INF
    cut = compare_results(logits, device, min_p=0.1)
    assert (masked_by(logits, cut)[0, :10] == -INF).all() and cut.item() > -INF


@pytest.mark.kernel
@pytest.mark.parametrize("min_p_val", [0.01, 0.1, 0.5, 0.9])
def test_min_p_threshold_correctness(device, min_p_val):
    """A token survives iff logit >= max + ln(min_p), exactly."""
    logits = torch.randn(1, 64, generator=generator(6))
    cut = cut_of(logits, device, min_p=min_p_val).cpu()
    threshold = logits.max().item() + math.log(float(torch.tensor(min_p_val)))
    for i, v in enumerate(logits[0].tolist()):
        assert (v >= cut.item()) == (v >= threshold), f"token {i}: {v} vs {threshold}"


# ------------------------------------- test_sampler.py / test_logits_processors.py


@pytest.mark.kernel
@pytest.mark.parametrize("batch_size", [1, 2] if INTERPRETER else [1, 2, 32])
@pytest.mark.parametrize("min_p", [0.0, 0.1])
def test_sampler_min_p(device, batch_size, min_p):
    """One dominant token (10.0) over 0.01 everywhere else: min_p 0.1 keeps only it,
    min_p 0 keeps everything."""
    vocab = 40 if INTERPRETER else 1024
    logits = torch.full((batch_size, vocab), 1e-2)
    logits[:, 0] = 10.0
    kept = masked_by(logits, compare_results(logits, device, min_p=min_p)) > -INF
    assert kept[:, 0].all()
    assert (kept[:, 1:] == (min_p == 0.0)).all()
