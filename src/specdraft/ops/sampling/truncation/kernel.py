"""The Triton kernel of `truncation_cut` (this package's docstring defines the cut).

One program per row, a bounded number of passes over the row, no sort:

1. the row's max m (every truncated row);
2. top-k (when on): a search over the logits' order keys for the k-th largest
   candidate: each pass histograms the candidates of the current key interval into
   BINS buckets of 2**s keys each (tl.histogram: a few instructions a token) and
   keeps the bucket where the count at or above it crosses k;
3. top-p (when on): the same search on the candidates' mass (sum of exp((l - m) /
   T)) against top_p times the mass at or above step 2's cut. A histogram has no
   weights, so a pass brackets each bucket's mass between count x the weights of its
   lowest and highest keys (mass_search), and only where no bucket is sure falls
   back to exact masses at PIVOTS keys (a [MASS_BLOCK, PIVOTS] comparison);
4. the cut's value: the key the last search stopped at, decoded; only where no
   search moved (min-p alone, or fewer than k candidates), one more pass takes the
   smallest candidate.

The min-p threshold needs only m, so it is no pass of its own: every pass of steps
2-4 drops the tokens below it ("candidates" are the tokens at or above it, never
-inf or NaN).

Order keys: an fp32 value's bits as an int32, the negative ones' magnitude bits
flipped, is monotone in the value; bf16 (fp16) logits leave the low 16 (13) bits
of their fp32 value zero, so the key shifted right by SHIFT = 16 (13) is still
one-to-one on them and the search covers 2**16 (2**19) keys instead of 2**32. A
count pass cuts the interval by BINS (ceil((32 - SHIFT) / log2(BINS)) passes at
most: 4 for fp32, 2 for bf16, 3 for fp16 with 256 bins); a bracketing mass pass
by up to BINS, a fallback pass by PIVOTS + 1; fewer when min-p narrows the interval. Passes
per truncated row: 1 + those of each search that is on, + 1 where no search moved.
Each pass streams the row in tiles of BLOCK (MASS_BLOCK) tokens: a tile is the
loads one program has in flight, and a row is read by one program, so small tiles
leave a pass waiting on memory latency (256-token tiles took ~570 us a pass at B =
256, V = 152k on an H200).

A count at a key is exact, so top-k's search finds the exact k-th candidate. The
masses a pass computes never decrease as the key decreases (sums of non-negative
terms), so the buckets or pivots that pass are a prefix; across passes a mass at
one key may be summed differently (tiles, or count x weight) by rounding. Against
the sort-based reference (an fp64 cumulative sum of the same fp32 weights), a top-p
decision can differ only where the mass at a cut is within rounding of top_p times
the total: each weight's exp may differ by an ulp or two between implementations
(about 1e-7 of the total in all), and the tiles' fp32 sums by a few 1e-8. One tail token at top_p = 0.99 and
V = 152k weighs about 1e-5 of the total; a bf16 row's tie groups weigh far more.
"""

from ...backend import tl, triton


@triton.jit
def row_rules(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab):
    """A row's parameters, which rules are on, and `truncated`: the row is cut at all
    (T > 0 and finite, and some rule on)."""
    temp = tl.load(temperature_ptr + row)
    top_k = tl.load(top_k_ptr + row).to(tl.int64)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    top_k_on = (top_k > 0) & (top_k < vocab)
    top_p_on = top_p < 1.0
    min_p_on = min_p > 0.0
    truncated = (temp > 0.0) & (temp < float("inf")) & (top_k_on | top_p_on | min_p_on)
    return temp, top_k, top_p, min_p, top_k_on, top_p_on, min_p_on, truncated


@triton.jit
def order_key(x, SHIFT: tl.constexpr):
    """The int32 key of fp32 x (no NaN; -0.0 counts as +0.0 only if the caller
    canonicalised it), monotone in x, shifted right by SHIFT."""
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return key >> SHIFT


