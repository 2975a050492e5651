"""Budgeted verification measured on data (training.budget_curve; draft_metrics'
`survival`; DraftEvaluator(budget=True)):

- the per-bin sums are the plain loop's (specs.vocab_metrics.draft_metric_sums):
  on Hypothesis survival tables of powers of two (exact products, so every bin is
  decided exactly; NaN, values above 1 and below 0 included), and with the draft's
  own confidence, greedy and inside a request's truncation;
- a threshold at a bin edge keeps exactly what ops.budget_keep, the serving
  allocation, keeps with every start in one batch and the same number of drafts;
- the curve runs from nothing to fixed K's acceptance length; at_budget interpolates
  between bin edges and puts fixed K beside it;
- the evaluator's step with a budget compiles fullgraph, one graph for batches of
  three lengths, equal to eager; a DSpark head is ranked by its confidence head.
"""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdraft.ops import budget_keep
from specdraft.testing import CompileCounts
from specdraft.training import DraftEvaluator, TargetBatch, draft_metrics, finalize
from specdraft.training.block import block_forward_for_eval, start_anchors
from specdraft.training.budget_curve import NUM_BINS, at_budget, budget_curve, gain_bins

import specs.vocab_metrics as spec
from fixtures.block_heads import make_block_batch, make_block_head
from fixtures.unroll_batches import head_for, make_packed

BUDGET_FIELDS = ("budget_drafts", "budget_accepted")  # integer-valued: exact
FLOAT_BUDGET_FIELDS = ("budget_expected", "expected_prefix")


def make_batch(seed, num_steps, seq_lens, vocab, agree=0.6):
    """Packed sequences whose draft logits partly follow the target's next rows, so
    that matches, runs and confident drafts occur."""
    g = torch.Generator().manual_seed(seed)
    total = sum(seq_lens)
    target = torch.randn(total, vocab, generator=g) * 2
    ahead = torch.stack([torch.roll(target, -(k + 1), 0) for k in range(num_steps)])
    draft = agree * ahead * 2 + torch.randn(num_steps, total, vocab, generator=g)
    loss_mask = torch.rand(total, generator=g) >= 0.15
    cu_seqlens = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()], dtype=torch.int32)
    return draft, target, loss_mask, cu_seqlens


def spec_of(draft, target, loss_mask, temperature, seq_lens, survival, truncation=None, bin_margins=None):
    total = draft.shape[1]
    return spec.draft_metric_sums(
        [[row.tolist() for row in draft[k].double()] for k in range(draft.shape[0])],
        [row.tolist() for row in target.double()], loss_mask.tolist(), [temperature] * total, list(seq_lens),
        truncations=None if truncation is None else [truncation] * total, survival=survival, bin_margins=bin_margins,
    )  # fmt: skip


def assert_budget_sums(sums, want):
    for name in BUDGET_FIELDS:
        assert getattr(sums, name).cpu().tolist() == want[name], name
    for name in FLOAT_BUDGET_FIELDS:
        torch.testing.assert_close(getattr(sums, name).cpu(), torch.tensor(want[name], dtype=torch.float64),
                                   rtol=1e-6, atol=1e-6, msg=name)  # fmt: skip


# Survival estimates whose products are exact powers of two (or 0): each gain's bin is
# decided exactly in fp32 and in the spec's float64 alike.
EXACT_SURVIVALS = st.sampled_from([1.0, 0.5, 0.25, 0.125, 2.0**-20, 0.0, math.nan, 1.5, -0.25])


@given(
    seed=st.integers(0, 2**16),
    num_steps=st.integers(1, 4),
    seq_lens=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    temperature=st.sampled_from([0.0, 0.8]),
    data=st.data(),
)
def test_per_bin_sums_are_the_plain_loops(device, seed, num_steps, seq_lens, temperature, data):
    draft, target, loss_mask, cu_seqlens = make_batch(seed, num_steps, seq_lens, 6)
    total = draft.shape[1]
    rows = data.draw(st.lists(st.lists(EXACT_SURVIVALS, min_size=total, max_size=total), min_size=num_steps,
                              max_size=num_steps))  # fmt: skip
    survival = torch.tensor(rows, dtype=torch.float32)
    args = [x.to(device) for x in (draft, target, loss_mask)]
    sums = draft_metrics(*args, temperature, cu_seqlens=cu_seqlens.to(device), survival=survival.to(device))
    assert_budget_sums(sums, spec_of(draft, target, loss_mask, temperature, seq_lens, rows))


