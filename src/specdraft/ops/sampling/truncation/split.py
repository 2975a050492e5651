"""The split-row path of `truncation_cut`: two reads of the logits, each spread over
the whole GPU, then exact work on a few hundred or thousand values a row.

kernel.py's search reads a row with one program, once per pass, and its passes
count or weigh tokens into buckets: a few passes of a row that one program streams.
At B = 256 rows of V = 152k that is 0.1-1 ms, where one read of the logits is 30 us.
Here a row is split over programs of CHUNK tokens, and the logits are read twice:

1. `window_kernel` [R, S]: each chunk's max, and a histogram of its tokens over
   bins of equal logit width w (absolute bins: bin(x) = floor(x / w)), counted from
   the chunk's own top bin down, NB - 1 bins deep (the last bin counts the rest).
   Every chunk's window starts at or below the row's top bin, so shifted to the row's
   top bin the chunks' counts add up exactly for the row's first NB - 1 bins.
2. `bracket_kernel` [R]: the row's max, its min-p threshold, and from the counts a
   range of bins that holds the cut: top-k's k-th candidate is in the bin where the
   count from the top crosses k (exact); top-p's cut near the bin where the mass,
   estimated as count x the bin's mean weight (the max as 1; only top-k's share of
   the k-th's bin), crosses top_p x the estimated total: that bin, its neighbours
   where they fit (else the one on the side the crossing is nearer), and up to the
   next bin above holding a token. w is chosen per row so that the window reaches
   every cut top-p and min-p can make (top_p_floor in kernel.py for top-p, T x
   -ln(min_p) for min-p) and, without top-p, 32 logits for top-k (a guess: a k-th
   below the window is only slower).
3. `collect_kernel` [R, S]: with the range known, each chunk adds up exactly (fp32
   per chunk, fp64 over chunks) the candidates above the range (count and mass) and
   below it, and copies the candidates inside it to a buffer of CAPACITY values a
   row (each takes its place by an atomic add on the row's count); or, for bf16 and
   fp16 logits whose range spans fewer than KEYS order keys (a few logits hold few
   distinct values of those dtypes) and holds many tokens, `count_kernel` counts
   the candidates inside per key (tl.histogram), so a key's mass is its count times
   its value's weight, exactly, with no copy however many tokens the range holds;
4. resolve.py's `resolve_kernel` [R]: the exact cut from the sums and the copied
   values or the counted keys (the k-th candidate by a search over their order
   keys, then top-p's largest value whose mass at or above it reaches top_p x the
   total), or, where the counts show the cut is not in the range (the estimate
   missed, the range held more than CAPACITY values to copy, the window did not
   reach the cut), nothing: the row is left undone.

kernel.py's per-row search then runs for the rows left undone only (the others
return at once). So the cut is exact whatever the estimate: the estimate decides
only which rows take the slow path. Rows with min-p on that maxima.py's path does
not take (top-p on and top-k off, or k above its bound) go to the search from the
start (`row_switches`): measured, its two passes beat these two reads there. The kernels here handle min-p's threshold all the same, so
that choice is one line. Rows with top-k on and k at most V / maxima.py's chunk,
and rows with min-p alone, go to maxima.py's path (min-p rows with top-k among
them): the chunks' maxima instead of a histogram.

Measured on an H200 (B = 256, V = 152k, bf16, random rows): the window pass 98 us
(tl.histogram is most of it: a read with the bins alone is 36 us), the collect pass
145 us for top-k and 400 us for top-p (copying ~3,000 tokens a row by atomic adds
on one count; a scan of each chunk's mask instead: 250 us; 16 counts a row, one a
token's index residue: 392 us, so the atomics' own cost, not one count's
contention), the resolve 5-40 us.

Bins are found by the same fp32 computation in steps 1 and 3 (floor of x / w,
clamped), which is monotone in x, so a bin's tokens are all above those of a lower
bin and the two passes agree on every token's bin.
"""

