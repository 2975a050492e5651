"""The Triton kernel of `budget_keep` (this package's docstring defines what it
computes). One program for the whole batch, no sort: the kept set is everything at
or before the K-th position of the order (K = min(budget, eligible)), and that
position is found by bisection on counts.

Keys: an eligible value's float32 bits, read as an int32, order like the value
(non-negative floats, +inf included, have increasing bit patterns; -0.0 is keyed 0);
an ineligible value (negative, NaN) is keyed -1. The tie key is depth * M + b * N + i
(M = B * N, the depth clamped into [0, N]), so (key descending, tie ascending) is the
op's order, and the wrapper keeps (N + 1) * M below 2**31.

Passes, each one count over the batch (a sum over the tile):
1. the eligible count and the eligible keys' range: K;
2. bisection for the threshold key: the largest k with #(key >= k) >= K;
3. if more positions have the threshold key than the budget has room for, bisection
   over the tie key among them: the smallest t with #(at or before (k, t)) >= K;
4. keep = at or before (k, t); counts = each row's sum.

The batch is read as tiles of [ROWS, COLS] (COLS = N rounded up to a power of two):
the first tile stays in registers for every pass, and a batch of more tiles reloads
the others per pass (from L2: M is at most a few tens of thousands).
"""

from ..backend import tl, triton

# Literals in the kernels: 0x7F800000 is +inf's bits, the largest key; 0x7F800001
# ("no key") is above every key, so no position comes before it.