@pytest.mark.parametrize(
    ("temperature", "truncation"),
    [(0.0, None), (0.7, None), (0.7, (0, 0.9, 0.0)), (1.0, (4, 1.0, 0.05))],
)
def test_the_drafts_confidence_is_the_plain_loops(device, temperature, truncation):
    """survival="draft": each draft row's largest probability, at the temperature (1
    when greedy) and of the truncated row when the request truncates."""
    seq_lens = (13, 7, 21)
    draft, target, loss_mask, cu_seqlens = make_batch(5, 3, seq_lens, 17)
    bin_margins = []
    want = spec_of(draft, target, loss_mask, temperature, seq_lens, "draft", truncation, bin_margins)
    assert min(bin_margins) > 1e-4, min(bin_margins)  # no gain within float rounding of a bin edge
    kwargs = {} if truncation is None else dict(zip(("top_k", "top_p", "min_p"), truncation, strict=True))
    args = [x.to(device) for x in (draft, target, loss_mask)]
    sums = draft_metrics(*args, temperature, cu_seqlens=cu_seqlens.to(device), survival="draft", **kwargs)
    assert_budget_sums(sums, want)
    assert sum(want["budget_drafts"][1 : NUM_BINS - 1]) > 0  # the gains spread over the bins


def test_a_bin_edge_keeps_what_budget_keep_keeps():
    """Every start one batch of T requests of K drafts: for each bin edge b, budget_keep
    with the budget of the drafts in bins 0..b keeps exactly those drafts."""
    num_steps, total = 4, 300
    g = torch.Generator().manual_seed(0)
    survival = torch.rand(num_steps, total, generator=g) ** 0.3
    bins = gain_bins(survival)
    gains = survival.cumprod(0).T.contiguous()  # [T, K]: the requests' expected gains
    depths = torch.arange(num_steps, dtype=torch.int32).expand(total, num_steps).contiguous()
    edges_tested = 0
    for edge in range(NUM_BINS - 1):
        inside = (bins <= edge).T
        kept = budget_keep(gains, depths, torch.tensor(int(inside.sum()))).keep
        assert torch.equal(kept, inside), edge
        edges_tested += bool(0 < int(inside.sum()) < num_steps * total)
    assert edges_tested > 20


def test_the_curve_runs_from_nothing_to_fixed_k():
    seq_lens = (30, 18, 25)
    draft, target, loss_mask, cu_seqlens = make_batch(9, 3, seq_lens, 11)
    sums = draft_metrics(draft, target, loss_mask, 0.9, cu_seqlens=cu_seqlens, survival="draft")
    curve = budget_curve(sums.budget_drafts, sums.budget_accepted, sums.budget_expected, sums.starts)
    want = spec_of(draft, target, loss_mask, 0.9, seq_lens, "draft")
    lengths = want["acceptance_lengths"]
    assert curve.verified[0] == 0 and curve.accepted[0] == 0 and curve.threshold[0] == 1
    assert curve.verified[-1] == 3 and curve.threshold[-1] == 0
    assert float(curve.accepted[-1]) == pytest.approx(sum(lengths) / len(lengths), rel=1e-12)
    assert (curve.verified.diff() >= 0).all() and (curve.accepted.diff() >= 0).all()
    assert (curve.threshold.diff() < 0).all()