@triton.jit
def key_value(key, SHIFT: tl.constexpr):
    """The fp32 value whose order_key is `key` (int32), for values of the logits'
    dtype: the bits SHIFT dropped are zero in the value, so all ones in a negative
    value's key."""
    full = key << SHIFT
    full = tl.where(key < 0, full | ((1 << SHIFT) - 1), full)
    bits = tl.where(full >= 0, full, full ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def clean(x):
    """NaN -> -inf (never kept), -0.0 -> +0.0 (one key for equal values)."""
    x = tl.where(x == x, x, float("-inf"))
    return tl.where(x == 0.0, 0.0, x)


@triton.jit
def load_clean(row_ptr, idx, vocab):
    return clean(tl.load(row_ptr + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32))


@triton.jit
def min_p_threshold(top, temp, min_p, on):
    """The smallest fp32 t >= top + T * ln(min_p), the sum taken in fp64 (min_p
    above 1 counts as 1, whose log is 0 exactly: the max's ties alone); -inf when
    min-p is off or the sum is NaN (a +inf max with an overflowing T * ln)."""
    ratio = tl.where(on, tl.minimum(min_p, 1.0), 1.0).to(tl.float64)  # no log of 0 or below when off
    span = tl.where(ratio >= 1.0, 0.0, temp.to(tl.float64) * tl.log(ratio))
    exact = top.to(tl.float64) + span
    thr = exact.to(tl.float32)
    # Round up, so that a logit l passes l >= thr exactly when l >= the fp64 sum.
    up = key_value(order_key(thr, 0) + 1, 0)
    thr = tl.where(thr.to(tl.float64) < exact, up, thr)
    return tl.where(on & (exact == exact), thr, float("-inf"))


@triton.jit
def is_candidate(x, thr):
    """At or above the min-p threshold, and not -inf (nor NaN, cleaned to -inf)."""
    return (x >= thr) & (x > float("-inf"))


@triton.jit
def candidate_keys(x, thr, SHIFT: tl.constexpr):
    """Keys of the candidates; below every key a search visits elsewhere (-2139095041
    is the key of -inf: 0xFF800000 with its low 31 bits flipped)."""
    return tl.where(is_candidate(x, thr), order_key(x, SHIFT), (-2139095041 >> SHIFT) - 1)


@triton.jit
def candidate_weights(x, thr, top, temp):
    """exp((x - top) / T) for candidates (1 at the max, so a +inf max weighs 1), 0
    elsewhere."""
    at_top = x == top
    # Subtracted where x != top only: inf - inf (a +inf max) would be NaN.
    w = tl.where(at_top, 1.0, tl.exp((tl.where(at_top, 0.0, x) - tl.where(at_top, 0.0, top)) / temp))
    return tl.where(is_candidate(x, thr), w, 0.0)


@triton.jit
def row_max(row_ptr, vocab, BLOCK: tl.constexpr):
    top = tl.full([BLOCK], float("-inf"), tl.float32)
    for off in range(0, vocab, BLOCK):
        top = tl.maximum(top, load_clean(row_ptr, off + tl.arange(0, BLOCK), vocab))
    return tl.max(top, 0)


@triton.jit
def mass_pass(row_ptr, vocab, pivots, base, thr, top, temp,
              SHIFT: tl.constexpr, BLOCK: tl.constexpr, PIVOTS: tl.constexpr):  # fmt: skip
    """One pass: the mass of the candidates at or above each pivot, and at or above
    `base`. A tile's mass is summed in fp32, the tiles' in fp64: a 152k row in
    256-token tiles has 594 of them, whose fp32 running sum would drift by ~1e-5 of
    the total, the size of one tail token's mass at top_p = 0.99, and move the cut."""
    hits = tl.zeros([PIVOTS], tl.float64)
    total = tl.zeros([], tl.float64)
    for off in range(0, vocab, BLOCK):
        x = load_clean(row_ptr, off + tl.arange(0, BLOCK), vocab)
        key = candidate_keys(x, thr, SHIFT)
        w = candidate_weights(x, thr, top, temp)
        hits += tl.sum(tl.where(key[:, None] >= pivots[None, :], w[:, None], 0.0), 0).to(tl.float64)
        total += tl.sum(tl.where(key >= base, w, 0.0), 0).to(tl.float64)
    return hits, total


@triton.jit
def bucket_shift(lo, hi, BINS: tl.constexpr):
    """The smallest s with the keys [lo, hi) in BINS buckets of 2**s keys."""
    shift = tl.zeros([], tl.int32)
    while ((hi - lo - 1) >> shift) >= BINS:
        shift += 1
    return shift


@triton.jit
def bucket_pass(row_ptr, vocab, lo, hi, shift, value_lo, inv_width, base, thr, top, temp, BY_VALUE: tl.constexpr,
                MASS: tl.constexpr, SHIFT: tl.constexpr, BLOCK: tl.constexpr, BINS: tl.constexpr):  # fmt: skip
    """One pass: the candidates of each bucket b (keys lo + [b * 2**shift, (b + 1) *
    2**shift), within [lo, hi); BY_VALUE: logits value_lo + [b, b + 1) / inv_width, up
    to fp32 rounding) and those at or above hi; MASS: also the mass at or
    above hi and at or above `base` (a tile's in fp32, the tiles' in fp64: a 152k row
    in 256-token tiles has 594 of them, whose fp32 running sum would drift by ~1e-5
    of the total, the size of one tail token's mass at top_p = 0.99)."""
    counts = tl.zeros([BINS], tl.int32)
    above = tl.zeros([], tl.int32)
    above_mass = tl.zeros([], tl.float64)
    total = tl.zeros([], tl.float64)
    # Per token in int32 (int64 is two instructions a step): keys and the bounds fit
    # it, and key - lo, up to 2**32 - 1, wraps into the right uint32.
    lo32, hi32, base32 = lo.to(tl.int32), hi.to(tl.int32), base.to(tl.int32)
    for off in range(0, vocab, BLOCK):
        x = load_clean(row_ptr, off + tl.arange(0, BLOCK), vocab)
        key = candidate_keys(x, thr, SHIFT)
        inside = (key >= lo32) & (key < hi32)
        if BY_VALUE:
            offset = tl.minimum(((x - value_lo) * inv_width).to(tl.int32), BINS - 1)
        else:
            offset = ((key - lo32).to(tl.uint32, bitcast=True) >> shift.to(tl.uint32)).to(tl.int32)
        counts += tl.histogram(tl.where(inside, offset, 0).to(tl.int32), BINS, mask=inside)
        above += tl.sum((key >= hi32).to(tl.int32), 0)
        if MASS:
            w = candidate_weights(x, thr, top, temp)
            above_mass += tl.sum(tl.where(key >= hi32, w, 0.0), 0).to(tl.float64)
            total += tl.sum(tl.where(key >= base32, w, 0.0), 0).to(tl.float64)
    return counts, above, above_mass, total


@triton.jit
def suffix_sums(values):
    """Per bucket, the sum of its value and those of every bucket above it."""
    return tl.sum(values, 0) - tl.cumsum(values, 0) + values


@triton.jit
def count_search(row_ptr, vocab, lo, hi, top_k, thr,
                 SHIFT: tl.constexpr, BLOCK: tl.constexpr, BINS: tl.constexpr):  # fmt: skip
    """The largest key t in [lo, hi) with at least top_k candidates at or above it;
    lo where none has (lo counts as passing, hi as failing). Keys are int64 here.
    The count at or above a bucket's first key is the candidates at or above hi plus
    the buckets' counts from it up."""
    bins = tl.arange(0, BINS)
    while hi - lo > 1:
        shift = bucket_shift(lo, hi, BINS)
        counts, above, _, _ = bucket_pass(row_ptr, vocab, lo, hi, shift, 0.0, 0.0, lo, thr, 0.0, 1.0,
                                          False, False, SHIFT, BLOCK, BINS)  # fmt: skip
        starts = lo + (bins.to(tl.int64) << shift)
        passing = (above + suffix_sums(counts) >= top_k) & (starts < hi)
        # Passing buckets are a prefix (counts at or above never grow with the key).
        last = tl.max(tl.where(passing, bins, 0), 0).to(tl.int64)
        hi = tl.minimum(hi, lo + ((last + 1) << shift))
        lo = lo + (last << shift)
    return lo


@triton.jit
def weight_at(value, top, temp):
    """exp((value - top) / T), 1 at or above top: a candidate's weight as a function
    of its logit, for bounds."""
    return tl.where(value >= top, 1.0, tl.exp((tl.minimum(value, top) - top) / temp)).to(tl.float64)


@triton.jit
def key_buckets_step(row_ptr, vocab, lo, hi, base, top_p, thr, top, temp,
                     SHIFT: tl.constexpr, BLOCK: tl.constexpr, BINS: tl.constexpr):  # fmt: skip
    """One bracketing pass over buckets of 2**s keys: (new lo, new hi)."""
    bins = tl.arange(0, BINS)
    shift = bucket_shift(lo, hi, BINS)
    counts, _, above_mass, total = bucket_pass(row_ptr, vocab, lo, hi, shift, 0.0, 0.0, base, thr, top, temp,
                                               False, True, SHIFT, BLOCK, BINS)  # fmt: skip
    target = top_p.to(tl.float64) * total
    starts = lo + (bins.to(tl.int64) << shift)
    inside = starts < hi
    lasts = tl.minimum(starts + (1 << shift), hi) - 1
    lightest = candidate_weights(key_value(starts.to(tl.int32), SHIFT), thr, top, temp).to(tl.float64)
    heaviest = candidate_weights(key_value(lasts.to(tl.int32), SHIFT), thr, top, temp).to(tl.float64)
    number = tl.where(inside, counts, 0).to(tl.float64)
    sure_pass = (above_mass + suffix_sums(number * lightest) >= target) & inside
    sure_fail = (above_mass + suffix_sums(number * heaviest) < target) & inside & (bins > 0)
    return tl.max(tl.where(sure_pass, starts, lo), 0), tl.min(tl.where(sure_fail, starts, hi), 0)


@triton.jit
def value_buckets_step(row_ptr, vocab, lo, hi, value_lo, width, base, top_p, thr, top, temp,
                       SHIFT: tl.constexpr, BLOCK: tl.constexpr, BINS: tl.constexpr):  # fmt: skip
    """One bracketing pass over buckets of equal logit width (a bucket's weights then
    differ by exp(width / T), where key buckets near the max span whole binades):
    (new lo, new hi). A token lands in bucket b up to fp32 rounding, so each bound
    reaches one bucket further (from b - 1's start to b + 2's), and the new interval
    is taken one bucket wider on each side."""
    bins = tl.arange(0, BINS)
    counts, _, above_mass, total = bucket_pass(row_ptr, vocab, lo, hi, 0, value_lo, 1.0 / width, base, thr, top,
                                               temp, True, True, SHIFT, BLOCK, BINS)  # fmt: skip
    target = top_p.to(tl.float64) * total
    edges = value_lo + bins.to(tl.float32) * width
    number = counts.to(tl.float64)
    lightest = weight_at(edges - width, top, temp)
    heaviest = weight_at(edges + 2 * width, top, temp)
    sure_pass = above_mass + suffix_sums(number * lightest) >= target
    sure_fail = (above_mass + suffix_sums(number * heaviest) < target) & (bins > 0)
    last_pass = tl.max(tl.where(sure_pass, bins, 0), 0)
    first_fail = tl.min(tl.where(sure_fail, bins, BINS), 0)
    pass_key = order_key(value_lo + (last_pass - 1).to(tl.float32) * width, SHIFT).to(tl.int64)
    fail_key = order_key(value_lo + (first_fail + 1).to(tl.float32) * width, SHIFT).to(tl.int64) + 1
    new_lo = tl.where(last_pass >= 1, tl.minimum(tl.maximum(lo, pass_key), hi - 1), lo)
    new_hi = tl.where(first_fail < BINS, tl.maximum(tl.minimum(hi, fail_key), new_lo + 1), hi)
    return new_lo, new_hi


@triton.jit
def top_p_floor(top, temp, top_p, vocab, SHIFT: tl.constexpr):
    """A key that top-p's search may start at (int64): at or below the value t0 =
    top + T * ln((1 - top_p) / (2 * vocab)). Every candidate below t0 weighs less
    than (1 - top_p) / (2 * vocab) of the max's weight (1), all of them less than
    (1 - top_p) / 2 <= (1 - top_p) / 2 x the total (>= 1), so the mass at or above
    t0 is more than top_p x the total: t0 passes, as does any key below it. The
    factor 2 covers t0's rounding to fp32 and the sums' rounding. On a flat row
    (random logits) t0 is far below most logits; on a peaked one (a trained
    model's) it leaves few candidates to search."""
    span = temp.to(tl.float64) * tl.log((1.0 - top_p.to(tl.float64)) / (2.0 * vocab))
    t0 = (top.to(tl.float64) + span).to(tl.float32)
    return order_key(tl.where(t0 == t0, t0, float("-inf")), SHIFT).to(tl.int64)


@triton.jit
def mass_search(row_ptr, vocab, base, hi, top_p, thr, top, temp, SHIFT: tl.constexpr, BLOCK: tl.constexpr,
                BINS: tl.constexpr, MASS_BLOCK: tl.constexpr, PIVOTS: tl.constexpr):  # fmt: skip
    """The largest key t in [base, hi) whose candidates at or above it weigh at least
    top_p times those at or above base; base where none does (base counts as
    passing, hi as failing). Keys are int64 here.

    The search starts at top_p_floor's key, which passes: the candidates below it
    weigh less than (1 - top_p) / 2 of the max's weight in all.

    A pass counts the candidates per bucket (as count_search) and sums the exact
    mass at or above hi and the total; every candidate of a bucket weighs between
    the weights of the bucket's lowest and highest values, so the mass at or above a
    bucket's start lies between two suffix sums of count x weight. Buckets whose
    lower bound passes surely pass, those whose upper bound fails surely fail, and
    the interval shrinks to the buckets between. Buckets are of equal logit width
    while the interval holds more than 4 x BINS keys over more than 1e-3 T of logit
    (value_buckets_step), then of 2**s keys (key_buckets_step; single keys are
    exact: their bounds are equal).
    Where no bucket is sure, a [MASS_BLOCK, PIVOTS] pass of exact masses at PIVOTS
    keys shrinks the interval PIVOTS + 1 times instead."""
    lo = tl.maximum(base, top_p_floor(top, temp, top_p, vocab, SHIFT))
    steps = tl.arange(0, PIVOTS).to(tl.int64) + 1
    while hi - lo > 1:
        value_lo = key_value(lo.to(tl.int32), SHIFT)
        width = (key_value((hi - 1).to(tl.int32), SHIFT) - value_lo) / BINS
        # Equal-width buckets while the interval spans weights that differ by more than
        # 0.1% (key buckets near the max span binades); then key buckets, whose bounds
        # are that tight, and which single out keys where values cannot (near 0 the
        # keys are dense and an interval of values shrinks to subnormals).
        if (hi - lo > 4 * BINS) & (width * BINS > 1e-3 * temp) & (width < float("inf")):
            new_lo, new_hi = value_buckets_step(row_ptr, vocab, lo, hi, value_lo, width, base, top_p, thr, top, temp,
                                                SHIFT, BLOCK, BINS)  # fmt: skip
        else:
            new_lo, new_hi = key_buckets_step(row_ptr, vocab, lo, hi, base, top_p, thr, top, temp, SHIFT, BLOCK, BINS)
        if (new_lo == lo) & (new_hi == hi):
            pivots = lo + ((hi - lo) * steps) // (PIVOTS + 1)
            hits, base_mass = mass_pass(row_ptr, vocab, pivots.to(tl.int32), base.to(tl.int32), thr, top, temp,
                                        SHIFT, MASS_BLOCK, PIVOTS)  # fmt: skip
            passing = hits >= top_p.to(tl.float64) * base_mass
            # Passing pivots are a prefix (hits never grow with the pivot).
            new_lo = tl.max(tl.where(passing, pivots, lo), 0)
            new_hi = tl.min(tl.where(passing, hi, pivots), 0)
        lo = new_lo
        hi = new_hi
    return lo


@triton.jit
def smallest_candidate(row_ptr, vocab, lo, thr, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """The smallest candidate with key >= lo (+inf if none)."""
    low = tl.full([BLOCK], float("inf"), tl.float32)
    for off in range(0, vocab, BLOCK):
        x = load_clean(row_ptr, off + tl.arange(0, BLOCK), vocab)
        low = tl.minimum(low, tl.where(candidate_keys(x, thr, SHIFT) >= lo, x, float("inf")))
    return tl.min(low, 0)


@triton.jit
def truncation_cut_kernel(
    logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, cut_ptr, done_ptr,
    vocab, row_stride,
    SHIFT: tl.constexpr, BLOCK: tl.constexpr, BINS: tl.constexpr, MASS_BLOCK: tl.constexpr,
    PIVOTS: tl.constexpr,
):  # fmt: skip
    """The rows split.py left undone (done[row] == 0); the others return at once."""
    row = tl.program_id(0).to(tl.int64)
    undone = tl.load(done_ptr + row) == 0
    row_ptr = logits_ptr + row * row_stride
    temp, top_k, top_p, min_p, top_k_on, top_p_on, min_p_on, truncated = row_rules(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab
    )
    cut = tl.full([], float("-inf"), tl.float32)
    if undone & truncated:
        top = row_max(row_ptr, vocab, BLOCK)
        if top > float("-inf"):
            thr = min_p_threshold(top, temp, min_p, min_p_on)
            floor = order_key(thr, SHIFT).to(tl.int64)
            lo = floor
            hi = order_key(top, SHIFT).to(tl.int64) + 1
            if top_k_on:
                lo = count_search(row_ptr, vocab, lo, hi, top_k, thr, SHIFT, BLOCK, BINS)
            if top_p_on:
                lo = mass_search(row_ptr, vocab, lo, hi, top_p, thr, top, temp, SHIFT, BLOCK, BINS, MASS_BLOCK, PIVOTS)
            if lo > floor:
                # A search moved: lo passes and lo + 1 fails, so lo is a candidate's key.
                cut = key_value(lo.to(tl.int32), SHIFT)
            else:
                cut = smallest_candidate(row_ptr, vocab, lo.to(tl.int32), thr, SHIFT, BLOCK)
    if undone:
        tl.store(cut_ptr + row, cut)