from ...backend import tl, triton
from .kernel import clean, is_candidate, load_clean, min_p_threshold, order_key, row_rules
from .maxima import on_maxima_path


@triton.jit
def row_switches(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab, maxima_chunks):
    """kernel.py's row_rules, and `split`: the row takes this path."""
    temp, top_k, top_p, min_p, top_k_on, top_p_on, min_p_on, truncated = row_rules(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab
    )
    # min-p rows go to kernel.py's search (its two passes, max and smallest candidate,
    # beat these two reads there: H200, B = 256, V = 152k, 123 against 220 us), or
    # with top-k or alone to maxima.py's path, as do top-k rows with k <= maxima_chunks.
    on_maxima = on_maxima_path(truncated, top_k_on, top_k, top_p_on, min_p_on, maxima_chunks)
    split = truncated & ~min_p_on & ~on_maxima
    return temp, top_k, top_p, min_p, top_k_on, top_p_on, min_p_on, truncated, split


@triton.jit
def bins_per_logit(temp, top_p, top_p_on, min_p, min_p_on, top_k_on, vocab, NB: tl.constexpr):
    """1 / w: the window's first NB - 3 bins reach top-p's floor (T ln(2V / (1 - top_p))
    below the max), min-p's threshold (T ln(1 / min_p) below it) and, for top-k
    without top-p, 32 logits, whichever rules are on; at least T, so w > 0. (With
    top-p on, the k-th counts only above top-p's floor: 32 logits would make the
    bins too coarse for top-p's estimate.)"""
    span = temp
    tail = tl.maximum(1.0 - top_p, 1e-30)  # top_p < 1 when on; NaN is off
    span = tl.where(top_p_on, tl.maximum(span, temp * tl.log(2.0 * vocab / tail)), span)
    ratio = tl.where(min_p_on, tl.minimum(min_p, 1.0), 1.0)
    span = tl.where(min_p_on, tl.maximum(span, -temp * tl.log(ratio)), span)
    span = tl.where(top_k_on & ~top_p_on, tl.maximum(span, 32.0), span)
    # NB - 3 bins: the max sits anywhere in its bin, and the threshold's rounding.
    return (NB - 3) / span


@triton.jit
def bin_of(x, inv_width):
    """floor(x / w), clamped to +-2**29 (-inf and +inf land on the ends), so that
    differences of bins fit an int32."""
    scaled = tl.minimum(tl.maximum(x * inv_width, -536870912.0), 536870912.0)
    return tl.floor(scaled).to(tl.int32)


@triton.jit
def window_kernel(
    logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, chunk_max_ptr, hist_ptr,
    vocab, row_stride, num_chunks, maxima_chunks, hist_stride,
    CHUNK: tl.constexpr, GROUP: tl.constexpr, NB: tl.constexpr,
):  # fmt: skip
    """Step 1, for each of the program's GROUP chunks: the chunk's max and its tokens'
    bins counted from its top bin."""
    row = tl.program_id(0).to(tl.int64)
    temp, _, top_p, min_p, top_k_on, top_p_on, min_p_on, _, split = row_switches(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab, maxima_chunks
    )
    if split:
        inv_width = bins_per_logit(temp, top_p, top_p_on, min_p, min_p_on, top_k_on, vocab, NB)
        for step in range(GROUP):
            chunk = tl.program_id(1) * GROUP + step
            if chunk < num_chunks:
                idx = chunk * CHUNK + tl.arange(0, CHUNK)
                x = load_clean(logits_ptr + row * row_stride, idx, vocab)
                top = tl.max(x, 0)
                tl.store(chunk_max_ptr + row * num_chunks + chunk, top)
                depth = bin_of(top, inv_width) - bin_of(x, inv_width)
                depth = tl.where(x > float("-inf"), tl.minimum(depth, NB - 1), NB - 1)
                counts = tl.histogram(depth, NB)
                tl.store(hist_ptr + (row * num_chunks + chunk) * hist_stride + tl.arange(0, NB), counts)


