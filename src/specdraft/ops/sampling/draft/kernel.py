"""draft_sample's two Triton passes (the rules in the package docstring): per
(request, vocab chunk) the argmax of the Gumbel keys and, when probabilities are
written, online-softmax statistics; then per request the combine of the partials
and the probabilities' store."""

from ...backend import tl, triton

# Imported by name: Inductor re-emits a user Triton kernel with the jit functions it
# calls, and a module attribute (noise.x) is not carried along.
from ...common.scan import (
    combine_argmax,
    combine_softmax,
    lane_argmax_finish,
    lane_argmax_init,
    lane_argmax_update,
    scan_vocab,
    softmax_update,
)
from ..noise import gumbel_gain, gumbel_keys, row_key


@triton.jit
def draft_step(acc, x, side, idx, args, FLAGS: tl.constexpr):
    """One block of scan_vocab: the per-lane argmax of the keys (logits * gain, plus
    base-2 Gumbel noise if NOISE), online-softmax statistics of logits / scale
    (WRITE == 1) or their store (WRITE == 2); with CUT, logits below the row's cut
    count as -inf in all three."""
    NOISE: tl.constexpr = FLAGS[0]  # annotated: a plain assignment would make a runtime value
    WRITE: tl.constexpr = FLAGS[1]
    FAST: tl.constexpr = FLAGS[2]
    CUT: tl.constexpr = FLAGS[3]
    best, best_idx, run_max, run_sum = acc
    gain, key, scale, out_row, out_limit, cut = args
    if CUT:
        x = tl.where(x < cut, float("-inf"), x)
    if NOISE:
        keys = gumbel_keys(x, idx, gain, key, FAST)
    else:
        keys = x * gain
    best, best_idx = lane_argmax_update(best, best_idx, keys, idx)
    if WRITE == 1:
        run_max, run_sum = softmax_update(run_max, run_sum, x / scale)
    if WRITE == 2:
        tl.store(out_row + idx, x / scale, mask=idx < out_limit)
    return best, best_idx, run_max, run_sum


@triton.jit
def draft_partials_kernel(
    logits_ptr, temperature_ptr, seeds_ptr, positions_ptr, cut_ptr,  # cut_ptr: read with HAS_CUT
    out_ptr, step_ptr,  # WRITE == 2: logits / T stored at out[:, step]
    part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,  # out: per (request, chunk)
    vocab, row_stride, num_splits, num_steps,
    SALT_KEY: tl.constexpr,
    WRITE: tl.constexpr,  # 0: nothing, 1: probs (stats here, values in pass 2), 2: logits
    HAS_CUT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, FAST_LOG2: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    temp = tl.load(temperature_ptr + row).to(tl.float32)
    greedy = temp <= 0
    cut = tl.full([], float("-inf"), tl.float32)
    if HAS_CUT:
        cut = tl.load(cut_ptr + row)
    scale = tl.where(greedy, 1.0, temp)
    gain = gumbel_gain(temp)
    key = row_key(tl.load(seeds_ptr + row), tl.load(positions_ptr + row), SALT_KEY)
    row_ptr = logits_ptr + row * row_stride
    out_row, out_limit = out_ptr, 0
    if WRITE == 2:
        step = tl.load(step_ptr).to(tl.int64)
        # A step outside [0, K) stores nothing: every store index fails idx < 0.
        out_limit = tl.where((step >= 0) & (step < num_steps), vocab, 0)
        out_row = out_ptr + (row * num_steps + step) * vocab

    start = split * CHUNK
    end = tl.minimum(start + CHUNK, vocab)
    best, best_idx = lane_argmax_init(start, BLOCK)
    acc = (best, best_idx, tl.full([], float("-inf"), tl.float32), tl.full([], 0.0, tl.float32))
    args = (gain, key, scale, out_row, out_limit, cut)
    # The greedy / random branch outside the token loop: each loop body is straight-line code.
    # Greedy rows ignore the cut.
    if greedy:
        best, best_idx, run_max, run_sum = scan_vocab(
            row_ptr, row_ptr, start, end, acc, args, draft_step, (False, WRITE, FAST_LOG2, False), False, BLOCK
        )
    else:
        best, best_idx, run_max, run_sum = scan_vocab(
            row_ptr, row_ptr, start, end, acc, args, draft_step, (True, WRITE, FAST_LOG2, HAS_CUT), False, BLOCK
        )
    best, best_idx = lane_argmax_finish(best, best_idx)

    part = row * num_splits + split
    tl.store(part_key_ptr + part, best)
    tl.store(part_idx_ptr + part, best_idx)
    if WRITE == 1:
        tl.store(part_max_ptr + part, run_max)
        tl.store(part_sum_ptr + part, run_sum)


@triton.jit
def draft_finish_kernel(
    logits_ptr, temperature_ptr, cut_ptr, tokens_ptr, out_ptr, step_ptr,
    part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,  # in: the partials kernel's
    vocab, row_stride, num_splits, num_steps,
    WRITE_PROBS: tl.constexpr, HAS_CUT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    parts = row * num_splits
    if split == 0:
        _, token = combine_argmax(part_key_ptr + parts, part_idx_ptr + parts, num_splits, SPLIT_BLOCK)
        tl.store(tokens_ptr + row, token)
    if WRITE_PROBS:
        step = tl.load(step_ptr).to(tl.int64)
        # A step outside [0, K) stores nothing: every store index fails idx < 0.
        out_limit = tl.where((step >= 0) & (step < num_steps), vocab, 0)
        out_row = out_ptr + (row * num_steps + step) * vocab
        run_max, run_sum = combine_softmax(part_max_ptr + parts, part_sum_ptr + parts, num_splits, SPLIT_BLOCK)
        temp = tl.load(temperature_ptr + row).to(tl.float32)
        scale = tl.where(temp <= 0, 1.0, temp)
        cut = tl.full([], float("-inf"), tl.float32)
        if HAS_CUT:
            cut = tl.where(temp <= 0, float("-inf"), tl.load(cut_ptr + row))  # greedy rows: untruncated
        row_ptr = logits_ptr + row * row_stride
        for off in range(split * CHUNK, tl.minimum(split * CHUNK + CHUNK, vocab), BLOCK):
            idx = off + tl.arange(0, BLOCK)
            mask = idx < vocab
            x = tl.load(row_ptr + idx, mask=mask, other=float("-inf")).to(tl.float32)
            if HAS_CUT:
                x = tl.where(x < cut, float("-inf"), x)
            z = x / scale
            tl.store(out_row + idx, tl.exp(z - run_max) / run_sum, mask=idx < out_limit)
