"""training.draft_metrics against a plain-Python loop over sequences, starts and steps
(specs.vocab_metrics); finalize against the formulas; exact sums; one fullgraph
compile, no graph break and no recompile across sequence lengths (dynamic=True)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.testing import CompileCounts, fresh_compile
from specdraft.training import DraftMetricSums, combine, draft_metrics, finalize

import specs.vocab_metrics as spec
from fixtures.lanes import INTERPRETER

# The interpreter emulates every lane of a kernel in NumPy: half the profile's examples there.
EXAMPLES = settings.default.max_examples // 2 if INTERPRETER else settings.default.max_examples

EXACT_FIELDS = ("count", "matches", "accepted_prefix", "starts")
FLOAT_FIELDS = ("accept", "cross_entropy", "kl")


def make_batch(seed, num_steps, seq_lens, vocab, draft_vocab, *, use_map, dtype=torch.float32, mask_rate=0.2,
               agree=0.5):  # fmt: skip
    """Packed sequences with draft logits that partly follow the target (so that
    greedy matches and accepted runs occur): draft[k, t] = agree * target[t + k + 1]
    on the draft ids + noise."""
    g = torch.Generator().manual_seed(seed)
    total = sum(seq_lens)
    target = torch.randn(total, vocab, generator=g) * 2
    d2t = None
    ids = torch.arange(vocab)
    if use_map:
        ids = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
        d2t = ids - torch.arange(draft_vocab)
    ahead = torch.stack([torch.roll(target, -(k + 1), 0) for k in range(num_steps)])[..., ids]
    draft = agree * ahead * 2 + torch.randn(num_steps, total, draft_vocab, generator=g)
    loss_mask = torch.rand(total, generator=g) >= mask_rate
    cu_seqlens = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()], dtype=torch.int32)
    return draft.to(dtype), target.to(dtype), loss_mask, cu_seqlens, d2t


def to(device, *tensors):
    """The tensors on device (Python numbers and None pass through)."""
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors]


def spec_sums(draft, target, loss_mask, temperatures, seq_lens, d2t, probs=False) -> dict:
    k_rows = [[row.tolist() for row in draft[k].double()] for k in range(draft.shape[0])]
    return spec.draft_metric_sums(k_rows, [row.tolist() for row in target.double()], loss_mask.tolist(),
                                  temperatures, seq_lens, None if d2t is None else d2t.tolist(), probs)  # fmt: skip


def assert_float_close(got: torch.Tensor, want: list[float]):
    want64 = torch.tensor(want, dtype=torch.float64)
    infinite = torch.isinf(want64)
    assert torch.equal(got[infinite], want64[infinite])
    scale = max([1.0] + [abs(v) for v in want if not math.isinf(v)])
    assert (got[~infinite] - want64[~infinite]).abs().max().item() <= 2e-5 * scale if (~infinite).any() else True


@pytest.mark.kernel
@settings(max_examples=EXAMPLES)
@given(
    seed=st.integers(0, 2**16),
    num_steps=st.integers(1, 3),
    seq_lens=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    vocab=st.integers(2, 9),
    use_map=st.booleans(),
    temperature=st.sampled_from([0.0, 0.7, 1.0, "per start"]),
    divergence=st.booleans(),
    probs=st.booleans(),
)
def test_sums_and_ratios_match_the_spec(device, seed, num_steps, seq_lens, vocab, use_map, temperature, divergence,
                                        probs):  # fmt: skip
    draft_vocab = max(1, vocab - 3) if use_map else vocab
    draft, target, loss_mask, cu_seqlens, d2t = make_batch(seed, num_steps, seq_lens, vocab, draft_vocab,
                                                           use_map=use_map)  # fmt: skip
    total = draft.shape[1]
    if probs:
        target = torch.softmax(target, -1)
    if temperature == "per start":
        temps = [(0.0, 0.5, 1.5)[t % 3] for t in range(total)]
        temperature = torch.tensor(temps)
    else:
        temps = [temperature] * total
    sums = draft_metrics(*to(device, draft, target, loss_mask, temperature), d2t=to(device, d2t)[0],
                         cu_seqlens=to(device, cu_seqlens)[0], target_is_probs=probs, divergence=divergence)  # fmt: skip
    sums = DraftMetricSums(*to("cpu", *sums))
    want = spec_sums(draft, target, loss_mask, temps, seq_lens, d2t, probs)
    for name in EXACT_FIELDS:
        assert getattr(sums, name).tolist() == want[name], name
    for name in FLOAT_FIELDS:
        got = getattr(sums, name)
        assert got.dtype == torch.float64
        if name != "accept" and not divergence:
            assert got.shape == (0,)
            continue
        assert got.shape == (num_steps,)
        assert_float_close(got, want[name])

    ratios = finalize(sums)
    count = want["count"]
    accuracy = [m / c if c else math.nan for m, c in zip(want["matches"], count, strict=True)]
    rate = [a / c if c else math.nan for a, c in zip(want["accept"], count, strict=True)]
    lengths = want["acceptance_lengths"]
    torch.testing.assert_close(ratios.accuracy, torch.tensor(accuracy, dtype=torch.float64), equal_nan=True)
    torch.testing.assert_close(ratios.acceptance_rate, torch.tensor(rate, dtype=torch.float64), equal_nan=True)
    mean_length = sum(lengths) / len(lengths) if lengths else math.nan
    torch.testing.assert_close(ratios.acceptance_length, torch.tensor(mean_length, dtype=torch.float64),
                               equal_nan=True)  # fmt: skip
    torch.testing.assert_close(ratios.marginal_acceptance_length,
                               torch.tensor(spec.simulated_acceptance_length(accuracy), dtype=torch.float64),
                               equal_nan=True)  # fmt: skip
    torch.testing.assert_close(ratios.expected_acceptance_length,
                               torch.tensor(spec.simulated_acceptance_length(rate), dtype=torch.float64),
                               equal_nan=True)  # fmt: skip


def test_a_mean_of_products_is_not_a_product_of_means():
    """K = 2, one sequence of 4 positions, every row scored. Full starts: 0 and 1
    (start 2's step 1 would need row 4). Start 0 drafts both tokens right, start 1
    neither, start 2's single step is wrong. Per step: accuracy [1/3, 1/2], so the
    product of means is 1/3 + 1/3 * 1/2 = 0.5; per start the leading runs are 2 and
    0, a mean of 1.0."""
    vocab = 4
    target = torch.eye(vocab) * 5  # row j: argmax j
    right = lambda row: torch.eye(vocab)[row] * 5  # noqa: E731
    wrong = lambda row: torch.eye(vocab)[(row + 1) % vocab] * 5  # noqa: E731
    draft = torch.zeros(2, 4, vocab)
    draft[0, 0], draft[1, 0] = right(1), right(2)  # start 0: rows 1 and 2
    draft[0, 1], draft[1, 1] = wrong(2), wrong(3)  # start 1: rows 2 and 3
    draft[0, 2] = wrong(3)  # start 2: row 3
    ratios = finalize(draft_metrics(draft, target, temperature=0.0))
    assert ratios.accuracy.tolist() == [1 / 3, 1 / 2]
    assert ratios.acceptance_length.item() == 1.0
    assert ratios.marginal_acceptance_length.item() == pytest.approx(0.5)
    assert ratios.accepted_prefix_rate.tolist() == [0.5, 0.5]


def test_greedy_acceptance_is_the_match_count():
    draft, target, loss_mask, cu_seqlens, d2t = make_batch(4, 3, [6, 9], 7, 5, use_map=True)
    sums = draft_metrics(draft, target, loss_mask, 0.0, d2t=d2t, cu_seqlens=cu_seqlens)
    assert torch.equal(sums.accept, sums.matches) and sums.matches.sum() > 0


def test_two_batches_combined_equal_the_packed_batch_exactly():
    """Per-pair values on the 2**-24 grid make every sum exact: the order (here, two
    batches added afterwards) changes no bit. Temperatures from 0.02 to 2.7 spread the
    per-pair values over many binades, where plain float64 sums of them do depend on
    the order (they did for two of these seeds)."""
    seq_lens = [5, 8, 3, 6]
    for seed in range(10):
        draft, target, loss_mask, cu_seqlens, d2t = make_batch(seed, 3, seq_lens, 11, 8, use_map=True, agree=0.2)
        temperature = torch.exp(torch.rand(draft.shape[1], generator=torch.Generator().manual_seed(seed)) * 5 - 4)
        options = dict(d2t=d2t, divergence=True)
        whole = draft_metrics(draft, target, loss_mask, temperature, cu_seqlens=cu_seqlens, **options)
        cut = 13  # after the first two sequences
        first = draft_metrics(draft[:, :cut], target[:cut], loss_mask[:cut], temperature[:cut],
                              cu_seqlens=torch.tensor([0, 5, 13]), **options)  # fmt: skip
        second = draft_metrics(draft[:, cut:], target[cut:], loss_mask[cut:], temperature[cut:],
                               cu_seqlens=torch.tensor([0, 3, 9]), **options)  # fmt: skip
        for name, a, b in zip(DraftMetricSums._fields, combine(first, second), whole, strict=True):
            assert torch.equal(a, b), (seed, name)
        assert (whole.accept != whole.accept.round()).all()  # sums of fractions, not integers


def test_compiled_fullgraph_without_recompiles_across_lengths(device):
    def evaluate(draft, target, loss_mask, cu_seqlens, temperature, d2t):
        sums = draft_metrics(draft, target, loss_mask, temperature, d2t=d2t, cu_seqlens=cu_seqlens, divergence=True)
        at_one_temperature = draft_metrics(draft, target, loss_mask, 0.5, d2t=d2t, cu_seqlens=cu_seqlens)
        return sums, finalize(combine(sums, sums)), at_one_temperature

    compiled = fresh_compile(evaluate, fullgraph=True, dynamic=True)
    with CompileCounts.measure() as counts:
        for seed, seq_lens in enumerate(([4, 9, 7], [6, 11, 12], [10, 19, 8])):  # T = 20, 29, 37
            draft, target, loss_mask, cu_seqlens, d2t = make_batch(seed, 3, seq_lens, 23, 17, use_map=True,
                                                                   dtype=torch.bfloat16)  # fmt: skip
            temperature = torch.rand(draft.shape[1], generator=torch.Generator().manual_seed(seed)) * 1.5
            args = to(device, draft, target, loss_mask, cu_seqlens, temperature, d2t)
            for got, want in zip(compiled(*args), evaluate(*args), strict=True):
                for a, b in zip(got, want, strict=True):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert counts.graph_breaks == 0 and counts.compiles == 1 and counts.restarts == 0


def test_logits_that_require_grad_are_evaluated_without_autograd_state():
    draft, target, loss_mask, cu_seqlens, _ = make_batch(1, 2, [5, 4], 6, 6, use_map=False)
    draft.requires_grad_(True)
    sums = draft_metrics(draft * 1.0, target, loss_mask, 1.0, cu_seqlens=cu_seqlens, divergence=True)
    assert not any(field.requires_grad for field in sums)


def test_bad_input_names_the_argument():
    draft, target, loss_mask, cu_seqlens, d2t = make_batch(0, 2, [4, 3], 6, 4, use_map=True)
    base = dict(draft_logits=draft, target_logits=target, loss_mask=loss_mask, cu_seqlens=cu_seqlens, d2t=d2t)
    bad = [
        ("draft_logits", dict(draft_logits=draft[0])),
        ("target_logits", dict(target_logits=target[:-1])),
        ("loss_mask", dict(loss_mask=loss_mask.float())),
        ("loss_mask", dict(loss_mask=loss_mask[:-1])),
        ("cu_seqlens", dict(cu_seqlens=cu_seqlens[None])),
        ("temperature", dict(temperature=True)),
        ("temperature", dict(temperature=torch.ones(3))),
        ("divergence", dict(divergence=None)),
        ("d2t", dict(d2t=None)),
    ]
    for name, change in bad:
        kwargs = {**base, **change}
        with pytest.raises(ValueError, match=name):
            draft_metrics(kwargs.pop("draft_logits"), kwargs.pop("target_logits"), **kwargs)


def test_any_python_int_top_k_off_or_on_as_its_value():
    """top_k is off at <= 0 and at >= the vocabulary, whatever its size (2**40 is
    off, not an int32 overflow), and otherwise a cut: as a Python int or a tensor."""
    draft, target, loss_mask, cu_seqlens, d2t = make_batch(2, 2, [5, 4], 13, 9, use_map=True)
    args = (draft, target, loss_mask, 0.8)
    kwargs = dict(d2t=d2t, cu_seqlens=cu_seqlens)
    untruncated = draft_metrics(*args, **kwargs)
    for off in (2**40, 13, 0, -(2**40)):
        got = draft_metrics(*args, top_k=off, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(got, untruncated, strict=True)), off
    as_number = draft_metrics(*args, top_k=3, **kwargs)
    as_tensor = draft_metrics(*args, top_k=torch.tensor(3), **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(as_number, as_tensor, strict=True))
    assert not torch.equal(as_number.accept, untruncated.accept)


def test_one_graph_from_a_single_sequence_on(device):
    """A first call with one sequence compiles the graph every later sequence count
    reuses (a slice of size S was size 1 there, and a dynamic graph specialised on
    it: a second compile at S = 3)."""

    def evaluate(draft, target, loss_mask, cu_seqlens, d2t):
        return draft_metrics(draft, target, loss_mask, 0.5, d2t=d2t, cu_seqlens=cu_seqlens)

    compiled = fresh_compile(evaluate, fullgraph=True, dynamic=True)
    with CompileCounts.measure() as counts:
        for seed, seq_lens in enumerate(([25], [6, 11, 12], [4, 9, 7, 8, 1])):
            args = to(device, *make_batch(seed, 3, seq_lens, 23, 17, use_map=True))
            for a, b in zip(compiled(*args), evaluate(*args), strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert counts.graph_breaks == 0 and counts.compiles == 1 and counts.restarts == 0


# (top_k, top_p, min_p) of the truncation tests: each rule alone, and all three
TRUNCATIONS = [(3, 1.0, 0.0), (0, 0.7, 0.0), (0, 1.0, 0.25), (5, 0.85, 0.05)]


def truncation_case(seed, per_start: bool, probs: bool = False, seq_lens=(6, 9, 4)):
    """A packed batch with a map (V = 13, Vd = 9) and its sampling: one temperature
    and TRUNCATIONS[seed % 4] for every start, or per start (greedy, 0.6, 1.3 in turn,
    each start one of TRUNCATIONS) as [T] tensors. Returns (args, kwargs of
    draft_metrics, the spec's sums, the spec's untruncated sums, the top-p margins)."""
    seq_lens = list(seq_lens)
    draft, target, loss_mask, cu_seqlens, d2t = make_batch(seed, 3, seq_lens, 13, 9, use_map=True, agree=0.4)
    if probs:
        target = torch.softmax(target, -1)
    total = draft.shape[1]
    if per_start:
        temps = [(0.0, 0.6, 1.3)[t % 3] for t in range(total)]
        truncations = [TRUNCATIONS[(t // 3 + seed) % 4] for t in range(total)]
        temperature = torch.tensor(temps)
        columns = list(zip(*truncations, strict=True))
        kwargs = dict(top_k=torch.tensor(columns[0]), top_p=torch.tensor(columns[1]), min_p=torch.tensor(columns[2]))
    else:
        temps, truncations = [0.8] * total, [TRUNCATIONS[seed % 4]] * total
        temperature = 0.8
        kwargs = dict(zip(("top_k", "top_p", "min_p"), TRUNCATIONS[seed % 4], strict=True))
    margins = []
    want = spec.draft_metric_sums([[row.tolist() for row in draft[k].double()] for k in range(3)],
                                  [row.tolist() for row in target.double()], loss_mask.tolist(), temps, seq_lens,
                                  d2t.tolist(), probs, truncations, margins)  # fmt: skip
    untruncated = spec_sums(draft, target, loss_mask, temps, seq_lens, d2t, probs)
    args = (draft, target, loss_mask, temperature)
    return args, dict(kwargs, d2t=d2t, cu_seqlens=cu_seqlens, target_is_probs=probs), want, untruncated, margins


def assert_truncated_sums(sums, want, untruncated, divergence):
    for name in EXACT_FIELDS:
        assert getattr(sums, name).tolist() == want[name], name
    assert_float_close(sums.accept, want["accept"])
    if divergence:  # the head's fit to the whole target: untruncated
        assert_float_close(sums.cross_entropy, untruncated["cross_entropy"])
        assert_float_close(sums.kl, untruncated["kl"])
    # The truncation changed Σ min(p, q): the comparison has power.
    assert max(abs(a - b) for a, b in zip(want["accept"], untruncated["accept"], strict=True)) > 0.05


@pytest.mark.kernel
@pytest.mark.parametrize(
    ("seed", "per_start", "probs", "divergence"),
    [(0, False, False, False), (1, False, True, True), (2, False, False, True), (3, False, False, False),
     (4, True, False, True), (5, True, True, False)],
)  # fmt: skip
def test_truncated_acceptance_matches_the_spec(device, seed, per_start, probs, divergence):
    """Σ min(p~, q~) per step against the plain loop: each draft row and target row
    truncated by specs.truncation (sorted lists, float64), then Σ min over the draft
    ids; greedy starts untruncated; matches, counts and the divergences as untruncated."""
    args, kwargs, want, untruncated, margins = truncation_case(seed, per_start, probs)
    assert min(margins) > 1e-4, min(margins)  # no top-p decision within float rounding of its boundary
    sums = draft_metrics(*to(device, *args), **dict(zip(kwargs, to(device, *kwargs.values()), strict=True)),
                         divergence=divergence)  # fmt: skip
    assert_truncated_sums(DraftMetricSums(*to("cpu", *sums)), want, untruncated, divergence)


def test_truncated_metrics_compile_fullgraph_once(device):
    """Both truncation paths (one setting for all starts, as Python numbers; per-start
    tensors) in one Inductor graph, fullgraph, no recompile for batches of other
    lengths and other per-start values; equal to the spec."""

    def evaluate(uniform_args, uniform_kwargs, per_start_args, per_start_kwargs):
        return (draft_metrics(*uniform_args, **uniform_kwargs, divergence=True),
                draft_metrics(*per_start_args, **per_start_kwargs))  # fmt: skip

    compiled = fresh_compile(evaluate, fullgraph=True, dynamic=True)
    with CompileCounts.measure() as counts:
        # The same numbers (TRUNCATIONS[3]); in one call the two batches' sizes differ, or
        # duck sizing would tie them together.
        for seed, lengths, other_lengths in ((3, (6, 9, 5, 2), (6, 9, 4)), (7, (5, 11, 8), (7, 3, 12, 2, 5))):
            uniform = truncation_case(seed, False, seq_lens=lengths)
            per_start = truncation_case(seed + 1, True, seq_lens=other_lengths)
            inputs = []
            for args, kwargs, *_ in (uniform, per_start):
                inputs += [to(device, *args), dict(zip(kwargs, to(device, *kwargs.values()), strict=True))]
            got = compiled(*inputs)
            for sums, (_, _, want, untruncated, margins), divergence in zip(got, (uniform, per_start), (True, False),
                                                                           strict=True):  # fmt: skip
                assert min(margins) > 1e-4
                assert_truncated_sums(DraftMetricSums(*to("cpu", *sums)), want, untruncated, divergence)
    assert counts.graph_breaks == 0 and counts.compiles == 1 and counts.restarts == 0


def test_truncation_arguments_are_checked():
    draft, target, loss_mask, cu_seqlens, d2t = make_batch(0, 2, [4, 3], 6, 4, use_map=True)
    for kwargs, message in [
        (dict(top_k=2.0), "top_k must be an int"),
        (dict(top_k=True), "top_k must be an int"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=float("nan")), r"top_p must be in \(0, 1\]"),
        (dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
        (dict(min_p="0.1"), "min_p must be a number"),
        (dict(top_p=torch.ones(7, dtype=torch.float64)), "top_p must have dtype"),
        (dict(top_k=torch.ones(3, dtype=torch.int32)), "top_k must have shape"),
    ]:
        with pytest.raises(ValueError, match=message):
            draft_metrics(draft, target, loss_mask, 0.8, d2t=d2t, cu_seqlens=cu_seqlens, **kwargs)