@triton.jit
def bracket_kernel(
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, chunk_max_ptr, hist_ptr, hist_stride, bounds_ptr, span_ptr,
    count_ptr, cut_ptr, done_ptr, vocab, num_chunks, maxima_chunks, keyed_from,
    NB: tl.constexpr, CHUNKS: tl.constexpr, CAPACITY: tl.constexpr, SHIFT: tl.constexpr, KEYS: tl.constexpr,
):  # fmt: skip
    """Step 2: the row's max and the range to collect. bounds[row] = (max, min-p
    threshold, 1 / w); span[row] = (the range's lowest bin, its highest bin, go), or
    (its lowest key, its highest key, go) when go = 2: go = 1 copies the range's
    values, 2 counts them per key; 0 leaves the row finished (done = 1: not
    truncated, or nothing above -inf) or to another path (done = 0: maxima.py's rows,
    then kernel.py's search, min-p rows among them)."""
    row = tl.program_id(0).to(tl.int64)
    temp, top_k, top_p, min_p, top_k_on, top_p_on, min_p_on, truncated, split = row_switches(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab, maxima_chunks
    )
    go = tl.zeros([], tl.int32)
    done = (~truncated).to(tl.int32)  # truncated rows not split: kernel.py's search
    if split:
        chunks = tl.arange(0, CHUNKS)
        maxima = tl.load(chunk_max_ptr + row * num_chunks + chunks, mask=chunks < num_chunks, other=float("-inf"))
        top = tl.max(maxima, 0)
        inv_width = bins_per_logit(temp, top_p, top_p_on, min_p, min_p_on, top_k_on, vocab, NB)
        done = (top == float("-inf")).to(tl.int32)  # no logit above -inf: kept whole
        # A +inf max (its weights are not exp's) or a width below fp32's: the search.
        if (top > float("-inf")) & (top < float("inf")) & (inv_width < float("inf")):
            top_bin = bin_of(top, inv_width)
            # Each chunk's counts, shifted from its top bin to the row's: bins 0..NB-2.
            shift = tl.where(maxima > float("-inf"), top_bin - bin_of(maxima, inv_width), NB)
            bins = tl.arange(0, NB)
            source = bins[None, :] - shift[:, None]
            inside = (source >= 0) & (source < NB - 1) & (chunks[:, None] < num_chunks)
            chunk_hist = hist_ptr + (row * num_chunks + chunks[:, None]) * hist_stride + source
            counts = tl.sum(tl.load(chunk_hist, mask=inside, other=0), 0)
            thr = min_p_threshold(top, temp, min_p, min_p_on)
            # The threshold's bin: candidates fill the bins above it, part of it, none below.
            thr_bin = tl.where(thr > float("-inf"), top_bin - bin_of(thr, inv_width), NB)
            counts = tl.where((bins <= thr_bin) & (bins < NB - 1), counts, 0)
            in_window = thr_bin < NB - 1  # every candidate lies in the window
            # The smallest candidate lies between the deepest bin above the threshold's
            # that holds a token (all candidates) and the threshold's bin.
            small_lo = tl.maximum(tl.max(tl.where((counts > 0) & (bins < thr_bin), bins, 0), 0), 0)
            small_hi = tl.minimum(thr_bin, NB - 2)
            lo = tl.zeros([], tl.int32)
            hi = tl.full([], NB - 2, tl.int32)
            found = tl.full([], 1, tl.int1)
            kept = counts  # top-p's estimate: the tokens top-k keeps in each bin
            if top_k_on:
                reached = tl.cumsum(counts, 0)
                k_bin = tl.min(tl.where(reached >= top_k, bins, NB), 0)
                # The k-th's bin keeps only k minus those above it (the rest of the
                # bin would move top-p's estimate deeper).
                kept = tl.where(bins == k_bin, (top_k - (reached - counts)).to(tl.int32), counts)
                if k_bin == NB:
                    # Fewer than k tokens in the window: fewer than k candidates if the
                    # window holds them all (the smallest is the cut), else the k-th
                    # lies below the window.
                    found = in_window
                    lo = small_lo
                    hi = small_hi
                elif k_bin >= thr_bin:  # the k-th, or the smallest candidate if fewer
                    lo = small_lo
                    hi = small_hi
                else:
                    lo = k_bin
                    hi = k_bin
            elif not top_p_on:
                found = in_window  # min-p alone: the smallest candidate
                lo = small_lo
                hi = small_hi
            if top_p_on:
                # Each bin's mass estimated as its count x the mean weight over the bin
                # (the values spread evenly in it); the range: the bin where the
                # estimate crosses top_p of the total, and its neighbour on the side
                # the crossing is nearer, or both neighbours where they fit.
                upper = tl.minimum((top_bin - bins + 1).to(tl.float32) / inv_width, top)
                lower = (top_bin - bins).to(tl.float32) / inv_width
                a = (tl.minimum(lower, top) - top) / temp
                c = (upper - top) / temp
                spread = c - a
                mean = tl.where(
                    spread > 1e-6, (tl.exp(c) - tl.exp(a)) / tl.where(spread > 1e-6, spread, 1.0), tl.exp(c)
                )
                last = tl.where(top_k_on, hi, NB - 2)
                # The max itself weighs 1, not its bin's mean (peaked rows: most of the mass).
                mass = tl.where(bins == 0, 1.0 + (kept.to(tl.float32) - 1.0) * mean, kept.to(tl.float32) * mean)
                mass = tl.where(bins <= last, mass, 0.0)
                running = tl.cumsum(mass, 0)
                target = tl.maximum(top_p, 0.0) * tl.sum(mass, 0)
                p_bin = tl.min(tl.where(running >= target, bins, NB - 2), 0)
                at = bins == p_bin
                into = (target - tl.sum(tl.where(at, running - mass, 0.0), 0)) / tl.sum(tl.where(at, mass, 1.0), 0)
                p_lo = tl.maximum(p_bin - 1, 0)
                p_hi = tl.minimum(p_bin + 1, NB - 2)
                both = tl.sum(tl.where((bins >= p_lo) & (bins <= p_hi), counts, 0), 0) <= CAPACITY
                p_lo = tl.where(both | (into < 0.5), p_lo, p_bin)
                p_hi = tl.where(both | (into >= 0.5), p_hi, p_bin)
                # And up to the next bin above that holds a token, where it fits (the
                # estimate is coarsest across empty bins: a peaked row's next token).
                above = tl.max(tl.where((bins < p_lo) & (counts > 0), bins, -1), 0)
                wider = tl.sum(tl.where((bins >= above) & (bins <= p_hi), counts, 0), 0) <= CAPACITY
                p_lo = tl.where((above >= 0) & wider, above, p_lo)
                if top_k_on:
                    lo = tl.minimum(p_lo, lo)
                else:
                    lo = p_lo
                    hi = p_hi
            held = tl.sum(tl.where((bins >= lo) & (bins <= hi), counts, 0), 0)
            go = (found & (held <= CAPACITY)).to(tl.int32)
            range_lo = top_bin - hi  # absolute bins, the deepest first
            range_hi = top_bin - lo
            if SHIFT > 0:
                # bf16 / fp16 values: a range of a few logits holds few distinct values
                # (one key each), so where KEYS - 1 keys cover it, count per key instead
                # of copying (the count of a key times its value's weight is its mass),
                # where the copy would be long (keyed_from tokens; a short copy is
                # cheaper than the histogram) or would overflow. One key of margin on
                # each side for the bins' fp32 rounding.
                lowest = order_key(range_lo.to(tl.float32) / inv_width, SHIFT) - 1
                highest = order_key(tl.minimum((range_hi + 1).to(tl.float32) / inv_width, top), SHIFT) + 1
                long_copy = (held >= keyed_from) | (held > CAPACITY)
                if found & long_copy & (highest - lowest < KEYS - 1):
                    go = tl.full([], 2, tl.int32)
                    range_lo = lowest - (KEYS - 2 - (highest - lowest)) // 2
                    range_hi = range_lo + KEYS - 2
            tl.store(bounds_ptr + row * 3, top)
            tl.store(bounds_ptr + row * 3 + 1, thr)
            tl.store(bounds_ptr + row * 3 + 2, inv_width)
            tl.store(span_ptr + row * 3, range_lo)
            tl.store(span_ptr + row * 3 + 1, range_hi)
            tl.store(count_ptr + row, 0)
    tl.store(span_ptr + row * 3 + 2, go)
    tl.store(done_ptr + row, done.to(tl.int8))
    if done != 0:
        tl.store(cut_ptr + row, float("-inf"))


