"""The kernels chain verification (rejection/) and tree verification
(tree_verify.py) both launch, and the scan steps they share (fla-style: one body,
parametrised by what differs between the two).

Both verify against target rows laid out [B, R, V] (a chain: R = K + 1 rows, row j
after j drafts; a tree: R = N rows, row n after node n) and run three passes:

(1) `target_stats_kernel`, per (request, row, vocab chunk): the argmax of the row
for a greedy request, its online-softmax max and sum for a sampled one. The chain
reads only rows 0..n (greedy) or 0..n-1 (sampled) of a request with n drafts
(ROWS_OF_DRAFTS); the tree reads every node's row.
(2) the walk, per (request, vocab chunk): the chain's acceptance chain
(rejection/) or the tree's walk (tree_walk.py), then the partial races over that
chunk of the emitting row: the residual race with p as the fallback after a
rejection, Gumbel-max (`gumbel_step`, its own fallback) for the bonus token.
(3) `race_finish_kernel`, per sampled request: the races' winner, the residual's
unless every residual key is 0, written after the accepted drafts.

Truncation (an optional logit cut per target row, ops/sampling/truncation): a
sampled request's logits below its row's cut count as -inf wherever the row is read
(its softmax statistics, p of a draft, the residual race, the bonus token's
Gumbel-max): one compare per loaded logit, no extra pass. Greedy requests do not read
the cut.

Jit functions are imported by name: Inductor re-emits a user Triton kernel with the
jit functions it calls, and a module attribute (noise.x) is not carried along.
"""

from ..backend import tl, triton
from ..common.scan import (
    combine_argmax,
    lane_argmax_finish,
    lane_argmax_init,
    lane_argmax_update,
    lane_softmax_finish,
    lane_softmax_init,
    lane_softmax_update,
    scan_vocab,
)
from .noise import gumbel_gain, gumbel_keys

# ---------------------------------------------------- steps: what scan_vocab does per block


@triton.jit
def argmax_step(acc, x, side, idx, args, FLAGS: tl.constexpr):
    """Greedy: the per-lane argmax of the logits (acc: lane_argmax_init)."""
    best, best_idx = acc
    return lane_argmax_update(best, best_idx, x, idx)


@triton.jit
def gumbel_step(acc, x, side, idx, args, FLAGS: tl.constexpr):
    """Sampling: the per-lane argmax of the base-2 Gumbel-max keys (args: gain, row
    key, cut; FLAGS: FAST, CUT: logits below the cut count as -inf)."""
    FAST: tl.constexpr = FLAGS[0]  # annotated: a plain assignment would make a runtime value
    CUT: tl.constexpr = FLAGS[1]
    best, best_idx = acc
    gain, key, cut = args
    if CUT:
        x = tl.where(x < cut, float("-inf"), x)
    return lane_argmax_update(best, best_idx, gumbel_keys(x, idx, gain, key, FAST), idx)


@triton.jit
def lane_softmax_step(acc, x, side, idx, args, FLAGS: tl.constexpr):
    """Per-lane online softmax of x * gain (x / T in base 2), no reduction in the
    loop (args: gain, cut; FLAGS: FAST, CUT: logits below the cut count as -inf)."""
    FAST: tl.constexpr = FLAGS[0]
    CUT: tl.constexpr = FLAGS[1]
    lane_max, lane_sum = acc
    gain, cut = args
    if CUT:
        x = tl.where(x < cut, float("-inf"), x)
    return lane_softmax_update(lane_max, lane_sum, x * gain, FAST)


@triton.jit
def row_cut(cut_ptr, row, HAS_CUT: tl.constexpr):
    """A target row's logit cut (flat row index into [B, R]); -inf without one."""
    cut = tl.full([], float("-inf"), tl.float32)
    if HAS_CUT:
        cut = tl.load(cut_ptr + row).to(tl.float32)
    return cut


# ----------------------------------------------------------------------- kernels


