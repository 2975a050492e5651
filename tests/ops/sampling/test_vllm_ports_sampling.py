"""vLLM's top-k / top-p sampling tests (tests/v1/sample/), ported to draft_sample
with truncation_cut's cut (issue 40, proof 4): what is drawn after the filter. The
filter itself: test_vllm_ports_truncation.py (whose docstring lists the rest of
test_topk_topp_sampler.py); the rejection sampler: test_vllm_ports_rejection.py.

The oracles: specs/truncation.py's cuts (fixtures/vllm_ports.py), the truncated law
softmax over the kept logits in float64, chi-square thresholds of specs/sampling.py.
Where vLLM's rule differs from ours (its top_k = 1 picks the first of a tied max,
its Cake top-k keeps the lowest indices of a tie group), the port asserts ours and
says so. Unmarked tests (statistical, many patterns) run in the CPU and GPU lanes
only: the interpreted kernels equal the references in test_truncated_sampling.py;
the interpreter lane runs the marked ones with fewer seeds and parameter values.

vLLM tests, by file (vllm-project/vllm, at the commit read):

tests/v1/sample/test_topk_topp_sampler.py @ 01fa3fe74b058bb604f236341ab2361c7cf3d25b
- TestFlashInferTopkToppRobustness.test_flashinfer_handles_pathological_logits:
  ported as test_pathological_logits (the cut and draft_sample on NaN / +inf / -inf /
  flat rows).
- TestFlashInferDistributionMatch.test_distribution_matches_theoretical: its native
  half ported under the same name.

tests/v1/sample/test_topk_topp_cake.py @ 11ccf19a170508a4fb404e1739c8a1ba37414e4b
- test_mask_matches_reference / test_mask_per_row_params /
  test_dispatch_matches_reference: ported as test_topk_and_topp of
  test_vllm_ports_truncation.py (the same check: the fast path against a sort,
  per-row parameters, exactly).
- test_mask_ties_keep_lowest_index: ported as test_mask_ties_keep_every_tie; ours
  keeps all 10 tied tokens, where Cake keeps the 4 lowest indices.
- test_sample_within_kept_set / test_sample_preserves_nonuniform_probabilities:
  ported under the same names.
- test_eligibility: not applicable: FlashInfer Cake dispatch.

tests/v1/sample/test_greedy_topk1_invariance.py @ b98c3c8f4ce2c87c70567e4e8ce1722374e5f5bb
- test_topk1_matches_greedy_on_tied_logits / test_topk1_in_mixed_batch_matches_
  temperature_zero / test_topk1_with_topp_still_matches_greedy /
  test_pure_random_batch_with_topk1_row / test_topk_greater_than_one_is_unaffected:
  ported under the same names. Our top_k = 1 keeps the max's ties and samples among
  them: it equals greedy where the max is unique (asserted), and stays within the
  tie group, both members drawn, where it is not (asserted).

tests/v1/sample/test_gumbel.py @ 21ed9698282d4d5e0f61e1e5ad0408c16d4c26c8
- test_gumbel_noise_does_not_turn_negative_inf_logits_into_nan: ported under the
  same name (-inf logits are never drawn and store probability 0, not NaN; the
  noise's endpoints themselves: test_noise.py).
"""

import math

import pytest
import torch

from specdraft.ops import draft_sample

import specs.sampling as spec
import specs.truncation as truncation
from fixtures.lanes import INTERPRETER
from fixtures.vllm_ports import MARGIN, compare_results, cut_of, generator, masked_by, per_row

INF = math.inf


# ------------------------------------------------------- test_topk_topp_sampler.py

# Poisoned rows (vLLM's FlashInfer robustness test): through the cut and the sampler.

PATTERNS = [
    "clean",
    "nan_one_row",
    "nan_few",
    "nan_at_top",
    "nan_all_rows",
    "pos_inf_one_row",
    "neg_inf_one_row",
    "mixed_inf_nan",
    "degenerate_flat",
]


