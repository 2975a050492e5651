"""Plain-Python oracles for ops.budget_keep, from the issue's two statements of it:

- `kept_in_order`: the op's rule, literally: the eligible positions (value >= 0)
  sorted by (value descending, depth ascending, b, i), the first min(budget,
  #eligible) of them kept;
- `best_closed_sum`: the allocation's goal, by brute force: the largest total value
  of any set of exactly min(budget, #eligible) eligible positions closed under
  parents (every kept position's parent kept), over the whole batch.

Values are Python floats (each a float32's value), positions (b, i) pairs."""

import itertools
import math


def eligible_positions(values: list[list[float]]) -> list[tuple[int, int]]:
    return [(b, i) for b, row in enumerate(values) for i, v in enumerate(row) if v >= 0]  # NaN >= 0 is False


def kept_count(values: list[list[float]], budget: int) -> int:
    return min(max(budget, 0), len(eligible_positions(values)))


def kept_in_order(values: list[list[float]], depths: list[list[int]], budget: int) -> set[tuple[int, int]]:
    ranked = sorted(eligible_positions(values), key=lambda p: (-values[p[0]][p[1]], depths[p[0]][p[1]], p[0], p[1]))
    return set(ranked[: kept_count(values, budget)])


def is_closed(kept: set[tuple[int, int]], parents: list[list[int]]) -> bool:
    """Every kept position's parent (-1: none) is kept."""
    return all(parents[b][i] < 0 or (b, parents[b][i]) in kept for b, i in kept)


def best_closed_sum(values: list[list[float]], parents: list[list[int]], budget: int) -> float:
    """The largest sum of values over closed sets of exactly kept_count positions
    (-inf if none is closed, which a caller's precondition rules out)."""
    size = kept_count(values, budget)
    best = -math.inf
    for subset in itertools.combinations(eligible_positions(values), size):
        if is_closed(set(subset), parents):
            best = max(best, math.fsum(values[b][i] for b, i in subset))
    return best