@triton.jit
def target_stats_kernel(
    logits_ptr, num_draft_ptr, temperature_ptr, cut_ptr,
    part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,  # out: per (request, row, chunk)
    vocab, req_stride, row_stride, num_rows, num_splits,
    ROWS_OF_DRAFTS: tl.constexpr, HAS_CUT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, FAST_LOG2: tl.constexpr,
):  # fmt: skip
    """Grid (B, R, chunks). With ROWS_OF_DRAFTS (the chain) a request's rows past
    its n = num_draft_ptr[b] drafts (clamped to [0, R - 1]) are never read; without
    it (the tree) num_draft_ptr is not read. With HAS_CUT a sampled row's
    statistics are over its logits >= cut_ptr[b, r] ([B, R], contiguous)."""
    req = tl.program_id(0).to(tl.int64)
    row_in_req = tl.program_id(1)
    split = tl.program_id(2)
    temp = tl.load(temperature_ptr + req).to(tl.float32)
    greedy = temp <= 0
    if ROWS_OF_DRAFTS:
        num_draft = tl.minimum(tl.maximum(tl.load(num_draft_ptr + req), 0), num_rows - 1)
        needed = tl.where(greedy, row_in_req <= num_draft, row_in_req < num_draft)
    else:
        needed = row_in_req < num_rows
    if needed:
        row = req * num_rows + row_in_req
        row_ptr = logits_ptr + req * req_stride + row_in_req * row_stride
        start = split * CHUNK
        end = tl.minimum(start + CHUNK, vocab)
        best, best_idx = lane_argmax_init(start, BLOCK)
        run_max = tl.full([], float("-inf"), tl.float32)
        run_sum = tl.full([], 0.0, tl.float32)
        if greedy:
            best, best_idx = scan_vocab(
                row_ptr, row_ptr, start, end, (best, best_idx), None, argmax_step, None, False, BLOCK
            )
        else:
            lane_max, lane_sum = lane_softmax_init(BLOCK)
            args = (gumbel_gain(temp), row_cut(cut_ptr, row, HAS_CUT))
            lane_max, lane_sum = scan_vocab(
                row_ptr, row_ptr, start, end, (lane_max, lane_sum), args, lane_softmax_step,
                (FAST_LOG2, HAS_CUT), False, BLOCK,
            )  # fmt: skip
            run_max, run_sum = lane_softmax_finish(lane_max, lane_sum)
        best, best_idx = lane_argmax_finish(best, best_idx)
        part = row * num_splits + split
        tl.store(part_key_ptr + part, best)
        tl.store(part_idx_ptr + part, best_idx)
        tl.store(part_max_ptr + part, run_max)
        tl.store(part_sum_ptr + part, run_sum)


@triton.jit
def race_finish_kernel(
    temperature_ptr, tokens_ptr, counts_ptr,
    race_key_ptr, race_idx_ptr, fall_key_ptr, fall_idx_ptr,  # in: the walk's partial races
    tokens_per_req, num_splits,
    SPLIT_BLOCK: tl.constexpr,
):  # fmt: skip
    """Grid (B,). A sampled request's emitted token: the residual race's winner, or
    the fallback's where every residual key is 0; for the bonus token (a leaf) both
    races are the Gumbel-max race, so either gives its winner. Greedy requests were
    written whole by the walk."""
    req = tl.program_id(0).to(tl.int64)
    temp = tl.load(temperature_ptr + req).to(tl.float32)
    if not (temp <= 0):
        parts = req * num_splits
        race, token = combine_argmax(race_key_ptr + parts, race_idx_ptr + parts, num_splits, SPLIT_BLOCK)
        _, fallback = combine_argmax(fall_key_ptr + parts, fall_idx_ptr + parts, num_splits, SPLIT_BLOCK)
        token = tl.where(race > 0, token, fallback)
        tl.store(tokens_ptr + req * tokens_per_req + tl.load(counts_ptr + req), token)
