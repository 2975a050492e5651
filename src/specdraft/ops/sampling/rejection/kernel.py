"""Rejection sampling's chain kernel (step (2) of the package docstring) and its
device-side rules: the acceptance test and the residual race step."""

from ...backend import tl, triton

# Imported by name: Inductor re-emits a user Triton kernel with the jit functions it
# calls, and a module attribute (noise.x) is not carried along.
from ...common.fastmath import exp2, rcp
from ...common.scan import (
    combine_argmax,
    combine_softmax,
    lane_argmax_finish,
    lane_argmax_init,
    lane_argmax_update,
    scan_vocab,
)
from ..noise import (
    exponential2,
    gumbel_gain,
    noise_bits,
    row_key,
    uniform,
)
from ..verify_kernels import gumbel_step, row_cut


@triton.jit
def residual_race_step(acc, x, q, idx, args, FLAGS: tl.constexpr):
    """A rejected row: the exponential races r / E over the residual r = max(p - q, 0)
    and, as the fallback, over p. p = softmax in base 2: 2**(x * log2(e) / T -
    max * log2(e)) / sum, the division and the division by T hoisted out of the loop
    (args). Without draft probs q is the one-hot of the rejected token."""
    HAS_DRAFT_PROBS: tl.constexpr = FLAGS[0]  # annotated: a plain assignment would make a runtime value
    FAST: tl.constexpr = FLAGS[1]
    CUT: tl.constexpr = FLAGS[2]
    race, race_idx, fall, fall_idx = acc
    gain, max2, inv_sum, key, end, rejected, cut = args
    mask = idx < end
    if CUT:  # p = 0 below the cut
        x = tl.where(x < cut, float("-inf"), x)
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


@triton.jit
def accept_draft(
    logits_ptr, draft_probs_ptr, part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,
    draft, logits_row, q_row, parts, greedy, temp, seed, position, vocab, num_splits, cut,
    ACCEPT_KEY: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
):  # fmt: skip
    """Whether one draft token is accepted (as int32), from the statistics kernel's
    partials of its target row: greedy, draft == argmax; random, u * q(x) <= p(x),
    p(x) = 0 where the logit is below the row's cut."""
    if greedy:
        _, target = combine_argmax(part_key_ptr + parts, part_idx_ptr + parts, num_splits, SPLIT_BLOCK)
        accept = (draft == target).to(tl.int32)
    else:
        valid = (draft >= 0) & (draft < vocab)
        run_max, run_sum = combine_softmax(part_max_ptr + parts, part_sum_ptr + parts, num_splits, SPLIT_BLOCK)
        x = tl.load(logits_ptr + logits_row + draft, mask=valid, other=float("-inf")).to(tl.float32)
        x = tl.where(x < cut, float("-inf"), x)  # cut = -inf without truncation
        p = tl.exp(x / temp - run_max) / run_sum
        if HAS_DRAFT_PROBS:
            q = tl.load(draft_probs_ptr + q_row * vocab + draft, mask=valid, other=0.0).to(tl.float32)
        else:
            q = 1.0
        u = uniform(noise_bits(row_key(seed, position, ACCEPT_KEY), tl.full([], 0, tl.int32)))
        accept = (valid & (u * q <= p)).to(tl.int32)
    return accept


