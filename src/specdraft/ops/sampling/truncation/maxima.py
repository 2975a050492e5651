"""The top-k and min-p path of `truncation_cut` on CUDA: the maxima of the row's
chunks, then exact work on a few values a row.

Top-k: a row of V logits split into S chunks has S chunk maxima, S distinct tokens of
the row, so where k <= S the k-th largest chunk maximum L is at most the row's k-th
largest logit: at least k tokens (those maxima) are >= L. Every token top-k can keep
is >= L, and on typical rows few others are (random rows, V = 152k in chunks of
1,024, k = 50: about a hundred). Min-p alone (top-k and top-p off): the cut is the
row's smallest candidate (the smallest logit at or above the max's threshold), the
smallest of each part's smallest. So:

1. `maxima_kernel` [R, S / GROUP]: each chunk's max (one read of the logits: no
   histogram, no exp);
2. `level_kernel` [R]: the row's max, its min-p threshold thr, and for top-k the
   level max(L, thr): L as the largest chunk maximum that at least k maxima reach (a
   [S, S] comparison, no sort). Where fewer than k candidates (tokens >= thr) exist,
   L < thr (k maxima >= L would be k candidates), so the level is thr and every
   candidate is copied;
3. `gather_kernel` [R, V / PART]: top-k rows: each program counts its candidates
   below the level and copies those at or above it (a few a row, each placed by an
   atomic add); min-p rows: each program copies its smallest candidate, one value;
4. resolve.py's `resolve_kernel`, as split.py's rows take it: with nothing above
   the copied range, the k-th largest copied value is top-k's cut, and top-p's mass
   is over the copied values at or above it, which is all top-p weighs once top-k is
   on; with nothing below it (min-p), the smallest copied value is the cut.

Rows whose copy overflows CAPACITY (a row of ties, a flat row) stay undone and go to
kernel.py's per-row search, like split.py's leftovers; so the cut is exact whatever
the row. Rows with top-k off or k > S, min-p rows with top-p on among them, take
split.py's histogram path or kernel.py's search. Measured on an H200 at B = 256, V =
152k: the histogram path's window and copy passes were 248-293 us for top-k 50 or
top-k 20 + top-p 0.9, this path's 131-136 us (benchmarks/README.md, "Sampling
truncation"); kernel.py's two passes for min-p alone, 142 us.
"""

from ...backend import tl, triton
from .kernel import clean, is_candidate, load_clean, min_p_threshold, row_rules


@triton.jit
def on_maxima_path(truncated, top_k_on, top_k, top_p_on, min_p_on, num_chunks):
    """This path's rule (split.py's row_switches leaves these rows to it): truncated,
    and top-k on with k at most the number of chunks, or min-p alone."""
    min_p_alone = min_p_on & ~top_k_on & ~top_p_on
    return truncated & ((top_k_on & (top_k <= num_chunks)) | min_p_alone)


@triton.jit
def by_maxima(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab, num_chunks):
    """kernel.py's row_rules, and whether the row takes this path (on_maxima_path)."""
    temp, top_k, top_p, min_p, top_k_on, top_p_on, min_p_on, truncated = row_rules(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab
    )
    taken = on_maxima_path(truncated, top_k_on, top_k, top_p_on, min_p_on, num_chunks)
    return temp, top_k, top_k_on, min_p, min_p_on, taken