@triton.jit
def range_sums(out, x, above, below, top_p_on, top, temp):
    """sums[row, chunk] at `out` = (count above, mass above, count below, mass below)
    of the chunk's candidates, counts as fp32 of exact small integers (<= CHUNK, summed
    as int32), masses only where top-p is on (the resolve reads them only then: an exp
    a token). The weight is kernel.py's candidate_weights with fewer guards, the same
    values here: `above` and `below` hold candidates only, and bracket_kernel sends a
    row here only with a finite max (so x - top is never inf - inf). The count pass's
    SASS (sm_90, triton 3.6): 102 instructions a token with candidate_weights and fp32
    counts, 89 with this weight and int32 counts."""
    tl.store(out, tl.sum(above.to(tl.int32), 0).to(tl.float32))
    tl.store(out + 2, tl.sum(below.to(tl.int32), 0).to(tl.float32))
    if top_p_on:
        w = tl.where(x == top, 1.0, tl.exp((x - top) / temp))
        tl.store(out + 1, tl.sum(tl.where(above, w, 0.0), 0))
        tl.store(out + 3, tl.sum(tl.where(below, w, 0.0), 0))


@triton.jit
def range_masks(x, thr, position, range_lo, range_hi):
    """(above, below, inside): a chunk's candidates against the range [range_lo,
    range_hi] of their positions (bins for the copy, keys for the count)."""
    candidate = is_candidate(x, thr)
    above = candidate & (position > range_hi)
    below = candidate & (position < range_lo)
    return above, below, candidate & ~above & ~below