def poisoned_logits(pattern, batch, vocab, gen):
    logits = torch.randn(batch, vocab, generator=gen) * 5.0
    if pattern == "nan_one_row":
        logits[0] = math.nan
    elif pattern == "nan_few":
        logits[0, torch.randperm(vocab, generator=gen)[:16]] = math.nan
    elif pattern == "nan_at_top":  # the tokens top-k would otherwise pick
        logits[0, logits[0].argsort(descending=True)[:32]] = math.nan
    elif pattern == "nan_all_rows":
        logits[:] = math.nan
    elif pattern == "pos_inf_one_row":
        logits[0] = INF
    elif pattern == "neg_inf_one_row":
        logits[0] = -INF
    elif pattern == "mixed_inf_nan":
        logits[0], logits[1], logits[2] = math.nan, INF, -INF
    elif pattern == "degenerate_flat":
        logits[:] = 1.0
    return logits


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("path", ["topk_only", "topp_only", "topk_topp"])
def test_pathological_logits(device, pattern, path):
    """vLLM: a poisoned row 0 must not crash, give ids outside [0, V) or change its
    neighbours. Here also: every row's cut is the oracle's (NaN never kept, +inf
    tokens weigh 1 each), the clean rows get the cuts and tokens they get alone, and
    a row with a finite cut draws only a token the cut keeps, never a NaN
    (draft_sample: a sampled row samples over {i : logits[i] >= cut})."""
    batch, vocab = 8, 4096  # vLLM: 8 x 32768
    logits = poisoned_logits(pattern, batch, vocab, generator(1234))
    params = {"top_k": 50 if path != "topp_only" else 0, "top_p": 0.9 if path != "topk_only" else 1.0}
    cut = compare_results(logits, device, **params)
    ones = torch.ones(batch, device=device)
    seeds, positions = torch.arange(batch, device=device), torch.zeros(batch, dtype=torch.int64, device=device)
    tokens = draft_sample(logits.to(device), ones, seeds, positions, logit_cut=cut).cpu()
    assert ((tokens >= 0) & (tokens < vocab)).all()
    clean = torch.isfinite(logits).all(-1)
    if clean.any():
        rows = torch.nonzero(clean)[:, 0]
        alone = cut_of(logits[rows], device, **params)
        assert torch.equal(alone.cpu(), cut.cpu()[rows])
        alone_tokens = draft_sample(logits[rows].to(device), ones[rows], seeds[rows], positions[rows], logit_cut=alone)
        assert torch.equal(alone_tokens.cpu(), tokens[rows])
    finite_cut = torch.isfinite(cut.cpu())
    picked = logits.gather(1, tokens.long()[:, None])[:, 0]
    assert (picked[finite_cut] >= cut.cpu()[finite_cut]).all(), picked  # also: not NaN


@pytest.mark.kernel
def test_nan_logits_are_never_drawn(device):
    """test_pathological_logits's NaN rule in every lane, on small rows: NaN at the
    three largest logits' places, cut by top-k 10 (NaN never kept), sampled at T = 1
    and greedy; the kernels' argmax never takes a NaN key (ops/common/scan.py), and
    the CPU gives the same tokens as CUDA (draft_sample's docstring)."""
    batch, vocab = 4, 40
    logits = torch.randn(batch, vocab, generator=generator(3)) * 5.0
    logits.scatter_(1, logits.argsort(-1, descending=True)[:, :3], math.nan)
    temperature = torch.tensor([1.0, 1.0, 2.0, 0.0])
    cut = compare_results(logits, device, temperature=temperature, top_k=10)
    seeds = torch.arange(batch, device=device)
    for logit_cut in (cut, None):
        tokens = draft_sample(logits.to(device), temperature.to(device), seeds, seeds, logit_cut=logit_cut).cpu()
        assert not torch.isnan(logits.gather(1, tokens.long()[:, None])).any(), tokens
    assert (masked_by(logits, cut).gather(1, tokens.long()[:, None]) > -INF).all()


# Distribution after top-k / top-p (vLLM's chi-square against the theoretical law).

DISTRIBUTION_CASES = [(8, None), (16, None), (None, 0.5), (None, 0.7), (None, 0.99), (8, 0.9), (4, 0.5)]


def truncated_law(row, top_k, top_p):
    """specs/truncation.py's kept set at temperature 1, softmax over it in float64."""
    values = torch.tensor(row.tolist(), dtype=torch.float64)
    cut, margin = truncation.truncation_cut(row.tolist(), 1.0, top_k, float(torch.tensor(top_p)), 0.0)
    assert margin >= MARGIN, "a top-p boundary within rounding: pick another seed"
    return torch.softmax(torch.where(values >= cut, values, -INF), -1)


