"""Plain-Python oracle of truncation_cut, one row at a time: lists, sorted(),
math.exp and math.log in float64 (the rule: ops/sampling/truncation/__init__.py).

min-p, then top-k, then top-p over what those keep; every rule a threshold on the
logit, so ties at the cut are kept; NaN counts as -inf and -inf is never kept by a
truncated row."""

import math

INF = float("inf")


def weight(value: float, top: float, temperature: float) -> float:
    """exp((value - top) / T), 1 at the max (a +inf max weighs 1)."""
    return 1.0 if value == top else math.exp((value - top) / temperature)


def min_p_threshold(top: float, temperature: float, min_p: float) -> float:
    ratio = min(min_p, 1.0)
    threshold = top + (0.0 if ratio >= 1.0 else temperature * math.log(ratio))
    return -INF if math.isnan(threshold) else threshold


def top_p_cut(candidates: list[float], cut: float, top: float, temperature: float, top_p: float):
    """(the largest value c >= cut whose candidates >= c weigh >= top_p of those >=
    cut, the decision's relative margin: how close the mass at c, and at the next
    value above c, come to top_p times the total)."""
    groups: dict[float, float] = {}
    for v in candidates:
        if v >= cut:
            groups[v] = groups.get(v, 0.0) + weight(v, top, temperature)
    total = sum(groups.values())
    mass, above = 0.0, None
    for level in sorted(groups, reverse=True):
        mass += groups[level]
        if mass >= top_p * total:
            margin = (mass - top_p * total) / total
            if above is not None:
                margin = min(margin, (top_p * total - above) / total)
            return level, margin
        above = mass
    raise AssertionError("the last level holds the whole mass")


def truncation_cut(row: list[float], temperature: float, top_k: int, top_p: float, min_p: float):
    """(cut, margin) for one row: the row keeps {i : row[i] >= cut}; margin is the
    smallest relative distance of a top-p decision from its boundary (inf without
    top-p), below which float rounding may decide either way."""
    vocab = len(row)
    values = [-INF if math.isnan(v) else v for v in row]
    top_k_on, top_p_on, min_p_on = 0 < top_k < vocab, top_p < 1.0, min_p > 0.0
    if not (0.0 < temperature < INF) or not (top_k_on or top_p_on or min_p_on):
        return -INF, INF
    top = max(values)
    if top == -INF:
        return -INF, INF
    threshold = min_p_threshold(top, temperature, min_p) if min_p_on else -INF
    candidates = sorted((v for v in values if v >= threshold and v > -INF), reverse=True)
    cut = candidates[min(top_k, len(candidates)) - 1] if top_k_on else candidates[-1]
    if not top_p_on:
        return cut, INF
    return top_p_cut(candidates, cut, top, temperature, top_p)


def kept(row: list[float], cut: float) -> set[int]:
    """The indices a cut keeps: row[i] >= cut (NaN never)."""
    return {i for i, v in enumerate(row) if v >= cut}
