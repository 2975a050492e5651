"""The check of the lossless statistical tests (test_tree_verify_lossless.py,
test_truncated_sampling.py): draws of a sampler against the exact distribution they
should follow. No draw in a cell of probability 0; total variation within a bound
from the sample size (or a fixed limit at the nightly sizes); a chi-square over the
cells of positive probability, small cells pooled, that does not reject at `alpha`."""

import math

from specs.sampling import chi2_threshold


def tv_bound(probs: list[float], n: int, alpha: float) -> float:
    """P(TV > bound) <= alpha for n draws from probs: E[TV] <= sum sqrt(p (1 - p) / n) / 2
    (Jensen), and TV moves by at most 1 / n per draw (McDiarmid)."""
    return sum(math.sqrt(p * (1 - p) / n) for p in probs) / 2 + math.sqrt(math.log(1 / alpha) / (2 * n))


def chi_square_pooled(counts: list[int], probs: list[float]) -> tuple[float, int]:
    """(statistic, dof) over the cells of positive probability, cells expecting
    fewer than 5 draws pooled into one (into the next smallest, if still short)."""
    n = sum(counts)
    cells = sorted((n * p, c) for c, p in zip(counts, probs, strict=True) if p > 0)
    pooled = []
    for expected, observed in cells:
        if pooled and pooled[-1][0] < 5:
            pooled[-1] = (pooled[-1][0] + expected, pooled[-1][1] + observed)
        else:
            pooled.append((expected, observed))
    if len(pooled) > 1 and pooled[-1][0] < 5:
        last = pooled.pop()
        pooled[-1] = (pooled[-1][0] + last[0], pooled[-1][1] + last[1])
    return sum((o - e) ** 2 / e for e, o in pooled), len(pooled) - 1


def verdict(counts: list[int], probs: list[float], alpha: float, tv_limit: float | None = None) -> tuple[bool, str]:
    """(passes, what was measured) for draws `counts` of the distribution `probs`."""
    n = sum(counts)
    impossible = sum(c for c, p in zip(counts, probs, strict=True) if p == 0)
    tv = sum(abs(c / n - p) for c, p in zip(counts, probs, strict=True)) / 2
    limit = tv_bound(probs, n, alpha) if tv_limit is None else tv_limit
    chi2, dof = chi_square_pooled(counts, probs)
    threshold = chi2_threshold(dof, alpha) if dof > 0 else math.inf
    ok = impossible == 0 and tv <= limit and chi2 <= threshold
    return (
        ok,
        f"n={n} impossible={impossible} tv={tv:.5f} (limit {limit:.5f}) chi2={chi2:.1f} (limit {threshold:.1f}, dof {dof})",
    )