@pytest.mark.parametrize("topk,topp", DISTRIBUTION_CASES)
def test_distribution_matches_theoretical(device, topk, topp):
    """50,000 requests of one row (vocab 32, logits ~ 2 N(0, 1)), each its own seed:
    no draw outside the kept set, and a chi-square over the kept tokens that does
    not reject at alpha = 1e-6 (vLLM's alpha)."""
    vocab, draws = 32, 50_000
    row = torch.randn(vocab, generator=generator(0)) * 2.0
    params = {"top_k": topk or 0, "top_p": 1.0 if topp is None else topp}
    law = truncated_law(row, **params)
    logits = row.expand(draws, vocab).contiguous().to(device)
    cut = cut_of(logits, device, **params)
    seeds = torch.arange(draws, device=device)
    tokens = draft_sample(logits, torch.ones(draws, device=device), seeds, torch.zeros_like(seeds), logit_cut=cut)
    counts = torch.bincount(tokens.long().cpu(), minlength=vocab)
    support = law > 0
    assert counts[~support].sum() == 0, f"drew tokens of probability 0: {torch.nonzero(counts * ~support)[:, 0]}"
    if support.sum() > 1:
        observed, probs = counts[support].tolist(), law[support].tolist()
        assert spec.chi_square(observed, probs) < spec.chi2_threshold(len(observed) - 1), (observed, probs)


# ------------------------------------------------------------ test_topk_topp_cake.py


@pytest.mark.kernel
def test_mask_ties_keep_every_tie(device):
    """Ten tokens tied at 5.0, top-k 4. vLLM's Cake keeps the 4 lowest indices; our
    rule keeps every token tied with the k-th: all 10."""
    logits = torch.zeros(2, 40 if INTERPRETER else 1000)
    logits[:, 10:20] = 5.0
    cut = compare_results(logits, device, top_k=4)
    kept = masked_by(logits, cut) > -INF
    assert kept.sum(-1).tolist() == [10, 10] and kept[:, 10:20].all()


@pytest.mark.kernel
@pytest.mark.parametrize("top_p", [0.8] if INTERPRETER else [None, 0.8])
def test_sample_within_kept_set(device, top_p):
    """Every draw of draft_sample with the cut is a token the cut keeps."""
    batch, vocab, rounds = (2, 40, 2) if INTERPRETER else (32, 4096, 20)
    logits = (torch.randn(batch, vocab, generator=generator(2)) * 2).to(device)
    params = {"top_k": 50 if not INTERPRETER else 6, "top_p": top_p or 1.0}
    cut = compare_results(logits, device, **params)
    kept = (logits >= cut[:, None]).cpu()
    ones, seeds = torch.ones(batch, device=device), torch.arange(batch, device=device)
    for position in range(rounds):
        tokens = draft_sample(logits, ones, seeds, torch.full_like(seeds, position), logit_cut=cut)
        assert kept.gather(1, tokens.long().cpu()[:, None]).all()


def test_sample_preserves_nonuniform_probabilities(device):
    """Four tokens of probabilities 0.4, 0.3, 0.2, 0.1, the rest -inf, top-k 4:
    16,384 draws within 0.03 of each (vLLM's bound), none elsewhere."""
    draws, vocab = 128 * 128, 64
    probabilities = torch.tensor([0.4, 0.3, 0.2, 0.1])
    logits = torch.full((draws, vocab), -INF)
    logits[:, :4] = probabilities.log()
    logits = logits.to(device)
    cut = cut_of(logits, device, top_k=4, top_p=1.0)
    seeds = torch.arange(draws, device=device)
    tokens = draft_sample(logits, torch.ones(draws, device=device), seeds, seeds * 0 + 9, logit_cut=cut)
    observed = torch.bincount(tokens.long().cpu(), minlength=vocab).float() / draws
    assert observed[4:].sum() == 0
    torch.testing.assert_close(observed[:4], probabilities, atol=0.03, rtol=0)


# --------------------------------------------------- test_greedy_topk1_invariance.py

SEEDS = 8 if INTERPRETER else 32  # vLLM: 32 seeds
TOPK1_TEMPERATURES = (0.7,) if INTERPRETER else (0.1, 0.7, 1.0, 2.0)


def tied_top_logits(dtype=torch.float32, unique=False):
    """vLLM's row: two tokens tied at the max, the rest strictly lower; `unique`
    lifts token 1 above token 0 so the max is unique."""
    row = [1.0, 1.5 if unique else 1.0, 0.5, 0.0, -1.0, -2.0] + [-3.0] * 26
    return torch.tensor([row], dtype=dtype)


def sample_rows(logits, device, temperature, seeds=SEEDS, **params):
    """Draft tokens for `seeds` requests of the rows of `logits` [R, V] (row r's
    parameters: params[..][r] or a scalar), request i of row i % R with seed i // R.
    The cut of each row is computed once (a cut is a function of its row)."""
    num_rows = logits.shape[0]
    cut = cut_of(logits, device, temperature=temperature, **params).repeat(seeds)
    temp = per_row(temperature, num_rows).float().repeat(seeds).to(device)
    rows = logits.repeat(seeds, 1).to(device)
    s = torch.arange(seeds, device=device).repeat_interleave(num_rows)
    return draft_sample(rows, temp, s, torch.zeros_like(s), logit_cut=cut).cpu().view(seeds, num_rows)


