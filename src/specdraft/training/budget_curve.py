"""Budgeted verification measured on data: the acceptance a head keeps when each
start verifies only the drafts that pay off, against the same number of drafts
verified as a fixed K (what `SpeculativeDecoder(budget=...)` does in serving).

Gains. Draft k of start t (k = 0 .. K-1) has the expected gain
g[k, t] = s[0, t] * ... * s[k, t], its survival estimates' product, each estimate
clamped to [0, 1] and NaN read as 0 (generation.budget.survival_rates): the order
in which budgeted verification keeps positions. For a chain head the estimate is
the draft's confidence at step k, the largest probability of its distribution there
(at the temperature, inside the truncation; at T = 1 when greedy); for a DSpark head
its confidence head's sigmoid. A budget of N drafts keeps the batch's N positions of
largest gain; over a batch of many starts that is a threshold on the gain, and a
threshold keeps a prefix of every start's drafts, since g never rises along a chain.
The curve here is that limit: every start ranked against every other start of the
data, where a serving batch of B requests ranks only its own B (a small batch
allocates less well than the curve says).

Bins. Sums are kept per bin of the gain, bin(g) = floor(-BINS_PER_OCTAVE * log2 g)
clamped to [0, NUM_BINS - 1]: bin 0 holds g = 1, each bin an eighth of an octave
below it, the last one 0 and everything below 2**-31.875. Keeping bins 0 .. b is
the threshold g > 2**(-(b + 1) / 8) (at the bins' resolution), so the curve is exact
at bin edges; between them `at_budget` interpolates linearly. Keeping every bin
verifies all K drafts of every start: the fixed-K acceptance length, exactly.

Per bin, over full starts (draft_metrics' module docstring):
- drafts: the positions of that gain;
- accepted: those whose drafts 0 .. k all match the target's argmax (greedy
  verification accepts them);
- expected: the product of Σ min(p, q) over drafts 0 .. k (the chance rejection
  sampling accepts them all, at the metrics' temperature and truncation).
"""

from typing import NamedTuple

import torch

from specdraft.generation.budget import survival_rates

BINS_PER_OCTAVE = 8
NUM_BINS = 256


class BudgetCurve(NamedTuple):
    """Per start, keeping gain bins 0 .. b (entry b + 1; entry 0 keeps nothing):
    verified drafts, drafts accepted greedily, drafts accepted in expectation
    (Σ min(p, q)), and the gain threshold (keeps g > threshold at the bins'
    resolution; the last is 0: every draft). float64 [NUM_BINS + 1] each."""

    verified: torch.Tensor
    accepted: torch.Tensor
    expected: torch.Tensor
    threshold: torch.Tensor


class BudgetPoint(NamedTuple):
    """The curve at `verified` drafts per start, and fixed K = verified's whole part
    (plus the fraction's share of draft K + 1) beside it: each an acceptance length
    (accepted drafts per start; add 1 for tokens per target pass)."""

    verified: float
    accepted: float
    expected: float
    fixed_accepted: float
    fixed_expected: float


def gain_bins(survival: torch.Tensor) -> torch.Tensor:
    """[K, T] int64: the bin of every position's gain (module docstring); survival
    [K, T] estimates (any float dtype)."""
    gains = survival_rates(survival).cumprod(dim=0)
    octaves = -torch.log2(gains) * BINS_PER_OCTAVE  # g = 0: +inf, the last bin
    return torch.floor(octaves.clamp(0, NUM_BINS - 1)).long()


def budget_sums(survival: torch.Tensor, accepted: torch.Tensor, expected: torch.Tensor, full: torch.Tensor):
    """(drafts, accepted, expected), float64 [NUM_BINS] each: the sums per gain bin
    over full starts. survival [K, T]; accepted [K, T] 0/1 (drafts 0 .. k all
    matched); expected [K, T] float64 (products of Σ min(p, q)); full [T] bool."""
    bins = torch.where(full, gain_bins(survival), NUM_BINS)  # not a full start: a bin past the last, dropped
    flat = bins.reshape(-1)

    def per_bin(values: torch.Tensor) -> torch.Tensor:
        sums = torch.zeros(NUM_BINS + 1, dtype=torch.float64, device=values.device)
        return sums.index_add_(0, flat, values.reshape(-1).double())[:NUM_BINS]

    return per_bin(torch.ones_like(expected)), per_bin(accepted), per_bin(expected)


def budget_curve(drafts: torch.Tensor, accepted: torch.Tensor, expected: torch.Tensor,
                 starts: torch.Tensor) -> BudgetCurve:  # fmt: skip
    """The curve from the per-bin sums and the number of full starts."""
    zero = drafts.new_zeros(1)

    def cumulative(values: torch.Tensor) -> torch.Tensor:
        return torch.cat([zero, values.cumsum(0)]) / starts

    edges = torch.arange(1, NUM_BINS + 1, dtype=torch.float64, device=drafts.device)
    threshold = torch.cat([drafts.new_ones(1), torch.exp2(-edges / BINS_PER_OCTAVE)])
    threshold[-1] = 0.0
    return BudgetCurve(cumulative(drafts), cumulative(accepted), cumulative(expected), threshold)


def at_budget(curve: BudgetCurve, verified: float, prefix_rates: torch.Tensor,
              expected_prefix_rates: torch.Tensor) -> BudgetPoint:  # fmt: skip
    """The curve at `verified` drafts per start (0 < verified <= K), interpolated
    linearly between bin edges, beside fixed K verifying the same number: the first
    floor(verified) drafts of every start, and the next one for the fraction of starts
    left. prefix_rates [K]: the share of starts whose drafts 0 .. k all match
    (DraftMetrics.accepted_prefix_rate); expected_prefix_rates [K]: the mean product of
    Σ min(p, q) over drafts 0 .. k."""
    num_steps = prefix_rates.shape[0]
    if not 0 < verified <= num_steps:
        raise ValueError(f"budget must be in (0, K = {num_steps}] drafts per start, got {verified!r}")
    xs = curve.verified.tolist()
    right = next((i for i, x in enumerate(xs) if x >= verified), len(xs) - 1)
    left = max(right - 1, 0)
    share = 0.0 if xs[right] == xs[left] else (verified - xs[left]) / (xs[right] - xs[left])

    def between(values: torch.Tensor) -> float:
        return float(values[left]) + share * (float(values[right]) - float(values[left]))

    def fixed(rates: torch.Tensor) -> float:
        whole = int(verified)
        part = float(rates[:whole].sum())
        return part + (verified - whole) * float(rates[whole]) if whole < num_steps else part

    return BudgetPoint(verified, between(curve.accepted), between(curve.expected), fixed(prefix_rates),
                       fixed(expected_prefix_rates))  # fmt: skip