def test_at_budget_interpolates_and_puts_fixed_k_beside():
    """Four starts, K = 2. Bins 0 and 3 hold 2 and 4 drafts (the rest empty); of them 2
    and 1 accepted, expected 1.5 and 0.5: the curve's edges are (0, 0), (0.5, 0.5),
    (1.5, 0.75). Fixed K: rates 0.5 then 0.25 accepted per start."""
    drafts, accepted, expected = (torch.zeros(NUM_BINS, dtype=torch.float64) for _ in range(3))
    drafts[0], drafts[3], accepted[0], accepted[3], expected[0], expected[3] = 2, 4, 2, 1, 1.5, 0.5
    curve = budget_curve(drafts, accepted, expected, torch.tensor(4.0, dtype=torch.float64))
    rates, expected_rates = torch.tensor([0.5, 0.25]), torch.tensor([0.6, 0.3])
    point = at_budget(curve, 1.0, rates, expected_rates)
    assert point.accepted == pytest.approx(0.5 + 0.5 * 0.25)  # halfway from 0.5 to 1.5 drafts
    assert point.expected == pytest.approx(0.375 + 0.5 * 0.125)
    assert (point.fixed_accepted, point.fixed_expected) == pytest.approx((0.5, 0.6))
    half = at_budget(curve, 1.5, rates, expected_rates)
    assert (half.accepted, half.fixed_accepted) == pytest.approx((0.75, 0.5 + 0.5 * 0.25))
    assert at_budget(curve, 0.25, rates, expected_rates).accepted == pytest.approx(0.25)
    for bad in (0.0, -1.0, 2.5, math.nan):
        with pytest.raises(ValueError, match=r"budget must be in \(0, K = 2\]"):
            at_budget(curve, bad, rates, expected_rates)


def test_bad_survival_is_named():
    draft, target, loss_mask, cu_seqlens = make_batch(1, 2, [5, 4], 6)
    with pytest.raises(ValueError, match="survival must be None"):
        draft_metrics(draft, target, loss_mask, 0.0, survival="confidence")
    with pytest.raises(ValueError, match="survival"):
        draft_metrics(draft, target, loss_mask, 0.0, survival=torch.ones(3, 9))
    with pytest.raises(ValueError, match="budget must be a bool"):
        DraftEvaluator(head_for("eagle3", False, "cpu")[0], num_steps=2, budget=1, compile=False)


def test_the_budget_step_compiles_to_one_graph(device):
    head, width, _ = head_for("eagle3", False, device)
    compiled = DraftEvaluator(head, num_steps=3, temperature=0.7, top_p=0.9, budget=True,
                              compile={"backend": "aot_eager"})  # fmt: skip
    eager = DraftEvaluator(head, num_steps=3, temperature=0.7, top_p=0.9, budget=True, compile=False)
    torch._dynamo.reset()
    with CompileCounts.measure() as counts:
        for seed, lengths in enumerate(([5, 2, 6], [9, 3, 4, 7], [11])):
            packed = make_packed(lengths, target_hidden=width, mrope=False, seed=seed, device=device)
            logits = torch.randn(sum(lengths), head.config.vocab_size, generator=torch.Generator().manual_seed(seed))
            batch = TargetBatch(packed.token_ids, packed.hidden_states, logits.to(device), packed.positions,
                                packed.cu_seqlens)  # fmt: skip
            got, want = compiled(batch), eager(batch)
            assert got.budget_drafts.sum() == 3 * got.starts
            for name, a, b in zip(got._fields, got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"{counts.compiles} graphs for three batch lengths"


def test_a_dspark_head_is_ranked_by_its_confidence_head():
    """With a confidence head the gains are its sigmoids' products, row k of the block
    anchored after start t for draft k of start t, not the draft's own confidence."""
    head = make_block_head(markov="vanilla", confidence=True).eval()
    lengths = (12, 9)
    batch = make_block_batch(head, lengths, seed=2)
    logits = batch.target_logits
    sums = DraftEvaluator(head, num_steps=3, budget=True, compile=False)(batch)
    anchors, valid = start_anchors(batch.cu_seqlens, batch.num_tokens)
    out = block_forward_for_eval(head, *batch.unroll_args(), anchors, valid)
    total = batch.num_tokens
    confidence = [[float(torch.sigmoid(out.confidence[t, k])) for t in range(total)] for k in range(3)]
    draft = out.logits[:, :3].transpose(0, 1)
    want = spec_of(draft, logits, torch.ones(total, dtype=torch.bool), 0.0, lengths, confidence)
    assert sums.budget_drafts.tolist() == want["budget_drafts"]
    assert sums.budget_accepted.tolist() == want["budget_accepted"]
    by_draft = spec_of(draft, logits, torch.ones(total, dtype=torch.bool), 0.0, lengths, "draft")
    assert by_draft["budget_drafts"] != want["budget_drafts"]
    lengths = want["acceptance_lengths"]
    assert float(finalize(sums).acceptance_length) == pytest.approx(sum(lengths) / len(lengths))