@triton.jit
def collect_kernel(
    logits_ptr, temperature_ptr, top_p_ptr, bounds_ptr, span_ptr, count_ptr, values_ptr, sums_ptr,
    vocab, row_stride, num_chunks,
    CHUNK: tl.constexpr, GROUP: tl.constexpr, CAPACITY: tl.constexpr,
):  # fmt: skip
    """Step 3, rows whose span says copy (go = 1), for each of the program's GROUP
    chunks: the chunk's candidates above and below the range (range_sums), and its
    candidates inside the range copied out."""
    row = tl.program_id(0).to(tl.int64)
    if tl.load(span_ptr + row * 3 + 2) == 1:
        top = tl.load(bounds_ptr + row * 3)
        thr = tl.load(bounds_ptr + row * 3 + 1)
        inv_width = tl.load(bounds_ptr + row * 3 + 2)
        range_lo = tl.load(span_ptr + row * 3)
        range_hi = tl.load(span_ptr + row * 3 + 1)
        temp = tl.load(temperature_ptr + row)
        top_p_on = tl.load(top_p_ptr + row) < 1.0
        for step in range(GROUP):
            chunk = tl.program_id(1) * GROUP + step
            if chunk < num_chunks:
                idx = chunk * CHUNK + tl.arange(0, CHUNK)
                # Loaded here, not through load_clean: torch.compile's analysis of a
                # launch counts every pointer a store's address was computed from as
                # written, and it follows a helper's result back to all its arguments,
                # so the copy's address (from the atomic, whose mask comes from x) would
                # make the logits "written" and Inductor would clone them (wrong results
                # on CUDA, torch 2.11).
                x = tl.load(logits_ptr + row * row_stride + idx, mask=idx < vocab, other=float("-inf"))
                x = clean(x.to(tl.float32))
                above, below, inside = range_masks(x, thr, bin_of(x, inv_width), range_lo, range_hi)
                range_sums(sums_ptr + (row * num_chunks + chunk) * 4, x, above, below, top_p_on, top, temp)
                if tl.max(inside.to(tl.int32), 0) > 0:
                    # One atomic add a copied token takes its place (a scan of the
                    # chunk's mask for places cost 3x the rest of this kernel on an H200).
                    # Relaxed: a place need only be unique (the launch's end orders the
                    # stores for the resolve); Triton's default, acq_rel, puts a
                    # MEMBAR.GPU beside every atomic (relaxed: 226 -> 217 us, top-p 0.9
                    # at T = 0.7, B = 256, V = 152k, H200).
                    counter = count_ptr + row + tl.zeros([CHUNK], tl.int32)
                    ones = tl.full([CHUNK], 1, tl.int32)
                    place = tl.atomic_add(counter, ones, mask=inside, sem="relaxed")
                    tl.store(values_ptr + row * CAPACITY + place, x, mask=inside & (place < CAPACITY))


