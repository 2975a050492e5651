"""The last step of both CUDA paths of `truncation_cut` (split.py's and maxima.py's):
`resolve_kernel` [R], one program a row, takes the exact cut from the sums of the
candidates above and below a range and from the range itself: the values copied out
of it, or (split.py's count_kernel, bf16 / fp16) its tokens counted per order key. The
k-th candidate by a search over their order keys, then top-p's largest value whose
mass at or above it reaches top_p x the total; or, where the sums show the cut
outside the range, nothing: the row is left undone, for kernel.py's per-row search.

Copied values are values of the logits' dtype, so SHIFT's keys (kernel.py) are
one-to-one on them, and a key's count times its value's weight is its mass, exactly
in fp64.
"""

from ...backend import tl, triton
from .kernel import candidate_weights, key_value, order_key, row_rules


@triton.jit
def copied_tile(row_values, start, slots, key_base, keyed, SHIFT: tl.constexpr, TILE: tl.constexpr):
    """A tile of the resolve's slots: (values, their order keys as int64, how many
    tokens each stands for, as fp64). A copied value stands for one token; keyed,
    slot j is the value of key key_base + j and holds its count."""
    at = start + tl.arange(0, TILE)
    valid = at < slots
    stored = tl.load(row_values + at, mask=valid, other=0.0)
    keys = tl.where(keyed, key_base + at.to(tl.int64), order_key(stored, SHIFT).to(tl.int64))
    values = tl.where(keyed, key_value(keys.to(tl.int32), SHIFT), stored)
    many = tl.where(valid, tl.where(keyed, stored, 1.0), 0.0).to(tl.float64)
    return values, keys, many


@triton.jit
def copied_key_range(row_values, slots, key_base, keyed, SHIFT: tl.constexpr, TILE: tl.constexpr):
    """(the lowest, the highest) order key of the copied values."""
    lowest = tl.full([], 1 << 40, tl.int64)
    highest = tl.full([], -(1 << 40), tl.int64)
    for start in range(0, slots, TILE):
        _, keys, many = copied_tile(row_values, start, slots, key_base, keyed, SHIFT, TILE)
        lowest = tl.minimum(lowest, tl.min(tl.where(many > 0, keys, 1 << 40), 0))
        highest = tl.maximum(highest, tl.max(tl.where(many > 0, keys, -(1 << 40)), 0))
    return lowest, highest


@triton.jit
def copied_reach(row_values, slots, key_base, keyed, pivots, base, thr, top, temp, MASS: tl.constexpr,
                 SHIFT: tl.constexpr, TILE: tl.constexpr, PIVOTS: tl.constexpr):  # fmt: skip
    """Per pivot, the copied tokens with key >= the pivot and >= base: their number
    (MASS false) or mass (a tile's in fp32, the tiles' in fp64; keyed, in fp64: a
    key's count times its weight is exact there, and a count may be thousands)."""
    reach = tl.zeros([PIVOTS], tl.float64)
    for start in range(0, slots, TILE):
        values, keys, many = copied_tile(row_values, start, slots, key_base, keyed, SHIFT, TILE)
        if MASS:
            weights = candidate_weights(values, thr, top, temp)
        else:
            weights = tl.full([TILE], 1.0, tl.float32)
        reached = (keys[:, None] >= pivots[None, :]) & (keys >= base)[:, None]
        if keyed:
            exact = weights.to(tl.float64) * many
            reach += tl.sum(tl.where(reached, exact[:, None], 0.0), 0)
        else:  # one token a slot: fp32 in the tile (fp64: the top-p 0.9 cut 942 against 564 us, H200)
            single = tl.where(many > 0, weights, 0.0)
            reach += tl.sum(tl.where(reached, single[:, None], 0.0), 0).to(tl.float64)
    return reach


@triton.jit
def copied_search(row_values, slots, key_base, keyed, lo, hi, base, floor, goal, thr, top, temp,
                  MASS: tl.constexpr, SHIFT: tl.constexpr, TILE: tl.constexpr, PIVOTS: tl.constexpr):  # fmt: skip
    """The largest key t in [lo, hi) with floor + copied_reach(t) >= goal; lo where
    none does (lo counts as passing). PIVOTS keys a pass: the interval shrinks
    PIVOTS + 1 times (copied bf16 values span a few keys: one or two passes)."""
    steps = tl.arange(0, PIVOTS).to(tl.int64) + 1
    while hi - lo > 1:
        pivots = lo + ((hi - lo) * steps) // (PIVOTS + 1)
        reach = floor + copied_reach(row_values, slots, key_base, keyed, pivots, base, thr, top, temp, MASS, SHIFT,
                                     TILE, PIVOTS)  # fmt: skip
        passing = reach >= goal  # a prefix: reach never grows with the pivot
        new_lo = tl.max(tl.where(passing, pivots, lo), 0)
        hi = tl.min(tl.where(passing, hi, pivots), 0)
        lo = new_lo
    return lo


