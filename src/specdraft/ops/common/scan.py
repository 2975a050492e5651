"""Streaming one vocabulary row: the prefetching block loop (`scan_vocab`), the
per-lane accumulators a block updates (argmax, online softmax) with their reductions
across the block, and the combining of per-program partials.

Per-lane accumulators (one compare and two selects per token for an argmax) are
reduced across the block once per program, not once per block; where a row is split
across programs, the per-program partials are combined by a second, tiny pass
(`combine_argmax`, `combine_softmax`). The samplers (ops/sampling) and the
training-time metrics (ops/vocab_metrics/) build their kernels from these.
"""

from ..backend import tl, triton
from .fastmath import exp2

# ------------------------------------------------------------------- the scan loop


@triton.jit
def load_block(ptr, idx, end, other):
    """ptr[idx] where idx < end, else `other`: one block of a program's token range."""
    return tl.load(ptr + idx, mask=idx < end, other=other)


@triton.jit
def scan_vocab(
    row_ptr,
    side_ptr,
    start,
    end,
    acc,
    args,
    STEP: tl.constexpr,
    FLAGS: tl.constexpr,
    SIDE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Tokens [start, end) of one row, BLOCK at a time: acc = STEP(acc, x, side, idx,
    args, FLAGS) per block, with idx the block's token indices, x the row's values
    there in fp32 (-inf past end) and, when SIDE, side the values of a second row
    read alongside (side_ptr, fp32, 0 past end; x again otherwise). Returns the final
    acc (a tuple). args (runtime values) and FLAGS (constexprs) are STEP's own; a step
    takes a tuple of flags apart with annotated assignments (`X: tl.constexpr =
    FLAGS[0]`), as a plain assignment would turn them into runtime values.

    Prefetch: the next block's loads are in flight while STEP works on this one. The
    per-lane accumulators cost registers, so occupancy alone cannot keep enough bytes
    in flight (Little's law); a second load per thread does."""
    first = start + tl.arange(0, BLOCK)
    x_next = load_block(row_ptr, first, end, float("-inf"))
    if SIDE:
        side_next = load_block(side_ptr, first, end, 0.0)
    for off in range(start, end, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        x = x_next.to(tl.float32)
        x_next = load_block(row_ptr, idx + BLOCK, end, float("-inf"))
        side = x
        if SIDE:
            side = side_next.to(tl.float32)
            side_next = load_block(side_ptr, idx + BLOCK, end, 0.0)
        acc = STEP(acc, x, side, idx, args, FLAGS)
    return acc


# ------------------------------------------------------------ block-wise reductions


@triton.jit
def lane_argmax_init(start, BLOCK: tl.constexpr):
    """Per-lane (max, index) before any token: -inf at the range's first index."""
    return tl.full([BLOCK], float("-inf"), tl.float32), tl.full([BLOCK], 0, tl.int32) + start


@triton.jit
def lane_argmax_update(best, best_idx, keys, idx):
    """Per-lane running (max, index); strict, so a lane keeps its earliest index on a
    tie. NaN keys never win (every comparison with NaN is false)."""
    better = keys > best
    return tl.where(better, keys, best), tl.where(better, idx, best_idx)


@triton.jit
def lane_argmax_finish(best, best_idx):
    """(max, first index of the max) across the lanes of lane_argmax_update."""
    top = tl.max(best, 0)
    return top, tl.min(tl.where(best == top, best_idx, 2147483647), 0)


@triton.jit
def lane_softmax_init(BLOCK: tl.constexpr):
    """Per-lane (max, sum) before any token. The max is finite: lane_softmax_update
    subtracts the running max, and -inf - -inf is NaN."""
    return tl.full([BLOCK], -3.4028234663852886e38, tl.float32), tl.zeros([BLOCK], tl.float32)


@triton.jit
def lane_softmax_update(lane_max, lane_sum, z2, FAST: tl.constexpr):
    """Online softmax statistics per lane, z2 in base-2 units: one exp2 per token
    (rescale the sum when the max grows, else add the new term)."""
    d = z2 - lane_max
    e = exp2(-tl.abs(d), FAST)
    lane_sum = tl.where(d > 0, lane_sum * e + 1.0, lane_sum + e)
    return tl.maximum(lane_max, z2), lane_sum


@triton.jit
def lane_softmax_finish(lane_max, lane_sum):
    """(max, sum) across lanes in natural units: sum_i e**(z_i - max), the same
    number as the base-2 sum, with the max converted by ln 2."""
    top = tl.max(lane_max, 0)
    total = tl.sum(lane_sum * tl.exp2(lane_max - top), 0)
    return top * 0.6931471805599453, total


@triton.jit
def lane_lse2(lane_max, lane_sum):
    """log2 sum 2**z across the lanes of lane_softmax_update; -inf for a row with no
    finite value."""
    top = tl.max(lane_max, 0)
    return top + tl.log2(tl.sum(lane_sum * tl.exp2(lane_max - top), 0))


@triton.jit
def softmax_update(run_max, run_sum, z):
    """Online softmax statistics; rows of -inf so far contribute nothing."""
    new_max = tl.maximum(run_max, tl.max(z, 0))
    safe = tl.where(new_max == float("-inf"), 0.0, new_max)
    run_sum = run_sum * tl.exp(run_max - safe) + tl.sum(tl.exp(z - safe), 0)
    return new_max, run_sum


# --------------------------------------------------- combining per-program partials


@triton.jit
def combine_argmax(key_ptr, idx_ptr, num_splits, SPLIT_BLOCK: tl.constexpr):
    """Global (max, first index) from per-program partials ordered by token range."""
    best = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int32)
    for s0 in range(0, num_splits, SPLIT_BLOCK):
        offs = s0 + tl.arange(0, SPLIT_BLOCK)
        mask = offs < num_splits
        keys = tl.load(key_ptr + offs, mask=mask, other=float("-inf"))
        idxs = tl.load(idx_ptr + offs, mask=mask, other=2147483647)
        block_best = tl.max(keys, 0)
        block_idx = tl.min(tl.where(mask & (keys == block_best), idxs, 2147483647), 0)
        better = block_best > best
        best = tl.where(better, block_best, best)
        best_idx = tl.where(better, block_idx, best_idx)
    return best, best_idx


@triton.jit
def combine_softmax(max_ptr, sum_ptr, num_splits, SPLIT_BLOCK: tl.constexpr):
    """Global softmax (max, sum) from per-program partials."""
    run_max = tl.full([], float("-inf"), tl.float32)
    run_sum = tl.full([], 0.0, tl.float32)
    for s0 in range(0, num_splits, SPLIT_BLOCK):
        offs = s0 + tl.arange(0, SPLIT_BLOCK)
        mask = offs < num_splits
        maxes = tl.load(max_ptr + offs, mask=mask, other=float("-inf"))
        sums = tl.load(sum_ptr + offs, mask=mask, other=0.0)
        new_max = tl.maximum(run_max, tl.max(maxes, 0))
        safe = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - safe) + tl.sum(sums * tl.exp(maxes - safe), 0)
        run_max = new_max
    return run_max, run_sum
