"""What draft and rejection sampling share: the tiles, the prefetching scan of a
vocabulary row with its common steps (greedy argmax, Gumbel-max, online softmax),
the block-wise reductions, and the checks of the per-request sampling arguments.

Both samplers split each row of V logits across programs (CHUNK_V tokens each, so
that small batches still fill the GPU) and walk a program's tokens BLOCK at a time
with `scan_vocab`; what a block does to the running state is the caller's STEP
function. Per-lane accumulators (one compare and two selects per token for an
argmax) are reduced across the block once per program, not once per block, and the
per-program partials are combined by a second, tiny pass (`combine_argmax`,
`combine_softmax`).
"""

import torch

from specdraft.checks import INDEX_DTYPES, check_tensor_arg

from ..backend import TRITON_INTERPRET, tl, triton
from .noise import exp2, gumbel_keys

if TRITON_INTERPRET:
    # The interpreter emulates every lane of a block in NumPy: small blocks keep
    # its lane fast and make small test vocabularies span several blocks and chunks.
    BLOCK_V, CHUNK_V, DRAFT_BLOCK_V = 16, 64, 16
else:
    BLOCK_V = 2048  # tokens per loop iteration of one program (rejection sampling)
    CHUNK_V = 8192  # tokens per program; a 152k vocab row spreads over 19 programs
    DRAFT_BLOCK_V = 1024  # draft_sample's loop: 8 tokens per thread (benchmarks/README.md, tiles)
SPLIT_BLOCK = 32  # partials combined per iteration of the combining loops
FAST_LOG2 = not TRITON_INTERPRET  # the interpreter has no inline PTX: exact log2 there
NUM_WARPS = 8
DRAFT_NUM_WARPS = 4
# rejection_sample's tiles (tokens per program, per loop iteration, warps). Large batches want
# long programs on narrow iterations (8 tokens a thread): at V = 152k, B = 256 they
# read at 3.3 TB/s where the small tiles read at 2.2. Small batches want the
# opposite (few programs, each a short serial loop): the large tiles double their
# latency. The switch is taken only where B is a known number (eager, or a static
# compile); under dynamic shapes the op stays on the small tiles instead of adding
# a guard on B (benchmarks/README.md). The interpreter keeps draft_sample's tiny tiles.
RS_TILES_SMALL = (CHUNK_V, BLOCK_V, NUM_WARPS)
RS_TILES_LARGE = (2 * CHUNK_V, DRAFT_BLOCK_V, 4) if not TRITON_INTERPRET else (CHUNK_V, BLOCK_V, 4)
RS_LARGE_FROM = 4 * 1024 * 1024  # B * V from which the large tiles pay


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


# ---------------------------------------------------- steps: what scan_vocab does per block


@triton.jit
def argmax_step(acc, x, side, idx, args, FLAGS: tl.constexpr):
    """Greedy: the per-lane argmax of the logits (acc: lane_argmax_init)."""
    best, best_idx = acc
    return lane_argmax_update(best, best_idx, x, idx)


@triton.jit
def gumbel_step(acc, x, side, idx, args, FAST: tl.constexpr):
    """Sampling: the per-lane argmax of the base-2 Gumbel-max keys (args: gain, row key)."""
    best, best_idx = acc
    gain, key = args
    return lane_argmax_update(best, best_idx, gumbel_keys(x, idx, gain, key, FAST), idx)


@triton.jit
def lane_softmax_step(acc, x, side, idx, gain, FAST: tl.constexpr):
    """Per-lane online softmax of x * gain (x / T in base 2), no reduction in the loop."""
    lane_max, lane_sum = acc
    return lane_softmax_update(lane_max, lane_sum, x * gain, FAST)


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
def softmax_update(run_max, run_sum, z):
    """Online softmax statistics; rows of -inf so far contribute nothing."""
    new_max = tl.maximum(run_max, tl.max(z, 0))
    safe = tl.where(new_max == float("-inf"), 0.0, new_max)
    run_sum = run_sum * tl.exp(run_max - safe) + tl.sum(tl.exp(z - safe), 0)
    return new_max, run_sum


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


# ------------------------------------------------------- the shared argument checks


def check_request_params(num_reqs, temperature, seeds, positions, device_of: torch.Tensor | None = None) -> None:
    """temperature fp32 [B]; seeds, positions int32/int64 [B]; all contiguous."""
    check_tensor_arg("temperature", temperature, torch.float32, shape=(num_reqs,), contiguous=True, device_of=device_of)
    check_tensor_arg("seeds", seeds, INDEX_DTYPES, shape=(num_reqs,), contiguous=True, device_of=device_of)
    check_tensor_arg("positions", positions, INDEX_DTYPES, shape=(num_reqs,), contiguous=True, device_of=device_of)