@triton.jit
def resolve_kernel(
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, bounds_ptr, span_ptr, count_ptr, values_ptr, sums_ptr,
    keyed_ptr, keyed_stride, cut_ptr, done_ptr, vocab, num_chunks,
    CHUNKS: tl.constexpr, CAPACITY: tl.constexpr, SHIFT: tl.constexpr, TILE: tl.constexpr, PIVOTS: tl.constexpr,
    KEYS: tl.constexpr,
):  # fmt: skip
    """Step 4: the exact cut from the sums and the copied values (or keyed counts),
    or nothing (the row stays undone) where they show the cut outside the range.
    Copied values are values of the logits' dtype, so SHIFT's keys (kernel.py) are
    one-to-one on them."""
    row = tl.program_id(0).to(tl.int64)
    go = tl.load(span_ptr + row * 3 + 2)
    number = tl.load(count_ptr + row)
    if (go != 0) & (number <= CAPACITY):  # always <= (the counts bound it)
        top = tl.load(bounds_ptr + row * 3)
        thr = tl.load(bounds_ptr + row * 3 + 1)
        temp, top_k, top_p, _, top_k_on, top_p_on, _, _ = row_rules(
            temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab
        )
        chunks = tl.arange(0, CHUNKS)
        part = sums_ptr + (row * num_chunks + chunks) * 4
        real = chunks < num_chunks
        count_above = tl.sum(tl.load(part, mask=real, other=0.0).to(tl.int64), 0)
        mass_above = tl.sum(tl.load(part + 1, mask=real, other=0.0).to(tl.float64), 0)
        count_below = tl.sum(tl.load(part + 2, mask=real, other=0.0).to(tl.int64), 0)
        mass_below = tl.sum(tl.load(part + 3, mask=real, other=0.0).to(tl.float64), 0)
        row_values = values_ptr + row * CAPACITY
        keyed = go == 2
        key_base = tl.load(span_ptr + row * 3).to(tl.int64)  # keyed: the range's lowest key
        slots = number
        copies = number.to(tl.int64)
        if keyed:
            # The chunks' counts per key, summed into the row's slots (fp32: exact to
            # 2**24 tokens).
            keys = tl.arange(0, KEYS)
            per_chunk = keyed_ptr + (row * num_chunks + chunks[:, None]) * keyed_stride + keys[None, :]
            many = tl.sum(tl.load(per_chunk, mask=real[:, None] & (keys < KEYS - 1)[None, :], other=0), 0)
            tl.store(row_values + keys, many.to(tl.float32))
            tl.debug_barrier()  # the tiles below read the slots other threads wrote
            slots = tl.full([], KEYS, tl.int32)
            copies = tl.sum(many, 0).to(tl.int64)
        lowest, highest = copied_key_range(row_values, slots, key_base, keyed, SHIFT, TILE)
        smallest_known = (count_below == 0) & (copies > 0)  # the smallest candidate is copied

        ok = tl.full([], 1, tl.int1)
        base = lowest  # the lowest copied key kept before top-p
        with_below = tl.zeros([], tl.int1)
        if top_k_on:
            need = top_k - count_above
            if (need >= 1) & (need <= copies):
                base = copied_search(row_values, slots, key_base, keyed, lowest, highest + 1, lowest, 0.0,
                                     need.to(tl.float64), thr, top, temp, False, SHIFT, TILE, PIVOTS)  # fmt: skip
            else:
                ok = (need > copies) & smallest_known  # fewer than k candidates: the smallest
        else:
            with_below = count_below > 0
            ok = top_p_on | smallest_known  # min-p alone: the smallest candidate
        cut_key = base
        if top_p_on & ok:
            all_kept = copied_reach(row_values, slots, key_base, keyed, tl.full([PIVOTS], -(1 << 40), tl.int64), base,
                                    thr, top, temp, True, SHIFT, TILE, PIVOTS)  # fmt: skip
            total = mass_above + tl.max(all_kept, 0) + tl.where(with_below, mass_below, 0.0)
            goal = top_p.to(tl.float64) * total
            if (count_above > 0) & (mass_above >= goal):
                ok = False  # the cut is above the range
            else:
                cut_key = copied_search(row_values, slots, key_base, keyed, base, highest + 1, base, mass_above, goal,
                                        thr, top, temp, True, SHIFT, TILE, PIVOTS)  # fmt: skip
                # Where even every copied value falls short, the cut is below the range.
                ok = (copies > 0) & (mass_above + tl.max(all_kept, 0) >= goal)
        if ok:
            tl.store(cut_ptr + row, key_value(cut_key.to(tl.int32), SHIFT))
            tl.store(done_ptr + row, 1)