@triton.jit
def maxima_kernel(
    logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, maxima_ptr, vocab, row_stride, num_chunks,
    CHUNK: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    """Step 1: the max of each of the program's GROUP chunks (NaN as -inf). GROUP
    chunks a program, not one: a row not on this path still launches the grid, and
    at B = 256, V = 152k one chunk a program was 38k programs that only read their
    row's switches."""
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    _, _, _, _, _, taken = by_maxima(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab, num_chunks)
    if taken:
        chunks = group * GROUP + tl.arange(0, GROUP)
        idx = chunks[:, None] * CHUNK + tl.arange(0, CHUNK)[None, :]
        x = load_clean(logits_ptr + row * row_stride, idx, vocab)
        tl.store(maxima_ptr + row * num_chunks + chunks, tl.max(x, 1), mask=chunks < num_chunks)


@triton.jit
def level_kernel(
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, maxima_ptr, bounds_ptr, span_ptr, count_ptr, cut_ptr,
    done_ptr, vocab, num_chunks,
    CHUNKS: tl.constexpr,
):  # fmt: skip
    """Step 2, for this path's rows (the others keep what split.py's bracket_kernel
    wrote): bounds[row] = (max, min-p threshold, the level); span[row, 2] = go (1:
    gather and resolve; 0: done, or left to kernel.py's search). resolve.py's kernel
    reads span[row, 2] only, and the sums and copies gather_kernel writes."""
    row = tl.program_id(0).to(tl.int64)
    temp, top_k, _, min_p, min_p_on, taken = by_maxima(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab, num_chunks
    )
    go = tl.zeros([], tl.int32)
    if taken:
        chunks = tl.arange(0, CHUNKS)
        maxima = tl.load(maxima_ptr + row * num_chunks + chunks, mask=chunks < num_chunks, other=float("-inf"))
        top = tl.max(maxima, 0)
        if top == float("-inf"):  # no logit above -inf: kept whole
            tl.store(cut_ptr + row, float("-inf"))
            tl.store(done_ptr + row, 1)
        elif top < float("inf"):  # a +inf max (its weights are not exp's): the search
            # How many maxima reach each maximum; L: the largest that k of them reach.
            reach = tl.sum((maxima[None, :] >= maxima[:, None]).to(tl.int32), 1)
            bound = tl.max(tl.where(reach >= top_k, maxima, float("-inf")), 0)
            thr = min_p_threshold(top, temp, min_p, min_p_on)
            tl.store(bounds_ptr + row * 3, top)
            tl.store(bounds_ptr + row * 3 + 1, thr)
            tl.store(bounds_ptr + row * 3 + 2, tl.maximum(bound, thr))
            tl.store(count_ptr + row, 0)
            go = tl.full([], 1, tl.int32)
    tl.store(span_ptr + row * 3 + 2, go)


@triton.jit
def gather_kernel(
    logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, bounds_ptr, span_ptr, count_ptr, values_ptr,
    sums_ptr, vocab, row_stride, num_parts, maxima_chunks,
    PART: tl.constexpr, CAPACITY: tl.constexpr,
):  # fmt: skip
    """Step 3: top-k rows: the candidates of the program's PART tokens below the level
    counted, those at or above it copied out; min-p rows: the program's smallest
    candidate copied out, one value (so the row's smallest is among the copies and
    none lies below them). sums[row, part] = (0, 0, count below, 0): nothing lies
    above the copied range, and resolve_kernel reads the mass below only with top-p
    and without top-k."""
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    _, _, top_k_on, _, _, _ = by_maxima(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab, maxima_chunks)
    # level_kernel set every row's go, 0 off this path: read beside the switches, not
    # after them (a program here is a few dependent loads; each one costs its latency).
    if tl.load(span_ptr + row * 3 + 2) != 0:
        thr = tl.load(bounds_ptr + row * 3 + 1)
        level = tl.load(bounds_ptr + row * 3 + 2)
        idx = part * PART + tl.arange(0, PART)
        # Loaded here, not through load_clean: split.py's collect_kernel says why (a
        # store whose address comes from a helper's result marks the logits written).
        x = clean(tl.load(logits_ptr + row * row_stride + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32))
        candidate = is_candidate(x, thr)
        out = sums_ptr + (row * num_parts + part) * 4
        tl.store(out, 0.0)
        tl.store(out + 1, 0.0)
        tl.store(out + 3, 0.0)
        if top_k_on:
            inside = candidate & (x >= level)
            tl.store(out + 2, tl.sum((candidate & ~inside).to(tl.int32), 0).to(tl.float32))
            if tl.max(inside.to(tl.int32), 0) > 0:
                # Relaxed, as split.py's copy pass says why.
                counter = count_ptr + row + tl.zeros([PART], tl.int32)
                place = tl.atomic_add(counter, tl.full([PART], 1, tl.int32), mask=inside, sem="relaxed")
                tl.store(values_ptr + row * CAPACITY + place, x, mask=inside & (place < CAPACITY))
        else:
            tl.store(out + 2, 0.0)
            smallest = tl.min(tl.where(candidate, x, float("inf")), 0)
            if smallest < float("inf"):
                place = tl.atomic_add(count_ptr + row, 1, sem="relaxed")
                tl.store(values_ptr + row * CAPACITY + place, smallest, mask=place < CAPACITY)
