"""Plain-Python oracles for the sampling tests: the counter-based hash on Python
ints (as documented in ops/sampling/noise.py), draft sampling and rejection sampling
one request at a time in float64, and chi-square / normal thresholds for the
statistical tests (no scipy: closed forms, inverted by bisection)."""

import math

MASK = 0xFFFFFFFF
STREAM_DRAFT, STREAM_ACCEPT, STREAM_SAMPLE = 0, 1, 2


# --------------------------------------------------------------------- the hash


def fmix(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & MASK
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & MASK
    return x ^ (x >> 16)


def absorb(key: int, word: int) -> int:
    return fmix(((key ^ word) + 0x9E3779B9) & MASK)


def row_key(seed: int, position: int, salt: int, stream: int) -> int:
    key = 0x243F6A88
    for word in (salt, stream, seed & MASK, (seed >> 32) & MASK, position & MASK, (position >> 32) & MASK):
        key = absorb(key, word)
    return key


def bits(key: int, token: int) -> int:
    return fmix((token * 0x9E3779B9 + key) & MASK)


def uniform(b: int) -> float:
    """The acceptance tests' uniform, 23 bits."""
    return ((b >> 9) + 0.5) / 2**23


def tail_complement(b: int) -> float | None:
    """1 - (b + 0.5) / 2**32 where b's top 9 bits are set (a tail lane), else None."""
    return ((b ^ MASK) + 0.5) / 2**32 if b >> 23 == 511 else None


def exponential(b: int) -> float:
    """-log U, U = (b + 0.5) / 2**32: from the complement where U > 1 - 2**-9, else
    from the 23-bit uniform."""
    v = tail_complement(b)
    return -math.log(uniform(b)) if v is None else -math.log1p(-v)


def gumbel(b: int) -> float:
    return -math.log(exponential(b))


# ------------------------------------------------------------------- samplers


def first_argmax(values) -> int:
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def softmax(values, temperature: float):
    z = [v / temperature for v in values]
    m = max(z)
    e = [math.exp(v - m) for v in z]
    s = sum(e)
    return [v / s for v in e]


def truncate(row, cut):
    """The row with every value below the cut at -inf (the samplers' logit_cut: those
    tokens get probability 0); cut None: the row. NaN stays NaN (never below)."""
    return list(row) if cut is None else [-math.inf if v < cut else v for v in row]


def draft_sample(logits, temperature, seed, position, salt, cut=None):
    """One request: logits a list of floats; cut: its logit cut or None (greedy
    requests ignore it)."""
    if temperature <= 0:
        return first_argmax(logits)
    logits = truncate(logits, cut)
    key = row_key(seed, position, salt, STREAM_DRAFT)
    return first_argmax([x / temperature + gumbel(bits(key, i)) for i, x in enumerate(logits)])


def rejection_sample(drafts, num_draft, draft_probs, target, temperature, seed, position, salt, cuts=None):
    """One request. drafts: K ints; draft_probs: K lists or None; target: K+1 lists;
    cuts: K+1 logit cuts of the target rows, or None (greedy requests ignore them).
    Returns (tokens of length K+1, accepted count)."""
    num_spec, vocab = len(drafts), len(target[0])
    if cuts is not None and temperature > 0:
        target = [truncate(row, cut) for row, cut in zip(target, cuts, strict=True)]
    n = min(max(num_draft, 0), num_spec)
    count = 0
    if temperature <= 0:
        while count < n and drafts[count] == first_argmax(target[count]):
            count += 1
        emitted = first_argmax(target[count])
    else:
        while count < n:
            d = drafts[count]
            if not 0 <= d < vocab:
                break
            p = softmax(target[count], temperature)[d]
            q = 1.0 if draft_probs is None else draft_probs[count][d]
            u = uniform(bits(row_key(seed, position + count, salt, STREAM_ACCEPT), 0))
            if u * q > p:
                break
            count += 1
        key = row_key(seed, position + count, salt, STREAM_SAMPLE)
        e = [exponential(bits(key, i)) for i in range(vocab)]
        if count < n:
            p = softmax(target[count], temperature)
            if draft_probs is None:
                q = [1.0 if i == drafts[count] else 0.0 for i in range(vocab)]
            else:
                q = draft_probs[count]
            race = [max(p[i] - q[i], 0.0) / e[i] for i in range(vocab)]
            emitted = first_argmax(race) if max(race) > 0 else first_argmax([p[i] / e[i] for i in range(vocab)])
        else:
            emitted = first_argmax([x / temperature - math.log(e[i]) for i, x in enumerate(target[count])])
    tokens = list(drafts[:count]) + [emitted] + [-1] * (num_spec - count)
    return tokens, count


# ------------------------------------------------------------------ thresholds


def chi2_sf(x: float, dof: int) -> float:
    """P(X > x) for a chi-square variable with `dof` degrees of freedom."""
    half = x / 2
    if dof % 2 == 0:
        term, total = 1.0, 1.0
        for i in range(1, dof // 2):
            term *= half / i
            total += term
        return math.exp(-half) * total
    total = math.erfc(math.sqrt(half))
    term = math.sqrt(2 * x / math.pi) * math.exp(-half)
    for i in range(1, (dof + 1) // 2):
        total += term
        term *= x / (2 * i + 1)
    return total


def _invert(sf, p: float) -> float:
    low, high = 0.0, 1e4
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if sf(mid) > p else (low, mid)
    return high


def chi2_threshold(dof: int, p: float = 1e-6) -> float:
    return _invert(lambda x: chi2_sf(x, dof), p)


def normal_threshold(p: float = 1e-6) -> float:
    """|Z| above this has two-sided probability p."""
    return _invert(lambda z: math.erfc(z / math.sqrt(2)), p)


def chi_square(counts, probs) -> float:
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs, strict=True))


def poisson_two_sided_p(count: int, mean: float) -> float:
    """Two-sided p-value of `count` under Poisson(mean): twice the smaller tail."""

    def pmf(k: int) -> float:
        return math.exp(k * math.log(mean) - mean - math.lgamma(k + 1))

    below = sum(pmf(k) for k in range(count + 1))
    above = 1.0 - sum(pmf(k) for k in range(count))
    return min(1.0, 2 * min(below, above))
