"""The Triton kernel of `vocab_metrics` (this package's docstring defines what it
computes). The kernel: one program per row, two passes over the row's tiles. Pass 1 keeps, per
lane, the online-softmax statistics and the argmax of both rows (and, for divergence
with a map, the target's statistics on the draft ids). Pass 2 needs both normalisers;
it reads the tiles back to front, so the tiles pass 1 read last, the likeliest still
in L2, come first. In base 2, min(p, q) = 2**min(log2 p, log2 q): one exp2 per token
pair. Extra memory: the outputs, O(N). The row scans' per-lane statistics are
ops/common/scan.py's; the reads of a draft tile and of the target at its ids are
below, before the kernel.

Jit functions are imported by name: Inductor re-emits a user Triton kernel with the
jit functions it calls, and a module attribute is not carried along.
"""

from ..backend import tl, triton
from ..common.fastmath import exp2
from ..common.scan import (
    lane_argmax_finish,
    lane_argmax_init,
    lane_argmax_update,
    lane_lse2,
    lane_softmax_init,
    lane_softmax_update,
)

# ------------------------------------------------------------ the tiles it reads


@triton.jit
def target_ids(d2t_ptr, idx, in_draft, vocab, HAS_MAP: tl.constexpr):
    """(target ids of draft ids idx, where they may be read)."""
    if HAS_MAP:
        ids = idx + tl.load(d2t_ptr + idx, mask=in_draft, other=0).to(tl.int64)
        return ids, in_draft & (ids >= 0) & (ids < vocab)
    else:
        return idx, in_draft


@triton.jit
def load_target(row_ptr, ids, mask, PROBS: tl.constexpr):
    """Raw target values: logits (-inf where masked) or probabilities (0 there)."""
    if PROBS:
        return tl.load(row_ptr + ids, mask=mask, other=0.0)
    else:
        return tl.load(row_ptr + ids, mask=mask, other=float("-inf"))


@triton.jit
def draft_tile(draft_row, target_row, d2t_ptr, idx, draft_vocab, vocab, WITH_TARGET: tl.constexpr,
               HAS_MAP: tl.constexpr, PROBS: tl.constexpr):  # fmt: skip
    """Raw values of the draft ids idx (-inf outside [0, Vd)) and, WITH_TARGET, of the
    target at their target ids (else the draft values again)."""
    in_draft = (idx >= 0) & (idx < draft_vocab)
    x = tl.load(draft_row + idx, mask=in_draft, other=float("-inf"))
    if WITH_TARGET:
        ids, readable = target_ids(d2t_ptr, idx, in_draft, vocab, HAS_MAP)
        return x, load_target(target_row, ids, readable, PROBS)
    else:
        return x, x


@triton.jit
def target_log2(x, gain, PROBS: tl.constexpr):
    """log2 of the unnormalised tempered target: logits * log2(e) / s, or log2(probs) / s."""
    if PROBS:
        return tl.log2(x) * gain
    else:
        return x * gain


# ------------------------------------------------------------------------ kernel