@triton.jit
def count_kernel(
    logits_ptr, temperature_ptr, top_p_ptr, bounds_ptr, span_ptr, sums_ptr, keyed_ptr, keyed_stride,
    vocab, row_stride, num_chunks,
    SHIFT: tl.constexpr, CHUNK: tl.constexpr, GROUP: tl.constexpr, KEYS: tl.constexpr,
):  # fmt: skip
    """Step 3, rows whose span says count (go = 2; the range is KEYS - 1 order keys),
    for each of the program's GROUP chunks: the chunk's candidates above and below the
    range (range_sums), and those inside counted per key: keyed[row * num_chunks +
    chunk, j] = the chunk's tokens of key range_lo + j, keyed_stride apart a chunk
    (the last slot counts the others). A kernel of its own, not a branch of
    collect_kernel: with the histogram in it, the copy pass alone took 364 us (top-p
    0.9, T = 0.7, B = 256, V = 152k, H200), where the whole cut had taken 361 us
    without it."""
    row = tl.program_id(0).to(tl.int64)
    if tl.load(span_ptr + row * 3 + 2) == 2:
        top = tl.load(bounds_ptr + row * 3)
        thr = tl.load(bounds_ptr + row * 3 + 1)
        range_lo = tl.load(span_ptr + row * 3)
        range_hi = tl.load(span_ptr + row * 3 + 1)
        temp = tl.load(temperature_ptr + row)
        top_p_on = tl.load(top_p_ptr + row) < 1.0
        for step in range(GROUP):
            chunk = tl.program_id(1) * GROUP + step
            if chunk < num_chunks:
                idx = chunk * CHUNK + tl.arange(0, CHUNK)
                x = tl.load(logits_ptr + row * row_stride + idx, mask=idx < vocab, other=float("-inf"))
                x = clean(x.to(tl.float32))
                key = order_key(x, SHIFT)
                above, below, inside = range_masks(x, thr, key, range_lo, range_hi)
                range_sums(sums_ptr + (row * num_chunks + chunk) * 4, x, above, below, top_p_on, top, temp)
                # Unmasked, as the window's histogram (with mask=inside this pass took
                # 372 us at B = 256, V = 152k on an H200, the window's 96). Measured
                # too: a relaxed atomic add per token inside the range instead of the
                # histogram, 267 us against 241. Nsight Compute: this pass issues at
                # 80% of the SMs' rate, 204 registers a thread (12.5% occupancy).
                counts = tl.histogram(tl.where(inside, key - range_lo, KEYS - 1), KEYS)
                tl.store(keyed_ptr + (row * num_chunks + chunk) * keyed_stride + tl.arange(0, KEYS), counts)
