"""The device-side rules of rejection sampling (rejection.py): the STEP functions
its kernels hand to `scan_vocab` (what one block of a target row does to the running
state) and the acceptance test of one draft token. Their torch twins are inline in
`rejection_sample_reference`.

Jit functions are imported by name: Inductor re-emits a user Triton kernel with the
jit functions it calls, and a module attribute (noise.x) is not carried along.
"""

from ..backend import tl, triton
from ..common.fastmath import exp2, rcp
from ..common.scan import combine_argmax, combine_softmax, lane_argmax_update, lane_softmax_update
from .noise import exponential2, gumbel_keys, noise_bits, row_key, uniform

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


@triton.jit
def residual_race_step(acc, x, q, idx, args, FLAGS: tl.constexpr):
    """A rejected row: the exponential races r / E over the residual r = max(p - q, 0)
    and, as the fallback, over p. p = softmax in base 2: 2**(x * log2(e) / T -
    max * log2(e)) / sum, the division and the division by T hoisted out of the loop
    (args). Without draft probs q is the one-hot of the rejected token."""
    HAS_DRAFT_PROBS: tl.constexpr = FLAGS[0]  # annotated: a plain assignment would make a runtime value
    FAST: tl.constexpr = FLAGS[1]
    race, race_idx, fall, fall_idx = acc
    gain, max2, inv_sum, key, end, rejected = args
    mask = idx < end
    p = exp2(x * gain - max2, FAST) * inv_sum
    if not HAS_DRAFT_PROBS:
        q = (idx == rejected).to(tl.float32)
    # 1 / (E / ln 2): the races rank r / E, and a common factor ln 2 changes no winner.
    inv_e = rcp(exponential2(noise_bits(key, idx), FAST), FAST)
    race_keys = tl.where(mask, tl.maximum(p - q, 0.0) * inv_e, float("-inf"))
    fall_keys = tl.where(mask, p * inv_e, float("-inf"))
    race, race_idx = lane_argmax_update(race, race_idx, race_keys, idx)
    fall, fall_idx = lane_argmax_update(fall, fall_idx, fall_keys, idx)
    return race, race_idx, fall, fall_idx


# ------------------------------------------------------------------ the acceptance test


@triton.jit
def accept_draft(
    logits_ptr, draft_probs_ptr, part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,
    draft, logits_row, q_row, parts, greedy, temp, seed, position, vocab, num_splits,
    ACCEPT_KEY: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
):  # fmt: skip
    """Whether one draft token is accepted (as int32), from the statistics kernel's
    partials of its target row: greedy, draft == argmax; random, u * q(x) <= p(x)."""
    if greedy:
        _, target = combine_argmax(part_key_ptr + parts, part_idx_ptr + parts, num_splits, SPLIT_BLOCK)
        accept = (draft == target).to(tl.int32)
    else:
        valid = (draft >= 0) & (draft < vocab)
        run_max, run_sum = combine_softmax(part_max_ptr + parts, part_sum_ptr + parts, num_splits, SPLIT_BLOCK)
        x = tl.load(logits_ptr + logits_row + draft, mask=valid, other=float("-inf")).to(tl.float32)
        p = tl.exp(x / temp - run_max) / run_sum
        if HAS_DRAFT_PROBS:
            q = tl.load(draft_probs_ptr + q_row * vocab + draft, mask=valid, other=0.0).to(tl.float32)
        else:
            q = 1.0
        u = uniform(noise_bits(row_key(seed, position, ACCEPT_KEY), tl.full([], 0, tl.int32)))
        accept = (valid & (u * q <= p)).to(tl.int32)
    return accept