@triton.jit
def second_pass(
    draft_row, target_row, d2t_ptr, draft_vocab, vocab, draft_gain, target_gain, d_lse2, t_lse2, o_lse2,
    HAS_MAP: tl.constexpr, PROBS: tl.constexpr, DIVERGENCE: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr,
):  # fmt: skip
    """(sum min(p, q), cross-entropy, KL) of one row, its normalisers known (base 2).
    Tiles back to front: the ones pass 1 read last are the likeliest still in L2."""
    # A normaliser of -inf (an empty row) becomes +inf: that row's probabilities are 0, not NaN.
    d_norm = tl.where(d_lse2 == float("-inf"), float("inf"), d_lse2)
    t_norm = tl.where(t_lse2 == float("-inf"), float("inf"), t_lse2)
    o_norm = tl.where(o_lse2 == float("-inf"), float("inf"), o_lse2)
    lanes = tl.arange(0, BLOCK)
    min_lane = tl.zeros([BLOCK], tl.float32)
    ce_lane = tl.zeros([BLOCK], tl.float32)
    kl_lane = tl.zeros([BLOCK], tl.float32)
    num_blocks = tl.cdiv(draft_vocab, BLOCK)
    tile = draft_tile(draft_row, target_row, d2t_ptr, (num_blocks - 1) * BLOCK + lanes, draft_vocab, vocab, True,
                      HAS_MAP, PROBS)  # fmt: skip
    for back in range(0, num_blocks):
        idx = (num_blocks - 1 - back) * BLOCK + lanes
        x, xt = tile
        # Prefetch: the next tile's loads are in flight while this one is summed.
        tile = draft_tile(draft_row, target_row, d2t_ptr, idx - BLOCK, draft_vocab, vocab, True, HAS_MAP, PROBS)
        zt = target_log2(xt.to(tl.float32), target_gain, PROBS)
        log_q = x.to(tl.float32) * draft_gain - d_norm
        log_p = zt - t_norm
        if DIVERGENCE:
            log_pd = zt - o_norm
            pd = exp2(log_pd, FAST)
            if HAS_MAP:
                p = exp2(log_p, FAST)
            else:
                p = pd  # without a map the draft vocabulary is the whole vocabulary: pd is p
            min_lane += tl.minimum(p, exp2(log_q, FAST))
            counted = pd > 0
            ce_lane += tl.where(counted, -pd * log_q, 0.0)
            kl_lane += tl.where(counted, pd * (log_pd - log_q), 0.0)
        else:
            # min(p, q) = 2**min(log2 p, log2 q): one exp2 per token pair.
            min_lane += exp2(tl.minimum(log_p, log_q), FAST)
    ln2 = 0.6931471805599453
    return tl.sum(min_lane, 0), tl.sum(ce_lane, 0) * ln2, tl.sum(kl_lane, 0) * ln2