@triton.jit
def value_keys(values):
    """int32 keys of fp32 values: the bits of a value >= 0 (-0.0 as 0), -1 for a
    negative or NaN one. From the bits alone, so no float compare (which may flush
    denormals) decides eligibility."""
    bits = values.to(tl.int32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    eligible = ((bits >= 0) | (magnitude == 0)) & (magnitude <= 0x7F800000)
    return tl.where(eligible, magnitude, -1)


@triton.jit
def tile_positions(row0, num_reqs, num_pos, ROWS: tl.constexpr, COLS: tl.constexpr):
    """(inside, flat index, rows) of rows [row0, row0 + ROWS). Apart from tile_keys,
    with no pointer among its arguments: torch.compile's analysis of a launch counts
    every pointer a store's address was computed from (through a helper's arguments)
    as written, so the stores take their addresses from here."""
    rows = row0 + tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    inside = (rows[:, None] < num_reqs) & (cols[None, :] < num_pos)
    return inside, rows[:, None] * num_pos + cols[None, :], rows


@triton.jit
def tile_keys(values_ptr, depths_ptr, row0, num_reqs, num_pos, ROWS: tl.constexpr, COLS: tl.constexpr):
    """(keys, tie keys) of rows [row0, row0 + ROWS); -1 keys outside the batch."""
    inside, flat, _ = tile_positions(row0, num_reqs, num_pos, ROWS, COLS)
    keys = value_keys(tl.load(values_ptr + flat, mask=inside, other=-1.0))
    depth = tl.load(depths_ptr + flat, mask=inside, other=0)
    depth = tl.minimum(tl.maximum(depth, 0), num_pos).to(tl.int32)
    return keys, depth * (num_reqs * num_pos) + flat


@triton.jit
def at_or_before(keys, ties, key, tie):
    """Which entries come at or before (key, tie) in the order (key descending, tie
    ascending). key >= 0, so an ineligible entry (-1) never does."""
    return (keys > key) | ((keys == key) & (ties <= tie))


@triton.jit
def count_at_or_before(values_ptr, depths_ptr, keys, ties, key, tie, num_reqs, num_pos,
                       ROWS: tl.constexpr, COLS: tl.constexpr, NUM_TILES: tl.constexpr):  # fmt: skip
    """How many positions of the batch come at or before (key, tie): the first tile's
    from registers (keys, ties), the others' loaded."""
    count = tl.sum(at_or_before(keys, ties, key, tie).to(tl.int32))
    for tile in range(1, NUM_TILES):
        tile_k, tile_t = tile_keys(values_ptr, depths_ptr, tile * ROWS, num_reqs, num_pos, ROWS, COLS)
        count += tl.sum(at_or_before(tile_k, tile_t, key, tie).to(tl.int32))
    return count


@triton.jit
def eligible_range(values_ptr, depths_ptr, keys, num_reqs, num_pos,
                   ROWS: tl.constexpr, COLS: tl.constexpr, NUM_TILES: tl.constexpr):  # fmt: skip
    """(count, lowest key, highest key) of the eligible positions; (0, 0x7F800001, -1)
    when there are none."""
    count = tl.sum((keys >= 0).to(tl.int32))
    low = tl.min(tl.where(keys >= 0, keys, 0x7F800001))
    high = tl.max(keys)
    for tile in range(1, NUM_TILES):
        tile_k, _ = tile_keys(values_ptr, depths_ptr, tile * ROWS, num_reqs, num_pos, ROWS, COLS)
        count += tl.sum((tile_k >= 0).to(tl.int32))
        low = tl.minimum(low, tl.min(tl.where(tile_k >= 0, tile_k, 0x7F800001)))
        high = tl.maximum(high, tl.max(tile_k))
    return count, low, high


@triton.jit
def budget_keep_kernel(values_ptr, depths_ptr, budget_ptr, keep_ptr, counts_ptr, num_reqs, num_pos,
                       ROWS: tl.constexpr, COLS: tl.constexpr, NUM_TILES: tl.constexpr):  # fmt: skip
    """keep [B, N] and counts [B] of the whole batch, one program."""
    keys, ties = tile_keys(values_ptr, depths_ptr, 0, num_reqs, num_pos, ROWS, COLS)
    eligible, low, high = eligible_range(values_ptr, depths_ptr, keys, num_reqs, num_pos, ROWS, COLS, NUM_TILES)
    budget = tl.load(budget_ptr).to(tl.int64)
    wanted = tl.minimum(tl.maximum(budget, 0), eligible.to(tl.int64)).to(tl.int32)

    # The threshold key: #(key >= lo) >= K > #(key >= hi). K = 0 keeps nothing (no key).
    lo = tl.where(wanted > 0, low, 0x7F800001)
    hi = tl.where(wanted > 0, high + 1, 0x7F800002)
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        enough = count_at_or_before(values_ptr, depths_ptr, keys, ties, mid - 1, -1, num_reqs, num_pos,
                                    ROWS, COLS, NUM_TILES) >= wanted  # fmt: skip
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid)

    # The last tie key kept among the threshold's: #(before (lo, tie_lo)) < K <= #(before (lo, tie_hi)).
    tie_end = (num_pos + 1) * (num_reqs * num_pos)  # above every tie key
    at_or_above = count_at_or_before(values_ptr, depths_ptr, keys, ties, lo, tie_end, num_reqs, num_pos,
                                     ROWS, COLS, NUM_TILES)  # fmt: skip
    tie_hi = tie_end
    tie_lo = tl.where(at_or_above == wanted, tie_end - 1, -1)  # all of them kept: no search
    while tie_hi - tie_lo > 1:
        mid = tie_lo + (tie_hi - tie_lo) // 2
        enough = count_at_or_before(values_ptr, depths_ptr, keys, ties, lo, mid, num_reqs, num_pos,
                                    ROWS, COLS, NUM_TILES) >= wanted  # fmt: skip
        tie_hi = tl.where(enough, mid, tie_hi)
        tie_lo = tl.where(enough, tie_lo, mid)

    for tile in range(NUM_TILES):
        tile_k, tile_t = tile_keys(values_ptr, depths_ptr, tile * ROWS, num_reqs, num_pos, ROWS, COLS)
        inside, flat, rows = tile_positions(tile * ROWS, num_reqs, num_pos, ROWS, COLS)
        kept = at_or_before(tile_k, tile_t, lo, tie_hi)
        tl.store(keep_ptr + flat, kept, mask=inside)
        tl.store(counts_ptr + rows, tl.sum(kept.to(tl.int32), 1), mask=rows < num_reqs)