@pytest.mark.kernel
@pytest.mark.parametrize("temperature", TOPK1_TEMPERATURES)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16] if INTERPRETER else [torch.float32, torch.float16, torch.bfloat16]
)
def test_topk1_matches_greedy_on_tied_logits(device, temperature, dtype):
    """vLLM: top_k = 1 picks the argmax (the first tied index), as temperature 0.
    Ours keeps both tied tokens and samples between them; with a unique max it is
    greedy's token on every seed."""
    logits = torch.cat([tied_top_logits(dtype), tied_top_logits(dtype, unique=True)])
    tokens = sample_rows(logits, device, temperature, top_k=1)
    assert set(tokens[:, 0].tolist()) == {0, 1}
    assert set(tokens[:, 1].tolist()) == {1}


@pytest.mark.kernel
def test_topk1_in_mixed_batch_matches_temperature_zero(device):
    """Two requests of one row, temperature 0 and top_k = 1 at temperature 0.7: the
    same token on every seed where the max is unique (with a tied max, our top_k = 1
    samples the tie: the previous test)."""
    logits = tied_top_logits(unique=True).expand(2, -1)
    tokens = sample_rows(logits, device, torch.tensor([0.0, 0.7]), top_k=torch.tensor([32, 1]))
    assert (tokens == 1).all(), tokens


@pytest.mark.kernel
@pytest.mark.parametrize("top_p", [0.9] if INTERPRETER else [0.5, 0.9, 0.99])
def test_topk1_with_topp_still_matches_greedy(device, top_p):
    tokens = sample_rows(
        torch.cat([tied_top_logits(unique=True), tied_top_logits()]), device, 0.7, top_k=1, top_p=top_p
    )
    assert set(tokens[:, 0].tolist()) == {1}
    assert set(tokens[:, 1].tolist()) <= {0, 1}


@pytest.mark.kernel
def test_pure_random_batch_with_topk1_row(device):
    """Every request sampled (no temperature-0 row), one with top_k = 1: that one
    is the argmax on every seed; the other (top-k off) is not always."""
    logits = tied_top_logits(unique=True).expand(2, -1)
    tokens = sample_rows(logits, device, 0.7, seeds=SEEDS, top_k=torch.tensor([32, 1]))
    assert (tokens[:, 1] == 1).all()
    assert len(set(tokens[:, 0].tolist())) > 1


@pytest.mark.kernel
def test_topk_greater_than_one_is_unaffected(device):
    """top_k = 3 on a row with a unique max: more than one outcome over 64 seeds,
    all within the top 3."""
    row = torch.tensor([[3.0, 2.5, 2.0, 1.5, 1.0, 0.5] + [-3.0] * 26])
    seen = set(sample_rows(row, device, 1.0, seeds=16 if INTERPRETER else 64, top_k=3)[:, 0].tolist())
    assert len(seen) > 1 and seen <= {0, 1, 2}


# --------------------------------------------------------------------- test_gumbel.py


@pytest.mark.kernel
def test_gumbel_noise_does_not_turn_negative_inf_logits_into_nan(device):
    """A row of -inf but one token (as a cut leaves it), many seeds: always that
    token, and the stored probabilities are 1 there and 0 (not NaN) elsewhere."""
    draws, vocab = (8, 40) if INTERPRETER else (256, 1024)
    logits = torch.full((draws, vocab), -INF)
    logits[:, 17] = 0.5
    logits = logits.to(device)
    cut = cut_of(logits[:1], device, top_k=5).expand(draws).contiguous()  # one row's cut, every row's
    assert cut[0].item() == 0.5
    seeds = torch.arange(draws, device=device)
    out = torch.full((draws, 1, vocab), math.nan, device=device)
    step = torch.tensor(0, device=device)
    tokens = draft_sample(
        logits, torch.ones(draws, device=device), seeds, seeds, logit_cut=cut, probs_out=out, step=step
    )
    assert (tokens == 17).all()
    stored = out[:, 0].cpu()
    assert not torch.isnan(stored).any()
    assert (stored[:, :17] == 0).all() and (stored[:, 18:] == 0).all()
    torch.testing.assert_close(stored[:, 17], torch.ones(draws))