@triton.jit
def vocab_metrics_kernel(
    draft_ptr, target_ptr, temperature_ptr, d2t_ptr,
    draft_token_ptr, target_token_ptr, draft_lse_ptr, target_lse_ptr, accept_ptr, ce_ptr, kl_ptr,  # out
    draft_vocab, vocab, draft_stride, target_stride, temperature_stride,
    HAS_MAP: tl.constexpr, PROBS: tl.constexpr, DIVERGENCE: tl.constexpr, BLOCK: tl.constexpr,
    FAST: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    temp = tl.load(temperature_ptr + row * temperature_stride).to(tl.float32)
    sampled = temp > 0  # anything else (T <= 0, NaN) is greedy
    scale = tl.where(sampled, temp, 1.0)
    draft_gain = 1.4426950408889634 / scale  # log2(e) / s: base-2 logits
    if PROBS:
        target_gain = 1.0 / scale
    else:
        target_gain = draft_gain
    draft_row = draft_ptr + row * draft_stride
    target_row = target_ptr + row * target_stride
    lanes = tl.arange(0, BLOCK)
    # Pass 1 reads the target along the draft ids when they are its own ids (no map), or for
    # the divergences' normaliser on the draft vocabulary.
    DRAFT_IDS_TARGET: tl.constexpr = DIVERGENCE or not HAS_MAP

    # Pass 1: per-lane softmax statistics and argmax of both rows. Each loop prefetches:
    # the next tile's loads are in flight while this one is reduced.
    d_max, d_sum = lane_softmax_init(BLOCK)
    t_max, t_sum = lane_softmax_init(BLOCK)
    o_max, o_sum = lane_softmax_init(BLOCK)  # the target on the draft ids (divergence with a map)
    d_best, d_idx = lane_argmax_init(0, BLOCK)
    t_best, t_idx = lane_argmax_init(0, BLOCK)
    if HAS_MAP:
        target_next = load_target(target_row, lanes, lanes < vocab, PROBS)
        for off in range(0, vocab, BLOCK):
            idx = off + lanes
            xt = target_next.to(tl.float32)
            target_next = load_target(target_row, idx + BLOCK, idx + BLOCK < vocab, PROBS)
            t_best, t_idx = lane_argmax_update(t_best, t_idx, xt, idx)
            t_max, t_sum = lane_softmax_update(t_max, t_sum, target_log2(xt, target_gain, PROBS), FAST)
    tile = draft_tile(draft_row, target_row, d2t_ptr, lanes, draft_vocab, vocab, DRAFT_IDS_TARGET,
                      HAS_MAP, PROBS)  # fmt: skip
    for off in range(0, draft_vocab, BLOCK):
        idx = off + lanes
        x, xt = tile
        tile = draft_tile(draft_row, target_row, d2t_ptr, idx + BLOCK, draft_vocab, vocab, DRAFT_IDS_TARGET,
                          HAS_MAP, PROBS)  # fmt: skip
        x = x.to(tl.float32)
        d_best, d_idx = lane_argmax_update(d_best, d_idx, x, idx)
        d_max, d_sum = lane_softmax_update(d_max, d_sum, x * draft_gain, FAST)
        if HAS_MAP:
            if DIVERGENCE:
                zt = target_log2(xt.to(tl.float32), target_gain, PROBS)
                o_max, o_sum = lane_softmax_update(o_max, o_sum, zt, FAST)
        else:  # the same ids: the target's own statistics
            xt = xt.to(tl.float32)
            t_best, t_idx = lane_argmax_update(t_best, t_idx, xt, idx)
            t_max, t_sum = lane_softmax_update(t_max, t_sum, target_log2(xt, target_gain, PROBS), FAST)
    _, d_arg = lane_argmax_finish(d_best, d_idx)
    _, t_arg = lane_argmax_finish(t_best, t_idx)
    d_lse2 = lane_lse2(d_max, d_sum)
    t_lse2 = lane_lse2(t_max, t_sum)
    o_lse2 = t_lse2
    draft_token = d_arg.to(tl.int64)
    if HAS_MAP:
        draft_token += tl.load(d2t_ptr + d_arg).to(tl.int64)
        if DIVERGENCE:
            o_lse2 = lane_lse2(o_max, o_sum)

    # Pass 2, skipped by a greedy row unless it needs the divergences.
    min_sum = tl.zeros([], tl.float32)
    ce = tl.zeros([], tl.float32)
    kl = tl.zeros([], tl.float32)
    if DIVERGENCE:
        min_sum, ce, kl = second_pass(
            draft_row, target_row, d2t_ptr, draft_vocab, vocab, draft_gain, target_gain, d_lse2, t_lse2, o_lse2,
            HAS_MAP, PROBS, DIVERGENCE, BLOCK, FAST,
        )  # fmt: skip
    else:
        if sampled:
            min_sum, ce, kl = second_pass(
                draft_row, target_row, d2t_ptr, draft_vocab, vocab, draft_gain, target_gain, d_lse2, t_lse2, o_lse2,
                HAS_MAP, PROBS, DIVERGENCE, BLOCK, FAST,
            )  # fmt: skip
    # Greedy: p and q are one-hot, sum min(p, q) is the match.
    accept = tl.where(sampled, min_sum, (draft_token == t_arg).to(tl.float32))

    ln2 = 0.6931471805599453
    tl.store(draft_token_ptr + row, draft_token.to(tl.int32))
    tl.store(target_token_ptr + row, t_arg)
    tl.store(draft_lse_ptr + row, d_lse2 * ln2)
    tl.store(target_lse_ptr + row, t_lse2 * ln2)
    tl.store(accept_ptr + row, accept)
    if DIVERGENCE:
        tl.store(ce_ptr + row, ce)
        tl.store(kl_ptr + row, kl)