@triton.jit
def rs_chain_kernel(
    logits_ptr, draft_tokens_ptr, draft_probs_ptr, num_draft_ptr, temperature_ptr, seeds_ptr, positions_ptr,
    cut_ptr,  # [B, K + 1], read with HAS_CUT
    tokens_ptr, counts_ptr,  # out
    part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,  # in: the statistics kernel's partials
    race_key_ptr, race_idx_ptr, fall_key_ptr, fall_idx_ptr,  # out: per (request, chunk)
    vocab, req_stride, row_stride, num_spec, num_splits,
    ACCEPT_KEY: tl.constexpr, SAMPLE_KEY: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, HAS_CUT: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, SPLIT_BLOCK: tl.constexpr, FAST_LOG2: tl.constexpr,
):  # fmt: skip
    req = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    num_draft = tl.minimum(tl.maximum(tl.load(num_draft_ptr + req), 0), num_spec)
    temp = tl.load(temperature_ptr + req).to(tl.float32)
    greedy = temp <= 0
    seed = tl.load(seeds_ptr + req).to(tl.int64)
    position = tl.load(positions_ptr + req).to(tl.int64)
    draft_base = draft_tokens_ptr + req * num_spec

    # The acceptance chain: count = number of leading accepted drafts.
    count = tl.full([], 0, tl.int32)
    alive = tl.full([], 1, tl.int32)
    for j in range(0, num_spec):
        accept = tl.full([], 0, tl.int32)
        if (alive != 0) & (j < num_draft):
            row = req * (num_spec + 1) + j
            accept = accept_draft(
                logits_ptr, draft_probs_ptr, part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,
                tl.load(draft_base + j).to(tl.int64), req * req_stride + j * row_stride, req * num_spec + j,
                row * num_splits,
                greedy, temp, seed, position + j, vocab, num_splits, row_cut(cut_ptr, row, HAS_CUT),
                ACCEPT_KEY, HAS_DRAFT_PROBS, SPLIT_BLOCK,
            )  # fmt: skip
        count += accept
        alive = accept

    row = req * (num_spec + 1) + count
    parts = row * num_splits
    if split == 0:
        emitted = tl.full([], -1, tl.int32)  # random requests: filled in by the finish kernel
        if greedy:
            _, emitted = combine_argmax(part_key_ptr + parts, part_idx_ptr + parts, num_splits, SPLIT_BLOCK)
        for i in range(0, num_spec + 1):
            draft = tl.load(draft_base + i, mask=i < count, other=-1).to(tl.int32)
            token = tl.where(i < count, draft, tl.where(i == count, emitted, -1))
            tl.store(tokens_ptr + req * (num_spec + 1) + i, token)
        tl.store(counts_ptr + req, count)

    if not greedy:
        key = row_key(seed, position + count, SAMPLE_KEY)
        cut = row_cut(cut_ptr, row, HAS_CUT)
        row_ptr = logits_ptr + req * req_stride + count * row_stride
        start = split * CHUNK
        end = tl.minimum(start + CHUNK, vocab)
        race, race_idx = lane_argmax_init(start, BLOCK)
        fall, fall_idx = race, race_idx
        if count < num_draft:  # rejected at row `count`: race over the residual
            run_max, run_sum = combine_softmax(part_max_ptr + parts, part_sum_ptr + parts, num_splits, SPLIT_BLOCK)
            rejected = tl.load(draft_base + count).to(tl.int64)
            q_ptr = draft_probs_ptr + (req * num_spec + count) * vocab
            args = (gumbel_gain(temp), run_max * 1.4426950408889634, 1.0 / run_sum, key, end, rejected, cut)
            race, race_idx, fall, fall_idx = scan_vocab(
                row_ptr, q_ptr, start, end, (race, race_idx, fall, fall_idx), args, residual_race_step,
                (HAS_DRAFT_PROBS, FAST_LOG2, HAS_CUT), HAS_DRAFT_PROBS, BLOCK,
            )  # fmt: skip
        else:  # all accepted: the bonus token
            race, race_idx = scan_vocab(
                row_ptr, row_ptr, start, end, (race, race_idx), (gumbel_gain(temp), key, cut), gumbel_step,
                (FAST_LOG2, HAS_CUT), False, BLOCK,
            )  # fmt: skip
            fall, fall_idx = race, race_idx  # its own fallback: race_finish_kernel takes either
        race, race_idx = lane_argmax_finish(race, race_idx)
        fall, fall_idx = lane_argmax_finish(fall, fall_idx)
        part = req * num_splits + split
        tl.store(race_key_ptr + part, race)
        tl.store(race_idx_ptr + part, race_idx)
        tl.store(fall_key_ptr + part, fall)
        tl.store(fall_idx_ptr + part, fall_idx)
